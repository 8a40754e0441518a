"""Notebook 06's exercise checks: a PPO update over stored log-probs, and a SAM step.

Each check builds its own small model and data, runs the learner's function twice (the second time from
the parameters the first call left, with ``.grad`` still holding values), records every optimizer step
through a step hook, and compares each step with a reference computed here. Messages name only what was
measured: a step on .grad cleared after its backward (:mod:`helpers.zeroed`) first, then the number of steps,
which step first differs, and what that step's gradient equals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle

from helpers.checks import SECOND_CALL, CheckResult, Rejected, checked, flat, run_answer
from helpers.measure import gradients_close

__all__ = ["check_ppo_update", "check_sam_step"]

EPOCHS, CLIP, PPO_LR = 4, 0.2, 0.5
RHO, SAM_LR = 0.05, 0.1


@dataclass(frozen=True)
class _BeforeStep:
    """The parameters and their ``.grad`` (zeros where there is none), flattened, just before an optimizer step."""

    params: torch.Tensor
    grad: torch.Tensor


def _recording(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> tuple[list[_BeforeStep], RemovableHandle]:
    """Record, at every ``optimizer.step()``, the parameters and their ``.grad`` just before it."""
    steps: list[_BeforeStep] = []

    def before(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        steps.append(
            _BeforeStep(flat(params), flat([torch.zeros_like(p) if p.grad is None else p.grad for p in params]))
        )

    return steps, optimizer.register_step_pre_hook(before)


# -- PPO ------------------------------------------------------------------------------------------------


def ppo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The clipped PPO objective, as notebook 06 writes it."""
    ratio = torch.exp(new_log_probs - old_log_probs)
    return -torch.min(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages).mean()


def _ppo_setup() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(3)  # inside the check's fork_rng
    return torch.nn.Linear(4, 3), torch.randn(64, 4, generator=generator), torch.randn(64, generator=generator)


def _rollout(policy: torch.nn.Module, observations: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions sampled from the policy, and their log-probs *with* the rollout's graph, as a rollout stores them."""
    distribution = torch.distributions.Categorical(logits=policy(observations))
    generator = torch.Generator().manual_seed(seed)
    actions = torch.multinomial(distribution.probs.detach(), 1, generator=generator).squeeze(1)
    return actions, distribution.log_prob(actions)


def _reference_ppo(
    policy: torch.nn.Module,
    observations: torch.Tensor,
    actions: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
) -> list[_BeforeStep]:
    optimizer = torch.optim.SGD(policy.parameters(), lr=PPO_LR)
    steps, handle = _recording(optimizer, list(policy.parameters()))
    old = old.detach()
    for _ in range(EPOCHS):
        new = torch.distributions.Categorical(logits=policy(observations)).log_prob(actions)
        optimizer.zero_grad()
        ppo_loss(new, old, advantages).backward()
        optimizer.step()
    handle.remove()
    return steps


def _first_bad_step(
    got: list[_BeforeStep],
    want: list[_BeforeStep],
    who: str,
    where: str,
    hint: str,
    known: dict[str, Callable[[int], torch.Tensor]],
) -> None:
    if len(got) != len(want):
        raise Rejected(f"{who} made {len(got)} optimizer step(s); the right one makes {len(want)}.", hint, where)
    for index, (mine, right) in enumerate(zip(got, want), start=1):
        if not gradients_close(mine.params, right.params):
            raise Rejected(f"the parameters before optimizer step {index} differ from the right update's.", hint, where)
        if not gradients_close(mine.grad, right.grad):
            for description, gradient in known.items():
                if gradients_close(mine.grad, gradient(index)):
                    raise Rejected(f"at optimizer step {index}, .grad holds {description}.", hint, where)
            raise Rejected(f"at optimizer step {index}, .grad differs from the right update's gradient.", hint, where)


def _ppo_mistakes(want: list[_BeforeStep], got: list[_BeforeStep]) -> dict[str, Callable[[int], torch.Tensor]]:
    """What .grad holds at optimizer step ``index`` (from 1) after two typical mistakes: nothing backpropagated, or
    nothing zeroed (the right gradient plus what .grad held before: the check's ones before the first step)."""
    zero = torch.zeros_like(want[0].grad)
    return {
        "zeros": lambda index: zero,
        "the right gradient plus the one left in .grad before it": lambda index: (
            want[index - 1].grad + (got[index - 2].grad if index > 1 else torch.ones_like(zero))
        ),
    }


@checked
def check_ppo_update(ppo_update: Callable[..., Any]) -> CheckResult:
    """Exercise 1: ``ppo_update(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs)``.

    The check gives it log-probs that still carry the rollout's graph (as a rollout stores them), runs it
    twice (a second rollout, from the parameters the first call left, with ``.grad`` left dirty), and
    compares every optimizer step with four epochs of the right update.

    Used by notebook 06_real_stack.
    """
    policy, observations, advantages = _ppo_setup()
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(policy.state_dict())
    hint = (
        "Store the rollout's log-probs detached (the old policy is a constant), and compute the new log-probs "
        "from the current policy inside every epoch."
    )
    for call in range(2):
        where = SECOND_CALL if call else ""
        actions, rollout_log_probs = _rollout(policy, observations, seed=call)
        want = _reference_ppo(reference, observations, actions, rollout_log_probs.detach(), advantages)
        optimizer = torch.optim.SGD(policy.parameters(), lr=PPO_LR)
        for p in policy.parameters():
            p.grad = torch.ones_like(p)  # what an earlier update may leave behind
        steps, handle = _recording(optimizer, list(policy.parameters()))
        start = flat(list(policy.parameters()))
        try:
            run_answer(
                ppo_update,
                policy,
                optimizer,
                observations,
                actions,
                rollout_log_probs,
                advantages,
                EPOCHS,
                who="your update",
                where=where,
                hint=hint,
                trained=list(policy.parameters()),
            )
        finally:
            handle.remove()
        if steps and torch.equal(flat(list(policy.parameters())), start):
            raise Rejected("your update left the policy's parameters exactly where they started.", hint, where)
        _first_bad_step(steps, want, "your update", where, hint, _ppo_mistakes(want, steps))
        if not gradients_close(flat(list(policy.parameters())), flat(list(reference.parameters()))):
            raise Rejected("the parameters after your update differ from the right update's.", hint, where)
    return CheckResult(
        True,
        f"{EPOCHS} epochs, each a new forward with the current policy against the stored, "
        "detached log-probs: every step matches the right update, also from dirty .grad.",
    )


# -- SAM ------------------------------------------------------------------------------------------------


def _sam_setup() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    torch.manual_seed(5)  # inside the check's fork_rng
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator)


