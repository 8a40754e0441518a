"""How a recording is cut into iterations, decided afterwards from the events a :class:`helpers.recorder.Recorder`
kept (so a rule can use what came later: in a GAN, which optimizer steps last in a cycle).

* a step's runs under :func:`helpers.harness.run_step`: one iteration per run;
* the learner's ``next_iteration()`` marks, if there are any;
* else the steps of the optimizer whose first step came last (the generator's, after the critic's five); when
  the loop raised before an optimizer its code names ever stepped, that one's step, which never came;
* else a new iteration at each call of the first backward line.

An iteration ends at its event, or, where the line tracer saw the loop come round to its header before the next
backward call, there (``total += loss`` after ``optimizer.step()`` still belongs to the iteration).

Used by :mod:`helpers.recorder` and :mod:`helpers.verdicts`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helpers.learner import short

if TYPE_CHECKING:
    from helpers.recorder import Recorder

__all__ = ["EventKey", "IterationEnd", "Split", "StepEvent", "split_iterations"]

EventKey = tuple[str, int]  # an event the recorder saw: ("step", "mark" or "call", its index among its kind)


@dataclass(frozen=True)
class IterationEnd:
    """Where an iteration ends: the engine's sequence counter there (nodes numbered below it were built before),
    and how many backward calls were made before it."""

    sequence: int
    calls: int


@dataclass(frozen=True)
class StepEvent:
    """An optimizer step the recorder saw: the optimizer's id, the engine's sequence counter then, how many
    backward calls came before it, and the learner's line that called ``step()``."""

    optimizer: int
    sequence: int
    calls: int
    line: str


@dataclass(frozen=True)
class Split:
    """How the run was cut into iterations: the rule in words, the ends of iterations, and the sequence counter
    when the recording started."""

    how: str
    ends: tuple[IterationEnd, ...]
    start: int
    end_sightings: tuple[int, ...] = ()  # the recorder's sighting at each end (its event, or the loop header)

    @property
    def count(self) -> int:
        return len(self.ends)

    def iteration_of_node(self, sequence: int) -> int:
        """1-based iteration that built a node; 0 before the first."""
        if sequence < self.start:
            return 0
        return 1 + bisect.bisect_right([end.sequence for end in self.ends], sequence)

    def iteration_of_call(self, index: int) -> int:
        return 1 + bisect.bisect_right([end.calls for end in self.ends], index)

    def iteration_of_sighting(self, sighting: int) -> int:
        """The iteration a look at the names (by its index) belongs to: one at an end opens the next."""
        return 1 + bisect.bisect_right(self.end_sightings, sighting)


def split_iterations(recorder: Recorder) -> Split:
    """The rule that splits ``recorder``'s recording into iterations (see the module's docstring), and the ends."""
    if recorder.by_runs:
        marks = [(end, ("mark", i)) for i, end in enumerate(recorder.marks)]
        return _to_loop_header(recorder, "one iteration per run of the step", marks, move=False)
    if recorder.marks:
        marks = [(end, ("mark", i)) for i, end in enumerate(recorder.marks)]
        return _to_loop_header(recorder, "by next_iteration()", marks)
    if recorder.steps and recorder.pending:
        return Split(f"by {recorder.pending[0]}.step(), which never came before the error", (), recorder.start)
    if recorder.steps:
        first: dict[int, int] = {}
        for position, step in enumerate(recorder.steps):
            first.setdefault(step.optimizer, position)
        closing = max(first, key=lambda optimizer: first[optimizer])
        steps = [
            (IterationEnd(step.sequence, step.calls), ("step", i))
            for i, step in enumerate(recorder.steps)
            if step.optimizer == closing
        ]
        kind = recorder.optimizer_kinds.get(closing, "optimizer")
        line = next(step.line for step in recorder.steps if step.optimizer == closing)
        return _to_loop_header(recorder, f"by {kind}.step() at {short(line)}", steps)
    calls = recorder.calls
    if not calls:
        return Split("no backward call and no optimizer step", (), recorder.start)
    first_site = calls[0].site
    repeats = [
        (IterationEnd(c.end, c.index + 1), ("call", c.index))
        for c, after in itertools.pairwise(calls)
        if after.site == first_site
    ]
    return _to_loop_header(
        recorder, f"at each call of {short(calls[0].line)} (no optimizer step and no next_iteration())", repeats
    )


def _to_loop_header(
    recorder: Recorder, how: str, ends: list[tuple[IterationEnd, EventKey]], move: bool = True
) -> Split:
    """The split by rule ``how`` with these ends (each with the event that made it), each moved to the first loop
    header the tracer saw after its event, if that came before the next call (``move``); the sighting kept is the
    header's, or the event's."""
    starts = recorder.starts[1:]  # sighting indices, in the order they came
    moved: list[IterationEnd] = []
    sightings: list[int] = []
    for end, event in ends:
        sighting = recorder.event_sightings.get(event, len(recorder.sightings))
        position = bisect.bisect_left(starts, sighting)
        limit = recorder.calls[end.calls].start if end.calls < len(recorder.calls) else 2**64
        if move and position < len(starts) and recorder.sightings[starts[position]] <= limit:
            end, sighting = IterationEnd(recorder.sightings[starts[position]], end.calls), starts[position]
        moved.append(end)
        sightings.append(sighting)
    return Split(how, tuple(moved), recorder.start, tuple(sightings))
