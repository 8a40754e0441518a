"""Graphs a later iteration's backward walks: a node built in an earlier iteration or before the first, found in
the recorder's walks, with the name that held it at an iteration's start (its ``NamedGraph``) for the fix's variable,
and :func:`backward_twice.judge.built.built_line` for the line that built it. One :class:`CarriedFinding` per name.

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass, replace

from backward_twice.judge.accumulated import accumulated_gradients
from backward_twice.judge.built import (
    assigns_from_itself,
    built_line,
    function_span,
    lines_built_before,
    one_line_loop,
    reads_on_line,
    rebinds_from_itself,
    starts_without_a_tensor,
)
from backward_twice.judge.cached import cached_on_an_object_fix
from backward_twice.judge.closures import read_by_a_closure
from backward_twice.judge.fixes import carried_fix, read_after_its_build
from backward_twice.judge.grads import gradients_fix
from backward_twice.judge.kept_by import kept_by_a_name_fix
from backward_twice.judge.loop_body import live_link, loop_body, where_read
from backward_twice.judge.returned import computed_in_the_step
from backward_twice.judge.states import one_state, whole_name, whole_state, whole_state_fix
from backward_twice.judge.stored import as_stored, as_the_line_names_it, before_inner_loop
from backward_twice.judge.trained_through import another_pass_fix, without_a_detach
from backward_twice.judge.twins import iteration_1_start, places, twin_in_iteration_1
from backward_twice.judge.uses import bound_in, first_read, list_use, read_first
from backward_twice.record.iterations import Split
from backward_twice.record.learner import learner_line_at, lines_of_file, site_of
from backward_twice.record.loops import enclosing, innermost_loop_body, outermost_loop_around
from backward_twice.record.names import CodeSite, NamedGraph
from backward_twice.record.recorder import Recorder
from backward_twice.record.sources import function_around, parsed

__all__ = ["CarriedFinding", "carried_findings", "rebound_each_pass", "when"]


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
    stored_at: str | None = None  # without a loop of the learner's: their line that stores it
    detach_after: str | None = None  # and the line the fix goes after (a later line of the step may read it whole)
    state: str | None = None  # the state its fix detaches whole (``net.mem``), of which ``name`` is an item
    freed: bool = False  # the backward that raised reached its graph's buffers an earlier backward freed (two
    # carriers, each iteration's ``states['enc']`` and ``states['dec']``: detaching one, the other still raises)


def carried_findings(recorder: Recorder, split: Split) -> list[CarriedFinding]:
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
            known.freed = known.freed or sighting.freed

    through = recorder.error.reached_through if recorder.error is not None else None
    lists: set[str] = set()  # lists found keeping items an earlier iteration built (``saved_actions``)
    twins: dict[tuple[str, int], NamedGraph] = {}
    befores: dict[str, tuple[int, ...]] = {}  # a graph built before the loop: the lines that built it, by its line
    first = iteration_1_start(recorder)
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        # not what passes without a backward built for this one (gradient accumulation: losses.append(...) each pass,
        # sum(losses).backward() every 2nd): walked once, by the first backward after them
        since = min(split.iteration_of_call(call.index - 1) if call.index else 0, iteration - 1)
        old = [seq for seq in call.old if split.iteration_of_node(seq) <= since]
        walked_again = call.first_freed is not None or call.error is not None or bool(set(call.again) & set(old))
        if not old or not (walked_again or _built_in_an_earlier_pass(recorder, split, old)):
            continue  # a walk that raised went through what a backward walked before: the earlier one unread
        chained = len({split.iteration_of_node(seq) for seq in old}) > 1
        if call.create_graph and not walked_again and not chained:
            continue  # the last update, written in autograd and walked once (hypergradient descent's p - g * alpha):
            # a create_graph backward differentiates through it by design
        if call.first_freed is None and call.error is None and accumulated_gradients(recorder, old, call.index):
            continue  # one update's micro-batch gradients (AdaHessian's): its second derivative walks them by design
        top = [seq for seq in call.frontier if split.iteration_of_node(seq) < iteration]
        candidates = (
            recorder.names.get(seq) or next(filter(None, map(twins.get, places(split, seq, first))), None)
            for seq in top
        )
        named = [node for node in candidates if node is not None]
        held_now = recorder.error is not None and recorder.error.call == call.index and recorder.error.held_now
        if held_now and through is not None:  # what held them at the passes' starts let go: state held now carries
            named = [replace(through, sequence=max(top or old))]
        if not named:  # no new node points to them: the backward starts in the old graph (``states[-2][1]``)
            named = [recorder.names[seq] for seq in sorted(old, reverse=True)[:1] if seq in recorder.names]
        if not named and through is not None and recorder.error is not None and recorder.error.call == call.index:
            # the names were not read at this pass (only at some): the failing call's own read found the name it
            # reached them through, one each pass assigns from itself (``hidden = cell(x, hidden)``), or one the loop
            # reads and never binds (a parameter ``x_pos`` of the function whose loop it is: built before the loop)
            body, outer = loop_body(recorder), recorder.error.outer_through
            if not _kept_on(through, body) and outer is not None and _kept_on(outer, body):
                through = outer  # a helper's parameter: the caller's name carries it (``loss, ctx = step(b, ctx)``)
            kept_on = _kept_on(through, body)
            named = [replace(through, sequence=max(top or old))] if kept_on else []
            named += [other for other in recorder.error.also_through if kept_on and _kept_on(other, body)]
        for node in named:  # a later iteration's node at the same place is this one's twin (read after the loop
            for place in places(split, node.sequence, first):  # rebound the name that held it)
                twins.setdefault(place, node)
        error = recorder.error if recorder.error is not None and recorder.error.call == call.index else None
        freed, freed_names = set(), set()  # what the raising call found freed, and the names it reached that by
        if error is not None:
            freed = set(call.freed_seen)
            freed_names = {n.name for n in (error.reached_through, *(n for n, _ in error.freed_also_through)) if n}
        for node in named:
            built = split.iteration_of_node(node.sequence)
            traced = (
                next((s for s in sorted(old, reverse=True) if recorder.creation.line_of(s)), None) if held_now else None
            )
            if held_now and traced is not None and recorder.creation.line_of(node.sequence) is None:
                line = built_line(replace(node, sequence=traced), False, recorder)  # an older pass's, of those traced
            else:  # past the traced passes, the line of its twin in iteration 1 (``log_probs[1]``, appended again)
                twin = twin_in_iteration_1(recorder, split, node.sequence) if built >= 2 else None
                untraced = twin is not None and recorder.creation.line_of(node.sequence) is None
                line = built_line(replace(node, sequence=twin) if untraced and twin else node, built == 0, recorder)
            name, container = node.name, node.container
            if container == "grad":  # a weight's gradient the engine built in ``backward(create_graph=True)``: its line
                calls = (c for c in recorder.calls if c.create_graph and c.start <= node.sequence <= c.end)
                line = next((c.line for c in calls), line)
            carrier = None if held_now else _carrier(recorder, recorder.carriers.get(node.sequence))
            if (
                through is not None
                and through.sequence == node.sequence
                and through.container in ("list", "tuple", "dict")
                and through.name != carrier
                and not (carrier is not None and _assigned_first(recorder, through))
            ):
                # the container that still held it when the failing backward walked it: the loop rebound the name
                # that held it at the iteration's start (hidden, rebound before bank[0] is read)
                name, container, carrier = through.name, through.container, None
            elif carrier is not None and carrier != name:  # out = model(x); outputs.append(out): outputs[0] carries
                name = carrier
                if re.search(r"\[\d+\]$", carrier) and container is None:  # an item: of the kind its name was read in
                    container = _container_named(recorder, carrier) or "list"
            if name == node.name:
                name = _read_in_the_loop(recorder, node)
            if (  # read after the step, untraced (``prev = pred`` comes after it): what the failing call reached it
                through is not None  # through, if the pass reads that one first and rebinds this one first
                and through.sequence == node.sequence
                and through.name != name
                and rebound_each_pass(recorder, whole_name(name, container))
                and not rebound_each_pass(recorder, whole_name(through.name, through.container))
            ):
                name, container = through.name, through.container
            aliases = [  # another output of the node (a compiled cell's ``pred`` beside ``h``) carries it only if
                a  # the pass reads it before it rebinds it
                for a in node.aliases
                if (carrier is None or carrier == node.name) and not rebound_each_pass(recorder, a)
            ]
            kept = _kept_in_a_list(recorder, [name, *aliases], node.frame)
            if kept is not None:  # the list that keeps the items, not each item's own tensors, nor a loop's names
                name, container, aliases = kept, "list", []
                lists.add(kept.rsplit("[", 1)[0])
            elif container == "list":  # an item of a list: a ``for`` over that list names its items too
                lists.add(re.sub(r"\[\d+\]$", "", name))
            state = (
                one_state(node, functools.partial(rebound_each_pass, recorder)) if container != "parameter" else None
            )
            if state is not None:  # one tensor under two entries of one state: detaching one leaves the other's
                name, container, aliases = state, "state", []
            if not built and line not in befores:  # read once per line: every pass's walk reaches the same graph
                earlier = [s for s in old if not split.iteration_of_node(s)]
                befores[line] = lines_built_before(recorder, earlier, line) if earlier else ()
            before = befores.get(line, ()) if not built else ()
            for spelled in (name, *aliases):
                seen = (spelled, line, built or None, call.line, container, node.shape, iteration, {iteration})
                was_freed = node.sequence in freed or node.name in freed_names
                add(spelled, _Carried(*seen, node.frame, chained, before, was_freed))
        if not named:
            built = split.iteration_of_node(max(old))
            line = f"(no name the loop holds; built {when(built)})"
            add(line, _Carried(None, line, built or None, call.line, None, None, iteration, {iteration}, None, chained))
    for key in [key for key, e in found.items() if lists and _bound_from_a_list(recorder, e, lists)]:
        del found[key]
    rebound = [
        key for key, e in found.items() if e.name and rebound_each_pass(recorder, whole_name(e.name, e.container))
    ]
    for key in rebound if len(rebound) < len(found) else []:  # assigned before any read: it carries nothing into
        del found[key]  # the next pass (``hids`` of ``logits, hids = model(data, mems)``); what does is another name
    for key in [key for key, e in found.items() if (e.name or "").endswith(".grad")][1:]:  # each weight's ``.grad``:
        del found[key]  # one cause, one fix for all of them
    stored_only = recorder.loop.innermost is None and not recorder.by_runs  # a framework's ``fit`` runs the loop
    return [
        CarriedFinding(
            name,
            e.built_at,
            e.iteration,
            e.used_at,
            e.reached_from,
            len(e.times),
            before_inner_loop(
                fix, None if at_entry or _a_global_there(recorder, entry, name) else entry, live_link(recorder)
            ),
            e.shape,
            e.container,
            None if entry is None else learner_line_at(*entry),
            at_entry,
            e.chained,
            None if stored is None or stored[1] is None or at_entry else learner_line_at(*stored[1]),
            None if stored is None or stored[2] is None or at_entry else learner_line_at(*stored[2]),
            _detached_whole(name, e, fix),
            e.freed,
        )
        for e, named in ((e, as_the_line_names_it(e.name, e.built_at)) for e in _named_first(list(found.values())))
        for stored in (as_stored(named, recorder.creation.ran, site_of(e.built_at)) if stored_only and named else None,)
        for name in (named if stored is None else stored[0],)
        for entry in (_entry(recorder, e),)
        for in_closure in (read_by_a_closure(name, entry, e.built_at),)
        for at_entry in (not in_closure and _fix_at_entry(recorder, entry, e, name),)
        for fix in (
            in_closure
            or another_pass_fix(name, e.built_at)
            or cached_on_an_object_fix(name, e.built_at)
            or read_after_its_build(name, entry, e.built_at, _body(recorder))
            or computed_in_the_step(name, e.built_at)
            or (name and name.endswith(".grad") and gradients_fix(name))
            or (_built_before(e) and kept_by_a_name_fix(name, entry, e.built_at, e.lines_before))
            or _unless_it_trains_nothing(
                recorder,
                e,
                name,
                carried_fix(name, e.built_at, _built_before(e), e.container, _list_use(recorder, e), e),
            ),
        )
    ]


def _unless_it_trains_nothing(recorder: Recorder, carried: _Carried, name: str | None, fix: str) -> str:
    """``fix``, unless the raising backward walked ``carried``'s graph and its loss trains nothing but through graphs
    built before this pass (:func:`without_a_detach`)."""
    error = recorder.error
    if error is None or not error.trains_only_old or carried.used_at != error.line or not name:
        return fix
    return without_a_detach(fix, name, carried.container, carried.built_at, _built_before(carried))


def _built_before(carried: _Carried) -> bool:
    """Whether the fix is the one for a graph built before the loop (compute it inside, or detach it once): not for a
    name the loop assigns from itself (``hidden = model(x, hidden)`` entering with a graph an earlier run of the cell
    left it), whose detach at the end of each iteration, placed where it comes in, covers the first too."""
    return carried.iteration is None and not (carried.name and assigns_from_itself(carried.name, carried.frame))


def _detached_whole(name: str | None, carried: _Carried, fix: str) -> str | None:
    """The state ``fix`` detaches whole (:func:`backward_twice.judge.fixes.whole_state`), if it is that fix."""
    root = whole_state(name, carried.container, carried.built_at) if name else None
    return root if root is not None and fix == whole_state_fix(root) else None


def _body(recorder: Recorder) -> tuple[str, int, int] | None:
    """(file, first line, last line) of the iteration loop's body, else of the step the tool ran (diagnose)."""
    body = loop_body(recorder)
    return body if body is not None or recorder.roots_where is None else function_span(recorder.roots_where)


