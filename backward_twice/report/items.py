"""The items of a diagnosis, each built from one verdict: a graph carried into a later iteration (with the backward it
broke, and a ``retain_graph=True`` that only served it: the forum's band-aid), a ``retain_graph=True`` that can go, a
name that keeps more graphs alive every iteration, and a model's parameters given a graph. Each is the learner's lines
with a caret under what matters (:class:`CodeLine`), one sentence of why and one line of fix in their own names
(:class:`Item`).

The item of an error no carried graph explains is :mod:`backward_twice.report.error_item`'s, from these parts.

Used by :mod:`backward_twice.report.error_item` and :mod:`backward_twice.report.rendering`.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from dataclasses import dataclass

from backward_twice.common.units import format_bytes, plural
from backward_twice.judge.built import reads_on_line
from backward_twice.judge.fed import fed_line
from backward_twice.judge.fixes import computed_inside, items_of_one_list, read_as_a_tensor
from backward_twice.judge.grows_at import added_to, assigned_line, beside, growing_line, growing_lines, receiver
from backward_twice.judge.verdicts import CREATE_GRAPH_KEEPS, CarriedFinding, ErrorVerdict, LineVerdict, Note
from backward_twice.record.learner import place as place_of

__all__ = [
    "CodeLine",
    "Item",
    "carried_item",
    "line_number",
    "no_graph_item",
    "note_item",
    "parameters_item",
    "raising_line",
    "retain_item",
    "span_of",
    "split_line",
]


_SEARCHED = (  # the words of PyTorch's messages that people search for, as a raising line's label
    "Trying to backward through the graph a second time",
    "modified by an inplace operation",
    "its base or another view of its base has been modified inplace",
    "does not require grad and does not have a grad_fn",
    "compiled with non-empty donated buffers",
    "Expected to mark a variable ready only once",
)


@dataclass(frozen=True)
class CodeLine:
    """One of the learner's lines in an item: where ("train.py:16", "Cell In[7], line 6"), the code as written,
    the columns to underline (start, end; None: none) and the label beside the carets."""

    place: str
    code: str
    span: tuple[int, int] | None
    label: str


@dataclass(frozen=True)
class Item:
    """One thing to fix (or, ``to_fix`` False, a note): a one-line label naming the learner's variable, their lines,
    why (one sentence), and the fix (one line)."""

    kind: str
    label: str
    lines: tuple[CodeLine, ...]
    why: str
    fix: str
    to_fix: bool = True


def split_line(line: str) -> tuple[str, str]:
    """ "file:12: code" -> ("file:12", "code"); a cell's "Cell In[3], line 5: code" the same way."""
    place, _, code = line.partition(": ")
    return _short_place(place), code


def _short_place(place: str) -> str:
    return place if place.startswith("Cell ") else place.rsplit("/", 1)[-1]


def line_number(place: str) -> str:
    """The line number at the end of a place ("file.py:12", "Cell In[3], line 5"); "?" without one."""
    match = re.search(r"(\d+)$", place)
    return match.group(1) if match else "?"


@functools.lru_cache(maxsize=1024)  # a parse per line and name; the same lines come back in every report
def span_of(code: str, wanted: str, load_only: bool = False) -> tuple[int, int] | None:
    """Where ``wanted`` (a name, ``model.hidden``, ``retain_graph=True``) stands in ``code``: where it is read, for a
    name read and assigned on one line (``out, h = rnn(x, h)``: the ``h`` going in), else its first occurrence."""
    if load_only:
        try:
            tree = ast.parse(code.strip().rstrip(":") or "pass")
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
                continue
            if ast.unparse(node) == wanted:
                return node.col_offset, node.end_col_offset or node.col_offset + len(wanted)
    match = re.search(rf"(?<![\w.]){re.escape(wanted)}(?!\w)", code)
    return (match.start(), match.end()) if match else None


def _searched_words(message: str) -> str:
    """The words people search for in PyTorch's message, else its first clause."""
    for words in _SEARCHED:
        if words in message:
            return words if message.startswith(words) or ": " + words in message else f"...{words}"
    text = message.split(": ", 1)[-1]
    return re.split(r"(?<=[.;])\s|\s\(", text, maxsplit=1)[0][:80]


def raising_line(error: ErrorVerdict) -> CodeLine:
    """The learner's line where the error rose; for a backward a framework ran, the return of the loss it walked."""
    place, code = split_line(error.returned_at or error.line)
    raised = f'raised "{_searched_words(error.message)}"'
    return CodeLine(
        place, code, (0, len(code)) if code else None, f"its backward {raised}" if error.returned_at else raised
    )


