"""Find the tensor that carries one iteration's autograd graph into the next, and the learner's line that built it.

Most people who meet "Trying to backward through the graph a second time" call ``backward()`` once per
iteration: the error comes on iteration 2 because something from iteration 1 (a hidden state not
detached, a tensor computed once before the loop, ``total_loss = total_loss + loss``, state kept on a
module, a list of outputs, a distribution built once) still carries its graph. :func:`find_carried_graph`
runs one iteration of the learner's loop a few times, as written, and names that tensor.

How: :func:`backward_twice.steps.harness.run_step` runs the step under the recorder
(:mod:`backward_twice.record.recorder`), which reads what each backward walks and which iteration built each node it
walks (its sequence number against the engine's counter at each run's end); a node built by an earlier run or before the
first is carried (:mod:`backward_twice.judge.verdicts`). The name that held it (the step's closure and globals,
attributes of modules and other objects, items of lists, tuples and dicts: ``h``, ``model.memory``, ``state[0]``) gives
the fix its
variable, and the line that built it comes from the recorder's line tracer (a node built before the first run:
the assignment to that name, read with ``ast``). Everything the runs change is put back (on the CPU copies of
:class:`backward_twice.steps.snapshot.CpuSnapshot`); the report keeps plain data only.

:func:`stamp_iteration` is the drawing aid of notebook 04: it stamps each node an iteration builds, for
``draw_graph(..., by_iteration=True)``.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from backward_twice.steps.harness import StepRun, reported, run_step

__all__ = [
    "ITERATION_KEY",
    "CarriedGraphReport",
    "CarriedTensor",
    "carried_report",
    "find_carried_graph",
    "stamp_iteration",
]

# :func:`stamp_iteration` stamps each node an iteration builds with ``fn.metadata[ITERATION_KEY] = k`` (k = 1, 2,
# ...), for ``backward_twice.instruments.graph.draw_graph(..., by_iteration=True)``.
ITERATION_KEY = "backward_twice.iteration"


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
        shape += "" if self.name is None else f" ({self.name})"
        return (
            f"a tensor{shape} built {built} at {self.created_at}, reached from iteration "
            f"{self.reached_from} at {self.used_at}. Fix: {self.fix}."
        )


@dataclass(frozen=True)
class CarriedGraphReport:
    """What :func:`find_carried_graph` found: the findings, the iterations run and the error a step raised."""

    findings: tuple[CarriedTensor, ...]
    iterations_run: int
    error: str | None
    not_put_back: tuple[str, ...] = ()  # what the runs changed that nothing can put back (an iterator moved on)
    error_iteration: int | None = None  # the run that raised ``error`` first (None: the last one run)
    caught: bool = False  # a backward raised ``error`` and the step caught it and went on
    problem: str | None = None  # the tool's own failure to judge the runs: then it claims nothing

    @property
    def found(self) -> bool:
        return bool(self.findings)

    def verdict(self) -> str:
        if self.problem is not None:
            return self.problem
        runs = f"{self.iterations_run} iteration{'' if self.iterations_run == 1 else 's'}"
        if not self.found:
            text = f"No graph carried across iterations in {runs}."
        else:
            text = f"Graph carried across iterations: {len(self.findings)} tensor(s) in {runs}."
        if self.error is None:
            return text
        raised = self.error_iteration or self.iterations_run
        caught = ", and the step caught it and went on" if self.caught else ""
        return f"{text} Iteration {raised} raised: {self.error.split('. ')[0].rstrip('.')}{caught}."

    def __str__(self) -> str:
        notes = [f"note: {sentence}" for sentence in self.not_put_back]
        return "\n".join([self.verdict(), *notes, *(f"- {f.describe()}" for f in self.findings)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(f.describe())}</li>" for f in self.findings)
        notes = "".join(f"<p>note: {html.escape(sentence)}</p>" for sentence in self.not_put_back)
        return f"<div><b>{html.escape(self.verdict())}</b>{notes}{f'<ul>{items}</ul>' if items else ''}</div>"


class _IterationStamps(TorchFunctionMode):
    def __init__(self, iteration: int) -> None:
        super().__init__()
        self.iteration = iteration

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        # Read before the call: an in-place op gives its input a new grad_fn, which this call built.
        # The nodes themselves, not only their ids: a node's Python object read and dropped can give its id away.
        inputs = {id(fn): fn for fn in (t.grad_fn for t in _tensors((args, kwargs))) if fn is not None}
        out = func(*args, **kwargs)
        stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while stack:  # down to the inputs' nodes: what lies between, one C++ op built inside itself
            node = stack.pop()
            if id(node) in inputs or hasattr(node, "variable"):
                continue
            metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict attribute, not a method
            if ITERATION_KEY in metadata:
                continue
            metadata[ITERATION_KEY] = self.iteration
            stack.extend(child for child, _ in node.next_functions if child is not None)
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


def stamp_iteration(iteration: int) -> TorchFunctionMode:
    """A context manager that stamps each autograd node built inside it with ``iteration`` (1, 2, ...), in
    ``grad_fn.metadata[ITERATION_KEY]``, for ``draw_graph(..., by_iteration=True)``: wrap
    each iteration of a loop in ``with stamp_iteration(k):``. Nodes built before the first one stay
    unstamped; a node already stamped keeps its stamp.

    Used by notebook 04_carried_state.
    """
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1:
        raise ValueError(f"stamp_iteration: iteration must be a whole number from 1 up, got {iteration!r}")
    return _IterationStamps(iteration)


def carried_report(run: StepRun) -> CarriedGraphReport:
    """The carried graphs :func:`backward_twice.steps.harness.run_step` saw, as :func:`find_carried_graph` reports
    them."""
    v = run.verdicts
    findings = tuple(
        CarriedTensor(
            shape=f.shape,
            iteration=f.iteration,
            created_at=f.built_at,
            used_at=f.used_at,
            reached_from=f.reached_from,
            fix=f.fix,
            name=f.name,
        )
        for f in v.carried
    )
    error = None if v.error is None else v.error.message
    raised, caught = (None, False) if v.error is None else (v.error.iteration, v.error.caught)
    return CarriedGraphReport(findings, run.runs, error, run.not_put_back, raised, caught)


def find_carried_graph(
    step: Callable[[], Any],
    iterations: int = 3,
    models: torch.nn.Module | Iterable[torch.nn.Module] = (),
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
) -> CarriedGraphReport:
    """Run ``step`` (one iteration of a training loop, no arguments) ``iterations`` times as written, and
    report each tensor whose graph a later iteration's backward walks: built by an earlier iteration or before
    the first one, with the learner's line that built it and the fix. An exception a step raises stops the
    run and goes in ``.error``. ``models``' parameters, ``.grad``, buffers and tensor attributes
    (``self.memory``), ``optimizers``' state, the random streams and what the step's closure and globals hold
    are put back afterwards; the report holds no tensor and no graph.

    Used by notebook 04_carried_state.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError(
            f"find_carried_graph: iterations must be an int >= 2 (a carried graph shows from "
            f"the second iteration on), got {iterations!r}"
        )
    try:
        run = run_step(step, models, optimizers, iterations, who="find_carried_graph")
    except (TypeError, ValueError) as exc:  # the input checks: raised here, not deep in the harness
        raise type(exc)(str(exc)) from None
    return reported(
        run, step, carried_report, lambda why: CarriedGraphReport((), run.runs, None, run.not_put_back, problem=why)
    )
