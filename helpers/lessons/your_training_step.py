"""What only notebook 05_your_training_step uses: a gradient check of a training step against reference gradients,
and the check of its exercise (predict the audit's verdicts).

:func:`gradient_check` answers the question the retain_graph audit cannot: does the step compute the gradients it
should? The audit compares the step with itself (with and without each retain); the check compares it with a
reference, the losses each network should minimise, written by the learner. How:

* every learning rate is set to 0 for the check (as notebook 03's checker does), so the weights stay where they
  are and every gradient is judged at the same point; ``optimizer.step()`` still writes the weights in place,
  which is all autograd's version counter sees;
* each run draws the reference first (``torch.autograd.grad`` of each model's loss with respect to that model's
  parameters only), then puts the random streams back and runs the step, so both draw the same random numbers;
* what the step gives a parameter is its ``.grad`` when the optimizer holding it calls ``step()`` (its first
  call), or at the end of the step for a parameter no optimizer holds;
* the step runs twice: the second run starts from the state the first left (``.grad``, a hidden state the
  step rebinds, optimizer state), as the next iteration of a loop would; the reference is drawn again for it;
* everything (parameters, ``.grad``, buffers, optimizer state, learning rates, random streams, the tensors the
  step's closure and globals hold) is put back afterwards.

:func:`check_audit_predictions` runs :func:`helpers.audit.audit_retain_graph` on its own copies of the
exercise's three steps (the notebook shows the same code; ``tests/test_your_training_step.py`` keeps them equal)
and compares each verdict with the learner's prediction. The answers are measured on every call, never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from helpers.audit import audit_retain_graph
from helpers.checks import CheckResult, clear_multiple, flat
from helpers.learner import as_items, check_step, known_names, passed_optimizers_only
from helpers.measure import TrainingState, gradients_close

__all__ = ["check_audit_predictions", "gradient_check"]

WHO = "gradient_check"


@dataclass(frozen=True)
class GradientCheck:
    """What :func:`gradient_check` found: per run, the step's error (type and first line; None if it ran) and,
    per model, whether its gradients equal the reference up to float rounding, and how they read.

    Used by notebook 05_your_training_step.
    """

    step: str
    runs: tuple[tuple[str | None, tuple[tuple[str, bool, str], ...]], ...]

    @property
    def passed(self) -> bool:
        return all(error is None and all(close for _, close, _ in models) for error, models in self.runs)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        head = (f"✓ {self.step} gives the reference gradients in both runs (the second from the state the first "
                f"left)." if self.passed else f"✗ {self.step} does not give the reference gradients:")
        rows = []
        for number, (error, models) in enumerate(self.runs, 1):
            said = f"raised {error}" if error else ", ".join(f"{name} {text}" for name, _, text in models)
            rows.append(f"  run {number}: {said}")
        return "\n".join([head, *rows])


def _named_models(models: object, step: Callable[[], Any]) -> dict[str, torch.nn.Module]:
    """Each model by the name the reference's dict uses: a dict's keys, else the name the step knows it by."""
    if isinstance(models, Mapping):
        named = dict(models)
        wrong = [n for n, m in named.items() if not isinstance(n, str) or not isinstance(m, torch.nn.Module)]
        if not named or wrong:
            raise TypeError(f"{WHO}: models must be a torch.nn.Module, a list of them or a dict of name -> "
                            f"torch.nn.Module (the names the reference's losses use); check "
                            f"{wrong[0] if wrong else 'the empty dict'}")
        return named
    items = as_items(models, torch.nn.Module, "models", "torch.nn.Module, a list of them or a dict of them", WHO)
    if not items:
        raise TypeError(f"{WHO}: pass the models whose gradients to check")
    known = {id(v): n for n, v in reversed(known_names(step).items()) if isinstance(v, torch.nn.Module)}
    names = [known.get(id(m), "model" if len(items) == 1 else f"models[{i}]") for i, m in enumerate(items)]
    return dict(zip(names, items))


def _reference_gradients(reference: Callable[[], Any], models: dict[str, torch.nn.Module]
                         ) -> dict[str, torch.Tensor]:
    losses = reference()
    if isinstance(losses, torch.Tensor) and len(models) == 1:
        losses = {next(iter(models)): losses}
    if not isinstance(losses, Mapping) or set(losses) != set(models):
        got = sorted(losses) if isinstance(losses, Mapping) else type(losses).__name__
        raise TypeError(f"{WHO}: the reference must return a dict of model name -> loss with the names "
                        f"{sorted(models)} (one model: the loss itself); it returned {got}")
    wanted = {}
    for name, module in models.items():
        loss, params = losses[name], list(module.parameters())
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise TypeError(f"{WHO}: the reference's loss for {name} must be a one-number tensor with a graph "
                            f"back to {name}'s parameters")
        # The losses may share a graph (one forward pass for D's and G's): keep it for the next loss's grad.
        grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        wanted[name] = flat([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
    return wanted


def _run_step(step: Callable[[], Any], models: dict[str, torch.nn.Module],
              optimizers: tuple[torch.optim.Optimizer, ...]) -> tuple[dict[str, torch.Tensor], str | None]:
    """Run the step once: each model's gradients as its optimizer received them, and the error it raised."""
    received: dict[int, torch.Tensor | None] = {}

    def on_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                received.setdefault(id(p), None if p.grad is None else p.grad.detach().clone())

    hooks = [optimizer.register_step_pre_hook(on_step) for optimizer in optimizers]
    error = None
    try:
        step()
    except Exception as exc:  # the step's own error is the verdict of this run
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    finally:
        for hook in hooks:
            hook.remove()
    got = {}
    for name, module in models.items():
        grads = [received[id(p)] if id(p) in received else p.grad for p in module.parameters()]
        got[name] = flat([torch.zeros_like(p) if g is None else g for p, g in zip(module.parameters(), grads)])
    return got, error