def _holder(finding: CarriedFinding) -> str:
    """The whole the fix detaches: ``state`` of ``state[0]`` when the state is a tuple (or a dict by numbers: a
    memory per node id), else the name."""
    name = finding.name or "the tensor"
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    by_number = finding.container == "dict" and re.search(r"\[\d+\]$", name) is not None
    return item.group(1) if item and (finding.container in ("tuple", "list") or by_number) else name


def carried_item(
    findings: list[CarriedFinding],
    error: ErrorVerdict | None,
    band_aid: LineVerdict | None,
    stopped_after: int | None = None,
) -> Item:
    first = findings[0]
    name = _holder(first)
    # the other names of the same graph (an LSTM cell's hx beside cx): each one left holding it still carries it
    others = list(dict.fromkeys(_holder(f) for f in findings[1:] if f.name and _holder(f) != name))
    spelled = " and ".join(f"`{n}`" for n in (name, *others)) if first.name else "a tensor no name of yours holds"
    grouped = items_of_one_list([name, *others]) if first.name and others else None
    followed = spelled
    if grouped is not None:  # a cache's layers[i].keys and .values: one spelling, one statement that detaches them
        spelled, followed = grouped[0], "them"
    state = first.state
    if state is not None and first.name and all(n == state or n.startswith(f"{state}[") for n in (name, *others)):
        spelled = followed = f"`{state}`"  # items of one state the fix detaches whole: the state
        others = []
    origin = "the graph built before the loop" if first.iteration is None else f"iteration {first.iteration}'s graph"
    into = f"iteration {first.reached_from}"
    carries = "carry" if others else "carries"
    label = f"{spelled} {carries} {origin} into {into}" + ("; retain_graph=True only hides it" if band_aid else "")
    place, code = split_line(first.built_at)
    lines = []
    backwarded = first.enters_at is not None and split_line(first.enters_at)[0] == split_line(first.used_at)[0]
    if first.enters_at is not None and not backwarded:  # the loop's first line that reads it: where the old graph
        place, code = split_line(first.enters_at)  # comes in
        lines.append(CodeLine(place, code, span_of(code, name, load_only=True), f"{origin} comes in here"))
    elif backwarded and not code.startswith("("):  # it comes in at the backward itself (``loss.backward()`` of a loss
        built = "built here, before the loop" if first.iteration is None else "built here"  # built before the loop):
        lines.append(CodeLine(place, code, span_of(code, name), built))  # the line that built it, not that line twice
    elif not code.startswith("(") and first.name:
        comes_in = span_of(code, name, load_only=True)
        if comes_in is not None and first.iteration is not None and reads_on_line(code, name):
            lines.append(CodeLine(place, code, comes_in, f"{origin} comes in here"))
        else:
            built = "built here, before the loop" if first.iteration is None else "built here"
            lines.append(CodeLine(place, code, span_of(code, name), built))
    if first.stored_at is not None and first.name:  # no loop of theirs: their line that keeps it for the next step
        stored_place, stored_code = split_line(first.stored_at)
        if stored_place not in (line.place for line in lines):
            lines.append(CodeLine(stored_place, stored_code, span_of(stored_code, name), "kept for the next step here"))
    raising = raising_line(error) if error is not None else None
    if band_aid is not None:
        retain_place, retain_code = split_line(band_aid.line)
        retain = span_of(retain_code, "retain_graph=True")
        if raising is not None and raising.place == retain_place:  # one line: the retain, where it raised
            raising = CodeLine(retain_place, retain_code, retain, raising.label)
        else:
            lines.append(CodeLine(retain_place, retain_code, retain, f"keeps {origin} walkable"))
    if raising is not None:
        lines.append(raising)
    else:
        used_place, used_code = split_line(first.used_at)
        again = f"walks it {'' if first.iteration is None and first.reached_from == 1 else 'again '}in {into}"
        if lines and lines[-1].place == used_place:  # one line: the retain that keeps it, and the walk again
            lines[-1] = CodeLine(used_place, used_code, lines[-1].span, f"{lines[-1].label}, and {again}")
        else:
            lines.append(CodeLine(used_place, used_code, (0, len(used_code)), again))
    step = re.search(r"optimizer step at (.+)$", error.evidence) if error is not None else None
    if error is not None and error.kind == "in-place version error":
        if step is not None:
            step_place, step_code = split_line(step.group(1))
            statements = step_code.split("#", 1)[0].split(";")  # the statement of several on the line, no comment
            step_code = next((part.strip() for part in statements if ".step(" in part), step_code)
            changed = f"`{step_code}` (line {line_number(step_place)}) changed the weights it saved"
        else:
            changed = "a tensor it saved was changed in place since"
        if first.iteration is not None and error.iteration > first.iteration + 1:  # kept walkable: the chain is longer
            last = error.iteration - 1
            origin = (
                f"the graphs of iterations {first.iteration} {'and' if last == first.iteration + 1 else 'to'} {last}"
            )
            changed = changed.replace("the weights it saved", "weights one of them saved").replace(
                "a tensor it saved", "a tensor one of them saved"
            )
        why = f"this backward follows {followed} into {origin}, and {changed}"
    elif error is not None:
        freer = re.search(r"freed by the backward at .+? in iteration (\d+)", error.evidence)
        if freer and int(freer.group(1)) != first.iteration:
            by = f"iteration {freer.group(1)}'s"
        else:  # built before the loop, and freed before it (an earlier run of the cell): no iteration of this loop
            by = "an earlier" if first.iteration is None and not freer else "that iteration's"
        why = f"this backward follows {followed} into {origin}, which {by} backward already freed"
    elif first.freed:  # a second carrier the raising backward reached too: fixing the first alone, it raises
        why = (
            f"this backward follows {followed} into {origin} too, which that iteration's backward already freed: "
            "with only the item above fixed, it still raises"
        )
    elif first.chained and first.iteration is not None:  # one graph built before the loop does not pile up
        why = f"every backward follows {followed} back into {origin}: memory and time grow with each iteration"
    else:  # SAC's alpha = log_alpha.exp(): one old graph at a time, rebuilt each iteration
        older = "the graph built before the loop" if first.iteration is None else "the previous iteration's graph"
        why = (
            f"every backward follows {followed} back into {older}, one graph at a time (it does not pile up), and "
            "sends gradient into what that graph was built from"
        )
        if stopped_after is not None:  # a third iteration's backward walking two graphs at once may be yet to come
            why = (
                f"every backward follows {followed} back into {older} and sends gradient into what that graph was "
                f"built from; the run stopped after {plural(stopped_after, 'iteration')}, and a longer one shows "
                "whether these graphs pile up"
            )
    fix = _carried_fix(first, place if first.fix_at_entry and lines[0].label.endswith("comes in here") else None)
    added = re.match(r"add `[^`]+`", fix)
    detaches = (re.match(r"add (`[^`]+`)", f.fix) for f in findings[1:] if f.name and _holder(f) in others)
    also = [detach for detach in dict.fromkeys(m.group(1) for m in detaches if m) if detach not in fix]
    if added is not None and grouped is not None:
        fix = fix.replace(added.group(0), f"add `{grouped[1]}`", 1)
    elif added is not None and also:
        fix = fix.replace(added.group(0), " and ".join([added.group(0), *also]), 1)
    fix = computed_inside([f.fix for f in findings if f is first or _holder(f) in others]) or fix
    if band_aid is not None:
        fix += f", and remove retain_graph=True at line {line_number(split_line(band_aid.line)[0])}"
    return Item("carried", label, tuple(lines), why, fix)


