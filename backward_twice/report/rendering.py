"""The diagnosis as a learner reads it: a headline that counts the items under it, each item their own lines with a
caret under what matters, one sentence of why and one line of fix in their own names; the evidence a step away.

:func:`build_report` turns :class:`backward_twice.judge.verdicts.Verdicts` into a :class:`Report`; every way in shows
the same items (``bt.watch``'s ``w``, the note on the loop's own exception, ``backward-twice watch``, ``bt.diagnose``
and ``%%diagnose``): :func:`render_text` (``verbose`` adds the evidence), :func:`render_html` (the evidence in a
``<details>``), and :func:`report_json` (the items in order, then everything the verdicts hold).

One item per cause: a graph carried into a later iteration (with the backward it broke, and a ``retain_graph=True``
that only served it: the forum's band-aid), an error no carried graph explains, a ``retain_graph=True`` that can go,
and a name that keeps more graphs alive every iteration. A retain a later backward of the same iteration needs, a
``create_graph``, a graph held one iteration and released: evidence, not items.

Used by :mod:`backward_twice.cli`, :mod:`backward_twice.steps.diagnose` and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import ast
import functools
import html
import linecache
import re
from dataclasses import asdict, dataclass
from typing import Any

from backward_twice.common.units import format_bytes
from backward_twice.judge.built import reads_on_line
from backward_twice.judge.fixes import computed_inside, items_of_one_list
from backward_twice.judge.verdicts import (
    CREATE_GRAPH_KEEPS,
    GOES_WITH_CARRIED,
    CarriedFinding,
    ErrorVerdict,
    LineVerdict,
    Note,
    Verdicts,
    plural,
)
from backward_twice.record.learner import site_of

__all__ = ["CodeLine", "Item", "Report", "build_report", "render_html", "render_text", "report_json"]

_GAN_HINT = "a GAN: G's loss on a fresh D(fake)"
_DISCRIMINATOR = re.compile(r"\bfake|[Dd]iscriminator|net_?D\b|_D\b|\bD\(|\bD_|\bd_loss|\berrD")
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


@dataclass(frozen=True)
class Report:
    """The headline, the items, the evidence (lines of text), and, if the recorder switched itself off, why."""

    headline: str
    items: tuple[Item, ...]
    evidence: tuple[str, ...]
    stopped_watching: str | None = None
    not_put_back: tuple[str, ...] = ()  # a step tool's runs: what they changed that nothing can put back


def _split(line: str) -> tuple[str, str]:
    """ "file:12: code" -> ("file:12", "code"); a cell's "Cell In[3], line 5: code" the same way."""
    place, _, code = line.partition(": ")
    return _short_place(place), code


def _short_place(place: str) -> str:
    return place if place.startswith("Cell ") else place.rsplit("/", 1)[-1]


def _line_number(place: str) -> str:
    match = re.search(r"(\d+)$", place)
    return match.group(1) if match else "?"


@functools.lru_cache(maxsize=1024)  # a parse per line and name; the same lines come back in every report
def _span(code: str, wanted: str, load_only: bool = False) -> tuple[int, int] | None:
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


def _raising_line(error: ErrorVerdict) -> CodeLine:
    place, code = _split(error.line)
    return CodeLine(place, code, (0, len(code)) if code else None, f'raised "{_searched_words(error.message)}"')


def _holder(finding: CarriedFinding) -> str:
    """The whole the fix detaches: ``state`` of ``state[0]`` when the state is a tuple, else the name."""
    name = finding.name or "the tensor"
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    return item.group(1) if item and finding.container in ("tuple", "list") else name