def _kept_on(named: NamedGraph, body: tuple[str, int, int] | None) -> bool:
    """Whether ``named`` carries its graph from pass to pass: a name each pass assigns from itself, or one the loop
    reads and never binds."""
    spelled = whole_name(named.name, named.container)
    return rebinds_from_itself(named) or (body is not None and not bound_in(spelled, body))


def _built_in_an_earlier_pass(recorder: Recorder, split: Split, old: list[int]) -> bool:
    """Whether a backward that walks ``old`` (built before its pass, and walked by no call before) walks a graph an
    earlier pass of the loop built: a name the loop's body assigns (SAC's ``alpha = log_alpha.exp()`` at the end of an
    update, read by the next one's loss). What was built before the loop, or around it (each model's output of a
    per-model loop, built in the batch loop's pass: one backward each), is consumed, not carried."""
    span = loop_body(recorder)
    if span is None:  # a step's runs, a framework's steps: any earlier one
        return any(split.iteration_of_node(seq) for seq in old)
    for seq in old:
        node = recorder.names.get(seq)
        if not split.iteration_of_node(seq) or node is None:
            continue
        whole = whole_name(node.name, node.container)
        if bound_in(whole, span):
            return True
        if "." in whole and bound_in(whole, (span[0], 1, sys.maxsize)):  # an attribute a method of its object sets
            return True  # (``atk.step(b)`` sets ``self.delta``), called from the loop: state from pass to pass
    return False


