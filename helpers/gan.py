"""A tiny GAN on a ring of Gaussians, and a checker that says what a GAN training step really does.

A GAN step backpropagates two losses through one generator and one discriminator, with two
optimizers stepping in between. Written wrongly it either raises (the graph was freed, or an
optimizer changed weights the graph still needs) or, worse, runs and hands the optimizers wrong
gradients. :class:`GanStepChecker` runs any step function once at a fixed point and compares the
gradients each optimizer receives with reference gradients computed separately for each network;
:class:`GanLab` is a panel that builds the step from four switches and shows the verdict live.

Every step function has the signature ``step(netG, netD, optimizerG, optimizerD, real, z)``.

Used by notebook 03_gan_step.
"""

from __future__ import annotations

import contextlib
import copy
import html
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from helpers.checks import CheckResult
from helpers.compare import profiler_peak_bytes
from helpers.figures import PngFigure
from helpers.meter import SavedTensorMeter, format_bytes
from helpers.tables import Table

__all__ = [
    "GanLab",
    "GanStepChecker",
    "NetworkCheck",
    "RingCoverage",
    "StepCheck",
    "StepComparison",
    "StepSettings",
    "check_fixed_srgan_step",
    "check_gradient_penalty",
    "check_single_forward_step",
    "make_step",
    "ring_centers",
    "ring_coverage",
    "ring_of_gaussians",
    "sample_distance",
    "samples_figure",
    "training_figure",
]

Step = Callable[..., Any]
LossD = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LossG = Callable[[torch.Tensor], torch.Tensor]
Outcome = Literal["error", "silently wrong", "correct"]

NETWORK_NAMES = {"D": "discriminator (D)", "G": "generator (G)"}
IN_PLACE = "modified by an inplace operation"
SECOND_TIME = "backward through the graph a second time"

# Gradients "match the reference" within float rounding: two correct ways of computing the same
# gradient may add the same terms in a different order.
RTOL, ATOL = 1e-4, 1e-6


# -- data ----------------------------------------------------------------------------------------

