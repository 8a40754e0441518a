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


def split_iterations(recorder: Any) -> Split:
    """The rule that splits ``recorder``'s recording into iterations (see the module's docstring), and the ends."""
    if recorder.by_runs:
        return Split("one iteration per run of the step", tuple(recorder.marks), recorder.start)
    if recorder.marks:
        return Split("by next_iteration()", _to_loop_header(recorder, recorder.marks), recorder.start)
    if recorder.steps and recorder.pending:
        return Split(f"by {recorder.pending[0]}.step(), which never came before the error", (), recorder.start)
    if recorder.steps:
        first: dict[int, int] = {}
        for position, (optimizer, _, _, _) in enumerate(recorder.steps):
            first.setdefault(optimizer, position)
        closing = max(first, key=first.get)  # type: ignore[arg-type]
        ends = [(seq, calls) for optimizer, seq, calls, _ in recorder.steps if optimizer == closing]
        kind = recorder.optimizer_kinds.get(closing, "optimizer")
        line = next(line for optimizer, _, _, line in recorder.steps if optimizer == closing)
        return Split(f"by {kind}.step() at {short(line)}", _to_loop_header(recorder, ends), recorder.start)
    calls = recorder.calls
    if not calls:
        return Split("no backward call and no optimizer step", (), recorder.start)
    first_site = calls[0].site
    ends = [(c.end, c.index + 1) for c, after in zip(calls, calls[1:]) if after.site == first_site]
    return Split(f"at each call of {short(calls[0].line)} (no optimizer step and no next_iteration())",
                 _to_loop_header(recorder, ends), recorder.start)


def _to_loop_header(recorder: Any, ends: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    starts = sorted(recorder.sightings[i] for i in recorder.starts[1:])
    moved = []
    for seq, calls in ends:
        position = bisect.bisect_left(starts, seq)
        limit = recorder.calls[calls].start if calls < len(recorder.calls) else 2 ** 64
        header = position < len(starts) and starts[position] <= limit
        moved.append((starts[position], calls) if header else (seq, calls))
    return tuple(moved)
