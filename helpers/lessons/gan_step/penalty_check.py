"""The exercise check on a learner's gradient penalty (exercise 3 of notebook 03_gan_step, WGAN-GP).

The penalty function is called twice on copies of a fixed batch, with every backward call it
makes recorded by :mod:`helpers.lessons.gan_step.watch`; its value, its gradient for D's weights
and what it left behind in D and in the inputs are each judged. A wrong answer is a verdict with
a hint, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.record.learner import first_line
from helpers.checks import CheckResult
from helpers.lessons.gan_step.data import ring_of_gaussians
from helpers.lessons.gan_step.watch import _BackwardCall, _mlp, _watching_backward

__all__ = ["check_gradient_penalty"]


def _reference_penalty(
    netD: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


_PENALTY_HINT = "Mix the points with alpha, take D's gradient at the mixed points, and average (norm - 1) squared."
_CREATE_GRAPH_HINT = (
    "retain_graph=True keeps buffers; only create_graph=True records the gradient computation "
    "itself so it can be differentiated."
)


@dataclass
class _PenaltyCall:
    """One call of a learner's penalty function: what it returned or raised, and what it did."""

    penalty: Any
    error: BaseException | None
    backward_calls: list[_BackwardCall]
    problem: str | None  # a side effect on D or on the inputs


def _call_penalty(
    gradient_penalty: Callable[..., Any],
    netD: torch.nn.Module,
    real: torch.Tensor,
    fake: torch.Tensor,
    alpha: torch.Tensor,
) -> _PenaltyCall:
    """Call it on copies of the inputs with D's .grad empty, and note what it left behind."""
    inputs = {"real": real.clone(), "fake": fake.clone(), "alpha": alpha.clone()}
    weights = {name: p.detach().clone() for name, p in netD.named_parameters()}
    netD.zero_grad(set_to_none=True)
    penalty: Any = None
    error: BaseException | None = None
    try:
        with _watching_backward() as backward_calls:
            penalty = gradient_penalty(netD, inputs["real"], inputs["fake"], inputs["alpha"])
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = exc
    problem = None
    parameters = dict(netD.named_parameters())
    if any(p.grad is not None for p in parameters.values()):
        problem = (
            "Your function left values in D's .grad (a backward inside it accumulated into D's weights): in "
            "training they would be added to D's gradient. torch.autograd.grad returns the gradient "
            "without touching .grad."
        )
    elif any(not p.requires_grad for p in parameters.values()):
        problem = "Your function switched off requires_grad on D's weights and left it off: D would stop learning."
    elif any(not torch.equal(p.detach(), weights[name]) for name, p in parameters.items()):
        problem = "Your function changed D's weights."
    else:
        changed = [
            name
            for name, value in inputs.items()
            if not torch.equal(value.detach(), {"real": real, "fake": fake, "alpha": alpha}[name])
        ]
        if changed:
            problem = (
                f"Your function changed {' and '.join(changed)} in place: the caller's tensor no longer "
                "holds the batch."
            )
    # Put D back only where the function changed it: restoring equal weights in place would bump
    # their version and break the returned penalty's graph.
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.requires_grad_(True)
            if not torch.equal(parameter, weights[name]):
                parameter.copy_(weights[name])
    netD.zero_grad(set_to_none=True)
    return _PenaltyCall(penalty, error, backward_calls, problem)


