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
#
# A step that is right once can be wrong from its second call on (nothing clears .grad, so D trains
# on the sum of earlier losses), so each step is judged on three calls in a row at learning rate 0:
# from empty .grad, right after itself, and with .grad pre-filled with other values. Every
# gradient an optimizer receives at any step() call must equal the reference. What each backward
# call did (torch.autograd.grad or .backward(), retain_graph, create_graph) is recorded where
# PyTorch's engine is entered, so a name imported before the check is seen too.

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
    """``'NameError: name ...'``: the exception's type and the first line of its message."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a learner's exception class may break even str()
        text = ""
    lines = text.split(" Hint:")[0].strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:110]}" if lines else type(exc).__name__


@dataclass(frozen=True)
class _BackwardCall:
    """One entry into autograd's engine: ``torch.autograd.grad`` (``computes_grad``) or a backward."""

    computes_grad: bool
    retain_graph: bool
    create_graph: bool


# The private function both torch.autograd.backward and torch.autograd.grad enter the engine
# through (torch 2.x). Without it, the public functions are watched instead.
_ENGINE_ENTRY = "_engine_run_backward"


def _watched_public(name: str, original: Callable[..., Any], calls: list[_BackwardCall]) -> Callable[..., Any]:
    """``torch.autograd.backward`` or ``.grad``, recording each call (used where the engine entry is missing)."""
    import inspect

    signature = inspect.signature(original)

    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:  # let PyTorch itself say what is wrong with the call
            return original(*args, **kwargs)
        create = bool(bound.get("create_graph", False))
        retain = bound.get("retain_graph")
        calls.append(_BackwardCall(name == "grad", create if retain is None else bool(retain), create))
        return original(*args, **kwargs)

    return watched


@contextmanager
def _watching_backward() -> Iterator[list[_BackwardCall]]:
    """Record every backward and ``torch.autograd.grad`` call made inside; restored on the way out."""
    calls: list[_BackwardCall] = []
    engine = getattr(torch.autograd, _ENGINE_ENTRY, None)
    replaced: list[tuple[str, Any]] = []
    if callable(engine):
        # engine(outputs, grad_outputs, retain_graph, create_graph, inputs, ..., accumulate_grad=...)
        def entered(outputs: Any, *args: Any, **kwargs: Any) -> Any:
            retain = args[1] if len(args) > 1 else kwargs.get("keep_graph", False)
            create = args[2] if len(args) > 2 else kwargs.get("create_graph", False)
            calls.append(_BackwardCall(not kwargs.get("accumulate_grad", True), bool(retain), bool(create)))
            return engine(outputs, *args, **kwargs)

        replaced.append((_ENGINE_ENTRY, entered))
    else:
        for name in ("backward", "grad"):
            replaced.append((name, _watched_public(name, getattr(torch.autograd, name), calls)))
    originals = [(name, getattr(torch.autograd, name)) for name, _ in replaced]
    try:
        for name, function in replaced:
            setattr(torch.autograd, name, function)
        yield calls
    finally:
        for name, function in originals:
            setattr(torch.autograd, name, function)


