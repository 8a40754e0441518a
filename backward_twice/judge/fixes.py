"""The fix a verdict gives, in the learner's own names: for each kind of PyTorch error, for a graph carried into a later
iteration (by the carrier's kind: a tensor, a tuple of states, a list rebound, built from whole or read by slice; the
same attributes of each item of one list, a cache's ``layers[i].keys`` and ``.values``, detached by one statement). A
second backward through buffers an earlier backward of the same iteration freed:
:mod:`backward_twice.judge.second_backward`; the learner's statement that changed a saved tensor in place:
:mod:`backward_twice.judge.in_place_fix`.

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.second_backward`,
:mod:`backward_twice.judge.verdicts`, :mod:`backward_twice.report.items` and :mod:`backward_twice.report.rendering`. A
state detached whole:
:mod:`backward_twice.judge.states`.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Protocol

from backward_twice.judge.states import as_spelled_in_its_methods, whole_state, whole_state_fix
from backward_twice.judge.trained_through import appended_to
from backward_twice.judge.uses import bound_in
from backward_twice.record.learner import lines_of_file, site_of, source_lines
from backward_twice.record.loops import loop_inside, outermost_loop_without
from backward_twice.record.sources import class_around, function_around, parsed

__all__ = ["ERROR_FIXES", "carried_fix", "items_of_one_list", "read_as_a_tensor", "total_fix"]

ERROR_FIXES = {
    "backward a second time": "a backward freed this graph's buffers and a later one goes through them: add "
    "retain_graph=True to the earlier backward only, or sum the losses and call "
    "backward() once",
    "in-place version error": "a tensor the graph saved was changed in place (x += ..., relu_(), "
    "optimizer.step()) before the backward through it: use the out-of-place form; "
    "after an optimizer.step(), compute the forward again (a GAN: G's loss on a fresh "
    "netD(fake)). Moving the step after the later backward runs, but takes that "
    "gradient through the old weights (notebook 03, section 3)",
    "donated buffers": "torch.compile compiled this backward for one use, free to reuse the saved buffers: at its "
    "first call when that call did not retain, or ahead of time under dynamic shapes (dynamic=True, or a batch "
    "size that changed, such as a smaller last batch), when even a first call that retains is refused: call "
    "backward once per forward (sum the losses), or get each loss's gradient from one "
    "torch.autograd.grad(torch.stack(losses), params, grad_outputs=torch.eye(n), is_grads_batched=True); only if "
    "the code must retain, keep torch._functorch.config.donated_buffer = False in force at every backward that "
    "retains (it is read at each call: setting it only while compiling is not enough) (notebook 06, section 2)",
    "DDP ready only once": "DistributedDataParallel all-reduces gradients by buckets, once per forward: a second "
    "backward through the same parameters is refused while a bucket still waits for a gradient the first left "
    "out, and when none waits its gradient is never averaged, without a word: sum the losses and call "
    "backward() once per forward ((l1 + l2).backward()); static_graph=True and "
    "find_unused_parameters=True do not make two backward calls right: they average the wrong "
    "gradients and fail one iteration later (notebook 06, section 3)",
    "no graph": "the loss was computed without a graph (under torch.no_grad(), from .detach() or .item(), or "
    "from tensors that need no gradient): compute it from the model's output with grad enabled",
    "other": "the loop stopped at this error: fix it first, then run the loop under the tool again",
}


def _a_term_kept_on_an_object(total: str, summed: tuple[str, int] | None, used: tuple[str, int] | None) -> bool:
    """Whether ``total`` (``self.aux_total``) is an attribute a later line of the loss reads as a term, and the
    function that adds to it does not return it (a framework's step returns the loss it is a term of): its graph is
    cut after that line, keeping the value it holds, where a running total returned as the loss (``return
    self.running_loss / (batch_idx + 1)``) starts again at 0."""
    if "." not in total or summed is None or used is None or summed[0] != used[0]:
        return False
    if not _read_into_the_loss(total, summed[0], summed[1], used[1]):
        return False
    tree = parsed(summed[0])
    function = function_around(tree, summed[1]) if tree is not None else None
    reads = re.compile(rf"(?<![\w.]){re.escape(total)}(?![\w])")
    returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value] if function else []
    return bool(returns) and not any(reads.search(ast.unparse(n.value)) for n in returns if n.value is not None)


def _read_into_the_loss(name: str, filename: str, added_at: int, backward_at: int) -> bool:
    """Whether a line after ``added_at`` and before the backward at ``backward_at`` reads ``name`` other than to add
    to it: the total is a term of the loss, not a log."""
    lines = source_lines(filename)
    reads = re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w])(?!\s*(?:\+=|=[^=]))")
    return any(reads.search(text) for text in lines[added_at : max(added_at, backward_at - 1)])


def _without_comment(code: str) -> str:
    """``code`` without a trailing comment (a ``#`` inside a string, ``w["mse#1"]``, is code)."""
    quote = ""
    for position, char in enumerate(code):
        if quote:
            quote = "" if char == quote and code[position - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return code[:position].strip()
    return code.strip()


def total_fix(summed_name: str, added: str, backward: str, read_in: tuple[str, int] | None = None) -> str:
    """The fix for a running total of losses kept as a tensor (``summed_name += added``, or ``= summed_name + added``)
    that ``backward`` (its code) walks: each backward walks this iteration's loss alone, the total kept as a number,
    or as a tensor without a graph where the function around ``read_in`` (file, line) reads it as a tensor
    (``total_loss.item()`` for its log)."""
    added = _without_comment(added)
    if re.fullmatch(r"[\w.]+", added):
        if read_in is not None and read_as_a_tensor(summed_name, *read_in):
            return (
                f"add a copy without its graph instead (`{summed_name} += {added}.detach()`) and call backward() "
                "on this iteration's loss"
            )
        return f"add a number instead (`{summed_name} += {added}.item()`) and call backward() on this iteration's loss"
    if summed_name == "loss" and re.search(r"(?<![\w.])loss\s*\.backward\(", backward):
        # ``loss += criterion(...); loss.backward()``: no other name for this iteration's loss
        return (
            f"assign instead of adding (`loss = {added}`): each backward() already adds this iteration's "
            "gradient to the .grad of the weights"
        )
    kept = (
        "a copy without its graph instead (`{} += loss.detach()`)"
        if read_in is not None and read_as_a_tensor(summed_name, *read_in)
        else "a number instead (`{} += loss.item()`)"
    )
    return (  # the term has no name of its own (Reptile's ``task_loss = task_loss + F.mse_loss(...)``): one for it
        f"name this iteration's loss (`loss = {added}`), call `loss.backward()`, and add {kept.format(summed_name)}"
    )


_NUMBER_SAFE_CALLS = frozenset(
    {"print", "str", "float", "int", "round", "format", "repr", "abs", "math.isfinite", "len", "sum", "min", "max"}
    | {"sorted", "math.fsum", "statistics.mean", "np.mean", "numpy.mean"}
)
_LIST_METHODS = frozenset({"append", "extend", "insert", "pop", "clear", "remove", "copy"})


def read_as_a_tensor(name: str, filename: str, line: int) -> bool:
    """Whether the function around ``line`` (the class, for ``self.`` names) reads ``name`` where a float would not do:
    a method of it (``total_loss.item()``, ``.isnan()``), or handed on (``logged.append(total_loss)``, later stacked).
    Reads a number serves as well are not: in an f-string, ``print``, ``float``, arithmetic, a comparison, its own
    ``+=`` and its ``.backward()`` (which the fix replaces)."""
    tree = parsed(filename)
    scope = function_around(tree, line) if tree is not None else None
    if scope is None:
        return False
    scope = (class_around((filename, line)) if name.startswith("self.") else None) or scope  # each method's reads
    parents = {id(child): node for node in ast.walk(scope) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(scope):
        if not isinstance(node, (ast.Name, ast.Attribute)) or ast.unparse(node) != name:
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        parent = parents.get(id(node))
        while isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, ast.Load):
            node, parent = parent, parents.get(id(parent))  # an item of it (``losses[-1]``) is read as the item is
        if isinstance(parent, ast.Attribute):  # a method or attribute of it: a float has almost none (a list's own
            if parent.attr != "backward" and parent.attr not in _LIST_METHODS:  # methods read no item)
                return True
        elif isinstance(parent, ast.Call) and node in parent.args:
            if ast.unparse(parent.func) not in _NUMBER_SAFE_CALLS:
                return True
        elif isinstance(parent, (ast.List, ast.Tuple, ast.Dict, ast.Return, ast.Subscript, ast.keyword)):
            return True
    return False


class Walked(Protocol):
    """What the backward that walked a carried graph saw of it: its shape, and that backward's line."""

    shape: tuple[int, ...] | None
    used_at: str
    lines_before: tuple[int, ...]  # built before the loop: the lines of the code that built it


def carried_fix(
    name: str | None,
    built_at: str,
    before_loop: bool,
    container: str | None = None,
    use: str | None = None,
    walked: Walked | None = None,
) -> str:
    """The fix for a carried graph, in the learner's own variable, as one imperative line (the report puts "before
    line 16" for "at the end of each iteration" where it knows the line the graph comes in at).

    A list that carries it (``use``, :func:`backward_twice.judge.built.list_use`) is detached item by item when the loop
    rebinds it every iteration (a Transformer-XL memory), cleared when the code reads it only whole (the log-probs
    REINFORCE collects for one update, which detached would give no gradient), and keeps detached copies when read by
    index or slice (a bank of recent features).

    A running total (``total += ...`` of one number, where ``walked`` tells: a state ``x = x + K @ y`` is not one)
    summed in a loop nested in the one whose pass walks it (``meta_loss`` over a meta-batch's tasks, at
    ``walked.used_at``) starts at 0 before that loop; one named ``loss`` and called backward() on each iteration
    (gradient accumulation written as ``loss += ...; loss.backward()``) is assigned, not added to; any other is kept
    as a number."""
    code = built_at.split(": ", 1)[-1]
    total = re.match(r"([\w.]+)\s*(?:\+=|=\s*\1\s*\+)\s*(.*)$", code)
    one_number = walked is None or walked.shape is None or math.prod(walked.shape) == 1
    summed, used = site_of(built_at), site_of(walked.used_at if walked is not None else "")
    if not before_loop and total and one_number and not _a_term_kept_on_an_object(total.group(1), summed, used):
        inside = loop_inside(summed[0], summed[1], used[1]) if summed and used and summed[0] == used[0] else None
        if inside is not None:
            return (
                f"set `{total.group(1)} = 0` before line {inside}, so each iteration's backward walks only the "
                "losses it adds"
            )
        if (
            summed
            and used
            and summed[0] == used[0]
            and _read_into_the_loss(total.group(1), summed[0], *summed[1:], used[1])
        ):
            # a regulariser the loss reads (A2C's ``entropy += ...``, then ``loss = ... - 0.01 * entropy``): its
            # gradient is wanted, this iteration's terms only
            first = outermost_loop_without(summed[0], summed[1], used[1]) or summed[1]  # an inner rollout's loop
            start = f"set `{total.group(1)} = 0` before line {first}"
            return f"{start}, so each iteration's backward walks only the terms it adds"
        backward = walked.used_at.split(": ", 1)[-1] if walked is not None else ""
        return total_fix(total.group(1), total.group(2).strip(), backward, summed)
    if name is None:
        return "detach the tensor that carries it at the end of each iteration, or build it inside the loop"
    if container == "parameter":  # a parameter is given a graph only by an in-place update autograd recorded
        update = site_of(built_at)
        line = f"line {update[1]}" if update else "the update that built it"
        return f"run {line} under `with torch.no_grad():`, so updating `{name}` records no graph"
    root = whole_state(name, container, built_at)
    if root is not None:
        return whole_state_fix(root)
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    if item and container == "dict" and re.search(r"\[\d+\]$", name):  # a memory kept per node id: every entry
        whole = item.group(1)
        return f"add `for key in {whole}: {whole}[key] = {whole}[key].detach()` at the end of each iteration"
    if item and container == "tuple":
        whole = item.group(1)
        return f"add `{whole} = tuple(s.detach() for s in {whole})` at the end of each iteration"
    if item and container == "list":
        whole = item.group(1)
        if use == "rebound":
            kept = "m.detach() if torch.is_tensor(m) else m" if _starts_as_numbers(whole, built_at) else "m.detach()"
            return f"add `{whole} = [{kept} for m in {whole}]` at the end of each iteration"
        if use == "whole" and before_loop:  # filled before the loop (an episode's rollout, then updates on it):
            # cleared after the first update, the next one has nothing to walk
            return (
                f"fill `{whole}` inside the loop, so each backward walks items built in its own iteration (or "
                f"`{whole} = [m.detach() for m in {whole}]` before it, if its items need no gradient)"
            )
        if use == "whole":
            return f"clear `{whole}` after each update (`{whole}.clear()`): each backward walks this iteration's items"
        appended, lines = (appended_to(whole, built_at) or (None,))[0], lines_of_file(built_at)
        backward = walked.used_at.split(": ", 1)[-1] if walked is not None else ""
        if appended and re.search(rf"(?<![\w.]){re.escape(whole)}\[[^\]]+\]\.backward\(", backward):  # old item
            return f"call `{appended}.backward()`: `{whole}[...]` reads an item an earlier pass appended"
        used = site_of(walked.used_at) if walked is not None else None
        if appended and use == "indexed" and used is not None and not _read_again(lines, whole, appended, used[1]):
            # the last few read back (a moving window) and this pass's only through the list: the items before
            # this pass's need no graph, this pass's keeps it until its backward
            return f"add `{whole}[-1] = {whole}[-1].detach()` after line {used[1]}'s backward"
        kept = f"{whole}.append({appended or 'out'}.detach())"
        return f"keep detached copies in `{whole}` (`{kept}`), or clear it each iteration"
    owner = re.match(r"^(\w+)\.\w+$", name)
    if before_loop and owner and _builds_an_owner(owner.group(1), built_at):
        built, used = site_of(built_at), site_of(walked.used_at) if walked is not None else None
        if (built is not None and used is not None and _iterated_by_the_loop(owner.group(1), *used)) or (
            built is not None and _builds_a_trainer(built_at)
        ):
            # ``for x, y in loader(dataset)``: the loop draws from the object made once; made again inside, it
            # would not be the one the loop reads; an agent that holds models and optimizers, made again, would
            # start training afresh each pass
            return f"add `{name} = {name}.detach()` after line {built[1]}, if it needs no gradient"
        return f"build `{owner.group(1)}` inside the loop (or from detached tensors, if it needs no gradient)"
    with_lines = _with_the_lines(walked.lines_before if walked is not None else (), built_at)
    if before_loop and walked is not None and re.search(rf"(?<![\w.]){re.escape(name)}\s*\.backward\(", walked.used_at):
        return f"compute `{name}` inside the loop{with_lines}: its backward needs a graph built in the same iteration"
    if before_loop and walked is not None and _taken_by_the_loop(name, walked):
        # the loop takes ``name`` from what was built before it (``for x, y in loader`` over slices of labels made
        # from weights that require grad): each pass's item brings that one graph in
        return (
            f"add `{name} = {name}.detach()` as the loop's body begins: the loop takes `{name}` from a graph built "
            "before it (build that inside the loop instead if it must train what it comes from)"
        )
    if before_loop:
        return f"compute `{name}` inside the loop{with_lines} (or `{name} = {name}.detach()`, if it needs no gradient)"
    if _differentiated(name, built_at):  # ``autograd.grad(loss, delta)``: a detached delta must ask for its gradient
        return f"add `{name} = {name}.detach().requires_grad_()` at the end of each iteration"
    return f"add `{name} = {name}.detach()` at the end of each iteration"


def read_after_its_build(
    name: str | None, entry: tuple[str, int] | None, built_at: str, body: tuple[str, int, int] | None
) -> str | None:
    """For an attribute the loop never assigns and reads before the call that builds it anew (``model.fc1.weight``,
    which pruning's forward pre-hook rebuilds at each ``model(data)``; a model's ``self.aux_loss`` set in its
    ``forward``): "move line N below line M (`output = model(data)`), ...". Read before that call, it is the previous
    iteration's; a detach there would take the gradient from what the loop computes with it (an L1 penalty).
    ``entry``: the line the old graph comes in at; ``body``: the iteration loop's (file, first line, last line). None
    where the loop assigns it, where a line of the loop built it that calls no owner of it after ``entry``, or where
    what ``entry`` assigns is read before that call."""
    owner = re.match(r"^(\w+)(?:\[[^\]]*\]|\.\w+)*\.\w+$", name or "")  # an attribute: model.fc1.weight, model[0].w
    if owner is None or entry is None or body is None or name is None:
        return None
    filename, first, last = body
    built = site_of(built_at)
    if entry[0] != filename or not first <= entry[1] < last or built is None:
        return None
    in_body = built[0] == filename and first <= built[1] <= last  # torch's module: built on the loop's call line
    if (in_body and built[1] <= entry[1]) or bound_in(name, body):
        return None
    lines = source_lines(filename)
    assigned = re.match(r"^([\w\s,]+?)\s*(?:=|\+=)(?!=)", lines[entry[1] - 1] if entry[1] <= len(lines) else "")
    if assigned is None:
        return None
    targets = [target.strip() for target in assigned.group(1).split(",") if target.strip().isidentifier()]
    for number in range(entry[1] + 1, min(last, len(lines)) + 1):
        text = lines[number - 1]
        if any(re.search(rf"(?<![\w.]){target}\b", text) for target in targets):
            return None  # read before the call: the line cannot move below it
        calls = re.search(rf"(?<![\w.]){owner.group(1)}(?:\.forward)?\s*\(", text)
        if calls and (not in_body or number == built[1]):
            return (
                f"move line {entry[1]} below line {number} (`{text}`), which builds `{name}` anew each iteration: "
                f"read before it, `{name}` is the previous iteration's"
            )
    return None


def _read_again(lines: list[str], whole: str, item: str, backward: int) -> bool:
    """Whether what the list's ``append`` line appends (``hidden`` of ``bank.append(hidden)``) is read again by its
    own name between the last such line before the backward's line ``backward`` of the same file and that line
    (``(hidden.sum() + recent.sum()).backward()``): then detached copies in the list leave this pass its gradient."""
    start = max((n for n, text in enumerate(lines[:backward], 1) if f"{whole}.append({item})" in text), default=None)
    if start is None or not item.isidentifier():
        return True
    return any(re.search(rf"(?<![\w.]){re.escape(item)}\b", text) for text in lines[start:backward])


_COMPUTE = re.compile(
    r"compute (`[^`]+`) inside the loop(, with lines [^(]+ that it comes from)? "
    r"\(or (`[^`]+`), if it needs no gradient\)"
)


def _with_the_lines(lines: tuple[int, ...], built_at: str) -> str:
    """The clause ", with lines 29 to 32 that it comes from" where the graph built before the loop took more lines
    than the one that gave the name its tensor: computing that one alone in the loop still walks the others' graph."""
    built = site_of(built_at)
    if len(lines) < 2 or built is None or built[1] not in lines:
        return ""
    return _lines_clause(list(lines), "it comes")


def _lines_clause(lines: list[int], comes: str) -> str:
    """ ", with lines 29 to 32 that it comes from" (or "lines 7, 9 and 10"; ``comes``: "it comes", "they come")."""
    if lines == list(range(lines[0], lines[-1] + 1)):
        return f", with lines {lines[0]} to {lines[-1]} that {comes} from"
    return f", with lines {', '.join(map(str, lines[:-1]))} and {lines[-1]} that {comes} from"


def _lines_named(clause: str) -> set[int]:
    """The lines of a clause ", with lines 29 to 32 that it comes from" (or "lines 7, 9 and 10")."""
    span = re.search(r"lines (\d+) to (\d+)", clause)
    if span:
        return set(range(int(span.group(1)), int(span.group(2)) + 1))
    return {int(number) for number in re.findall(r"\d+", clause)}


def one_graph_before_the_loop(fix: str, built_at: str, other_fix: str, other_built_at: str) -> bool:
    """Whether two names each to be computed inside the loop hold one graph built before it: the lines that built one
    hold the line that built the other (``act = relu(feat)``, then ``base = act.mean(0)``): moved in alone, either
    still leaves the other's part of the graph behind."""
    mine, other = _COMPUTE.fullmatch(fix), _COMPUTE.fullmatch(other_fix)
    built, other_built = site_of(built_at), site_of(other_built_at)
    if mine is None or other is None or built is None or other_built is None or built[0] != other_built[0]:
        return False
    lines = _lines_named(mine.group(2) or "") | {built[1]}
    other_lines = _lines_named(other.group(2) or "") | {other_built[1]}
    return built[1] in other_lines or other_built[1] in lines


def computed_inside(fixes: list[str]) -> str | None:
    """The fixes of several names of one graph built before the loop (``compute `X` inside the loop (or ...)``), as
    one that changes each (PPO's ``b_advantages`` and ``b_returns``), with every line any of them comes from; None
    unless there are several, all of that form."""
    matches = [_COMPUTE.fullmatch(fix) for fix in fixes]
    if len(matches) < 2 or not all(matches):
        return None
    names, detached = (" and ".join(dict.fromkeys(m.group(i) for m in matches if m)) for i in (1, 3))
    numbers = sorted(set().union(*(_lines_named(m.group(2)) for m in matches if m and m.group(2))))
    lines = _lines_clause(numbers, "they come") if len(numbers) > 1 else ""
    return f"compute {names} inside the loop{lines} (or {detached}, if they need no gradient)"


def _starts_as_numbers(whole: str, built_at: str) -> bool:
    """Whether the file of ``built_at`` starts the list ``whole`` as numbers (``self.losses_q = [0 for _ in ...]``,
    ``[0] * n``): its items become tensors only once added to, and a number has no ``.detach()``."""
    numbers = re.compile(rf"(?<![\w]){re.escape(whole.rsplit('.', 1)[-1])}\s*=\s*\[\s*0")
    return any(numbers.search(text) for text in lines_of_file(built_at))


def _taken_by_the_loop(name: str, walked: Walked) -> bool:
    """Whether the ``for`` whose body holds the backward that walked it binds ``name`` (``for x, y in loader``)."""
    used = site_of(walked.used_at)
    tree = parsed(used[0]) if used else None
    if used is None or tree is None:
        return False
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.For, ast.AsyncFor))
            and node.body[0].lineno <= used[1] <= (node.end_lineno or node.lineno)
            and name in {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        ):
            return True
    return False


def _differentiated(name: str, built_at: str) -> bool:
    """Whether the file of ``built_at`` asks for the gradient of ``name`` (``torch.autograd.grad(loss, delta)``,
    ``backward(inputs=[delta])``, ``input.grad``): an adversarial perturbation carried across batches, or DeepDream's
    image, which must stay a leaf; an attribute also as its object's methods spell it (``self.delta.grad``)."""
    spelled = "(?:" + "|".join(re.escape(each) for each in as_spelled_in_its_methods(name)) + ")"
    asked = re.compile(
        rf"\bgrad\(\s*[^,()]+,\s*[(\[]?\s*{spelled}\b|\binputs\s*=\s*[(\[]?\s*{spelled}\b|(?<![\w.]){spelled}\.grad\b"
    )
    return any(asked.search(text) for text in lines_of_file(built_at))


def _iterated_by_the_loop(owner: str, filename: str, line: int) -> bool:
    """Whether a ``for`` around ``line`` of ``filename`` takes its items from an expression that reads ``owner``."""
    tree = parsed(filename)
    loops = (n for n in ast.walk(tree) if isinstance(n, ast.For)) if tree is not None else iter(())
    return any(
        node.lineno <= line <= (node.end_lineno or 0)
        and any(isinstance(n, ast.Name) and n.id == owner for n in ast.walk(node.iter))
        for node in loops
    )


def _builds_an_owner(owner: str, built_at: str) -> bool:
    """Whether the line ``built_at`` makes ``owner`` (``dist = Normal(mu, sigma)``), other than a ``torch.nn`` module:
    a model built afresh each pass never trains, and a line that only calls one of its methods (``net.generate()``)
    makes an attribute, not the object."""
    assigns = re.match(rf"{re.escape(owner)}\s*=[^=]", built_at.split(": ", 1)[-1])
    return assigns is not None and not _builds_a_module(built_at)


def _builds_a_trainer(built_at: str) -> bool:
    """Whether the line ``built_at`` ("file:line: code") makes an object of a class of that file that builds an
    optimizer or reads weights (``agent = SacAgent()``, whose ``__init__`` makes ``Adam(self.policy.parameters())``)."""
    site, code = site_of(built_at), built_at.split(": ", 1)[-1]
    call = re.match(r"[\w.]+\s*=\s*([\w.]+)\(", code)
    tree = parsed(site[0]) if call is not None and site is not None else None
    name = call.group(1).rsplit(".", 1)[-1] if call is not None else ""
    return any(
        isinstance(node, ast.ClassDef) and node.name == name and _TRAINS.search(ast.unparse(node))
        for node in (ast.walk(tree) if tree is not None else ())
    )


_TRAINS = re.compile(r"\boptim\.|\.parameters\(\)|\b(Adam|AdamW|SGD|RMSprop)\(")


def _builds_a_module(built_at: str) -> bool:
    """Whether the line ``built_at`` ("file:line: code") builds a ``torch.nn`` module (``model = BaseModel()``, its
    class a subclass of ``nn.Module`` in that file; ``net = nn.Sequential(...)``)."""
    site, code = site_of(built_at), built_at.split(": ", 1)[-1]
    call = re.match(r"[\w.]+\s*=\s*([\w.]+)\(", code)
    if call is None or site is None:
        return False
    if re.match(r"(torch\.)?nn\.", call.group(1)):
        return True
    tree = parsed(site[0])
    classes = (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)) if tree is not None else ()
    return any(
        node.name == call.group(1).rsplit(".", 1)[-1] and any("Module" in ast.unparse(base) for base in node.bases)
        for node in classes
    )


