"""Notes: graphs a name keeps alive that no backward walks again (a running total of losses kept as tensors, a list of
losses for logging), judged from the names the recorder read at iterations' starts.

:func:`notes` keeps a name's note when it holds graphs of several iterations at once, or one graph reaching back over
several (``running_loss += loss`` after the step: read at the next pass's first event, the graph dates from that
pass, and reaches back before it); a name the next iteration rebinds holds one iteration's graph at a time, and its
note says it does not grow. A deque with a maxlen that was full of graphs (a memory bank's queue of keys) holds the
last few iterations' graphs, no more: its note says how many, in every way in (a watch reads it after a pass's own
append has pushed the oldest out, diagnose before), and never that it grows every iteration.

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import linecache
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backward_twice.judge.built import built_line
from backward_twice.judge.fed import fed_line
from backward_twice.judge.grows_at import either_quote, growing_line, local_alias
from backward_twice.judge.twins import twin_in_iteration_1
from backward_twice.record.held import Growth, HeldGraph, item_of
from backward_twice.record.in_place import in_place_statement
from backward_twice.record.iterations import Split
from backward_twice.record.learner import site_of
from backward_twice.record.sources import function_around, parsed

if TYPE_CHECKING:
    from backward_twice.record.names import NamedGraph
    from backward_twice.record.recorder import Recorder

__all__ = ["Note", "notes"]


@dataclass(frozen=True)
class Note:
    """A graph a name keeps alive that no backward walks: the name, the line that built it, its bytes, and whether
    it grows (the name holds graphs of several iterations, or one graph reaching back over several): a name the
    next iteration rebinds holds one iteration's graph at a time, and is no note to show."""

    name: str
    built_at: str
    held_bytes: int
    grows: bool = False
    parameter: bool = False  # a module's parameter that holds a graph: updated in place outside torch.no_grad()
    reset: bool = False  # it grows, but a later start saw it hold fewer iterations' graphs: the loop resets it
    one_element: bool = True  # the tensor held is a single number (``.item()`` fits it)
    entries: int = 1  # a dict's entries that one line builds (``ema.shadow[name] = ...``): one note, ``name`` the dict
    bound: int = 0  # a deque full of graphs: it holds the last ``bound`` iterations' graphs at once, no more
    grows_in: str | None = None  # the file of the line that grows it: the code it was read in (a step's, a cell's)
    ran: frozenset[int] = frozenset()  # the lines of ``grows_in`` that ran while traced (where it grows)
    buffer: bool = False  # ``parameter`` for a registered buffer (an EMA's codebook): the same fix
    attributes: tuple[str, ...] = ()  # an object whose attributes grow together (a meter's ``sum`` and ``avg``): one
    # note of the object, whose method the loop feeds the tensor to
    entry: str = ""  # the key, in the items it keeps, of the newest graph (``'logits'`` of a model's outputs kept)
    nested: bool = False  # its items are lists or tuples of tensors (``states_list.append([word, states])``)
    positions: tuple[int, ...] = ()  # ``nested``: the places in an item that held graphs (``(s, a, logp, r)``: 2)
    so_far: int = 0  # ``bound`` of a deque never full in the run (its maxlen): the iterations' graphs it held last
    up_to: bool = (
        False  # ``bound`` is a deque's maxlen it was not seen to fill (``so_far``: read where the run stopped)
    )


def _updated_in_place(named: NamedGraph | None, grows: bool, recorder: Recorder | None = None) -> bool:
    """Whether a module's own state holds a graph its update gave it: a parameter with a graph always (only an
    in-place update gives one), a buffer when its graph grows, or when the line that built it updates it from
    itself (``self.avg.mul_(0.9).add_(x)``, ``self.avg = 0.9 * self.avg + x``: it grows from the next pass on,
    which a loop of 2 passes never reaches); a buffer a forward hook assigns afresh each pass (``self.weight =
    self.weight_orig / sigma``) holds one pass's graph, as a name rebound each pass does."""
    if named is None or named.container not in ("parameter", "buffer"):
        return False
    if named.container == "parameter" or grows:
        return True
    site = site_of(built_line(named, False, recorder)) if recorder is not None else None
    return site is not None and _updates_itself(*site)


