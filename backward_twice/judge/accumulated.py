"""Gradients kept with their graphs while they accumulate: what ``backward(create_graph=True)`` builds into each
weight's ``.grad`` over several passes (micro-batches) before one update, which that update's Hessian-vector product
walks, with the forwards those gradients come from (AdaHessian, gradient accumulation with a second-order optimizer).
Such a walk into an earlier pass's graph is the point of ``create_graph``, not a graph carried by mistake.

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backward_twice.record.recorder import Recorder

__all__ = ["accumulated_gradients"]


def accumulated_gradients(recorder: Recorder, old: list[int], index: int) -> bool:
    """Whether call ``index``, with an optimizer step after it, walks only what was built since the last step before
    it and the last call other than a ``backward(create_graph=True)`` before it (``old``: the sequence numbers it
    walked from earlier passes), with at least one such backward between: the micro-batches of one update, their
    gradients accumulated in ``.grad`` with their graphs for that update's own second derivative (not
    ``autograd.grad``'s, which the learner keeps by name: LiSSA's ``h_estimate``; not a hypergradient's updates
    written in autograd, with no optimizer step)."""
    if not old:
        return False
    last_step = bisect.bisect_right(recorder.steps, index, key=lambda step: step.calls) - 1
    if last_step + 1 >= len(recorder.steps):  # no optimizer step after it: no update these gradients are for (a
        return False  # hypergradient's chained updates, written in autograd, are a carried graph)
    since = recorder.steps[last_step].sequence if last_step >= 0 else -1
    oldest, created = min(old), False
    for earlier in range(index - 1, -1, -1):  # newest first, back to the last step or plain backward
        call = recorder.calls.record(earlier)
        if call is None:  # folded away in a long run: not read
            return False
        if call.end <= since:
            break
        if not call.create_graph or call.function != "backward":  # only backward accumulates into ``.grad``
            since = max(since, call.end)
            break
        created = True
    return created and oldest >= since