def _carried_fix(finding: CarriedFinding, place: str | None) -> str:
    """The finding's fix, placed: "add `h = h.detach()` before line 16" where the graph comes in; after the line that
    stores it, without a loop of the learner's (a framework's ``fit`` runs the iterations)."""
    after = finding.detach_after or finding.stored_at
    if after is not None:
        stored = line_number(split_line(after)[0])
        return finding.fix.replace(" at the end of each iteration", f" after line {stored}")
    if place is None:
        return finding.fix
    return finding.fix.replace(" at the end of each iteration", f" before line {line_number(place)}")


def no_graph_item(line: str, cut: tuple[str, str] | None = None) -> Item:
    """The backward of a loss that has no graph: it trains nothing (the forum's ``loss.requires_grad = True``, or
    ``Variable(loss, requires_grad=True)``, after a ``.data`` or ``.detach()`` cut the graph to the model);
    ``cut``: ("file:line: code", operation) of the line that cut it, if known (``.item()``, ``torch.no_grad()``)."""
    place, code = split_line(line)
    lines = [CodeLine(place, code, (0, len(code)), "walks no graph: no weight gets a gradient")]
    fix = (
        "find where the loss's inputs lose their graph and compute them with autograd on; then drop "
        "`requires_grad = True` on the loss"
    )
    if cut is not None:
        cut_place, cut_code = split_line(cut[0])
        under = cut[1] == "torch.no_grad()"
        span = None if under else span_of(cut_code, cut[1].rstrip("()"))
        lines.insert(0, CodeLine(cut_place, cut_code, span, "under torch.no_grad()" if under else "cuts the graph"))
        number = line_number(cut_place)
        if under:
            fix = f"run line {number} outside torch.no_grad(); then drop `requires_grad = True` on the loss"
        elif "requires_grad" in cut_code:  # ``loss = torch.tensor(loss.item(), requires_grad=True)``: the leaf, made
            fix = f"remove line {number}: call backward on the loss it makes a new tensor of"  # from the loss itself
        elif cut[1] in (".data", ".detach()"):  # the loss itself made a leaf (``loss.requires_grad = True``)
            fix = (
                f"compute the loss from line {number} without `{cut[1]}`; then drop `requires_grad = True` on the loss"
            )
        else:  # a number made a new tensor (``torch.tensor(mse, requires_grad=True)``)
            fix = (
                f"call backward on the loss line {number} computes, without `{cut[1]}`, not on a new tensor made "
                "from its value"
            )
    return Item(
        "no graph",
        "the backward trains nothing: the loss it is called on has no graph",
        tuple(lines),
        "the loss is a leaf that requires grad (`requires_grad = True`), made from values without a graph: no graph "
        "leads from it to the model, so no weight gets a gradient, and the error that said so is gone",
        fix,
    )