def _describe(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    if gradients_close(got, want):
        return True, "equal up to float rounding"
    if not bool(got.any()):
        return False, "DIFFERENT (no gradient)"
    k = clear_multiple(got, want) if bool(want.any()) else None
    return False, f"DIFFERENT ({k:.2f}x the reference)" if k is not None else "DIFFERENT"


def gradient_check(step: Callable[[], Any], reference: Callable[[], Any],
                   models: torch.nn.Module | Iterable[torch.nn.Module] | Mapping[str, torch.nn.Module],
                   optimizers: torch.optim.Optimizer | Any = ()) -> GradientCheck:
    """Run ``step`` (one training iteration, no arguments) twice at learning rate 0, the second time from the
    state the first left, and compare the gradients each model receives with the reference: ``reference()``
    returns the loss each model should minimise, and its gradients are taken with respect to that model's
    parameters only. ``models``: a dict of name -> model, whose names the reference's dict uses; one model (or
    a list) goes by the name the step knows it by, and with one model the reference may return the loss
    itself. Everything is put back afterwards.

    Used by notebook 05_your_training_step."""
    check_step(step, WHO)
    check_step(reference, f"{WHO}'s reference")
    named = _named_models(models, step)
    optimizers = as_items(optimizers, torch.optim.Optimizer, "optimizers", "torch.optim.Optimizer", WHO)
    state = TrainingState(list(named.values()), optimizers, step=step)
    buffers = [(b, b.detach().clone()) for m in named.values() for b in m.buffers()]
    runs = []
    try:
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = 0.0
        with passed_optimizers_only(step, optimizers, WHO):
            for _ in range(2):
                streams = torch.random.get_rng_state()
                wanted = _reference_gradients(reference, named)
                torch.random.set_rng_state(streams)
                got, error = _run_step(step, named, optimizers)
                runs.append((error, tuple((name, *_describe(got[name], wanted[name])) for name in named)))
                if error is not None:
                    break
    finally:
        state.restore()
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
    return GradientCheck(getattr(step, "__name__", "the step"), tuple(runs))


# -- the exercise: predict the audit's verdicts -------------------------------------------------------------

VERDICTS = ("needed", "can go")


def _exercise_steps() -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Callable[[], None]]]:
    """The check's own model, batch and the exercise's three steps, written as the notebook shows them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xb, yb = torch.randn(8, 4), torch.randn(8, 1)

    def adversarial_step():
        x_in = xb.clone().requires_grad_()
        loss = F.mse_loss(model(x_in), yb)
        loss.backward(retain_graph=True)
        x_adv = (x_in + 0.1 * x_in.grad.sign()).detach()
        opt.zero_grad()
        total = 0.5 * loss + 0.5 * F.mse_loss(model(x_adv), yb)
        total.backward()
        opt.step()

    def head_grad_step():
        opt.zero_grad()
        features = model[:2](xb)
        aux_loss = model[2](features).pow(2).mean()
        head_grads = torch.autograd.grad(aux_loss, list(model[2].parameters()), retain_graph=True)
        loss = F.mse_loss(model[2](features), yb)
        loss.backward()
        for p, g in zip(model[2].parameters(), head_grads):
            p.grad += 0.1 * g
        opt.step()

    def regularised_step():
        opt.zero_grad()
        out = model(xb)
        loss = F.mse_loss(out, yb)
        loss.backward(retain_graph=True)
        penalty = 0.01 * out.pow(2).mean()
        penalty.backward(retain_graph=True)
        opt.step()

    steps = {"adversarial_step": adversarial_step, "head_grad_step": head_grad_step,
             "regularised_step": regularised_step}
    return model, opt, steps


def _measured_verdicts() -> dict[str, tuple[str, ...]]:
    """Each exercise step's retain_graph=True verdicts, in order, from the audit run now."""
    model, opt, steps = _exercise_steps()
    verdicts = {}
    for name, step in steps.items():
        calls = audit_retain_graph(step, models=model, optimizers=opt).calls
        verdicts[name] = tuple(c.verdict for c in calls if c.retain_graph and not c.create_graph)
    return verdicts


