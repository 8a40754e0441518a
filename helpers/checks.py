"""Check functions for the exercises: each runs the learner's answer live and says what is wrong.

Every check returns a :class:`CheckResult`, which is truthy when the answer is right and shows as
the verdict (a tick, or what is wrong plus a hint); it never raises on a wrong answer. Used by
notebook 01_graph_buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from helpers.meter import SavedTensorMeter, format_bytes

__all__ = [
    "CheckResult",
    "SECOND_BACKWARD_QUESTIONS",
    "check_backward_three_times",
    "check_predictions",
    "check_training_loop",
]

# Expression text -> function of (x, w) building it; the check measures the answers live.
SECOND_BACKWARD_QUESTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "(x + w).sum()": lambda x, w: (x + w).sum(),
    "(x * w).sum()": lambda x, w: (x * w).sum(),
    "x.exp().sum()": lambda x, w: x.exp().sum(),
    "x.view(2, 3).sum()": lambda x, w: x.view(2, 3).sum(),
    "(x * 2).sum()": lambda x, w: (x * 2).sum(),
    "x.mean()": lambda x, w: x.mean(),
}


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise answer: shown as text, truthy when the answer is right."""

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


def _verdict(ok: bool, message: str, hint: str = "") -> CheckResult:
    return CheckResult(ok, message, hint)


def second_backward_works(expression: str) -> bool:
    """Build ``expression`` on fresh ``x`` and ``w``, backward twice, say whether the second worked."""
    x = torch.arange(1.0, 7.0, requires_grad=True)
    w = torch.full((6,), 0.5, requires_grad=True)
    loss = SECOND_BACKWARD_QUESTIONS[expression](x, w)
    loss.backward()
    try:
        loss.backward()
    except RuntimeError:
        return False
    return True


def check_predictions(predictions: Mapping[str, bool]) -> CheckResult:
    """Exercise 1: for each expression, predict whether a second plain backward() works."""
    if not isinstance(predictions, Mapping):
        return _verdict(False, f"Give a dict of expression -> True/False, not {type(predictions).__name__}.")
    missing = [e for e in SECOND_BACKWARD_QUESTIONS if not isinstance(predictions.get(e), bool)]
    if missing:
        return _verdict(False, f"Fill in True or False for: {', '.join(missing)}.",
                        "Replace each ... with True (second backward works) or False (it raises).")
    wrong = [e for e in SECOND_BACKWARD_QUESTIONS if predictions[e] != second_backward_works(e)]
    if wrong:
        return _verdict(
            False, f"{len(wrong)} of {len(SECOND_BACKWARD_QUESTIONS)} predictions are wrong: {', '.join(wrong)}.",
            "A second backward fails exactly when a node saved a tensor it needs for its gradient. "
            "Adding and viewing save nothing; multiplying saves the other factor, even a Python number.")
    return _verdict(True, "Every prediction matches what autograd does.")


def check_backward_three_times(backward_three_times: Callable[[torch.Tensor], None]) -> CheckResult:
    """Exercise 2: backward one loss three times so ``.grad`` is 3x, leaving no buffers behind."""
    if not callable(backward_three_times):
        return _verdict(False, "Pass your function itself (without calling it).")
    weight = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    inputs = torch.tensor([0.5, 1.5, -1.0])
    meter = SavedTensorMeter()
    with meter:
        loss = torch.tanh(inputs * weight).sum()
    expected = 3 * torch.autograd.grad(loss, weight, retain_graph=True)[0]
    try:
        backward_three_times(loss)
    except RuntimeError as exc:
        return _verdict(False, f"Your function raised: {str(exc).splitlines()[0][:90]}...",
                        "Every backward except the last needs retain_graph=True.")
    if weight.grad is None:
        return _verdict(False, "weight.grad is None: your function did not call backward.")
    if not torch.allclose(weight.grad, expected):
        ratio = float(weight.grad[0] / expected[0] * 3)
        return _verdict(False, f"weight.grad is {ratio:.2f}x one backward's gradient, not 3x.",
                        "Call loss.backward(...) exactly three times and do not zero .grad in between.")
    left = meter.graph_only_bytes
    if left:
        return _verdict(False, f"The gradient is right, but the graph still holds {format_bytes(left)} of buffers.",
                        "Only the backward calls that are followed by another one need retain_graph=True.")
    return _verdict(True, "weight.grad is 3x one backward, and the last backward freed the buffers.")


def check_training_loop(train: Callable[[torch.nn.Module, list[torch.Tensor]], list[float]]) -> CheckResult:
    """Exercise 3: a loop that records each step's loss must leave no graph buffers behind."""
    if not callable(train):
        return _verdict(False, "Pass your function itself (without calling it).")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    batches = [torch.randn(16, 8) for _ in range(5)]
    meter = SavedTensorMeter()
    with meter:
        try:
            history = train(model, batches)
        except RuntimeError as exc:
            return _verdict(False, f"Your loop raised: {str(exc).splitlines()[0][:90]}...")
    if not isinstance(history, list) or len(history) != len(batches):
        return _verdict(False, f"Return a list with one loss per batch ({len(batches)} items).")
    if any(isinstance(item, torch.Tensor) for item in history):
        return _verdict(False, "The history holds tensors, and each one keeps its whole graph reachable.",
                        "Store loss.item(), a plain Python number.")
    left = meter.graph_only_bytes
    if left:
        return _verdict(False, f"After the loop the graphs still hold {format_bytes(left)} of buffers.",
                        "Is something still retaining graphs, or keeping tensors that carry a grad_fn?")
    if not all(isinstance(item, float) for item in history):
        return _verdict(False, "Each history item should be a float (loss.item()).")
    return _verdict(True, "The loop keeps only numbers, so every graph was freed by its backward.")
