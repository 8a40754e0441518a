"""Find the tensor that carries one iteration's autograd graph into the next, and the learner's line that built it.

Most people who meet "Trying to backward through the graph a second time" call ``backward()`` once per
iteration: the error comes on iteration 2 because something from iteration 1 (a hidden state not
detached, a tensor computed once before the loop, ``total_loss = total_loss + loss``, state kept on a
module, a list of outputs, a distribution built once) still carries its graph. :func:`find_carried_graph`
runs one iteration of the learner's loop a few times, as written, and names that tensor.

How, with public torch APIs only:

* while each iteration runs, a :class:`torch.overrides.TorchFunctionMode` sees every torch call. It stamps
  each output's ``grad_fn.metadata`` (a per-node dict) with this run, the iteration number, the output's
  shape and the learner's source line: the first frame (``sys._getframe``) outside torch, outside
  ``helpers/`` and outside the standard library and site-packages, read with ``linecache``;
* an input whose ``grad_fn`` has no stamp was built outside the mode: if nothing under it bears a stamp,
  it was built before the first iteration (a graph only points back in time);
* at the end of each iteration a walk of ``next_functions`` from the nodes stamped in it (held only until
  then) stamps the nodes one C++ op builds inside itself (``nn.LSTM``'s) with the iteration of the node
  above them, and stops at each node of an earlier iteration or from before the loop: that node is a
  finding. Parameters (``AccumulateGrad``) never are;
* the names that hold tensors (the step's closure, the globals it uses, attributes of modules and other
  objects, items of lists) give the fix its variable name, and, for a tensor built before the loop, the
  assignment that built it (read with ``ast`` from the source that defines the step).

The report keeps plain data only: no graph outlives the call. Models, optimizers, the random streams and
the tensors the step's closure and globals hold (a hidden state it rebinds, a list it appends to) are put
back afterwards (:class:`helpers.measure.TrainingState`).
"""

from __future__ import annotations

import ast
import html
import itertools
import linecache
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from helpers.graph import ITERATION_KEY
from helpers.learner import known_names, learner_line, place, skipped_dirs
from helpers.measure import TrainingState

__all__ = ["CarriedGraphReport", "CarriedTensor", "find_carried_graph", "stamp_iteration"]

_KEY = "backward_twice.carried"
_PRE_LOOP = 0
_RUNS = itertools.count(1)


@dataclass(frozen=True)
class CarriedTensor:
    """One tensor whose graph an iteration reaches from a later one: its shape (None if unknown), the
    iteration that built it (1-based; None: before the first), the learner's line that built it
    ("file:line: code"), the line of the later iteration that used it, that iteration, the fix, and the
    name that held it at the end of an iteration ("h", "model.memory", "outputs[0]"; None when no name
    the step can reach held it)."""

    shape: tuple[int, ...] | None
    iteration: int | None
    created_at: str
    used_at: str
    reached_from: int
    fix: str
    name: str | None = None

    def describe(self) -> str:
        built = "before the first iteration" if self.iteration is None else f"in iteration {self.iteration}"
        shape = "" if self.shape is None else f" of shape {self.shape}"
        return (f"a tensor{shape} built {built} at {self.created_at}, reached from iteration "
                f"{self.reached_from} at {self.used_at}. Fix: {self.fix}.")


