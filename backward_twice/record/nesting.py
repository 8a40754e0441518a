"""Recorders inside recorders, and errors inside the watched code that it caught.

A script under ``backward-twice watch`` may run ``bt.watch(...)`` or ``bt.diagnose(step)`` itself (a notebook's
``with bt.watch():`` may wrap a cell that does). The recorders stack (:class:`Nesting`): the innermost records, the
one around it is off, its line tracer too, until the inner one ends, and then follows the learner's code again. Its
report covers what ran outside the inner tool: a run of ``diagnose`` is no iteration of the loop, and its kept
buffers are the tool's, not a ``retain_graph=True`` of the learner's; an inner ``watch(iterations=N)`` needs the
line tracer to stop at the top of pass N+1, and only one can be set.

A backward's error the watched code caught (a ``try:`` around ``loss.backward()`` that skips a bad batch) and went on
past is no error of the loop's: :class:`CaughtErrors` keeps the raising exception's identity (no reference: it would
keep its frames) and tells whether it, or an error it caused, left the watched code, and whether a backward ran
after it.

Used by :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import types
from typing import Any, Protocol

__all__ = ["CaughtErrors", "Nesting"]


class _Pausable(Protocol):
    off: bool
    failure: Any
    nesting: Nesting

    @property
    def creation(self) -> Any: ...

    def fail(self, where: str, error: BaseException) -> None: ...


_ACTIVE: list[Any] = []  # the recorders watching now, innermost last: only that one records


class Nesting:
    """One recorder's place in the stack: the one it made way for, and what it was doing then."""

    def __init__(self) -> None:
        self.outer: _Pausable | None = None
        self.made_way = 0  # how many tools of the learner's own code (a watch, a diagnose) this one made way for
        self._paused: tuple[bool, bool] | None = None  # while an inner one records: off, tracing

    def enter(self, recorder: _Pausable) -> None:
        """``recorder`` starts: the one watching now, if any, makes way."""
        self.outer = _ACTIVE[-1] if _ACTIVE else None
        if self.outer is not None:
            self.outer.nesting.make_way(self.outer)
        _ACTIVE.append(recorder)

    def leave(self, recorder: _Pausable, frame: types.FrameType) -> None:
        """``recorder`` ended, in ``frame``: the one it made way for takes over."""
        if recorder in _ACTIVE:
            _ACTIVE.remove(recorder)
        if self.outer is not None:
            self.outer.nesting.take_over(self.outer, frame)
            self.outer = None

    def make_way(self, recorder: _Pausable) -> None:
        if self._paused is None:
            self._paused = (recorder.off, recorder.creation.active)
            self.made_way += 1
            recorder.off = True
            recorder.creation.stop()

    def take_over(self, recorder: _Pausable, frame: types.FrameType) -> None:
        if self._paused is None:
            return
        (off, tracing), self._paused = self._paused, None
        recorder.off = off or recorder.failure is not None
        if tracing and not recorder.off:
            try:
                recorder.creation.start(frame)
            except Exception as error:
                recorder.fail("following your loop again", error)


class CaughtErrors:
    """Whether the backward's error a recorder kept left the watched code, or the code caught it."""

    def __init__(self) -> None:
        self._raised: tuple[int, type] | None = None  # id and type of the backward's error kept
        self._let_out = False
        self._calls = 0  # the backward calls by then
        self.by_runs = False  # a tool's runs of a step: a run that returned caught it (no later backward needed)
        self.raised_again_as: BaseException | None = None  # another error the code raised from it, that left

    def raised(self, exc: BaseException, calls: int) -> None:
        """A backward raised ``exc``, kept as the recorder's error, with ``calls`` backward calls by then."""
        self._raised, self._calls = (id(exc), type(exc)), calls

    def let_out(self, exc: BaseException) -> None:
        """The learner's code raised ``exc`` out of the watched code (a step's run, the watched block): whether the
        kept error went with it (itself, or as the cause or context of another)."""
        seen: set[int] = set()
        error: BaseException | None = exc
        while self._raised is not None and error is not None and id(error) not in seen:
            if (id(error), type(error)) == self._raised:
                self._let_out = True
                self.raised_again_as = exc if error is not exc else None  # ``raise ValueError(...) from error``
                return
            seen.add(id(error))
            error = error.__cause__ or error.__context__

    def caught(self, calls: int) -> bool:
        """At the watch's end, with ``calls`` backward calls: a backward's error was kept, it never left the watched
        code, and the loop went on past it (a later backward ran: a ``try:`` around the whole loop ends it there)."""
        caught = self._raised is not None and not self._let_out and (calls > self._calls or self.by_runs)
        self._raised, self.raised_again_as = None, None
        return caught
