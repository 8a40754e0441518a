"""One entry point for "my training step fails or grows": :func:`diagnose` runs both tools on the step and
turns their findings into one prescription, ordered by what to fix first.

* :func:`helpers.carried.find_carried_graph` runs the step a few times and names each tensor that carries an
  iteration's graph into the next (what raises at iteration 2, and what makes ``retain_graph=True`` slow and
  then fail); :func:`helpers.audit.audit_retain_graph` says, per backward call, whether its ``retain_graph=True``
  is needed or can go. Both check the input (their errors are raised again, named ``diagnose``) and put back
  (:class:`helpers.measure.TrainingState`) the models, optimizers, random streams and the tensors the step's
  closure and globals hold (a hidden state the step rebinds), so each of them sees the learner's start;
* the error a run raised is named by kind ("backward a second time", "in-place version error", "no graph",
  "other"), with the learner's line where the audit gives it;
* the prescription: carried tensors first, then the error when no carried tensor explains it, then the
  retains that can go, the retains that are needed, and the notes (``create_graph``, no verdict). The verdict
  is "Healthy: ..." when nothing is carried, nothing raised and no retain can go; otherwise "N things to fix" (and "and M notes" when the list holds notes).

The diagnosis holds plain data and the two reports (plain data too): no tensor and no graph. Lines in notebook
cells read as IPython's tracebacks name them ("Cell In[5], line 3: code").

Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README, "Bring your own
training step").
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers.audit import CREATE_GRAPH_NOTE, RetainAudit, audit_retain_graph
from helpers.carried import CarriedGraphReport, find_carried_graph
from helpers.errors import error_kind
from helpers.verdicts import ERROR_FIXES as _ERROR_FIXES

__all__ = ["Diagnosis", "Prescription", "diagnose"]


@dataclass(frozen=True)
class Prescription:
    """One thing the diagnosis says: the learner's line ("file:line: code"), the problem, the fix, and whether
    it is to fix (``to_fix``; False: a note, e.g. a retain that is needed)."""

    line: str
    problem: str
    fix: str
    to_fix: bool = True

    def describe(self) -> str:
        return f"{self.line}\n     {self.problem}\n     {'Fix' if self.to_fix else 'Note'}: {self.fix}"


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: the error's kind and text (None if no run raised) and the learner's line
    where it was raised (None where the tools do not give it), the two reports, and the prescription."""

    error_kind: str | None
    error: str | None
    error_line: str | None
    carried: CarriedGraphReport
    audit: RetainAudit
    prescription: list[Prescription] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.carried.found and self.error is None and not any(
            c.needed is False for c in self.audit.calls)

    @property
    def verdict(self) -> str:
        if self.healthy:
            return (f"Healthy: no graph carried across {self.carried.iterations_run} iterations, no error, "
                    f"and no retain_graph=True that can go.")
        fixes = sum(1 for p in self.prescription if p.to_fix)
        notes = len(self.prescription) - fixes
        counted = f"{fixes} thing{'' if fixes == 1 else 's'} to fix"
        if notes:  # the numbered list holds the notes too: the header counts both, so they add up
            counted += f" and {notes} note{'' if notes == 1 else 's'}"
        return f"{counted}, in the order below."

    def error_text(self) -> str:
        if self.error is None:
            return ""
        where = self.error_line or f"iteration {self.carried.iterations_run}"
        return f"Error ({self.error_kind}) at {where}: {self.error}"

    def __repr__(self) -> str:
        items = [f"{i}. {p.describe()}" for i, p in enumerate(self.prescription, 1)]
        return "\n".join(line for line in [self.verdict, self.error_text(), *items] if line)

    def _repr_html_(self) -> str:
        error = f"<p>{html.escape(self.error_text())}</p>" if self.error else ""
        items = "".join(
            f"<li><code>{html.escape(p.line)}</code><br>{html.escape(p.problem)}<br>"
            f"<b>{'Fix' if p.to_fix else 'Note'}:</b> {html.escape(p.fix)}</li>" for p in self.prescription)
        return f"<div><p><b>{html.escape(self.verdict)}</b></p>{error}{f'<ol>{items}</ol>' if items else ''}</div>"