@dataclass
class _StepCall:
    """What one call of a learner's step did: .grad as it began, what each optimizer received at
    each of its ``step()`` calls, .grad as the call ended, D's passes, the backward calls, and the
    exception it raised, if any."""

    entry: dict[str, dict[str, torch.Tensor | None]]
    received: dict[str, list[dict[str, torch.Tensor | None]]]
    final: dict[str, dict[str, torch.Tensor | None]]
    d_passes: int
    backward_calls: list[_BackwardCall]
    error: BaseException | None


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
    optimizers = {"D": checker.optimizerD, "G": checker.optimizerG}
    first_layer = next(m for m in checker.netD.modules() if list(m.parameters(recurse=False)))
    prefill = torch.Generator().manual_seed(3)
    calls: list[_StepCall] = []
    with checker.frozen():
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        for index in range(len(_CALLS)):
            if index == 2:
                for module in modules.values():
                    _prefill(module, prefill)
            received: dict[str, list[dict[str, torch.Tensor | None]]] = {"D": [], "G": []}
            passes = [0]

            def count_pass(*_: Any) -> None:
                passes[0] += 1

            def recorder(key: str) -> Callable[..., None]:
                def hook(*_: Any) -> None:
                    received[key].append(_named_grads(modules[key]))
                return hook

            entry = {key: _named_grads(module) for key, module in modules.items()}
            handles = [optimizers[key].register_step_pre_hook(recorder(key)) for key in optimizers]
            handles.append(first_layer.register_forward_hook(count_pass))
            error: BaseException | None = None
            try:
                with _watching_backward() as backward_calls:
                    step(*checker._args())
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a learner's bug is a verdict, not a crash
                error = exc
            finally:
                for handle in handles:
                    handle.remove()
            final = {key: _named_grads(module) for key, module in modules.items()}
            calls.append(_StepCall(entry, received, final, passes[0], backward_calls, error))
            if error is not None:
                break
    return calls


def _flat(grads: Mapping[str, torch.Tensor | None], like: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(grads.get(name) if grads.get(name) is not None else torch.zeros_like(ref)).reshape(-1)
                      for name, ref in like.items()])


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool(torch.allclose(got, expected, rtol=RTOL, atol=ATOL))


def _cross_reference(checker: GanStepChecker) -> dict[str, dict[str, torch.Tensor]]:
    """Each network's gradient of the *other* network's loss: D's of g_loss, G's of d_loss (fake not detached)."""
    d_params, g_params = dict(checker.netD.named_parameters()), dict(checker.netG.named_parameters())
    fake = checker.netG(checker.z)
    g_loss = checker.g_loss_fn(checker.netD(fake))
    d_grads = torch.autograd.grad(g_loss, list(d_params.values()), allow_unused=True)
    d_loss = checker.d_loss_fn(checker.netD(checker.real), checker.netD(fake))
    g_grads = torch.autograd.grad(d_loss, list(g_params.values()), allow_unused=True)
    return {key: {n: torch.zeros_like(p) if g is None else g.detach() for (n, p), g in zip(params.items(), grads)}
            for key, params, grads in (("D", d_params, d_grads), ("G", g_params, g_grads))}


_OWN_LOSS = {"D": "d_loss", "G": "g_loss"}
_OPTIMIZER = {"D": "optimizerD", "G": "optimizerG"}


def _combination(d_times: int, g_times: int) -> str:
    """``'d_loss + g_loss'``, ``'2 × d_loss'``, ``'g_loss'``: the loss whose gradient a network received."""
    counted = (("d_loss", d_times), ("g_loss", g_times))
    return " + ".join(f"{'' if times == 1 else f'{times} × '}{loss}" for loss, times in counted if times)


def _what_was_received(key: str, got: Mapping[str, torch.Tensor | None], reference: Mapping[str, torch.Tensor],
                       cross: Mapping[str, torch.Tensor]) -> tuple[str, str] | None:
    """Name the wrong gradient a network's optimizer received on a first call, if it is a simple one.

    Returns ``(kind, sentence)``, kind one of ``'empty'``, ``'zero'``, ``'repeated'``, ``'other loss'``,
    ``'both losses'``; tries small whole multiples of the network's own loss's gradient and the other's.
    """
    network = f"{key}'s optimizer"
    if all(value is None for value in got.values()):
        return "empty", (f"{network} found no gradient at all: {key}'s .grad was empty (None) when "
                         f"{_OPTIMIZER[key]}.step() ran.")
    flat, own, other = _flat(got, reference), _flat(reference, reference), _flat(cross, reference)
    if not bool(flat.abs().max() > 0):
        return "zero", (f"{network} received a zero gradient: {key}'s .grad held only zeros when "
                        f"{_OPTIMIZER[key]}.step() ran.")
    for own_times, other_times in itertools.product(range(4), range(3)):
        if (own_times, other_times) in ((0, 0), (1, 0)) or not _close(flat, own_times * own + other_times * other):
            continue
        d_times, g_times = (own_times, other_times) if key == "D" else (other_times, own_times)
        text = f"{network} received the gradient of {_combination(d_times, g_times)}"
        if other_times == 0:
            return "repeated", (f"{text}: {_OWN_LOSS[key]} was backpropagated into {key} {own_times} times "
                                "(a retain_graph=True lets a second backward add the same gradient again).")
        if own_times == 0:
            return "other loss", f"{text} instead of {_OWN_LOSS[key]}'s."
        return "both losses", f"{text}, not of {_OWN_LOSS[key]} alone."
    return None


