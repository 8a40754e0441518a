"""What the exercise checks run a learner's code with, and how they watch it.

The checks' own small networks and the notebook's losses, the first line of a learner's
exception, and a recorder of every backward call (``torch.autograd.grad`` or ``.backward()``,
with its ``retain_graph`` and ``create_graph``), taken where PyTorch's engine is entered, so a
name imported before the check is seen too. Used by the checks in ``checks`` and ``penalty_check``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


def _mlp(inputs: int, outputs: int, hidden: int = 32) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, outputs))


def _d_loss(real_out: torch.Tensor, fake_out: torch.Tensor) -> torch.Tensor:
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    return bce(real_out, torch.ones_like(real_out)) + bce(fake_out, torch.zeros_like(fake_out))


def _g_loss(fake_out: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(fake_out, torch.ones_like(fake_out))


def _first_line(exc: BaseException) -> str:
    """``'NameError: name ...'``: the exception's type and the first line of its message."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a learner's exception class may break even str()
        text = ""
    lines = text.split(" Hint:")[0].strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:110]}" if lines else type(exc).__name__


@dataclass(frozen=True)
class _BackwardCall:
    """One entry into autograd's engine: ``torch.autograd.grad`` (``computes_grad``) or a backward."""

    computes_grad: bool
    retain_graph: bool
    create_graph: bool


# The private function both torch.autograd.backward and torch.autograd.grad enter the engine
# through (torch 2.x). Without it, the public functions are watched instead.
_ENGINE_ENTRY = "_engine_run_backward"


def _watched_public(name: str, original: Callable[..., Any], calls: list[_BackwardCall]) -> Callable[..., Any]:
    """``torch.autograd.backward`` or ``.grad``, recording each call (used where the engine entry is missing)."""
    import inspect

    signature = inspect.signature(original)

    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:  # let PyTorch itself say what is wrong with the call
            return original(*args, **kwargs)
        create = bool(bound.get("create_graph", False))
        retain = bound.get("retain_graph")
        calls.append(_BackwardCall(name == "grad", create if retain is None else bool(retain), create))
        return original(*args, **kwargs)

    return watched


@contextmanager
def _watching_backward() -> Iterator[list[_BackwardCall]]:
    """Record every backward and ``torch.autograd.grad`` call made inside; restored on the way out."""
    calls: list[_BackwardCall] = []
    engine = getattr(torch.autograd, _ENGINE_ENTRY, None)
    replaced: list[tuple[str, Any]] = []
    if callable(engine):
        # engine(outputs, grad_outputs, retain_graph, create_graph, inputs, ..., accumulate_grad=...)
        def entered(outputs: Any, *args: Any, **kwargs: Any) -> Any:
            retain = args[1] if len(args) > 1 else kwargs.get("keep_graph", False)
            create = args[2] if len(args) > 2 else kwargs.get("create_graph", False)
            calls.append(_BackwardCall(not kwargs.get("accumulate_grad", True), bool(retain), bool(create)))
            return engine(outputs, *args, **kwargs)

        replaced.append((_ENGINE_ENTRY, entered))
    else:
        for name in ("backward", "grad"):
            replaced.append((name, _watched_public(name, getattr(torch.autograd, name), calls)))
    originals = [(name, getattr(torch.autograd, name)) for name, _ in replaced]
    try:
        for name, function in replaced:
            setattr(torch.autograd, name, function)
        yield calls
    finally:
        for name, function in originals:
            setattr(torch.autograd, name, function)
