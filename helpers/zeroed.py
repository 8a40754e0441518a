"""Optimizer steps taken on zeroed gradients: ``.grad`` cleared between the backward that filled it and the step.

A loop that calls ``optimizer.zero_grad()`` (or ``model.zero_grad()``, or sets ``p.grad = None``, or calls a helper
that does) after ``loss.backward()`` and before ``optimizer.step()`` hands the step nothing to follow. PyTorch's
optimizers skip a parameter whose ``.grad`` is None, and a ``.grad`` of zeros moves SGD by nothing and keeps
momentum and Adam's averages at zero when every step is taken so: the model never trains. Measured without the
course's code (tests/test_zeroed.py), SGD, SGD with momentum and Adam, from ``.grad`` pre-filled: the parameters
did not change at all. Only what an optimizer adds by itself can move them: weight decay, or momentum kept from
earlier steps that did have a gradient; the message says so when that is the case.

:class:`ZeroedSteps` watches a check's own parameters through the course's one interception point
(:func:`backward_twice.record.learner.intercepting`): after every backward that accumulates into ``.grad``, which of
them it left nonzero; at every optimizer step, which of those the optimizer holds and finds zero or None (and, after the
step, whether they moved). A parameter counts as filled only by the last backward before the step, so a ``zero_grad``
before a backward that does not reach a parameter is not blamed. :meth:`ZeroedSteps.problem` says what it saw,
in one sentence with the fix; the checks that judge a training loop reject the answer with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.record.learner import intercepting

__all__ = ["ZEROED_HINT", "ZeroedSteps"]

ZEROED_HINT = (
    "optimizer.step() follows what .grad holds when it runs: nothing may clear it between the backward and the step."
)


@dataclass(frozen=True)
class _Zeroed:
    """One optimizer step that found ``cleared`` of the ``filled`` parameters' gradients zeroed."""

    name: str
    index: int  # from 1, among this optimizer's steps
    cleared: int
    filled: int
    moved: bool  # a cleared parameter changed in the step, or could have (momentum kept, weight decay)


def _zero(p: torch.Tensor) -> bool:
    return p.grad is None or not bool(p.grad.detach().any())


def _moves_by_itself(optimizer: torch.optim.Optimizer, cleared: Sequence[torch.Tensor]) -> bool:
    """A step could move these parameters with their .grad zeros: the optimizer keeps a nonzero state for one
    (momentum, Adam's averages) or decays weights. A parameter whose .grad is None is skipped by the step."""
    held = {id(p) for p in cleared if p.grad is not None}
    decays = any(
        group.get("weight_decay") for group in optimizer.param_groups if any(id(p) in held for p in group["params"])
    )
    kept = [
        value
        for p in cleared
        if id(p) in held
        for key, value in optimizer.state.get(p, {}).items()
        if key != "step" and isinstance(value, torch.Tensor)
    ]
    return decays or any(bool(value.detach().any()) for value in kept)


class ZeroedSteps:
    """Which optimizer steps, while :meth:`watching`, ran with ``.grad`` cleared after the backward that filled it.

    ``params`` are the parameters watched (the check's own model); ``names`` names an optimizer by ``id`` in the
    message (``"optimizerD"``), ``"optimizer"`` otherwise. Optimizers created inside the watched code count too;
    one that holds none of ``params`` is not counted.
    """

    def __init__(self, params: Sequence[torch.Tensor], names: Mapping[int, str] | None = None) -> None:
        self._params = list(params)
        self._names = dict(names or {})
        self._clear()

    def _clear(self) -> None:
        self.zeroed: list[_Zeroed] = []
        self.steps: dict[str, int] = {}  # steps per optimizer name, in the order they first stepped
        self._filled: set[int] = set()
        self._before: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def _backward(self, engine: Callable[..., Any], outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = engine(outputs, *args, **kwargs)
        if kwargs.get("accumulate_grad", True):  # not torch.autograd.grad, which leaves .grad alone
            self._filled = {id(p) for p in self._params if not _zero(p)}
        return result

    def _held(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        held = {id(p) for p in self._held(optimizer)}
        if not any(id(p) in held for p in self._params):  # an optimizer of other parameters
            return
        name = self._names.get(id(optimizer), "optimizer")
        self.steps[name] = self.steps.get(name, 0) + 1
        filled = [p for p in self._params if id(p) in held and id(p) in self._filled]
        cleared = [p for p in filled if _zero(p)]
        self._filled -= held  # this step used them
        if cleared:
            self._before[id(optimizer)] = (cleared, [p.detach().clone() for p in cleared])
            moves = _moves_by_itself(optimizer, cleared)
            self.zeroed.append(_Zeroed(name, self.steps[name], len(cleared), len(filled), moved=moves))

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._before:
            return
        cleared, values = self._before.pop(id(optimizer))
        if any(not torch.equal(p.detach(), v) for p, v in zip(cleared, values)):
            last = self.zeroed[-1]
            self.zeroed[-1] = _Zeroed(last.name, last.index, last.cleared, last.filled, moved=True)

    @contextlib.contextmanager
    def watching(self) -> Iterator[ZeroedSteps]:
        """Watch the code run inside (what an earlier use saw is forgotten)."""
        self._clear()
        with intercepting(on_backward=self._backward, on_step=self._after_step, before_step=self._before_step):
            yield self

    def problem(self) -> str | None:
        """What was seen, in one sentence with the fix; None when no step ran on zeroed gradients."""
        if not self.zeroed:
            return None
        subjects = []
        for name, total in self.steps.items():
            mine = [z for z in self.zeroed if z.name == name]
            if not mine:
                continue
            if total == 1:
                subjects.append(f"{name}.step()")
            elif len(mine) == total:
                subjects.append(f"all {total} {name}.step() calls")
            elif len(mine) == 1:
                subjects.append(f"{name}.step() call {mine[0].index} of {total}")
            else:
                subjects.append(f"{len(mine)} of {total} {name}.step() calls")
        partial = any(z.cleared < z.filled for z in self.zeroed)
        how = "with part of the gradients zeroed" if partial else "on zeroed gradients"
        whose = "the weights whose .grad was cleared" if partial else "the weights"
        if any(z.moved for z in self.zeroed):
            one = len(self.zeroed) == 1
            outcome = (
                f"{'that step' if one else 'those steps'} followed no gradient of {'its' if one else 'their'} "
                "backward, only what the optimizer adds by itself (momentum kept from earlier steps, weight decay)"
            )
        elif sum(self.steps.values()) == len(self.zeroed):
            outcome = f"{whose} never changed"
        else:
            outcome = f"{whose} did not change at {'that step' if len(self.zeroed) == 1 else 'those steps'}"
        return (
            f"{' and '.join(subjects)} ran {how}: .grad was cleared (a zero_grad(), or .grad = None) after the "
            f"backward that filled it and before the step, so {outcome}; call zero_grad() before the backward or "
            "after the step, never between them."
        )