def _read_in_the_loop(recorder: Recorder, node: NamedGraph) -> str:
    """Of the names of one tensor (``ret[1]`` and ``mems[0]`` after ``loss, mems = ret[0], ret[1:]``), the one the
    loop's body reads before it assigns it: where the graph comes into the next pass (``mems``, passed to the model;
    ``ret`` is assigned first). The name found first when no other is read so."""
    spans = where_read(recorder, None)  # the loop's body, else the step's (a tool's runs of it)
    if not node.same or not spans:
        return node.name
    span = spans[0]

    def comes_in(spelled: str) -> bool:
        return read_first(whole_name(spelled, node.container if "[" in spelled else None), span) is True

    if comes_in(node.name):
        return node.name
    return next((other for other in node.same if comes_in(other)), node.name)


def _assigned_first(recorder: Recorder, through: NamedGraph) -> bool:
    """Whether the pass assigns the container ``through`` names before it reads it: ``ret = model(x, *mems)``
    holds this pass's tensors; what carried the old graph in is the name that held it at the pass's start."""
    return rebound_each_pass(recorder, whole_name(through.name, through.container))


def rebound_each_pass(recorder: Recorder, name: str) -> bool:
    """Whether the loop's body (or the step) assigns ``name`` before it reads it: ``out, h = model(x, h)`` rebinds
    ``out`` each pass, so a graph it holds grows only through what another name carries."""
    return any(read_first(name, span) is False for span in where_read(recorder, None))


