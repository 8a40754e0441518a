"""Verdicts from what a :class:`helpers.recorder.Recorder` saw run, never from a modified run.

* iterations (:func:`split_iterations`): the learner's ``next_iteration()`` marks if there are any; else the steps of
  the optimizer that stepped first last (in a GAN the generator's, after the critic's five); else a new iteration
  at each call of the first backward line. The split says which rule it used;
* a ``retain_graph=True`` is needed when a later backward walks a node with saved tensors that it kept (the same
  iteration or a later one); it can go when none does. One verdict per source line, with its counts;
* a graph is carried when a backward walks a node built in an earlier iteration or before the first; the name
  that held it at an event (:class:`helpers.recorder.NamedGraph`) gives the fix its variable and the assignment
  that built it (read with ``ast``). A named graph that holds bytes and that no backward walks is a note;
* the error, by kind (:func:`helpers.errors.error_kind`), with the recorder's evidence.

Used by :mod:`helpers.audit`, :mod:`helpers.diagnose`, :mod:`helpers.harness` and :mod:`helpers.watcher`.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass, field

from helpers.display import format_bytes
from helpers.errors import error_kind
from helpers.iterations import Split, split_iterations
from helpers.learner import place, short
from helpers.names import NamedGraph
from helpers.recorder import Recorder
from helpers.walks import CallRecord

__all__ = ["ERROR_FIXES", "CarriedFinding", "ErrorVerdict", "LineVerdict", "Note", "Verdicts", "judge"]

CREATE_GRAPH_NOTE = "create_graph=True: builds a graph of the gradient; not a retain that can go"


@dataclass(frozen=True)
class LineVerdict:
    """One source line's verdict over all its runs: the line, "needed", "can go" or a note ("create_graph"), how
    many runs (calls of the line) and how many a later backward needed, the most bytes it kept, why and the fix."""

    line: str
    verdict: str
    runs: int
    needed_runs: int
    held_bytes: int
    why: str
    fix: str


@dataclass(frozen=True)
class CarriedFinding:
    """A graph a later backward walks: the name that held it (None: no name the loop holds), the line that built it,
    the iteration that built it (None: before the first), the line and iteration of the backward that walked it,
    how many iterations walked such a graph, and the fix."""

    name: str | None
    built_at: str
    iteration: int | None
    used_at: str
    reached_from: int
    times: int
    fix: str
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Note:
    """A graph a name keeps alive that no backward walks: the name, the line that built it, its bytes."""

    name: str
    built_at: str
    held_bytes: int


@dataclass(frozen=True)
class ErrorVerdict:
    """The error: kind, first line, the learner's line, iteration, the recorder's evidence and the fix."""

    kind: str
    message: str
    line: str
    iteration: int
    evidence: str
    fix: str


@dataclass(frozen=True)
class Verdicts:
    """Everything judged from one recording."""

    split: Split
    iterations_run: int
    calls: int
    lines: list[LineVerdict] = field(default_factory=list)
    carried: list[CarriedFinding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    error: ErrorVerdict | None = None
    stopped_after: int | None = None  # watch(iterations=N) ended the loop after N iterations


ERROR_FIXES = {
    "backward a second time": "a backward freed this graph's buffers and a later one goes through them: add "
    "retain_graph=True to the earlier backward only, or sum the losses and call "
    "backward() once",
    "in-place version error": "a tensor the graph saved was changed in place (x += ..., relu_(), "
    "optimizer.step()) before the backward through it: use the out-of-place form; "
    "after an optimizer.step(), compute the forward again (a GAN: G's loss on a fresh "
    "netD(fake)). Moving the step after the later backward runs, but takes that "
    "gradient through the old weights (notebook 03, section 3)",
    "donated buffers": "torch.compile compiled this backward for one use (its first call did not retain), so it "
    "may reuse the saved buffers: call backward once per forward (sum the losses), or get each "
    "loss's gradient from one torch.autograd.grad(torch.stack(losses), params, "
    "grad_outputs=torch.eye(n), is_grads_batched=True); set "
    "torch._functorch.config.donated_buffer = False before compiling only if the code must "
    "retain (notebook 06, section 2)",
    "DDP ready only once": "DistributedDataParallel all-reduces each parameter once per backward, and a second "
    "backward through the same parameters marks them ready again: sum the losses and call "
    "backward() once per forward ((l1 + l2).backward()); static_graph=True and "
    "find_unused_parameters=True do not make two backward calls right: they fail one "
    "iteration later or average the wrong gradients (notebook 06, section 3)",
    "no graph": "the loss was computed without a graph (under torch.no_grad(), from .detach() or .item(), or "
    "from tensors that need no gradient): compute it from the model's output with grad enabled",
    "other": "the loop fails before retain_graph matters: fix this error first",
}


def judge(recorder: Recorder) -> Verdicts:
    split = split_iterations(recorder)
    calls = recorder.calls
    carried = _carried(recorder, split)
    lines = _lines(calls, split, recorder)
    carried_names = {c.name for c in carried if c.name}
    notes = [n for n in _notes(recorder, split) if n.name not in carried_names]  # carried already says it
    error = _error(recorder, split, carried)
    partial = len(calls) > (split.ends[-1].calls if split.ends else 0) or recorder.error is not None
    run = split.count + (1 if partial else 0)
    return Verdicts(
        split, run, len(calls), lines, carried, notes, error, recorder.iterations if recorder.stopped else None
    )


def _lines(calls: list[CallRecord], split: Split, recorder: Recorder) -> list[LineVerdict]:
    groups: dict[tuple[str, int], list[CallRecord]] = {}
    for call in calls:
        if call.retain_graph and call.error is None:  # the call that raised did not run
            groups.setdefault(call.site, []).append(call)
    verdicts = []
    for runs in groups.values():
        line = runs[0].line
        held = max(c.held_after_bytes for c in runs)
        if any(c.create_graph for c in runs):
            if _writes_retain(runs[0].site):  # written out, yet create_graph implies it
                verdicts.append(
                    LineVerdict(
                        line,
                        "can go",
                        len(runs),
                        0,
                        held,
                        "can go: create_graph=True keeps the graph anyway (retain_graph defaults to create_graph)",
                        "remove retain_graph=True",
                    )
                )
            else:
                verdicts.append(
                    LineVerdict(
                        line,
                        "not a retain (create_graph)",
                        len(runs),
                        0,
                        held,
                        CREATE_GRAPH_NOTE,
                        "nothing to change here",
                    )
                )
            continue
        needed = [c for c in runs if c.needed_by]
        if needed:
            later = calls[needed[0].needed_by[0]]
            same = split.iteration_of_call(later.index) == split.iteration_of_call(needed[0].index)
            when = "in the same iteration" if same else f"in iteration {split.iteration_of_call(later.index)}"
            why = (
                f"needed in {len(needed)} of {len(runs)} runs: a later backward, {short(later.line)}, walks the "
                f'buffers it kept ({when}); without it, that backward raises "Trying to backward through the '
                f'graph a second time"'
            )
            verdicts.append(
                LineVerdict(
                    line,
                    "needed",
                    len(runs),
                    len(needed),
                    held,
                    why,
                    f"keep it: a later backward needs these buffers ({short(later.line)})",
                )
            )
        else:
            stopped = " before the error" if recorder.error is not None else ""
            why = (
                f"can go: in {len(runs)} run{'s' if len(runs) != 1 else ''}{stopped} no later backward walks the "
                f"buffers it kept, so without it the step runs the same: it only kept {format_bytes(held)} alive"
            )
            verdicts.append(LineVerdict(line, "can go", len(runs), 0, held, why, "remove retain_graph=True"))
    return verdicts


def _carried(recorder: Recorder, split: Split) -> list[CarriedFinding]:
    """One finding per name and line that built it: each named node a backward walks that an earlier iteration
    built (or that was built before the first); a walk through old nodes no name holds is one finding too."""
    found: dict[str, _Carried] = {}

    def add(key: str, sighting: _Carried) -> None:
        known = found.get(key)
        if known is None:
            found[key] = sighting
        else:
            known.times.add(sighting.reached_from)

    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        old = [seq for seq in call.old if split.iteration_of_node(seq) < iteration]
        if not old:
            continue
        top = [seq for seq in call.frontier if split.iteration_of_node(seq) < iteration]
        named = [recorder.names[seq] for seq in top if seq in recorder.names]
        for node in named:
            built = split.iteration_of_node(node.sequence)
            line = built_line(node, built == 0, recorder)
            name, container = node.name, node.container
            carrier = recorder.carriers.get(node.sequence)
            if carrier is not None and carrier != name:  # out = model(x); outputs.append(out): outputs[0] carries
                name = carrier
                container = "list" if re.search(r"\[\d+\]$", carrier) and container is None else container
            for spelled in (name, *(a for a in node.aliases if carrier is None or carrier == node.name)):
                add(
                    f"{line}|{spelled}",
                    _Carried(spelled, line, built or None, call.line, container, node.shape, iteration, {iteration}),
                )
        if not named:
            built = split.iteration_of_node(max(old))
            line = f"(no name the loop holds; built {_when(built)})"
            add(line, _Carried(None, line, built or None, call.line, None, None, iteration, {iteration}))
    return [
        CarriedFinding(
            e.name,
            e.built_at,
            e.iteration,
            e.used_at,
            e.reached_from,
            len(e.times),
            carried_fix(e.name, e.built_at, e.iteration is None, e.container),
            e.shape,
        )
        for e in found.values()
    ]


@dataclass(slots=True)
class _Carried:
    """A carried graph as the first backward that walked it saw it (the fields of :class:`CarriedFinding`, and
    the container its name is an item of); ``times`` gathers every iteration whose backward walked it."""

    name: str | None
    built_at: str
    iteration: int | None
    used_at: str
    container: str | None
    shape: tuple[int, ...] | None
    reached_from: int
    times: set[int]


def _notes(recorder: Recorder, split: Split) -> list[Note]:
    """Graphs a name still held in a later iteration than the one that built them (or, built before the loop, in
    the first), that no backward of that iteration or a later one walked."""
    walked: dict[int, int] = {}  # node -> the last iteration whose backward walked it
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        for sequence in call.old:
            walked[sequence] = max(walked.get(sequence, 0), iteration)
    last = max(1, split.count + (1 if recorder.error is not None else 0))
    by_name: dict[str, Note] = {}
    for sequence, held_graph in recorder.held_from.items():
        holder = held_graph.holder
        held = split.iteration_of_sighting(held_graph.sighting)
        built = split.iteration_of_node(sequence)
        if not built < held <= last or walked.get(sequence, 0) >= held:
            continue
        if _below_a_submodule(holder):  # a loss module's self.loss: the model's own bookkeeping
            continue
        named = recorder.names[sequence]
        by_name.setdefault(holder, Note(holder, built_line(named, built == 0, recorder), held_graph.graph_bytes))
    return list(by_name.values())


def _writes_retain(site: tuple[str, int]) -> bool:
    """Whether the call at ``site`` (file, line) spells out ``retain_graph=`` (also on a later line of the call)."""
    filename, lineno = site
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except SyntaxError:
        return "retain_graph" in linecache.getline(filename, lineno)
    return any(
        isinstance(node, ast.Call)
        and node.lineno <= lineno <= (node.end_lineno or node.lineno)
        and any(k.arg == "retain_graph" for k in node.keywords)
        for node in ast.walk(tree)
    )


def _below_a_submodule(name: str) -> bool:
    """``model.block.loss`` (an attribute two levels below what the loop holds), not ``model.hidden``."""
    return re.sub(r"^\w+(\[[^\]]*\])*", "", name).count(".") > 1


def _error(recorder: Recorder, split: Split, carried: list[CarriedFinding]) -> ErrorVerdict | None:
    record = recorder.error
    if record is None:
        return None
    kind = error_kind(record.message)
    calls = recorder.calls
    iteration = split.iteration_of_call(record.call) if record.call is not None else max(1, split.count + 1)
    evidence, fix = "", ERROR_FIXES[kind]
    if record.freed_by is not None:
        freer = calls[record.freed_by]
        through = f" through {record.reached_through.name}" if record.reached_through is not None else ""
        evidence = (
            f"the buffers it needs were freed by the backward at {short(freer.line)} in iteration "
            f"{split.iteration_of_call(freer.index)}; this backward reached them{through}"
        )
        if carried:
            fix = carried[0].fix
    elif record.changed_by_step is not None:
        evidence = f"a tensor it saved was changed in place by the optimizer step at {short(record.changed_by_step)}"
    elif kind == "in-place version error":
        evidence = "a tensor it saved was changed in place after it was saved"
    return ErrorVerdict(kind, record.message, record.line, iteration, evidence, fix)


def _when(iteration: int) -> str:
    return "before the first iteration" if iteration == 0 else f"in iteration {iteration}"


def carried_fix(name: str | None, built_at: str, before_loop: bool, container: str | None = None) -> str:
    """The fix for a carried graph, in the learner's own variable."""
    code = built_at.split(": ", 1)[-1]
    total = re.match(r"(\w+)\s*(?:\+=|=\s*\1\s*\+)", code)
    if not before_loop and total:
        return (
            f"add a number instead ({total.group(1)} += loss.item()) and call backward() on this iteration's loss alone"
        )
    if name is None:
        return "detach the tensor that carries it at the end of each iteration, or build it inside the loop"
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    if item and container == "tuple":
        whole = item.group(1)
        return f"detach it at the end of each iteration ({whole} = tuple(s.detach() for s in {whole})), or rebuild it"
    if item and container == "list":
        whole = item.group(1)
        return f"keep detached copies in {whole} ({whole}.append(out.detach())), or clear it each iteration"
    owner = re.match(r"^(\w+)\.\w+$", name)
    if before_loop and owner:
        return f"build {owner.group(1)} inside the loop, or from detached tensors if it needs no gradient"
    if before_loop:
        return f"compute it inside the loop, or detach it ({name} = {name}.detach()) if it needs no gradient"
    return f"detach it at the end of each iteration ({name} = {name}.detach()), or rebuild it inside the loop"


