"""Verdicts from what a :class:`backward_twice.record.recorder.Recorder` saw run, never from a modified run.

* iterations (:func:`backward_twice.record.iterations.split_iterations`): the passes of the learner's own loop;
  without one, their ``next_iteration()`` marks, the steps of the optimizer that stepped first last, or a new
  iteration at each call of the first backward line. The split says which rule it used;
* a ``retain_graph=True`` is needed when a later backward of the same iteration walks a node with saved tensors
  that it kept; when only a later iteration's does (through a graph carried into it), it "goes with the carried
  fix": the forum's band-aid, which the carried tensor's fix makes useless; it can go when no backward walks what
  it kept. One verdict per source line, with its counts;
* a graph is carried when a backward walks a node built in an earlier iteration or before the first
  (:mod:`backward_twice.judge.carried`: the name that held it, its line, its fix). A graph held into a later
  iteration that no backward walks is a note (:mod:`backward_twice.judge.notes`), one that grows (a list that gains
  one every iteration, a running total) a note to show;
* the error, by kind (:func:`backward_twice.common.error_kinds.error_kind`), with the recorder's evidence.

Used by :mod:`backward_twice.judge.failsafe`, :mod:`backward_twice.report.error_item`,
:mod:`backward_twice.report.items`, :mod:`backward_twice.report.rendering`, :mod:`backward_twice.steps.audit`,
:mod:`backward_twice.steps.harness` and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass, field, replace

from backward_twice.common.error_kinds import error_kind
from backward_twice.common.units import format_bytes, plural
from backward_twice.judge.carried import CarriedFinding, carried_findings, rebound_each_pass
from backward_twice.judge.errors_fix import needed_by_the_detached, needed_by_the_stale
from backward_twice.judge.fixes import ERROR_FIXES
from backward_twice.judge.frozen import GRAD_OFF, switched_off_at, switched_off_elsewhere
from backward_twice.judge.gan_retain import detach_in_the_d_loss
from backward_twice.judge.hooks import hook_around
from backward_twice.judge.in_place_fix import in_place_fix
from backward_twice.judge.notes import Note, notes
from backward_twice.judge.returned import backward_of_the_returned_loss, loss_returned_at
from backward_twice.judge.second_backward import (
    earlier_backward_in_its_function,
    in_the_function_of,
    line_of_a_caller,
    second_backward_fix,
    where_the_step_ends,
)
from backward_twice.judge.states import whole_name
from backward_twice.judge.trained_through import built_each_pass_fix
from backward_twice.judge.twins import twin_in_iteration_1
from backward_twice.judge.uses import graph_cut
from backward_twice.record.evidence import ErrorRecord
from backward_twice.record.folds import CallLog, count_retains
from backward_twice.record.iterations import Split, split_iterations
from backward_twice.record.learner import learner_line_at, short, site_of
from backward_twice.record.recorder import Recorder
from backward_twice.record.sources import parsed

__all__ = [
    "ERROR_FIXES",
    "GOES_WITH_CARRIED",
    "GOES_WITH_THE_ERRORS_FIX",
    "CarriedFinding",
    "ErrorVerdict",
    "LineVerdict",
    "Note",
    "Verdicts",
    "judge",
]

CREATE_GRAPH_NOTE = "create_graph=True: builds a graph of the gradient; not a retain that can go"
CREATE_GRAPH_KEEPS = "can go: create_graph=True keeps the graph anyway (retain_graph defaults to create_graph)"
GOES_WITH_CARRIED = "goes with the carried fix"  # a retain only a later iteration's walk into a carried graph needs
# a retain only the failing backward needs, whose walk into a stale forward the error's fix detaches (SAC's alpha loss)
GOES_WITH_THE_ERRORS_FIX = "goes with the error's fix"


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
    instead: str | None = None  # the change that makes a needed one useless ("`fake.detach()` at line 173")


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
    caught: bool = False  # the learner's code caught it, and the loop went on
    stale_through: str | None = None  # the name to detach in the later loss, instead of computing it again
    cut: tuple[str, str] | None = None  # no graph: the learner's line whose operation cut it, and that operation
    returned_at: str | None = None  # a framework's backward: the learner's return of the loss it walked
    step_ends: int | None = None  # the stale forward's line goes again after this line: the end of the statement
    # beside it that runs the step (a hand update's ``with torch.no_grad():``, the call of a helper that steps)
    past_the_loop: bool = False  # a backward after the loop ended raised it (the learner's own check, not caught)
    frozen: tuple[tuple[str, int, int], ...] = ()  # no graph: what ``cut``'s toggles switched off (name, off, on)


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
    walks_no_graph: str | None = None  # the line of a backward, when every backward read walked no graph at all
    nested: int = 0  # the watches and diagnoses of the learner's own code this recording made way for
    walks_no_graph_cut: tuple[str, str] | None = None  # ("file:line: code", operation) that cut that loss's graph
    inside: tuple[int, str | None] = (
        0,
        None,
    )  # backward calls run inside another (a hook's), unjudged; the first's line


def judge(recorder: Recorder) -> Verdicts:
    split = split_iterations(recorder)
    calls = recorder.calls
    carried = carried_findings(recorder, split)
    lines = _lines(calls, split, recorder, carried)
    carried_names = {n for c in carried if c.name for n in (c.name, whole_name(c.name, c.container))}
    kept = [n for n in notes(recorder, split) if not _one_of(n.name, carried_names)]  # carried already says it
    if carried or any(n.parameter for n in kept):  # ``out`` and ``loss``, rebound each pass, grow only through the
        # carried graph, or the parameters' (an EMA teacher's output, through its weights' graph): one cause, one item
        kept = [n for n in kept if not (n.grows and not n.parameter and rebound_each_pass(recorder, n.name))]
    error = _error(recorder, split, carried)
    if error is not None and error.carried and _items_stale_after_a_step(recorder, carried[0]):
        whole = whole_name(carried[0].name or "", carried[0].container)
        carried[0] = replace(carried[0], fix=built_each_pass_fix(whole, carried[0].container, carried[0].built_at))
    last_end = split.ends[-1] if split.ends else None
    raised_in_a_pass = (  # not a ``finally:``'s, nor one the loop caught and went on past, nor a call of an
        recorder.error is not None  # iteration that ended (a framework's hook after its step, the step's own)
        and not recorder.error.after_the_loop
        and not recorder.error.caught
        and (recorder.error.call is None or last_end is None or recorder.error.call >= last_end.calls)
    )
    stepped_after = bool(recorder.steps) and (last_end is None or recorder.steps[-1].sequence > last_end.sequence)
    # the last pass ran if a backward or a step came after the last end (a loop with no backward: its steps)
    partial = len(calls) > (last_end.calls if last_end else 0) or stepped_after or raised_in_a_pass
    run = split.count + (1 if partial else 0)
    failure = recorder.failure
    stopped_watching = (
        None
        if failure is None
        else f"backward-twice stopped watching after {plural(failure.calls, 'backward call')}: an error of its own "
        f"({failure.where}: {failure.error}); the loop went on as written, and what follows covers what ran before"
    )
    stopped, read = recorder.iterations if recorder.stopped else None, [call for call in calls if call.read]
    # a loss with no graph (made a leaf: ``loss.requires_grad = True`` after a ``.data`` cut it): nothing trains
    leaf = read[0].line if read and not any(call.walked for call in read) and error is None else None
    cut = _graph_cut(recorder, leaf) if leaf is not None else None  # the forum's requires_grad=True on a cut loss
    return Verdicts(
        split,
        run,
        len(calls),
        lines,
        carried,
        kept,
        error,
        stopped,
        stopped_watching,
        leaf,
        recorder.nesting.made_way,
        cut,
        (recorder.inside.count, short(learner_line_at(*recorder.inside.first)) if recorder.inside.first else None),
    )


def _earlier_steps_the_source(recorder: Recorder, freer: int, record: ErrorRecord) -> bool | None:
    """Whether the optimizer that stepped between the backward that freed the buffers (call ``freer``) and the one
    that raised trains a weight the carrier's graph reaches; None when none stepped between, or nothing is known."""
    stepped = _weights_stepped_between(recorder, freer, record) if record.through_sources else None
    return None if stepped is None else bool(stepped & record.through_sources)


