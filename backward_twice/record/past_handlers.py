"""A stop carried past the learner's handlers that catch everything: a bare ``except:`` or ``except BaseException``
whose ``try`` holds the loop (a whole script in ``try:``, ``try: main()``, a cell's ``try:`` around the loop), or a
``with suppress(BaseException):`` that holds it.

The recorder's stop (:class:`backward_twice.record.stops.StopRecording`) is raised by a trace function, at the top of
pass N+1; an interpreter that sees a trace function raise switches tracing off and clears that frame's trace function,
so nothing of the tracer sees where the stop goes next. :class:`PastHandlers` is armed at that raise with the
learner's frames whose line lies in such a ``try``. From then until the watch ends, a profile function (each call and
return) and a trace function (each line of those frames) look at them: when one is in such a handler, or past the
end of its ``try`` (the handler swallowed the stop and the code went on), the stop is raised there again, before the
line or call runs. Each hook first puts the other back, as the interpreter clears the one that raised. ``finally:``
blocks and ``with`` exits run as they do for any exception; a framework's handler (not the learner's code) is left to
re-raise as it does. Where the learner set a profile function of their own, only the trace function carries it.

Used by :mod:`backward_twice.record.lines`.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backward_twice.record.sources import parsed
from backward_twice.record.unseen import real_getprofile, real_gettrace

__all__ = ["PastHandlers"]


@dataclass(frozen=True)
class _Guard:
    """A learner's frame whose line, when the stop was raised, lay in ``try`` statements with a catching handler (or
    in a ``with`` that suppresses everything)."""

    frame: types.FrameType
    handlers: frozenset[int]  # the lines of those handlers
    end: int  # the last line of the innermost such ``try`` (its ``finally:`` included)

    def caught(self) -> bool:
        line = self.frame.f_lineno
        return line in self.handlers or line > self.end


class PastHandlers:
    """Armed as a stop is raised (:meth:`arm`), off when the watch ends (:meth:`disarm`)."""

    def __init__(self) -> None:
        self._guards: dict[int, _Guard] = {}
        self._stop: BaseException | None = None
        self._profiles = False
        # each hook one bound method: what sys.gettrace() and sys.getprofile() give back is this very object
        self._new_frame_hook, self._line_hook, self._profile_hook = self._new_frame, self._line, self._profile

    def arm(
        self, frame: types.FrameType | None, is_learners: Callable[[types.CodeType], bool], stop: BaseException
    ) -> None:
        """``stop`` is being raised in ``frame`` by a trace function: guard it and the frames around it."""
        while frame is not None:
            if is_learners(frame.f_code):
                guard = _guard(frame)
                if guard is not None:
                    self._guards[id(frame)] = guard
            frame = frame.f_back
        if not self._guards:
            return
        self._stop = stop
        self._profiles = real_getprofile() is None  # a profiler of the learner's own stays theirs
        self._hook_in()

    def disarm(self) -> None:
        if self._stop is None:
            return
        self._stop = None
        if real_gettrace() is self._new_frame_hook:
            sys.settrace(None)
        if self._profiles and real_getprofile() is self._profile_hook:
            sys.setprofile(None)
        for guard in self._guards.values():
            guard.frame.f_trace = None
        self._guards.clear()  # frames hold their variables: none is kept past the watch

    def _hook_in(self) -> None:
        if self._profiles and real_getprofile() is None:
            sys.setprofile(self._profile_hook)
        if real_gettrace() is None:
            for guard in self._guards.values():
                guard.frame.f_trace = self._line_hook
            sys.settrace(self._new_frame_hook)  # a frame's own trace function is called only while one is set

    def _raise_if_caught(self, frame: types.FrameType | None) -> None:
        guard = None if frame is None else self._guards.get(id(frame))
        if guard is not None and guard.frame is frame and self._stop is not None and guard.caught():
            self._hook_in()
            raise self._stop

    def _new_frame(self, frame: types.FrameType, event: str, arg: Any) -> None:
        return None

    def _line(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self._raise_if_caught(frame)
        return self._line_hook

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event in ("call", "return"):
            self._raise_if_caught(frame.f_back if event == "call" else frame)
        else:  # c_call, c_return, c_exception: the frame that calls a builtin
            self._raise_if_caught(frame)
        if self._stop is not None and real_gettrace() is None:
            self._hook_in()  # the trace function raised once: trace again


def _guard(frame: types.FrameType) -> _Guard | None:
    tree = parsed(frame.f_code.co_filename)
    if tree is None:
        return None
    line = frame.f_lineno
    handlers: set[int] = set()
    innermost: ast.Try | ast.With | None = None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Try, ast.With)) or not node.body:
            continue
        if not node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
            continue
        if isinstance(node, ast.With):  # ``with suppress(BaseException):`` swallows it in its exit: no handler line
            catching = any(_suppresses_everything(item.context_expr) for item in node.items)
        else:
            caught = [h for h in node.handlers if _catches_everything(h.type)]
            for handler in caught:
                handlers.update(range(handler.lineno, (handler.end_lineno or handler.lineno) + 1))
            catching = bool(caught)
        if catching and (innermost is None or node.lineno > innermost.lineno):
            innermost = node
    if innermost is None:
        return None
    return _Guard(frame, frozenset(handlers), innermost.end_lineno or innermost.lineno)


def _suppresses_everything(manager: ast.expr) -> bool:
    """``suppress(BaseException)`` (``contextlib.suppress``, by any spelling of the name) among its types."""
    if not isinstance(manager, ast.Call):
        return False
    called = manager.func
    named = called.attr if isinstance(called, ast.Attribute) else called.id if isinstance(called, ast.Name) else None
    return named == "suppress" and any(_catches_everything(given) for given in manager.args)


def _catches_everything(caught: ast.expr | None) -> bool:
    """``except:``, ``except BaseException``, or a tuple holding it: a handler the stop (a BaseException) enters."""
    if caught is None:
        return True
    if isinstance(caught, ast.Tuple):
        return any(_catches_everything(element) for element in caught.elts)
    named = caught.attr if isinstance(caught, ast.Attribute) else caught.id if isinstance(caught, ast.Name) else None
    return named == "BaseException"