def built_line(named: NamedGraph, before_loop: bool, recorder: Recorder) -> str:
    """The learner's line that built ``named``'s node (:class:`helpers.lines.CreationLines`), as "file:line: code";
    for a node built before the recorder started, the assignment to its variable: outside loops (the last one)
    for one built before the first iteration, in a loop otherwise; else where the name was found."""
    site = recorder.creation.line_of(named.sequence) if not before_loop else None
    if site is not None:
        return f"{place(*site)}: {linecache.getline(*site).strip()}"
    # Where the name was found, then the code the step was given in (a notebook: another cell, perhaps).
    places = [where for where in (named.frame, recorder.roots_where) if where is not None]
    for index, (filename, first_line, code_name) in enumerate(places):
        if index and filename == places[0][0]:
            continue
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except SyntaxError:
            continue
        line = _assignment(tree, named, first_line, code_name, before_loop)
        if line is not None:
            return f"{place(filename, line)}: {linecache.getline(filename, line).strip()}"
    if not places:
        return f"(the name {named.name})"
    filename, first_line, code_name = places[0]
    return f"{place(filename, first_line)} ({named.name}, {code_name})"


def _assignment(tree: ast.Module, named: NamedGraph, first_line: int, code_name: str, before_loop: bool) -> int | None:
    """The line of the assignment that built ``named``'s value, searched from the function it was found in
    outward: the functions around it (a step defined inside a test or a cell), the module's top level, then the
    whole file (``y = model(x)`` in a ``build()`` that returns ``{"y": y}``). Assignments that only alias a value
    (``y = state["y"]``) or cannot build a graph (``h = h.detach()``) do not count. Built in an iteration: the
    last one inside a loop; built before the first: the last one outside loops before the function's own line."""
    spelled = named.name
    root = re.split(r"\W", spelled, maxsplit=1)[0]  # the leading word: "state" of state['h'], "" of ['h']
    keys = re.findall(r"\[['\"](\w+)['\"]\]", spelled)
    attribute = re.findall(r"\.(\w+)", spelled)
    wanted = {root, *keys[-1:], *attribute[-1:]} - {""}
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    around = (
        []
        if named.is_global or code_name == "<module>"
        else sorted(
            (
                node
                for node in ast.walk(tree)
                if isinstance(node, functions) and node.lineno <= first_line <= (node.end_lineno or node.lineno)
            ),
            key=lambda node: -node.lineno,
        )
    )
    for scope, nested in [*((f, False) for f in around), (tree, False), (tree, True)]:
        found = _assignments_to(wanted, scope, nested)
        if not found:
            continue
        if before_loop:
            outside = [line for line, in_loop in found if not in_loop] or [line for line, _ in found]
            earlier = [line for line in outside if line < first_line]
            return earlier[-1] if earlier else outside[0]
        inside = [line for line, in_loop in found if in_loop]
        return (inside or [line for line, _ in found])[-1]
    return None