def _kept_in_a_list(recorder: Recorder, spellings: list[str], frame: CodeSite | None) -> str | None:
    """The item, as ``saved_actions[0]``, of a list that a spelling reaches a tensor of an item through
    (``saved_actions[0][1]``: an actor-critic's ``SavedAction(log_prob, value)`` tuples, appended every step), when
    the loop's code reads that list only whole (``zip(saved_actions, returns)``): the list keeps them, and clearing
    it is the fix; None for any other spellings (a list of LSTM states rebuilt each pass is detached item by item)."""
    for spelled in spellings:
        item = re.fullmatch(r"([\w.]+\[\d+\])(?:\[\d+\])+", spelled)
        if item is None:
            continue
        whole = item.group(1).rsplit("[", 1)[0]
        spans = where_read(recorder, frame)
        if list_use(whole, spans) == "whole":
            return item.group(1)
    return None


def _bound_from_a_list(recorder: Recorder, carried: _Carried, lists: set[str]) -> bool:
    """Whether ``carried`` is a name a ``for`` of the learner's binds from one of ``lists`` (``for (log_prob, value),
    R in zip(saved_actions, returns)``), or one the loop's body assigns before it reads it (``probs, state_value =
    model(state)``, whose last value the list keeps too): an item the list keeps, past the items it is named by."""
    if carried.name is None or not carried.name.isidentifier():
        return False
    body = loop_body(recorder)
    if body is not None and read_first(carried.name, body) is False:
        return True
    spelled = re.escape(carried.name)
    return any(
        re.match(rf"for\b.*\b{spelled}\b.*\bin\b.*(?<![\w.]){re.escape(whole)}\b", text)
        for whole in lists
        for text in lines_of_file(carried.used_at)
    )


