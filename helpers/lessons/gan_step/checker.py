"""Checking a GAN step against reference gradients, and measuring its costs.

A GAN step backpropagates two losses through one generator and one discriminator, with two
optimizers stepping in between. Written wrongly it either raises (the graph was freed, or an
optimizer changed weights the graph still needs) or, worse, runs and hands the optimizers wrong
gradients. :class:`GanStepChecker` runs any step function once at a fixed point and compares the
gradients each optimizer receives with reference gradients computed separately for each network
(a :class:`StepCheck`); its ``compare`` also times each step and measures its memory (a
:class:`StepComparison`).
"""

from __future__ import annotations

import contextlib
import html
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.display import Table
from helpers.lessons.gan_step.data import _positive_int
from helpers.lessons.gan_step.steps import LossD, LossG, Step
from helpers.measure import TrainingState, compare_gradients, gradients_of, profiler_peak_bytes, time_round_robin

__all__ = ["GanStepChecker", "NetworkCheck", "StepCheck", "StepComparison"]

Outcome = Literal["error", "silently wrong", "correct"]

NETWORK_NAMES = {"D": "discriminator (D)", "G": "generator (G)"}
IN_PLACE = "modified by an inplace operation"
SECOND_TIME = "backward through the graph a second time"


@dataclass(frozen=True)
class NetworkCheck:
    """One network's gradients, as its optimizer received them, against the reference."""

    network: str
    max_difference: float
    relative_error: float
    matches: bool
    bit_equal: bool
    missing: tuple[str, ...]

    def describe(self) -> str:
        """``'matches (bit-equal)'``, ``'matches (max diff 3e-08)'`` or ``'WRONG: 47 % off ...'``."""
        if self.matches:
            return "matches (bit-equal)" if self.bit_equal else f"matches (max diff {self.max_difference:.0e})"
        text = f"WRONG: {self.relative_error:.0%} off (max diff {self.max_difference:.1e})"
        if self.missing:
            text += f"; no gradient for {len(self.missing)} parameters"
        return text


@dataclass(frozen=True)
class StepCheck:
    """What :meth:`GanStepChecker.check` found for one step (notebook 03_gan_step): the outcome and the live figures.

    ``peak_graph_only_bytes`` is the meter's peak during the step and ``held_at_d_step`` the
    graph-only bytes alive when ``optimizerD.step()`` was called; both are ``None`` for a step
    that raised (or, for the second, never called it). ``seconds`` is this one run (noisy),
    ``step_calls`` counts each optimizer's ``step()`` calls and ``d_forward_calls`` the
    discriminator's forward passes. ``gradients`` holds what each optimizer received
    (``{'D': {name: grad}, 'G': {...}}``; empty for a step that raised).

    Used by :class:`GanStepChecker`.
    """

    name: str
    outcome: Outcome
    error: str | None
    networks: dict[str, NetworkCheck]
    peak_graph_only_bytes: int | None
    held_at_d_step: int | None
    seconds: float
    step_calls: dict[str, int]
    d_forward_calls: int
    gradients: dict[str, dict[str, torch.Tensor | None]] = field(default_factory=dict, repr=False)

    @property
    def error_kind(self) -> str | None:
        """``'in-place modification'``, ``'backward a second time'``, another message, or ``None``."""
        if self.error is None:
            return None
        if IN_PLACE in self.error:
            return "in-place modification"
        if SECOND_TIME in self.error:
            return "backward a second time"
        return self.error.split(":", 1)[0]

    @property
    def verdict(self) -> str:
        """One loud sentence: what happened and what it means."""
        if self.outcome == "error":
            first = self.error.split(" Hint:")[0] if self.error else ""
            return f"ERROR ({self.error_kind}): {first}"
        wrong = [check for check in self.networks.values() if not check.matches]
        if wrong:
            parts = [f"{NETWORK_NAMES[c.network]} gradient {c.relative_error:.0%} off" for c in wrong]
            right = [NETWORK_NAMES[c.network] for c in self.networks.values() if c.matches]
            text = "SILENTLY WRONG: no error was raised, but the " + " and the ".join(parts)
            if right:
                text += f" (the {' and '.join(right)} gradient matches)"
            if len(wrong) == 2:
                return text + ". Both optimizers would step in wrong directions."
            return text + f". The optimizer of the {NETWORK_NAMES[wrong[0].network]} would step in a wrong direction."
        return "CORRECT: both optimizers receive the reference gradients."

    def table(self) -> Table:
        """One row per network: max difference, relative error, verdict."""
        rows = []
        for key in ("D", "G"):
            check = self.networks.get(key)
            if check is None:
                rows.append([NETWORK_NAMES[key], "-", "-", "not computed: the step raised"])
                continue
            rows.append(
                [
                    NETWORK_NAMES[key],
                    f"{check.max_difference:.2e}",
                    f"{check.relative_error:.2%}",
                    "matches" if check.matches else "WRONG",
                ]
            )
        return Table(["network", "max |grad - reference|", "relative error", "verdict"], rows)

    def __repr__(self) -> str:
        return f"{self.name}\n{self.verdict}\n{self.table()!r}"

    def _repr_html_(self) -> str:
        colour = {"error": "#b00020", "silently wrong": "#b00020", "correct": "#1b5e20"}[self.outcome]
        mark = "✓" if self.outcome == "correct" else "✗"
        return (
            f"<div style='border:2px solid {colour};padding:6px;margin:4px 0;background:#ffffff;color:#1f1f1f'>"
            f"<b style='color:{colour}'>{mark} {html.escape(self.verdict)}</b>"
            f"<div style='font-size:90%'>{html.escape(self.name)}</div>"
            f"{self.table()._repr_html_()}</div>"
        )


