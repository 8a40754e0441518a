"""The diagnosis as a learner reads it: a headline that counts the items under it, each item their own lines with a
caret under what matters, one sentence of why and one line of fix in their own names; the evidence a step away.

:func:`build_report` turns :class:`backward_twice.judge.verdicts.Verdicts` into a :class:`Report`; every way in shows
the same items (``bt.watch``'s ``w``, the note on the loop's own exception, ``backward-twice watch``, ``bt.diagnose``
and ``%%diagnose``): :func:`render_text` (``verbose`` adds the evidence), :func:`render_html` (the evidence in a
``<details>``), and :func:`report_json` (the items in order, then everything the verdicts hold).

One item per cause (:mod:`backward_twice.report.items` builds each, :mod:`backward_twice.report.error_item` an error's):
a graph carried into a later iteration, an error no carried graph explains, a ``retain_graph=True`` that can go, and a
name that keeps more graphs alive every iteration. A retain a later backward of the same iteration needs, a
``create_graph``, a graph held one iteration and released: evidence, not items.

Used by :mod:`backward_twice.cli`, :mod:`backward_twice.steps.diagnose` and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import Any

from backward_twice.common.units import format_bytes, plural
from backward_twice.judge.fixes import one_graph_before_the_loop
from backward_twice.judge.verdicts import (
    GOES_WITH_CARRIED,
    GOES_WITH_THE_ERRORS_FIX,
    CarriedFinding,
    Note,
    Verdicts,
)
from backward_twice.report.error_item import error_item
from backward_twice.report.items import (
    CodeLine,
    Item,
    carried_item,
    line_number,
    no_graph_item,
    note_item,
    parameters_item,
    retain_item,
    split_line,
)

__all__ = ["CodeLine", "Item", "Report", "build_report", "render_html", "render_text", "report_json"]


@dataclass(frozen=True)
class Report:
    """The headline, the items, the evidence (lines of text), and, if the recorder switched itself off, why."""

    headline: str
    items: tuple[Item, ...]
    evidence: tuple[str, ...]
    stopped_watching: str | None = None
    not_put_back: tuple[str, ...] = ()  # a step tool's runs: what they changed that nothing can put back


_BACKWARDS_ERRORS = frozenset({"backward a second time", "in-place version error"})


def build_report(
    v: Verdicts, runs_of: str | None = None, ended_by: str | None = None, in_runs: str | None = None
) -> Report:
    """The report of ``v``. ``runs_of``: a step's name, when a tool ran it (then iterations are its runs);
    ``ended_by``: how the loop ended when not by itself or an error (``SystemExit: 2``, ``KeyboardInterrupt``);
    ``in_runs``: the runs of a step whose own loop's passes are the iterations ("2 runs of step")."""
    band_aids = [line for line in v.lines if line.verdict == GOES_WITH_CARRIED]
    items: list[Item] = []
    groups: dict[str, list[CarriedFinding]] = {}
    # one item per graph (an LSTM's h and c come from one line; two names of one graph built before the loop) and
    # per fix (the items of one list)
    for finding in v.carried:
        same = (key for key, found in groups.items() if finding.name and _one_graph(found[0], finding))
        groups.setdefault(next(same, finding.built_at), []).append(finding)
    explained = v.error is not None and v.error.carried
    for index, findings in enumerate(groups.values()):
        first = index == 0
        error = v.error if explained and first else None
        items.append(carried_item(findings, error, band_aids[0] if band_aids and first else None, v.stopped_after))
    if v.error is not None and not explained and not (v.calls == 0 and v.nested):  # the inner watch's to judge
        band_aid = next((line for line in v.lines if line.verdict == GOES_WITH_THE_ERRORS_FIX), None)
        # a backward's own error first, the item the traceback above is about; the loop's own error after the
        # graphs found before it
        items.insert(0 if v.error.kind in _BACKWARDS_ERRORS else len(items), error_item(v.error, band_aid))
    items += [no_graph_item(v.walks_no_graph, v.walks_no_graph_cut)] if v.walks_no_graph is not None else []
    items += [retain_item(line, v.stopped_after) for line in v.lines if line.verdict == "can go"]
    items += [note_item(n) for n in v.notes if n.grows and not n.parameter]  # freed buffers too: the nodes pile up
    by_model: dict[str, list[Note]] = {}
    for note in v.notes:
        if note.parameter:
            by_model.setdefault(re.split(r"[\[.]", note.name, maxsplit=1)[0], []).append(note)
    # one item per update line: a bare name left holding one of those parameters (``p`` of a ``for p in
    # target.parameters()`` before the loop) is the same cause as the module it belongs to
    reached = sorted(by_model.items(), key=lambda group: not any(c in group[1][0].name for c in ".["))
    for model, notes in reached:
        item = parameters_item(_module_of(model, [note.name for note in notes]), notes)
        if not any(other.lines == item.lines and other.fix == item.fix for other in items):
            items.append(item)
    headline = _headline(v, items, runs_of, ended_by, in_runs)
    return Report(headline, tuple(items), _evidence(v), v.stopped_watching)


