"""The exercise checks on a learner's GAN step (exercises 1 and 2 of notebook 03_gan_step).

A step that is right once can be wrong from its second call on (nothing clears .grad, so D trains
on the sum of earlier losses), so each step is judged on three calls in a row at learning rate 0:
from empty .grad, right after itself, and with .grad pre-filled with other values. Every
gradient an optimizer receives at any step() call must equal the reference. What each backward
call did is recorded by :mod:`helpers.lessons.gan_step.watch`. A step whose optimizer finds .grad
cleared after the backward that filled it is told so (:mod:`helpers.zeroed`) before how its gradients
differ. A wrong answer is a verdict with a hint, never an exception.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.record.learner import first_line
from helpers.checks import CheckResult
from helpers.lessons.gan_step.checker import NETWORK_NAMES, GanStepChecker, _by_name, _bytes_or_dash
from helpers.lessons.gan_step.data import ring_of_gaussians
from helpers.lessons.gan_step.steps import STANDARD_SETTINGS, Step, make_step
from helpers.lessons.gan_step.watch import _BackwardCall, _d_loss, _g_loss, _mlp, _watching_backward
from helpers.measure import gradients_close, gradients_of
from helpers.zeroed import ZEROED_HINT, ZeroedSteps

__all__ = ["check_fixed_srgan_step", "check_single_forward_step"]


def _toy_checker(seed: int = 0) -> GanStepChecker:
    """The checks' own small GAN (notebook 03's shapes, smaller), with the notebook's losses."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    netG, netD = _mlp(2, 2), _mlp(2, 1)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    real = ring_of_gaussians(64, generator=generator)
    z = torch.randn(64, 2, generator=generator)
    return GanStepChecker(netG, netD, optimizerG, optimizerD, real, z, _d_loss, _g_loss)


@dataclass
class _StepCall:
    """What one call of a learner's step did: .grad as it began, what each optimizer received at
    each of its ``step()`` calls, .grad as the call ended, D's passes, the backward calls, the
    exception it raised, if any, and what :class:`ZeroedSteps` says of its steps (None: nothing)."""

    entry: dict[str, dict[str, torch.Tensor | None]]
    received: dict[str, list[dict[str, torch.Tensor | None]]]
    final: dict[str, dict[str, torch.Tensor | None]]
    d_passes: int
    backward_calls: list[_BackwardCall]
    error: BaseException | None
    zeroed: str | None


# The three calls each step is judged on, and how each is described in a verdict.
_CALLS = ("from empty .grad", "right after another call", "with .grad already holding values")