def _weights_stepped_between(recorder: Recorder, freer: int, record: ErrorRecord) -> frozenset[int] | None:
    """The ids of the weights of the first optimizer that stepped between call ``freer`` and the raising call; None
    when none did, or it is gone."""
    between = [step for step in recorder.steps if freer < step.calls <= (record.call or 0)]
    optimizer = recorder.optimizers_seen.get(between[0].optimizer) if between else None
    live = optimizer() if optimizer is not None else None
    return None if live is None else frozenset(id(p) for group in live.param_groups for p in group["params"])


def _with_the_other_ways(recorder: Recorder, freer: int, record: ErrorRecord, fix: str) -> str:
    """``fix`` (a detach of the name the walk reached the freed buffers through), and the detach each other way into
    them wants, where two losses each read what the other trains from (mutual learning: ``out2`` in the first loss,
    ``out1`` in the second): with the first alone, the next run raises at the same line."""
    stepped = _weights_stepped_between(recorder, freer, record)
    if stepped is None or not fix.startswith("use `") or record.call is None:
        return fix
    freed_at, raised_at = recorder.calls[freer].line, record.line
    others = [
        second_backward_fix(freed_at, raised_at, named.name, True, None, bool(stepped & sources), None)
        for named, sources in record.freed_also_through
    ]
    return "; and ".join([fix, *(other for other in others if other.startswith("use `"))])


