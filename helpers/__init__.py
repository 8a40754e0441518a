"""Helpers for the Backward Twice course: ``import helpers as bt`` gives every name a notebook calls.

The core, one module per idea: ``meter`` (the saved-tensor meter), ``graph`` (drawings of autograd
graphs), ``display`` (byte counts, tables, PNG charts), ``measure`` (gradients against a reference,
timing, the profiler's peak, training state), ``compare`` (training-step patterns measured side by
side), ``panels`` (what every widget panel shares), ``lab`` (the retain_graph panel), ``checks`` (what
every exercise check shares), ``errors`` (error demos that fail when the error stops happening) and
``environment`` (the setup line). ``helpers.lessons`` holds what only one notebook uses: ``graph_buffers`` (01), ``multi_loss``
(02) and ``gan_step`` (03). The core never imports a lesson and lessons never import each other; a
helper moves into the core when a second notebook needs it. ``tests/test_architecture.py`` keeps
these rules, and checks that ``bt`` exports exactly the names the notebooks call.

Importing the package has no side effects.
"""

from helpers.compare import compare_patterns
from helpers.display import Table, format_bytes
from helpers.environment import describe_environment, seed_everything
from helpers.errors import expect_error
from helpers.graph import draw_graph, record_saved_tensors
from helpers.lab import BackwardLab
from helpers.lessons.gan_step import (GanLab, GanStepChecker, check_fixed_srgan_step, check_gradient_penalty,
                                      check_single_forward_step, ring_coverage, ring_of_gaussians, sample_distance,
                                      samples_figure, training_figure)
from helpers.lessons.graph_buffers import (check_backward_three_times, check_predictions, check_training_loop,
                                           operation_table)
from helpers.lessons.multi_loss import check_backward_both, check_two_loss_loop, growth_experiment
from helpers.meter import SavedTensorMeter

__all__ = [
    "BackwardLab",
    "GanLab",
    "GanStepChecker",
    "SavedTensorMeter",
    "Table",
    "check_backward_both",
    "check_backward_three_times",
    "check_fixed_srgan_step",
    "check_gradient_penalty",
    "check_predictions",
    "check_single_forward_step",
    "check_training_loop",
    "check_two_loss_loop",
    "compare_patterns",
    "describe_environment",
    "draw_graph",
    "expect_error",
    "format_bytes",
    "growth_experiment",
    "operation_table",
    "record_saved_tensors",
    "ring_coverage",
    "ring_of_gaussians",
    "sample_distance",
    "samples_figure",
    "seed_everything",
    "training_figure",
]