def retain_item(line: LineVerdict, stopped_after: int | None = None) -> Item:
    """A retain no later backward needed; ``stopped_after``: the run was ended after that many iterations, so a later
    one's backward is not known to need it either (a DQN's replay batch reaching an old graph at pass 5)."""
    place, code = split_line(line.line)
    kept = f"kept {format_bytes(line.held_bytes)} no backward used" if line.held_bytes else "no backward uses it"
    runs = "once" if line.runs == 1 else f"{line.runs} times"
    if line.why == CREATE_GRAPH_KEEPS:  # a later backward may well walk what it kept: create_graph kept it anyway
        return Item(  # a note: written or not, the loop runs the same (WGAN-GP's published penalty writes it)
            "retain can go",
            f"retain_graph=True at line {line_number(place)} adds nothing: create_graph=True keeps the graph anyway",
            (CodeLine(place, code, span_of(code, "retain_graph=True"), "create_graph=True already keeps it"),),
            "retain_graph defaults to create_graph: with create_graph=True the buffers are kept whether or not "
            "retain_graph=True is written",
            f"remove retain_graph=True at line {line_number(place)} if you like: the loop runs the same",
            to_fix=False,
        )
    written = _retain_as_written(code)  # ``retain_graph=(i == 0)``: the words the line has
    shown = written if written == "retain_graph=True" else f"`{written}`"
    return Item(
        "retain can go",
        f"{shown} at line {line_number(place)} keeps buffers no backward uses",
        (CodeLine(place, code, span_of(code, written), kept),),
        f"it kept buffers {runs}, and no later backward walked them: without it the loop runs the same"
        if stopped_after is None
        else f"it kept buffers {runs}, and no later backward walked them; the run stopped after {stopped_after} "
        "iterations, and a later one may (watch the whole run to be sure)",
        f"remove {shown} at line {line_number(place)}",
    )


def _retain_as_written(code: str) -> str:
    """``retain_graph=...`` as the call in ``code`` writes it (``retain_graph=(i == 0)``); else ``retain_graph=True``
    (a retain passed positionally, or in another line)."""
    found = re.search(r"retain_graph\s*=\s*", code)
    if found is None or code[found.end() :].startswith("True"):
        return "retain_graph=True"
    depth, end = 0, found.end()
    while end < len(code) and (depth or code[end] not in ",)"):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(code[end], 0)
        end += 1
    return code[found.start() : end].strip() or "retain_graph=True"


