"""Where a node sits in the iteration that built it, and its twin: the node at the same place in iteration 1, whose
lines the tracer logged (a steady loop builds the same nodes in the same order each iteration).

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.notes` and :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backward_twice.record.iterations import Split
    from backward_twice.record.recorder import Recorder

__all__ = ["iteration_1_start", "places", "twin_in_iteration_1"]


def places(split: Split, sequence: int, first: int | None) -> list[tuple[str, int]]:
    """Where a node sits in the iteration that built it: how many nodes that iteration built before it, and after it
    (``first``: where iteration 1 began, when a loop's pass tells). A steady loop builds the same nodes in the same
    order each iteration, so the node a carrier holds sits at the same place in each; iteration 1 may build fewer
    before it (``0.9 * running_mean`` of a tensor with no graph yet builds no node), or fewer after it. None of
    either for a node built before the loop, or where the iteration's ends were folded."""
    built = split.iteration_of_node(sequence)
    ends = {end.iteration: end.sequence for end in split.ends if built - 1 <= end.iteration <= built}
    start = first if built == 1 else ends.get(built - 1) if built else None
    places = [] if start is None else [("from its start", sequence - start)]
    return places + ([("to its end", ends[built] - sequence)] if built and built in ends else [])


def iteration_1_start(recorder: Recorder) -> int | None:
    """The node counter where iteration 1 began, when a loop's pass tells it (a long run's folds keep pass 1)."""
    passes = recorder.loop.iteration_passes()
    return passes[0].sequence if passes and passes[0].number == 1 else None


def twin_in_iteration_1(recorder: Recorder, split: Split, sequence: int) -> int | None:
    """The node at the same place in iteration 1 as node ``sequence`` in its own, later iteration: a steady loop
    builds the same nodes in the same order each iteration, and iteration 1's lines are the ones the tracer logged
    (TD3's actor update every second iteration raises in iteration 2, past the traced pass)."""
    first = iteration_1_start(recorder)
    end = next((end.sequence for end in split.ends if end.iteration == 1), None)
    if first is None or end is None or split.iteration_of_node(sequence) < 2:
        return None
    offset = dict(places(split, sequence, first)).get("from its start")
    return first + offset if offset is not None and first + offset < end else None