def _items_stale_after_a_step(recorder: Recorder, finding: CarriedFinding) -> bool:
    """Whether the items of a list built before the loop (an episode's log-probs, then an update per item) went
    stale when a step changed the weights their graphs saved: their gradient is wanted, so no detach fixes it."""
    error = recorder.error
    stale = error is not None and error.changed_by_step is not None and finding.iteration in (None, 0)
    return stale and finding.name is not None and (finding.container == "list" or "the loop takes `" in finding.fix)


def _one_of(name: str, names: set[str]) -> bool:
    """Whether ``name`` is one of ``names`` or holds one as an item (``state`` of ``state[1][0]``), or, spelled from
    inside a method (``self.features``, as the line that grows it spells it), the same attribute of an object one of
    ``names`` spells from outside (``saver.features``)."""
    if name in names or any(other.startswith(f"{name}[") for other in names):
        return True
    inside = re.fullmatch(r"self(\..+)", name)
    return inside is not None and any(re.fullmatch(rf"\w+{re.escape(inside.group(1))}", other) for other in names)


def _same_iteration(split: Split, index: int, later: int) -> bool:
    return split.iteration_of_call(later) == split.iteration_of_call(index)


def _lines(calls: CallLog, split: Split, recorder: Recorder, carried: list[CarriedFinding]) -> list[LineVerdict]:
    """One verdict per line that wrote ``retain_graph=True`` (or ``create_graph=True``), from the counts of its
    calls: those kept as records, and those a long run folded (:mod:`backward_twice.record.folds`)."""
    tallies = {site: replace(tally) for site, tally in calls.retains.items()}
    # a framework's hook called twice in one of its steps: its calls are the passes a carried graph crosses
    hooks: dict[tuple[str, int], str | None] = {}
    by_steps = bool(carried) and not recorder.loop.iteration_passes()

    def same(index: int, later: int) -> bool:
        first, then = calls.record(index), calls.record(later)
        if by_steps and first is not None and first.site not in hooks:
            hooks[first.site] = hook_around(*first.site)
        crosses = first is not None and then is not None and first.site == then.site and bool(hooks.get(first.site))
        return _same_iteration(split, index, later) and not crosses

    count_retains(calls, same, tallies)
    verdicts = []
    for tally in sorted(tallies.values(), key=lambda t: t.first):
        line, runs, needed, held = retain_written_at(tally.line, tally.site), tally.runs, tally.needed, tally.held
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
            named = next((c for c in carried if c.name), None)
            wholes = list(dict.fromkeys(whole_name(c.name, c.container) for c in carried if c.name))
            # every name of the graph (an LSTM's h0 and c0): detaching one leaves the other carrying it
            carrier = " and ".join(f"`{whole}`" for whole in wholes) if wholes else "the carried tensor"
            fixed = named.fix if named is not None else ""
            freed = (  # a list is cleared; an attribute read before the call that rebuilds it is read after it
                "cleared"
                if fixed.startswith("clear ")
                else "read after the call that builds it anew"
                if fixed.startswith("move line ")
                else "detached"
            )
            hook = hooks.get(tally.site)
            needer = (
                f"a later call of `{hook}` needs it: {short(later.line)}"
                if hook and _same_iteration(split, tally.first, later.index)
                else f"a later iteration needs it: {short(later.line)} in iteration "
                f"{split.iteration_of_call(later.index)}"
            )
            why = (
                f"only {needer} follows {carrier} back into the buffers it kept; once "
                f"{carrier} {'are' if len(wholes) > 1 else 'is'} {freed}, no backward needs them"
            )
            carries = "carry their" if len(wholes) > 1 else "carries its"
            fix = f"remove retain_graph=True once {carrier} no longer {carries} graph"
            verdicts.append(LineVerdict(line, GOES_WITH_CARRIED, runs, needed, held, why, fix))
        elif (
            needed
            and tally.needer_here is not None
            and (
                needed_by_the_detached(recorder, tally.needer_here) or needed_by_the_stale(recorder, tally.needer_here)
            )
        ):
            later = calls[tally.needer_here]
            name = recorder.error.stale_through if recorder.error is not None else None
            once = f"that loss uses `{name}.detach()`" if name else "that forward is computed again after the step"
            walk = f"its walk through `{name}` into a forward" if name else "its walk into a forward"
            why = (
                f"only {short(later.line)} needs the buffers it kept, and {walk} an optimizer step made stale is "
                f"the error; once {once}, no backward needs them"
            )
            fix = "remove retain_graph=True with the error's fix"
            verdicts.append(LineVerdict(line, GOES_WITH_THE_ERRORS_FIX, runs, needed, held, why, fix))
        elif needed and tally.needer_here is not None:
            later = calls[tally.needer_here]
            why = (
                f"needed in {needed} of {runs} runs: a later backward of the same iteration, "
                f'{short(later.line)}, walks the buffers it kept; without it, that backward raises "Trying to '
                f'backward through the graph a second time"'
            )
            fix = f"keep it: a later backward needs these buffers ({short(later.line)})"
            detach = detach_in_the_d_loss(tally.site, later.site)  # a GAN's D loss walking G's graph
            instead = None if detach is None else f"`{detach[0]}.detach()` at line {detach[1]}"
            if instead is not None and detach is not None:
                fix = (
                    f"keep it, or use {instead} and remove it: then D's backward walks nothing of G's graph, and a "
                    f"GAN's D loss must not train what `{detach[0]}` comes from"
                )
            verdicts.append(LineVerdict(line, "needed", runs, needed, held, why, fix, instead))
        else:
            stopped = " before the error" if recorder.error is not None else ""
            why = (
                f"can go: in {runs} run{'s' if runs != 1 else ''}{stopped} no later backward walks the "
                f"buffers it kept, so without it the step runs the same: it only kept {format_bytes(held)} alive"
            )
            verdicts.append(LineVerdict(line, "can go", runs, 0, held, why, "remove retain_graph=True"))
    return verdicts


