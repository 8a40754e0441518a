"""Verdicts from what a :class:`backward_twice.record.recorder.Recorder` saw run, never from a modified run.

* iterations (:func:`backward_twice.record.iterations.split_iterations`): the passes of the learner's own loop; without
  one, their
  ``next_iteration()`` marks, the steps of the optimizer that stepped first last, or a new iteration at each call of
  the first backward line. The split says which rule it used;
* a ``retain_graph=True`` is needed when a later backward of the same iteration walks a node with saved tensors
  that it kept; when only a later iteration's does (through a graph carried into it), it "goes with the carried
  fix": the forum's band-aid, which the carried tensor's fix makes useless; it can go when no backward walks what
  it kept. One verdict per source line, with its counts;
* a graph is carried when a backward walks a node built in an earlier iteration or before the first; the name
  that held it at an iteration's start (:class:`backward_twice.record.names.NamedGraph`) gives the fix its variable, and
  :func:`backward_twice.judge.built.built_line` the line that built it. A graph held into a later iteration that no
  backward walks is a note (:mod:`backward_twice.judge.notes`), one that grows (a list that gains one every
  iteration, a running total) a note to show;
* the error, by kind (:func:`backward_twice.common.error_kinds.error_kind`), with the recorder's evidence.

Used by :mod:`backward_twice.steps.audit`, :mod:`backward_twice.steps.harness`, :mod:`backward_twice.report.rendering`
and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass, field, replace

from backward_twice.common.error_kinds import error_kind
from backward_twice.common.units import format_bytes
from backward_twice.judge.built import (
    built_line,
    first_read,
    function_span,
    list_use,
    one_line_loop,
    read_first,
    reads_on_line,
    rebinds_from_itself,
    starts_without_a_tensor,
)
from backward_twice.judge.fixes import ERROR_FIXES, carried_fix, in_place_fix, second_backward_fix
from backward_twice.judge.notes import Note, notes
from backward_twice.judge.stored import as_stored, as_the_line_names_it, before_inner_loop
from backward_twice.record.folds import CallLog, count_retains
from backward_twice.record.iterations import Split, split_iterations
from backward_twice.record.learner import learner_line_at, short
from backward_twice.record.loops import enclosing, outermost_loop_around
from backward_twice.record.names import CodeSite, NamedGraph
from backward_twice.record.recorder import Recorder
from backward_twice.record.sources import parsed

__all__ = [
    "ERROR_FIXES",
    "GOES_WITH_CARRIED",
    "CarriedFinding",
    "ErrorVerdict",
    "LineVerdict",
    "Note",
    "Verdicts",
    "judge",
    "plural",
]

CREATE_GRAPH_NOTE = "create_graph=True: builds a graph of the gradient; not a retain that can go"
CREATE_GRAPH_KEEPS = "can go: create_graph=True keeps the graph anyway (retain_graph defaults to create_graph)"
GOES_WITH_CARRIED = "goes with the carried fix"  # a retain only a later iteration's walk into a carried graph needs


@dataclass(frozen=True)
class LineVerdict:
    """One source line's verdict over all its runs: the line, "needed", "can go" or a note ("create_graph"), how
    many runs (calls of the line) and how many a later backward needed, the most bytes it kept, why and the fix."""

    line: str
    verdict: str
    runs: int
    needed_runs: int
    held_bytes: int
    why: str
    fix: str


@dataclass(frozen=True)
class CarriedFinding:
    """A graph a later backward walks: the name that held it (None: no name the loop holds), the line that built it,
    the iteration that built it (None: before the first), the line and iteration of the backward that walked it,
    how many iterations walked such a graph, and the fix."""

    name: str | None
    built_at: str
    iteration: int | None
    used_at: str
    reached_from: int
    times: int
    fix: str
    shape: tuple[int, ...] | None = None
    container: str | None = None  # "tuple", "list" or "dict" when the name is an item of one
    enters_at: str | None = None  # the first line of the loop that reads the name: where the old graph comes in
    fix_at_entry: bool = False  # a detach right before ``enters_at`` runs (else: at the end of each iteration)
    chained: bool = True  # a backward walked graphs of several earlier iterations at once (False: one at a time)
    stored_at: str | None = None  # without a loop of the learner's: their line that stores it (the fix goes after)


@dataclass(frozen=True)
class ErrorVerdict:
    """The error: kind, first line, the learner's line, iteration, the recorder's evidence, the fix, and whether a
    graph carried from an earlier iteration caused it (then the fix is the carried graph's)."""

    kind: str
    message: str
    line: str
    iteration: int
    evidence: str
    fix: str
    carried: bool = False
    stale_line: str | None = None  # the learner's line that computed what the step then changed (in place)
    changed_line: str | None = None  # the learner's in-place statement that changed what a node saved


@dataclass(frozen=True)
class Verdicts:
    """Everything judged from one recording (``stopped_watching``: why the recorder switched itself off, if it did)."""

    split: Split
    iterations_run: int
    calls: int
    lines: list[LineVerdict] = field(default_factory=list)
    carried: list[CarriedFinding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    error: ErrorVerdict | None = None
    stopped_after: int | None = None  # watch(iterations=N) ended the loop after N iterations
    stopped_watching: str | None = None


def judge(recorder: Recorder) -> Verdicts:
    split = split_iterations(recorder)
    calls = recorder.calls
    carried = _carried(recorder, split)
    lines = _lines(calls, split, recorder, carried)
    carried_names = {n for c in carried if c.name for n in (c.name, _whole(c.name, c.container))}
    kept = [n for n in notes(recorder, split) if n.name not in carried_names]  # carried already says it
    error = _error(recorder, split, carried)
    partial = len(calls) > (split.ends[-1].calls if split.ends else 0) or recorder.error is not None
    run = split.count + (1 if partial else 0)
    failure = recorder.failure
    stopped_watching = (
        None
        if failure is None
        else f"backward-twice stopped watching after {plural(failure.calls, 'backward call')}: an error of its own "
        f"({failure.where}: {failure.error}); the loop went on as written, and what follows covers what ran before"
    )
    stopped = recorder.iterations if recorder.stopped else None
    return Verdicts(split, run, len(calls), lines, carried, kept, error, stopped, stopped_watching)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _same_iteration(split: Split, index: int, later: int) -> bool:
    return split.iteration_of_call(later) == split.iteration_of_call(index)


def _lines(calls: CallLog, split: Split, recorder: Recorder, carried: list[CarriedFinding]) -> list[LineVerdict]:
    """One verdict per line that wrote ``retain_graph=True`` (or ``create_graph=True``), from the counts of its
    calls: those kept as records, and those a long run folded (:mod:`backward_twice.record.folds`)."""
    tallies = {site: replace(tally) for site, tally in calls.retains.items()}
    count_retains(calls, lambda index, later: _same_iteration(split, index, later), tallies)
    verdicts = []
    for tally in sorted(tallies.values(), key=lambda t: t.first):
        line, runs, needed, held = tally.line, tally.runs, tally.needed, tally.held
        if tally.create_graph:
            written = _writes_retain(tally.site)  # written out, yet create_graph implies it
            kind, why, fix = (
                ("can go", CREATE_GRAPH_KEEPS, "remove retain_graph=True")
                if written
                else ("not a retain (create_graph)", CREATE_GRAPH_NOTE, "nothing to change here")
            )
            verdicts.append(LineVerdict(line, kind, runs, 0, held, why, fix))
            continue
        if needed and not tally.needed_here and tally.needer_later is not None:
            # the forum's band-aid: only a later iteration's walk into a carried graph needs it
            later = calls[tally.needer_later]
            # the whole state (``hidden``, not ``hidden[0]``): detaching one of its tensors leaves the other carrying it
            carrier = next((f"`{_whole(c.name, c.container)}`" for c in carried if c.name), "the carried tensor")
            why = (
                f"only a later iteration needs it: {short(later.line)} in iteration "
                f"{split.iteration_of_call(later.index)} follows {carrier} back into the buffers it kept; once "
                f"{carrier} is detached, no backward needs them"
            )
            fix = f"remove retain_graph=True once {carrier} no longer carries its graph"
            verdicts.append(LineVerdict(line, GOES_WITH_CARRIED, runs, needed, held, why, fix))
        elif needed and tally.needer_here is not None:
            later = calls[tally.needer_here]
            why = (
                f"needed in {needed} of {runs} runs: a later backward of the same iteration, "
                f'{short(later.line)}, walks the buffers it kept; without it, that backward raises "Trying to '
                f'backward through the graph a second time"'
            )
            fix = f"keep it: a later backward needs these buffers ({short(later.line)})"
            verdicts.append(LineVerdict(line, "needed", runs, needed, held, why, fix))
        else:
            stopped = " before the error" if recorder.error is not None else ""
            why = (
                f"can go: in {runs} run{'s' if runs != 1 else ''}{stopped} no later backward walks the "
                f"buffers it kept, so without it the step runs the same: it only kept {format_bytes(held)} alive"
            )
            verdicts.append(LineVerdict(line, "can go", runs, 0, held, why, "remove retain_graph=True"))
    return verdicts


def _carried(recorder: Recorder, split: Split) -> list[CarriedFinding]:
    """One finding per name: each named node a backward walks that an earlier iteration built (or that was built
    before the first), found first where it was first walked (a later iteration's sighting of the same name is the
    same cause, though its line may read otherwise once the line tracer is off); a walk through old nodes no name
    holds is one finding too."""
    found: dict[str, _Carried] = {}

    def add(key: str, sighting: _Carried) -> None:
        known = found.get(key)
        if known is None:
            found[key] = sighting
        else:
            known.times.add(sighting.reached_from)
            known.chained = known.chained or sighting.chained

    through = recorder.error.reached_through if recorder.error is not None else None
    twins: dict[tuple[str, int], NamedGraph] = {}
    first = _iteration_1_start(recorder)
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        # not what passes without a backward built for this one (gradient accumulation: losses.append(...) each pass,
        # sum(losses).backward() every 2nd): walked once, by the first backward after them
        since = min(split.iteration_of_call(call.index - 1) if call.index else 0, iteration - 1)
        old = [seq for seq in call.old if split.iteration_of_node(seq) <= since]
        if not old:
            continue
        chained = len({split.iteration_of_node(seq) for seq in old}) > 1
        top = [seq for seq in call.frontier if split.iteration_of_node(seq) < iteration]
        candidates = (
            recorder.names.get(seq) or next(filter(None, map(twins.get, _places(split, seq, first))), None)
            for seq in top
        )
        named = [node for node in candidates if node is not None]
        if not named:  # no new node points to them: the backward starts in the old graph (``states[-2][1]``)
            named = [recorder.names[seq] for seq in sorted(old, reverse=True)[:1] if seq in recorder.names]
        if not named and through is not None and recorder.error is not None and recorder.error.call == call.index:
            # the names were not read at this pass (only at some): the failing call's own read found the name it
            # reached them through, one each pass assigns from itself (``hidden = cell(x, hidden)``)
            named = [replace(through, sequence=max(top or old))] if rebinds_from_itself(through) else []
        for node in named:  # a later iteration's node at the same place is this one's twin (read after the loop
            for place in _places(split, node.sequence, first):  # rebound the name that held it)
                twins.setdefault(place, node)
        for node in named:
            built = split.iteration_of_node(node.sequence)
            line = built_line(node, built == 0, recorder)
            name, container = node.name, node.container
            carrier = _carrier(recorder, recorder.carriers.get(node.sequence))
            if (
                through is not None
                and through.sequence == node.sequence
                and through.container in ("list", "tuple", "dict")
                and through.name != carrier
            ):
                # the container that still held it when the failing backward walked it: the loop rebound the name
                # that held it at the iteration's start (hidden, rebound before bank[0] is read)
                name, container, carrier = through.name, through.container, None
            elif carrier is not None and carrier != name:  # out = model(x); outputs.append(out): outputs[0] carries
                name = carrier
                container = "list" if re.search(r"\[\d+\]$", carrier) and container is None else container
            for spelled in (name, *(a for a in node.aliases if carrier is None or carrier == node.name)):
                add(
                    spelled,
                    _Carried(
                        spelled,
                        line,
                        built or None,
                        call.line,
                        container,
                        node.shape,
                        iteration,
                        {iteration},
                        node.frame,
                        chained,
                    ),
                )
        if not named:
            built = split.iteration_of_node(max(old))
            line = f"(no name the loop holds; built {_when(built)})"
            add(line, _Carried(None, line, built or None, call.line, None, None, iteration, {iteration}, None, chained))
    stored_only = recorder.loop.innermost is None and not recorder.by_runs  # a framework's ``fit`` runs the loop
    return [
        CarriedFinding(
            name,
            e.built_at,
            e.iteration,
            e.used_at,
            e.reached_from,
            len(e.times),
            before_inner_loop(fix, None if at_entry else entry, recorder.loop.innermost),
            e.shape,
            e.container,
            None if entry is None else learner_line_at(*entry),
            at_entry,
            e.chained,
            None if stored is None or stored[1] is None or at_entry else learner_line_at(*stored[1]),
        )
        for e, named in ((e, as_the_line_names_it(e.name, e.built_at)) for e in _named_first(list(found.values())))
        for stored in (as_stored(named, recorder.creation.ran) if stored_only and named else None,)
        for name in (named if stored is None else stored[0],)
        for entry in (_entry(recorder, e),)
        for at_entry in (_fix_at_entry(recorder, entry, e, name),)
        for fix in (carried_fix(name, e.built_at, e.iteration is None, e.container, _list_use(recorder, e), e),)
    ]


def _named_first(found: list[_Carried]) -> list[_Carried]:
    """``found`` less the carriers no name holds once one is named (``hx[done] = 0`` hides ``hx`` behind a node)."""
    return [e for e in found if e.name is not None] or found


def _places(split: Split, sequence: int, first: int | None) -> list[tuple[str, int]]:
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


def _iteration_1_start(recorder: Recorder) -> int | None:
    """The node counter where iteration 1 began, when a loop's pass tells it (a long run's folds keep pass 1)."""
    passes = recorder.loop.iteration_passes()
    return passes[0].sequence if passes and passes[0].number == 1 else None


def _twin_in_iteration_1(recorder: Recorder, split: Split, sequence: int) -> int | None:
    """The node at the same place in iteration 1 as node ``sequence`` in its own, later iteration: a steady loop
    builds the same nodes in the same order each iteration, and iteration 1's lines are the ones the tracer logged
    (TD3's actor update every second iteration raises in iteration 2, past the traced pass)."""
    first = _iteration_1_start(recorder)
    end = next((end.sequence for end in split.ends if end.iteration == 1), None)
    if first is None or end is None or split.iteration_of_node(sequence) < 2:
        return None
    offset = dict(_places(split, sequence, first)).get("from its start")
    return first + offset if offset is not None and first + offset < end else None


def _carrier(recorder: Recorder, spellings: list[str] | None) -> str | None:
    """Of the names that held a graph at an iteration's start (simplest first), the first one the loop's body does
    not assign before it reads it: ``smooth`` of ``loss = ...; smooth = 0.9 * smooth + 0.1 * loss`` (in iteration
    1 both held one tensor, but ``loss`` is rebound before anything reads it)."""
    if not spellings:
        return None
    link = recorder.loop.innermost
    if len(spellings) == 1 or link is None or recorder.loop.unusable is not None:
        return spellings[0]
    span = (link.loop.filename, link.loop.body_first, link.loop.body_last)
    live = (s for s in spellings if read_first(re.sub(r"\[\d+\]$", "", s), span) is not False)
    return next(live, spellings[0])


def _whole(name: str, container: str | None) -> str:
    """``state`` of ``state[0]`` when the name is an item of a tuple or a list: what the loop reads and rebinds."""
    return re.sub(r"\[\d+\]$", "", name) if container in ("tuple", "list") else name


def _entry(recorder: Recorder, carried: _Carried) -> tuple[str, int] | None:
    """(file, line) of the first line that reads the carrier in the loop's body, else in the code the name was found
    in, else in the step the tool ran: where the old graph comes in."""
    if carried.name is None:
        return None
    whole = _whole(carried.name, carried.container)
    return first_read(whole, _spans(recorder, carried), carried.container == "list", recorder.creation.ran)


def _fix_at_entry(recorder: Recorder, entry: tuple[str, int] | None, carried: _Carried, name: str | None) -> bool:
    """Whether a detach right before ``entry``, the line where the old graph comes in, is a fix that runs: the name
    starts as a tensor (not ``beta = 0``, ``self.hidden = None`` or a function's parameter: no ``.detach()`` in
    iteration 1), and that line is not in a loop nested in the iteration's (an encoder's loop over time steps: a
    detach there cuts each sequence too)."""
    if carried.name is None or name is None:
        return False
    whole = _whole(name, carried.container)
    if starts_without_a_tensor(whole, entry[0] if entry is not None else carried.built_at.split(":", 1)[0]):
        return False
    if entry is None:  # comes in where it is built (``self.h = self.rnn(x, self.h)`` in a framework's step)
        return reads_on_line(carried.built_at.split(": ", 1)[-1], whole)
    if one_line_loop(*entry):  # ``for x in data: h = cell(x, h); ...``: a line added before it runs once
        return False
    link = recorder.loop.innermost
    if link is not None and outermost_loop_around(*entry, link.code) is not None:  # in a loop of a function it calls
        return False
    if link is None or recorder.loop.unusable is not None or entry[0] != link.loop.filename:
        return True
    code = link.code  # a parameter of the loop's function (``beta`` of ``train(..., beta)``) may come in as a number
    if whole in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        return False
    return not any(loop.header > link.loop.header for loop in enclosing(code, entry[1]))


def _list_use(recorder: Recorder, carried: _Carried) -> str | None:
    """For a carrier that is an item of a list: how the learner's code uses that list (:func:`list_use`)."""
    if carried.name is None or carried.container != "list":
        return None
    return list_use(re.sub(r"\[\d+\]$", "", carried.name), _spans(recorder, carried))


def _spans(recorder: Recorder, carried: _Carried) -> list[tuple[str, int, int]]:
    """Where the learner's code may read a carrier: the loop's body, the code the name was found in, the step."""
    spans: list[tuple[str, int, int]] = []
    link = recorder.loop.innermost
    if link is not None and recorder.loop.unusable is None:
        spans.append((link.loop.filename, link.loop.body_first, link.loop.body_last))
    for where in (carried.frame, recorder.roots_where):
        span = function_span(where) if where is not None else None
        if span is not None:
            spans.append(span)
    return spans


@dataclass(slots=True)
class _Carried:
    """A carried graph as the first backward that walked it saw it (the fields of :class:`CarriedFinding`, and
    the container its name is an item of); ``times`` gathers every iteration whose backward walked it."""

    name: str | None
    built_at: str
    iteration: int | None
    used_at: str
    container: str | None
    shape: tuple[int, ...] | None
    reached_from: int
    times: set[int]
    frame: CodeSite | None = None  # the code the name was found in
    chained: bool = False  # a backward walked graphs of two or more earlier iterations at once: they pile up


def _writes_retain(site: tuple[str, int]) -> bool:
    """Whether the call at ``site`` (file, line) spells out ``retain_graph=`` (also on a later line of the call)."""
    filename, lineno = site
    tree = parsed(filename)
    if tree is None:
        return "retain_graph" in linecache.getline(filename, lineno)
    return any(
        isinstance(node, ast.Call)
        and node.lineno <= lineno <= (node.end_lineno or node.lineno)
        and any(k.arg == "retain_graph" for k in node.keywords)
        for node in ast.walk(tree)
    )


def _error(recorder: Recorder, split: Split, carried: list[CarriedFinding]) -> ErrorVerdict | None:
    record = recorder.error
    if record is None or record.after_the_loop:  # the script's own error after training: its traceback says it
        return None
    kind = error_kind(record.message)
    calls = recorder.calls
    iteration = split.iteration_of_call(record.call) if record.call is not None else max(1, split.count + 1)
    evidence, fix, stale, changed = "", ERROR_FIXES[kind], None, None
    through_carried = record.call is not None and any(
        split.iteration_of_node(seq) < iteration for seq in calls[record.call].old
    )
    if record.freed_by is not None:
        freer = calls[record.freed_by]
        name = record.reached_through.name if record.reached_through is not None else None
        through = f" through {name}" if name is not None else ""
        evidence = (
            f"the buffers it needs were freed by the backward at {short(freer.line)} in iteration "
            f"{split.iteration_of_call(freer.index)}; this backward reached them{through}"
        )
        if name is not None:
            fix = second_backward_fix(freer.line, record.line, name)
    elif record.changed_by_step is not None:
        evidence = f"a tensor it saved was changed in place by the optimizer step at {short(record.changed_by_step)}"
        site = None
        if record.stale_node is not None:
            raised = calls[record.call].site if record.call is not None else ("", 0)
            site = recorder.creation.call_line_of(record.stale_node, raised)
            twin = _twin_in_iteration_1(recorder, split, record.stale_node) if site is None else None
            site = recorder.creation.call_line_of(twin, raised) if twin is not None else site
        stale = learner_line_at(*site) if site is not None else None
    elif record.changed_at is not None:
        changed = learner_line_at(*record.changed_at)
        evidence = f"a tensor it saved was changed in place at {short(changed)}"
        fix = in_place_fix(*record.changed_at)
    elif kind == "in-place version error":
        evidence = "a tensor it saved was changed in place after it was saved"
    caused = bool(carried) and through_carried and kind in ("backward a second time", "in-place version error")
    fix = carried[0].fix if caused else fix  # the walk into an earlier iteration's graph is the cause: its fix
    return ErrorVerdict(kind, record.message, record.line, iteration, evidence, fix, caused, stale, changed)


def _when(iteration: int) -> str:
    return "before the first iteration" if iteration == 0 else f"in iteration {iteration}"
