"""``import backward_twice as bt``: the tool a learner runs on their own training code.

* ``bt.watch()`` around a loop as written (``with bt.watch() as w:``), ``backward-twice watch SCRIPT`` for a script
  and ``%%diagnose`` for a notebook cell (``%load_ext backward_twice``) say which ``retain_graph=True`` can go, which
  tensor carries a graph into the next iteration, and why a backward raised;
* ``bt.diagnose(step)``, ``bt.audit_retain_graph(step)`` and ``bt.find_carried_graph(step)`` run one step of it a
  few times as written, and put back what it changed;
* the instruments a learner wraps around their code: ``bt.SavedTensorMeter`` (the bytes autograd saves) and
  ``bt.draw_graph`` (the graph, drawn with graphviz).

The import is light: torch and the tool. ``draw_graph`` and ``record_saved_tensors`` load graphviz when first asked
for, and ``%load_ext backward_twice`` loads the IPython magic; nothing here imports matplotlib or ipywidgets.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from backward_twice.common.error_kinds import error_kind
from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.steps.audit import audit_retain_graph
from backward_twice.steps.carried import find_carried_graph, stamp_iteration
from backward_twice.steps.diagnose import diagnose
from backward_twice.watcher import watch

if TYPE_CHECKING:  # read at run time by __getattr__ below, so that graphviz loads only with the first drawing
    from backward_twice.instruments.graph import draw_graph, record_saved_tensors

_LAZY = {
    "draw_graph": "backward_twice.instruments.graph",
    "record_saved_tensors": "backward_twice.instruments.graph",
}

__all__ = [
    "SavedTensorMeter",
    "audit_retain_graph",
    "diagnose",
    "draw_graph",
    "error_kind",
    "find_carried_graph",
    "format_bytes",
    "load_ipython_extension",
    "record_saved_tensors",
    "stamp_iteration",
    "watch",
]


def __getattr__(name: str) -> Any:
    """``bt.draw_graph``: its module (which needs graphviz) is imported at the first use, then kept."""
    if name not in _LAZY:
        raise AttributeError(f"module 'backward_twice' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (for tab completion), the lazy ones included, and the module's own dunders."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext backward_twice``: registers ``%%diagnose`` (IPython is imported only now)."""
    from backward_twice.magic import load_ipython_extension as load

    load(ipython)