def _prescription(carried: CarriedGraphReport, audit: RetainAudit, kind: str | None, error: str | None,
                  error_line: str | None) -> list[Prescription]:
    items, lines = [], {}  # one item per learner's line: the same line builds a carried tensor each iteration
    for f in carried.findings:
        lines.setdefault(f.created_at, []).append(f)
    for line, (f, *more) in lines.items():
        built = "before the first iteration" if f.iteration is None else f"in iteration {f.iteration}"
        again = f" (and again in {len(more)} later iteration(s))" if more else ""
        shape = "" if f.shape is None else f" of shape {f.shape}"
        items.append(Prescription(
            line, f"a tensor{shape} built {built}{again} still carries its graph into iteration "
                  f"{f.reached_from} (used at {f.used_at}): the second backward through it raises, and "
                  f"retain_graph=True only makes each iteration slower until something fails", f.fix))
    explained = carried.found and kind in ("backward a second time", "in-place version error")
    if error is not None and kind is not None and not explained:
        where = error_line or f"(iteration {carried.iterations_run}; no learner's line)"
        items.append(Prescription(where, error, _ERROR_FIXES[kind]))
    calls = audit.calls
    for c in (c for c in calls if c.needed is False):
        later = " (detach the carried tensor first: this retain only hides it)" if carried.found else ""
        items.append(Prescription(c.line, f"retain_graph=True can go: {c.why}",
                                  f"remove retain_graph=True at {c.line}{later}"))
    for c in (c for c in calls if c.needed):
        keep = (f"keep retain_graph=True at {c.line}: a later backward goes through these buffers"
                if audit.error is None else c.fix)  # the audit's own words when the step fails either way
        items.append(Prescription(c.line, f"retain_graph=True is needed: {c.why}", keep, to_fix=False))
    for c in (c for c in calls if c.needed is None and c.retain_graph):
        note, fix = (CREATE_GRAPH_NOTE, c.fix) if c.create_graph else (f"no verdict: {c.why}", c.fix)
        if carried.found and not c.create_graph:  # the carried tensor is what makes the runs differ
            fix = (f"fix the carried tensor first, then run diagnose again to judge retain_graph=True at {c.line} "
                   f"(a retain added to silence the second-time error usually can go then)")
        items.append(Prescription(c.line, note, fix, to_fix=False))
    return items


def diagnose(step: Callable[[], Any],
             models: torch.nn.Module | Iterable[torch.nn.Module] | Mapping[str, torch.nn.Module] = (),
             optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
             iterations: int = 3) -> Diagnosis:
    """Diagnose ``step`` (one training iteration as written, no arguments): run it ``iterations`` times to find
    a graph carried across iterations, audit each ``retain_graph=True``, name the error a run raised by kind,
    and give one prescription ordered by what to fix first, each item with the learner's line and the fix.
    Pass the ``models`` and ``optimizers`` the step trains: they, the random streams and the tensors the
    step's closure and globals hold are put back afterwards.

    Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README, "Bring your own
    training step")."""
    if isinstance(models, Mapping):  # {"D": netD, "G": netG}, as the gradient check takes them
        models = list(models.values())
    try:  # each tool puts back what the step changes, the closure's and globals' tensors included
        audit = audit_retain_graph(step, models, optimizers)  # first: it refuses an optimizer nobody passed
        carried = find_carried_graph(step, iterations, models, optimizers)
    except (TypeError, ValueError) as exc:  # the tools' input checks; the step's own errors are in the reports
        message = str(exc).replace("find_carried_graph", "diagnose").replace("audit_retain_graph", "diagnose")
        raise type(exc)(message if message.startswith("diagnose") else f"diagnose: {message}") from None
    if audit.error is not None:
        error, line = audit.error, audit.error_line
    elif carried.error is not None:
        error, line = carried.error.strip().splitlines()[0], None
    else:
        error, line = None, None
    kind = None if error is None else error_kind(error)
    return Diagnosis(kind, error, line, carried, audit, _prescription(carried, audit, kind, error, line))
