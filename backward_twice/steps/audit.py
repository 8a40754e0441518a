"""Audit a training step's ``retain_graph=True``: which ones can go, which are needed, and what each keeps alive.

:func:`audit_retain_graph` takes one training iteration as the learner wrote it (a function of no arguments),
runs it as written a few times (:func:`backward_twice.steps.harness.run_step`: under the recorder, everything put back
afterwards, on CPU copies) and judges each backward call from what ran (:mod:`backward_twice.judge.verdicts`): a
``retain_graph=True`` is needed when a later backward (in the same run, or a later one: a graph built before the
step) walks a node with saved tensors that it kept; it can go when none does. No run is changed: no retain is
switched off to see what happens.

The report lists the calls of the first run (``.calls``, each with its learner's line, flags, bytes the graph
still held after it, and the verdict of its line) and one verdict per source line over all runs (``.lines``, with
counts: "needed in 1 of 5 runs"), so a line gets one prescription. It holds plain data only: no tensor and no
graph outlives the call. A line in a notebook cell is named as IPython's tracebacks name it ("Cell In[5], line 3:
code", :func:`backward_twice.record.learner.learner_line`).

Used by notebooks 05_your_training_step and 06_real_stack.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from backward_twice.common.units import format_bytes
from backward_twice.judge.verdicts import (
    CREATE_GRAPH_NOTE,
    GOES_WITH_CARRIED,
    GOES_WITH_THE_ERRORS_FIX,
    LineVerdict,
    retain_written_at,
)
from backward_twice.record.learner import short
from backward_twice.steps.harness import StepRun, reported, run_step

__all__ = ["BackwardCall", "RetainAudit", "audit_report", "audit_retain_graph"]


@dataclass(frozen=True)
class BackwardCall:
    """One backward call of the step: its place in the run (0-based), the learner's line ("file:line: code"),
    which function it was, its effective ``retain_graph`` and ``create_graph``, the verdict (``needed``: True,
    False = can go, None = not a retain; ``band_aid``: needed only by a later iteration, through a carried graph),
    the graph-only bytes still held right after it, why, and the fix."""

    index: int
    line: str
    function: str
    retain_graph: bool
    create_graph: bool
    needed: bool | None
    held_after_bytes: int
    why: str
    fix: str
    band_aid: bool = False
    with_the_errors_fix: bool = False  # the band-aid for a stale forward's missing detach (SAC's alpha loss)

    @property
    def verdict(self) -> str:
        if self.band_aid:
            return GOES_WITH_THE_ERRORS_FIX if self.with_the_errors_fix else GOES_WITH_CARRIED
        if self.needed is not None:
            return "needed" if self.needed else "can go"
        if self.retain_graph and not self.create_graph:
            return "cannot tell"
        if self.create_graph:
            return "not a retain (create_graph)" if self.retain_graph else "not a retain (retain_graph=False)"
        return "not a retain"


_BAND_AIDS = (GOES_WITH_CARRIED, GOES_WITH_THE_ERRORS_FIX)


@dataclass(frozen=True)
class RetainAudit:
    """What :func:`audit_retain_graph` found: the step's error as written (its type and the message's first line;
    None if it ran), the first run's backward calls in order, the learner's line where the error was raised, and
    one verdict per source line over all runs (:class:`backward_twice.judge.verdicts.LineVerdict`)."""

    error: str | None
    calls: list[BackwardCall] = field(default_factory=list)
    error_line: str | None = None
    lines: list[LineVerdict] = field(default_factory=list)
    not_put_back: tuple[str, ...] = ()  # what the runs changed that nothing can put back (an iterator moved on)
    caught: bool = False  # a backward raised ``error`` and the step caught it and went on
    problem: str | None = None  # the tool's own failure to judge the runs: then it claims nothing

    def summary(self) -> str:
        if self.problem is not None:
            return self.problem
        retains = [c for c in self.calls if c.needed is not None]
        band_aids = sum(1 for c in retains if c.band_aid)  # needed only through a carried graph: not "needed"
        needed = sum(1 for c in retains if c.needed and not c.band_aid)
        goes = "".join(
            f"{count} go{'es' if count == 1 else ''} with the {fix}, "
            for fix, count in (
                ("carried fix", sum(1 for c in retains if c.band_aid and not c.with_the_errors_fix)),
                ("error's fix", sum(1 for c in retains if c.band_aid and c.with_the_errors_fix)),
            )
            if count
        )
        error = (self.error or "").split(". ")[0].rstrip(".")  # its first sentence: the whole is in ``error``
        failed = (
            ""
            if self.error is None
            else (
                f" As written a backward of the step raises {error} at"
                f" {_short(self.error_line or '?')}, and the step catches it and goes on"
                if self.caught
                else f" As written the step raises {error} at {_short(self.error_line or '?')}"
            )
        )
        return (
            f"{len(self.calls)} backward call(s); {len(retains)} retain_graph=True judged: {needed} needed, {goes}"
            f"{len(retains) - needed - band_aids} can go.{failed}"
        )

    def __repr__(self) -> str:
        rows = [
            f"  {c.index + 1}. {_short(c.line)} | retain_graph={c.retain_graph} | {c.verdict} | "
            f"{format_bytes(c.held_after_bytes)} held after | {c.fix} ({c.why})"
            for c in self.calls
        ]
        lines = [
            f"  {_short(v.line)}: {v.verdict} ({v.runs} run{'s' if v.runs != 1 else ''}, needed in "
            f"{v.needed_runs}). {v.fix}"
            for v in self.lines
        ]
        notes = [f"note: {sentence}" for sentence in self.not_put_back]
        per_line = ["Per line:", *lines] if lines else []
        return "\n".join([f"retain_graph audit: {self.summary()}", *notes, *rows, *per_line])

    def _repr_html_(self) -> str:
        # Left-aligned and wrapped, the why under the fix: the table fits a notebook's column.
        cell = "style='text-align:left;vertical-align:top;padding:2px 10px 2px 0'"
        head = "".join(
            f"<th {cell}>{h}</th>" for h in ("#", "line", "retain_graph", "verdict", "held after", "fix (why)")
        )
        rows = "".join(
            f"<tr><td {cell}>{c.index + 1}</td><td {cell} title='{html.escape(c.line, quote=True)}'>"
            f"<code style='white-space:pre-wrap'>{html.escape(_short(c.line))}</code></td><td {cell}>"
            f"{c.retain_graph}</td><td {cell}><b>{c.verdict}</b></td><td {cell}>{format_bytes(c.held_after_bytes)}"
            f"</td><td {cell}>{html.escape(c.fix)}<br><small>{html.escape(c.why)}</small></td></tr>"
            for c in self.calls
        )
        return (
            f"<div><p><b>retain_graph audit:</b> {html.escape(self.summary())}</p>"
            + "".join(f"<p>note: {html.escape(sentence)}</p>" for sentence in self.not_put_back)
            + f"<table style='border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>"
            f"</table></div>"
        )


def _short(line: str) -> str:
    return short(line)


def audit_report(run: StepRun) -> RetainAudit:
    """The retain verdicts :func:`backward_twice.steps.harness.run_step` saw, as :func:`audit_retain_graph` reports
    them."""
    recorder, v = run.recorder, run.verdicts
    by_line = {line.line: line for line in v.lines}
    first = [c for c in recorder.calls if v.split.iteration_of_call(c.index) == 1]
    calls = []
    for c in first:
        line = by_line.get(retain_written_at(c.line, c.site))
        code = c.line.split(": ", 1)[-1]
        function = (
            "torch.autograd.grad"
            if c.function == "grad"
            else "loss.backward"
            if ".backward(" in code and "autograd.backward" not in code
            else "torch.autograd.backward"
        )
        if c.error is not None:  # no verdict for a call that raised: it never finished
            why, fix, needed = f"it raised {c.error}", "fix the step's error first", None
        elif c.create_graph and not c.retain_graph:  # MAML's inner grad told not to keep the graph it builds from
            walked_again = v.error is not None and v.error.kind == "backward a second time"
            why = "create_graph=True with retain_graph=False: it frees the graph it walked"
            fix = "remove retain_graph=False: a later backward walks it" if walked_again else "nothing to change"
            needed = None
        elif line is None or line.verdict.startswith("not a retain") or not c.retain_graph:  # a line whose retain
            # is an expression, false this call (EWC's ``retain_graph=(i < len(loglikelihoods))`` for the last sample)
            why, fix = (
                (CREATE_GRAPH_NOTE, "nothing to change here")
                if c.create_graph
                else ("it does not retain the graph (retain_graph is off)", "nothing to change")
            )
            needed = None
        else:
            needed = bool(c.needed_by) and not c.create_graph
            why, fix = line.why, line.fix
            if not needed and line.verdict == "needed":  # another call of the line needs its retain, not this one
                why = "no later backward walked the buffers this call kept"
                fix = "the line keeps retain_graph=True for its other call that a later backward needs"
        band_aid = line is not None and line.verdict in _BAND_AIDS and bool(c.needed_by)
        calls.append(
            BackwardCall(
                c.index,
                c.line,
                function,
                c.retain_graph,
                c.create_graph,
                needed,
                c.held_after_bytes,
                why,
                fix,
                band_aid,
                band_aid and line is not None and line.verdict == GOES_WITH_THE_ERRORS_FIX,
            )
        )
    error = None if v.error is None else v.error.message
    raised_at, caught = (None, False) if v.error is None else (v.error.line, v.error.caught)
    return RetainAudit(error, calls, raised_at, list(v.lines), run.not_put_back, caught)


def audit_retain_graph(
    step: Callable[[], Any],
    models: torch.nn.Module | Iterable[torch.nn.Module] = (),
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
    iterations: int = 2,
) -> RetainAudit:
    """Run ``step`` (one training iteration, no arguments) as written ``iterations`` times and say, for every
    ``retain_graph=True``, whether a later backward walks the buffers it kept (needed) or none does (can go), per
    call of the first run and once per source line with counts; with the bytes only the graph still held right
    after each call, why and the fix. Pass the ``models`` and ``optimizers`` the step trains: their state, the
    random streams and what the step's closure and globals hold are put back afterwards.

    Used by notebook 05_your_training_step."""
    try:
        run = run_step(step, models, optimizers, iterations, who="audit_retain_graph")
    except (TypeError, ValueError) as exc:  # the input checks: raised here, not deep in the harness
        raise type(exc)(str(exc)) from None
    return reported(run, step, audit_report, lambda why: RetainAudit(None, not_put_back=run.not_put_back, problem=why))
