"""The GAN step lesson (notebook 03_gan_step): a tiny GAN on a ring of Gaussians, and checks that say
what a GAN training step really does.

One module per job: ``data`` (the ring of Gaussians, how close generated points come to it, and
its figures), ``steps`` (steps built from four switches), ``checker`` (a step's gradients against
reference gradients, and its costs), ``panel`` (the GAN step lab), ``watch`` (how the exercise
checks run and watch a learner's code), ``checks`` (exercises 1 and 2: a learner's step) and
``penalty_check`` (exercise 3: a learner's gradient penalty). The names notebook 03 calls are
re-exported here; the others are imported from their module.
"""

from helpers.lessons.gan_step.checker import GanStepChecker
from helpers.lessons.gan_step.checks import check_fixed_srgan_step, check_single_forward_step
from helpers.lessons.gan_step.data import (
    ring_coverage,
    ring_of_gaussians,
    sample_distance,
    samples_figure,
    training_figure,
)
from helpers.lessons.gan_step.panel import GanLab
from helpers.lessons.gan_step.penalty_check import check_gradient_penalty

__all__ = [
    "GanLab",
    "GanStepChecker",
    "check_fixed_srgan_step",
    "check_gradient_penalty",
    "check_single_forward_step",
    "ring_coverage",
    "ring_of_gaussians",
    "sample_distance",
    "samples_figure",
    "training_figure",
]