def _updates_itself(filename: str, line: int) -> bool:
    """Whether the statement at ``line`` changes a tensor in place or assigns a name from an expression reading it."""
    if in_place_statement(filename, line) is not None:
        return True
    tree = parsed(filename)
    assigned = (
        next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno <= line <= (n.end_lineno or 0)), None)
        if tree is not None
        else None
    )
    if assigned is None:
        return False
    read = {ast.unparse(n) for n in ast.walk(assigned.value) if isinstance(n, (ast.Name, ast.Attribute))}
    return any(ast.unparse(target) in read for target in assigned.targets)


def notes(recorder: Recorder, split: Split) -> list[Note]:
    """Graphs a name still held in a later iteration than the one that built them (or, built before the loop, in
    the first), that no backward of that iteration or a later one walked."""
    walked: dict[int, int] = {}  # node -> the last iteration whose backward walked it
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        for sequence in call.old:
            walked[sequence] = max(walked.get(sequence, 0), iteration)
    last_end = split.ends[-1] if split.ends else None  # the last pass ran (its backward calls) though no end came:
    ran_on = len(recorder.calls) > (last_end.calls if last_end is not None else 0)  # the loop finished there
    last = max(1, split.count + (1 if recorder.error is not None or ran_on else 0))
    # (holder, node, built, what it holds, how many iterations its graph spans): a late graph (built after the last
    # event of its pass: ``return loss / 3`` after the step) counts as the next pass's, so its span starts a pass later
    held: list[tuple[str, int, int, HeldGraph, int]] = []
    nodes_of: dict[str, set[int]] = {}  # a name rebound each pass holds a new node at each look (``loss``)
    for sequence, held_graph in recorder.held_from.items():
        nodes_of.setdefault(held_graph.holder, set()).add(sequence)
    rebound = {holder for holder, nodes in nodes_of.items() if len(nodes) > 1}
    for sequence, held_graph in recorder.held_from.items():
        holder = held_graph.holder
        held_in = split.iteration_of_sighting(held_graph.sighting)
        built = split.iteration_of_node(sequence)
        earliest = split.iteration_of_node(held_graph.earliest)
        # built since the last pass's last event and reaching back before it: a total kept across passes
        late = built == held_in and earliest < held_in
        oldest, checked = (earliest, held_graph.earliest) if late else (built, sequence)
        # read where iterations=N stopped (pass N+1's top): no backward of that pass ran to walk what is held into
        # it, so only a graph reaching back over several iterations (a total kept across them) tells anything there
        at_the_stop = recorder.stopped and held_in == last + 1
        if not (oldest < held_in <= last or at_the_stop) or walked.get(checked, 0) >= held_in:
            continue
        if holder in rebound and earliest < built and walked.get(held_graph.earliest, 0) >= held_in:
            continue  # each pass's graph, reaching back into one later backwards walk: the carried graph's finding
        # a graph built before the loop that each iteration's graph reaches (features = encoder(images)) is the
        # carried graph's finding, not a name's growth: the span counts from iteration 1
        spans = built - int(late) - max(earliest, 1) + 1
        named = recorder.names.get(sequence)
        if _below_a_submodule(holder) and spans < 2 and not _updated_in_place(named, False, recorder):
            continue  # a loss module's self.loss: the model's own bookkeeping (a parameter with a graph never is); a
            # total two levels down that spans iterations (a trainer's self.logger.total += loss) is the loop's
        if at_the_stop and (spans < 2 or oldest >= held_in or walked.get(held_graph.earliest, 0) > earliest):
            continue  # (what it reaches back to, a later backward walked: state the loop uses, not a total)
        held.append((holder, sequence, built, held_graph, spans))
    together: dict[tuple[str, int], set[int]] = {}  # (a name's root, a sighting) -> the iterations whose graphs it
    entries: dict[tuple[str, int], set[str]] = {}  # held there: a name rebound each iteration holds one at a time;
    for holder, _, built, held_graph, _ in held:  # and the names under it that held them
        together.setdefault((_root(holder), held_graph.sighting), set()).add(built)
        entries.setdefault((_root(holder), held_graph.sighting), set()).add(holder)
    several = {root for (root, _), built in together.items() if len(built) > 1}
    growing = {root for root in several if _more_entries(root, entries)}
    reach_back: dict[str, list[tuple[int, int]]] = {}  # holder -> (sighting, how many iterations its graph spans)
    for holder, _, _, held_graph, spans in held:
        reach_back.setdefault(holder, []).append((held_graph.sighting, spans))
    reset = {holder for holder, seen in reach_back.items() if _dropped([s for _, s in sorted(seen)], holder, recorder)}
    by_name: dict[str, Note] = {}
    growing_lists = (  # a list or dict that holds one more graph at every start; each, where one name holds several
        (name, grown, newest, spelled, nbytes)
        for name, grown in recorder.growth.items()
        for newest, spelled, nbytes in _each_grown(grown)
    )
    for name, grown, newest, newest_name, newest_bytes in growing_lists:
        named = recorder.names.get(newest)
        if grown.grew and named is not None and not _below_a_submodule(name):
            built = split.iteration_of_node(newest)
            line = built_line(_logged(named, recorder, split), built == 0, recorder)
            grower = _container(newest_name or named.name, name)
            item = (newest_name or named.name)[len(grower) :]  # ``[7]``, ``[7]['logits']``, ``[7][1]``
            keys = re.match(r"\[\d+\](\['[^\]]*'\])", item)  # an item's entry: a dict's
            nested = re.match(r"\[\d+\]\[\d+\]", item) is not None  # an item's item: a list's
            note = Note(grower, line, newest_bytes, True, reset=grown.emptied, one_element=_one_element(named.shape))
            places = (re.match(rf"{re.escape(grower)}\[\d+\]\[(\d+)\]", seen) for seen in grown.seen)
            positions = tuple(sorted({int(place.group(1)) for place in places if place is not None}))
            note = dataclasses.replace(note, entry=keys.group(1)[1:-1] if keys else "", nested=nested)
            note = dataclasses.replace(note, positions=positions)
            by_name[grower] = dataclasses.replace(note, grows_in=named.frame.filename if named.frame else None)
    from_before: set[str] = set()  # names whose note's line is where their graph began, before the loop
    for holder, sequence, built, held_graph, spans in held:
        grows = _root(holder) in growing or spans > 1
        named = _logged(recorder.names[sequence], recorder, split)
        line = built_line(named, built == 0, recorder)
        parameter = _updated_in_place(named, grows, recorder)
        one = _one_element(named.shape)
        read_in = named.frame.filename if named.frame else None
        note = Note(
            holder,
            line,
            held_graph.graph_bytes,
            grows,
            parameter,
            grows and holder in reset,
            one,
            buffer=named.container == "buffer",
        )
        known = by_name.setdefault(holder, dataclasses.replace(note, grows_in=read_in))
        if grows and not known.grows:  # a later start showed it growing (running_loss += loss: from pass 3 on)
            known = by_name[holder] = dataclasses.replace(known, grows=True, reset=holder in reset, parameter=parameter)
        if grows and built > 0 and holder in from_before and line != known.built_at:
            # it started before the loop (``ema.shadow['w'] = w.clone()``); the line each pass adds from is the one
            by_name[holder] = dataclasses.replace(known, built_at=line)  # to change (the update in ``forward``)
            from_before.discard(holder)
        elif built == 0:
            from_before.add(holder)
        for alias in named.aliases if holder == named.name else ():  # the other outputs of one node (w1, w2)
            by_name.setdefault(alias, Note(alias, line, 0, grows, one_element=one, grows_in=read_in))
    by_name = _one_per_tensor(by_name)
    found = [_bounded(note, recorder, split) for note in _one_per_line(_one_per_container(list(by_name.values())))]
    found = _one_per_object(found)
    spelled = [_fed_object(_where_it_grows(note, recorder), note) for note in found]
    merged: dict[str, Note] = {}  # one list reached two ways (``r.total`` and, in its method, ``self.total``): one
    for note in spelled:  # note, growing where either reading saw it grow (an in-place ``self.total += loss``)
        first = merged.get(note.name)
        if first is None or (note.grows and not first.grows):
            merged[note.name] = note
    return list(merged.values())