def _assignments_to(wanted: set[str], scope: ast.AST, nested: bool) -> list[tuple[int, bool]]:
    """(line, inside a loop) of each assignment in ``scope`` that binds one of ``wanted`` with a value that may
    build a graph; the functions, classes and lambdas inside ``scope`` are searched too only if ``nested``."""
    found: list[tuple[int, bool]] = []
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, scopes) and child is not scope and not nested:
                continue  # a scope of its own: searched when it is around the name, or in the last pass
            loop = in_loop or isinstance(child, (ast.For, ast.While, ast.AsyncFor))
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _may_build(child.value):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                if any(_binds(t, wanted) for t in targets):
                    found.append((child.lineno, in_loop))
            visit(child, loop)

    visit(scope, False)
    return found


def _may_build(value: ast.AST | None) -> bool:
    """Whether an assignment's value can build a graph: not a constant, not a mere alias (``y = state["y"]``,
    ``a, b = x, y``), not ``x.detach()`` or ``x.item()``."""
    if value is None or isinstance(value, (ast.Constant, ast.Name, ast.Subscript, ast.Attribute)):
        return False
    if isinstance(value, ast.Tuple):
        return any(_may_build(item) for item in value.elts)
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in ("detach", "detach_", "item", "tolist", "numpy")
    )


def _binds(target: ast.AST, wanted: set[str]) -> bool:
    """Whether an assignment target binds one of ``wanted``: a name, an attribute or a string key."""
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and node.id in wanted and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Attribute) and node.attr in wanted and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in wanted:
            return True
    return False
