"""Helpers for the Backward Twice course, kept out of the notebooks so their cells stay short.

One module per idea: ``meter`` (saved-tensor bytes), ``graph`` (drawings), ``errors`` (error
demos that fail when the error stops happening), ``lab`` (the retain_graph widget panel),
``tables`` (live tables), ``compare`` (patterns side by side), ``growth`` (memory over
iterations), ``gan`` (the GAN step lesson: data, gradient checks, its panel), ``figures`` (charts
that render as PNG), ``checks`` (exercise checks) and ``environment`` (the setup line).
Importing the package has no side effects.
"""

from helpers.checks import (
    CheckResult,
    check_backward_both,
    check_backward_three_times,
    check_predictions,
    check_training_loop,
    check_two_loss_loop,
)
from helpers.compare import PatternComparison, PatternResult, compare_patterns, profiler_peak_bytes
from helpers.environment import describe_environment, pick_device, seed_everything
from helpers.errors import ExpectedError, expect_error
from helpers.gan import (
    GanLab,
    GanStepChecker,
    NetworkCheck,
    RingCoverage,
    StepCheck,
    StepComparison,
    StepSettings,
    check_fixed_srgan_step,
    check_gradient_penalty,
    check_single_forward_step,
    make_step,
    ring_centers,
    ring_coverage,
    ring_of_gaussians,
    sample_distance,
    samples_figure,
    training_figure,
)
from helpers.graph import (
    AutogradGraph,
    SavedTensorInfo,
    dot_install_help,
    draw_graph,
    record_saved_tensors,
    saved_tensors_of,
)
from helpers.growth import GrowthResult, growth_experiment
from helpers.lab import BackwardLab
from helpers.meter import MeterReading, SavedTensorMeter, format_bytes
from helpers.tables import Table, operation_table

__all__ = [
    "AutogradGraph",
    "BackwardLab",
    "CheckResult",
    "ExpectedError",
    "GanLab",
    "GanStepChecker",
    "GrowthResult",
    "MeterReading",
    "NetworkCheck",
    "PatternComparison",
    "PatternResult",
    "RingCoverage",
    "SavedTensorInfo",
    "SavedTensorMeter",
    "StepCheck",
    "StepComparison",
    "StepSettings",
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
    "dot_install_help",
    "draw_graph",
    "expect_error",
    "format_bytes",
    "growth_experiment",
    "make_step",
    "operation_table",
    "pick_device",
    "profiler_peak_bytes",
    "record_saved_tensors",
    "ring_centers",
    "ring_coverage",
    "ring_of_gaussians",
    "sample_distance",
    "samples_figure",
    "saved_tensors_of",
    "seed_everything",
    "training_figure",
]