def _first_call_hint(kinds: set[str]) -> str:
    if kinds & {"empty", "zero"}:
        return ("Call each optimizer's step() after the backward that fills its network's .grad, and clear "
                ".grad only before that backward.")
    if kinds == {"repeated"}:
        return "Backpropagate each loss into each network once per step."
    return ("D's gradient must come from d_loss alone (fake term on fake.detach() or through inputs=), G's from "
            "g_loss alone. Is a backward adding into the other network's .grad?")


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


def _later_call_problem(call: _StepCall, index: int, previous: _StepCall | None,
                        reference: Mapping[str, Mapping[str, torch.Tensor]]) -> tuple[str, str] | None:
    """Message and hint when an optimizer got a wrong gradient on one of the calls after the first (see ``_CALLS``)."""
    leftover, unexplained = [], []
    for key in ("D", "G"):
        got = _flat(call.received[key][0], reference[key])
        expected = _flat(reference[key], reference[key])
        if _close(got, expected):
            continue
        entry = _flat(call.entry[key], reference[key])
        if bool(entry.abs().max() > 0) and _close(got, expected + entry):
            leftover.append(key)
        else:
            unexplained.append(key)
    fix = ("Clear each network's .grad at the start of the step, before its backward: net.zero_grad() or "
           "optimizer.zero_grad().")
    if leftover:
        who, whose = " and ".join(leftover), " and ".join(f"{key}'s" for key in leftover)
        optimizers = f"{whose} optimizer{'s' if len(leftover) > 1 else ''}"
        if index == 1:
            twice = all(_close(_flat(call.entry[key], reference[key]), _flat(reference[key], reference[key]))
                        for key in leftover)
            what = ("twice the reference gradient, the sum of two steps' gradients" if twice else
                    "the reference gradient plus what the first call left in .grad")
            return (f"Right on a first call, but on the second call in a row {optimizers} received {what}: "
                    f"nothing cleared {whose} .grad before the backward, so from the second iteration on "
                    f"{who} would train on the sum of earlier losses.", fix)
        cleared_at_end = previous is not None and all(
            all(value is None or not bool(value.abs().max() > 0) for value in previous.final[key].values())
            for key in leftover)
        how = ("your step clears .grad after using it, not before its backward" if cleared_at_end else
               f"nothing cleared {whose} .grad before the backward")
        return ("Right from empty .grad and twice in a row, but when .grad already holds values as the step begins "
                "(left by other code: a gradient penalty, an evaluation backward, an earlier cell), "
                f"{optimizers} received them added to the reference gradient: {how}.", fix)
    if unexplained:
        whose = " and ".join(f"{key}'s" for key in unexplained)
        optimizers = f"{whose} optimizer{'s' if len(unexplained) > 1 else ''}"
        return (f"Right on a first call, but called {'again ' if index == 0 else ''}{_CALLS[index]}, {optimizers} "
                "received a wrong gradient.",
                "A step must hand each optimizer the same gradient whatever .grad held and whatever ran before it.")
    return None


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
    except BaseException as exc:  # noqa: BLE001 - a learner's bug is a verdict, not a crash
        return CheckResult(False, f"Your step raised {_first_line(exc)}")
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
        cross = _cross_reference(checker)
        found = [_what_was_received(key, result.gradients[key], checker.reference[key], cross[key])
                 for key in ("D", "G") if not result.networks[key].matches]
        explained = [pair for pair in found if pair is not None]
        message = " ".join([result.verdict, *(text for _, text in explained)])
        return CheckResult(False, message, _first_call_hint({kind for kind, _ in explained}))
    calls = _run_three_calls(checker, step)
    for index, call in enumerate(calls):
        when = f"called {'again ' if index == 0 else ''}{_CALLS[index]}"
        if call.error is not None:
            return CheckResult(False, f"Right on a first call, but {when} your step raised {_first_line(call.error)}")
        problem = _step_call_problem({key: len(got) for key, got in call.received.items()},
                                     f"Right on a first call, but {when} ")
        if problem:
            return CheckResult(False, problem)
        later = _later_call_problem(call, index, calls[index - 1] if index else None, checker.reference)
        if later:
            return CheckResult(False, *later)
    first = calls[0]
    computed = sum(call.computes_grad for call in first.backward_calls)
    if single_forward and computed:
        return CheckResult(False, f"Right gradients, but your step calls torch.autograd.grad ({computed} "
                                  f"time{'s' if computed > 1 else ''}, directly or through a function built on "
                                  "it); this exercise asks for backward(inputs=...) instead.",
                           "backward(inputs=[...]) fills .grad of only the tensors you list.")
    if single_forward and first.d_passes > 2:
        return CheckResult(False, f"Right gradients, but netD ran {first.d_passes} times; run it once on real and "
                                  "once on fake, and get both gradients from that one graph.",
                           "backward(inputs=...) sends a loss's gradient only to the tensors you list.")
    if first.backward_calls and first.backward_calls[-1].retain_graph:
        option = "create_graph=True, which retains" if first.backward_calls[-1].create_graph else "retain_graph=True"
        return CheckResult(False, f"Right gradients, but the last backward of your step keeps its graph's buffers "
                                  f"({option}), and no later backward needs them.",
                           "Keep retain_graph=True only on a backward that another backward through the same "
                           "graph follows.")
    peak = _bytes_or_dash(result.peak_graph_only_bytes)
    if single_forward:
        how = f"from one D pass on fake (peak graph-only {peak})"
    else:
        standard = _toy_checker().check(make_step(STANDARD_SETTINGS, _d_loss, _g_loss)).peak_graph_only_bytes
        # 10 % slack: the same step written with other temporaries differs by a few hundred bytes.
        if (result.peak_graph_only_bytes or 0) > 1.1 * (standard or 0):
            return CheckResult(False, f"Right gradients, but the graphs held up to {peak} during your step; the "
                                      f"standard step needs {_bytes_or_dash(standard)}.",
                               "Is a retain_graph=True left that no later backward needs?")
        how = (f"and your graphs held within 10 % of what the standard step's hold (peak graph-only {peak}; "
               f"standard {_bytes_or_dash(standard)})")
    return CheckResult(True, "Both optimizers receive the reference gradients, call after call (from empty .grad, "
                             f"right after another call, and over leftover .grad values), {how}.")


