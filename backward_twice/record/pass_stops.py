"""Where ``iterations=N`` ends a recorder's run: at the top of pass N+1 of the learner's loop (:func:`stop_here`,
from the line tracer's pass start and, for a loop whose body starts with ``try:``, its header, :func:`at_header`),
and without a loop of theirs, at pass N+1's first backward call, optimizer step or step-function call
(:func:`stop_without_a_loop`). What the stops ride on (a framework's loop asked to end, the step function's next
call, the item the header took) is :mod:`backward_twice.record.stops`.

Used by :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import types
from collections.abc import Sized
from typing import TYPE_CHECKING, Protocol, cast

from backward_twice.record import stops
from backward_twice.record.events import IterationEnd
from backward_twice.record.held import read_at_its_stop
from backward_twice.record.lines import LineTracer
from backward_twice.record.loops import Loop
from backward_twice.record.passes import IterationLoop, PassStart
from backward_twice.record.stops import StopRecording

if TYPE_CHECKING:
    from backward_twice.record.held import Holding

__all__ = ["Stoppable", "at_header", "framework_returned", "stop_due", "stop_here", "stop_without_a_loop"]


class Stoppable(Protocol):
    """What the stops read and set on the recorder (:class:`backward_twice.record.recorder.Recorder`)."""

    off: bool
    iterations: int | None
    stopped: bool
    by_runs: bool
    stop_pass: PassStart | None
    loop: IterationLoop
    creation: LineTracer
    taken: stops.TakenItem
    framework_stop: stops.FrameworkStop
    marks: list[IterationEnd]
    sightings: list[int]
    first_steps: dict[int, int]  # optimizer -> the position of its first step
    step_counts: dict[int, int]
    first_line_calls: int  # backward calls at the first one's line
    first_site: tuple[str, int] | None

    @property
    def calls(self) -> Sized: ...
    def read_at_the_stop(self, frame: types.FrameType, built_before: int | None = None) -> None: ...
    def fail(self, where: str, error: BaseException) -> None: ...


def at_header(recorder: Stoppable, frame: types.FrameType, loop: Loop, sequence: int) -> BaseException | None:
    """The line tracer's ``at_header``, before a pass takes its item: if pass N+1 is next, a loop whose body starts
    with ``try:`` stops here, another keeps what taking the item changes, for its stop (:class:`.TakenItem`)."""
    if recorder.off or recorder.iterations is None or recorder.stopped:
        return None
    try:
        due = recorder.loop.role(frame, loop) == "iteration" and stop_due(recorder)
        if due and loop.starts_with_try:
            return stop_here(recorder, sequence, frame, loop)
        loop_so_far, tracer = recorder.loop, recorder.creation
        if due or stops.next_pass_stops_before_any_event(loop_so_far, tracer, recorder.iterations, frame, loop):
            recorder.taken.keep(frame, loop)
    except Exception as error:
        recorder.fail("the header of your loop", error)
    return None


def stop_due(recorder: Stoppable) -> bool:
    """Whether the loop's next pass is pass N+1."""
    iterations = recorder.iterations
    return iterations is not None and not recorder.stopped and recorder.loop.iterations_started() >= iterations


def stop_here(recorder: Stoppable, sequence: int, frame: types.FrameType, loop: Loop) -> StopRecording:
    """The stop at the top of pass N+1, with pass N+1's item (taken at its header) put back: pass N's state is left."""
    recorder.taken.put_back(frame, loop)
    number = recorder.loop.iterations_started() + 1
    recorder.stopped = True
    recorder.stop_pass = PassStart(sequence, len(recorder.calls), len(recorder.sightings), number)
    recorder.read_at_the_stop(frame)
    return StopRecording(recorder.iterations)


def framework_returned(recorder: Stoppable, frame: types.FrameType | None) -> StopRecording:
    """The stop where a framework's call returns into the learner's code after step N (``frame``: the framework's frame
    that returns; None where its loop went on and called the learner's step again), with what step N left held read
    there first (:func:`.held.read_at_its_stop`)."""
    read_at_its_stop(cast("Holding", recorder), frame)
    return StopRecording(recorder.iterations)


def stop_without_a_loop(
    recorder: Stoppable, site: tuple[str, int] | None, mark: bool = True, frame: types.FrameType | None = None
) -> StopRecording | None:
    """The stop due here, if any (``mark`` False: only whether one is): without a loop of the learner's, at pass
    N+1's first backward (from ``frame``), optimizer step (``site`` None: a closure runs the backward) or step
    function call; by the calls of the first backward's line only where no framework's trainer runs the loop."""
    iterations = recorder.iterations
    if iterations is None or recorder.stopped or recorder.by_runs or recorder.loop.iteration_passes():
        return None
    if recorder.framework_stop.armed:  # asked, the framework ends its loop after this step, or the step's next call
        return None  # stops: the rest of this one (a second optimizer's backward and step) runs, as in a bare run
    ended = len(recorder.marks)  # iterations ended so far by the fallbacks: marks, the closing optimizer's steps
    first_steps = recorder.first_steps
    if not ended and first_steps:
        ended = recorder.step_counts[max(first_steps, key=first_steps.__getitem__)]
    if not ended and len(recorder.calls) and site is not None and not recorder.framework_stop.runs_the_loop(frame):
        ended = recorder.first_line_calls if site == recorder.first_site else 0  # no step, no mark: per first-line call
    recorder.stopped = mark and ended >= iterations
    return StopRecording(iterations) if ended >= iterations else None