def note_item(note: Note) -> Item:
    place, code = split_line(note.built_at)
    filename = note.grows_in
    grows = growing_line(note.name, filename, note.ran) if filename is not None and not note.attributes else None
    lines: tuple[CodeLine, ...] = (CodeLine(place, code, None, "each iteration's graph starts here"),)
    where = "each graph goes in here" if note.bound else "grows here"
    fix = "keep a number (`.item()`) or a detached tensor (`.detach()`) instead"
    if not note.one_element:  # `.item()` raises on a tensor of several numbers
        fix = "keep a detached tensor (`.detach()`) instead"
    if grows is not None and filename is not None:
        number, text, appended, method = grows
        owner = receiver(text, method) or note.name  # a list ``setdefault`` makes is appended to as the line does
        lines = (CodeLine(_short_place(place_of(filename, number)), text, span_of(text, note.name), where),)
        walked = _item_walked(note.name, filename) if appended else None
        literal = _with_places_detached(text, note.positions) if note.nested and not appended else None
        if walked is not None:  # ``losses[-1].backward()``: the backward needs the graph the append keeps
            fix = f"call `{appended}.backward()` in place of `{walked}`, and `{owner}.{method}({appended}.detach())`"
            literal = appended = None
        if literal is not None:  # ``memory.append((s, a, logp, r))``: the places that held graphs, detached
            fix = f"`{owner}.{method}({literal})`"
        elif appended and note.nested:  # a list of tensors each item: each detached, as a carried state's are
            kept = f"torch.utils._pytree.tree_map(lambda t: t.detach() if torch.is_tensor(t) else t, {appended})"
            fix = f"`{owner}.{method}({kept})`"
        elif appended and note.entry:  # an item with entries (a model's outputs): what is read of it, detached
            fix = f"`{owner}.{method}({appended}[{note.entry}].detach())`, with each entry you read detached"
        elif appended and note.one_element and not read_as_a_tensor(note.name, filename, number):
            fix = f"`{owner}.{method}({appended}.item())`, or `{appended}.detach()` if you need the tensor"
        elif appended:
            fix = f"`{owner}.{method}({appended}.detach())`"
        elif (added := added_to(text)) is not None:  # ``train_loss += loss``: what it adds, as a number if it may
            total, term = added
            fix = f"`{total} += {term}.detach()`"
            if note.one_element and not read_as_a_tensor(note.name, filename, number):
                fix = f"`{total} += {term}.item()`, or {fix} if you need the tensor"
        also = [f for f in growing_lines(note.name, filename, note.ran)[1:] if f[2] and beside(filename, number, f[0])]
        if appended and also and not (walked or literal or note.nested or note.entry):  # two appends a pass: both
            lines += tuple(
                CodeLine(_short_place(place_of(filename, n)), t, span_of(t, note.name), where) for n, t, *_ in also
            )
            kept = "item" if "item()" in fix else "detach"
            fix = " and ".join(
                f"`{receiver(t, how) or note.name}.{how}({what}.{kept}())`" for _, t, what, how in [grows, *also]
            )
    assigned = assigned_line(note.name, filename, note.ran) if grows is None and filename is not None else None
    if assigned is not None and filename is not None and not note.attributes:  # ``self.best = self.total``
        number, text = assigned
        lines = (CodeLine(_short_place(place_of(filename, number)), text, span_of(text, note.name), "gets them here"),)
    each = f" (about {format_bytes(note.held_bytes)} each)" if note.held_bytes else ""
    fed = fed_line(note.name, filename, note.ran) if note.attributes and filename is not None else None
    if fed is not None and filename is not None:  # a meter fed the loss: the call that feeds it is the line to change
        number, text, as_number = fed
        lines = (CodeLine(_short_place(place_of(filename, number)), text, (0, len(text)), "each graph goes in here"),)
        fix = f"`{as_number}`" if note.one_element else f"`{as_number.replace('.item()', '.detach()')}`"
    if note.attributes:  # an object whose attributes grow together
        label = f"`{note.name}` keeps one more iteration's graph alive every iteration"
        held = " and ".join(f"`{attribute}`" for attribute in note.attributes)
        hold = "hold" if len(note.attributes) > 1 else "holds"
        why = f"no later backward walks them, but {held} {hold} them all{each}"
    elif note.bound:  # a deque full of graphs: each append pushes the oldest out, so it holds these, no more
        label = f"`{note.name}` keeps the last {note.bound} iterations' graphs alive"
        if note.up_to:  # not seen full in this run: its maxlen
            so_far = f" ({note.so_far} so far)" if note.so_far else ""
            label = f"`{note.name}` keeps up to the last {note.bound} iterations' graphs alive{so_far}"
        why = f"no later backward walks them, but `{note.name}` holds them until newer ones push them out{each}"
    elif note.entries > 1:  # one line builds each entry of a dict: one note, the dict's
        kept = "several iterations' graphs alive at once" if note.reset else "one more iteration's graph alive"
        label = f"`{note.name}`'s {note.entries} entries keep {kept}" + ("" if note.reset else " every iteration")
        held = "hold them until the loop resets them" if note.reset else "hold them all"
        why = f"no later backward walks them, but the entries of `{note.name}` {held}{each}"
    elif note.reset:  # total = 0 every few passes: it holds several, not all
        label = f"`{note.name}` keeps several iterations' graphs alive at once"
        why = f"no later backward walks them, but `{note.name}` holds them until the loop resets it{each}"
    elif assigned is not None:  # no line grows it: it takes what another name grew (``best = min(best, total)``)
        label = f"`{note.name}` keeps earlier iterations' graphs alive"
        why = f"no later backward walks them, but `{note.name}` holds them{each}"
    else:
        label = f"`{note.name}` keeps one more iteration's graph alive every iteration"
        why = f"no later backward walks them, but `{note.name}` holds them all{each}"
    return Item("note", label, lines, why, fix, to_fix=False)