def _each_grown(grown: Growth) -> list[tuple[int, str, int]]:
    """(newest node, its spelling, graph-only bytes) of each list or dict under a name that grew: the newest's own
    first, then any other that grew beside it (``state['parts']`` beside ``state['totals']``)."""
    main = item_of(grown.newest_name) or grown.newest_name.rsplit(".", 1)[0]
    others = [found for container, found in grown.grown_in.items() if container != main]
    return [(grown.newest, grown.newest_name, grown.newest_bytes), *others]


def _one_per_tensor(by_name: dict[str, Note]) -> dict[str, Note]:
    """``by_name`` less the notes of a tensor another note names more simply: the same path from another root that
    holds the simpler name's root under that name (``state['model'].model[1].running_mean``, a step tool's models
    read from its caller, beside ``model.model[1].running_mean``, the step's own name)."""
    paths = {name: re.findall(r"\.\w+|\[[^\]]*\]", re.sub(r"^\w+", "", name)) for name in by_name}
    roots = {name: re.findall(r"^\w*", name)[0] for name in by_name}
    dropped = {
        longer
        for longer in by_name
        for shorter in by_name
        if paths[shorter]
        and len(paths[shorter]) < len(paths[longer])
        and paths[longer][-len(paths[shorter]) :] == paths[shorter]
        and paths[longer][-len(paths[shorter]) - 1] in (f"['{roots[shorter]}']", f".{roots[shorter]}")
    }
    return {name: note for name, note in by_name.items() if name not in dropped}


