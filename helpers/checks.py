"""What every exercise check shares: the verdict, and running a learner's answer without being fooled.

A check returns a :class:`CheckResult`, truthy when the answer is right and shown as the verdict (a
tick, or what is wrong plus a hint). It never raises on a wrong answer: :func:`checked` refuses a
non-function, keeps the caller's random stream, and turns a :class:`Rejected` into the verdict;
:func:`run_answer` turns an exception of any type from the answer into one, with its own first line, and
a step on gradients the answer cleared after their backward (:mod:`helpers.zeroed`) into another.
The lessons' checks (``helpers.lessons``) run each answer twice, the second time from the state the
first call left, against reference runs made in the check; :func:`run_loop` judges a training loop's
history and the buffers its graphs left, and :func:`reject_peak` the buffers a :class:`SavedTensorMeter`
counted *while* it ran. Messages print only
figures that are the same on every CPU: byte counts, counts, their ratios, and a gradient's ratio only
when it is a clear multiple (0.50x).
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.measure import gradients_close
from helpers.zeroed import ZEROED_HINT, ZeroedSteps

__all__ = [
    "SECOND_CALL",
    "CheckResult",
    "Rejected",
    "checked",
    "clear_multiple",
    "flat",
    "gradient_problem",
    "gradients_or_zeros",
    "loop_passed",
    "reject_peak",
    "run_answer",
    "run_loop",
]

SECOND_CALL = "On a second call, with .grad holding the first call's gradients, "


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise answer: shown as text, truthy when the answer is right.

    Returned by every exercise check, in notebooks 01_graph_buffers, 02_multi_loss and 03_gan_step.
    """

    passed: bool
    message: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        text = ("✓ Correct. " if self.passed else "✗ Not yet. ") + self.message
        if self.hint and not self.passed:
            text += f"\n  Hint: {self.hint}"
        return text


class Rejected(Exception):
    """Ends a check with a failing verdict: ``where`` + message, or the message capitalised unless it is code."""

    def __init__(self, message: str, hint: str = "", where: str = "") -> None:
        plain = message.split(" ", 1)[0].isalpha()
        text = where + message if where or not plain else message[:1].upper() + message[1:]
        super().__init__(text)
        self.result = CheckResult(False, text, hint)


def checked(check: Callable[[Any], CheckResult]) -> Callable[[Any], CheckResult]:
    """Refuse a non-function, keep the caller's random stream, and turn a rejection into the verdict."""

    @functools.wraps(check)
    def run(answer: Any) -> CheckResult:
        if not callable(answer):
            return CheckResult(False, "Pass your function itself (without calling it).")
        with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
            try:
                return check(answer)
            except Rejected as rejected:
                return rejected.result

    return run


