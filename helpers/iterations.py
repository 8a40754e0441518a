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
from dataclasses import dataclass
from typing import Any

from helpers.learner import short

__all__ = ["Split", "split_iterations"]


@dataclass(frozen=True)
class Split:
    """How the run was cut into iterations: the rule in words, and the ends of iterations as (sequence counter,
    calls made before it)."""

    how: str
    ends: tuple[tuple[int, int], ...]
    start: int
    end_sightings: tuple[int, ...] = ()  # the recorder's sighting at each end (its event, or the loop header)

    @property
    def count(self) -> int:
        return len(self.ends)

    def iteration_of_node(self, sequence: int) -> int:
        """1-based iteration that built a node; 0 before the first."""
        if sequence < self.start:
            return 0
        return 1 + bisect.bisect_right([seq for seq, _ in self.ends], sequence)

    def iteration_of_call(self, index: int) -> int:
        return 1 + bisect.bisect_right([calls for _, calls in self.ends], index)

    def iteration_of_sighting(self, sighting: int) -> int:
        """The iteration a look at the names (by its index) belongs to: one at an end opens the next."""
        return 1 + bisect.bisect_right(self.end_sightings, sighting)


def split_iterations(recorder: Any) -> Split:
    """The rule that splits ``recorder``'s recording into iterations (see the module's docstring), and the ends."""
    if recorder.by_runs:
        ends = [(seq, calls, ("mark", i)) for i, (seq, calls) in enumerate(recorder.marks)]
        return Split("one iteration per run of the step", *_to_loop_header(recorder, ends, move=False))
    if recorder.marks:
        ends = [(seq, calls, ("mark", i)) for i, (seq, calls) in enumerate(recorder.marks)]
        return Split("by next_iteration()", *_to_loop_header(recorder, ends))
    if recorder.steps and recorder.pending:
        return Split(f"by {recorder.pending[0]}.step(), which never came before the error", (), recorder.start)
    if recorder.steps:
        first: dict[int, int] = {}
        for position, (optimizer, _, _, _) in enumerate(recorder.steps):
            first.setdefault(optimizer, position)
        closing = max(first, key=first.get)  # type: ignore[arg-type]
        ends = [
            (seq, calls, ("step", i))
            for i, (optimizer, seq, calls, _) in enumerate(recorder.steps)
            if optimizer == closing
        ]
        kind = recorder.optimizer_kinds.get(closing, "optimizer")
        line = next(line for optimizer, _, _, line in recorder.steps if optimizer == closing)
        return Split(f"by {kind}.step() at {short(line)}", *_to_loop_header(recorder, ends))
    calls = recorder.calls
    if not calls:
        return Split("no backward call and no optimizer step", (), recorder.start)
    first_site = calls[0].site
    ends = [(c.end, c.index + 1, ("call", c.index)) for c, after in zip(calls, calls[1:]) if after.site == first_site]
    return Split(
        f"at each call of {short(calls[0].line)} (no optimizer step and no next_iteration())",
        *_to_loop_header(recorder, ends),
    )


def _to_loop_header(
    recorder: Any, ends: list[tuple[int, int, tuple[str, int]]], move: bool = True
) -> tuple[tuple[tuple[int, int], ...], int, tuple[int, ...]]:
    """(ends, start, end sightings): each end moved to the first loop header the tracer saw after its event, if
    that came before the next call (``move``); the sighting kept is the header's, or the event's."""
    starts = recorder.starts[1:]  # sighting indices, in the order they came
    moved, sightings = [], []
    for seq, calls, event in ends:
        sighting = recorder.event_sightings.get(event, len(recorder.sightings))
        position = bisect.bisect_left(starts, sighting)
        limit = recorder.calls[calls].start if calls < len(recorder.calls) else 2**64
        if move and position < len(starts) and recorder.sightings[starts[position]] <= limit:
            seq, sighting = recorder.sightings[starts[position]], starts[position]
        moved.append((seq, calls))
        sightings.append(sighting)
    return tuple(moved), recorder.start, tuple(sightings)
