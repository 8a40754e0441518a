"""Which of the learner's loops is the iteration, and where each of its passes started.

An iteration is one pass of the learner's own loop: the innermost ``for`` or ``while`` of their code that encloses
every backward call and optimizer step (a script's loop, a cell's loop, a ``train()`` method's loop). At each such
event, :meth:`IterationLoop.saw_event` reads the loops enclosing it, frame by frame (:func:`helpers.loops.enclosing`,
the frames from the event out to the one that entered the watch, only the loops that start inside the ``with``
block there), and keeps the loops every event so far lies in: the chain, outermost first. The innermost link is the
iteration. A loop that holds only some of one pass's events is dropped before the others run: where its frame
(or a frame between it and the next loop out) calls ``backward``, ``autograd.grad`` or an optimizer's ``step``
outside it (a critic's inner loop, with the generator's step after it).

Passes come from :class:`helpers.lines.LineTracer`: :meth:`IterationLoop.pass_started` is its ``on_pass`` for the
chain's loops. The first pass had started before the first event named the loop: it is read from the tracer's
latest pass of that loop in that frame. Nothing here reads a tensor; an optimizer's ``step`` is told from a
scheduler's by reading the receiver's value (a name or a plain attribute, never a property).

Used by :mod:`helpers.recorder`.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from helpers.lines import LineTracer
from helpers.loops import Loop, enclosing, step_calls

__all__ = ["IterationLoop", "Link", "PassStart"]

_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


@dataclass(frozen=True)
class Link:
    """A loop of the chain: its code, the loop, and the frame it runs in (its id: the frame is not kept)."""

    code: types.CodeType
    loop: Loop
    frame: int

    @property
    def key(self) -> tuple[types.CodeType, int]:
        return self.code, self.loop.header


@dataclass(slots=True)
class PassStart:
    """Where a pass started: the node counter, how many backward calls came before, and the recorder's sighting
    of the names there (-1: none)."""

    sequence: int
    calls: int
    sighting: int = -1


@dataclass
class IterationLoop:
    """The chain of loops every event lies in, and the passes of each (see the module's docstring)."""

    is_learners: Callable[[types.CodeType], bool]
    is_optimizer: Callable[[Any], bool]
    chain: list[Link] | None = None
    passes: dict[tuple[types.CodeType, int], list[PassStart]] = field(default_factory=dict)
    unusable: str | None = None  # why no loop can split the run (None: one can, or no event came yet)

    @property
    def innermost(self) -> Link | None:
        return self.chain[-1] if self.chain else None

    def iteration_passes(self) -> list[PassStart]:
        inner = self.innermost
        return self.passes.get(inner.key, []) if inner is not None and self.unusable is None else []

    def saw_event(
        self,
        frame: types.FrameType | None,
        boundary: types.FrameType | None,
        boundary_line: int,
        tracer: LineTracer,
        calls: int,
    ) -> None:
        """An event (a backward call, an optimizer step) ran in ``frame``: narrow the chain to the loops it lies in."""
        if self.unusable is not None:
            return
        path = self._path(frame, boundary, boundary_line)
        if self.chain is None:
            if not path:
                self.unusable = "no loop of yours encloses the backward calls"
                return
            for link in path:
                seen = tracer.latest.get((link.frame, link.loop.header))
                if seen is None:
                    self.unusable = "the loop's passes were not traced"
                    return
                self.passes[link.key] = [PassStart(seen.sequence, calls)]
            self.chain = path
        else:
            keys = [link.key for link in path]
            common = 0
            while common < min(len(self.chain), len(keys)) and self.chain[common].key == keys[common]:
                common += 1
            if common == 0:
                self.unusable = "the backward calls lie in different loops"
                return
            self._keep(common)
        self._drop_partial_loops(frame)

    def _keep(self, count: int) -> None:
        assert self.chain is not None
        for link in self.chain[count:]:
            self.passes.pop(link.key, None)
        del self.chain[count:]

    def _path(self, frame: types.FrameType | None, boundary: types.FrameType | None, line: int) -> list[Link]:
        links: list[Link] = []
        while frame is not None:
            code = frame.f_code
            if code.co_name not in _COMPREHENSIONS and self.is_learners(code):
                loops = enclosing(code, frame.f_lineno)
                if frame is boundary:
                    loops = [loop for loop in loops if loop.header > line]
                links[:0] = [Link(code, loop, id(frame)) for loop in loops]
            if frame is boundary:
                break
            frame = frame.f_back
        return links

    def _drop_partial_loops(self, frame: types.FrameType | None) -> None:
        """Drop the innermost link while its frame, or a frame between it and the next link out, has a
        training call outside it within that link's pass."""
        while self.chain is not None and len(self.chain) >= 2:
            inner, outer = self.chain[-1], self.chain[-2]
            if not self._calls_outside(frame, inner, outer):
                return
            self._keep(len(self.chain) - 1)

    def _calls_outside(self, frame: types.FrameType | None, inner: Link, outer: Link) -> bool:
        seen_inner = False
        while frame is not None:
            if id(frame) == inner.frame:
                seen_inner = True
            if seen_inner and self.is_learners(frame.f_code):
                for call in step_calls(frame.f_code):
                    if call.line == frame.f_lineno:
                        continue  # the line that leads to this event
                    if id(frame) == inner.frame and inner.loop.holds(call.line):
                        continue
                    if id(frame) == outer.frame and not outer.loop.holds(call.line):
                        continue
                    if call.method != "step" or self.is_optimizer(_value(frame, call.receiver)):
                        return True
            if id(frame) == outer.frame:
                return False
            frame = frame.f_back
        return False

    def role(self, frame: types.FrameType, loop: Loop) -> str | None:
        """ "iteration" for the chain's innermost loop, "outer" for another of its loops, None otherwise."""
        if self.unusable is not None or (frame.f_code, loop.header) not in self.passes:
            return None
        inner = self.innermost
        return "iteration" if inner is not None and inner.key == (frame.f_code, loop.header) else "outer"

    def add_pass(self, frame: types.FrameType, loop: Loop, start: PassStart) -> None:
        self.passes[(frame.f_code, loop.header)].append(start)


def _value(frame: types.FrameType, expression: ast.expr | None) -> Any:
    """What a name or a chain of plain attributes (``self.opt_g``) holds in ``frame``, without calling anything."""
    if isinstance(expression, ast.Name):
        names = frame.f_locals
        if expression.id in names:
            return names[expression.id]
        return frame.f_globals.get(expression.id)
    if isinstance(expression, ast.Attribute):
        owner = _value(frame, expression.value)
        attributes = getattr(owner, "__dict__", None)
        return attributes.get(expression.attr) if isinstance(attributes, dict) else None
    return None