def _named_first(found: list[_Carried]) -> list[_Carried]:
    """``found`` less the carriers no name holds once one is named (``hx[done] = 0`` hides ``hx`` behind a node), and
    less ``self.hidden`` where ``model.hidden`` built at the same line is found: the method's name for the loop's
    object, read in a later pass whose first event came inside the method (no ``self`` where the loop runs)."""
    named = [e for e in found if e.name is not None]
    outer = {(e.name.split(".", 1)[1], e.built_at) for e in named if e.name and "." in e.name and e.name[:5] != "self."}
    kept = [e for e in named if not (e.name and e.name[:5] == "self." and (e.name[5:], e.built_at) in outer)]
    return kept or found


def _carrier(recorder: Recorder, spellings: list[str] | None) -> str | None:
    """Of the names that held a graph at an iteration's start (simplest first), the first the loop's body does not
    assign before it reads (``smooth = 0.9 * smooth + 0.1 * loss``, not ``loss``); in a framework's step, self's."""
    if not spellings:
        return None
    span = loop_body(recorder)
    if span is None and recorder.loop.innermost is None and not recorder.by_runs:  # a framework calls the step: its
        return next((s for s in spellings if s.startswith("self.")), spellings[0])  # locals end, ``self.h`` lives on
    if len(spellings) == 1 or span is None:
        return spellings[0]
    live = (  # new[0][1]: new; ``layer.hidden`` of ``for layer in net``: the loop rebinds ``layer``
        s
        for s in spellings
        if read_first(re.sub(r"(\[\d+\])+$", "", s), span) is not False
        and read_first(re.split(r"[.\[]", s, maxsplit=1)[0], span) is not False
    )
    return next(live, spellings[0])