@dataclass(frozen=True)
class CarriedGraphReport:
    """What :func:`find_carried_graph` found: the findings, the iterations run and the error a step raised."""

    findings: tuple[CarriedTensor, ...]
    iterations_run: int
    error: str | None

    @property
    def found(self) -> bool:
        return bool(self.findings)

    def verdict(self) -> str:
        if not self.found:
            text = f"No graph carried across iterations in {self.iterations_run} iterations."
        else:
            text = (f"Graph carried across iterations: {len(self.findings)} tensor(s) in "
                    f"{self.iterations_run} iterations.")
        if self.error is None:
            return text
        return f"{text} Iteration {self.iterations_run} raised: {self.error.split('. ')[0].rstrip('.')}."

    def __str__(self) -> str:
        return "\n".join([self.verdict(), *(f"- {f.describe()}" for f in self.findings)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(f.describe())}</li>" for f in self.findings)
        return f"<div><b>{html.escape(self.verdict())}</b>{f'<ul>{items}</ul>' if items else ''}</div>"


class _IterationStamps(TorchFunctionMode):
    def __init__(self, iteration: int) -> None:
        super().__init__()
        self.iteration = iteration

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        # Read before the call: an in-place op gives its input a new grad_fn, which this call built.
        inputs = {id(t.grad_fn) for t in _tensors((args, kwargs)) if t.grad_fn is not None}
        out = func(*args, **kwargs)
        stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while stack:  # down to the inputs' nodes: what lies between, one C++ op built inside itself
            node = stack.pop()
            if id(node) in inputs or hasattr(node, "variable") or ITERATION_KEY in node.metadata:
                continue
            node.metadata[ITERATION_KEY] = self.iteration
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return out


def stamp_iteration(iteration: int) -> TorchFunctionMode:
    """A context manager that stamps each autograd node built inside it with ``iteration`` (1, 2, ...), in
    ``grad_fn.metadata[helpers.graph.ITERATION_KEY]``, for ``draw_graph(..., by_iteration=True)``: wrap
    each iteration of a loop in ``with stamp_iteration(k):``. Nodes built before the first one stay
    unstamped; a node already stamped keeps its stamp.

    Used by notebook 04_carried_state.
    """
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1:
        raise ValueError(f"stamp_iteration: iteration must be a whole number from 1 up, got {iteration!r}")
    return _IterationStamps(iteration)


class _Run:
    """One call's bookkeeping: the mode's stamps, the nodes stamped per iteration and the findings."""

    def __init__(self, step: Callable[[], Any], models: tuple[torch.nn.Module, ...]) -> None:
        self.run, self.step, self.models = next(_RUNS), step, models
        self.skipped, self.lines = skipped_dirs(), {}  # lines: (file, lineno) -> "file:line: code" or ""
        self.iteration, self.new_nodes, self.uids = 0, [], itertools.count(1)
        self.names: dict[int, str] = {}  # stamp uid -> the name that held its tensor at an iteration's end
        self.findings: dict[int, CarriedTensor] = {}

    # -- stamps ---------------------------------------------------------------------------------------
    def stamp_of(self, node: Any) -> dict | None:
        stamp = node.metadata.get(_KEY)
        return stamp if stamp is not None and stamp["run"] == self.run else None

    def put_stamp(self, node: Any, iteration: int, line: str, shape: tuple[int, ...] | None) -> dict:
        stamp = {"run": self.run, "uid": next(self.uids), "iteration": iteration, "line": line, "shape": shape}
        node.metadata[_KEY] = stamp
        return stamp

    def learner_line(self) -> str:
        return learner_line(sys._getframe(2), self.lines, self.skipped)

    def check_input(self, tensor: torch.Tensor) -> None:
        """An unstamped input: stamp it, and what lies under it, as built before the loop, or inherit."""
        node = tensor.grad_fn
        if node is None or self.stamp_of(node) is not None:
            return
        region, newest, stack, seen = [], _PRE_LOOP, [node], {id(node)}
        while stack:
            current = stack.pop()
            region.append(current)
            for child, _ in current.next_functions:
                if child is None or id(child) in seen or hasattr(child, "variable"):
                    continue
                seen.add(id(child))
                stamp = self.stamp_of(child)
                if stamp is None:
                    stack.append(child)
                else:
                    newest = max(newest, stamp["iteration"])
        line = self.learner_line()
        self.put_stamp(node, newest, line, tuple(tensor.shape))
        if newest == _PRE_LOOP:
            for other in region[1:]:
                self.put_stamp(other, _PRE_LOOP, line, None)

    def stamp_output(self, tensor: torch.Tensor) -> None:
        node = tensor.grad_fn
        if node is not None and self.stamp_of(node) is None:
            self.put_stamp(node, self.iteration, self.learner_line(), tuple(tensor.shape))
            self.new_nodes.append(node)

    # -- the end of an iteration ----------------------------------------------------------------------
    def end_iteration(self) -> None:
        nodes, self.new_nodes = self.new_nodes, []
        for name, tensor in _holders(self.step, self.models):
            stamp = self.stamp_of(tensor.grad_fn) if tensor.grad_fn is not None else None
            if stamp is not None:
                self.names.setdefault(stamp["uid"], name)
        seen = {id(n): n for n in nodes}
        stack = list(nodes)
        while stack:
            node = stack.pop()
            above = self.stamp_of(node)
            for child, _ in node.next_functions:
                if child is None or id(child) in seen or hasattr(child, "variable"):
                    continue
                seen[id(child)] = child
                stamp = self.stamp_of(child)
                if stamp is None:  # built inside one C++ op of this iteration
                    self.put_stamp(child, self.iteration, above["line"], None)
                    stack.append(child)
                elif stamp["iteration"] < self.iteration:
                    self.add_finding(stamp, above["line"])
                else:
                    stack.append(child)

    def add_finding(self, stamp: dict, used_at: str) -> None:
        if stamp["uid"] in self.findings:
            return
        name = self.names.get(stamp["uid"])
        before = stamp["iteration"] == _PRE_LOOP
        created_at = stamp["line"]
        if before:
            created_at = _assignment(self.step, name) or f"before the first iteration (first used at {used_at})"
        self.findings[stamp["uid"]] = CarriedTensor(
            shape=stamp["shape"], iteration=None if before else stamp["iteration"], created_at=created_at,
            used_at=used_at, reached_from=self.iteration, fix=_fix(name, stamp["line"], before), name=name)


class _StampMode(TorchFunctionMode):
    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.run = run

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for tensor in _tensors((args, kwargs)):
            self.run.check_input(tensor)
        out = func(*args, **kwargs)
        for tensor in _tensors(out):
            self.run.stamp_output(tensor)
        return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def _holders(step: Callable[[], Any], models: tuple[torch.nn.Module, ...]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for the tensors the step can reach by name: closure, globals, models, one level in."""
    roots = list(known_names(step).items())
    # After the step's own names, so that a module the step names keeps that name in the fix.
    roots += [(f"model{i}" if len(models) > 1 else "model", m) for i, m in enumerate(models)]
    for name, value in roots:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, (list, tuple)):  # a tuple is a state (h, c), a list a collection
            form = "{}[{}]" if isinstance(value, list) else "{}({})"
            yield from ((form.format(name, i), v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
        elif isinstance(value, torch.nn.Module):
            for prefix, module in value.named_modules(prefix=name):
                attrs = {**vars(module), **module._buffers}
                yield from ((f"{prefix}.{k}", v) for k, v in attrs.items() if isinstance(v, torch.Tensor))
        elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)) and not callable(value):
            yield from ((f"{name}.{k}", v) for k, v in vars(value).items() if isinstance(v, torch.Tensor))


def _assignment(step: Callable[[], Any], name: str | None) -> str | None:
    """The assignment to ``name``'s first part in the scope that defines ``step``: the last one before the
    step's ``def`` (else the first after), as "file:line: code"; None when it cannot be read."""
    code = getattr(step, "__code__", None)
    if code is None or name is None:
        return None
    root = re.match(r"\w*", name).group(0)
    try:
        tree = ast.parse("".join(linecache.getlines(code.co_filename)))
    except SyntaxError:
        return None
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    start = code.co_firstlineno

    def holds_step(scope: ast.AST) -> bool:
        inner = (n for n in ast.walk(scope) if n is not scope and isinstance(n, (ast.FunctionDef, ast.Lambda)))
        return any(min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) == start for n in inner)

    for scope in sorted((s for s in scopes if holds_step(s)), key=lambda s: -getattr(s, "lineno", 0)):
        lines = sorted(n.lineno for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                       and any(isinstance(t, ast.Name) and t.id == root
                               for target in getattr(n, "targets", [getattr(n, "target", None)])
                               for t in ast.walk(target) if target is not None))
        if lines:
            before = [line for line in lines if line < start]
            line = before[-1] if before else lines[0]
            return f"{place(code.co_filename, line)}: {linecache.getline(code.co_filename, line).strip()}"
    return None


def _fix(name: str | None, line: str, before_loop: bool) -> str:
    code = line.split(": ", 1)[-1]
    total = re.match(r"(\w+)\s*(?:\+=|=\s*\1\s*\+)", code)
    if not before_loop and total:
        return (f"add a number instead ({total.group(1)} += loss.item()) and call backward() on this "
                f"iteration's loss alone")
    if name is not None and "(" in name:
        x = name.split("(")[0]
        return f"detach it at the end of each iteration ({x} = tuple(s.detach() for s in {x})), or rebuild it"
    if name is not None and "[" in name:
        list_name = name.split("[")[0]
        return f"keep detached copies in {list_name} ({list_name}.append(out.detach())), or clear it each iteration"
    if before_loop:
        if name is not None and "." in name:
            return f"build {name.split('.')[0]} inside the loop, or from detached tensors if it needs no gradient"
        x = name or "x"
        return f"compute it inside the loop, or detach it ({x} = {x}.detach()) if it needs no gradient"
    x = name or "h"
    return f"detach it at the end of each iteration ({x} = {x}.detach()), or rebuild it inside the loop"


def _as_tuple(value: Any, kind: type, label: str, what: str) -> tuple:
    items = (value,) if isinstance(value, kind) else tuple(value) if isinstance(value, Iterable) else (value,)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"find_carried_graph: {what} must be a {label} or a list of them, "
                            f"got {type(item).__name__}")
    return items