def _one_graph(first: CarriedFinding, finding: CarriedFinding) -> bool:
    """Whether ``finding`` belongs to the item of ``first``: the same fix (the items of one list), or two names of one
    graph built before the loop, each to be computed inside it."""
    if first.fix == finding.fix:
        return True
    before = first.iteration is None and finding.iteration is None and first.name is not None
    return before and one_graph_before_the_loop(first.fix, first.built_at, finding.fix, finding.built_at)


def _module_of(root: str, parameters: list[str]) -> str:
    """The module whose parameters ``parameters`` all are, as spelled: ``model.ema`` of ``model.ema[0].weight`` and
    ``model.ema[2].bias``; ``root`` when they share no more."""
    paths = [re.findall(r"\.\w+|\[[^\]]*\]|^\w+", name)[:-1] for name in parameters]
    shared: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) > 1 or parts[0].startswith("["):
            break
        shared.append(parts[0])
    return "".join(shared) if len(shared) > 1 else root


def _headline(v: Verdicts, items: list[Item], runs_of: str | None, ended_by: str | None, in_runs: str | None) -> str:
    watched = (
        f"{plural(v.iterations_run, 'run')} of {runs_of}"
        if runs_of
        else plural(v.iterations_run, "iteration") + " watched" + (f" in {in_runs}" if in_runs else "")
    )
    if v.stopped_after is not None:
        watched += ", then stopped as asked"
    if ended_by is not None:
        watched += f"; {ended_by} ended the run"  # in the loop, or after it: a script's sys.exit(main())
    elif v.error is not None and v.error.caught:
        unit = "run" if runs_of else "iteration"
        watched += f"; a backward raised in {unit} {v.error.iteration}, and your code caught it"
    elif v.error is not None and v.error.past_the_loop:
        watched += "; a backward after the loop raised"
    elif v.error is not None:
        watched += (
            f"; run {v.error.iteration} raised" if runs_of else f"; the loop raised in iteration {v.error.iteration}"
        )
    if v.calls == 0 and not items and v.nested:
        return (
            "backward-twice: no backward call seen outside your code's own bt.watch or bt.diagnose "
            "(its report judges those)"
        )
    if v.calls == 0 and not items:
        return f"backward-twice: no backward call seen ({watched}): nothing to judge"
    fixes = sum(1 for item in items if item.to_fix)
    notes = len(items) - fixes
    if not items:
        needed = [line_number(split_line(line.line)[0]) for line in v.lines if line.verdict == "needed"]
        where = " and ".join(dict.fromkeys(needed))
        instead = next((line.instead for line in v.lines if line.verdict == "needed" and line.instead), None)
        retains = (
            f"retain_graph=True at line{'s' if len(set(needed)) > 1 else ''} {where} needed"
            + (f" (or {instead} in its place)" if instead else "")
            if needed
            else "no retain_graph=True to drop"
        ) + _inside(v)
        calls = plural(v.calls, "backward call")
        if v.iterations_run > 1:
            return f"backward-twice: healthy ({watched}, {calls}, nothing carried, {retains})"
        unit = "run" if runs_of else "iteration"  # the next one is where a carried graph is walked
        later = f"a graph carried into the next {unit} shows from 2 {unit}s on"
        return f"backward-twice: healthy ({watched}, {calls}, {retains}; {later})"
    counted = plural(fixes, "thing") + " to fix" if fixes else ""
    counted += (", " if counted else "") + plural(notes, "note") if notes else ""
    return f"backward-twice: {counted} ({watched})"


def _inside(v: Verdicts) -> str:
    """What the headline says of the backward calls run inside another backward, which no verdict judged."""
    count, first = v.inside
    if not count:
        return ""
    where = f" (line {line_number(split_line(first)[0])})" if first else ""
    return f"; {plural(count, 'backward call')} inside another backward{where} not judged"