def _bytes_or_dash(n: int | None, dash: str = "-") -> str:
    return dash if n is None else format_bytes(n)


def _by_name(params: Mapping[str, torch.Tensor], grads: Sequence[torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """``torch.autograd.grad``'s answer by parameter name, zeros for a parameter the loss does not reach."""
    return {n: torch.zeros_like(p) if g is None else g.detach() for (n, p), g in zip(params.items(), grads)}


def _network_check(
    network: str, grads: Mapping[str, torch.Tensor | None], reference: Mapping[str, torch.Tensor]
) -> NetworkCheck:
    match = compare_gradients(grads, reference)
    return NetworkCheck(
        network, match.max_difference, match.relative_error, match.close, match.bit_equal, match.missing
    )


def _scalar_loss(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must return a tensor, not {type(value).__name__}.")
    if value.numel() != 1:
        raise ValueError(f"{what} must return a single number; it returned shape {tuple(value.shape)}.")
    return value


class GanStepChecker:
    """Run a GAN step once at a fixed point and compare the gradients its optimizers receive.

    The reference gradients are computed separately for each network, at the current weights:
    D's from ``d_loss_fn(netD(real), netD(fake.detach()))`` alone, G's from
    ``g_loss_fn(netD(fake))`` alone, through a fresh D pass that is not updated.

    :meth:`check` runs the step with every learning rate set to 0, so neither network changes
    and each step is judged at the same point, while ``optimizer.step()`` still updates the
    weights in place (by zero), which is all autograd's version counter looks at. The gradients
    are recorded at the moment each ``optimizer.step()`` is called (at the end of the step for
    an optimizer the step never calls). Weights, optimizer state and ``.grad`` are restored
    afterwards, so a check leaves no trace.

    Used by notebook 03_gan_step.
    """

    def __init__(
        self,
        netG: torch.nn.Module,
        netD: torch.nn.Module,
        optimizerG: torch.optim.Optimizer,
        optimizerD: torch.optim.Optimizer,
        real: torch.Tensor,
        z: torch.Tensor,
        d_loss_fn: LossD,
        g_loss_fn: LossG,
    ) -> None:
        for name, module in (("netG", netG), ("netD", netD)):
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"GanStepChecker({name}=...) takes a torch.nn.Module, not {type(module).__name__}.")
            if not list(module.parameters()):
                raise ValueError(f"GanStepChecker({name}=...): the network has no parameters.")
        for name, optimizer, module in (("optimizerG", optimizerG, netG), ("optimizerD", optimizerD, netD)):
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(f"GanStepChecker({name}=...) takes a torch optimizer, not {type(optimizer).__name__}.")
            own = {id(p) for p in module.parameters()}
            held = [p for group in optimizer.param_groups for p in group["params"]]
            if not held or any(id(p) not in own for p in held):
                raise ValueError(
                    f"GanStepChecker: {name} must hold only the parameters of "
                    f"{'netG' if name == 'optimizerG' else 'netD'}."
                )
            if any("lr" not in group for group in optimizer.param_groups):
                raise ValueError(f"GanStepChecker: {name} has no learning rate to set to 0.")
        for name, tensor in (("real", real), ("z", z)):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"GanStepChecker({name}=...) takes a tensor, not {type(tensor).__name__}.")
        if not callable(d_loss_fn) or not callable(g_loss_fn):
            raise TypeError("GanStepChecker needs d_loss_fn(real_out, fake_out) and g_loss_fn(fake_out) functions.")
        self.netG, self.netD = netG, netD
        self.optimizerG, self.optimizerD = optimizerG, optimizerD
        self.real, self.z = real, z
        self.d_loss_fn, self.g_loss_fn = d_loss_fn, g_loss_fn
        self.reference = self._reference()

    def _reference(self) -> dict[str, dict[str, torch.Tensor]]:
        d_params = dict(self.netD.named_parameters())
        g_params = dict(self.netG.named_parameters())
        fake = self.netG(self.z)
        d_loss = _scalar_loss(self.d_loss_fn(self.netD(self.real), self.netD(fake.detach())), "d_loss_fn")
        d_grads = torch.autograd.grad(d_loss, list(d_params.values()), allow_unused=True)
        g_loss = _scalar_loss(self.g_loss_fn(self.netD(fake)), "g_loss_fn")
        g_grads = torch.autograd.grad(g_loss, list(g_params.values()), allow_unused=True)
        return {"D": _by_name(d_params, d_grads), "G": _by_name(g_params, g_grads)}

    def _args(self) -> tuple[Any, ...]:
        return self.netG, self.netD, self.optimizerG, self.optimizerD, self.real, self.z

    def _called(self, step: Step) -> Callable[[], object]:
        """``step`` as a function of no arguments: one call on this checker's networks, optimizers and batch."""
        return lambda: step(*self._args())

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Learning rates 0 inside; weights, ``.grad``, optimizer state and random streams restored on the way out."""
        state = TrainingState([self.netG, self.netD], [self.optimizerG, self.optimizerD])
        for optimizer in (self.optimizerG, self.optimizerD):
            for group in optimizer.param_groups:
                group["lr"] = 0.0
        try:
            yield
        finally:
            state.restore()

    def check(self, step: Step, name: str | None = None) -> StepCheck:
        """Run ``step(netG, netD, optimizerG, optimizerD, real, z)`` and judge its gradients.

        A ``RuntimeError`` from the step is the outcome ``'error'``; any other exception is a bug
        in the step and is raised. The step runs twice: once bare, for the outcome and the
        gradients (autograd's own checks, with no hooks installed), and, when that worked, once
        inside a :class:`SavedTensorMeter` for the figures.
        """
        if not callable(step):
            raise TypeError(f"check() needs a step function, not {type(step).__name__}.")
        name = name or str(getattr(step, "label", None) or getattr(step, "__name__", "step"))
        recorded, calls, error, seconds, forwards = self._run(step, meter=None)
        if error is not None:
            return StepCheck(name, "error", error, {}, None, None, seconds, calls, forwards)
        meter = SavedTensorMeter()
        held: list[int] = []
        self._run(step, meter=meter, held=held)
        networks = {key: _network_check(key, recorded[key], self.reference[key]) for key in ("D", "G")}
        outcome: Outcome = "correct" if all(c.matches for c in networks.values()) else "silently wrong"
        return StepCheck(
            name,
            outcome,
            None,
            networks,
            meter.peak_graph_only_bytes,
            held[0] if held else None,
            seconds,
            calls,
            forwards,
            recorded,
        )

    def _run(
        self,
        step: Step,
        meter: SavedTensorMeter | None,
        held: list[int] | None = None,
    ) -> tuple[dict[str, dict[str, torch.Tensor | None]], dict[str, int], str | None, float, int]:
        recorded: dict[str, dict[str, torch.Tensor | None]] = {}
        calls = {"D": 0, "G": 0}
        forwards = [0]

        def count_forward(*_: Any) -> None:
            forwards[0] += 1

        def recorder(key: str, module: torch.nn.Module) -> Callable[..., None]:
            def hook(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
                calls[key] += 1
                if key not in recorded:
                    recorded[key] = gradients_of(module)
                    if key == "D" and meter is not None and held is not None:
                        held.append(meter.graph_only_bytes)

            return hook

        error: str | None = None
        with self.frozen():
            self.netG.zero_grad(set_to_none=True)
            self.netD.zero_grad(set_to_none=True)
            handles = [
                self.optimizerD.register_step_pre_hook(recorder("D", self.netD)),
                self.optimizerG.register_step_pre_hook(recorder("G", self.netG)),
                self.netD.register_forward_hook(count_forward),
            ]
            start = time.perf_counter()
            try:
                with meter if meter is not None else contextlib.nullcontext():
                    step(*self._args())
            except RuntimeError as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                seconds = time.perf_counter() - start
                for handle in handles:
                    handle.remove()
            if error is None:
                recorded.setdefault("D", gradients_of(self.netD))
                recorded.setdefault("G", gradients_of(self.netG))
        return recorded, calls, error, seconds, forwards[0]

    def compare(
        self,
        steps: Mapping[str, Step],
        reference: str | None = None,
        rounds: int = 30,
        progress: bool = True,
    ) -> StepComparison:
        """Check each step, then measure it: time per step (median of ``rounds`` alternating rounds),
        the meter's peak graph-only bytes and torch.profiler's peak allocation, in one run.

        Steps that raise are checked but not timed. ``reference`` (default: the first step)
        is the one times are divided by.
        """
        if not isinstance(steps, Mapping) or not steps:
            raise TypeError("compare() takes a non-empty dict of name -> step function.")
        for key, step in steps.items():
            if not callable(step):
                raise TypeError(f"Step {key!r} is not a function.")
        reference = next(iter(steps)) if reference is None else reference
        if reference not in steps:
            raise ValueError(f"reference={reference!r} is not one of the steps {list(steps)}.")
        rounds = _positive_int(rounds, "rounds")
        checks = {key: self.check(step, name=key) for key, step in steps.items()}
        if checks[reference].outcome == "error":
            raise ValueError(f"The reference step {reference!r} raises; pick one that runs.")
        runnable = [key for key in steps if checks[key].outcome != "error"]
        allocated: dict[str, int] = {}
        with self.frozen():
            for key in runnable:
                self.netG.zero_grad(set_to_none=True)
                self.netD.zero_grad(set_to_none=True)
                allocated[key] = profiler_peak_bytes(self._called(steps[key]))
            times = time_round_robin({key: self._called(steps[key]) for key in runnable}, rounds, progress=progress)
        medians = {key: statistics.median(values) for key, values in times.items()}
        if progress:
            print(
                f"Checked {len(steps)} steps against the reference gradients; timed {len(runnable)} "
                f"of them over {rounds} rounds."
            )
        return StepComparison(reference, checks, medians, allocated, rounds)


@dataclass
class StepComparison:
    """What :meth:`GanStepChecker.compare` found: one :class:`StepCheck` and the costs per step.

    Used by :meth:`GanStepChecker.compare`.
    """

    reference: str
    checks: dict[str, StepCheck]
    seconds_per_step: dict[str, float]
    profiler_peak_bytes: dict[str, int]
    rounds: int

    def __getitem__(self, name: str) -> StepCheck:
        if name not in self.checks:
            raise KeyError(f"No step {name!r}; the steps are {list(self.checks)}.")
        return self.checks[name]

    def time_ratio(self, name: str) -> float | None:
        """Time per step relative to the reference step (``None`` for a step that raised)."""
        if name not in self.seconds_per_step:
            return None
        return self.seconds_per_step[name] / self.seconds_per_step[self.reference]

    def table(self, timing: bool = True) -> Table:
        """One row per step: outcome, both networks' gradients vs the reference, memory, and with ``timing``
        the time and the profiler's peak, which depend on the machine (leave them out where a notebook's
        output must be the same everywhere)."""
        columns = ["step", "outcome", "D gradient vs reference", "G gradient vs reference"]
        columns += ["time per step", f"time / {self.reference}"] if timing else []
        columns += ["peak graph-only (meter)"] + (["peak allocated (profiler)"] if timing else [])
        rows = []
        for name, check in self.checks.items():
            row = [
                name,
                check.outcome if check.outcome != "error" else f"error ({check.error_kind})",
                *(check.networks[key].describe() if key in check.networks else "-" for key in ("D", "G")),
            ]
            seconds, ratio = self.seconds_per_step.get(name), self.time_ratio(name)
            if timing:
                row += [
                    "-" if seconds is None else f"{seconds * 1e3:.2f} ms",
                    "-" if ratio is None else f"{ratio:.2f}x",
                ]
            row.append(_bytes_or_dash(check.peak_graph_only_bytes))
            if timing:
                row.append(format_bytes(self.profiler_peak_bytes[name]) if name in self.profiler_peak_bytes else "-")
            rows.append(row)
        return Table(columns, rows)
