"""How a recording is cut into iterations, decided afterwards from what a recorder kept (a :class:`Recording`: so a
rule can use what came later: in a GAN, which optimizer steps last in a cycle).

* a step's runs under :func:`backward_twice.steps.harness.run_step`: one iteration per run;
* the passes of the learner's own loop (:mod:`backward_twice.record.passes`): the innermost loop of theirs that encloses
  every backward call and optimizer step; an iteration starts where its pass starts;
* without one (a framework's loop, a loop the tracer could not follow), the evidence, in this order: the learner's
  ``next_iteration()`` marks; the steps of the optimizer whose first step came last (the generator's, after the
  critic's five), or, when the loop raised before an optimizer its code names ever stepped, that one's step,
  which never came; a new iteration at each call of the first backward line.

Without a loop, an iteration ends at its event.

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.failsafe`, :mod:`backward_twice.judge.notes`,
:mod:`backward_twice.judge.verdicts` and :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from backward_twice.record.events import EventKey, IterationEnd, StepEvent
from backward_twice.record.learner import learner_line_at, short

if TYPE_CHECKING:
    from backward_twice.record.folds import CallLog, StepFolder
    from backward_twice.record.passes import IterationLoop, PassStart

__all__ = ["Recording", "Split", "closing_optimizer", "iteration_start", "split_iterations"]


class Recording(Protocol):
    """What :func:`split_iterations` reads of a recorder (:class:`backward_twice.record.recorder.Recorder`)."""

    @property
    def by_runs(self) -> bool: ...
    @property
    def loop(self) -> IterationLoop: ...
    @property
    def stop_pass(self) -> PassStart | None: ...
    @property
    def marks(self) -> list[IterationEnd]: ...
    @property
    def steps(self) -> list[StepEvent]: ...
    @property
    def step_folder(self) -> StepFolder: ...
    @property
    def optimizer_kinds(self) -> dict[int, str]: ...
    @property
    def pending(self) -> list[str]: ...
    @property
    def sightings(self) -> list[int]: ...
    @property
    def event_sightings(self) -> dict[EventKey, int]: ...
    @property
    def calls(self) -> CallLog: ...
    @property
    def start(self) -> int: ...


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
        return self.ends[-1].iteration if self.ends else 0

    @functools.cached_property
    def _end_sequences(self) -> list[int]:
        return [end.sequence for end in self.ends]

    @functools.cached_property
    def _end_calls(self) -> list[int]:
        return [end.calls for end in self.ends]

    @functools.cached_property
    def _end_sightings(self) -> list[int]:
        return list(self.end_sightings)

    def _iteration_at(self, keys: list[int], value: int, start: int) -> int:
        """The iteration whose end is the first of ``keys`` above ``value`` (``start``: where iteration 1 began).
        Between two kept ends with folded iterations between them, the iteration is read in proportion: a steady
        loop builds as many nodes and calls in each."""
        position = bisect.bisect_right(keys, value)
        if position == len(keys):
            return self.count + 1
        upper = self.ends[position]
        below_iteration, below = (self.ends[position - 1].iteration, keys[position - 1]) if position else (0, start)
        folded = upper.iteration - below_iteration
        if folded <= 1 or keys[position] <= below:
            return upper.iteration
        share = (value - below) * folded // (keys[position] - below)
        return min(upper.iteration, below_iteration + 1 + share)

    def iteration_of_node(self, sequence: int) -> int:
        """1-based iteration that built a node; 0 before the first."""
        if sequence < self.start:
            return 0
        return self._iteration_at(self._end_sequences, sequence, self.start)

    def iteration_of_call(self, index: int) -> int:
        return self._iteration_at(self._end_calls, index, 0)

    def iteration_of_sighting(self, sighting: int) -> int:
        """The iteration a look at the names (by its index) belongs to: one at an end opens the next."""
        return self._iteration_at(self._end_sightings, sighting, 0)


def split_iterations(recorder: Recording) -> Split:
    """The rule that splits ``recorder``'s recording into iterations (see the module's docstring), and the ends."""
    if recorder.by_runs:
        marks = [(IterationEnd(end.sequence, end.calls, i + 1), ("mark", i)) for i, end in enumerate(recorder.marks)]
        return _at_events(recorder, "one iteration per run of the step", marks)
    passes = recorder.loop.iteration_passes()
    if passes:
        ends = [*passes[1:], *([recorder.stop_pass] if recorder.stop_pass is not None else [])]
        loop = recorder.loop.chain[-1].loop if recorder.loop.chain else None
        header = short(learner_line_at(loop.filename, loop.header)) if loop is not None else "(a loop)"
        return Split(
            f"one per pass of your loop at {header}",
            tuple(IterationEnd(p.sequence, p.calls, p.number - 1) for p in ends),
            passes[0].sequence,
            tuple(p.sighting if p.sighting >= 0 else len(recorder.sightings) for p in ends),
        )
    if recorder.marks:
        marks = [(IterationEnd(end.sequence, end.calls, i + 1), ("mark", i)) for i, end in enumerate(recorder.marks)]
        return _at_events(recorder, "by next_iteration()", marks)
    if recorder.steps and recorder.pending:
        return Split(f"by {recorder.pending[0]}.step(), which never came before the error", (), recorder.start)
    if recorder.steps:
        closing = closing_optimizer(recorder.steps, recorder.step_folder.closing)
        closing_steps = _with_what_follows(recorder, [step for step in recorder.steps if step.optimizer == closing])
        kind = recorder.optimizer_kinds.get(closing, "optimizer")
        unread = len(recorder.sightings)  # a step taken while a loop of the learner's split the run
        return Split(
            f"by {kind}.step() at {short(closing_steps[0].line)}",
            tuple(IterationEnd(step.sequence, step.calls, step.number) for step in closing_steps),
            recorder.start,
            tuple(step.sighting if step.sighting >= 0 else unread for step in closing_steps),
        )
    calls = recorder.calls
    if not calls:
        return Split("no backward call and no optimizer step", (), recorder.start)
    first_site = calls[0].site
    repeats = [
        (IterationEnd(c.end, c.index + 1, number), ("call", c.index))
        for number, (c, after) in enumerate(
            ((c, after) for c, after in itertools.pairwise(calls) if after.site == first_site), 1
        )
    ]
    return _at_events(
        recorder, f"at each call of {short(calls[0].line)} (no optimizer step and no next_iteration())", repeats
    )


def _with_what_follows(recorder: Recording, closing_steps: list[StepEvent]) -> list[StepEvent]:
    """The closing steps as iteration ends, an iteration beginning with its forward: the backward calls and steps
    that follow a step before any new node is built are its iteration's (a framework's hook that backpropagates the
    step's own outputs after the framework's optimizer step, Lightning's ``on_train_batch_end``)."""
    ends: list[StepEvent] = []
    merged = 0
    for step in closing_steps:
        if ends and step.sequence == ends[-1].sequence:  # no forward between the two: one iteration, ended here
            ends[-1] = step._replace(number=ends[-1].number)
            merged += 1
        else:
            ends.append(step._replace(number=step.number - merged))
    for position, step in enumerate(ends):
        calls = step.calls
        while (call := recorder.calls.get(calls)) is not None and call.start <= step.sequence:
            calls += 1
        ends[position] = step._replace(calls=calls)
    return ends