def retain_written_at(line: str, site: tuple[str, int]) -> str:
    """``line`` ("file:12: code" of the call at ``site``), or, for a call spread over several lines (WGAN-GP's
    ``autograd.grad(..., retain_graph=True)``), its line that writes ``retain_graph=``: the line the learner edits."""
    tree = parsed(site[0])
    spread = (
        node
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, ast.Call) and node.lineno == site[1] and (node.end_lineno or node.lineno) > site[1]
    )
    for call in sorted(spread, key=lambda node: (node.end_lineno or node.lineno) - node.lineno):
        written = next((k.value.lineno for k in call.keywords if k.arg == "retain_graph"), site[1])
        if written != site[1]:
            return learner_line_at(site[0], written)
    return line


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
            source = _earlier_steps_the_source(recorder, freer.index, record)
            hooked = next((s.line for s in recorder.steps if freer.index < s.calls <= (record.call or 0)), None)
            stepped = (hooked if source else None) or record.stepped_between
            fix = second_backward_fix(
                freer.line,
                record.line,
                name,
                record.through_walked,
                record.parameter_through,
                source,
                stepped if record.only_through or (source and record.another_trains) else None,
            )
            fix = _with_the_other_ways(recorder, freer.index, record, fix)
        returned = loss_returned_at(record.line, recorder.creation.ran) if record.call is not None else None
        fix = backward_of_the_returned_loss(freer.line, returned) or fix  # the trainer's own backward raised
    elif record.raised_inside is not None and kind == "backward a second time":
        inside = site_of(record.raised_inside) or ("", 0)
        evidence = f"the buffers it needs were freed by a call inside this backward, at {short(record.raised_inside)}"
        earlier = earlier_backward_in_its_function(*inside)
        fix = (
            f"pass retain_graph=True to the call at line {inside[1]}: each backward through this graph runs it again,"
            " on the graph it walked the first time (or call backward through this graph once)"
            if earlier is None
            else f"pass retain_graph=True to the call at line {earlier}: the call at line {inside[1]} walks the graph"
            " it freed"
        )
    elif record.changed_by_step is None and record.changed_at is None and record.stepped_between is not None:
        # an optimizer's own method no step() hook sees (SAM's ``first_step``) changed the weights in place
        evidence = f"a tensor it saved was changed in place by the optimizer step at {short(record.stepped_between)}"
    elif record.changed_by_step is not None:
        by = "your update" if record.updated_by_hand else "the optimizer step"
        evidence = f"a tensor it saved was changed in place by {by} at {short(record.changed_by_step)}"
        site = None
        if record.stale_node is not None:
            raised = calls[record.call].site if record.call is not None else ("", 0)
            site = recorder.creation.call_line_of(record.stale_node, raised)
            twin = twin_in_iteration_1(recorder, split, record.stale_node) if site is None else None
            site = recorder.creation.call_line_of(twin, raised) if twin is not None else site
            own_line = recorder.creation.line_of(record.stale_node)
            link = recorder.loop.innermost
            own = site is not None and in_the_function_of(site, raised)  # a step's own forward, its loop outside
            if site is not None and not own and site == own_line:
                # the raising code did not call what built it (StyleGAN2's R1 ``autograd.grad`` in its own function,
                # SAC's policy loss walked in ``update_params``): the line of the nearest frame out that did
                # (``real_pred = discriminator(real_img)``), not the model's ``forward``; else the loop's line
                site = line_of_a_caller(recorder, record.stale_node, own_line, record.raised_through[1:]) or (
                    recorder.creation.call_line_of(record.stale_node, (link.loop.filename, link.loop.header))
                    if link is not None
                    else site
                )
        stale = learner_line_at(*site) if site is not None else None
    elif record.changed_at is not None:
        changed = learner_line_at(*record.changed_at)
        evidence = f"a tensor it saved was changed in place at {short(changed)}"
        fix = in_place_fix(*record.changed_at)
    elif kind == "in-place version error":
        evidence = "a tensor it saved was changed in place after it was saved"
    caused = bool(carried) and through_carried and kind in ("backward a second time", "in-place version error")
    if caused and record.stale_node is not None and split.iteration_of_node(record.stale_node) >= iteration:
        caused = False  # the weights the step changed were saved by this iteration's own forward (SAC's policy loss
        # computed before the critics' steps): a carried graph walked beside it did not raise
    fix = carried[0].fix if caused else fix  # the walk into an earlier iteration's graph is the cause: its fix
    frozen: tuple[tuple[str, int, int], ...] = ()
    cut = _graph_cut(recorder, record.line) if kind == "no graph" else None
    if kind == "no graph" and cut is None:  # weights switched off before the forward (a GAN's toggle)
        cut, frozen = switched_off_at(record.line, recorder.creation.ran)
    off = record.grad_off or record.inference
    if kind == "no graph" and off and (cut is None or cut[1] not in ("torch.no_grad()", GRAD_OFF)):
        cut, frozen = (
            switched_off_elsewhere(record.line, record.inference, bool(record.call)),
            (),
        )  # not by a line of the loop's own
    return ErrorVerdict(
        kind,
        record.message,
        record.line,
        iteration,
        evidence,
        fix,
        caused,
        stale,
        changed,
        record.caught,
        record.stale_through if stale is not None else None,
        cut,
        loss_returned_at(record.line, recorder.creation.ran) if record.call is not None else None,
        _step_ends(record, site_of(stale)) if stale is not None else None,
        record.past_the_loop,
        frozen,
    )


def _step_ends(record: ErrorRecord, stale: tuple[str, int] | None) -> int | None:
    """The line after which the stale forward at ``stale`` goes again (:func:`where_the_step_ends`)."""
    step = site_of(record.changed_by_step) if record.changed_by_step is not None else None
    return where_the_step_ends(stale, step, record.raised_through) if stale and step else None


def _graph_cut(recorder: Recorder, line: str) -> tuple[str, str] | None:
    """("file:line: code", operation) of :func:`backward_twice.judge.uses.graph_cut` for the backward at ``line``."""
    site = site_of(line)
    cut = graph_cut(*site, ran=recorder.creation.ran) if site is not None else None
    return (learner_line_at(site[0], cut[0]), cut[1]) if site is not None and cut is not None else None
