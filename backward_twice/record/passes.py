"""Which of the learner's loops is the iteration, and where each of its passes started.

An iteration is one pass of the learner's own loop: the innermost ``for`` or ``while`` of their code that encloses
every backward call and optimizer step (a script's loop, a cell's loop, a ``train()`` method's loop). At each such
event, :meth:`IterationLoop.saw_event` reads the loops enclosing it, frame by frame
(:func:`backward_twice.record.loops.enclosing`, the frames from the event out to the one that entered the watch, only
the loops that start inside the ``with`` block there), and keeps the loops every event so far lies in: the chain,
outermost first. The innermost link is the iteration. A loop that holds only some of one pass's events is dropped before
the others run: where its frame (or a frame between it and the next loop out) calls ``backward``, ``autograd.grad`` or
an optimizer's ``step`` outside it (a critic's inner loop, with the generator's step after it). A loop in a closure an
optimizer's ``step`` calls is never the iteration: its passes hold no step.

Passes come from :class:`backward_twice.record.lines.LineTracer` while it follows the loop
(:meth:`IterationLoop.add_pass`, from its ``on_pass``): the first pass had started before the first event named the
loop, and is read from the tracer's latest pass of that loop in that frame. A line tracer slows every Python call of the
process, so the recorder follows only the first passes that way; after that, :meth:`IterationLoop.saw_event` tells a new
pass at its first event: the values a ``for`` binds changed (``batch``, ``_``), or, for a ``while`` (whose optimizer
steps are events too), the event comes back to a line at or before the last one. Such a pass is dated at the end of
the previous event (what runs between, logging after the step, counts with the new pass). Passes with no event count
too where they can be told: those before the loop's first event (the tracer counted them), and, for a loop that
counts its passes by one (``for i in range(n)``, ``enumerate``), those its counter skipped between two events.
Nothing here reads a tensor; an optimizer's ``step`` is told from a scheduler's by reading the receiver's value (a
name or a plain attribute, never a property).

Used by :mod:`backward_twice.judge.loop_body`, :mod:`backward_twice.record.folds`,
:mod:`backward_twice.record.held`, :mod:`backward_twice.record.pass_stops`,
:mod:`backward_twice.record.recorder` and :mod:`backward_twice.record.stops`.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from backward_twice.record.bound import bound_tokens, same_tokens, skipped_passes
from backward_twice.record.lines import LineTracer
from backward_twice.record.loops import Loop, enclosing, step_calls
from backward_twice.record.optimizers import OPTIMIZERS, plain_value
from backward_twice.record.positions import Frames, Position, StepWindow, frames_between, position_of

__all__ = ["IterationLoop", "Link", "PassStart"]

_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


@dataclass(frozen=True)
class Link:
    """A loop of the chain: its code, the loop, and the frame it runs in (its id: the frame is not kept)."""

    code: types.CodeType
    loop: Loop
    frame: int

    @functools.cached_property  # read at every event: made once, and by the code's id (a code object hashes its
    def key(self) -> tuple[int, int]:  # whole bytecode at every lookup: a script's module, each time)
        return id(self.code), self.loop.header


@dataclass(slots=True)
class PassStart:
    """Where a pass started: the node counter, how many backward calls came before, the recorder's sighting of the
    names there (-1: none), which pass of its loop it is (1-based; a long run's folded passes,
    :mod:`backward_twice.record.folds`, leave gaps in the list), and whether the names were read there."""

    sequence: int
    calls: int
    sighting: int = -1
    number: int = 0
    looked: bool = False  # the recorder read the names here


# Where a loop's frame was at the last event: the frame's id, what its ``for`` bound, the lines from it in. A tuple,
# not an object: one is made at every event.
_Marker = tuple[int, tuple[Any, ...], Position]


# Why no loop splits the run, where the source still shows the loop around the backward calls (the judge reads it)
UNTRACED = "the loop's passes were not traced"
IN_DIFFERENT_LOOPS = "the backward calls lie in different loops"


def _stepped_by_the_learner(frame: types.FrameType | None, is_learners: Callable[[types.CodeType], bool]) -> bool:
    """Whether the learner's code called the optimizer step ``frame`` (torch's own step wrapper) runs in: their
    pretraining step at their script's top level, not a framework's step from inside its loop."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
        frame = frame.f_back
    return frame is not None and is_learners(frame.f_code)


