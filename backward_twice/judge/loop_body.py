"""Where the learner's loop is and where it reads a carrier: the iteration loop the recorder split the run by, its
body (or, where no loop could split the run, the source's innermost loop around the last backward call), and the spans
of code a carrier may be read in (the loop's body, the code its name was found in, the step).

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

from backward_twice.judge.built import function_span
from backward_twice.record.loops import innermost_loop_body
from backward_twice.record.names import CodeSite
from backward_twice.record.passes import IN_DIFFERENT_LOOPS, UNTRACED, Link
from backward_twice.record.recorder import Recorder

__all__ = ["live_link", "loop_body", "where_read"]


def live_link(recorder: Recorder) -> Link | None:
    """The iteration loop, when the recorder could split the run by its passes (not a loop given up on: backward
    calls in two loops one after the other leave the first as the innermost link)."""
    return recorder.loop.innermost if recorder.loop.unusable is None else None


def loop_body(recorder: Recorder) -> tuple[str, int, int] | None:
    """(file, first line, last line) of the body of the loop whose passes are the iterations; without one the
    recorder could read (backward calls in two loops one after the other, untraced), the source's innermost loop
    around the last backward call, where the run ended; None in a tool's runs of a step or a framework's loop."""
    link = recorder.loop.innermost
    if link is not None and recorder.loop.unusable is None:
        return link.loop.filename, link.loop.body_first, link.loop.body_last
    if recorder.loop.unusable not in (UNTRACED, IN_DIFFERENT_LOOPS) or not len(recorder.calls):
        return None  # a tool's runs of a step, a framework's loop
    filename, line = recorder.calls[len(recorder.calls) - 1].site
    body = innermost_loop_body(filename, line)
    return None if body is None else (filename, *body)


def where_read(recorder: Recorder, frame: CodeSite | None) -> list[tuple[str, int, int]]:
    """Where the learner's code may read a carrier: the loop's body, the code the name was found in (``frame``), the
    step."""
    body = loop_body(recorder)
    spans: list[tuple[str, int, int]] = [] if body is None else [body]
    for where in (recorder.roots_where, frame):  # a step's own code first: what it reads is where a graph comes in
        span = function_span(where) if where is not None else None
        if span is not None:
            spans.append(span)
    return spans