def _evidence(v: Verdicts) -> tuple[str, ...]:
    out = [f"iterations: {v.split.how}; {plural(v.calls, 'backward call')}"]
    if v.inside[0]:
        first = f"; the first at {v.inside[1]}" if v.inside[1] else ""
        out.append(
            f"inside: {plural(v.inside[0], 'backward call')} run inside another backward (a hook's, a custom "
            f"Function's), passed through as written and not judged{first}"
        )
    if v.error is not None:
        out.append(f"error: {v.error.message}")
        if v.error.evidence:
            out.append(f"  {v.error.evidence}")
        if v.error.kind not in ("backward a second time", "in-place version error", "other"):
            out.append(f"  about this error: {v.error.fix}")
    for c in v.carried:
        built = "before the loop" if c.iteration is None else f"in iteration {c.iteration}"
        name = c.name or "(no name the loop holds)"
        out.append(
            f"carried: {name} built {built} at {split_line(c.built_at)[0]}, walked from iteration {c.reached_from}"
        )
    for line in v.lines:
        place, code = split_line(line.line)
        out.append(f"retain_graph=True at {place}: {code}: {line.verdict}; {line.why}")
    for n in v.notes:
        so_far = f" ({n.so_far} so far)" if n.so_far else ""
        last = f"up to the last {n.bound}{so_far}" if n.up_to else f"the last {n.bound}"
        kept = f", holds {last} iterations' graphs" if n.bound else ", grows" if n.grows else ""
        out.append(f"held: {n.name} ({format_bytes(n.held_bytes)}{kept})")
    return tuple(out)


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes: two for a wide or full-width character, one for any other."""
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def _caret_lines(line: CodeLine, width: int) -> list[str]:
    out = [f"   {line.place.rjust(width)} | {line.code}"]
    if line.span is not None:
        start, end = line.span  # characters; a wide one (CJK: ``隐藏 = ...``) takes two columns of the terminal
        before, under = _columns(line.code[:start]), _columns(line.code[start:end])
        out.append(f"   {''.rjust(width)} | {' ' * before}{'^' * max(1, under)} {line.label}")
    elif line.label:
        out.append(f"   {''.rjust(width)} | {line.label}")
    return out


def render_text(report: Report, verbose: bool = False, more: str | None = None) -> str:
    out = [report.headline]
    if report.stopped_watching:
        out.append(report.stopped_watching)
    out += [f"note: {sentence}" for sentence in report.not_put_back]
    for number, item in enumerate(report.items, 1):
        out.append(f"{number}. {item.label}")
        width = max((len(line.place) for line in item.lines), default=0)
        for line in item.lines:
            out.extend(_caret_lines(line, width))
        out.append(f"   why: {item.why}")
        out.append(f"   {'fix' if item.to_fix else 'keep in mind'}: {item.fix}")
    if verbose:
        out += ["evidence:", *(f"  {line}" for line in report.evidence)]
    elif more and report.items:
        out.append(f"more: {more}")
    return "\n".join(out)


def render_html(report: Report) -> str:
    parts = [f"<div><p><b>{html.escape(report.headline)}</b></p>"]
    if report.stopped_watching:
        parts.append(f"<p>{html.escape(report.stopped_watching)}</p>")
    parts += [f"<p>note: {html.escape(sentence)}</p>" for sentence in report.not_put_back]
    if report.items:
        rows = []
        for item in report.items:
            width = max((len(line.place) for line in item.lines), default=0)
            code = "\n".join(text for line in item.lines for text in _caret_lines(line, width))
            rows.append(
                f"<li><b>{html.escape(item.label)}</b><pre>{html.escape(code)}</pre>why: {html.escape(item.why)}"
                f"<br><b>{'fix' if item.to_fix else 'keep in mind'}:</b> <code>{html.escape(item.fix)}</code></li>"
            )
        parts.append(f"<ol>{''.join(rows)}</ol>")
    evidence = html.escape("\n".join(report.evidence))
    parts.append(f"<details><summary>evidence</summary><pre>{evidence}</pre></details></div>")
    return "".join(parts)


def report_json(report: Report) -> dict[str, Any]:
    return {
        "headline": report.headline,
        "count": len(report.items),
        "items": [asdict(item) for item in report.items],
        "stopped_watching": report.stopped_watching,
        "not_put_back": list(report.not_put_back),
        "evidence": list(report.evidence),
    }