def _as_verdicts(name: str, value: object, count: int) -> tuple[str, ...] | None:
    """The prediction for one step as a tuple of verdicts; None when it is not filled in yet; ValueError with what
    is wrong otherwise."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if any(item is Ellipsis for item in items):
        return None
    if len(items) != count:
        raise ValueError(f"{name} has {count} retain_graph=True: give {count} verdict"
                         f"{'s, in order, as a tuple' if count > 1 else ''}, not {len(items)}")
    bad = [item for item in items if type(item) is not str or item.strip().lower() not in VERDICTS]
    if bad:
        shown = repr(bad[0]) if isinstance(bad[0], (str, bool, int, float, type(None))) else f"a {type(bad[0]).__name__}"
        raise ValueError(f"each verdict is the text 'needed' or 'can go'; {name} has {shown}")
    return tuple(item.strip().lower() for item in items)


def check_audit_predictions(predictions: Mapping[str, object]) -> CheckResult:
    """The exercise: predict, for each retain_graph=True of the three steps, the audit's verdict ('needed' or
    'can go'). The audit runs on the check's own copies of the steps, on every call.

    Used by notebook 05_your_training_step.
    """
    if not isinstance(predictions, Mapping):
        return CheckResult(False, f"Give a dict of step name -> verdict, not {type(predictions).__name__}.",
                           "Fill in the dict in the cell: 'needed' or 'can go' for each retain_graph=True.")
    with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
        truth = _measured_verdicts()
    given = {name: predictions[name] for name in predictions}  # read once
    unknown = sorted(str(name) for name in given if name not in truth)
    if unknown:
        return CheckResult(False, f"Unknown step name(s): {', '.join(unknown)}; the steps are "
                                  f"{', '.join(truth)}.")
    answers, missing = {}, []
    for name, verdicts in truth.items():
        try:
            answers[name] = _as_verdicts(name, given.get(name, ...), len(verdicts))
        except ValueError as problem:
            return CheckResult(False, str(problem)[:1].upper() + str(problem)[1:] + ".",
                               "Each prediction is 'needed' or 'can go' (regularised_step: a tuple of two, in the "
                               "order of its retain_graph=True calls).")
        if answers[name] is None:
            missing.append(name)
    if missing:
        return CheckResult(False, f"Fill in 'needed' or 'can go' for: {', '.join(missing)}.",
                           "Replace each ... with 'needed' or 'can go'.")
    wrong = [f"{name}" if len(verdicts) == 1 else f"{name} (retain {i + 1} of {len(verdicts)})"
             for name, verdicts in truth.items() for i, verdict in enumerate(verdicts)
             if answers[name][i] != verdict]
    total = sum(len(v) for v in truth.values())
    if wrong:
        return CheckResult(False, f"{len(wrong)} of {total} verdicts differ from the audit's: {', '.join(wrong)}.",
                           "For each retain, run the step in your head without it: does a later backward walk "
                           "a node whose buffers this one freed? Then it raises. A backward frees only the buffers on "
                           "the path it walks, and a new forward pass builds a new graph.")
    return CheckResult(True, f"All {total} verdicts match the audit's, measured just now.")
