"""``with bt.watch() as w:`` around the learner's own loop: the loop runs as written, and afterwards ``w`` shows
what the recorder saw, judged (:mod:`helpers.verdicts`): in a notebook as HTML, printed as text, and as JSON for
``backward-twice watch --json``.

The loop is not changed: no re-run, no copy of parameters, gradients or optimizer state. An error the loop raises
goes on up (the diagnosis names it); ``watch(iterations=N)`` ends the block quietly once N iterations ended. A loop
without an optimizer (a hand-written update) marks its iterations with ``w.next_iteration()``; otherwise the
report says how it split them.

Used by notebook 05_your_training_step, and by :mod:`helpers.cli`. ``backward-twice watch SCRIPT``
runs it on a script.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

from helpers.display import format_bytes
from helpers.learner import short
from helpers.recorder import Recorder, StopRecording
from helpers.verdicts import Verdicts, judge

__all__ = ["Watch", "render_text", "verdicts_json", "watch"]


class Watch:
    """What :func:`watch` returns: the recorder while the block runs, the diagnosis (``.verdicts``) after it."""

    def __init__(self, iterations: int | None = None) -> None:
        self.recorder = Recorder(iterations)
        self._verdicts: Verdicts | None = None

    def __enter__(self) -> Watch:
        self._verdicts = None
        self.recorder.__enter__()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        self.recorder.__exit__(kind, exc, tb)
        self._verdicts = judge(self.recorder)
        return isinstance(exc, StopRecording)

    def next_iteration(self) -> None:
        """End an iteration here (for a loop with no optimizer, or a hand-written update)."""
        self.recorder.next_iteration()

    @property
    def verdicts(self) -> Verdicts:
        return self._verdicts if self._verdicts is not None else judge(self.recorder)

    @property
    def healthy(self) -> bool:
        v = self.verdicts
        return v.error is None and not v.carried and not any(line.verdict == "can go" for line in v.lines)

    def to_json(self) -> dict[str, Any]:
        return verdicts_json(self.verdicts)

    def __str__(self) -> str:
        return render_text(self.verdicts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return render_html(self.verdicts)


def watch(iterations: int | None = None) -> Watch:
    """Watch the loop inside ``with watch() as w:`` as it runs, unchanged: every backward and
    ``torch.autograd.grad`` call with the learner's line, what each walks, the bytes the graph still holds, the
    iterations (optimizer steps, or ``w.next_iteration()``), and the error, if one rises (it is not caught).
    ``iterations``: end the block quietly after that many iterations. Afterwards ``w`` shows one verdict per
    line: which ``retain_graph=True`` are needed, which graphs a later iteration walks (carried), what keeps a
    graph alive that no backward walks, and the error by kind, each with the fix in your own variable names.

    Used by notebook 05_your_training_step."""
    return Watch(iterations)


def _headline(v: Verdicts) -> str:
    fixes = (
        len(v.carried)
        + sum(1 for line in v.lines if line.verdict == "can go")
        + (1 if v.error is not None and not v.carried else 0)
    )
    iterations = f"{v.iterations_run} iteration{'s' if v.iterations_run != 1 else ''}"
    calls = f"{v.calls} backward call{'s' if v.calls != 1 else ''}"
    stopped = ", then stopped as asked" if v.stopped_after is not None else ""
    watched = f"Watched {iterations} ({v.split.how}){stopped}, {calls}."
    if not fixes:
        return f"{watched} Healthy: no graph carried, no error, and no retain_graph=True that can go."
    return f"{watched} {fixes} thing{'s' if fixes != 1 else ''} to fix."


@dataclass(frozen=True)
class _Item:
    """One thing to look at: the learner's line (or name and line), why, and the fix (or "Keep: ...")."""

    what: str
    why: str
    fix: str


@dataclass(frozen=True)
class _Section:
    """A titled group of the report's items ("Graphs carried into a later iteration")."""

    title: str
    items: tuple[_Item, ...]


