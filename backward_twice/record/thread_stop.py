"""The stop of ``iterations=N`` in a thread other than the one that started the watch: the thread that runs the loop
ends at the top of pass N+1, and the watch's own thread (the script's main thread, waiting for the loop's results on a
queue or in ``join()``) stops there too, so the whole run ends after N passes with the report, as a loop of the main
thread's does. Without this, that thread's loop ended alone and the rest of the script went on: a consumer waiting
for the next loss waited for ever, and no report came.

The main thread is stopped where it waits (given up to a second to take what the last pass handed it), by a signal
sent to it alone (``signal.pthread_kill``), whose handler, set for the watch's time only, raises the stop: a signal
also ends a wait on a lock, which nothing else can. The signal is one no program sends (the last real-time one,
``SIGRTMAX``); a watch started in another thread than the main one, or where the signal cannot be handled, keeps the
old way (that thread ends alone). The handler is put back under a lock the
sender also takes, so no signal comes once the handler is gone (its default would end the process).

Used by :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
import types
from typing import Any

__all__ = ["ThreadStop"]

_SIGNAL: int | None = getattr(signal, "SIGRTMAX", None) if hasattr(signal, "pthread_kill") else None
_GRACE = 1.0  # seconds the stopped thread waits for the main thread to take what the last pass handed it
_WAITS = frozenset({threading.__file__, queue.__file__})  # a thread whose innermost frame is here waits


def _waiting(ident: int) -> bool:
    """Whether thread ``ident`` waits in ``threading`` or ``queue`` (a ``get()``, a ``join()``, an event)."""
    frame = sys._current_frames().get(ident)
    return frame is None or frame.f_code.co_filename in _WAITS


class ThreadStop:
    """Carries a stop raised in another thread to the thread that armed it (the main thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread to stop, while armed
        self._previous: Any = None
        self._stop: BaseException | None = None
        self._sent = False

    def arm(self) -> None:
        """From the main thread, as a watch with ``iterations=N`` starts: its stops in other threads reach it."""
        if _SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.signal(_SIGNAL, self._raise)
        except (ValueError, OSError):  # not the main interpreter, or no such signal here
            return
        self._owner, self._sent = threading.get_ident(), False

    def spread(self, stop: BaseException) -> None:
        """A thread ended with ``stop`` (the watch's ``iterations=N``): stop the armed thread too, once, where it
        waits (for the next item of a queue, in ``join()``), after what the loop's last pass handed it (up to a
        second: a thread that never waits is stopped where it is then)."""
        owner = self._owner
        if owner is None or self._sent or threading.get_ident() == owner:
            return
        deadline = time.monotonic() + _GRACE
        while time.monotonic() < deadline:
            time.sleep(0.01)  # the main thread runs meanwhile: it takes what was handed over, then waits again
            if _waiting(owner):
                break
        with self._lock:
            if self._owner is None or self._sent or threading.get_ident() == self._owner:
                return
            self._stop, self._sent = type(stop)(*stop.args), True
            try:
                signal.pthread_kill(self._owner, _SIGNAL)  # type: ignore[arg-type]  # armed: not None
            except (OSError, ValueError):  # the thread is gone
                self._stop = None

    def disarm(self) -> None:
        """As the watch ends (in the thread that armed it): the learner's own handler of that signal, if any, back."""
        with self._lock:
            if self._owner is None:
                return
            self._owner, self._stop = None, None
            previous = signal.SIG_DFL if self._previous is None else self._previous  # None: set outside Python
            signal.signal(_SIGNAL, previous)  # type: ignore[arg-type]  # armed: not None

    def _raise(self, signum: int, frame: types.FrameType | None) -> None:
        stop, self._stop = self._stop, None
        if stop is not None and self._owner is not None:
            raise stop
