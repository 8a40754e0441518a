"""Notes: graphs a name keeps alive that no backward walks again (a running total of losses kept as tensors, a list of
losses for logging), judged from the names the recorder read at iterations' starts.

:func:`notes` keeps a name's note when it holds graphs of several iterations at once, or one graph reaching back over
several (``running_loss += loss`` after the step: read at the next pass's first event, the graph dates from that
pass, and reaches back before it); a name the next iteration rebinds holds one iteration's graph at a time, and its
note says it does not grow.

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backward_twice.judge.built import built_line
from backward_twice.record.held import HeldGraph
from backward_twice.record.iterations import Split

if TYPE_CHECKING:
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


def notes(recorder: Recorder, split: Split) -> list[Note]:
    """Graphs a name still held in a later iteration than the one that built them (or, built before the loop, in
    the first), that no backward of that iteration or a later one walked."""
    walked: dict[int, int] = {}  # node -> the last iteration whose backward walked it
    for call in recorder.calls:
        iteration = split.iteration_of_call(call.index)
        for sequence in call.old:
            walked[sequence] = max(walked.get(sequence, 0), iteration)
    last = max(1, split.count + (1 if recorder.error is not None else 0))
    held: list[tuple[str, int, int, HeldGraph, bool]] = []  # (holder, node, built, what it holds, late)
    for sequence, held_graph in recorder.held_from.items():
        holder = held_graph.holder
        held_in = split.iteration_of_sighting(held_graph.sighting)
        built = split.iteration_of_node(sequence)
        earliest = split.iteration_of_node(held_graph.earliest)
        # built since the last pass's last event and reaching back before it: a total kept across passes
        late = built == held_in and earliest < held_in
        oldest, checked = (earliest, held_graph.earliest) if late else (built, sequence)
        if not oldest < held_in <= last or walked.get(checked, 0) >= held_in:
            continue
        named = recorder.names.get(sequence)
        if _below_a_submodule(holder) and (named is None or named.container != "parameter"):
            continue  # a loss module's self.loss: the model's own bookkeeping (a parameter with a graph never is)
        held.append((holder, sequence, built, held_graph, late))
    together: dict[tuple[str, int], set[int]] = {}  # (a name's root, a sighting) -> the iterations whose graphs it
    for holder, _, built, held_graph, _ in held:  # held there: a name rebound each iteration holds one at a time
        together.setdefault((_root(holder), held_graph.sighting), set()).add(built)
    growing = {root for (root, _), built in together.items() if len(built) > 1}
    reach_back: dict[str, list[tuple[int, int]]] = {}  # holder -> (sighting, how many iterations its graph spans)
    for holder, _, built, held_graph, late in held:
        spans = built - (1 if late else 0) - split.iteration_of_node(held_graph.earliest) + 1
        reach_back.setdefault(holder, []).append((held_graph.sighting, spans))
    reset = {holder for holder, seen in reach_back.items() if _dropped([spans for _, spans in sorted(seen)])}
    by_name: dict[str, Note] = {}
    for name, grown in recorder.growth.items():  # a list or dict that holds one more graph at every start
        named = recorder.names.get(grown.newest)
        if grown.grew and named is not None and not _below_a_submodule(name):
            built = split.iteration_of_node(grown.newest)
            by_name[name] = Note(name, built_line(named, built == 0, recorder), grown.newest_bytes, True)
    for holder, sequence, built, held_graph, late in held:
        # a late graph (built after the last event of its pass: ``return loss / 3`` after the step) counts as the
        # next pass's, so reaching back one pass is its own pass's loss: only further back does it pile up
        reach = split.iteration_of_node(held_graph.earliest)
        grows = _root(holder) in growing or reach < built - (1 if late else 0)
        named = recorder.names[sequence]
        line = built_line(named, built == 0, recorder)
        parameter = named.container == "parameter"
        known = by_name.setdefault(
            holder, Note(holder, line, held_graph.graph_bytes, grows, parameter, grows and holder in reset)
        )
        if grows and not known.grows:  # a later start showed it growing (running_loss += loss: from pass 3 on)
            by_name[holder] = dataclasses.replace(known, grows=True, reset=holder in reset)
        for alias in named.aliases if holder == named.name else ():  # the other outputs of one node (w1, w2)
            by_name.setdefault(alias, Note(alias, line, 0, grows))
    return _one_per_container(list(by_name.values()))


def _one_per_container(found: list[Note]) -> list[Note]:
    """The notes of several items of one list (``losses[1]``, ``losses[2]``, ...) as one note of the list,
    which is the cause: it holds one more graph each iteration (a dict's named entries stay notes of their own)."""
    items: dict[str, list[Note]] = {}
    for note in found:
        container = re.match(r"^(.+?)\[\d+\]$", note.name)
        if container is not None and not note.parameter:
            items.setdefault(container.group(1), []).append(note)
    merged = {whole: parts for whole, parts in items.items() if len(parts) > 1}
    kept: list[Note] = []
    for note in found:
        container = re.match(r"^(.+?)\[\d+\]$", note.name)
        whole = container.group(1) if container is not None else None
        if whole in merged:
            parts = merged.pop(whole)
            if not any(other.name == whole for other in found):
                grows = any(p.grows for p in parts)
                kept.append(Note(whole, parts[-1].built_at, sum(p.held_bytes for p in parts), grows))
            continue
        if whole is None or whole not in items or len(items[whole]) == 1:
            kept.append(note)
    return kept


def _dropped(spans: list[int]) -> bool:
    """Whether a later start saw fewer iterations' graphs than an earlier one (``total = 0`` every few passes)."""
    return any(later < earlier for earlier, later in itertools.pairwise(spans))


def _root(holder: str) -> str:
    """``losses`` of ``losses[3]``, ``model`` of ``model.memory``."""
    return re.split(r"[\[.]", holder, maxsplit=1)[0]


def _below_a_submodule(name: str) -> bool:
    """``model.block.loss`` (an attribute two levels below what the loop holds), not ``model.hidden``."""
    return re.sub(r"^\w+(\[[^\]]*\])*", "", name).count(".") > 1
