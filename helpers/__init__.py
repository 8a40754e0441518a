"""Helpers for the Backward Twice course, kept out of the notebooks so their cells stay short.

One module per idea: ``meter`` (saved-tensor bytes), ``graph`` (drawings), ``errors`` (error
demos that fail when the error stops happening), ``lab`` (the retain_graph widget panel),
``tables`` (live tables), ``checks`` (exercise checks) and ``environment`` (the setup line).
Importing the package has no side effects.
"""

from helpers.checks import CheckResult, check_backward_three_times, check_predictions, check_training_loop
from helpers.environment import describe_environment, pick_device, seed_everything
from helpers.errors import ExpectedError, expect_error
from helpers.graph import AutogradGraph, SavedTensorInfo, dot_install_help, draw_graph, record_saved_tensors, saved_tensors_of
from helpers.lab import BackwardLab
from helpers.meter import MeterReading, SavedTensorMeter, format_bytes
from helpers.tables import Table, operation_table

__all__ = [
    "AutogradGraph",
    "BackwardLab",
    "CheckResult",
    "ExpectedError",
    "MeterReading",
    "SavedTensorInfo",
    "SavedTensorMeter",
    "Table",
    "check_backward_three_times",
    "check_predictions",
    "check_training_loop",
    "describe_environment",
    "dot_install_help",
    "draw_graph",
    "expect_error",
    "format_bytes",
    "operation_table",
    "pick_device",
    "record_saved_tensors",
    "saved_tensors_of",
    "seed_everything",
]