def _container_named(recorder: Recorder, item: str) -> str | None:
    """The kind of container (a list, a dict, ...) the names read saw ``item``'s container hold items as, if any."""
    entry = re.compile(re.escape(re.sub(r"\[[^\]]*\]$", "", item)) + r"\[[^\]]*\]")
    return next((named.container for named in recorder.names.values() if entry.fullmatch(named.name)), None)


def _entry(recorder: Recorder, carried: _Carried) -> tuple[str, int] | None:
    """(file, line) of the first line that reads the carrier in the loop's body, else in the code the name was found
    in, else in the step the tool ran: where the old graph comes in."""
    if carried.name is None:
        return None
    whole = whole_name(carried.name, carried.container)
    return first_read(whole, where_read(recorder, carried.frame), carried.container == "list", recorder.creation.ran)


def _fix_at_entry(recorder: Recorder, entry: tuple[str, int] | None, carried: _Carried, name: str | None) -> bool:
    """Whether a detach right before ``entry``, the line where the old graph comes in, is a fix that runs: the name
    starts as a tensor (not ``beta = 0``, ``self.hidden = None`` or a function's parameter: no ``.detach()`` in
    iteration 1), and that line is not in a loop nested in the iteration's (an encoder's loop over time steps: a
    detach there cuts each sequence too)."""
    if carried.name is None or name is None:
        return False
    whole = whole_name(name, carried.container)
    if starts_without_a_tensor(whole, entry[0] if entry is not None else carried.built_at.split(":", 1)[0]):
        return False
    if entry is None:  # comes in where it is built (``self.h = self.rnn(x, self.h)`` in a framework's step)
        return reads_on_line(carried.built_at.split(": ", 1)[-1], whole)
    if one_line_loop(*entry):  # ``for x in data: h = cell(x, h); ...``: a line added before it runs once
        return False
    link = live_link(recorder)
    if link is not None and outermost_loop_around(*entry, link.code) is not None:  # in a loop of a function it calls
        return False
    if link is None or entry[0] != link.loop.filename:  # a step's runs: not in a loop of the step's own (per node)
        return link is not None or not recorder.by_runs or innermost_loop_body(*entry) is None
    if _a_global_there(recorder, entry, whole):
        return False  # ``data`` a generator the loop draws from reads: assigned there, it would be its local
    code = link.code  # a parameter of the loop's function (``beta`` of ``train(..., beta)``) may come in as a number
    if whole in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        return False
    return not any(loop.header > link.loop.header for loop in enclosing(code, entry[1]))


def _a_global_there(recorder: Recorder, entry: tuple[str, int] | None, name: str | None) -> bool:
    """Whether the plain ``name`` is, at line ``entry``, read by a function other than the loop's without being
    assigned there (a global or a closure's variable): a detach written there would make it that function's local."""
    link = live_link(recorder)
    if entry is None or name is None or not name.isidentifier() or link is None or entry[0] != link.loop.filename:
        return False
    code = link.code
    tree = parsed(entry[0])
    function = function_around(tree, entry[1]) if tree is not None else None
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.lineno == code.co_firstlineno:
        return False
    assigned = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return name not in assigned | {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}


def _list_use(recorder: Recorder, carried: _Carried) -> str | None:
    """For a carrier that is an item of a list: how the learner's code uses that list (:func:`list_use`)."""
    if carried.name is None or carried.container != "list":
        return None
    spans = where_read(recorder, carried.frame)
    used = site_of(carried.used_at)  # the function that runs the backward reads the list it sums (``finish_episode``)
    tree = parsed(used[0]) if used is not None else None
    if used is not None and tree is not None:
        around = function_around(tree, used[1])
        if isinstance(around, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((used[0], around.lineno, around.end_lineno or around.lineno))
    return list_use(re.sub(r"\[\d+\]$", "", carried.name), spans)


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
    lines_before: tuple[int, ...] = ()  # built before the loop: the lines of the code that built it (all move in)
    freed: bool = False


def when(iteration: int) -> str:
    """ "before the first iteration", "in iteration 3"."""
    return "before the first iteration" if iteration == 0 else f"in iteration {iteration}"