def items_of_one_list(names: list[str]) -> tuple[str, str] | None:
    """Names that are the same attributes of each item of one list (``cache.layers[0].keys``, ``.values``, then
    ``cache.layers[1].keys``, ...: every attribute of every item) as one spelling (```cache.layers[i].keys` and
    `cache.layers[i].values` (i = 0, 1)``) and one statement that detaches them all (``for layer in cache.layers:
    layer.keys, layer.values = layer.keys.detach(), layer.values.detach()``), or, for some items only, one over their
    indices (``for i in (2, 5, 8): net[i].mem = net[i].mem.detach()``); None for any other names."""
    parts = [re.fullmatch(r"(.+)\[(\d+)\]\.(\w+)", name) for name in names]
    if len(names) < 3 or any(part is None for part in parts):
        return None
    owners = {part.group(1) for part in parts if part is not None}
    indices = sorted({int(part.group(2)) for part in parts if part is not None})
    attributes = list(dict.fromkeys(part.group(3) for part in parts if part is not None))
    if len(owners) != 1 or len(names) != len(indices) * len(attributes):
        return None
    owner = owners.pop()
    last = re.split(r"[.\[\]']+", owner.rstrip("]'"))[-1]
    item = last[:-1] if last.endswith("s") and len(last) > 1 and last[:-1].isidentifier() else "item"
    spelled = " and ".join(f"`{owner}[i].{attribute}`" for attribute in attributes)
    numbers = ", ".join(str(index) for index in indices)
    if indices != list(range(len(indices))):  # some items only (a spiking net's neurons among its layers): the
        # others may lack the attribute
        targets = ", ".join(f"{owner}[i].{attribute}" for attribute in attributes)
        detached = ", ".join(f"{owner}[i].{attribute}.detach()" for attribute in attributes)
        return f"{spelled} (i = {numbers})", f"for i in ({numbers}): {targets} = {detached}"
    targets = ", ".join(f"{item}.{attribute}" for attribute in attributes)
    detached = ", ".join(f"{item}.{attribute}.detach()" for attribute in attributes)
    return f"{spelled} (i = {numbers})", f"for {item} in {owner}: {targets} = {detached}"
