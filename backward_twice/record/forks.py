"""A process the learner's code forks (a ``DataLoader``'s worker) watches nothing: the recorders it inherited are
switched off in it, and the parent watches.

Used by :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["watching"]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_REGISTERED: list[bool] = []


def watching(recorder: Any) -> None:
    """Switch ``recorder`` off (its ``off`` flag, read at each hook) in any child this process forks from now on."""
    if not _REGISTERED and hasattr(os, "register_at_fork"):  # no fork on Windows
        os.register_at_fork(after_in_child=_forked)  # a flag read at each hook, not a getpid() call at each
        _REGISTERED.append(True)
    _LIVE.add(recorder)


def _forked() -> None:
    for recorder in list(_LIVE):
        recorder.off = True
