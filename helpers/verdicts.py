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

Used by :mod:`helpers.watcher`, :mod:`helpers.audit`, :mod:`helpers.carried` and :mod:`helpers.diagnose`.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass, field

from helpers.display import format_bytes
from helpers.errors import error_kind

from helpers.learner import place, short
from helpers.names import NamedGraph
from helpers.recorder import CallRecord, Recorder, Split, split_iterations

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
                              "optimizer.step()) before the backward through it: use the out-of-place form, "
                              "or call optimizer.step() after every backward through this graph",
    "no graph": "the loss was computed without a graph (under torch.no_grad(), from .detach() or .item(), or "
                "from tensors that need no gradient): compute it from the model's output with grad enabled",
    "other": "the loop fails before retain_graph matters: fix this error first",
}


def judge(recorder: Recorder) -> Verdicts:
    split = split_iterations(recorder)
    calls = recorder.calls
    carried = _carried(recorder, split)
    lines = _lines(calls, split, recorder)
    notes = _notes(recorder)
    error = _error(recorder, split, carried)
    partial = len(calls) > (split.ends[-1][1] if split.ends else 0) or recorder.error is not None
    run = split.count + (1 if partial else 0)
    return Verdicts(split, run, len(calls), lines, carried, notes, error,
                    recorder.iterations if recorder.stopped else None)


def _lines(calls: list[CallRecord], split: Split, recorder: Recorder) -> list[LineVerdict]:
    groups: dict[tuple[str, int], list[CallRecord]] = {}
    for call in calls:
        if call.retain_graph:
            groups.setdefault(call.site, []).append(call)
    verdicts = []
    for runs in groups.values():
        line = runs[0].line
        held = max(c.held_after_bytes for c in runs)
        if any(c.create_graph for c in runs):
            verdicts.append(LineVerdict(line, "not a retain (create_graph)", len(runs), 0, held, CREATE_GRAPH_NOTE,
                                        "nothing to change here"))
            continue
        needed = [c for c in runs if c.needed_by]
        if needed:
            later = calls[needed[0].needed_by[0]]
            same = split.iteration_of_call(later.index) == split.iteration_of_call(needed[0].index)
            when = "in the same iteration" if same else f"in iteration {split.iteration_of_call(later.index)}"
            why = (f"needed in {len(needed)} of {len(runs)} runs: a later backward, {short(later.line)}, walks the "
                   f"buffers it kept ({when})")
            verdicts.append(LineVerdict(line, "needed", len(runs), len(needed), held, why,
                                        f"keep retain_graph=True at {short(line)}"))
        else:
            stopped = " before the error" if recorder.error is not None else ""
            why = (f"can go: in {len(runs)} run{'s' if len(runs) != 1 else ''}{stopped} no later backward walks the "
                   f"buffers it kept ({format_bytes(held)} held after it)")
            verdicts.append(LineVerdict(line, "can go", len(runs), 0, held, why,
                                        f"remove retain_graph=True at {short(line)}"))
    return verdicts


def _carried(recorder: Recorder, split: Split) -> list[CarriedFinding]:
    found: dict[str, dict] = {}
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        old = [seq for seq in call.old if split.iteration_of_node(seq) < iteration]
        if not old:
            continue
        named = [recorder.names[seq] for seq in old if seq in recorder.names]
        if named:
            newest = max(named, key=lambda n: n.sequence)
            built = split.iteration_of_node(newest.sequence)
            line = built_line(newest, built == 0, recorder)
            name = newest.name
        else:
            built = split.iteration_of_node(max(old))
            name, line = None, f"(no name the loop holds; built {_when(built)})"
        key = line if name is None else f"{line}|{name}"
        entry = found.get(key)
        if entry is None:
            found[key] = {"name": name, "built_at": line, "iteration": built or None, "used_at": call.line,
                          "reached_from": iteration, "times": {iteration}}
        else:
            entry["times"].add(iteration)
    return [CarriedFinding(e["name"], e["built_at"], e["iteration"], e["used_at"], e["reached_from"],
                           len(e["times"]), carried_fix(e["name"], e["built_at"], e["iteration"] is None))
            for e in found.values()]