def _carried_item(findings: list[CarriedFinding], error: ErrorVerdict | None, band_aid: LineVerdict | None) -> Item:
    first = findings[0]
    name = _holder(first)
    # the other names of the same graph (an LSTM cell's hx beside cx): each one left holding it still carries it
    others = list(dict.fromkeys(_holder(f) for f in findings[1:] if f.name and _holder(f) != name))
    spelled = " and ".join(f"`{n}`" for n in (name, *others)) if first.name else "a tensor no name of yours holds"
    grouped = items_of_one_list([name, *others]) if first.name and others else None
    followed = spelled
    if grouped is not None:  # a cache's layers[i].keys and .values: one spelling, one statement that detaches them
        spelled, followed = grouped[0], "them"
    origin = "the graph built before the loop" if first.iteration is None else f"iteration {first.iteration}'s graph"
    into = f"iteration {first.reached_from}"
    carries = "carry" if others else "carries"
    label = f"{spelled} {carries} {origin} into {into}" + ("; retain_graph=True only hides it" if band_aid else "")
    place, code = _split(first.built_at)
    lines = []
    if first.enters_at is not None:  # the loop's first line that reads it: where the old graph comes in
        place, code = _split(first.enters_at)
        lines.append(CodeLine(place, code, _span(code, name, load_only=True), f"{origin} comes in here"))
    elif not code.startswith("(") and first.name:
        comes_in = _span(code, name, load_only=True)
        if comes_in is not None and first.iteration is not None and reads_on_line(code, name):
            lines.append(CodeLine(place, code, comes_in, f"{origin} comes in here"))
        else:
            built = "built here, before the loop" if first.iteration is None else "built here"
            lines.append(CodeLine(place, code, _span(code, name), built))
    if first.stored_at is not None and first.name:  # no loop of theirs: their line that keeps it for the next step
        stored_place, stored_code = _split(first.stored_at)
        if stored_place not in (line.place for line in lines):
            lines.append(CodeLine(stored_place, stored_code, _span(stored_code, name), "kept for the next step here"))
    raising = _raising_line(error) if error is not None else None
    if band_aid is not None:
        retain_place, retain_code = _split(band_aid.line)
        retain = _span(retain_code, "retain_graph=True")
        if raising is not None and raising.place == retain_place:  # one line: the retain, where it raised
            raising = CodeLine(retain_place, retain_code, retain, raising.label)
        else:
            lines.append(CodeLine(retain_place, retain_code, retain, f"keeps {origin} walkable"))
    if raising is not None:
        lines.append(raising)
    else:
        used_place, used_code = _split(first.used_at)
        lines.append(CodeLine(used_place, used_code, (0, len(used_code)), f"walks it again in {into}"))
    step = re.search(r"optimizer step at (.+)$", error.evidence) if error is not None else None
    if error is not None and error.kind == "in-place version error":
        if step is not None:
            step_place, step_code = _split(step.group(1))
            changed = f"`{step_code}` (line {_line_number(step_place)}) changed the weights it saved"
        else:
            changed = "a tensor it saved was changed in place since"
        why = f"this backward follows {followed} into {origin}, and {changed}"
    elif error is not None:
        freer = re.search(r"freed by the backward at .+? in iteration (\d+)", error.evidence)
        by = f"iteration {freer.group(1)}'s" if freer and int(freer.group(1)) != first.iteration else "that iteration's"
        why = f"this backward follows {followed} into {origin}, which {by} backward already freed"
    elif first.chained:
        why = f"every backward follows {followed} back into {origin}: memory and time grow with each iteration"
    else:  # SAC's alpha = log_alpha.exp(): one old graph at a time, rebuilt each iteration
        older = "the graph built before the loop" if first.iteration is None else "the previous iteration's graph"
        why = (
            f"every backward follows {followed} back into {older}, one graph at a time (it does not pile up), and "
            "sends gradient into what that graph was built from"
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
        fix += f", and remove retain_graph=True at line {_line_number(_split(band_aid.line)[0])}"
    return Item("carried", label, tuple(lines), why, fix)


def _carried_fix(finding: CarriedFinding, place: str | None) -> str:
    """The finding's fix, placed: "add `h = h.detach()` before line 16" where the graph comes in; after the line that
    stores it, without a loop of the learner's (a framework's ``fit`` runs the iterations)."""
    if finding.stored_at is not None:
        stored = _line_number(_split(finding.stored_at)[0])
        return finding.fix.replace(" at the end of each iteration", f" after line {stored}")
    if place is None:
        return finding.fix
    return finding.fix.replace(" at the end of each iteration", f" before line {_line_number(place)}")


def _gan_hint(*code: str) -> str:
    """`` (a GAN: G's loss on a fresh D(fake))`` where the lines speak of a discriminator (``fake``, ``netD``,
    ``opt_D``, ``discriminator``); nothing for an actor and a critic, or a generator's own stale forward."""
    return f" ({_GAN_HINT})" if any(_DISCRIMINATOR.search(line) for line in code) else ""


def _error_item(error: ErrorVerdict) -> Item:
    raising = _raising_line(error)
    lines = [raising]
    step = re.search(r"optimizer step at (.+)$", error.evidence)
    freed = re.search(r"freed by the backward at (.+?) in iteration", error.evidence)
    fix = _first_clause(error.fix)
    if error.kind == "in-place version error":
        why = "backward needs the values the forward saved; an in-place change replaced them"
        label = "a tensor this backward needs was changed in place after the forward saved it"
        if step is not None:
            step_place, step_code = _split(step.group(1))
            step_number = _line_number(step_place)
            lines.insert(0, CodeLine(step_place, step_code, (0, len(step_code)), "changed the weights it saved"))
            label = f"this backward needs weights that the optimizer step at line {step_number} changed"
            why = f"this backward goes through a forward computed before line {step_number}'s step changed its weights"
            gan = _gan_hint(step_code, raising.code)
            fix = f"compute the forward again after line {step_number}'s step{gan}"
            if error.stale_line is not None:
                stale_place, stale_code = _split(error.stale_line)
                stale_number = _line_number(stale_place)
                lines.insert(
                    0, CodeLine(stale_place, stale_code, (0, len(stale_code)), "computed with the old weights")
                )
                label = (
                    f"this backward goes through line {stale_number}, computed before the step at line {step_number}"
                )
                gan = _gan_hint(step_code, raising.code, stale_code)
                fix = f"compute line {stale_number} again after the step at line {step_number}{gan}"
        elif error.changed_line is not None:
            changed_place, changed_code = _split(error.changed_line)
            lines.insert(0, CodeLine(changed_place, changed_code, (0, len(changed_code)), "changed it in place"))
            changed_number = _line_number(changed_place)
            label = f"line {changed_number} changed in place a tensor this backward needs"
            why = f"the forward saved that tensor for the backward; line {changed_number} replaced its values"
    elif error.kind == "backward a second time":
        if freed is not None:
            freed_place, freed_code = _split(freed.group(1))
            lines.insert(0, CodeLine(freed_place, freed_code, (0, len(freed_code)), "freed the buffers"))
            label = f"a second backward through the graph that line {_line_number(freed_place)}'s backward freed"
        else:
            label = "a second backward through a graph whose buffers were freed"
        why = "a backward frees the saved tensors it walked; this one needs them again"
    elif error.kind == "other":
        label = f"the loop raised {error.message.split(':', 1)[0]}, before retain_graph matters"
        why = error.message
    else:
        label = f"the loop raised PyTorch's {error.kind} error"
        why = error.message
    return Item("error", label, tuple(lines), why, fix)


def _first_clause(fix: str) -> str:
    """A fix's first sentence, without the notebook pointer: the rest is evidence."""
    return re.sub(r"\s*\(notebook \d+, section \d+\)$", "", fix.split(". ")[0]).rstrip(".")


def _retain_item(line: LineVerdict) -> Item:
    place, code = _split(line.line)
    kept = f"kept {format_bytes(line.held_bytes)} no backward used" if line.held_bytes else "no backward uses it"
    runs = f"{line.runs} run{'s' if line.runs != 1 else ''}"
    if line.why == CREATE_GRAPH_KEEPS:  # a later backward may well walk what it kept: create_graph kept it anyway
        return Item(  # a note: written or not, the loop runs the same (WGAN-GP's published penalty writes it)
            "retain can go",
            f"retain_graph=True at line {_line_number(place)} adds nothing: create_graph=True keeps the graph anyway",
            (CodeLine(place, code, _span(code, "retain_graph=True"), "create_graph=True already keeps it"),),
            "retain_graph defaults to create_graph: with create_graph=True the buffers are kept whether or not "
            "retain_graph=True is written",
            f"remove retain_graph=True at line {_line_number(place)} if you like: the loop runs the same",
            to_fix=False,
        )
    return Item(
        "retain can go",
        f"retain_graph=True at line {_line_number(place)} keeps buffers no backward uses",
        (CodeLine(place, code, _span(code, "retain_graph=True"), kept),),
        f"in {runs}, no later backward walked what it kept: without it the loop runs the same",
        f"remove retain_graph=True at line {_line_number(place)}",
    )


def _note_item(note: Note) -> Item:
    place, code = _split(note.built_at)
    site = site_of(note.built_at)
    grows = _growing_line(note.name, site[0]) if site else None
    lines = (CodeLine(place, code, None, "each iteration's graph starts here"),)
    fix = "keep a number (`.item()`) or a detached tensor (`.detach()`) instead"
    if not note.one_element:  # `.item()` raises on a tensor of several numbers
        fix = "keep a detached tensor (`.detach()`) instead"
    if grows is not None:
        number, text, appended = grows
        lines = (CodeLine(f"{place.rsplit(':', 1)[0]}:{number}", text, _span(text, note.name), "grows here"),)
        if appended and note.one_element:
            fix = f"`{note.name}.append({appended}.item())`, or `{appended}.detach()` if you need the tensor"
        elif appended:
            fix = f"`{note.name}.append({appended}.detach())`"
    each = f" (about {format_bytes(note.held_bytes)} each)" if note.held_bytes else ""
    if note.reset:  # total = 0 every few passes: it holds several, not all
        label = f"`{note.name}` keeps several iterations' graphs alive at once"
        why = f"no later backward walks them, but `{note.name}` holds them until the loop resets it{each}"
    else:
        label = f"`{note.name}` keeps one more iteration's graph alive every iteration"
        why = f"no later backward walks them, but `{note.name}` holds them all{each}"
    return Item("note", label, lines, why, fix, to_fix=False)


def _parameters_item(model: str, notes: list[Note]) -> Item:
    """Parameters of one model that hold a graph: an in-place update (an EMA's) ran outside ``torch.no_grad()``."""
    place, code = _split(notes[0].built_at)
    number = _line_number(place)
    line = f"line {number}" if number != "?" else "the update"
    whose = f"`{model}`'s parameters hold" if len(notes) > 1 else f"`{notes[0].name}` holds"
    return Item(
        "note",
        f"{whose} a graph that grows every iteration",
        (CodeLine(place, code, (0, len(code)), "updates them with autograd recording"),),
        f"{line} runs outside torch.no_grad(): each update adds to the parameters' graph and keeps the old one",
        f"run {line} under `with torch.no_grad():`",
        to_fix=True,
    )


def _growing_line(name: str, filename: str) -> tuple[int, str, str | None] | None:
    """The line of ``filename`` where ``name`` grows (``losses.append(loss)``, ``losses.append(outputs.loss)``,
    ``history += [loss]``, ``cache[key] = out``), with what it appends when that is a name or an attribute; one that
    appends a number (``history.append(loss.item())``, a baseline before the loop) only if no other line grows it."""
    pattern = re.compile(
        rf"(?<![\w.]){re.escape(name)}\s*(\.append\(([\w.]+(?:\[[\w'\"]+\])?)\)|\.append\(|\.extend\(|\[[^\]]*\]\s*=[^=]|\+=)"
    )
    lines = enumerate((text.split("#", 1)[0] for text in linecache.getlines(filename)), 1)  # a comment quoting it: no
    found = [(number, code.strip(), match.group(2)) for number, code in lines if (match := pattern.search(code))]
    return next(
        (f for f in found if not re.search(r"\.(item|tolist)\(\)|\bfloat\(", f[1])), found[0] if found else None
    )


def build_report(v: Verdicts, runs_of: str | None = None, ended_by: str | None = None) -> Report:
    """The report of ``v``. ``runs_of``: a step's name, when a tool ran it (then iterations are its runs);
    ``ended_by``: how the loop ended when not by itself or an error (``SystemExit: 2``, ``KeyboardInterrupt``)."""
    band_aids = [line for line in v.lines if line.verdict == GOES_WITH_CARRIED]
    items: list[Item] = []
    groups: dict[str, list[CarriedFinding]] = {}
    for finding in v.carried:  # one item per graph (an LSTM's h and c come from one line) and per fix (the items of
        same = (key for key, found in groups.items() if finding.name and found[0].fix == finding.fix)  # one list)
        groups.setdefault(next(same, finding.built_at), []).append(finding)
    explained = v.error is not None and v.error.carried
    for index, findings in enumerate(groups.values()):
        first = index == 0
        error = v.error if explained and first else None
        items.append(_carried_item(findings, error, band_aids[0] if band_aids and first else None))
    if v.error is not None and not explained:
        items.append(_error_item(v.error))
    items += [_retain_item(line) for line in v.lines if line.verdict == "can go"]
    items += [_note_item(n) for n in v.notes if n.grows and not n.parameter]  # freed buffers too: the nodes pile up
    by_model: dict[str, list[Note]] = {}
    for note in v.notes:
        if note.parameter:
            by_model.setdefault(re.split(r"[\[.]", note.name, maxsplit=1)[0], []).append(note)
    items += [_parameters_item(model, notes) for model, notes in by_model.items()]
    return Report(_headline(v, items, runs_of, ended_by), tuple(items), _evidence(v), v.stopped_watching)


def _headline(v: Verdicts, items: list[Item], runs_of: str | None, ended_by: str | None) -> str:
    watched = (
        f"{plural(v.iterations_run, 'run')} of {runs_of}"
        if runs_of
        else plural(v.iterations_run, "iteration") + " watched"
    )
    if v.stopped_after is not None:
        watched += ", then stopped as asked"
    if ended_by is not None:
        watched += f"; {ended_by} ended the run"  # in the loop, or after it: a script's sys.exit(main())
    elif v.error is not None:
        watched += (
            f"; run {v.error.iteration} raised" if runs_of else f"; the loop raised in iteration {v.error.iteration}"
        )
    if v.calls == 0 and not items:
        return f"backward-twice: no backward call seen ({watched}): nothing to judge"
    fixes = sum(1 for item in items if item.to_fix)
    notes = len(items) - fixes
    if not items:
        retains = "no retain_graph=True to drop"
        return f"backward-twice: healthy ({watched}, {plural(v.calls, 'backward call')}, nothing carried, {retains})"
    counted = plural(fixes, "thing") + " to fix" if fixes else ""
    counted += (", " if counted else "") + plural(notes, "note") if notes else ""
    return f"backward-twice: {counted} ({watched})"


def _evidence(v: Verdicts) -> tuple[str, ...]:
    out = [f"iterations: {v.split.how}; {plural(v.calls, 'backward call')}"]
    if v.error is not None:
        out.append(f"error: {v.error.message}")
        if v.error.evidence:
            out.append(f"  {v.error.evidence}")
    for c in v.carried:
        built = "before the loop" if c.iteration is None else f"in iteration {c.iteration}"
        name = c.name or "(no name the loop holds)"
        out.append(f"carried: {name} built {built} at {_split(c.built_at)[0]}, walked from iteration {c.reached_from}")
    for line in v.lines:
        place, code = _split(line.line)
        out.append(f"retain_graph=True at {place}: {code}: {line.verdict}; {line.why}")
    for n in v.notes:
        out.append(f"held: {n.name} ({format_bytes(n.held_bytes)}{', grows' if n.grows else ''})")
    return tuple(out)


def _caret_lines(line: CodeLine, width: int) -> list[str]:
    out = [f"   {line.place.rjust(width)} | {line.code}"]
    if line.span is not None:
        start, end = line.span
        out.append(f"   {''.rjust(width)} | {' ' * start}{'^' * max(1, end - start)} {line.label}")
    elif line.label:
        out.append(f"   {''.rjust(width)} | {line.label}")
    return out


def render_text(report: Report, verbose: bool = False, more: str | None = None) -> str:
    out = [report.headline]
    if report.stopped_watching:
        out.append(report.stopped_watching)
    out += [f"note: {sentence}" for sentence in report.not_put_back]
    for number, item in enumerate(report.items, 1):
        out.append(f"{number}. {item.label}")
        width = max((len(line.place) for line in item.lines), default=0)
        for line in item.lines:
            out.extend(_caret_lines(line, width))
        out.append(f"   why: {item.why}")
        out.append(f"   {'fix' if item.to_fix else 'keep in mind'}: {item.fix}")
    if verbose:
        out += ["evidence:", *(f"  {line}" for line in report.evidence)]
    elif more and report.items:
        out.append(f"more: {more}")
    return "\n".join(out)


def render_html(report: Report) -> str:
    parts = [f"<div><p><b>{html.escape(report.headline)}</b></p>"]
    if report.stopped_watching:
        parts.append(f"<p>{html.escape(report.stopped_watching)}</p>")
    parts += [f"<p>note: {html.escape(sentence)}</p>" for sentence in report.not_put_back]
    if report.items:
        rows = []
        for item in report.items:
            width = max((len(line.place) for line in item.lines), default=0)
            code = "\n".join(text for line in item.lines for text in _caret_lines(line, width))
            rows.append(
                f"<li><b>{html.escape(item.label)}</b><pre>{html.escape(code)}</pre>why: {html.escape(item.why)}"
                f"<br><b>{'fix' if item.to_fix else 'keep in mind'}:</b> <code>{html.escape(item.fix)}</code></li>"
            )
        parts.append(f"<ol>{''.join(rows)}</ol>")
    evidence = html.escape("\n".join(report.evidence))
    parts.append(f"<details><summary>evidence</summary><pre>{evidence}</pre></details></div>")
    return "".join(parts)


def report_json(report: Report) -> dict[str, Any]:
    return {
        "headline": report.headline,
        "count": len(report.items),
        "items": [asdict(item) for item in report.items],
        "stopped_watching": report.stopped_watching,
        "not_put_back": list(report.not_put_back),
        "evidence": list(report.evidence),
    }
