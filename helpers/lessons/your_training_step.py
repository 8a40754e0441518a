"""What only notebook 05_your_training_step uses: a gradient check of a training step against reference gradients,
and the check of its exercise (predict the audit's verdicts).

:func:`gradient_check` answers the question the retain_graph audit cannot: does the step compute the gradients it
should? The audit compares the step with itself (with and without each retain); the check compares it with a
reference, the losses each network should minimise, written by the learner. How:

* the step runs with the optimizers' own learning rates, so the weights move as in training; each model's
  reference gradient is taken twice, at the weights the step began with and at the weights of the moment its
  optimizer steps, and the step must match at one of the two for every model: alternating updates (the standard
  GAN step: G's gradient through D after D's update) match the second, simultaneous ones (one forward pass for
  both networks, both optimizers stepping at the end) the first; at learning rate 0 the two cannot be told apart;
* the reference is always evaluated as the step began: the random streams put back (the reference draws the same
  random numbers as the step), the tensors its closure and globals held then (a hidden state the step rebinds),
  and copies of the models' buffers (its forward passes change nothing the step's graphs saved);
* what the step gives a parameter is its ``.grad`` when the optimizer holding it calls ``step()`` (its first
  call), or at the end of the step for a parameter no optimizer holds;
* the step runs twice: the second run starts from the state the first left (``.grad``, a hidden state the
  step rebinds, optimizer state), as the next iteration of a loop would; the reference is drawn again for it;
* everything (parameters, ``.grad``, buffers, optimizer state, random streams, the tensors the
  step's closure and globals hold) is put back afterwards.

:func:`check_audit_predictions` runs :func:`backward_twice.steps.audit.audit_retain_graph` on its own copies of the
exercise's three steps (the notebook shows the same code; ``tests/test_your_training_step.py`` keeps them equal)
and compares each verdict with the learner's prediction. The answers are measured on every call, never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from backward_twice.record.learner import first_line, intercepting, passed_optimizers_only
from backward_twice.record.step_input import as_items, check_step, known_names
from backward_twice.steps.audit import audit_retain_graph
from helpers.checks import CheckResult, clear_multiple, flat
from helpers.measure import TrainingState, gradients_close

__all__ = ["check_audit_predictions", "gradient_check"]

WHO = "gradient_check"


# Where a model's reference gradient is taken: the weights the step began with, or the weights as they are when its
# optimizer steps. With two optimizers they differ exactly when one network's update comes before the other's
# gradient is computed: the standard GAN step (alternating updates) against the single-forward step (simultaneous).
AT_START, AT_STEP = "at the step's start", "at its optimizer's step"


@dataclass(frozen=True)
class ModelGradients:
    """One model's gradients in one run of the step, against its two references."""

    model: str
    equals_reference_at_start: bool  # the reference taken at the weights the step began with
    equals_reference_at_step: bool  # the reference taken when the model's optimizer stepped
    reads: str  # how they read: "equal up to float rounding", "DIFFERENT (...)"


@dataclass(frozen=True)
class StepRun:
    """One run of the step: its error (type and first line; None if it ran) and each model's gradients."""

    error: str | None
    models: tuple[ModelGradients, ...]


@dataclass(frozen=True)
class GradientCheck:
    """What :func:`gradient_check` found: per run, the step's error and, per model, whether its gradients equal
    the reference taken at the weights the step began with, whether they equal the reference taken when its
    optimizer stepped, and how they read.

    Used by notebook 05_your_training_step.
    """

    step: str
    runs: tuple[StepRun, ...]

    @property
    def alternating(self) -> bool:
        """Every model's gradients equal the reference taken when its optimizer stepped, in both runs."""
        return all(r.error is None and all(m.equals_reference_at_step for m in r.models) for r in self.runs)

    @property
    def simultaneous(self) -> bool:
        """Every model's gradients equal the reference taken at the weights the step began with, in both runs."""
        return all(r.error is None and all(m.equals_reference_at_start for m in r.models) for r in self.runs)

    @property
    def passed(self) -> bool:
        return self.alternating or self.simultaneous

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        if not self.passed:
            head = f"✗ {self.step} does not give the reference gradients:"
        else:
            head = (
                f"✓ {self.step} gives the reference gradients in both runs (the second from the state the first left)"
            )
            if not self.simultaneous:
                head += ", each model's taken when its optimizer stepped: alternating updates"
            elif not self.alternating:
                head += ", each model's taken at the weights the step began with: simultaneous updates"
            head += "."
        rows = []
        for number, run in enumerate(self.runs, 1):
            said = f"raised {run.error}" if run.error else ", ".join(f"{m.model} {m.reads}" for m in run.models)
            rows.append(f"  run {number}: {said}")
        return "\n".join([head, *rows])


