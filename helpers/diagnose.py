"""One entry point for "my training step fails or grows": :func:`diagnose` runs the step as written a few times
under the recorder (:func:`helpers.harness.run_step`, everything put back afterwards) and turns what ran into one
prescription, ordered by what to fix first.

* from the one recording come both reports: the graphs a later iteration's backward walks
  (:func:`helpers.carried.carried_report`: what raises at iteration 2, and what makes ``retain_graph=True`` slow
  and then fail) and each ``retain_graph=True``'s verdict, once per source line (:func:`helpers.audit.audit_report`);
* the error a run raised is named by kind ("backward a second time", "in-place version error", "no graph",
  "other"), with the learner's line and the recorder's evidence (which earlier backward freed the buffers);
* the prescription: carried tensors first, then the error when no carried tensor explains it, then the lines
  whose retain can go, the lines whose retain is needed, the notes (``create_graph``), and the graphs a name
  keeps alive that no backward walks (with their bytes). One item per line. The verdict is "Healthy: ..." when
  nothing is carried, nothing raised and no retain can go; otherwise "N things to fix" (and "and M notes" when
  the list holds notes).

The diagnosis holds plain data and the two reports (plain data too): no tensor and no graph. Lines in notebook
cells read as IPython's tracebacks name them ("Cell In[5], line 3: code").

Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README,
"Bring your own training step").
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers.audit import RetainAudit, audit_report
from helpers.carried import CarriedGraphReport, CarriedTensor, carried_report
from helpers.display import format_bytes
from helpers.harness import StepRun, run_step
from helpers.verdicts import CREATE_GRAPH_NOTE

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
        return (
            not self.carried.found
            and self.error is None
            and not any(line.verdict == "can go" for line in self.audit.lines)
        )

    @property
    def verdict(self) -> str:
        if self.healthy:
            return (
                f"Healthy: no graph carried across {self.carried.iterations_run} iterations, no error, "
                f"and no retain_graph=True that can go."
            )
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
            f"<b>{'Fix' if p.to_fix else 'Note'}:</b> {html.escape(p.fix)}</li>"
            for p in self.prescription
        )
        return f"<div><p><b>{html.escape(self.verdict)}</b></p>{error}{f'<ol>{items}</ol>' if items else ''}</div>"


def _prescription(run: StepRun, carried: CarriedGraphReport, audit: RetainAudit) -> list[Prescription]:
    v = run.verdicts
    items: list[Prescription] = []
    # one item per line: an LSTM's line builds h and c, one fix detaches both
    by_line: dict[str, list[CarriedTensor]] = {}
    for f in carried.findings:
        by_line.setdefault(f.created_at, []).append(f)
    for f, *more in by_line.values():
        built = "before the first iteration" if f.iteration is None else f"in iteration {f.iteration}"
        shape = "" if f.shape is None else f" of shape {f.shape}"
        names = [g.name for g in (f, *more) if g.name]
        name = f" ({', '.join(names)})" if names else ""
        items.append(
            Prescription(
                f.created_at,
                f"a tensor{shape}{name} built {built} still carries its graph into iteration "
                f"{f.reached_from} (walked by the backward at {f.used_at}): the second backward through "
                f"it raises, and retain_graph=True only makes each iteration slower until something fails",
                f.fix,
            )
        )
    e = v.error
    if e is not None and not (carried.found and e.kind in ("backward a second time", "in-place version error")):
        evidence = f" ({e.evidence})" if e.evidence else ""
        items.append(Prescription(e.line, f"{e.message}{evidence}", e.fix))
    for line in v.lines:
        if line.verdict == "can go":
            later = " (detach the carried tensor first: this retain only hides it)" if carried.found else ""
            items.append(
                Prescription(
                    line.line, f"retain_graph=True {line.why}", f"remove retain_graph=True at {line.line}{later}"
                )
            )
    for line in v.lines:
        if line.verdict == "needed":
            keep = f"keep retain_graph=True at {line.line}: a later backward goes through these buffers"
            if carried.found and "in iteration" in line.why:  # a later iteration walks them: the carried graph
                keep = (
                    "fix the carried tensor first; as written a later iteration walks what this retain keeps, "
                    "so removing it now raises. Once nothing is carried, run diagnose again: it can likely go"
                )
            items.append(Prescription(line.line, f"retain_graph=True is {line.why}", keep, to_fix=False))
    for line in v.lines:
        if line.verdict.startswith("not a retain"):
            items.append(Prescription(line.line, CREATE_GRAPH_NOTE, line.fix, to_fix=False))
    for note in v.notes:
        if note.held_bytes:
            items.append(
                Prescription(
                    note.built_at,
                    f"{note.name} keeps {format_bytes(note.held_bytes)} of an "
                    f"earlier iteration's graph alive; no backward walks it",
                    f"store {note.name}.detach() (or .item()) if you only log it",
                    to_fix=False,
                )
            )
    return items


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
    random streams and what the step's closure and globals hold are put back afterwards (on CPU copies).

    Used by notebooks 05_your_training_step and 06_real_stack, and by learners on their own training step (README,
    "Bring your own training step")."""
    try:
        run = run_step(step, models, optimizers, iterations, who="diagnose")
    except (TypeError, ValueError) as exc:  # the input checks: raised here, not deep in the harness
        raise type(exc)(str(exc)) from None
    carried, audit = carried_report(run), audit_report(run)
    e = run.verdicts.error
    return Diagnosis(
        None if e is None else e.kind,
        None if e is None else e.message,
        None if e is None else e.line,
        carried,
        audit,
        _prescription(run, carried, audit),
    )