def closing_optimizer(steps: list[StepEvent], folded_by: int | None) -> int:
    """The optimizer whose steps end iterations: the one whose first step came last (a GAN's generator, after the
    critic's steps), or the one a long run's older iterations were folded by (``folded_by``)."""
    if folded_by is not None:
        return folded_by
    first: dict[int, int] = {}
    for position, step in enumerate(steps):
        first.setdefault(step.optimizer, position)
    return max(first, key=first.__getitem__)


def _at_events(recorder: Recording, how: str, ends: list[tuple[IterationEnd, EventKey]]) -> Split:
    """The split by rule ``how`` with these ends, each with the event that made it (and the names read there)."""
    sightings = tuple(recorder.event_sightings.get(event, len(recorder.sightings)) for _, event in ends)
    return Split(how, tuple(end for end, _ in ends), recorder.start, sightings)


def iteration_start(recording: Recording) -> int:
    """The sequence counter where the current iteration started, without a loop's passes: the last event that may
    end an iteration (an optimizer step, a mark, or, while there is neither, the end of the last call)."""
    calls = recording.calls
    previous = calls.get(len(calls) - 2)
    step = recording.steps[-1].sequence if recording.steps else 0
    mark = recording.marks[-1].sequence if recording.marks else 0
    return max(recording.start, step, mark, previous.end if previous is not None else 0)
