"""Probes for the gallery's framework loops (PyTorch Lightning, Hugging Face transformers), without the course's helpers.

A framework loop (a module with ``FRAMEWORK``) is driven one of two ways:

- with a ``step_function`` (a hand-written loop over a framework's model), one call per iteration, as probes.py does;
- without one (``trainer.fit``, ``Trainer.train``: the framework runs the step), through the module's own
  ``run(state, iterations, callbacks)``, with a framework callback that marks each iteration's start from the
  framework's own hooks: Lightning's ``Callback.on_train_batch_start``, transformers' ``TrainerCallback.on_step_begin``.
  The optimizers the framework builds (``trainer.optimizers``, the ``Trainer``'s optimizer) join the fingerprint.

What is judged, and how, is probes.py's: the error read from the traceback, a retain judged by switching it off,
what each backward reaches by sequence numbers against the iteration's start, the line that built a node by the line
tracer, and clean references by detaching. What differs is where a graph can hide: a framework keeps tensors deeper
in objects than a plain loop does (a transformers cache keeps them at ``past_key_values.layers[i].keys`` and
``.values``), so the named places below look through the public attributes, lists and dicts of plain objects (not
models, optimizers or classes), and a detached copy is made in place there.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from . import probes
from .probes import (
    BoundaryHook,
    LineTracer,
    Outcome,
    Reach,
    RetainSwitch,
    RetainVerdict,
    error_kind,
    markers,
    nodes_below,
    raising_marker,
    retain_lines,
    run_published,
    source_path,
    variant,
    walk_old_nodes,
)

__all__ = [
    "PACKAGES",
    "STEP_TOOLS",
    "WAYS",
    "candidates",
    "detaching",
    "drive",
    "driven_by_steps",
    "error_kind",
    "judge_retains",
    "leaves_changed_in_place",
    "markers",
    "observe_reach",
    "retain_lines",
    "run_published",
    "source_path",
]

STEP_TOOLS = ("diagnose", "audit_retain_graph", "find_carried_graph")
WAYS = ("watch", "command", *STEP_TOOLS)
# what a module of each FRAMEWORK may import on top of torch, numpy and the standard library
PACKAGES = {
    "lightning": {"pytorch_lightning", "lightning", "lightning_fabric"},
    "transformers": {"transformers", "accelerate"},
}
DEPTH = 4  # how deep into plain objects a graph is looked for (cache -> layers -> [i] -> keys is 3)


def driven_by_steps(module: types.ModuleType) -> bool:
    return hasattr(module, "step_function")


# ---------------------------------------------------------------- iteration boundaries from the framework's hooks


class Boundaries:
    """Counts the iterations the framework starts, calls the hook at each start, and keeps the optimizers it built."""

    def __init__(self, state: dict, hook: BoundaryHook | None) -> None:
        self.state = state
        self.hook = hook
        self.number = 0
        self.optimizers: list[Any] = []

    def start(self, optimizers: list[Any]) -> None:
        self.number += 1
        self.optimizers = [unwrapped(optimizer) for optimizer in optimizers if optimizer is not None]
        if self.hook is not None:
            self.hook(self.number, self.state)


def unwrapped(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer, LightningOptimizer)."""
    while getattr(optimizer, "optimizer", optimizer) is not optimizer:
        optimizer = optimizer.optimizer
    return optimizer