def _sections(v: Verdicts) -> list[_Section]:
    """The report's sections in the order to fix them."""
    sections = []
    if v.error is not None:
        e = v.error
        why = e.message + (f" Evidence: {e.evidence}." if e.evidence else "")
        error = _Item(short(e.line), why, f"Fix: {e.fix}")
        sections.append(_Section(f"Error ({e.kind}) in iteration {e.iteration}", (error,)))
    if v.carried:
        items = []
        for c in v.carried:
            built = "before the first iteration" if c.iteration is None else f"in iteration {c.iteration}"
            name = c.name or "a tensor"
            times = f" ({c.times} iterations walked it)" if c.times > 1 else ""
            items.append(
                _Item(
                    f"{name}: {short(c.built_at)}",
                    f"built {built}, walked by the backward of iteration {c.reached_from} at {short(c.used_at)}{times}",
                    f"Fix: {c.fix}",
                )
            )
        sections.append(_Section("Graphs carried into a later iteration", tuple(items)))
    if v.lines:
        items = []
        for line in v.lines:
            keep = line.verdict != "can go"
            fix = f"{line.fix} at {short(line.line)}" if line.fix == "remove retain_graph=True" else line.fix
            items.append(_Item(short(line.line), line.why, f"{'Keep' if keep else 'Fix'}: {fix}"))
        sections.append(_Section("retain_graph=True, one verdict per line", tuple(items)))
    heavy = [n for n in v.notes if n.held_bytes]
    if heavy:
        notes = tuple(
            _Item(
                f"{n.name}: {short(n.built_at)}",
                f"keeps {format_bytes(n.held_bytes)} of an earlier iteration's graph alive; no backward walks it",
                "Note: not an error; keep .detach() or .item() if you only log it",
            )
            for n in heavy
        )
        sections.append(_Section("Notes", notes))
    return sections


def _light_notes(v: Verdicts) -> str:
    """The names that hold an earlier iteration's graph whose buffers are already freed, in one line."""
    light = [n.name for n in v.notes if not n.held_bytes]
    return (
        f"Also held into the next iteration, with no saved tensors left (harmless): {', '.join(light)}."
        if light
        else ""
    )


def render_text(v: Verdicts) -> str:
    out = [_headline(v)]
    for section in _sections(v):
        out.append(f"{section.title}:")
        for i, item in enumerate(section.items, 1):
            out.extend([f"  {i}. {item.what}", f"     {item.why}", f"     {item.fix}"])
    return "\n".join([*out, _light_notes(v)] if _light_notes(v) else out)


def render_html(v: Verdicts) -> str:
    parts = [f"<div><p><b>{html.escape(_headline(v))}</b></p>"]
    for section in _sections(v):
        rows = "".join(
            f"<li><code>{html.escape(item.what)}</code><br>{html.escape(item.why)}<br><b>{html.escape(item.fix)}</b></li>"
            for item in section.items
        )
        parts.append(f"<p>{html.escape(section.title)}:</p><ol>{rows}</ol>")
    if _light_notes(v):
        parts.append(f"<p><small>{html.escape(_light_notes(v))}</small></p>")
    return "".join(parts) + "</div>"


def verdicts_json(v: Verdicts) -> dict[str, Any]:
    e = v.error
    return {
        "iterations": v.iterations_run,
        "split": v.split.how,
        "calls": v.calls,
        "error": None
        if e is None
        else {
            "kind": e.kind,
            "message": e.message,
            "line": e.line,
            "iteration": e.iteration,
            "evidence": e.evidence,
            "fix": e.fix,
        },
        "carried": [
            {
                "variable": c.name,
                "built_at": c.built_at,
                "iteration": c.iteration,
                "used_at": c.used_at,
                "reached_from": c.reached_from,
                "iterations_walked": c.times,
                "fix": c.fix,
            }
            for c in v.carried
        ],
        "lines": [
            {
                "line": line.line,
                "verdict": line.verdict,
                "runs": line.runs,
                "needed_runs": line.needed_runs,
                "held_bytes": line.held_bytes,
                "why": line.why,
                "fix": line.fix,
            }
            for line in v.lines
        ],
        "notes": [{"variable": n.name, "built_at": n.built_at, "held_bytes": n.held_bytes} for n in v.notes],
    }


def dump_json(v: Verdicts, path: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(verdicts_json(v), file, indent=2)
        file.write("\n")
