"""The tool's own trace and profile functions, out of the learner's sight.

While a recorder is on (:func:`hooks_unseen`), ``sys.gettrace()``, ``sys.getprofile()``, ``threading.gettrace()``
and ``threading.getprofile()`` give None where the function set is one of the tool's (a method of a class of
``backward_twice``): what they give under python, as the tool sets one only where none was set. A script that asks
whether a debugger runs (``debugging = sys.gettrace() is not None``, to train one epoch, or to switch its logging
off) takes the path it takes under python. A function the learner set (a debugger, coverage, their own counter) is
given back as it is. The tool's own modules read the real ones (``real_gettrace``, ``real_getprofile``,
``real_thread_gettrace``).

Nested recorders share one replacement; when the last one ends, each original is put back unless the learner's
code replaced it meanwhile (a ``mock.patch``), which is then left as theirs.

Used by :mod:`backward_twice.record.lines`, :mod:`backward_twice.record.past_handlers`,
:mod:`backward_twice.record.recorder` and :mod:`backward_twice.record.stops`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["hooks_unseen", "real_getprofile", "real_gettrace", "real_thread_gettrace"]

real_gettrace: Callable[[], Any] = sys.gettrace
real_getprofile: Callable[[], Any] = sys.getprofile
real_thread_gettrace: Callable[[], Any] | None = getattr(threading, "gettrace", None)  # from Python 3.10

_PACKAGE = __name__.split(".")[0] + "."
_depth = 0
_lock = threading.Lock()
_replaced: list[tuple[types.ModuleType, str, Callable[[], Any], Callable[[], Any]]] = []  # owner, name, real, ours


def _is_the_tools(hook: Any) -> bool:
    function = getattr(hook, "__func__", hook)
    return str(getattr(function, "__module__", None) or "").startswith(_PACKAGE)


def _as_without_the_tool(real: Callable[[], Any], name: str) -> Callable[[], Any]:
    def get() -> Any:
        current = real()
        return None if current is not None and _is_the_tools(current) else current

    get.__name__ = get.__qualname__ = name
    get.__doc__ = real.__doc__
    return get


@contextlib.contextmanager
def hooks_unseen() -> Iterator[None]:
    """While it is entered, the four getters give what they would give without the tool's hooks."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            for owner in (sys, threading):
                for name in ("gettrace", "getprofile"):
                    real = getattr(owner, name, None)
                    if real is not None:
                        ours = _as_without_the_tool(real, name)
                        _replaced.append((owner, name, real, ours))
                        setattr(owner, name, ours)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for owner, name, real, ours in _replaced:
                    if getattr(owner, name, None) is ours:
                        setattr(owner, name, real)
                _replaced.clear()