def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, not {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, not {value}.")
    return value


def _positive_float(value: Any, name: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}.")
    if value < 0 or (value == 0 and not allow_zero) or math.isnan(value):
        raise ValueError(f"{name} must be {'at least 0' if allow_zero else 'above 0'}, not {value}.")
    return float(value)


def ring_centers(modes: int = 8, radius: float = 2.0) -> torch.Tensor:
    """The ``modes`` centres of the ring, evenly spaced on a circle, shape ``(modes, 2)``.

    Used by notebook 03_gan_step.
    """
    modes = _positive_int(modes, "modes")
    radius = _positive_float(radius, "radius")
    angles = torch.arange(modes, dtype=torch.float32) * (2 * math.pi / modes)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * radius


def ring_of_gaussians(
    n: int,
    modes: int = 8,
    radius: float = 2.0,
    std: float = 0.1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``n`` points from a ring of ``modes`` Gaussians (the classic toy GAN data), shape ``(n, 2)``.

    Each point picks a centre uniformly and adds Gaussian noise of standard deviation ``std``.
    Pass a ``torch.Generator`` for a sample that does not depend on the global seed. Used by
    notebook 03_gan_step.
    """
    n = _positive_int(n, "n")
    std = _positive_float(std, "std", allow_zero=True)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, not {type(generator).__name__}.")
    centers = ring_centers(modes, radius)
    which = torch.randint(0, len(centers), (n,), generator=generator)
    return centers[which] + std * torch.randn(n, 2, generator=generator)


def _points(samples: Any, name: str) -> torch.Tensor:
    if not isinstance(samples, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of 2-D points, not {type(samples).__name__}.")
    if samples.dim() != 2 or samples.shape[1] != 2 or len(samples) == 0:
        raise ValueError(f"{name} must have shape (n, 2) with n >= 1, not {tuple(samples.shape)}.")
    return samples.detach().float()


def sample_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """How far two point clouds are apart: the mean nearest-neighbour distance, both ways, averaged.

    Each point of ``a`` looks for its nearest point of ``b`` and vice versa; a generator that
    covers only some modes scores badly too, because the real points of the missing modes are
    far from every generated point. 0 for identical clouds. Used by notebook 03_gan_step.
    """
    a, b = _points(a, "a"), _points(b, "b")
    distances = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")  # exact: 0 for equal points
    return float((distances.min(dim=1).values.mean() + distances.min(dim=0).values.mean()) / 2)


@dataclass(frozen=True)
class RingCoverage:
    """How well samples cover the ring: modes with enough samples near them, and the share near any.

    Used by notebook 03_gan_step.
    """

    modes_covered: int
    modes: int
    near_fraction: float

    def __str__(self) -> str:
        return (f"{self.modes_covered} of {self.modes} modes covered, "
                f"{self.near_fraction:.0%} of the samples within 3 std of a centre")


def ring_coverage(samples: torch.Tensor, modes: int = 8, radius: float = 2.0, std: float = 0.1) -> RingCoverage:
    """Count the modes that at least 1 % of ``samples`` land near (within 3 ``std`` of the centre).

    Used by notebook 03_gan_step.
    """
    points = _points(samples, "samples")
    std = _positive_float(std, "std")
    nearest, which = torch.cdist(points, ring_centers(modes, radius)).min(dim=1)
    near = nearest < 3 * std
    counts = torch.bincount(which[near], minlength=modes)
    enough = max(1, math.ceil(0.01 * len(points)))
    return RingCoverage(int((counts >= enough).sum()), modes, float(near.float().mean()))


# -- figures -------------------------------------------------------------------------------------

def _scatter(axes: Any, real: torch.Tensor, generated: torch.Tensor | None, title: str) -> None:
    axes.scatter(real[:, 0], real[:, 1], s=4, color="tab:gray", alpha=0.5, label="real data")
    if generated is not None:
        axes.scatter(generated[:, 0], generated[:, 1], s=4, color="tab:orange", alpha=0.6, label="generated")
    axes.set_title(title, fontsize=10)
    axes.set_xlim(-3, 3)
    axes.set_ylim(-3, 3)
    axes.set_aspect("equal")
    axes.legend(fontsize=7, loc="upper right", markerscale=3)


def samples_figure(real: torch.Tensor, generated: torch.Tensor | None = None, title: str = "") -> Figure:
    """A scatter plot of real points (grey) and, if given, generated ones (orange).

    Used by notebook 03_gan_step.
    """
    real = _points(real, "real")
    generated = None if generated is None else _points(generated, "generated")
    figure = PngFigure(figsize=(3.6, 3.6), dpi=90)
    _scatter(figure.add_subplot(), real, generated, title or "real data")
    figure.tight_layout()
    return figure


def training_figure(
    real: torch.Tensor,
    before: torch.Tensor,
    after: torch.Tensor,
    history: Sequence[tuple[float, float]],
) -> Figure:
    """Generated samples before and after training against the real data, and the two loss curves.

    ``history`` holds one ``(d_loss, g_loss)`` pair of numbers per iteration. Each scatter's title
    gives :func:`sample_distance` to the real points. Used by notebook 03_gan_step.
    """
    real, before, after = _points(real, "real"), _points(before, "before"), _points(after, "after")
    if not history or any(len(pair) != 2 for pair in history):
        raise ValueError("history must be a non-empty list of (d_loss, g_loss) pairs, one per iteration.")
    figure = PngFigure(figsize=(11, 3.6), dpi=90)
    first, second, losses = figure.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.5]})
    _scatter(first, real, before, f"before training (distance {sample_distance(before, real):.2f})")
    _scatter(second, real, after, f"after {len(history)} steps (distance {sample_distance(after, real):.2f})")
    window = max(1, len(history) // 25)
    for index, (label, colour) in enumerate((("d_loss", "tab:blue"), ("g_loss", "tab:red"))):
        values = [pair[index] for pair in history]
        smooth = [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]
        losses.plot(values, color=colour, alpha=0.25, linewidth=0.8)
        losses.plot(smooth, color=colour, label=f"{label} (moving mean)")
    losses.set_xlabel("training step")
    losses.set_ylabel("loss")
    losses.set_title("Losses", fontsize=10)
    losses.legend(fontsize=8)
    losses.grid(alpha=0.3)
    figure.tight_layout()
    return figure


# -- steps built from four switches ----------------------------------------------------------------

@dataclass(frozen=True)
class StepSettings:
    """The four choices that decide what a SRGAN-shaped GAN step does.

    ``retain_graph``: ``d_loss.backward(retain_graph=True)``. ``detach``: D's fake term sees
    ``fake.detach()``. ``fresh_pass``: ``g_loss`` comes from a new ``netD(fake)`` pass instead of
    reusing D's ``fake_out``. ``d_step_first``: ``optimizerD.step()`` runs before
    ``g_loss.backward()`` (otherwise after it). Used by notebook 03_gan_step.
    """

    retain_graph: bool
    detach: bool
    fresh_pass: bool
    d_step_first: bool

    def __post_init__(self) -> None:
        for name in ("retain_graph", "detach", "fresh_pass", "d_step_first"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StepSettings.{name} must be True or False, not {getattr(self, name)!r}.")

    @classmethod
    def all(cls) -> list[StepSettings]:
        """All 16 combinations, in a fixed order."""
        return [cls(*values) for values in itertools.product((False, True), repeat=4)]

    @property
    def label(self) -> str:
        """A short description, for tables."""
        return ", ".join([
            "retain" if self.retain_graph else "no retain",
            "fake.detach()" if self.detach else "fake",
            "fresh netD(fake) for G" if self.fresh_pass else "G reuses fake_out",
            "D step before g_loss.backward()" if self.d_step_first else "D step after g_loss.backward()",
        ])

    @property
    def code(self) -> str:
        """The step function these settings stand for, exactly as :func:`make_step` compiles it."""
        d_step = "    optimizerD.step()"
        lines = [
            "def step(netG, netD, optimizerG, optimizerD, real, z):",
            "    netD.zero_grad()",
            "    fake = netG(z)",
            "    real_out = netD(real)",
            f"    fake_out = netD({'fake.detach()' if self.detach else 'fake'})",
            "    d_loss = d_loss_fn(real_out, fake_out)",
            f"    d_loss.backward({'retain_graph=True' if self.retain_graph else ''})",
        ]
        if self.d_step_first:
            lines.append(d_step)
        lines += [
            "    netG.zero_grad()",
            f"    g_loss = g_loss_fn({'netD(fake)' if self.fresh_pass else 'fake_out'})",
            "    g_loss.backward()",
        ]
        if not self.d_step_first:
            lines.append(d_step)
        lines += ["    optimizerG.step()", "    return d_loss.item(), g_loss.item()"]
        return "\n".join(lines) + "\n"


SRGAN_SETTINGS = StepSettings(retain_graph=True, detach=False, fresh_pass=False, d_step_first=True)
STANDARD_SETTINGS = StepSettings(retain_graph=False, detach=True, fresh_pass=True, d_step_first=True)


def make_step(settings: StepSettings, d_loss_fn: LossD, g_loss_fn: LossG) -> Step:
    """Compile ``settings.code`` into a step function that uses the given loss functions.

    What runs is exactly the code the panel shows. Used by notebook 03_gan_step.
    """
    if not isinstance(settings, StepSettings):
        raise TypeError(f"make_step() needs StepSettings, not {type(settings).__name__}.")
    if not callable(d_loss_fn) or not callable(g_loss_fn):
        raise TypeError("make_step() needs two loss functions: d_loss_fn(real_out, fake_out) and g_loss_fn(fake_out).")
    namespace: dict[str, Any] = {"d_loss_fn": d_loss_fn, "g_loss_fn": g_loss_fn}
    exec(compile(settings.code, f"<GAN step: {settings.label}>", "exec"), namespace)  # noqa: S102 - our own template
    step = namespace["step"]
    step.label = settings.label  # type: ignore[attr-defined]  # shown as the step's name
    return step


# -- checking a step against reference gradients ----------------------------------------------------

@dataclass(frozen=True)
class NetworkCheck:
    """One network's gradients, as its optimizer received them, against the reference.

    Used by notebook 03_gan_step.
    """

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
            rows.append([NETWORK_NAMES[key], f"{check.max_difference:.2e}", f"{check.relative_error:.2%}",
                         "matches" if check.matches else "WRONG"])
        return Table(["network", "max |grad - reference|", "relative error", "verdict"], rows)

    def __repr__(self) -> str:
        return f"{self.name}\n{self.verdict}\n{self.table()!r}"

    def _repr_html_(self) -> str:
        colour = {"error": "#b00020", "silently wrong": "#b00020", "correct": "#1b5e20"}[self.outcome]
        mark = "✓" if self.outcome == "correct" else "✗"
        return (f"<div style='border:2px solid {colour};padding:6px;margin:4px 0'>"
                f"<b style='color:{colour}'>{mark} {html.escape(self.verdict)}</b>"
                f"<div style='font-size:90%'>{html.escape(self.name)}</div>"
                f"{self.table()._repr_html_()}</div>")


def _bytes_or_dash(n: int | None, dash: str = "-") -> str:
    return dash if n is None else format_bytes(n)


def _named_grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.detach().clone() for name, p in module.named_parameters()}


def _network_check(network: str, grads: Mapping[str, torch.Tensor | None],
                   reference: Mapping[str, torch.Tensor]) -> NetworkCheck:
    worst, squared_diff, squared_ref = 0.0, 0.0, 0.0
    matches, bit_equal, missing = True, True, []
    for name, ref in reference.items():
        got = grads.get(name)
        if got is None:
            missing.append(name)
            got = torch.zeros_like(ref)
        difference = got - ref
        worst = max(worst, float(difference.abs().max()) if difference.numel() else 0.0)
        squared_diff += float(difference.pow(2).sum())
        squared_ref += float(ref.pow(2).sum())
        if not torch.equal(got, ref):
            bit_equal = False
            matches = matches and torch.allclose(got, ref, rtol=RTOL, atol=ATOL)
    matches = matches and not missing
    relative = math.sqrt(squared_diff) / math.sqrt(squared_ref) if squared_ref > 0 else math.sqrt(squared_diff)
    return NetworkCheck(network, worst, relative, matches, bit_equal and not missing, tuple(missing))


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
    afterwards, so a check leaves no trace. Used by notebook 03_gan_step.
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
                raise ValueError(f"GanStepChecker: {name} must hold only the parameters of "
                                 f"{'netG' if name == 'optimizerG' else 'netD'}.")
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
        return {
            "D": {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(d_params.items(), d_grads)},
            "G": {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(g_params.items(), g_grads)},
        }

    def _args(self) -> tuple[Any, ...]:
        return self.netG, self.netD, self.optimizerG, self.optimizerD, self.real, self.z

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Learning rates 0 inside; weights, optimizer state and ``.grad`` restored on the way out."""
        saved = [(p, p.detach().clone()) for net in (self.netG, self.netD) for p in net.parameters()]
        states = [copy.deepcopy(opt.state_dict()) for opt in (self.optimizerG, self.optimizerD)]
        for optimizer in (self.optimizerG, self.optimizerD):
            for group in optimizer.param_groups:
                group["lr"] = 0.0
        try:
            yield
        finally:
            with torch.no_grad():
                for parameter, value in saved:
                    parameter.copy_(value)
            for optimizer, state in zip((self.optimizerG, self.optimizerD), states):
                optimizer.load_state_dict(state)
            self.netG.zero_grad(set_to_none=True)
            self.netD.zero_grad(set_to_none=True)

    def check(self, step: Step, name: str | None = None) -> StepCheck:
        """Run ``step(netG, netD, optimizerG, optimizerD, real, z)`` and judge its gradients.

        A ``RuntimeError`` from the step is the outcome ``'error'``; any other exception is a bug
        in the step and is raised. The step runs twice: once bare, for the outcome and the
        gradients (autograd's own checks, with no hooks installed), and, when that worked, once
        inside a :class:`SavedTensorMeter` for the figures.
        """
        if not callable(step):
            raise TypeError(f"check() needs a step function, not {type(step).__name__}.")
        name = name or getattr(step, "label", None) or getattr(step, "__name__", "step")
        recorded, calls, error, seconds, forwards = self._run(step, meter=None)
        if error is not None:
            return StepCheck(name, "error", error, {}, None, None, seconds, calls, forwards)
        meter = SavedTensorMeter()
        held: list[int] = []
        self._run(step, meter=meter, held=held)
        networks = {key: _network_check(key, recorded[key], self.reference[key]) for key in ("D", "G")}
        outcome: Outcome = "correct" if all(c.matches for c in networks.values()) else "silently wrong"
        return StepCheck(name, outcome, None, networks, meter.peak_graph_only_bytes, held[0] if held else None,
                         seconds, calls, forwards, recorded)

    def _run(
        self, step: Step, meter: SavedTensorMeter | None, held: list[int] | None = None,
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
                    recorded[key] = _named_grads(module)
                    if key == "D" and meter is not None and held is not None:
                        held.append(meter.graph_only_bytes)
            return hook

        error: str | None = None
        with self.frozen():
            self.netG.zero_grad(set_to_none=True)
            self.netD.zero_grad(set_to_none=True)
            handles = [self.optimizerD.register_step_pre_hook(recorder("D", self.netD)),
                       self.optimizerG.register_step_pre_hook(recorder("G", self.netG)),
                       self.netD.register_forward_hook(count_forward)]
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
                recorded.setdefault("D", _named_grads(self.netD))
                recorded.setdefault("G", _named_grads(self.netG))
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
        times: dict[str, list[float]] = {key: [] for key in runnable}
        with self.frozen():
            for key in runnable:
                self.netG.zero_grad(set_to_none=True)
                self.netD.zero_grad(set_to_none=True)
                allocated[key] = profiler_peak_bytes(lambda step=steps[key]: step(*self._args()))
            for index in tqdm(range(rounds), desc="timing rounds", disable=not progress, leave=True):
                shift = index % len(runnable)
                for key in runnable[shift:] + runnable[:shift]:
                    start = time.perf_counter()
                    steps[key](*self._args())
                    times[key].append(time.perf_counter() - start)
        medians = {key: statistics.median(values) for key, values in times.items()}
        if progress:
            print(f"Checked {len(steps)} steps against the reference gradients; timed {len(runnable)} "
                  f"of them over {rounds} rounds.")
        return StepComparison(reference, checks, medians, allocated, rounds)


@dataclass
class StepComparison:
    """What :meth:`GanStepChecker.compare` found: one :class:`StepCheck` and the costs per step.

    Used by notebook 03_gan_step.
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

    def table(self) -> Table:
        """One row per step: outcome, both networks' gradients vs the reference, time and memory."""
        rows = []
        for name, check in self.checks.items():
            grads = [check.networks[key].describe() if key in check.networks else "-" for key in ("D", "G")]
            seconds = self.seconds_per_step.get(name)
            ratio = self.time_ratio(name)
            rows.append([name, check.outcome if check.outcome != "error" else f"error ({check.error_kind})",
                         *grads, "-" if seconds is None else f"{seconds * 1e3:.2f} ms",
                         "-" if ratio is None else f"{ratio:.2f}x", _bytes_or_dash(check.peak_graph_only_bytes),
                         format_bytes(self.profiler_peak_bytes[name]) if name in self.profiler_peak_bytes else "-"])
        return Table(["step", "outcome", "D gradient vs reference", "G gradient vs reference", "time per step",
                      f"time / {self.reference}", "peak graph-only (meter)", "peak allocated (profiler)"], rows)


# -- the panel -----------------------------------------------------------------------------------

class GanLab:
    """A panel that builds a GAN step from four switches, runs it through a :class:`GanStepChecker`
    and shows the verdict (error, silently wrong, correct) with the meter's figures.

    The switches: ``retain_graph`` on ``d_loss.backward()``, ``fake.detach()`` for D's fake term,
    a fresh ``netD(fake)`` pass for ``g_loss`` (instead of reusing ``fake_out``), and whether
    ``optimizerD.step()`` comes before or after ``g_loss.backward()``. The code that runs is shown
    beside them. Drive it by clicking, or from Python: ``lab.retain.value = True``,
    ``lab.order.value = 'after'``, ``lab.run_button.click()``, ``lab.run_all_button.click()``.

    Used by notebook 03_gan_step.
    """

    def __init__(self, checker: GanStepChecker, title: str = "GAN step lab") -> None:
        if not isinstance(checker, GanStepChecker):
            raise TypeError(f"GanLab needs a GanStepChecker, not {type(checker).__name__}.")
        self.checker = checker
        self.results: dict[StepSettings, StepCheck] = {}
        self.last_check: StepCheck | None = None
        self.last_error: str | None = None
        self.message = ""
        self._build_widgets(title)
        self._show_code()
        self._set_status("Choose the switches, then press Run one step.")

    # -- widgets ---------------------------------------------------------------------------
    def _checkbox(self, description: str, tooltip: str, css: str, value: bool) -> widgets.Checkbox:
        box = widgets.Checkbox(value=value, description=description, tooltip=tooltip, indent=False,
                               layout=widgets.Layout(width="auto"))
        box.add_class(css)
        box.observe(lambda _change: self._safely(self._show_code), names="value")
        return box

    def _button(self, description: str, tooltip: str, css: str, handler: Callable[[], None]) -> widgets.Button:
        button = widgets.Button(description=description, tooltip=tooltip, layout=widgets.Layout(width="auto"))
        button.add_class(css)
        button.on_click(lambda _button: self._safely(handler))
        return button

    def _build_widgets(self, title: str) -> None:
        self.retain = self._checkbox("retain_graph=True on d_loss.backward()",
                                     "Keep the graph's buffers after D's backward (the SRGAN code does)",
                                     "bt-gan-retain", SRGAN_SETTINGS.retain_graph)
        self.detach = self._checkbox("D's fake term uses fake.detach()",
                                     "Cut the generator out of the discriminator's loss",
                                     "bt-gan-detach", SRGAN_SETTINGS.detach)
        self.fresh_pass = self._checkbox("g_loss from a fresh netD(fake) pass",
                                         "Unticked: g_loss reuses fake_out from D's pass, as the SRGAN code does",
                                         "bt-gan-fresh-pass", SRGAN_SETTINGS.fresh_pass)
        self.order = widgets.ToggleButtons(
            options=[("before g_loss.backward()", "before"), ("after g_loss.backward()", "after")],
            value="before" if SRGAN_SETTINGS.d_step_first else "after",
            description="optimizerD.step()",
            tooltip="When the discriminator's optimizer updates its weights",
            tooltips=["Update D between the two backward calls (the SRGAN order)",
                      "Update D only after g_loss.backward() (the tempting fix)"],
            style={"description_width": "initial", "button_width": "auto"},
        )
        self.order.add_class("bt-gan-order")
        self.order.observe(lambda _change: self._safely(self._show_code), names="value")
        self.run_button = self._button("Run one step", "Run the step shown below once and check its gradients",
                                       "bt-gan-run", self.run)
        self.run_all_button = self._button("Try all 16 combinations",
                                           "Run every combination of the four switches and fill the table",
                                           "bt-gan-run-all", self.run_all)
        self.code = widgets.HTML(value="")
        self.code.add_class("bt-gan-code")
        self.outcome = widgets.HTML(value="")
        self.outcome.add_class("bt-gan-outcome")
        self.values: dict[str, widgets.Label] = {}
        rows = []
        for key, label, tip in [
            ("d-grad", "D gradient vs reference", "What optimizerD.step() received, against D's reference gradient"),
            ("g-grad", "G gradient vs reference", "What optimizerG.step() received, against G's reference gradient"),
            ("peak-bytes", "peak graph-only bytes", "Most bytes only the graphs kept alive during the step (meter)"),
            ("held-bytes", "held at optimizerD.step()", "Graph-only bytes alive when optimizerD.step() was called"),
            ("seconds", "time of this step", "Wall time of this one run (noisy)"),
        ]:
            name = widgets.Label(value=label, tooltip=tip, layout=widgets.Layout(width="190px"))
            value = widgets.Label(value="-", tooltip=tip)
            value.add_class(f"bt-gan-value-{key}")
            self.values[key] = value
            rows.append(widgets.HBox([name, value]))
        self.summary = widgets.HTML(value="")
        self.summary.add_class("bt-gan-summary")
        self.status = widgets.HTML(value="")
        self.status.add_class("bt-gan-status")
        self.panel = widgets.VBox([
            widgets.HTML(f"<b>{html.escape(title)}</b>"),
            self.retain, self.detach, self.fresh_pass, self.order,
            # Room above, so the run buttons do not read as a third option of the order toggle.
            widgets.HBox([self.run_button, self.run_all_button], layout=widgets.Layout(margin="10px 0 0 0")),
            self.code, self.outcome, widgets.VBox(rows), self.status, self.summary,
        ])
        self.panel.add_class("bt-gan-lab")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel)

    # -- state -----------------------------------------------------------------------------
    @property
    def settings(self) -> StepSettings:
        """The step the switches describe now."""
        return StepSettings(bool(self.retain.value), bool(self.detach.value), bool(self.fresh_pass.value),
                            self.order.value == "before")

    @settings.setter
    def settings(self, settings: StepSettings) -> None:
        if not isinstance(settings, StepSettings):
            raise TypeError(f"GanLab.settings takes StepSettings, not {type(settings).__name__}.")
        self.retain.value, self.detach.value = settings.retain_graph, settings.detach
        self.fresh_pass.value = settings.fresh_pass
        self.order.value = "before" if settings.d_step_first else "after"

    # -- actions ---------------------------------------------------------------------------
    def _safely(self, action: Callable[[], None]) -> None:
        # ipywidgets swallows exceptions raised in handlers; show them in the panel instead.
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - every error must reach the learner
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.message = f"Error: {self.last_error}"
            self.status.value = ("<div style='color:#b00020'><b>The panel hit an error</b> (it still works)<br>"
                                 f"<code>{html.escape(self.last_error)}</code></div>")

    def _set_status(self, message: str) -> None:
        self.message = message
        self.status.value = f"<span>Status: {html.escape(message)}</span>"

    def _show_code(self) -> None:
        self.code.value = f"<pre style='font-size:85%;line-height:1.25'>{html.escape(self.settings.code)}</pre>"

    def _check(self, settings: StepSettings) -> StepCheck:
        step = make_step(settings, self.checker.d_loss_fn, self.checker.g_loss_fn)
        result = self.checker.check(step, name=settings.label)
        self.results[settings] = result
        return result

    def run(self) -> None:
        """Build the step from the switches, check it, and show the verdict and the figures."""
        result = self._check(self.settings)
        self.last_check = result
        self.last_error = None
        self._show_result(result)
        self._set_status(f"Ran: {self.settings.label}.")
        self._show_summary()

    def run_all(self) -> None:
        """Check every combination of the switches (the switches themselves are left as they are)."""
        for settings in StepSettings.all():
            self._check(settings)
        self.last_error = None
        self._show_summary()
        counts = {outcome: sum(r.outcome == outcome for r in self.results.values())
                  for outcome in ("error", "silently wrong", "correct")}
        self._set_status(f"Tried all 16: {counts['error']} raise, {counts['silently wrong']} are silently wrong, "
                         f"{counts['correct']} are correct.")

    def _show_result(self, result: StepCheck) -> None:
        self.outcome.value = result._repr_html_()
        for key, network in (("d-grad", "D"), ("g-grad", "G")):
            check = result.networks.get(network)
            self.values[key].value = "not computed: the step raised" if check is None else check.describe()
        self.values["peak-bytes"].value = _bytes_or_dash(result.peak_graph_only_bytes, "not measured: the step raised")
        held = result.held_at_d_step
        self.values["held-bytes"].value = "optimizerD.step() not reached" if held is None else format_bytes(held)
        self.values["seconds"].value = f"{result.seconds * 1e3:.1f} ms"

    def summary_table(self) -> Table:
        """Every combination tried so far, in a fixed order."""
        rows = []
        for settings in StepSettings.all():
            result = self.results.get(settings)
            if result is None:
                continue
            outcome = result.outcome if result.outcome != "error" else f"error: {result.error_kind}"
            rows.append(["yes" if settings.retain_graph else "no", "fake.detach()" if settings.detach else "fake",
                         "fresh netD(fake)" if settings.fresh_pass else "reuse fake_out",
                         "before" if settings.d_step_first else "after", outcome,
                         _bytes_or_dash(result.peak_graph_only_bytes)])
        return Table(["retain_graph", "D's fake input", "g_loss from", "optimizerD.step()", "outcome",
                      "peak graph-only bytes"], rows)

    def _show_summary(self) -> None:
        self.summary.value = self.summary_table()._repr_html_() if self.results else ""


# -- exercise checks -------------------------------------------------------------------------------

def _mlp(inputs: int, outputs: int, hidden: int = 32) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, outputs))


