"""Check functions for the exercises: each runs the learner's answer live and says what is wrong.

Every check returns a :class:`CheckResult`, which is truthy when the answer is right and shows as
the verdict (a tick, or what is wrong plus a hint); it never raises on a wrong answer. Used by
notebooks 01_graph_buffers and 02_multi_loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from helpers.meter import SavedTensorMeter, format_bytes

__all__ = [
    "CheckResult",
    "SECOND_BACKWARD_QUESTIONS",
    "check_backward_both",
    "check_backward_three_times",
    "check_predictions",
    "check_training_loop",
    "check_two_loss_loop",
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
    """The verdict on one exercise answer: shown as text, truthy when the answer is right.

    Returned by every check in notebooks 01_graph_buffers and 02_multi_loss.
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


def _verdict(ok: bool, message: str, hint: str = "") -> CheckResult:
    return CheckResult(ok, message, hint)


def _history_problem(history: object, batches: int, meter: SavedTensorMeter, tensor_hint: str,
                     left_hint: str) -> CheckResult | None:
    """What is wrong with a training loop's returned history, judged after the loop ran; None if nothing."""
    if not isinstance(history, list) or len(history) != batches:
        return _verdict(False, f"Return a list with one loss per batch ({batches} items).")
    if any(isinstance(item, torch.Tensor) for item in history):
        return _verdict(False, "The history holds tensors, and each one keeps its whole graph (and any "
                               "retained buffers) reachable.", tensor_hint)
    left = meter.graph_only_bytes
    if left:
        return _verdict(False, f"After the loop the graphs still hold {format_bytes(left)} of buffers.", left_hint)
    return None


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
    """Notebook 01_graph_buffers, exercise 1: predict, per expression, whether a second plain backward() works."""
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
    """Notebook 01_graph_buffers, exercise 2: backward three times so ``.grad`` is 3x, leaving no buffers."""
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
    """Notebook 01_graph_buffers, exercise 3: a loop that records its losses must leave no buffers behind."""
    if not callable(train):
        return _verdict(False, "Pass your function itself (without calling it).")
    with torch.random.fork_rng():  # a check must not disturb the learner's random stream
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        batches = [torch.randn(16, 8) for _ in range(5)]
    meter = SavedTensorMeter()
    with meter:
        try:
            history = train(model, batches)
        except RuntimeError as exc:
            return _verdict(False, f"Your loop raised: {str(exc).splitlines()[0][:90]}...")
    problem = _history_problem(history, len(batches), meter, "Store loss.item(), a plain Python number.",
                               "Is something still retaining graphs, or keeping tensors that carry a grad_fn?")
    if problem is not None:
        return problem
    if not all(isinstance(item, float) for item in history):
        return _verdict(False, "Each history item should be a float (loss.item()).")
    return _verdict(True, "The loop keeps only numbers, so every graph was freed by its backward.")


