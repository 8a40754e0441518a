"""How ``iterations=N`` stops a run (:class:`StopRecording`), and where it stops one that no loop of the learner's
splits (a framework's ``fit`` or ``train`` runs the iterations): :class:`StepCallStop` stops it as the learner's
step function is called again after N iterations, before its first line (a Lightning ``training_step`` with manual
optimization: stopped at its backward, the step had already moved the state it keeps on ``self`` one iteration on).

The step function is the learner's function that ran the run's first backward call (not a script's or a cell's top
level, which is never called again). The stop rides on ``sys.setprofile`` from the end of iteration N to that call:
a profile function sees each call, where a trace function would see each line, and the window is one iteration's
tail. Any error of its own switches it off; the recorder's stop at the next backward call or optimizer step stays.
A profiler of the learner's own, already set, is left alone (the stop comes at the backward then).

Used by :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["StepCallStop", "StopRecording"]


class StopRecording(BaseException):
    """Raised at the top of the pass after the N iterations a recorder was told to watch; the watch swallows it.
    Not an Exception: the learner's own ``except Exception`` must not catch it."""


class StepCallStop:
    """The stop at the next call of the learner's step function, armed once iteration N has ended."""

    def __init__(self) -> None:
        self.code: types.CodeType | None = None  # the learner's function that ran the first backward call
        self._stop: Callable[[], BaseException | None] | None = None
        self._previous: Any = None

    def saw_backward(self, learners: types.FrameType | None) -> None:
        """A backward call ran in ``learners`` (the learner's innermost frame): the first one's function is the step."""
        if self.code is None and learners is not None and learners.f_code.co_name != "<module>":
            self.code = learners.f_code

    def arm(self, stop: Callable[[], BaseException | None]) -> None:
        """From now on, the next call of the step function raises what ``stop`` gives (None: no stop is due)."""
        if self.code is None or self._stop is not None:
            return
        self._stop, self._previous = stop, sys.getprofile()
        if self._previous is None:  # a profiler of the learner's own stays theirs
            sys.setprofile(self._profile)
        else:
            self._stop = None

    def disarm(self) -> None:
        if self._stop is not None:
            self._stop = None
            if sys.getprofile() == self._profile:
                sys.setprofile(None)

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code is not self.code:
            return
        stop = self._stop
        self.disarm()
        try:
            raised = stop() if stop is not None else None
        except Exception:  # the recorder's own error: no stop here
            return
        if raised is not None:
            raise raised  # into the learner's step function, before its first line