_TORCH = os.path.dirname(torch.__file__) + os.sep  # not torchvision's, beside it
_LOOPLESS_CALLS = 8  # backward calls outside every loop, none inside one yet: then no loop splits the run


@dataclass
class IterationLoop:
    """The chain of loops every event lies in, and the passes of each (see the module's docstring)."""

    is_learners: Callable[[types.CodeType], bool]
    is_optimizer: Callable[[Any], bool]
    chain: list[Link] | None = None
    passes: dict[tuple[int, int], list[PassStart]] = field(default_factory=dict)  # by Link.key
    unusable: str | None = None  # why no loop can split the run (None: one can, or no event came yet)
    past_its_end: bool = False  # the last event came after the loop ended (a backward of the learner's check after it)
    loopless: int = 0  # backward calls outside every loop of the learner's before any inside one (a PINN's boundary
    # term from ``autograd.grad`` before its loop): before the loop, while a later one may yet come in a loop
    _markers: dict[tuple[int, int], _Marker] = field(default_factory=dict)
    _step: StepWindow = field(default_factory=StepWindow)  # the optimizer step the last event ran inside

    @property
    def innermost(self) -> Link | None:
        return self.chain[-1] if self.chain else None

    def told_by_lines(self) -> bool:
        """Whether the iteration's loop tells a new pass by the lines its events come back to (a ``while``, or a
        ``for`` whose names an inner loop rebinds), not by what its ``for`` binds: then every event, an optimizer
        step too, moves its marker (a ``while`` whose inner loop runs the backward calls and whose step follows)."""
        chain = self.chain
        if not chain or self.unusable is not None:
            return False
        loop = chain[-1].loop
        return not loop.targets or loop.shadowed

    def iteration_passes(self) -> list[PassStart]:
        chain = self.chain  # read at every event: no property in between
        return self.passes.get(chain[-1].key, []) if chain and self.unusable is None else []

    def iterations_started(self) -> int:
        """How many passes of the iteration's loop have started (folded ones too)."""
        passes = self.iteration_passes()
        return passes[-1].number if passes else 0

    def _append_after(
        self, key: tuple[int, int], loop: Loop, last: _Marker, now: tuple[int, tuple[Any, ...]], start: PassStart
    ) -> None:
        """Append a pass told at its first event, numbered after those with no event its counter skipped since the
        ``last`` marker (``now``: the frame's id and what the loop binds now)."""
        self._append(key, start)
        if last[0] == now[0]:
            start.number += skipped_passes(loop, last[1], now[1])
        elif loop.from_zero:  # a new call of its function: the passes before this first event there had none
            start.number += skipped_passes(loop, (), now[1])

    def _append(self, key: tuple[int, int], start: PassStart) -> None:
        passes = self.passes.get(key)
        if passes is None:
            passes = self.passes[key] = []
        start.number = passes[-1].number + 1 if passes else 1
        passes.append(start)

    def saw_event(
        self,
        frame: types.FrameType | None,
        boundary: types.FrameType | None,
        boundary_line: int,
        tracer: LineTracer,
        calls: int,
        since: int,
        line: int = 0,
        step: bool = False,
    ) -> bool:
        """An event (a backward call, an optimizer ``step``) ran in ``frame`` (at ``line``, if known: then ``frame`` is
        the learner's): narrow the chain to the loops it lies in; unless the tracer follows the passes, tell whether a
        chain loop began a new pass (dated ``since``: the end of the previous event). True when the iteration's loop
        did: this is the first event of a new iteration. Backward calls and steps of the learner's outside every loop
        before the first inside one are the run's before its loop; a ``step`` a framework called outside every loop of
        the learner's, or many such calls, and no loop splits the run."""
        if self.unusable is not None:
            return False
        past, self.past_its_end = self.past_its_end, False
        settled = None if past else self._settled(frame, boundary, calls, since, tracer.active, line, step)
        if settled is not None:
            return settled
        path = self._path(frame, boundary, boundary_line)
        if past and path:  # back in a loop after an event past the loop's end: the loop runs again (a critic's loop
            self.unusable = IN_DIFFERENT_LOOPS  # in a step a framework calls, the generator's backward after it)
            return False
        links = [link for link, _ in path]
        if self.chain is None:
            if not path:
                self.loopless += 1
                if (step and not _stepped_by_the_learner(frame, self.is_learners)) or self.loopless >= _LOOPLESS_CALLS:
                    self.unusable = "no loop of yours encloses the backward calls"
                return False
            for link in links:
                seen = tracer.latest.get((link.frame, link.loop.header))
                if seen is None:
                    self.unusable = UNTRACED
                    return False
                if seen.count > 1:  # passes with no event came first (a replay buffer filling up): pass 1 began
                    self._append(link.key, PassStart(seen.first, calls))  # there, and the ones between are
                self._append(link.key, PassStart(seen.sequence, calls))  # read as a long run's folded passes
                self.passes[link.key][-1].number = seen.count
            self.chain = links
        else:
            keys = [link.key for link in links]
            common = 0
            while common < min(len(self.chain), len(keys)) and self.chain[common].key == keys[common]:
                common += 1
            if common == 0:
                if not path and self._past_the_loop(frame, boundary):
                    self.past_its_end = True  # a backward after the loop ended (the learner's check, a saliency
                    return False  # map): no pass of it, and its error is no training error
                self.unusable = IN_DIFFERENT_LOOPS
                return False
            self._keep(common)
            self.chain[:] = links[:common]  # the same loops, in the frames they run in now (the next epoch's call)
        self._drop_partial_loops(frame)
        inward, stepping = frames_between(frame, boundary, self.is_learners)
        return self._new_passes(path, inward, calls, since, tracer.active, self._step.within(stepping, step), step)

    def _settled(
        self,
        frame: types.FrameType | None,
        boundary: types.FrameType | None,
        calls: int,
        since: int,
        following: bool,
        line: int = 0,
        step: bool = False,
    ) -> bool | None:
        """Once the tracer stopped following the loop (past its second pass), an event in the iteration loop's own
        frame is read the short way: only that loop's marker (None: the long way, for an event elsewhere). With no
        loop of the chain outside it, a later call of the loop's function counts as its own frame too (a
        ``train_epoch()`` called once per epoch): the long way would find that same single loop."""
        chain = self.chain  # read at every event: the short way is kept short
        if following or not chain:
            return None
        inner = chain[-1]
        code, found = inner.code, frame
        while found is not None and found.f_code is not code and found is not boundary:
            found = found.f_back
        if found is None or found.f_code is not code:
            return None
        if found is not frame or not line:
            line = found.f_lineno  # read once: on a module's frame it scans its line table
        loop = inner.loop
        if not loop.body_first <= line <= loop.body_last:  # loop.holds(line), without a call
            return None
        if len(chain) != 1:
            # a new pass of a loop outside it is a new pass of this one: read those too
            return (
                None if id(found) != inner.frame else self._with_outer_loops(found, boundary, calls, since, following)
            )
        if loop.targets and not loop.shadowed:  # told by what the ``for`` binds (no lines needed): _marked's
            key, bound = inner.key, bound_tokens(found, loop)  # work inline, as it runs at every event of a run
            last = self._markers.get(key)
            self._markers[key] = (id(found), bound, ())
            if last is None or (last[0] == id(found) and same_tokens(last[1], bound)):
                return False
            passes = self.passes.get(key)
            if not passes:
                self._append_after(key, loop, last, (id(found), bound), PassStart(since, calls))
                return True
            number = passes[-1].number + 1  # _append_after's work inline, as this runs at every iteration
            if last[0] == id(found) and loop.counter >= 0:
                number += skipped_passes(loop, last[1], bound)
            passes.append(PassStart(since, calls, -1, number))
            return True
        between, stepping = frames_between(frame, found, self.is_learners)
        inward = [(id(found), line, found.f_lasti), *(f for f in between if f[0] != id(found))]  # its line as read
        within = self._step.within(stepping, step)
        return self._new_passes([(inner, found)], inward, calls, since, following, within, step)

    def _with_outer_loops(
        self, found: types.FrameType, boundary: types.FrameType | None, calls: int, since: int, following: bool
    ) -> bool | None:
        """The short way for a chain of ``for`` loops (an epoch loop, a batch loop): each loop's marker from what it
        binds, its frame found by id from the iteration loop's out. None (the long way) for a ``while`` among them
        or a frame not found."""
        assert self.chain is not None
        if any(not link.loop.targets or link.loop.shadowed for link in self.chain):
            return None
        frames: dict[int, types.FrameType] = {}
        frame: types.FrameType | None = found
        wanted = {link.frame for link in self.chain}
        while frame is not None and len(frames) < len(wanted):
            if id(frame) in wanted:
                frames[id(frame)] = frame
            if frame is boundary:
                break
            frame = frame.f_back
        if len(frames) < len(wanted):
            return None
        return self._new_passes([(link, frames[link.frame]) for link in self.chain], [], calls, since, following)

    def _past_the_loop(self, frame: types.FrameType | None, boundary: types.FrameType | None) -> bool:
        """Whether the chain's outermost loop has ended: its frame has returned, or runs a line past the loop."""
        assert self.chain is not None
        outer = self.chain[0]
        running = next((f for f in _outward(frame, boundary) if id(f) == outer.frame), None)
        return running is None or not outer.loop.header <= running.f_lineno <= outer.loop.body_last

    def _new_passes(
        self,
        path: list[tuple[Link, types.FrameType]],
        inward: Frames,
        calls: int,
        since: int,
        following: bool,
        within: bool = False,
        step: bool = False,
    ) -> bool:
        """Update each chain loop's marker; unless ``following``, a changed one is a new pass (by its position,
        :mod:`backward_twice.record.positions`, where lines tell it; ``within``: in the last event's optimizer step,
        no new one)."""
        inner = self.innermost
        began = outer_began = False  # ``path`` is outermost first
        frames = [frame_id for frame_id, _, _ in inward]
        for link, frame in path:
            if link.key not in self.passes:
                continue
            nested = False
            position: Position = ()  # a ``for`` whose names no inner loop rebinds: told by what it binds
            if not (link.loop.targets and not link.loop.shadowed):
                start = frames.index(id(frame)) if id(frame) in frames else 0
                line = inward[start][1] if id(frame) in frames else frame.f_lineno
                position = position_of(inward, start, step)
                inner_loops = [loop for loop in enclosing(frame.f_code, line) if loop.header > link.loop.header]
                if inner_loops:  # inside a loop nested in this one: at this loop's level, the event is that loop's
                    position, nested = ((inner_loops[0].header, -1),), True  # line
            new = self._marked(link, frame, position, nested, calls, since, following or within)
            if outer_began and not new and not following:  # its enclosing loop went on: this loop began again
                began_again = PassStart(since, calls)
                self._append(link.key, began_again)
                began_again.number += skipped_passes(
                    link.loop, (), self._markers[link.key][1]
                )  # before its first event
                new = True
            outer_began = outer_began or new
            began = began or (new and inner is not None and link.key == inner.key)
        return began

    def _marked(
        self,
        link: Link,
        frame: types.FrameType,
        position: Position,
        nested: bool,
        calls: int,
        since: int,
        following: bool,
    ) -> bool:
        """Set ``link``'s marker to this event; True when, not ``following``, this event began a new pass of it."""
        bound = bound_tokens(frame, link.loop)
        last = self._markers.get(link.key)
        self._markers[link.key] = (id(frame), bound, position)
        if following or last is None:
            return False
        if last[0] != id(frame):
            new = True  # the loop's function was called again: a new pass of it
        elif link.loop.targets and not link.loop.shadowed:
            new = not same_tokens(last[1], bound)
        else:  # a while, or a for whose names an inner loop rebinds: back before the last event's line, or at it
            # again where no inner loop of this one repeats it
            new = position < last[2] or (position == last[2] and not nested)
        if new:
            self._append_after(link.key, link.loop, last, (id(frame), bound), PassStart(since, calls))
        return new

    def _keep(self, count: int) -> None:
        assert self.chain is not None
        for link in self.chain[count:]:
            self.passes.pop(link.key, None)
        del self.chain[count:]

    def _path(
        self, frame: types.FrameType | None, boundary: types.FrameType | None, line: int
    ) -> list[tuple[Link, types.FrameType]]:
        links: list[tuple[Link, types.FrameType]] = []
        while frame is not None:
            code = frame.f_code
            if OPTIMIZERS in code.co_filename:  # inside an optimizer's step (a closure it calls): a pass of a
                links.clear()  # loop there holds no step, so the iteration is a loop further out
            elif code.co_name not in _COMPREHENSIONS and self.is_learners(code):
                loops = enclosing(code, frame.f_lineno)
                if frame is boundary:
                    loops = [loop for loop in loops if loop.header > line]
                links[:0] = [(Link(code, loop, id(frame)), frame) for loop in loops]
            if frame is boundary:
                break
            frame = frame.f_back
        return links

    def _drop_partial_loops(self, frame: types.FrameType | None) -> None:
        """Drop the links inside the outermost link whose pass has a training call outside the next link in (in
        that link's frame, or a frame between them): a pass of a loop inside it is part of an iteration, not one (a
        critic's inner loop; MAML's inner steps, two loops in from the meta step's backward)."""
        chain = self.chain or []
        for index in range(len(chain) - 1):
            if self._calls_outside(frame, chain[index + 1], chain[index]):
                self._keep(index + 1)
                return

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
                    if call.method != "step" or self.is_optimizer(plain_value(frame, call.receiver)):
                        return True
            if id(frame) == outer.frame:
                return False
            frame = frame.f_back
        return False

    def saw_error(self, frames: list[tuple[types.FrameType, int]], calls: int, since: int) -> None:
        """The loop raised outside an event (``frames``: its traceback's frames and lines): a pass of the iteration's
        loop that raised before its first event (a shape error in the forward of a short last batch) is a new pass
        where its ``for`` binds new values since the last event, or, for a ``while``, where it raised before the line
        of the last event. The tracer, while it followed the loop, set the marker at the pass's start: then nothing
        changed."""
        inner = self.innermost
        if inner is None or self.unusable is not None:
            return
        frame, line = next(((f, n) for f, n in frames if id(f) == inner.frame and inner.loop.holds(n)), (None, 0))
        last = self._markers.get(inner.key)
        if frame is None or last is None or last[0] != id(frame):
            return
        bound = bound_tokens(frame, inner.loop)
        if not inner.loop.targets or inner.loop.shadowed:  # a ``while``: raised before the last event's line
            if last[2] and line < last[2][0][0]:
                self._markers[inner.key] = (id(frame), bound, ((line, -1),))
                self._append_after(inner.key, inner.loop, last, (id(frame), bound), PassStart(since, calls))
        elif not same_tokens(last[1], bound):
            self._markers[inner.key] = (id(frame), bound, ())
            self._append_after(inner.key, inner.loop, last, (id(frame), bound), PassStart(since, calls))

    def role(self, frame: types.FrameType, loop: Loop) -> str | None:
        """ "iteration" for the chain's innermost loop, "outer" for another of its loops, None otherwise."""
        if self.unusable is not None or (id(frame.f_code), loop.header) not in self.passes:
            return None
        inner = self.innermost
        return "iteration" if inner is not None and inner.key == (id(frame.f_code), loop.header) else "outer"

    def add_pass(self, frame: types.FrameType, loop: Loop, start: PassStart) -> None:
        """A pass the tracer saw start: the next event's marker starts afresh (it is this pass's, not a new one's),
        or, for a loop told by what its ``for`` binds, from what it binds now (a later pass's event is new, even when
        this pass has none)."""
        key = (id(frame.f_code), loop.header)
        self._append(key, start)
        if loop.targets and not loop.shadowed and not loop.rebound.issuperset(loop.targets):  # else what the body
            # binds: the next event's value is the body's; those it rebinds before its first event are not read yet
            self._markers[key] = (id(frame), bound_tokens(frame, loop, loop.assigned - loop.rebound), ())
        else:
            self._markers.pop(key, None)


def _outward(frame: types.FrameType | None, boundary: types.FrameType | None) -> Iterator[types.FrameType]:
    """``frame`` and its callers, out to ``boundary``."""
    while frame is not None:
        yield frame
        if frame is boundary:
            return
        frame = frame.f_back