def _penalty_problem(
    call: _PenaltyCall, netD: torch.nn.Module, expected: torch.Tensor, expected_grads: Sequence[torch.Tensor | None]
) -> CheckResult | None:
    """What is wrong with one call's penalty, or None when it is right."""
    if call.error is not None:
        hint = ""
        if "does not require grad" in first_line(call.error):
            hint = (
                "torch.autograd.grad can only differentiate with respect to a tensor that requires grad: take "
                "D's gradient with respect to the mixed points, and call .requires_grad_() on them before "
                "D sees them."
            )
        return CheckResult(False, f"Your function raised {first_line(call.error)}", hint)
    if call.problem:
        return CheckResult(False, call.problem)
    penalty = call.penalty
    if not isinstance(penalty, torch.Tensor):
        dropped = " (.item() and float() drop the graph)" if isinstance(penalty, (int, float)) else ""
        return CheckResult(
            False, f"Return the penalty as a single-number tensor, not a {type(penalty).__name__}{dropped}."
        )
    if penalty.numel() != 1:
        return CheckResult(
            False,
            f"Return the penalty as a single number (the mean over the batch); your "
            f"function returned shape {tuple(penalty.shape)}.",
            _PENALTY_HINT,
        )
    if not torch.allclose(penalty.detach().float().reshape(()), expected.detach(), rtol=1e-4, atol=1e-6):
        return CheckResult(
            False,
            f"The penalty is {float(penalty.detach()):.4f}; expected {float(expected.detach()):.4f}.",
            _PENALTY_HINT,
        )
    created = any(backward.create_graph for backward in call.backward_calls)
    if penalty.grad_fn is None:
        if penalty.requires_grad:
            return CheckResult(
                False,
                "The value is right, but the penalty is a leaf tensor with no grad_fn, cut "
                "off from D's weights (a .detach() or a new tensor made from the value), so "
                "adding it to d_loss changes nothing.",
                "Return the penalty as computed, without .detach(), .data or torch.tensor(...).",
            )
        if not created:
            return CheckResult(
                False,
                "The value is right, but the penalty is a constant: no gradient reaches D's "
                "weights, so adding it to d_loss changes nothing.",
                _CREATE_GRAPH_HINT,
            )
        return CheckResult(
            False,
            "The value is right, and you used create_graph=True, but the penalty is a "
            "constant: something after the gradient cut the graph (.detach(), .data, "
            "torch.no_grad()), so no gradient reaches D's weights.",
            "Compute the penalty from the gradient exactly as autograd returned it.",
        )
    params = list(netD.parameters())
    try:
        got = torch.autograd.grad(penalty, params, allow_unused=True)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return CheckResult(
            False,
            f"The value is right, but the penalty cannot be backpropagated: {first_line(exc)}",
            _CREATE_GRAPH_HINT if not created else "",
        )
    if all(grad is None for grad in got):
        return CheckResult(
            False,
            "The value is right and the penalty has a grad_fn, but no path in its graph "
            "leads to D's weights, so adding it to d_loss changes nothing for D.",
            _CREATE_GRAPH_HINT if not created else "",
        )
    for (name, parameter), mine, ref in zip(netD.named_parameters(), got, expected_grads):
        mine = torch.zeros_like(parameter) if mine is None else mine
        ref = torch.zeros_like(parameter) if ref is None else ref
        if not torch.allclose(mine, ref, rtol=1e-4, atol=1e-6):
            return CheckResult(
                False,
                f"The value is right, but the penalty's gradient for D's {name} differs from the reference.",
                _CREATE_GRAPH_HINT if not created else "",
            )
    return None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values, NaN equal to NaN (a deterministic function returns the same twice)."""
    if a.shape != b.shape:
        return False
    try:
        return bool(torch.allclose(a.double(), b.double(), rtol=0.0, atol=0.0, equal_nan=True))
    except (RuntimeError, TypeError):  # complex or other values that do not convert
        return torch.equal(a, b)


def check_gradient_penalty(gradient_penalty: object) -> CheckResult:
    """Exercise 3: ``gradient_penalty(netD, real, fake, alpha)`` must give D a gradient (WGAN-GP).

    Called twice on copies of a fixed batch: each call must return the reference value as a
    one-number tensor whose gradient for D's weights equals the reference, and leave D (its
    weights, ``requires_grad`` and ``.grad``) and the inputs as they were. Never raises on a wrong
    answer.

    Used by notebook 03_gan_step.
    """
    if not callable(gradient_penalty):
        return CheckResult(False, "Pass your function itself (without calling it).")
    with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
        generator = torch.Generator().manual_seed(1)
        torch.manual_seed(1)
        netD = _mlp(2, 1)
        real = ring_of_gaussians(64, generator=generator)
        fake = torch.randn(64, 2, generator=generator)
        alpha = torch.rand(64, 1, generator=generator)
        expected = _reference_penalty(netD, real, fake, alpha)
        # The last layer's bias does not affect D's gradient with respect to its input: no gradient.
        expected_grads = torch.autograd.grad(expected, list(netD.parameters()), allow_unused=True)
        calls, values, problems = [], [], []
        for _ in range(2):  # each call judged before the next, which might disturb D
            call = _call_penalty(gradient_penalty, netD, real, fake, alpha)
            calls.append(call)
            values.append(call.penalty.detach().clone() if isinstance(call.penalty, torch.Tensor) else None)
            problems.append(_penalty_problem(call, netD, expected, expected_grads))
    if (
        problems[0] is not None
        and values[0] is not None
        and values[1] is not None
        and not _same_values(values[0], values[1])
    ):
        return CheckResult(
            False,
            "Your function returned two different penalties for the same batch: does it "
            "draw its own random numbers instead of using alpha?",
            _PENALTY_HINT,
        )
    if problems[0] is not None:
        return problems[0]
    if problems[1] is not None:
        message = problems[1].message
        return CheckResult(
            False,
            f"Right on the first call, but not on the second: {message[:1].lower()}{message[1:]}",
            problems[1].hint,
        )
    how = " (create_graph=True)" if any(b.create_graph for b in calls[0].backward_calls) else ""
    return CheckResult(
        True,
        f"The penalty gives D the right gradient, call after call: the gradient computation itself was recorded{how}.",
    )