def _item_walked(name: str, filename: str) -> str | None:
    """The call of ``filename`` that runs backward on an item of the list ``name`` (``losses[-1].backward()``), as
    written; None if none does."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\[[^\]]+\]\.backward\([^)]*\)")
    found = (pattern.search(line.split("#", 1)[0]) for line in linecache.getlines(filename))
    return next((match.group(0) for match in found if match is not None), None)


def _with_places_detached(code: str, positions: tuple[int, ...]) -> str | None:
    """The tuple or list ``code`` appends (``memory.append((s, a, logp, r))``), with the names at ``positions``
    detached (``(s, a, logp.detach(), r)``); None where it appends no literal, or a place is no name."""
    try:
        statement = ast.parse(code.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    call = statement.value if isinstance(statement, ast.Expr) else None
    item = call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
    if not isinstance(item, (ast.Tuple, ast.List)) or not positions or max(positions) >= len(item.elts):
        return None
    if any(not isinstance(item.elts[i], (ast.Name, ast.Attribute, ast.Subscript)) for i in positions):
        return None
    source = code.strip()  # each place as the line spells it (``"train"``, not ``'train'``)
    parts = [
        (ast.get_source_segment(source, e) or ast.unparse(e)) + (".detach()" if i in positions else "")
        for i, e in enumerate(item.elts)
    ]
    return (
        f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        if isinstance(item, ast.Tuple)
        else f"[{', '.join(parts)}]"
    )


def _line_order(place: str) -> tuple[str, int]:
    number = line_number(place)
    return place.rsplit(":", 1)[0], int(number) if number.isdigit() else 0


def parameters_item(model: str, notes: list[Note]) -> Item:
    """Parameters (or buffers) of one model that hold a graph: an in-place update (an EMA's) ran outside
    ``torch.no_grad()``. Updates on several lines of one file (a codebook's running average, then the codebook
    from it) are one span to run under it."""
    updates = list(dict.fromkeys(note.built_at for note in notes))
    shown = sorted((split_line(update) for update in updates), key=lambda seen: _line_order(seen[0]))
    numbers = sorted({line_number(place) for place, _ in shown})
    files = {place.rsplit(":", 1)[0] for place, _ in shown}
    if len(numbers) > 1 and len(files) == 1 and all(number.isdigit() for number in numbers):
        first, last = min(numbers, key=int), max(numbers, key=int)
        line, runs = f"lines {first} to {last}", "run"
    else:
        shown = shown[:1]
        line, runs = (f"line {numbers[0]}" if numbers and numbers[0] != "?" else "the update"), "runs"
    state = "buffers" if all(note.buffer for note in notes) else "parameters"
    whose = f"`{model}`'s {state} hold" if len(notes) > 1 else f"`{notes[0].name}` holds"
    return Item(
        "note",
        f"{whose} a graph that grows every iteration",
        tuple(CodeLine(place, code, (0, len(code)), "updates them with autograd recording") for place, code in shown),
        f"{line} {runs} outside torch.no_grad(): each update adds to the {state}' graph and keeps the old one",
        f"run {line} under `with torch.no_grad():`",
        to_fix=True,
    )