class _TwoHeads(torch.nn.Module):
    """The checks' own copy of notebook 02's model: a shared trunk, a classifier and a regressor."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                         torch.nn.ReLU())
        self.classify = torch.nn.Linear(128, 4)
        self.regress = torch.nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(x)
        return self.classify(features), self.regress(features)


def _two_head_setup(batches: int = 4) -> tuple[_TwoHeads, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():  # a check must not disturb the learner's random stream
        torch.manual_seed(0)
        net = _TwoHeads()
    data = [(torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator),
             torch.randn(64, 1, generator=generator)) for _ in range(batches)]
    return net, data


def _two_losses(net: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits, value = net(x)
    return torch.nn.functional.cross_entropy(logits, labels), torch.nn.functional.mse_loss(value, targets)


def _reference_gradients(net: torch.nn.Module, data: list[tuple[torch.Tensor, ...]]) -> dict[str, torch.Tensor]:
    net.zero_grad(set_to_none=True)
    for x, labels, targets in data:
        l1, l2 = _two_losses(net, x, labels, targets)
        (l1 + l2).backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    return grads


def _gradients_match(net: torch.nn.Module, reference: dict[str, torch.Tensor]) -> str | None:
    for name, p in net.named_parameters():
        if p.grad is None:
            return f"{name}.grad is None: did every loss reach the backward pass?"
        if not torch.allclose(p.grad, reference[name], rtol=1e-4, atol=1e-6):
            ratio = float(p.grad.norm() / reference[name].norm())
            return f"{name}.grad differs from the gradient of l1 + l2 (its norm is {ratio:.2f}x the expected one)."
    return None


def check_two_loss_loop(
    train: Callable[[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]], list[float]],
) -> CheckResult:
    """Notebook 02, exercise 1: a two-loss loop must accumulate the right gradients and keep no graphs."""
    if not callable(train):
        return _verdict(False, "Pass your function itself (without calling it).")
    net, data = _two_head_setup()
    reference = _reference_gradients(net, data)
    meter = SavedTensorMeter()
    with meter:
        try:
            history = train(net, data)
        except RuntimeError as exc:
            return _verdict(False, f"Your loop raised: {str(exc).splitlines()[0][:90]}...",
                            "Both losses share the trunk: the first backward through it must keep the buffers.")
    problem = _history_problem(history, len(data), meter,
                               "Append (l1 + l2).item() or l1.item() + l2.item(): plain numbers.",
                               "Which backward is the last one through each graph? It should not retain.")
    if problem is not None:
        return problem
    problem = _gradients_match(net, reference)
    if problem:
        return _verdict(False, problem, "Backpropagate both losses once per batch, and do not zero .grad in the loop.")
    return _verdict(True, "Right gradients, numbers in the history, and no buffers left behind.")


def check_backward_both(backward_both: Callable[[torch.Tensor, torch.Tensor], None]) -> CheckResult:
    """Notebook 02, exercise 2: both losses' gradients, freed buffers, and no more memory than one backward."""
    if not callable(backward_both):
        return _verdict(False, "Pass your function itself (without calling it).")
    from helpers.compare import profiler_peak_bytes

    net, data = _two_head_setup(batches=1)
    reference = _reference_gradients(net, data)
    x, labels, targets = data[0]

    def summed() -> None:
        l1, l2 = _two_losses(net, x, labels, targets)
        (l1 + l2).backward()

    meter = SavedTensorMeter()
    left_behind: list[int] = []

    def learners() -> None:
        with meter:
            l1, l2 = _two_losses(net, x, labels, targets)
        backward_both(l1, l2)
        left_behind.append(meter.graph_only_bytes)  # while l1 and l2 are still referenced

    try:
        learners()
    except RuntimeError as exc:
        return _verdict(False, f"Your function raised: {str(exc).splitlines()[0][:90]}...",
                        "The two losses share the trunk's buffers.")
    problem = _gradients_match(net, reference)
    if problem:
        return _verdict(False, problem)
    if left_behind[0]:
        return _verdict(
            False, f"Right gradients, but while l1 and l2 are still referenced the graph holds "
                   f"{format_bytes(left_behind[0])} of buffers after your function.",
            "Buffers survive a backward that retains, and buffers off the last backward's path: a backward "
            "frees only what it walks through. One backward through everything frees it all.")
    net.zero_grad(set_to_none=True)
    expected_peak = min(profiler_peak_bytes(summed) for _ in range(2))
    net.zero_grad(set_to_none=True)
    your_peak = min(profiler_peak_bytes(learners) for _ in range(2))
    net.zero_grad(set_to_none=True)
    if your_peak > 1.1 * expected_peak:
        return _verdict(
            False,
            f"Right gradients, but your step allocated up to {format_bytes(your_peak)}; one backward of l1 + l2 "
            f"needs {format_bytes(expected_peak)}.",
            "Two backward passes through the trunk allocate its gradients twice. Can you do it in one pass?")
    return _verdict(True, f"Right gradients in one pass: peak {format_bytes(your_peak)} "
                          f"(one backward of l1 + l2: {format_bytes(expected_peak)}).")
