"""The lesson's toy data, a ring of Gaussians, and its figures.

:func:`ring_of_gaussians` draws the points the GAN learns; :func:`sample_distance` and
:func:`ring_coverage` say how close generated points come to them; :func:`samples_figure` and
:func:`training_figure` draw both clouds (and a training run's loss curves).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from helpers.figures import PngFigure

__all__ = [
    "RingCoverage",
    "ring_centers",
    "ring_coverage",
    "ring_of_gaussians",
    "sample_distance",
    "samples_figure",
    "training_figure",
]


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

    Used by :func:`ring_of_gaussians` and :func:`ring_coverage`.
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
    Pass a ``torch.Generator`` for a sample that does not depend on the global seed.

    Used by notebook 03_gan_step.
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
    far from every generated point. 0 for identical clouds.

    Used by notebook 03_gan_step.
    """
    a, b = _points(a, "a"), _points(b, "b")
    distances = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")  # exact: 0 for equal points
    return float((distances.min(dim=1).values.mean() + distances.min(dim=0).values.mean()) / 2)


@dataclass(frozen=True)
class RingCoverage:
    """How well samples cover the ring: modes with enough samples near them, and the share near any.

    Used by :func:`ring_coverage`.
    """

    modes_covered: int
    modes: int
    near_fraction: float

    def __str__(self) -> str:
        return (
            f"{self.modes_covered} of {self.modes} modes covered, "
            f"{self.near_fraction:.0%} of the samples within 3 std of a centre"
        )


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
    gives :func:`sample_distance` to the real points.

    Used by notebook 03_gan_step.
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
        smooth = [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
        losses.plot(values, color=colour, alpha=0.25, linewidth=0.8)
        losses.plot(smooth, color=colour, label=f"{label} (moving mean)")
    losses.set_xlabel("training step")
    losses.set_ylabel("loss")
    losses.set_title("Losses", fontsize=10)
    losses.legend(fontsize=8)
    losses.grid(alpha=0.3)
    figure.tight_layout()
    return figure