def _d_loss(real_out: torch.Tensor, fake_out: torch.Tensor) -> torch.Tensor:
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    return bce(real_out, torch.ones_like(real_out)) + bce(fake_out, torch.zeros_like(fake_out))


def _g_loss(fake_out: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(fake_out, torch.ones_like(fake_out))


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).split(" Hint:")[0].splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:110]}"


def _judge_step(step: Any, single_forward: bool) -> CheckResult:
    if not callable(step):
        return CheckResult(False, "Pass your step function itself (without calling it).")
    checker = _toy_checker()
    try:
        result = checker.check(step)
    except Exception as exc:  # noqa: BLE001 - a learner's bug is a verdict, not a crash
        return CheckResult(False, f"Your step raised {_first_line(exc)}")
    if result.outcome == "error":
        hint = ("optimizerD.step() changed D's weights in place while a graph still needed the old ones: "
                "compute every gradient that needs D's current weights before D's step.")
        if result.error_kind == "backward a second time":
            hint = "A second backward went through buffers the first one freed. Which graph does g_loss need?"
        return CheckResult(False, f"Your step raised {(result.error or '').split(' Hint:')[0]}", hint)
    if result.step_calls != {"D": 1, "G": 1}:
        return CheckResult(False, f"Call optimizerD.step() and optimizerG.step() once each; your step called them "
                                  f"{result.step_calls['D']} and {result.step_calls['G']} times.")
    if result.outcome == "silently wrong":
        return CheckResult(False, result.verdict,
                           "D's gradient must come from d_loss alone (fake term on fake.detach() or through "
                           "inputs=), G's from g_loss alone. Is a backward adding into the other network's .grad?")
    if single_forward and result.d_forward_calls > 2:
        return CheckResult(False, f"Right gradients, but netD ran {result.d_forward_calls} times; run it once on "
                                  "real and once on fake, and get both gradients from that one graph.",
                           "backward(inputs=...) sends a loss's gradient only to the tensors you list.")
    if not single_forward:
        standard = _toy_checker().check(make_step(STANDARD_SETTINGS, _d_loss, _g_loss))
        # 10 % slack: the same step written with other temporaries differs by a few hundred bytes.
        if (result.peak_graph_only_bytes or 0) > 1.1 * (standard.peak_graph_only_bytes or 0):
            return CheckResult(
                False, f"Right gradients, but the graphs held up to {_bytes_or_dash(result.peak_graph_only_bytes)} "
                       f"during your step; the standard step needs {_bytes_or_dash(standard.peak_graph_only_bytes)}.",
                "Is a retain_graph=True left that no later backward needs?")
    how = "from one D pass on fake" if single_forward else "without retaining anything it does not need"
    return CheckResult(True, f"Both optimizers receive the reference gradients, {how} "
                             f"(peak graph-only {_bytes_or_dash(result.peak_graph_only_bytes)}).")