def _logged(named: NamedGraph, recorder: Recorder, split: Split) -> NamedGraph:
    """``named``, or, for a node built past the traced passes (the tracer follows two), its twin: iteration 1's node
    at the same place, whose line the tracer logged (the newest of a growing list's graphs, ``losses[2]``)."""
    twin = (
        twin_in_iteration_1(recorder, split, named.sequence)
        if recorder.creation.line_of(named.sequence) is None
        else None
    )
    if twin is not None and recorder.creation.line_of(twin) is not None:
        return dataclasses.replace(named, sequence=twin)
    return named


def _bounded(note: Note, recorder: Recorder, split: Split) -> Note:
    """``note`` as the note of the deque it is (an item of), when that deque was full of graphs of 2 or more
    iterations at once: it keeps the last that many iterations' graphs (the most seen at one read), not one more
    every iteration. A deque not seen full (``--iterations 2`` of a ``deque(maxlen=3)``) that held one graph of each
    of its iterations keeps up to its maxlen of them, with how many it held where the run stopped or after a step's
    call (a loop's passes are read at their first events: none sees its end). ``note`` as it is otherwise (a deque
    that takes several graphs a pass and never filled up grows, as a list does)."""
    queue = _root(note.name)
    reads = recorder.full.get(queue, [])
    maxlen, held, items = recorder.filling.get(queue, (0, frozenset(), 0))
    # each item one pass's (a dict of its tensors, one built after the step: dated from the next pass), at most maxlen
    last = max((len({split.iteration_of_node(sequence) for sequence in read}) for read in reads), default=0)
    last = min(last, maxlen) if maxlen else last
    if last > 1:
        return dataclasses.replace(note, name=queue, grows=True, reset=False, bound=last)
    if not reads and len({split.iteration_of_node(sequence) for sequence in held}) >= items > 1:
        so_far = items if recorder.stopped or recorder.by_runs else 0
        return dataclasses.replace(note, name=queue, grows=True, reset=False, bound=maxlen, so_far=so_far, up_to=True)
    return note


def _where_it_grows(note: Note, recorder: Recorder) -> Note:
    """``note`` with the file of the line that grows its name (:func:`growing_line`), the name as that line spells it
    and the lines of that file that ran: the code the name was read in (a step's, a cell's: the model's ``forward``
    that built the graph may lie in another module or cell), else the file of the line that built it."""
    built = site_of(note.built_at)
    files = [file for file in dict.fromkeys((note.grows_in, built[0] if built else None)) if file is not None]
    framework = recorder.loop.innermost is None and not recorder.by_runs  # the learner's step has the only name
    placed = [
        dataclasses.replace(
            note, name=_as_grown(note.name, file, framework) or note.name, grows_in=file, ran=_ran_in(recorder, file)
        )
        for file in files
    ]
    for found in placed:
        line = growing_line(found.name, found.grows_in, found.ran) if found.grows_in else None
        spelled = re.search(either_quote(found.name), line[1]) if line is not None else None
        if spelled is not None:  # as the line spells its keys (``self.totals["critic"]``)
            return dataclasses.replace(found, name=spelled.group(0))
    for found in placed:  # grown under a function's own name for it (``losses = state["losses"]``)
        at = built[1] if built is not None and built[0] == found.grows_in and not note.parameter else None
        alias = local_alias(found.name, found.grows_in, at) if found.grows_in and at is not None else None
        if alias is not None:
            return dataclasses.replace(found, name=alias)
    return placed[-1] if placed else note