def framework_callbacks(module: types.ModuleType, boundaries: Boundaries) -> list[Any]:
    """A callback of the module's framework that marks each iteration's start."""
    if module.FRAMEWORK == "lightning":
        import pytorch_lightning as pl

        class LightningBoundaries(pl.Callback):
            def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
                boundaries.start(list(trainer.optimizers))

        return [LightningBoundaries()]
    if module.FRAMEWORK == "transformers":
        from transformers import TrainerCallback

        class TrainerBoundaries(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                boundaries.start([kwargs.get("optimizer")])

        return [TrainerBoundaries()]
    raise ValueError(f"{module.__name__}: unknown FRAMEWORK {module.FRAMEWORK!r}")


def fingerprint(state: dict, optimizers: list[Any]) -> tuple[torch.Tensor, ...]:
    return probes.fingerprint(state) + tuple(t.detach().clone() for t in probes.tensors_of(optimizers))


def drive(module: types.ModuleType, iterations: int, at_boundary: BoundaryHook | None = None) -> Outcome:
    """Build, then run the loop for `iterations`; return the error and the final state."""
    return drive_state(module, module.build(), iterations, at_boundary)


def drive_state(
    module: types.ModuleType, state: dict, iterations: int, at_boundary: BoundaryHook | None = None
) -> Outcome:
    if driven_by_steps(module):
        step = module.step_function(state)
        for number in range(1, iterations + 1):
            if at_boundary is not None:
                at_boundary(number, state)
            try:
                step()
            except Exception as error:  # the loop's own error is the thing observed
                return Outcome((error_kind(error), number, raising_marker(module, error)), probes.fingerprint(state))
        return Outcome(None, probes.fingerprint(state))
    boundaries = Boundaries(state, at_boundary)
    try:
        module.run(state, iterations, callbacks=framework_callbacks(module, boundaries))
    except Exception as error:
        where = (error_kind(error), boundaries.number, raising_marker(module, error))
        return Outcome(where, fingerprint(state, boundaries.optimizers))
    assert boundaries.number == iterations, f"{module.__name__}: ran {boundaries.number} iterations, not {iterations}"
    return Outcome(None, fingerprint(state, boundaries.optimizers))


# ---------------------------------------------------------------- where a graph can outlive an iteration


def opaque(value: Any) -> bool:
    """Objects whose own tensors are not a graph a loop keeps (a model's parameters, an optimizer's state)."""
    return isinstance(
        value,
        (torch.nn.Module, torch.optim.Optimizer, type, types.ModuleType, types.FunctionType, types.MethodType),
    )


def held_tensors(value: Any, depth: int = DEPTH, seen: set[int] | None = None) -> list[torch.Tensor]:
    """The tensors a variable holds: probes.py's (a tensor, a tuple or list of them, a distribution), and those kept
    in the public attributes, lists and dicts of a plain object, `depth` levels down."""
    direct = probes.direct_tensors(value)
    if direct or depth == 0 or opaque(value):
        return direct
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif hasattr(value, "__dict__"):
        items = [held for attr, held in vars(value).items() if not attr.startswith("_")]
    else:
        return []
    return [t for item in items for t in held_tensors(item, depth - 1, seen)]


def grad_fns(value: Any) -> list[Any]:
    return [t.grad_fn for t in held_tensors(value) if t.grad_fn is not None]


def candidates(module: types.ModuleType, state: dict) -> dict[str, Any]:
    """probes.candidates, with a variable's tensors looked for through plain objects (:func:`held_tensors`)."""
    return probes.candidates(module, state, held_tensors)


def observe_reach(module: types.ModuleType, iterations: int) -> Reach:
    """probes.observe_reach, driven by :func:`drive` and looking through :func:`candidates`."""
    starts: dict[int, int] = {}
    held_at: dict[int, dict[str, list[Any]]] = {}
    reached: dict[int, dict[int, Any]] = {}
    current = [0]
    original_backward = torch.autograd.backward
    original_grad = torch.autograd.grad

    def note_roots(outputs: Any) -> None:
        tensors = probes.direct_tensors(outputs if isinstance(outputs, (list, tuple)) else [outputs])
        number = current[0]
        if number:
            reached.setdefault(number, {}).update(walk_old_nodes([t.grad_fn for t in tensors], starts[number]))

    def watched_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        note_roots(tensors)
        return original_backward(tensors, *args, **kwargs)

    def watched_grad(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        note_roots(outputs)
        return original_grad(outputs, *args, **kwargs)

    def at_boundary(number: int, state: dict) -> None:
        current[0] = number
        starts[number] = torch._C._autograd._get_sequence_nr()
        held_at[number] = {name: grad_fns(value) for name, value in candidates(module, state).items()}

    tracer = LineTracer(source_path(module), module.build.__code__)
    torch.autograd.backward, torch.autograd.grad = watched_backward, watched_grad
    try:
        with tracer:
            outcome = drive(module, iterations, at_boundary)
    finally:
        torch.autograd.backward, torch.autograd.grad = original_backward, original_grad

    by_line = {number: name for name, number in markers(module).items()}
    carried: dict[str, str] = {}
    notes: dict[str, str] = {}
    last = outcome.error[1] if outcome.error else iterations
    for number in range(1, last + 1):
        walked: set[int] = set()
        for later in range(number, last + 1):
            for node in reached.get(later, {}).values():
                walked |= nodes_below(node)
        for name, nodes in held_at[number].items():
            for node in nodes:
                before_loop = node._sequence_nr() < starts[1]
                built = (tracer.outer_line_of if before_loop else tracer.line_of)(node._sequence_nr())
                marker = by_line.get(built, f"unmarked line {built}")
                if id(node) in walked:
                    carried.setdefault(name, marker)
                else:
                    notes.setdefault(name, marker)
    notes = {name: line for name, line in notes.items() if name not in carried}
    carried = {name: line for name, line in carried.items() if name.rpartition(".")[0] not in carried}
    notes = {name: line for name, line in notes.items() if name.rpartition(".")[0] not in notes}
    frontier = {key: node for per_iteration in reached.values() for key, node in per_iteration.items()}
    explained: set[int] = set()
    for held in held_at.values():
        for nodes in held.values():
            for node in nodes:
                explained |= nodes_below(node)
    assert set(frontier) <= explained, f"{module.__name__}: a backward walked old nodes no named variable holds"
    return Reach(carried, notes, outcome)


# ---------------------------------------------------------------- retains, clean references, in-place leaves


def judge_retains(module: types.ModuleType, iterations: int) -> dict[str, RetainVerdict]:
    """probes.judge_retains, driven by :func:`drive`."""
    marked = [name for name, number in markers(module).items() if number in retain_lines(module)]
    carried = list(observe_reach(module, iterations).carried) if marked else []
    counting = RetainSwitch()
    reference = drive(variant(module, counting, marked), iterations)
    verdicts = {}
    for marker in marked:
        started = counting.started.get(marker, 0)
        completed = started - 1 if reference.error is not None and reference.error[2] == marker else started
        without = drive(variant(module, RetainSwitch({marker: "all"}), marked), iterations)
        needed_runs = sum(
            not drive(variant(module, RetainSwitch({marker: {run}}), marked), iterations).same_as(reference)
            for run in range(1, completed + 1)
        )
        if not completed:
            continue
        verdict = "can go" if without.same_as(reference) else "needed"
        if verdict == "needed" and carried:
            detach = detaching(module, carried)

            def fixed(number: int, state: dict) -> None:
                if number > 1:
                    detach(number, state)

            kept = drive(variant(module, RetainSwitch(), marked), iterations, fixed)
            dropped = drive(variant(module, RetainSwitch({marker: "all"}), marked), iterations, fixed)
            if dropped.same_as(kept):
                verdict = "goes with the carried fix"
        verdicts[marker] = RetainVerdict(verdict, completed, needed_runs)
    return verdicts


def detach_value(value: Any, depth: int = DEPTH) -> Any:
    """probes.detach_value; a plain object (a transformers cache) has the tensors it holds replaced, in place."""
    try:
        return probes.detach_value(value)
    except TypeError:
        if depth == 0 or opaque(value):
            raise
    if isinstance(value, list):
        value[:] = [detach_value(item, depth - 1) if held_tensors(item) else item for item in value]
    elif isinstance(value, dict):
        value.update({key: detach_value(item, depth - 1) for key, item in value.items() if held_tensors(item)})
    elif hasattr(value, "__dict__"):
        for attr, held in list(vars(value).items()):
            if not attr.startswith("_") and held_tensors(held):
                setattr(value, attr, detach_value(held, depth - 1))
    else:
        raise TypeError(f"cannot detach {type(value).__name__}")
    return value


def detaching(module: types.ModuleType, names: list[str]) -> BoundaryHook:
    """probes.detaching, with :func:`detach_value` (which also detaches inside plain objects)."""
    return probes.detaching(module, names, detach_value)


def leaves_changed_in_place(module: types.ModuleType, iterations: int) -> list[str]:
    """probes.leaves_changed_in_place, driven by :func:`drive_state`."""
    return probes.leaves_changed_in_place(module, iterations, drive_state)
