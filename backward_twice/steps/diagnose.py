"""One entry point for "my training step fails or grows": :func:`diagnose` runs the step as written a few times
under the recorder (:func:`backward_twice.steps.harness.run_step`, everything put back afterwards) and reports what ran
as every way in does (:mod:`backward_twice.report.rendering`), ordered by what to fix first.

* from the one recording come both reports: the graphs a later iteration's backward walks
  (:func:`backward_twice.steps.carried.carried_report`: what raises at iteration 2, and what makes ``retain_graph=True``
  slow and then fail) and each ``retain_graph=True``'s verdict, once per source line
  (:func:`backward_twice.steps.audit.audit_report`);
* the error a run raised is named by kind ("backward a second time", "in-place version error", "no graph",
  "other"), with the learner's line and the recorder's evidence (which earlier backward freed the buffers);
* the report: a graph carried into a later iteration first (with the error it caused and a ``retain_graph=True``
  that only served it), then an error no carried graph explains, the retains that can go, and a name that keeps
  more graphs alive every run; a retain a later backward of the same run needs is evidence, not an item. The
  headline counts the items, or says "healthy".

The diagnosis holds plain data and the two reports (plain data too): no tensor and no graph. Lines in notebook
cells read as IPython's tracebacks name them ("Cell In[5], line 3: code").

Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README,
"Bring your own training step").
"""

from __future__ import annotations

import linecache
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from backward_twice.common.units import plural
from backward_twice.judge.failsafe import could_not_judge
from backward_twice.report.rendering import Item, Report, build_report, render_html, render_text
from backward_twice.steps.audit import RetainAudit, audit_report
from backward_twice.steps.carried import CarriedGraphReport, carried_report
from backward_twice.steps.harness import run_step, step_name

__all__ = ["Diagnosis", "diagnose"]


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: the error's kind and text (None if no run raised) and the learner's line
    where it was raised (None where the tools do not give it), the two reports, and the report every way in shows
    (:mod:`backward_twice.report.rendering`: a headline, then one item per cause, each with the learner's lines, why and
    the fix)."""

    error_kind: str | None
    error: str | None
    error_line: str | None
    carried: CarriedGraphReport
    audit: RetainAudit
    report: Report
    more: str = ".evidence() of this diagnosis shows the evidence"  # in the caller's name for it, if any

    @property
    def items(self) -> tuple[Item, ...]:
        return self.report.items

    @property
    def healthy(self) -> bool:
        return not self.report.items and self.error is None and self.report.stopped_watching is None

    @property
    def verdict(self) -> str:
        return self.report.headline

    def evidence(self) -> str:
        """The diagnosis with its evidence: each run's backward calls, the retains a later backward needs, bytes."""
        return render_text(self.report, verbose=True)

    def __repr__(self) -> str:
        return render_text(self.report, more=self.more)

    def _repr_html_(self) -> str:
        return render_html(self.report)


def diagnose(
    step: Callable[[], Any],
    models: torch.nn.Module | Iterable[torch.nn.Module] | Mapping[str, torch.nn.Module] = (),
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
    iterations: int = 3,
) -> Diagnosis:
    """Diagnose ``step`` (one training iteration as written, no arguments): run it ``iterations`` times as
    written, find the graphs a later iteration walks, judge each ``retain_graph=True`` once per line, name the
    error a run raised by kind, and give one prescription ordered by what to fix first, each item with the
    learner's line and the fix (``iterations=1`` judges one run's retains; a carried graph shows from 2 on). The
    ``models`` and ``optimizers`` the step trains are found from its names (pass any it cannot reach): they, the
    random streams and what the step's closure and globals hold are put back afterwards (on CPU copies), but an
    iterator the step reads from: nothing can put it back, and the report says how far it moved.

    Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README,
    "Bring your own training step")."""
    try:
        run = run_step(step, models, optimizers, iterations, who="diagnose")
    except (TypeError, ValueError) as exc:  # the input checks: raised here, not deep in the harness
        raise type(exc)(str(exc)) from None
    e = run.verdicts.error
    runs_of = step_name(step)
    problem = run.problem  # the harness's own failure to judge the runs, if it had one
    if problem is None:
        try:
            carried, audit = carried_report(run), audit_report(run)
            if run.recorder.loop.iteration_passes():  # the step's own loop around its backward calls: its passes
                built = build_report(run.verdicts, in_runs=f"{plural(run.runs, 'run')} of {runs_of}")  # are the
            else:  # iterations
                built = build_report(run.verdicts, runs_of=runs_of)
        except Exception as error:  # the runs stand, put back; the diagnosis says the tool failed, claims nothing
            problem = could_not_judge(f"the runs of {runs_of}", error)
    if problem is not None:
        carried = CarriedGraphReport((), run.runs, None, run.not_put_back, problem=problem)
        audit = RetainAudit(None, not_put_back=run.not_put_back, problem=problem)
        built = Report(problem, (), (), problem)
    report = replace(built, not_put_back=run.not_put_back)
    return Diagnosis(
        None if e is None else e.kind,
        None if e is None else e.message,
        None if e is None else e.line,
        carried,
        audit,
        report,
        _way_to_the_evidence(sys._getframe(1)),
    )


def _way_to_the_evidence(caller: types.FrameType) -> str:
    """The footer's way to the evidence, in the caller's own name for the diagnosis (``d = bt.diagnose(step)``:
    ``print(d.evidence())``); a diagnosis no name holds is the cell's output in a notebook (``_``)."""
    code = linecache.getline(caller.f_code.co_filename, caller.f_lineno)
    assigned = re.match(r"\s*(\w+)\s*=\s*[\w.]*\bdiagnose\(", code)
    if assigned is not None:
        return f"print({assigned.group(1)}.evidence()) shows the evidence"
    ipython = sys.modules.get("IPython")  # never imported here: only a running shell displays its cells' values
    in_a_shell = ipython is not None and ipython.get_ipython() is not None
    return (
        "print(_.evidence()) shows the evidence" if in_a_shell else ".evidence() of this diagnosis shows the evidence"
    )