def _ran_in(recorder: Recorder, filename: str) -> frozenset[int]:
    """The lines of ``filename`` that ran while the line tracer followed the loop."""
    return frozenset(line for file, line in recorder.creation.ran if file == filename)


def _container(newest: str, root: str) -> str:
    """The list or dict that holds a name's newest graph, ``newest``: ``self.history['losses']`` of
    ``self.history['losses'][7]``, ``trainer.step_outputs`` of ``trainer.step_outputs[5]['logits']``; ``root``, the
    name whose count grew, when that graph is not an item of one."""
    return item_of(newest) or root


def _as_grown(container: str, filename: str, framework: bool = False) -> str | None:
    """``container`` as the line of ``filename`` that grows it spells it: ``self.history["losses"]`` for
    ``self.history['losses']``, ``self.outputs`` for a framework's ``trainer._connector.strategy._model.outputs``
    (the same last attribute and keys), and, in a ``framework``'s loop, where no loop of the learner's names it,
    ``self.epoch_loss`` of a step's ``self.epoch_loss = loss + self.epoch_loss``; None when no line grows it."""
    tail = re.search(r"(?:^|\.)(\w+)((?:\[[^\]]*\])*)$", container)
    if tail is None:
        return None
    grows = r"\s*(?:\.append\(|\.appendleft\(|\.extend\(|\.insert\(|\+=)"
    keys = tail.group(2).replace('"', "'")
    whole = container[: len(container) - len(tail.group(2))]
    pattern = re.compile(rf"(?<![\w.])((?:\w+\.)*{tail.group(1)})((?:\[[^\]]*\])*){grows}")
    # an attribute summed as ``self.epoch_loss = self.epoch_loss + loss`` (or ``loss + self.epoch_loss``)
    summed = re.compile(
        rf"(?<![\w.])((?:\w+\.)+{tail.group(1)})((?:\[[^\]]*\])*)\s*=(?!=)[^#]*?"
        r"(?:[-+*]\s*\1\2(?![\w.(\[])|(?<![\w.])\1\2\s*[-+*])"
    )
    key = re.fullmatch(r"\['(\w+)'\]", keys)  # a dict's list made at its first append: ``setdefault("loss", [])``
    made = (
        re.compile(rf"(?<![\w.])((?:\w+\.)*{tail.group(1)})\.setdefault\(\s*['\"]{key.group(1)}['\"]") if key else None
    )
    found = [
        (spelling.group(1) == whole, spelling.group(1) + (keys if spelling.re is made else spelling.group(2)))
        for code in (text.split("#", 1)[0] for text in linecache.getlines(filename))
        for spelling in [
            pattern.search(code)
            or (made.search(code) if made else None)
            or (summed.search(code) if framework else None)
        ]
        if spelling is not None and (spelling.re is made or spelling.group(2).replace('"', "'") == keys)
    ]
    return max(found, key=lambda candidate: candidate[0])[1] if found else None


def _one_per_container(found: list[Note]) -> list[Note]:
    """The notes of several items of one list (``losses[1]``, ``losses[2]``, ...) as one note of the list,
    which is the cause: it holds one more graph each iteration (a dict's named entries stay notes of their own)."""
    lists = {note.name: _list_of(note) for note in found}
    items = Counter(whole for whole in lists.values() if whole is not None)
    names = {note.name for note in found}
    kept: list[Note] = []
    merged: set[str] = set()
    for note in found:
        whole = lists[note.name]
        if whole is not None and whole in names and whole != note.name:
            continue  # the list's own note stands for its item (``history['loss'][1]``, read at a later start)
        if whole is None or items[whole] == 1:
            kept.append(note)
        elif whole not in merged:
            merged.add(whole)
            if whole not in names:  # else the list's own note stands for them
                parts = [part for part in found if lists[part.name] == whole]
                grows = any(part.grows for part in parts)
                one = all(part.one_element for part in parts)
                held = sum(part.held_bytes for part in parts)
                kept.append(Note(whole, parts[-1].built_at, held, grows, one_element=one, grows_in=parts[-1].grows_in))
    return kept


