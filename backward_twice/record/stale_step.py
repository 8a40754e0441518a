"""Which optimizer step made a graph stale: the last step whose parameters a walked node saved, taken after that
node was built (the version check's error, read back to the learner's ``opt.step()``).

Used by :mod:`backward_twice.record.evidence`.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
from torch.autograd.graph import Node

from backward_twice.record.events import StepEvent
from backward_twice.record.saved import saved_data, storage_address

__all__ = ["Stepped", "step_that_changed"]


class Stepped(Protocol):
    """What :func:`step_that_changed` reads of the recorder: the optimizers and the steps it saw."""

    @property
    def optimizers_seen(self) -> dict[int, weakref.ref[torch.optim.Optimizer]]: ...
    @property
    def steps(self) -> list[StepEvent]: ...


def step_that_changed(recorder: Stepped, walked: list[Node]) -> tuple[str, int] | None:
    """The learner's line of the last optimizer step whose parameters a walked node saved, if one stepped after
    that node was built, and that node's sequence number: of the oldest such node built since the step before the
    one nearest the loss, or that reads such a parameter itself (``h = enc(x)`` under ``out = dec(h)``: computing
    ``out`` again alone would leave ``h`` on the old weights)."""
    stepped = {step.optimizer: step for step in recorder.steps}  # each optimizer's last step
    if not stepped:
        return None
    params: dict[int, list[int]] = {}  # a parameter's storage -> the optimizers that step it, those that kept a state
    for optimizer_id in stepped:  # for it first (an Adam made over the wrong model's weights steps none of them)
        reference = recorder.optimizers_seen.get(optimizer_id)
        optimizer = reference() if reference is not None else None
        for group in optimizer.param_groups if optimizer is not None else ():
            for p in group["params"]:
                owners = params.setdefault(storage_address(p), [])
                owners.insert(0, optimizer_id) if optimizer is not None and optimizer.state.get(p) else owners.append(
                    optimizer_id
                )
    found: tuple[str, int] | None = None
    since = -1  # where the nearest stale node's stretch began: the step before it
    for node in walked:
        sequence = node._sequence_nr()
        if found is not None and (sequence >= found[1] or sequence < since):
            continue
        tensors = list(saved_data(node) or ())
        if found is not None:  # an older node that reads a weight the step changed (``Linear(x)``, no grad for
            tensors += [leaf for n, _ in node.next_functions if (leaf := getattr(n, "variable", None)) is not None]
        for tensor in tensors:
            owners = [o for o in params.get(storage_address(tensor), ()) if stepped[o].sequence > sequence]
            if owners:
                if found is None:
                    since = max((s.sequence for s in recorder.steps if s.sequence <= sequence), default=-1)
                found = stepped[owners[0]].line, sequence
                break
    return found
