"""What notebook 04's loop checks read while a learner's loop runs, and the patterns they recognise in it.

While :meth:`LoopWatch.watching`, :class:`LoopWatch` reads the check's own optimizer's steps and every backward
call through the course's one interception point (:func:`backward_twice.record.learner.intercepting`), and counts a
module's runs with a forward pre-hook. It keeps plain numbers and weak references only, so it never keeps alive the
graphs it reports on.
:func:`is_norm_clipping` tells norm clipping at one threshold from other ways of shrinking a gradient, and
:func:`reads_data` whether an answer's code uses ``.data``.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.record.learner import intercepting
from backward_twice.record.step_input import code_reached

__all__ = ["LoopWatch", "gradient_norm", "is_norm_clipping", "reads_data", "scale_down_to"]

_TOLERANCE = 1e-3  # relative, for gradient norms


def gradient_norm(model: torch.nn.Module) -> float:
    """The norm of all of ``.grad`` taken as one vector, as ``clip_grad_norm_`` measures it."""
    grads = [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else 0.0


def scale_down_to(model: torch.nn.Module, norm: float) -> None:
    """Scale ``.grad`` down to ``norm`` when it is larger (what norm clipping at ``norm`` does)."""
    total = gradient_norm(model)
    if norm < total:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(norm / total)


def is_norm_clipping(learner: Sequence[float], unclipped: Sequence[float]) -> bool:
    """The learner's gradient norms at each step are the right loop's, some scaled down to one threshold above
    zero and none above it: norm clipping (``clip_grad_norm_``) at that threshold."""
    if len(learner) != len(unclipped) or any(got > full * (1 + _TOLERANCE) for got, full in zip(learner, unclipped)):
        return False
    scaled = [got for got, full in zip(learner, unclipped) if got < full * (1 - _TOLERANCE)]
    if not scaled or min(scaled) <= 0:  # a gradient scaled down to nothing was cleared, not clipped
        return False
    threshold = max(scaled)
    kept = [full for got, full in zip(learner, unclipped) if got >= full * (1 - _TOLERANCE)]
    return min(scaled) >= threshold * (1 - _TOLERANCE) and all(full <= threshold * (1 + _TOLERANCE) for full in kept)


class _RootStamp:
    """Put into a backward root's ``grad_fn.metadata``: it dies with the node, so a weak reference to it says
    whether that graph is still alive (a node itself cannot be weakly referenced)."""

    __slots__ = ("__weakref__",)


_ROOT_KEY = "backward_twice.check_root"


def _alive(stamps: Sequence[weakref.ref]) -> bool:
    if not any(stamp() is not None for stamp in stamps):
        return False
    gc.collect()  # a graph held only by a reference cycle waits for the collector: do not blame the loop for it
    return any(stamp() is not None for stamp in stamps)


class LoopWatch:
    """What the learner's loop does, read while it runs.

    At every ``optimizer.step()``: the graph-only bytes still alive, the gradient's norm, and whether the graph
    of a loss backwarded before the previous step is still alive. At every ``torch.autograd.backward`` (which
    ``loss.backward()`` calls): whether it retained, and the graph-only bytes alive right after it. And how many
    times the module ``counted`` ran.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        meter: SavedTensorMeter,
        counted: torch.nn.Module,
    ) -> None:
        self.meter, self.counted, self._model, self._optimizer = meter, counted, model, optimizer
        self.clear()

    def clear(self) -> None:
        self.held: list[int] = []
        self.norms: list[float] = []
        self.earlier_alive: list[bool] = []
        self.retained_bytes: list[int] = []
        self.runs = 0
        self._earlier: list[weakref.ref] = []
        self._this_step: list[weakref.ref] = []

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer is not self._optimizer:
            return
        self.held.append(self.meter.graph_only_bytes)
        self.norms.append(gradient_norm(self._model))
        self.earlier_alive.append(_alive(self._earlier))
        self._earlier = [stamp for stamp in self._earlier + self._this_step if stamp() is not None]
        self._this_step = []

    def _backward(self, engine: Callable[..., Any], outputs: Any, args: tuple, kwargs: dict) -> Any:
        if not kwargs.get("accumulate_grad", True):  # torch.autograd.grad: not a backward of the loop's
            return engine(outputs, *args, **kwargs)
        for root in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
            if isinstance(root, torch.Tensor) and root.grad_fn is not None:
                # torch's stub declares Node.metadata a method; on autograd's nodes it is a dict
                metadata: dict[Any, Any] = root.grad_fn.metadata  # type: ignore[assignment]
                self._this_step.append(weakref.ref(metadata.setdefault(_ROOT_KEY, _RootStamp())))
        result = engine(outputs, *args, **kwargs)
        if len(args) > 1 and args[1]:  # the engine's keep_graph: retain_graph, or create_graph
            self.retained_bytes.append(self.meter.graph_only_bytes)
        return result

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        def count(*_: Any) -> None:
            self.runs += 1

        handle = self.counted.register_forward_pre_hook(count)
        try:
            with intercepting(on_backward=self._backward, before_step=self._before_step):
                yield
        finally:
            handle.remove()


def reads_data(answer: Callable[..., Any]) -> bool:
    """The answer's code reads an attribute ``.data``: its own code, its nested functions' and, through its
    closure, the code of the functions it was made with (a factory's arguments, a wrapper's target)."""
    return any("data" in code.co_names for code in code_reached(answer))
