"""What the exercise checks run a learner's code with, and how they watch it.

The checks' own small networks and the notebook's losses, the first line of a learner's
exception (:func:`backward_twice.record.learner.first_line`), and a list of every backward call
(``torch.autograd.grad`` or ``.backward()``, with its ``retain_graph`` and ``create_graph``), taken
through the course's one interception point (:func:`backward_twice.record.learner.intercepting`, where PyTorch's
engine is entered), so a name imported before the check is seen too. Used by
:mod:`helpers.lessons.gan_step.checks` and :mod:`helpers.lessons.gan_step.penalty_check`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.record.learner import ENGINE_ENTRY, intercepting


def _mlp(inputs: int, outputs: int, hidden: int = 32) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(hidden, hidden),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(hidden, outputs),
    )


def _d_loss(real_out: torch.Tensor, fake_out: torch.Tensor) -> torch.Tensor:
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    return bce(real_out, torch.ones_like(real_out)) + bce(fake_out, torch.zeros_like(fake_out))


def _g_loss(fake_out: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(fake_out, torch.ones_like(fake_out))


@dataclass(frozen=True)
class _BackwardCall:
    """One entry into autograd's engine: ``torch.autograd.grad`` (``computes_grad``) or a backward."""

    computes_grad: bool
    retain_graph: bool
    create_graph: bool


# The private function both torch.autograd.backward and torch.autograd.grad enter the engine through (torch 2.x);
# without it, the public functions are watched instead (the catalogue's tests change it to see that).
_ENGINE_ENTRY = ENGINE_ENTRY


@contextmanager
def _watching_backward() -> Iterator[list[_BackwardCall]]:
    """Record every backward and ``torch.autograd.grad`` call made inside (through the course's one interception
    point, :func:`backward_twice.record.learner.intercepting`); restored on the way out."""
    calls: list[_BackwardCall] = []

    def entered(engine: Callable[..., Any], outputs: Any, args: tuple, kwargs: dict) -> Any:
        # engine(outputs, grad_tensors, keep_graph, create_graph, inputs, ..., accumulate_grad=...)
        retain = args[1] if len(args) > 1 else kwargs.get("keep_graph", False)
        create = args[2] if len(args) > 2 else kwargs.get("create_graph", False)
        calls.append(_BackwardCall(not kwargs.get("accumulate_grad", True), bool(retain), bool(create)))
        return engine(outputs, *args, **kwargs)

    with intercepting(on_backward=entered, entry=_ENGINE_ENTRY):
        yield calls
