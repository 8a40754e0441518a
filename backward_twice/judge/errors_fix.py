"""A ``retain_graph=True`` only the loop's error needs: the later backward that walks the buffers it kept is the
one that raised the in-place error, through a forward an optimizer step made stale; with the error's fix (that
forward detached in the later loss, or computed again after the step) no backward needs them, and the retain goes
with that fix.

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from backward_twice.record.loops import own_nodes
from backward_twice.record.sources import function_around, parsed

if TYPE_CHECKING:
    from backward_twice.record.recorder import Recorder
    from backward_twice.record.walks import CallRecord

__all__ = ["needed_by_the_detached", "needed_by_the_stale"]


def needed_by_the_detached(recorder: Recorder, needer: int) -> bool:
    """Whether the call ``needer`` is the one that raised an in-place error whose fix detaches the stale forward, and
    with that detach it walks nothing an earlier backward kept."""
    error = recorder.error
    return (
        error is not None
        and error.call == needer
        and error.stale_through is not None
        and error.stale_only_through
        and not error.after_the_loop
    )


def needed_by_the_stale(recorder: Recorder, needer: int) -> bool:
    """Whether the call ``needer`` raised an in-place error by walking a forward a step made stale, whose fix
    computes that forward again after the step, and every node it walked whose buffers an earlier backward kept was
    built since the stale forward's first node: computed again, it walks none of them."""
    error, call = recorder.error, recorder.calls.record(needer)
    stale = error.stale_node if error is not None else None
    return (
        error is not None
        and call is not None
        and error.call == needer
        and stale is not None
        and error.stale_through is None
        and not error.after_the_loop
        and bool(call.walked_kept)
        and (min(call.walked_kept) >= stale or _all_built_by_the_stale_line(recorder, call, stale))
    )


def _all_built_by_the_stale_line(recorder: Recorder, call: CallRecord, stale: int) -> bool:
    """Whether every node ``call`` walked that an earlier backward kept was built under the line of the raising code
    that built the stale node (a GAN's ``d_loss, g_loss = losses(d, g, x)``: G's nodes, built before D's), with no
    step between them (not a total of several passes' losses, each stepped): that line computed again after the step,
    the call walks none of them."""
    line = recorder.creation.call_line_of(stale, call.site)
    oldest, newest = min(call.walked_kept), max(call.walked_kept)
    return (
        line is not None
        and not any(oldest < step.sequence < newest for step in recorder.steps)
        and all(recorder.creation.call_line_of(seq, call.site) == line for seq in call.walked_kept)
        and not _a_backward_after(*call.site)
    )


def _a_backward_after(filename: str, line: int) -> bool:
    """Whether the code around ``line`` calls a backward (``.backward(``, ``autograd.grad(``) after it: a third loss
    that may walk the first forward's graph still, which the raising one never let run (unseen: judged needed)."""
    tree = parsed(filename)
    scope = function_around(tree, line) if tree is not None else None
    return scope is not None and any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("backward", "manual_backward", "grad")
        and node.lineno > line
        for node in own_nodes(scope)
    )