def _named_models(models: object, step: Callable[[], Any]) -> dict[str, torch.nn.Module]:
    """Each model by the name the reference's dict uses: a dict's keys, else the name the step knows it by."""
    if isinstance(models, Mapping):
        named = dict(models)
        wrong = [n for n, m in named.items() if not isinstance(n, str) or not isinstance(m, torch.nn.Module)]
        if not named or wrong:
            raise TypeError(
                f"{WHO}: models must be a torch.nn.Module, a list of them or a dict of name -> "
                f"torch.nn.Module (the names the reference's losses use); check "
                f"{wrong[0] if wrong else 'the empty dict'}"
            )
        return named
    items = as_items(models, torch.nn.Module, "models", "torch.nn.Module, a list of them or a dict of them", WHO)
    if not items:
        raise TypeError(f"{WHO}: pass the models whose gradients to check")
    known = {id(v): n for n, v in reversed(known_names(step).items()) if isinstance(v, torch.nn.Module)}
    names = [known.get(id(m), "model" if len(items) == 1 else f"models[{i}]") for i, m in enumerate(items)]
    return dict(zip(names, items))


def _reference_gradients(reference: Callable[[], Any], models: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    losses = reference()
    if isinstance(losses, torch.Tensor) and len(models) == 1:
        losses = {next(iter(models)): losses}
    if not isinstance(losses, Mapping) or set(losses) != set(models):
        got = sorted(losses) if isinstance(losses, Mapping) else type(losses).__name__
        raise TypeError(
            f"{WHO}: the reference must return a dict of model name -> loss with the names "
            f"{sorted(models)} (one model: the loss itself); it returned {got}"
        )
    wanted = {}
    for name, module in models.items():
        loss, params = losses[name], list(module.parameters())
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise TypeError(
                f"{WHO}: the reference's loss for {name} must be a one-number tensor with a graph "
                f"back to {name}'s parameters"
            )
        # The losses may share a graph (one forward pass for D's and G's): keep it for the next loss's grad.
        grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        wanted[name] = flat([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
    return wanted


class _Reference:
    """The reference, evaluated as the step began: the tensors its closure and globals held then (a hidden state the
    step has rebound since), the random streams as they were, and copies of the models' buffers (so its forward
    passes change nothing the step's graphs saved); whatever the step has done by then is put back afterwards. Only
    the weights are the ones of the moment."""

    def __init__(self, reference: Callable[[], Any], models: dict[str, torch.nn.Module]) -> None:
        self.reference, self.models = reference, models
        self.start = TrainingState(step=reference)

    def gradients(self) -> dict[str, torch.Tensor]:
        now = TrainingState(step=self.reference)
        held = [
            (module, name, buffer)
            for model in self.models.values()
            for module in model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None
        ]
        self.start.restore()
        for module, name, buffer in held:
            module._buffers[name] = buffer.detach().clone()
        try:
            with torch.enable_grad():
                return _reference_gradients(self.reference, self.models)
        finally:
            for module, name, buffer in held:
                module._buffers[name] = buffer
            now.restore()


def _run_step(
    step: Callable[[], Any],
    models: dict[str, torch.nn.Module],
    optimizers: tuple[torch.optim.Optimizer, ...],
    reference: _Reference,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor], str | None]:
    """Run the step once: each model's gradients as its optimizer received them, its reference gradients taken at
    that moment (at the end of the step for a model no optimizer stepped), each model's .grad as the step began,
    and the error the step raised."""
    received: dict[int, torch.Tensor | None] = {}
    at_step: dict[str, torch.Tensor] = {}
    failed: list[BaseException] = []
    entry = {
        name: flat([torch.zeros_like(p) if p.grad is None else p.grad for p in module.parameters()])
        for name, module in models.items()
    }

    def take_reference(names: list[str]) -> None:
        try:
            at_step.update((name, grads) for name, grads in reference.gradients().items() if name in names)
        except Exception as exc:  # the reference's own error: raised after the step, never blamed on it
            failed.append(exc)

    passed = {id(o) for o in optimizers}

    def on_step(optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in passed:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for group in optimizer.param_groups:
            for p in group["params"]:
                received.setdefault(id(p), None if p.grad is None else p.grad.detach().clone())
        stepped = [
            name
            for name, module in models.items()
            if name not in at_step and any(id(p) in held for p in module.parameters())
        ]
        if stepped and not failed:
            take_reference(stepped)

    error = None
    with intercepting(before_step=on_step):
        try:
            step()
        except Exception as exc:  # the step's own error is the verdict of this run
            error = first_line(exc, width=10_000)
    if error is None and not failed and (rest := [name for name in models if name not in at_step]):
        take_reference(rest)
    if failed:
        raise failed[0]
    got = {}
    for name, module in models.items():
        grads = [received.get(id(p), p.grad) for p in module.parameters()]
        got[name] = flat([torch.zeros_like(p) if g is None else g for p, g in zip(module.parameters(), grads)])
    return got, at_step, entry, error


def _difference(got: torch.Tensor, want: torch.Tensor, entry: torch.Tensor) -> str:
    """How gradients that match neither reference read: none, a clear multiple, or the reference plus .grad's
    leftovers."""
    if not bool(got.any()):
        return "DIFFERENT (no gradient)"
    if bool(entry.any()) and gradients_close(got, want + entry):
        return "DIFFERENT (the reference plus what .grad held as the step began: nothing cleared it)"
    k = clear_multiple(got, want) if bool(want.any()) else None
    return f"DIFFERENT ({k:.2f}x the reference)" if k is not None else "DIFFERENT"


def _describe(
    name: str, got: torch.Tensor, at_start: torch.Tensor, at_step: torch.Tensor | None, entry: torch.Tensor
) -> ModelGradients:
    start = gradients_close(got, at_start)
    stepped = at_step is not None and gradients_close(got, at_step)
    if start and stepped:
        return ModelGradients(name, True, True, "equal up to float rounding")
    if start or stepped:
        here, there = (AT_START, AT_STEP) if start else (AT_STEP, AT_START)
        return ModelGradients(name, start, stepped, f"equal up to float rounding {here} (DIFFERENT {there})")
    detail = _difference(got, at_step if at_step is not None else at_start, entry)
    if detail == "DIFFERENT" and at_step is not None:
        detail = _difference(got, at_start, entry)
    return ModelGradients(name, False, False, detail)


def gradient_check(
    step: Callable[[], Any],
    reference: Callable[[], Any],
    models: torch.nn.Module | Iterable[torch.nn.Module] | Mapping[str, torch.nn.Module],
    optimizers: torch.optim.Optimizer | Any = (),
) -> GradientCheck:
    """Run ``step`` (one training iteration, no arguments) twice, with the optimizers' own learning rates, the
    second time from the state the first left, and compare the gradients each model receives (its ``.grad`` when
    its optimizer's ``step()`` is called) with the reference's: ``reference()`` returns the loss each model should
    minimise, and its gradients are taken with respect to that model's parameters only, twice per run: at the
    weights the step began with, and at the weights of the moment the model's optimizer steps (at the end of the
    step for a model no optimizer steps). A step passes when every model matches at one of the two points in both
    runs: the second means alternating updates (the standard GAN step: G's gradient through the updated D), the
    first simultaneous ones (one pass for both networks); with one optimizer step per iteration, or learning rates
    of 0, they coincide. The reference is always evaluated as the step began (the tensors it reads, the random
    streams, the buffers); only the weights differ. ``models``: a dict of name -> model, whose names the reference's
    dict uses; one model (or a list) goes by the name the step knows it by, and with one model the reference may
    return the loss itself. Everything is put back afterwards.

    Used by notebook 05_your_training_step."""
    check_step(step, WHO)
    check_step(reference, f"{WHO}'s reference")
    named = _named_models(models, step)
    optimizers = as_items(optimizers, torch.optim.Optimizer, "optimizers", "torch.optim.Optimizer", WHO)
    state = TrainingState(list(named.values()), optimizers, step=step)
    buffers = [(b, b.detach().clone()) for m in named.values() for b in m.buffers()]
    runs: list[StepRun] = []
    try:
        with passed_optimizers_only(step, optimizers, WHO):
            for _ in range(2):
                as_it_began = _Reference(reference, named)
                at_start = as_it_began.gradients()
                got, at_step, entry, error = _run_step(step, named, optimizers, as_it_began)
                each = tuple(
                    _describe(name, got[name], at_start[name], at_step.get(name), entry[name]) for name in named
                )
                runs.append(StepRun(error, each))
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
        x_adv = (x_in + 0.1 * x_in.grad.sign()).detach()  # type: ignore[union-attr]  # as on the page; backward() set .grad
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
            p.grad += 0.1 * g  # type: ignore[operator]  # as on the page; backward() set .grad
        opt.step()

    def regularised_step():
        opt.zero_grad()
        out = model(xb)
        loss = F.mse_loss(out, yb)
        loss.backward(retain_graph=True)
        penalty = 0.01 * out.pow(2).mean()
        penalty.backward(retain_graph=True)
        opt.step()

    steps = {
        "adversarial_step": adversarial_step,
        "head_grad_step": head_grad_step,
        "regularised_step": regularised_step,
    }
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
        raise ValueError(
            f"{name} has {count} retain_graph=True: give {count} verdict"
            f"{'s, in order, as a tuple' if count > 1 else ''}, not {len(items)}"
        )
    bad = [item for item in items if type(item) is not str or item.strip().lower() not in VERDICTS]
    if bad:
        shown = (
            repr(bad[0]) if isinstance(bad[0], (str, bool, int, float, type(None))) else f"a {type(bad[0]).__name__}"
        )
        raise ValueError(f"each verdict is the text 'needed' or 'can go'; {name} has {shown}")
    return tuple(item.strip().lower() for item in items)


def check_audit_predictions(predictions: object) -> CheckResult:
    """The exercise: predict, for each retain_graph=True of the three steps, the audit's verdict ('needed' or
    'can go'). The audit runs on the check's own copies of the steps, on every call.

    Used by notebook 05_your_training_step.
    """
    if not isinstance(predictions, Mapping):
        return CheckResult(
            False,
            f"Give a dict of step name -> verdict, not {type(predictions).__name__}.",
            "Fill in the dict in the cell: 'needed' or 'can go' for each retain_graph=True.",
        )
    with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
        truth = _measured_verdicts()
    given = {name: predictions[name] for name in predictions}  # read once
    unknown = sorted(str(name) for name in given if name not in truth)
    if unknown:
        return CheckResult(False, f"Unknown step name(s): {', '.join(unknown)}; the steps are {', '.join(truth)}.")
    answers: dict[str, tuple[str, ...]] = {}
    missing = []
    for name, verdicts in truth.items():
        try:
            answer = _as_verdicts(name, given.get(name, ...), len(verdicts))
        except ValueError as problem:
            return CheckResult(
                False,
                str(problem)[:1].upper() + str(problem)[1:] + ".",
                "Each prediction is 'needed' or 'can go' (regularised_step: a tuple of two, in the "
                "order of its retain_graph=True calls).",
            )
        if answer is None:
            missing.append(name)
        else:
            answers[name] = answer
    if missing:
        return CheckResult(
            False,
            f"Fill in 'needed' or 'can go' for: {', '.join(missing)}.",
            "Replace each ... with 'needed' or 'can go'.",
        )
    wrong = [
        f"{name}" if len(verdicts) == 1 else f"{name} (retain {i + 1} of {len(verdicts)})"
        for name, verdicts in truth.items()
        for i, verdict in enumerate(verdicts)
        if answers[name][i] != verdict
    ]
    total = sum(len(v) for v in truth.values())
    if wrong:
        return CheckResult(
            False,
            f"{len(wrong)} of {total} verdicts differ from the audit's: {', '.join(wrong)}.",
            "For each retain, run the step in your head without it: does a later backward walk "
            "a node whose buffers this one freed? Then it raises. A backward frees only the buffers on "
            "the path it walks, and a new forward pass builds a new graph.",
        )
    return CheckResult(True, f"All {total} verdicts match the audit's, measured just now.")
