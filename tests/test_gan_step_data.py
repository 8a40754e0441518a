"""helpers/lessons/gan_step/data.py: the ring of Gaussians, the distances and coverage measured on it,
and its figures, each against computations made here, independently of the module."""

from __future__ import annotations

import pytest
import torch

from helpers.lessons.gan_step.data import (
    ring_centers,
    ring_coverage,
    ring_of_gaussians,
    sample_distance,
    samples_figure,
    training_figure,
)


def test_ring_of_gaussians_lies_on_the_ring_and_is_reproducible():
    points = ring_of_gaussians(4000, generator=torch.Generator().manual_seed(0))
    assert points.shape == (4000, 2)
    radii = points.norm(dim=1)
    assert abs(float(radii.mean()) - 2.0) < 0.02 and float(radii.std()) < 0.15
    again = ring_of_gaussians(4000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(points, again)
    nearest = torch.cdist(points, ring_centers()).argmin(dim=1)
    counts = torch.bincount(nearest, minlength=8)
    assert counts.min() > 400 and counts.max() < 600  # every mode about 1/8 of the points


def test_ring_centers_are_evenly_spaced():
    centers = ring_centers(modes=4, radius=3.0)
    assert torch.allclose(centers, torch.tensor([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]]), atol=1e-6)
    assert torch.allclose(ring_of_gaussians(5, modes=1, radius=1.0, std=0.0), torch.tensor([[1.0, 0.0]] * 5))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: ring_of_gaussians(0), ValueError),
        (lambda: ring_of_gaussians(2.5), TypeError),
        (lambda: ring_of_gaussians(True), TypeError),
        (lambda: ring_of_gaussians(10, std=-0.1), ValueError),
        (lambda: ring_of_gaussians(10, generator=0), TypeError),
        (lambda: ring_of_gaussians(10, modes=0), ValueError),
        (lambda: ring_of_gaussians(10, radius=0), ValueError),
        (lambda: ring_centers(radius="2"), TypeError),
    ],
)
def test_data_functions_reject_bad_input(call, error):
    with pytest.raises(error):
        call()


def test_sample_distance_is_zero_for_the_same_points_and_grows_with_a_shift():
    points = ring_of_gaussians(500, generator=torch.Generator().manual_seed(0))
    assert sample_distance(points, points) == 0.0
    shifted = points + torch.tensor([0.5, 0.0])
    assert sample_distance(points, shifted) == pytest.approx(sample_distance(shifted, points))
    assert sample_distance(points, points + torch.tensor([1.0, 0.0])) > sample_distance(points, shifted) > 0.2


def test_sample_distance_punishes_missing_modes():
    real = ring_of_gaussians(800, generator=torch.Generator().manual_seed(0))
    one_mode = ring_of_gaussians(800, modes=1, generator=torch.Generator().manual_seed(1))
    assert sample_distance(one_mode, real) > 1.0  # the other 7 modes' real points are far from every sample


@pytest.mark.parametrize(
    "a, error",
    [
        ([[0.0, 0.0]], TypeError),
        (torch.zeros(5, 3), ValueError),
        (torch.zeros(5), ValueError),
        (torch.zeros(0, 2), ValueError),
    ],
)
def test_sample_distance_rejects_bad_input(a, error):
    with pytest.raises(error):
        sample_distance(a, torch.zeros(4, 2))


def test_ring_coverage_counts_modes_and_near_points():
    on_centers = ring_centers().repeat(10, 1)
    full = ring_coverage(on_centers)
    assert (full.modes_covered, full.modes, full.near_fraction) == (8, 8, 1.0)
    assert "8 of 8 modes" in str(full)
    one = ring_coverage(ring_centers()[:1].repeat(20, 1))
    assert one.modes_covered == 1
    blob = ring_coverage(torch.zeros(50, 2))
    assert blob.modes_covered == 0 and blob.near_fraction == 0.0
    with pytest.raises(ValueError):
        ring_coverage(on_centers, std=0)


def test_figures_render_as_png_and_check_their_input():
    real = ring_of_gaussians(100, generator=torch.Generator().manual_seed(0))
    png = samples_figure(real, real * 0.5, title="t").to_png()
    assert png.startswith(b"\x89PNG")
    figure = training_figure(real, real * 0.1, real, [(1.0, 0.5)] * 30)
    assert figure.to_png().startswith(b"\x89PNG")
    assert "after 30 steps" in figure.axes[1].get_title()
    with pytest.raises(ValueError):
        training_figure(real, real, real, [])
    with pytest.raises(ValueError):
        training_figure(real, real, real, [(1.0,)])
    with pytest.raises(TypeError):
        samples_figure("points")