def _gradient_at(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, shift: list[torch.Tensor]) -> torch.Tensor:
    params = {name: p.detach() + s for (name, p), s in zip(model.named_parameters(), shift)}
    values = list(params.values())
    for value in values:
        value.requires_grad_(True)
    loss = F.mse_loss(torch.func.functional_call(model, params, (x,)), y)
    return flat(torch.autograd.grad(loss, values))


@checked
def check_sam_step(sam_step: Callable[..., Any]) -> CheckResult:
    """Exercise 2: ``sam_step(model, optimizer, loss_fn, rho)``, one SAM step (``loss_fn()`` runs a forward).

    The check runs it twice on its own model (the second time with ``.grad`` left dirty) and compares the
    one optimizer step each call makes with SAM's: the gradient at ``w + rho * g / |g|``, applied at ``w``.

    Used by notebook 06_real_stack.
    """
    model, x, y = _sam_setup()
    params = list(model.parameters())
    hint = (
        "Two forwards: the first at w gives g; perturb w by rho * g / |g| in place (under torch.no_grad), zero "
        ".grad, run a second forward and backward there, put w back, then optimizer.step()."
    )
    for call in range(2):
        where = SECOND_CALL if call else ""
        w = flat(params)
        zeros = [torch.zeros_like(p) for p in params]
        g = _gradient_at(model, x, y, zeros)
        e = RHO * g / g.norm()
        shift, offset = [], 0
        for p in params:
            shift.append(e[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        g_sam = _gradient_at(model, x, y, shift)
        for p in params:
            p.grad = torch.full_like(p, 0.5)  # what the previous step leaves when nothing zeroes it
        optimizer = torch.optim.SGD(params, lr=SAM_LR)
        steps, handle = _recording(optimizer, params)
        try:
            run_answer(
                sam_step,
                model,
                optimizer,
                lambda: F.mse_loss(model(x), y),
                RHO,
                who="your step",
                where=where,
                hint=hint,
                trained=params,
            )
        finally:
            handle.remove()
        if len(steps) != 1:
            raise Rejected(f"your step made {len(steps)} optimizer step(s); a SAM step makes one.", hint, where)
        (step,) = steps
        if gradients_close(step.params, w + e):
            raise Rejected(
                "optimizer.step() ran while the weights were still perturbed: put w back before it.", hint, where
            )
        if not gradients_close(step.params, w):
            raise Rejected("the weights at optimizer.step() are neither w nor w + e.", hint, where)
        for description, gradient in {
            "the gradient at w (a plain step, not SAM's)": g,
            "the sum of the gradients at w and at w + e (.grad was not zeroed between)": g + g_sam,
            "the gradient at w + e plus what .grad held before the step": g_sam + 0.5,
        }.items():
            if gradients_close(step.grad, gradient):
                raise Rejected(f".grad at optimizer.step() holds {description}.", hint, where)
        if not gradients_close(step.grad, g_sam):
            raise Rejected(".grad at optimizer.step() differs from the gradient at w + e.", hint, where)
        if not gradients_close(flat(params), w - SAM_LR * g_sam):
            raise Rejected("the parameters after your step differ from SAM's.", hint, where)
    return CheckResult(
        True,
        "one optimizer step, at w, with the gradient of a second forward at w + e: SAM's step, "
        "twice, also from dirty .grad.",
    )