def _notes(recorder: Recorder) -> list[Note]:
    by_name: dict[str, Note] = {}
    for named, held in recorder.unwalked.values():
        if named.sequence in recorder.names and held:
            note = Note(named.name, built_line(named, named.sequence < recorder.start, recorder), held)
            by_name[named.name] = note  # the latest graph the name held
    return list(by_name.values())


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
        evidence = (f"the buffers it needs were freed by the backward at {short(freer.line)} in iteration "
                    f"{split.iteration_of_call(freer.index)}; this backward reached them{through}")
        if carried:
            fix = carried[0].fix
    elif record.changed_by_step is not None:
        evidence = f"a tensor it saved was changed in place by the optimizer step at {short(record.changed_by_step)}"
    elif kind == "in-place version error":
        evidence = "a tensor it saved was changed in place after it was saved"
    return ErrorVerdict(kind, record.message, record.line, iteration, evidence, fix)


def _when(iteration: int) -> str:
    return "before the first iteration" if iteration == 0 else f"in iteration {iteration}"


def carried_fix(name: str | None, built_at: str, before_loop: bool) -> str:
    """The fix for a carried graph, in the learner's own variable."""
    code = built_at.split(": ", 1)[-1]
    total = re.match(r"(\w+)\s*(?:\+=|=\s*\1\s*\+)", code)
    if not before_loop and total:
        return (f"add a number instead ({total.group(1)} += loss.item()) and call backward() on this "
                f"iteration's loss alone")
    if name is None:
        return "detach the tensor that carries it at the end of each iteration, or build it inside the loop"
    tuple_item = re.match(r"^(.*)\[(\d+)\]$", name)
    if tuple_item and not before_loop:
        whole = tuple_item.group(1)
        return f"detach it at the end of each iteration ({whole} = tuple(s.detach() for s in {whole})), or rebuild it"
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
    if named.frame is None:
        return f"(the name {named.name})"
    filename, first_line, code_name = named.frame
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except SyntaxError:
        tree = None
    line = None if tree is None else _assignment(tree, named, first_line, code_name, before_loop)
    if line is None:
        return f"{place(filename, first_line)} ({named.name}, {code_name})"
    return f"{place(filename, line)}: {linecache.getline(filename, line).strip()}"


def _assignment(tree: ast.Module, named: NamedGraph, first_line: int, code_name: str,
                before_loop: bool) -> int | None:
    scope: ast.AST = tree
    if not named.is_global and code_name != "<module>":
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    min([node.lineno, *(d.lineno for d in node.decorator_list)]) == first_line):
                scope = node
                break
    spelled = named.name
    root = re.match(r"\w*", spelled).group(0)
    attribute = spelled.rsplit(".", 1)[-1] if "." in spelled else None
    found: list[tuple[int, bool]] = []  # (line, inside a loop)

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and scope is tree \
                    and not named.is_global and attribute is None:
                continue
            loop = in_loop or isinstance(child, (ast.For, ast.While, ast.AsyncFor))
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _may_build(child.value):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                if any(_binds(t, root, attribute, spelled) for t in targets):
                    found.append((child.lineno, in_loop))
            visit(child, loop)

    visit(scope, False)
    if not found and attribute is not None:  # self.memory = ... in a method of the module's class
        visit(tree, False)
    if not found:
        return None
    if before_loop:
        outside = [line for line, in_loop in found if not in_loop]
        return (outside or [found[0][0]])[-1]
    inside = [line for line, in_loop in found if in_loop]
    return (inside or [line for line, _ in found])[-1]


def _may_build(value: ast.AST | None) -> bool:
    """Whether an assignment's value can build a graph: not a constant, not ``x.detach()`` or ``x.item()``."""
    if value is None or isinstance(value, ast.Constant):
        return False
    return not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("detach", "detach_", "item", "tolist", "numpy"))


def _binds(target: ast.AST, root: str, attribute: str | None, spelled: str) -> bool:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and node.id == root and attribute is None:
            return True
        if attribute is not None and isinstance(node, ast.Attribute) and node.attr == attribute:
            return True
        if isinstance(node, ast.Subscript) and ast.unparse(node) == spelled.replace("'", "'"):
            return True
    return False