def check_fixed_srgan_step(step: Step) -> CheckResult:
    """Exercise 1: the copied SRGAN step, fixed: no error, right gradients for both networks, no waste.

    The step runs three times in a row at learning rate 0 (from empty ``.grad``, right after itself,
    and with ``.grad`` pre-filled), and at every ``step()`` call each optimizer must hold its
    network's reference gradient. No waste: the last backward must not retain its graph, and the
    graphs may hold at most 10 % more than the standard step's. ``torch.autograd.grad`` is allowed.
    Never raises on a wrong answer. Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=False)


def check_single_forward_step(step: Step) -> CheckResult:
    """Exercise 2: a correct step that runs the discriminator on ``fake`` only once, with ``backward(inputs=...)``.

    Judged like :func:`check_fixed_srgan_step` (three calls, every ``step()`` call's gradients),
    without the memory comparison, and further: ``torch.autograd.grad`` must not be called (it is
    seen however it was imported), and D's first layer may run at most twice (real and fake).
    Never raises on a wrong answer. Used by notebook 03_gan_step.
    """
    return _judge_step(step, single_forward=True)


def _reference_penalty(netD: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor,
                       alpha: torch.Tensor) -> torch.Tensor:
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


_PENALTY_HINT = "Mix the points with alpha, take D's gradient at the mixed points, and average (norm - 1) squared."
_CREATE_GRAPH_HINT = ("retain_graph=True keeps buffers; only create_graph=True records the gradient computation "
                      "itself so it can be differentiated.")


@dataclass
class _PenaltyCall:
    """One call of a learner's penalty function: what it returned or raised, and what it did."""

    penalty: Any
    error: BaseException | None
    backward_calls: list[_BackwardCall]
    problem: str | None  # a side effect on D or on the inputs


def _call_penalty(gradient_penalty: Callable[..., Any], netD: torch.nn.Module, real: torch.Tensor,
                  fake: torch.Tensor, alpha: torch.Tensor) -> _PenaltyCall:
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
    except BaseException as exc:  # noqa: BLE001 - a learner's bug is a verdict, not a crash
        error = exc
    problem = None
    parameters = dict(netD.named_parameters())
    if any(p.grad is not None for p in parameters.values()):
        problem = ("Your function left values in D's .grad (a backward inside it accumulated into D's weights): in "
                   "training they would be added to D's gradient. torch.autograd.grad returns the gradient "
                   "without touching .grad.")
    elif any(not p.requires_grad for p in parameters.values()):
        problem = "Your function switched off requires_grad on D's weights and left it off: D would stop learning."
    elif any(not torch.equal(p.detach(), weights[name]) for name, p in parameters.items()):
        problem = "Your function changed D's weights."
    else:
        changed = [name for name, value in inputs.items()
                   if not torch.equal(value.detach(), {"real": real, "fake": fake, "alpha": alpha}[name])]
        if changed:
            problem = (f"Your function changed {' and '.join(changed)} in place: the caller's tensor no longer "
                       "holds the batch.")
    # Put D back only where the function changed it: restoring equal weights in place would bump
    # their version and break the returned penalty's graph.
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.requires_grad_(True)
            if not torch.equal(parameter, weights[name]):
                parameter.copy_(weights[name])
    netD.zero_grad(set_to_none=True)
    return _PenaltyCall(penalty, error, backward_calls, problem)


def _penalty_problem(call: _PenaltyCall, netD: torch.nn.Module, expected: torch.Tensor,
                     expected_grads: Sequence[torch.Tensor | None]) -> CheckResult | None:
    """What is wrong with one call's penalty, or None when it is right."""
    if call.error is not None:
        hint = ""
        if "does not require grad" in _first_line(call.error):
            hint = ("torch.autograd.grad can only differentiate with respect to a tensor that requires grad: take "
                    "D's gradient with respect to the mixed points, and call .requires_grad_() on them before "
                    "D sees them.")
        return CheckResult(False, f"Your function raised {_first_line(call.error)}", hint)
    if call.problem:
        return CheckResult(False, call.problem)
    penalty = call.penalty
    if not isinstance(penalty, torch.Tensor):
        dropped = " (.item() and float() drop the graph)" if isinstance(penalty, (int, float)) else ""
        return CheckResult(False, f"Return the penalty as a single-number tensor, not a {type(penalty).__name__}"
                                  f"{dropped}.")
    if penalty.numel() != 1:
        return CheckResult(False, f"Return the penalty as a single number (the mean over the batch); your "
                                  f"function returned shape {tuple(penalty.shape)}.", _PENALTY_HINT)
    if not torch.allclose(penalty.detach().float().reshape(()), expected.detach(), rtol=1e-4, atol=1e-6):
        return CheckResult(False, f"The penalty is {float(penalty.detach()):.4f}; expected "
                                  f"{float(expected.detach()):.4f}.", _PENALTY_HINT)
    created = any(backward.create_graph for backward in call.backward_calls)
    if penalty.grad_fn is None:
        if penalty.requires_grad:
            return CheckResult(False, "The value is right, but the penalty is a leaf tensor with no grad_fn, cut "
                                      "off from D's weights (a .detach() or a new tensor made from the value), so "
                                      "adding it to d_loss changes nothing.",
                               "Return the penalty as computed, without .detach(), .data or torch.tensor(...).")
        if not created:
            return CheckResult(False, "The value is right, but the penalty is a constant: no gradient reaches D's "
                                      "weights, so adding it to d_loss changes nothing.", _CREATE_GRAPH_HINT)
        return CheckResult(False, "The value is right, and you used create_graph=True, but the penalty is a "
                                  "constant: something after the gradient cut the graph (.detach(), .data, "
                                  "torch.no_grad()), so no gradient reaches D's weights.",
                           "Compute the penalty from the gradient exactly as autograd returned it.")
    params = list(netD.parameters())
    try:
        got = torch.autograd.grad(penalty, params, allow_unused=True)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the learner's graph, not the check, is broken
        return CheckResult(False, f"The value is right, but the penalty cannot be backpropagated: "
                                  f"{_first_line(exc)}", _CREATE_GRAPH_HINT if not created else "")
    if all(grad is None for grad in got):
        return CheckResult(False, "The value is right and the penalty has a grad_fn, but no path in its graph "
                                  "leads to D's weights, so adding it to d_loss changes nothing for D.",
                           _CREATE_GRAPH_HINT if not created else "")
    for (name, parameter), mine, ref in zip(netD.named_parameters(), got, expected_grads):
        mine = torch.zeros_like(parameter) if mine is None else mine
        ref = torch.zeros_like(parameter) if ref is None else ref
        if not torch.allclose(mine, ref, rtol=1e-4, atol=1e-6):
            return CheckResult(False, f"The value is right, but the penalty's gradient for D's {name} differs "
                                      "from the reference.", _CREATE_GRAPH_HINT if not created else "")
    return None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values, NaN equal to NaN (a deterministic function returns the same twice)."""
    if a.shape != b.shape:
        return False
    try:
        return bool(torch.allclose(a.double(), b.double(), rtol=0.0, atol=0.0, equal_nan=True))
    except (RuntimeError, TypeError):  # complex or other values that do not convert
        return torch.equal(a, b)


def check_gradient_penalty(gradient_penalty: Callable[..., torch.Tensor]) -> CheckResult:
    """Exercise 3: ``gradient_penalty(netD, real, fake, alpha)`` must give D a gradient (WGAN-GP).

    Called twice on copies of a fixed batch: each call must return the reference value as a
    one-number tensor whose gradient for D's weights equals the reference, and leave D (its
    weights, ``requires_grad`` and ``.grad``) and the inputs as they were. Never raises on a wrong
    answer. Used by notebook 03_gan_step.
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
    if (problems[0] is not None and values[0] is not None and values[1] is not None
            and not _same_values(values[0], values[1])):
        return CheckResult(False, "Your function returned two different penalties for the same batch: does it "
                                  "draw its own random numbers instead of using alpha?", _PENALTY_HINT)
    if problems[0] is not None:
        return problems[0]
    if problems[1] is not None:
        message = problems[1].message
        return CheckResult(False, f"Right on the first call, but not on the second: {message[:1].lower()}{message[1:]}",
                           problems[1].hint)
    how = " (create_graph=True)" if any(b.create_graph for b in calls[0].backward_calls) else ""
    return CheckResult(True, "The penalty gives D the right gradient, call after call: the gradient computation "
                             f"itself was recorded{how}.")
