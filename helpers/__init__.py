"""The Backward Twice course: ``import helpers as bt`` gives every name a notebook calls.

The tool a learner runs on their own code is the package :mod:`backward_twice` (``bt.watch``, ``bt.diagnose``, the
saved-tensor meter, the graph drawing); the course builds on it and re-exports the names its notebooks call. The
course's own modules, one per idea: ``display`` (exact byte counts and tables), ``figures`` (PNG charts),
``measure`` (gradients against a reference, timing, the profiler's peak, training state), ``compare``
(training-step patterns measured side by side), ``growth`` (loop bodies measured for bytes and nodes in one run and
for time in another), ``panels`` (what every widget panel shares), ``lab`` (the retain_graph panel), ``checks``
(what every exercise check shares), ``zeroed`` (a step taken on zeroed gradients), ``errors`` (error demos that fail
when the error stops happening) and ``environment`` (the setup line).

``helpers.lessons`` holds what only one notebook uses: ``graph_buffers`` (01), ``multi_loss`` (02),
``gan_step`` (03), ``carried_state`` (04), ``your_training_step`` (05) and ``real_stack`` (06). The course's core
never imports a lesson and lessons never import each other; a helper moves into the core when a second notebook
needs it, and into the tool when a learner uses it on their own code. The tool never imports the course.
``tests/test_architecture.py`` and import-linter keep these rules, and check that ``bt`` exports exactly the names
the notebooks call.

Importing the package loads the tool (which needs torch only) and registers the course's folder with the recorder
as code that is not the learner's; a name of the lessons, the drawings and the panels is imported at its first
use, with matplotlib, ipywidgets or graphviz only then.
"""

import functools
import os
from typing import TYPE_CHECKING, Any

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.record.learner import skip_folder
from backward_twice.steps.audit import audit_retain_graph
from backward_twice.steps.carried import find_carried_graph, stamp_iteration
from backward_twice.steps.diagnose import diagnose
from backward_twice.watcher import watch
from helpers.display import Table
from helpers.environment import describe_environment, seed_everything
from helpers.errors import expect_error

# The course's lessons and checks call backward too: under a watch, their lines are not the learner's.
skip_folder(os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:  # the rest is read at run time by __getattr__, below: each name is imported when a notebook first
    # asks for it, with matplotlib, ipywidgets or graphviz only then
    from backward_twice.instruments.graph import draw_graph, record_saved_tensors
    from helpers.compare import compare_patterns
    from helpers.growth import growth_experiment, reachable_nodes
    from helpers.lab import BackwardLab
    from helpers.lessons.carried_state import (
        CarriedLab,
        check_carried_names,
        check_precomputed_fix,
        check_truncated_bptt,
        jabberwocky,
    )
    from helpers.lessons.gan_step import (
        GanLab,
        GanStepChecker,
        check_fixed_srgan_step,
        check_gradient_penalty,
        check_single_forward_step,
        ring_coverage,
        ring_of_gaussians,
        sample_distance,
        samples_figure,
        training_figure,
    )
    from helpers.lessons.graph_buffers import (
        check_backward_three_times,
        check_predictions,
        check_training_loop,
        operation_table,
    )
    from helpers.lessons.multi_loss import check_backward_both, check_two_loss_loop
    from helpers.lessons.real_stack import best_milliseconds, check_ppo_update, check_sam_step, run_ddp
    from helpers.lessons.your_training_step import check_audit_predictions, gradient_check

__all__ = [
    "BackwardLab",
    "CarriedLab",
    "GanLab",
    "GanStepChecker",
    "SavedTensorMeter",
    "Table",
    "audit_retain_graph",
    "best_milliseconds",
    "check_audit_predictions",
    "check_backward_both",
    "check_backward_three_times",
    "check_carried_names",
    "check_fixed_srgan_step",
    "check_gradient_penalty",
    "check_ppo_update",
    "check_precomputed_fix",
    "check_predictions",
    "check_sam_step",
    "check_single_forward_step",
    "check_training_loop",
    "check_truncated_bptt",
    "check_two_loss_loop",
    "compare_patterns",
    "describe_environment",
    "diagnose",
    "draw_graph",
    "expect_error",
    "find_carried_graph",
    "format_bytes",
    "gradient_check",
    "growth_experiment",
    "jabberwocky",
    "operation_table",
    "reachable_nodes",
    "record_saved_tensors",
    "ring_coverage",
    "ring_of_gaussians",
    "run_ddp",
    "sample_distance",
    "samples_figure",
    "seed_everything",
    "stamp_iteration",
    "training_figure",
    "watch",
]


@functools.cache
def _origins() -> dict[str, str]:
    """Each exported name -> the module it comes from, as the imports above say (read from this file's source,
    once)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("helpers.", "backward_twice."))
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    """``bt.NAME``: the module that defines it is imported now, not when ``helpers`` is (a light import: the tool's
    modules never load matplotlib or ipywidgets, the lessons' do)."""
    if name not in __all__:
        raise AttributeError(f"module 'helpers' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_origins()[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