def _one_per_object(found: list[Note]) -> list[Note]:
    """The growing notes of two or more attributes of one plain object (an ``AverageMeter``'s ``losses.sum`` and
    ``losses.avg``, fed the loss tensor by ``losses.update(loss, n)``) as one note of the object: one line to change."""
    owners = Counter(owner for owner, _ in {tuple(n.name.rsplit(".", 1)) for n in found if _attribute_of_an_object(n)})
    kept: list[Note] = []
    for note in found:
        owner = note.name.rsplit(".", 1)[0] if _attribute_of_an_object(note) else None
        if owner is None or owners[owner] < 2:
            kept.append(note)
        elif owner not in (other.name for other in kept):
            parts = [part for part in found if part.name.rsplit(".", 1)[0] == owner and _attribute_of_an_object(part)]
            held = max(part.held_bytes for part in parts)
            attributes = tuple(dict.fromkeys(part.name for part in parts))
            kept.append(dataclasses.replace(parts[0], name=owner, held_bytes=held, attributes=attributes))
    return kept


def _fed_object(placed: Note, note: Note) -> Note:
    """A plain object's attribute that grows only in a method of its own (``self.total += loss`` in a logger's
    ``log``), fed the loss by a call of the loop's (``logger.log(batch_loss)``): the object's note, at that call, as
    a meter's; ``placed`` (``note`` placed where its name grows) as it is otherwise."""
    plain = note.grows and not note.parameter and not note.bound and not note.attributes
    # a logger's entry, keyed by the name the loop logs it under (``logger.records['train/loss']``, grown by
    # ``self.records.setdefault(key, []).append(value)``, no line the name spells): the call that feeds it
    keyed = re.fullmatch(r"(\w+)\.\w+\[(['\"])(.+?)\2\]", note.name) if plain else None
    fed = fed_line(keyed.group(1), placed.grows_in, placed.ran) if keyed and placed.grows_in else None
    key = (f'"{keyed.group(3)}"', f"'{keyed.group(3)}'") if keyed is not None and keyed.group(1) != "self" else ()
    if keyed is not None and fed is not None and any(spelled in fed[1] for spelled in key):
        return dataclasses.replace(placed, name=keyed.group(1), attributes=(note.name,))
    owner = re.fullmatch(r"(\w+(?:\.\w+)*)\.\w+", note.name) if plain else None
    if owner is None or owner.group(1) == "self" or not placed.name.startswith("self.") or placed.grows_in is None:
        return placed  # (a method's own ``self``: what it feeds itself, ``self.log(...)``, is no object of the loop's)
    grows = growing_line(placed.name, placed.grows_in, placed.ran)
    if grows is None or "+=" not in grows[1] or not _from_a_parameter(placed.grows_in, grows[0], grows[1]):
        return placed  # a total the caller feeds; not what the method computes itself (a step's outputs it keeps), nor
        # a queue it appends to (``self.queue.append(keys)``: its own line is where the graphs go in)
    if fed_line(owner.group(1), placed.grows_in, placed.ran) is None:
        return placed
    return dataclasses.replace(placed, name=owner.group(1), attributes=(note.name,))


def _from_a_parameter(filename: str, line: int, code: str) -> bool:
    """Whether what the statement ``code`` at ``line`` adds or appends reads a parameter of the method it is in
    (``self.total += loss`` in ``def log(self, loss)``): the value the caller feeds it."""
    tree = parsed(filename)
    function = function_around(tree, line) if tree is not None else None
    arguments = getattr(function, "args", None)
    names = [a.arg for a in arguments.args[1:] + arguments.kwonlyargs] if arguments is not None else []
    added = re.split(r"\+=|\.append\(|\.appendleft\(|\.extend\(", code, maxsplit=1)[-1]
    return any(re.search(rf"(?<![\w.]){re.escape(name)}\b", added) for name in names)


def _attribute_of_an_object(note: Note) -> bool:
    """Whether ``note`` is a growing attribute of a name (``losses.avg``), not an item, a parameter or a buffer."""
    plain = note.grows and not note.parameter and not note.bound  # a deque's note is its own (the last N graphs)
    # not a method's own ``self``: its attributes (a trainer's ``self.total`` and ``self.best``) are the learner's
    # lines to change, each where it grows; no call of the loop feeds that object
    return plain and re.fullmatch(r"\w+\.\w+", note.name) is not None and not note.name.startswith("self.")