def find_carried_graph(step: Callable[[], Any], iterations: int = 3,
                       models: torch.nn.Module | Iterable[torch.nn.Module] = (),
                       optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = ()
                       ) -> CarriedGraphReport:
    """Run ``step`` (one iteration of a training loop, no arguments) ``iterations`` times as written, and
    report each tensor whose graph a later iteration reaches: built by an earlier iteration or before the
    first one, with the learner's line that built it and the fix. An exception a step raises stops the
    run and goes in ``.error``. ``models``' parameters, ``.grad``, buffers and tensor attributes
    (``self.memory``), ``optimizers``' state, the random streams and the tensors the step's closure and
    globals hold are put back afterwards; the report holds no tensor and no graph.

    Used by notebook 04_carried_state.
    """
    if not callable(step):
        raise TypeError(f"find_carried_graph: step must be a function of no arguments (one iteration of "
                        f"the loop), got {type(step).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise ValueError(f"find_carried_graph: iterations must be an int >= 2, got {iterations!r}")
    if iterations < 2:
        raise ValueError(f"find_carried_graph: iterations must be an int >= 2 (a carried graph shows from "
                         f"the second iteration on), got {iterations}")
    models = _as_tuple(models, torch.nn.Module, "torch.nn.Module", "models")
    optimizers = _as_tuple(optimizers, torch.optim.Optimizer, "torch.optim.Optimizer", "optimizers")
    state = TrainingState(models, optimizers, step=step)
    run = _Run(step, models)
    error, done = None, 0
    try:
        for run.iteration in range(1, iterations + 1):
            done = run.iteration
            try:
                with _StampMode(run):
                    step()
            except Exception as exc:  # the step's own error is the report's subject
                error = f"{type(exc).__name__}: {exc}"
            finally:
                run.end_iteration()
            if error is not None:
                break
        return CarriedGraphReport(tuple(run.findings.values()), done, error)
    finally:
        run.new_nodes.clear()
        state.restore()