def check_fixed_srgan_step(step: Step) -> CheckResult:
    """Exercise 1: the copied SRGAN step, fixed: no error, right gradients for both networks, no waste.

    Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=False)


def check_single_forward_step(step: Step) -> CheckResult:
    """Exercise 2: a correct step that runs the discriminator on ``fake`` only once.

    Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=True)


def _reference_penalty(netD: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor,
                       alpha: torch.Tensor) -> torch.Tensor:
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def check_gradient_penalty(gradient_penalty: Callable[..., torch.Tensor]) -> CheckResult:
    """Exercise 3: ``gradient_penalty(netD, real, fake, alpha)`` must give D a gradient (WGAN-GP).

    Used by notebook 03_gan_step.
    """
    if not callable(gradient_penalty):
        return CheckResult(False, "Pass your function itself (without calling it).")
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    netD = _mlp(2, 1)
    real = ring_of_gaussians(64, generator=generator)
    fake = torch.randn(64, 2, generator=generator)
    alpha = torch.rand(64, 1, generator=generator)
    params = list(netD.parameters())
    expected = _reference_penalty(netD, real, fake, alpha)
    # The last layer's bias does not affect D's gradient with respect to its input: no gradient.
    expected_grads = torch.autograd.grad(expected, params, allow_unused=True)
    try:
        penalty = gradient_penalty(netD, real, fake, alpha)
    except Exception as exc:  # noqa: BLE001 - a learner's bug is a verdict, not a crash
        return CheckResult(False, f"Your function raised {_first_line(exc)}")
    if not isinstance(penalty, torch.Tensor) or penalty.numel() != 1:
        return CheckResult(False, "Return the penalty as a single-number tensor.")
    if not torch.allclose(penalty.detach(), expected.detach(), rtol=1e-4, atol=1e-6):
        return CheckResult(False, f"The penalty is {float(penalty.detach()):.4f}; "
                                  f"expected {float(expected.detach()):.4f}.",
                           "Mix the points with alpha, take D's gradient at the mixed points, and average "
                           "(norm - 1) squared.")
    if penalty.grad_fn is None:
        return CheckResult(False, "The value is right, but the penalty is a constant: no gradient reaches D's "
                                  "weights, so adding it to d_loss changes nothing.",
                           "retain_graph=True keeps buffers; only create_graph=True records the gradient "
                           "computation itself so it can be differentiated.")
    got = torch.autograd.grad(penalty, params, allow_unused=True)
    for (name, parameter), mine, ref in zip(netD.named_parameters(), got, expected_grads):
        mine = torch.zeros_like(parameter) if mine is None else mine
        ref = torch.zeros_like(parameter) if ref is None else ref
        if not torch.allclose(mine, ref, rtol=1e-4, atol=1e-6):
            return CheckResult(False, f"The penalty's gradient for D's {name} differs from the reference.")
    return CheckResult(True, f"The penalty ({float(penalty.detach()):.4f}) gives D the right gradient: the gradient "
                             "computation itself was recorded (create_graph=True).")