def _one_per_line(found: list[Note]) -> list[Note]:
    """The notes of several entries of one dict that one line builds (``ema.shadow['0.weight']``,
    ``ema.shadow['0.bias']``, ... from ``self.shadow[name] = ...``) as one note of the dict: one line to change."""
    groups: dict[tuple[str, str], list[Note]] = {}
    for note in found:
        entry = re.match(r"^(.+?)\[[^\]]*\]$", note.name)
        if entry is not None and not note.parameter:
            groups.setdefault((entry.group(1), note.built_at), []).append(note)
    merged: dict[str, Note] = {}
    for (whole, built_at), parts in groups.items():
        if len(parts) > 1 and _keyed_by_a_variable(built_at, whole):
            held = max(part.held_bytes for part in parts)
            one = all(part.one_element for part in parts)
            grows, reset = any(part.grows for part in parts), all(part.reset for part in parts)
            note = Note(whole, parts[0].built_at, held, grows, reset=reset, one_element=one, entries=len(parts))
            note = dataclasses.replace(note, grows_in=parts[0].grows_in)
            merged.update({part.name: note for part in parts})
    kept = [merged.get(note.name, note) for note in found]
    return [note for i, note in enumerate(kept) if note not in kept[:i] or note.entries == 1]


def _keyed_by_a_variable(built_at: str, whole: str) -> bool:
    """Whether the line ``built_at`` ("file:line: code") stores into ``whole`` by a key the code computes
    (``self.shadow[name] = ...``), not by a key it spells (``state['hx'], state['cx'] = ...``: names of their own)."""
    code = re.search(r"(?::|, line )\d+: (.*)$", built_at)  # a script's "file:12: code", a cell's "..., line 3: code"
    attribute = re.escape(whole.rsplit(".", 1)[-1])
    return code is not None and re.search(rf"\b{attribute}\[\s*[A-Za-z_][\w.]*\s*\]\s*=[^=]", code.group(1)) is not None


def _list_of(note: Note) -> str | None:
    """``losses`` of the note of ``losses[3]`` (and of ``history[3][1]``, an item of a list of lists, and of
    ``log[0]['loss']``, an entry of a list's item); None for anything else."""
    item = re.match(r"^(.+?)(?:\[\d+\])+(?:\['[^\]]*'\])*$", note.name)
    return item.group(1) if item is not None and not note.parameter else None


def _one_element(shape: tuple[int, ...] | None) -> bool:
    """Whether a tensor of ``shape`` is a single number (unknown: taken as one, a loss)."""
    return shape is None or math.prod(shape) == 1


def _dropped(spans: list[int], holder: str, recorder: Recorder) -> bool:
    """Whether a later start saw fewer iterations' graphs than an earlier one, or ``holder`` with this pass's alone
    or a plain number after it held earlier passes' (``total = 0`` every few passes)."""
    grown = recorder.growth.get(holder)
    return any(later < earlier for earlier, later in itertools.pairwise(spans)) or (grown is not None and grown.emptied)


def _more_entries(root: str, entries: dict[tuple[str, int], set[str]]) -> bool:
    """Whether more of ``root``'s entries hold graphs at its last sighting than at its first (a list appended to),
    or it was seen once: a fixed set of keys each overwritten in its own iterations (StyleGAN2's ``loss_dict``, a
    regulariser's loss every second iteration) holds graphs of several iterations at once, and no more over a run."""
    counts = [len(names) for (name, _), names in sorted(entries.items(), key=lambda kv: kv[0][1]) if name == root]
    return len(counts) < 2 or counts[-1] > counts[0]


def _root(holder: str) -> str:
    """The name whose items a holder is: ``losses`` of ``losses[3]``, ``model.memory`` of ``model.memory[2]``; an
    object's attributes are names of their own (a meter's ``val``, this pass's loss, beside its growing ``avg``)."""
    return re.sub(r"(\[[^\]]*\])+$", "", holder)


def _below_a_submodule(name: str) -> bool:
    """``model.block.loss`` (an attribute two levels below what the loop holds), not ``model.hidden`` nor
    ``ema.shadow['0.weight']`` (a key's dots are no attributes)."""
    return re.sub(r"\[[^\]]*\]", "", re.sub(r"^\w+", "", name)).count(".") > 1