def _prefill(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Fill every .grad with fixed nonzero values, as other code (a penalty, an evaluation) might."""
    for parameter in module.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator).to(parameter)


def _run_three_calls(checker: GanStepChecker, step: Step) -> list[_StepCall]:
    """Call ``step`` three times in a row at learning rate 0 (see ``_CALLS``); a call that raises ends the run.

    D's passes are counted at its first parameterized layer, so ``netD.forward(x)`` counts too.
    Weights, optimizer state and .grad are restored afterwards.
    """
    modules = {"D": checker.netD, "G": checker.netG}
    prefill = torch.Generator().manual_seed(3)
    calls: list[_StepCall] = []
    with checker.frozen():
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        for index in range(len(_CALLS)):
            if index == 2:
                for module in modules.values():
                    _prefill(module, prefill)
            calls.append(_call_once(checker, step))
            if calls[-1].error is not None:
                break
    return calls


def _call_once(checker: GanStepChecker, step: Step) -> _StepCall:
    """Call ``step`` once, recording .grad as the call begins, at each optimizer's ``step()`` and as it ends, D's
    passes (at its first parameterized layer) and the backward calls; the exception it raises is kept."""
    modules = {"D": checker.netD, "G": checker.netG}
    optimizers = {"D": checker.optimizerD, "G": checker.optimizerG}
    first_layer = next(m for m in checker.netD.modules() if list(m.parameters(recurse=False)))
    received: dict[str, list[dict[str, torch.Tensor | None]]] = {"D": [], "G": []}
    passes = [0]

    def count_pass(*_: Any) -> None:
        passes[0] += 1

    def recorder(key: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            received[key].append(gradients_of(modules[key]))

        return hook

    entry = {key: gradients_of(module) for key, module in modules.items()}
    handles = [optimizers[key].register_step_pre_hook(recorder(key)) for key in optimizers]
    handles.append(first_layer.register_forward_hook(count_pass))
    zeroed = ZeroedSteps(
        [p for module in modules.values() for p in module.parameters()],
        {id(optimizer): f"optimizer{key}" for key, optimizer in optimizers.items()},
    )
    error: BaseException | None = None
    try:
        with _watching_backward() as backward_calls, zeroed.watching():
            step(*checker._args())
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = exc
    finally:
        for handle in handles:
            handle.remove()
    final = {key: gradients_of(module) for key, module in modules.items()}
    return _StepCall(entry, received, final, passes[0], backward_calls, error, zeroed.problem())


def _flat(grads: Mapping[str, torch.Tensor | None], like: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat(
        [
            (grad if (grad := grads.get(name)) is not None else torch.zeros_like(ref)).reshape(-1)
            for name, ref in like.items()
        ]
    )


def _cross_reference(checker: GanStepChecker) -> dict[str, dict[str, torch.Tensor]]:
    """Each network's gradient of the *other* network's loss: D's of g_loss, G's of d_loss (fake not detached)."""
    d_params, g_params = dict(checker.netD.named_parameters()), dict(checker.netG.named_parameters())
    fake = checker.netG(checker.z)
    g_loss = checker.g_loss_fn(checker.netD(fake))
    d_grads = torch.autograd.grad(g_loss, list(d_params.values()), allow_unused=True)
    d_loss = checker.d_loss_fn(checker.netD(checker.real), checker.netD(fake))
    g_grads = torch.autograd.grad(d_loss, list(g_params.values()), allow_unused=True)
    return {"D": _by_name(d_params, d_grads), "G": _by_name(g_params, g_grads)}


_OWN_LOSS = {"D": "d_loss", "G": "g_loss"}
_OPTIMIZER = {"D": "optimizerD", "G": "optimizerG"}


def _combination(d_times: int, g_times: int) -> str:
    """``'d_loss + g_loss'``, ``'2 × d_loss'``, ``'g_loss'``: the loss whose gradient a network received."""
    counted = (("d_loss", d_times), ("g_loss", g_times))
    return " + ".join(f"{'' if times == 1 else f'{times} × '}{loss}" for loss, times in counted if times)


def _what_was_received(
    key: str,
    got: Mapping[str, torch.Tensor | None],
    reference: Mapping[str, torch.Tensor],
    cross: Mapping[str, torch.Tensor],
) -> tuple[str, str] | None:
    """Name the wrong gradient a network's optimizer received on a first call, if it is a simple one.

    Returns ``(kind, sentence)``, kind one of ``'empty'``, ``'zero'``, ``'repeated'``, ``'other loss'``,
    ``'both losses'``; tries small whole multiples of the network's own loss's gradient and the other's.
    """
    network = f"{key}'s optimizer"
    if all(value is None for value in got.values()):
        return "empty", (
            f"{network} found no gradient at all: {key}'s .grad was empty (None) when {_OPTIMIZER[key]}.step() ran."
        )
    flat, own, other = _flat(got, reference), _flat(reference, reference), _flat(cross, reference)
    if not bool(flat.abs().max() > 0):
        return "zero", (
            f"{network} received a zero gradient: {key}'s .grad held only zeros when {_OPTIMIZER[key]}.step() ran."
        )
    for own_times, other_times in itertools.product(range(4), range(3)):
        if (own_times, other_times) in ((0, 0), (1, 0)) or not gradients_close(
            flat, own_times * own + other_times * other
        ):
            continue
        d_times, g_times = (own_times, other_times) if key == "D" else (other_times, own_times)
        text = f"{network} received the gradient of {_combination(d_times, g_times)}"
        if other_times == 0:
            return "repeated", (
                f"{text}: {own_times} times {_OWN_LOSS[key]}'s, as {own_times} backward passes of "
                f"{_OWN_LOSS[key]} into {key} give (a retain_graph=True lets a second backward add the "
                f"same gradient again), or one pass of {own_times} × {_OWN_LOSS[key]}."
            )
        if own_times == 0:
            return "other loss", f"{text} instead of {_OWN_LOSS[key]}'s."
        return "both losses", f"{text}, not of {_OWN_LOSS[key]} alone."
    return None


def _first_call_hint(kinds: set[str]) -> str:
    if kinds & {"empty", "zero"}:
        return (
            "A network's .grad is filled by a backward whose path reaches its parameters (no .detach() on the "
            "way, and listed in inputs= if you pass it); call its optimizer's step() after that backward, and "
            "clear .grad only before it."
        )
    if kinds == {"repeated"}:
        return "Backpropagate each loss, unscaled, into each network once per step."
    return (
        "D's gradient must come from d_loss alone (fake term on fake.detach() or through inputs=), G's from "
        "g_loss alone. Is a backward adding into the other network's .grad?"
    )


def _step_call_problem(counts: Mapping[str, int], before: str = "") -> str | None:
    """What is wrong with how often a call stepped each optimizer (``{'D': 1, 'G': 0}``), or None."""
    problems = []
    for key in ("D", "G"):
        if counts[key] == 0:
            problems.append(f"never calls {_OPTIMIZER[key]}.step(), so the {NETWORK_NAMES[key]} would never learn")
        elif counts[key] > 1:
            problems.append(f"calls {_OPTIMIZER[key]}.step() {counts[key]} times")
    if not problems:
        return None
    sentence = f"your step {' and '.join(problems)}; call each optimizer's step() once per training step."
    return f"{before}{sentence}" if before else sentence[0].upper() + sentence[1:]


def _later_call_problem(
    call: _StepCall, index: int, previous: _StepCall | None, reference: Mapping[str, Mapping[str, torch.Tensor]]
) -> tuple[str, str] | None:
    """Message and hint when an optimizer got a wrong gradient on one of the calls after the first (see ``_CALLS``)."""
    leftover, unexplained = [], []
    for key in ("D", "G"):
        got = _flat(call.received[key][0], reference[key])
        expected = _flat(reference[key], reference[key])
        if gradients_close(got, expected):
            continue
        entry = _flat(call.entry[key], reference[key])
        if bool(entry.abs().max() > 0) and gradients_close(got, expected + entry):
            leftover.append(key)
        else:
            unexplained.append(key)
    fix = (
        "Clear each network's .grad at the start of the step, before its backward: net.zero_grad() or "
        "optimizer.zero_grad()."
    )
    if leftover:
        who, whose = " and ".join(leftover), " and ".join(f"{key}'s" for key in leftover)
        optimizers = f"{whose} optimizer{'s' if len(leftover) > 1 else ''}"
        if index == 1:
            twice = all(
                gradients_close(_flat(call.entry[key], reference[key]), _flat(reference[key], reference[key]))
                for key in leftover
            )
            what = (
                "twice the reference gradient, the sum of two steps' gradients"
                if twice
                else "the reference gradient plus what the first call left in .grad"
            )
            return (
                f"Right on a first call, but on the second call in a row {optimizers} received {what}: "
                f"nothing cleared {whose} .grad before the backward, so from the second iteration on "
                f"{who} would train on the sum of earlier losses.",
                fix,
            )
        cleared_at_end = previous is not None and all(
            all(value is None or not bool(value.abs().max() > 0) for value in previous.final[key].values())
            for key in leftover
        )
        how = (
            "your step clears .grad after using it, not before its backward"
            if cleared_at_end
            else f"nothing cleared {whose} .grad before the backward"
        )
        return (
            "Right from empty .grad and twice in a row, but when .grad already holds values as the step begins "
            "(left by other code: a gradient penalty, an evaluation backward, an earlier cell), "
            f"{optimizers} received them added to the reference gradient: {how}.",
            fix,
        )
    if unexplained:
        whose = " and ".join(f"{key}'s" for key in unexplained)
        optimizers = f"{whose} optimizer{'s' if len(unexplained) > 1 else ''}"
        return (
            f"Right on a first call, but called {'again ' if index == 0 else ''}{_CALLS[index]}, {optimizers} "
            "received a wrong gradient.",
            "A step must hand each optimizer the same gradient whatever .grad held and whatever ran before it.",
        )
    return None


def _zeroed_steps(checker: GanStepChecker, step: Step) -> str | None:
    """What :class:`ZeroedSteps` says of one more call of ``step`` (frozen, from empty .grad): an optimizer step
    taken on the gradients its network's backward filled and something then cleared. None when there is none."""
    with checker.frozen():
        checker.netG.zero_grad(set_to_none=True)
        checker.netD.zero_grad(set_to_none=True)
        return _call_once(checker, step).zeroed


def _judge_step(step: Any, single_forward: bool) -> CheckResult:
    if not callable(step):
        return CheckResult(False, "Pass your step function itself (without calling it).")
    with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
        return _judge_step_calls(step, single_forward)


def _judge_step_calls(step: Step, single_forward: bool) -> CheckResult:
    checker = _toy_checker()
    try:
        result = checker.check(step)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return CheckResult(False, f"Your step raised {first_line(exc)}")
    if result.outcome == "error":
        hint = {
            "in-place modification": "optimizerD.step() changed D's weights in place while a graph still needed "
            "the old ones: compute every gradient that needs D's current weights before "
            "D's step.",
            "backward a second time": "A second backward went through buffers the first one freed. Which graph "
            "does g_loss need?",
        }.get(result.error_kind or "", "")
        return CheckResult(False, f"Your step raised {(result.error or '').split(' Hint:')[0]}", hint)
    problem = _step_call_problem(result.step_calls)
    if problem:
        return CheckResult(False, problem)
    if result.outcome == "silently wrong":
        if zeroed := _zeroed_steps(checker, step):
            return CheckResult(False, zeroed, ZEROED_HINT)
        cross = _cross_reference(checker)
        found = [
            _what_was_received(key, result.gradients[key], checker.reference[key], cross[key])
            for key in ("D", "G")
            if not result.networks[key].matches
        ]
        explained = [pair for pair in found if pair is not None]
        message = " ".join([result.verdict, *(text for _, text in explained)])
        return CheckResult(False, message, _first_call_hint({kind for kind, _ in explained}))
    calls = _run_three_calls(checker, step)
    for index, call in enumerate(calls):
        when = f"called {'again ' if index == 0 else ''}{_CALLS[index]}"
        if call.error is not None:
            return CheckResult(False, f"Right on a first call, but {when} your step raised {first_line(call.error)}")
        problem = _step_call_problem(
            {key: len(got) for key, got in call.received.items()}, f"Right on a first call, but {when} "
        )
        if problem:
            return CheckResult(False, problem)
        if call.zeroed:
            return CheckResult(False, f"Right on a first call, but {when}, {call.zeroed}", ZEROED_HINT)
        later = _later_call_problem(call, index, calls[index - 1] if index else None, checker.reference)
        if later:
            return CheckResult(False, *later)
    first = calls[0]
    computed = sum(call.computes_grad for call in first.backward_calls)
    if single_forward and computed:
        return CheckResult(
            False,
            f"Right gradients, but your step calls torch.autograd.grad ({computed} "
            f"time{'s' if computed > 1 else ''}, directly or through a function built on "
            "it); this exercise asks for backward(inputs=...) instead.",
            "backward(inputs=[...]) fills .grad of only the tensors you list.",
        )
    if single_forward and first.d_passes > 2:
        return CheckResult(
            False,
            f"Right gradients, but netD ran {first.d_passes} times; run it once on real and "
            "once on fake, and get both gradients from that one graph.",
            "backward(inputs=...) sends a loss's gradient only to the tensors you list.",
        )
    if first.backward_calls and first.backward_calls[-1].retain_graph:
        option = "create_graph=True, which retains" if first.backward_calls[-1].create_graph else "retain_graph=True"
        return CheckResult(
            False,
            f"Right gradients, but the last backward of your step keeps its graph's buffers "
            f"({option}), and no later backward needs them.",
            "Keep retain_graph=True only on a backward that another backward through the same graph follows.",
        )
    peak = _bytes_or_dash(result.peak_graph_only_bytes)
    if single_forward:
        how = f"from one D pass on fake (peak graph-only {peak})"
    else:
        standard = _toy_checker().check(make_step(STANDARD_SETTINGS, _d_loss, _g_loss)).peak_graph_only_bytes
        # 10 % slack: the same step written with other temporaries differs by a few hundred bytes.
        if (result.peak_graph_only_bytes or 0) > 1.1 * (standard or 0):
            return CheckResult(
                False,
                f"Right gradients, but the graphs held up to {peak} during your step; the "
                f"standard step needs {_bytes_or_dash(standard)}.",
                "Is a retain_graph=True left that no later backward needs?",
            )
        how = (
            f"and your graphs held at most 10 % more than the standard step's (peak graph-only {peak}; "
            f"standard {_bytes_or_dash(standard)})"
        )
    return CheckResult(
        True,
        "Both optimizers receive the reference gradients, call after call (from empty .grad, "
        f"right after another call, and over leftover .grad values), {how}.",
    )


def check_fixed_srgan_step(step: Step) -> CheckResult:
    """Exercise 1: the copied SRGAN step, fixed: no error, right gradients for both networks, no waste.

    The step runs three times in a row at learning rate 0 (from empty ``.grad``, right after itself,
    and with ``.grad`` pre-filled), and at every ``step()`` call each optimizer must hold its
    network's reference gradient. No waste: the last backward must not retain its graph, and the
    graphs may hold at most 10 % more than the standard step's. ``torch.autograd.grad`` is allowed.
    Never raises on a wrong answer.

    Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=False)


def check_single_forward_step(step: Step) -> CheckResult:
    """Exercise 2: a correct step that runs the discriminator on ``fake`` only once, with ``backward(inputs=...)``.

    Judged like :func:`check_fixed_srgan_step` (three calls, every ``step()`` call's gradients),
    without the memory comparison, and further: ``torch.autograd.grad`` must not be called (it is
    seen however it was imported), and D's first layer may run at most twice (real and fake).
    Never raises on a wrong answer.

    Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=True)