def run_answer(
    answer: Callable[..., Any],
    *args: Any,
    who: str,
    hint: str = "",
    where: str = "",
    trained: Sequence[torch.Tensor] = (),
) -> Any:
    """Call the learner's answer; an exception it raises becomes the verdict, with its own first line. Given
    ``trained``, the parameters it should train, an optimizer step it takes with their ``.grad`` cleared after the
    backward that filled it (:class:`helpers.zeroed.ZeroedSteps`) is rejected too, before anything else is judged."""
    zeroed = ZeroedSteps(trained)
    try:
        with zeroed.watching() if trained else contextlib.nullcontext():
            result = answer(*args)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        text = lines[0][:90] + ("..." if len(lines[0]) > 90 else "") if lines else ""
        second = "backward through the graph a second time" in str(exc)  # the hint is about that error only
        raise Rejected(
            f"{who} raised {type(exc).__name__}" + (f": {text}" if text else "."), hint if second else "", where
        ) from None
    if problem := zeroed.problem():
        raise Rejected(problem, ZEROED_HINT, where)
    return result


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors, detached and flattened into one vector."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def gradients_or_zeros(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's ``.grad`` (a copy), zeros where it is None."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def clear_multiple(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """``k`` (2 decimals) when ``got`` is clearly ``k`` times ``want``, else None: the same on every CPU."""
    k = round(float(got @ want / (want @ want)), 2)
    return k if k and torch.allclose(got, k * want, rtol=1e-3, atol=1e-6) else None


def gradient_problem(
    params: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    what: str,
    known: Mapping[str, Sequence[torch.Tensor]],
) -> str | None:
    """What is wrong with the parameters' ``.grad`` against ``expected`` (None: nothing), in true words.

    ``known`` names gradients that typical mistakes produce ("those of l1 alone"), recognised first.
    """
    if all(p.grad is None for p in params):
        return "every parameter's .grad is None: no gradient was left in .grad."
    if any(p.grad.requires_grad for p in params if p.grad is not None):
        return ".grad carries a graph of its own (create_graph=True builds one), which keeps memory alive."
    got, want = flat(gradients_or_zeros(params)), flat(expected)
    if gradients_close(got, want):
        return None
    for description, grads in known.items():
        if gradients_close(got, flat(grads)):
            return f"the gradients are {description}, not {what}."
    k = clear_multiple(got, want)
    return f"the gradients are {k:.2f}x {what}." if k is not None else f"the gradients differ from {what}."


def run_loop(
    train: Callable[..., Any],
    args: tuple[Any, ...],
    meter: SavedTensorMeter,
    expected: Sequence[float],
    name: Callable[[int], str],
    where: str,
    hints: Sequence[str],
    one_graph: int,
    trained: Sequence[torch.Tensor] = (),
) -> tuple[bool, float]:
    """Run a learner's loop under ``meter`` and judge what it returns and what its graphs left.

    The history must be a list of one number per batch equal to ``expected`` (tensors without a graph,
    ``loss.detach()``, count as numbers), and no buffers may be left after it returns. ``hints``: on an
    error, on what is stored, on the values, on buffers left. The peak during the loop is the caller's to
    judge with :func:`reject_peak`, after its own checks of the training, so that a loop that does not
    train is told that first; a step on the zeroed gradients of ``trained`` is told before anything else.
    Returns whether the history held tensors, and the peak in graphs (peak / ``one_graph``), from byte
    counts, so the same on every CPU.
    """
    meter.reset_peak()
    with meter:
        history = run_answer(train, *args, who="your loop", where=where, hint=hints[0], trained=trained)
    if not isinstance(history, list) or len(history) != len(expected):
        got = (
            "None"
            if history is None
            else f"a list of {len(history)}"
            if isinstance(history, list)
            else f"a {type(history).__name__}"
        )
        raise Rejected(
            f"return a list with one number per batch ({len(expected)} items); yours returned {got}.",
            "Append one number per batch and return the list.",
            where,
        )
    tensors = [item for item in history if isinstance(item, torch.Tensor)]
    if any(t.grad_fn is not None for t in tensors):
        raise Rejected(
            "the history holds tensors that carry a grad_fn: each one keeps its whole graph (and any "
            "retained buffers) reachable.",
            hints[1],
            where,
        )
    if any(t.requires_grad for t in tensors):
        raise Rejected(
            "the history holds tensors that require grad: they carry no graph, but NumPy and plotting refuse them.",
            hints[1],
            where,
        )
    if not all(isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.numel() == 1) for v in history):
        raise Rejected("each history item should be one number, such as loss.item().", hints[1], where)
    for i, (item, want) in enumerate(zip(history, expected)):
        if not math.isclose(float(item), want, rel_tol=1e-4, abs_tol=1e-6):
            raise Rejected(f"history[{i}] is not {name(i)}.", hints[2], where)
    if left := meter.graph_only_bytes:
        raise Rejected(f"after your loop returned, graphs still hold {format_bytes(left)} of buffers.", hints[3], where)
    return bool(tensors), meter.peak_graph_only_bytes / one_graph


def reject_peak(meter: SavedTensorMeter, one_graph: int, limit: float, hint: str, where: str) -> None:
    """Reject a loop whose graph-only bytes during the run (``meter``'s peak) exceeded ``limit``."""
    if (peak := meter.peak_graph_only_bytes) > limit:
        raise Rejected(
            f"during your loop, graphs held up to {format_bytes(peak)} of buffers at once, "
            f"{peak / one_graph:.1f}x what one batch's graph holds: buffers of an earlier graph were "
            "still alive while another was built.",
            hint,
            where,
        )


def loop_passed(message: str, graphs: float, had_tensors: bool) -> CheckResult:
    """A loop's tick: ``message`` with ``{memory}`` filled in from the peak, and a note if it kept tensors."""
    memory = "never more than one graph's buffers" if graphs <= 1 else f"at most {graphs:.1f}x one graph's buffers"
    note = " (Detached tensors carry no graph; plain floats from .item() are the simplest to plot.)"
    return CheckResult(True, message.format(memory=memory) + (note if had_tensors else ""))
