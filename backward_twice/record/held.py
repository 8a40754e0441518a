"""What the loop holds into each iteration: a graph a name keeps at an iteration's start, a name (a list, a
dict, an object) that holds one more graph at every start, and a deque with a maxlen that is full of graphs.

:func:`note_names` is the recorder's look at the learner's names
(:func:`backward_twice.record.names.names_holding_graphs`): the simplest name of each node, the name that holds a graph
into an iteration (a carried graph's fix uses it), and what each holds, with its graph-only bytes (at most three graphs
per name: a name rebound every iteration holds one iteration's graph at a time, and is counted, not kept). A deque
full of graphs is kept with the nodes it holds, this pass's with them: each append pushes its oldest graph out, so
read at a pass's first event (after the pass's own append) its count of earlier passes' graphs stays the same.

Used by :mod:`backward_twice.judge.notes`, :mod:`backward_twice.record.pass_stops` and
:mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import re
import types
from collections import Counter
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.autograd.graph import Node

from backward_twice.record.names import LIST_ITEM, CodeSite, NamedGraph, names_holding_graphs, simpler
from backward_twice.record.passes import IterationLoop
from backward_twice.record.saved import graph_only_bytes, python_walk
from backward_twice.record.walks import kept

__all__ = [
    "Growth",
    "HeldGraph",
    "Holding",
    "event_names",
    "held_graph",
    "item_of",
    "names_read_due",
    "note_growth",
    "note_names",
    "read_at_its_stop",
]

_MAX_NAMES, _HELD_PER_NAME = 50_000, 8  # names kept; graphs a name is followed into (at passes 2-4, 8, ..., 128)
_CARRIER_SPELLINGS = 8  # names kept per graph held into an iteration
_FULL_READS = 8  # reads kept per deque full of graphs


@dataclass(frozen=True)
class HeldGraph:
    """A graph the loop held into an iteration: when it first did (a sighting), its graph-only bytes, its holder,
    and the sequence number of the earliest node it reaches (a running total reaches back to the first iteration)."""

    sighting: int
    graph_bytes: int
    holder: str
    earliest: int


@dataclass(slots=True)
class Growth:
    """How many graphs a name (a list, a dict, an object's attributes) held at the last iteration's start, how often
    that count grew from one start to the next, and its newest node's sequence number."""

    count: int = 0
    grew: int = 0
    newest: int = 0
    newest_bytes: int = 0  # the graph-only bytes of the newest graph when the count last grew
    newest_name: str = ""  # its spelling under the name
    # how many graphs each list, dict or object under the name held at the last start (``optim.parameters``): the
    # count grows when one of them holds more, not when another starts holding some (a list a method fills once)
    by_container: dict[str, int] = field(default_factory=dict)
    # the spellings that held a graph at some start (up to _SPELLINGS_SEEN): a count that grows by those alone is a
    # fixed set of keys each rewritten in its own iterations (StyleGAN2's ``loss_dict``), not a name that grows
    seen: set[str] = field(default_factory=set)
    emptied: bool = False  # a list under the name that grew let its oldest graph go by a later start (a clear)
    oldest: dict[str, int] = field(default_factory=dict)  # each list's oldest node at the last start
    # each list or dict under the name that grew (``state['parts']`` beside ``state['totals']``): its newest node,
    # that node's spelling and graph-only bytes when it last grew
    grown_in: dict[str, tuple[int, str, int]] = field(default_factory=dict)


def held_graph(node: Node, sighting: int, holder: str, key: str, reached: list[Node] | None = None) -> HeldGraph:
    """The graph under ``node`` as held at a sighting: its graph-only bytes (the buffers a recorder stamping under
    ``key`` saw kept) and the earliest node it reaches (``reached``: its nodes, if walked already)."""
    reached = python_walk([node]) if reached is None else reached
    alive = [n for n in reached if kept(n, key)]
    return HeldGraph(sighting, graph_only_bytes(alive), holder, earliest(node, reached))


def earliest(node: Node, reached: list[Node]) -> int:
    """The sequence number of the earliest node of ``reached``, the graph under ``node``."""
    return min((n._sequence_nr() for n in reached), default=node._sequence_nr())


def note_growth(
    growth: dict[str, Growth], held_under: dict[str, dict[int, str]], nodes: dict[int, Node], key: str
) -> None:
    """At an iteration's start: each name's count of graphs held (``held_under``: node -> its spelling under the
    name), how often it grew, and the newest's spelling (``m.training_step_outputs[5]``, where the step's own name for
    it is ``loss``): the newest an item of a list or dict spells, if any (what grows is a container; read at a
    framework's optimizer step, this step's ``trainer.model.aux_loss`` is newer than any its callback has kept yet)."""
    for name, held in held_under.items():
        grown = growth.setdefault(name, Growth())
        containers = Counter(_container_of(spelled) for spelled in held.values())
        full = len(grown.seen) >= _SPELLINGS_SEEN
        new = {_container_of(spelled) for spelled in held.values() if full or spelled not in grown.seen}
        more = {c for c, count in containers.items() if count > grown.by_container.get(c, count) and c in new}
        if not full:
            grown.seen.update(held.values())
        lists = {_container_of(spelled) for spelled in grown.seen | set(held.values()) if LIST_ITEM.search(spelled)}
        if (len(held) > grown.count or lists & more) and grown.count and more:  # a list grew (another let one go)
            grown.grew += 1
            grown.newest = max(
                (s for s, spelled in held.items() if spelled.endswith("]") and _container_of(spelled) in more),
                default=max(s for s, spelled in held.items() if _container_of(spelled) in more),
            )
            grown.newest_name = held[grown.newest]
            for container in more:
                sequence = max(s for s, spelled in held.items() if _container_of(spelled) == container)
                newest = nodes.get(sequence)
                reached = python_walk([newest]) if newest is not None else []
                nbytes = graph_only_bytes([n for n in reached if kept(n, key)])
                grown.grown_in[container] = (sequence, held[sequence], nbytes)
            grown.newest_bytes = grown.grown_in.get(_container_of(grown.newest_name), (0, "", 0))[2]
        members: dict[str, set[int]] = {}
        for sequence, spelled in held.items():
            if LIST_ITEM.search(spelled):
                members.setdefault(_container_of(spelled), set()).add(sequence)
        if grown.grew and any(oldest not in members.get(c, ()) for c, oldest in grown.oldest.items()):
            grown.emptied = True  # read at passes 1-4, 8, 16, ...: a count alone may look the same after a clear
        grown.oldest = {c: min(nodes) for c, nodes in members.items()}
        grown.count, grown.by_container = len(held), dict(containers)


_SPELLINGS_SEEN = 64  # past as many, a name's growth is read from its counts alone


def _container_of(spelled: str) -> str:
    """The list, dict or object a name's spelling reaches a graph in: ``optim.parameters`` of
    ``optim.parameters['mu']``, ``model`` of ``model.h``; the name itself when it holds the tensor."""
    return item_of(spelled) or spelled.rsplit(".", 1)[0]


def item_of(spelled: str) -> str | None:
    """The list (or dict by numbers) whose item a spelling ends in, before any keys of the item's own: ``outputs`` of
    ``outputs[3]['logits']`` (a list of a model's outputs), ``history['losses']`` of ``history['losses'][7]``;
    ``optim.parameters`` of ``optim.parameters['mu']``, a dict's entry; None for no item."""
    chain = re.match(r"^(.+?)((?:\[[^\]]*\])+)$", spelled)
    if chain is None:
        return None
    keys = re.findall(r"\[[^\]]*\]", chain.group(2))
    first = next((i for i, key in enumerate(keys) if re.fullmatch(r"\[\d+\]", key)), len(keys) - 1)
    return chain.group(1) + "".join(keys[:first])


class Holding(Protocol):
    """What :func:`note_names` and :func:`event_names` read and keep on the recorder
    (:class:`backward_twice.record.recorder.Recorder`): where the learner's frames end, the names seen and the
    graphs they hold, and the counts that say when to look."""

    @property
    def by_runs(self) -> bool: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def loop(self) -> IterationLoop: ...
    @property
    def calls(self) -> Sized: ...
    @property
    def events(self) -> int: ...
    @property
    def sightings(self) -> list[int]: ...
    @property
    def starts(self) -> list[int]: ...
    @property
    def skipped(self) -> tuple[str, ...]: ...
    @property
    def roots(self) -> Callable[[], list[tuple[str, Any]]] | None: ...
    @property
    def outermost(self) -> types.FrameType | None: ...
    @property
    def roots_where(self) -> CodeSite | None: ...
    @property
    def names(self) -> dict[int, NamedGraph]: ...
    @property
    def held_from(self) -> dict[int, HeldGraph]: ...
    @property
    def carriers(self) -> dict[int, list[str]]: ...
    @property
    def held_per_name(self) -> dict[str, int]: ...
    @property
    def growth(self) -> dict[str, Growth]: ...
    @property
    def full(self) -> dict[str, list[frozenset[int]]]: ...
    @property
    def filling(self) -> dict[str, tuple[int, frozenset[int], int]]: ...
    @property
    def key(self) -> str: ...
    def fail(self, where: str, error: BaseException) -> None: ...


def names_read_due(count: int) -> bool:
    """Whether the names are read at a loop's ``count``-th pass: the first 4, then the 6th, 8th, 12th, 16th, 24th,
    ...: a read costs a walk of the loop's objects, and what grows keeps growing; reads at powers of two alone would
    meet a total reset every 4 or 8 passes at the same point of its cycle each time, and never see it emptied."""
    return count <= 4 or count & (count - 1) == 0 or (count % 3 == 0 and (count // 3) & (count // 3 - 1) == 0)


def event_names(recorder: Holding, frame: types.FrameType, opens: bool = False) -> None:
    """At an event (a backward call, an optimizer step, a mark): with a loop of the learner's, the names are read at
    its passes' starts instead (what is held there is what can carry a graph into the next iteration); without one,
    now: at the first 16 events, then at the 32nd, 64th, ... (a framework's objects are many, and its loop can be
    long). ``opens``: the event may end an iteration (an optimizer step that splits the run), so what the names hold
    now is held into the next one, as at a pass's start."""
    if recorder.by_runs:
        note_names(recorder, frame)
    elif not recorder.loop.iteration_passes():
        count = len(recorder.calls) + recorder.events
        if count <= 16 or count & (count - 1) == 0:
            if opens:
                recorder.starts.append(len(recorder.sightings))
            note_names(recorder, frame)


def read_at_its_stop(recorder: Holding, frame: types.FrameType | None) -> None:
    """What a framework's step N left held into step N+1, read where ``iterations=N`` stops its loop (its call
    returning into the learner's code, ``frame`` the framework's frame that returns): a callback's ``on_step_end``
    appends after the optimizer step, where the names were last read. Nothing when ``frame`` is None (the framework
    called the learner's step again) or the run stopped after one step."""
    try:
        if frame is not None and len(recorder.starts) > 1:
            recorder.starts.append(len(recorder.sightings))
            note_names(recorder, frame)
    except Exception as error:
        recorder.fail("where your framework's loop stopped", error)


def _in_the_loops_frame(recorder: Holding, named: NamedGraph) -> bool:
    """Whether ``named`` is a variable of the frame the iteration's loop runs in: it lives from pass to pass."""
    link = recorder.loop.innermost
    if link is None or named.frame is None:
        return False
    code = link.code
    return named.frame == CodeSite(code.co_filename, code.co_firstlineno, code.co_name)


def note_names(recorder: Holding, frame: types.FrameType | None, built_before: int | None = None) -> None:
    """Keep the names that hold graphs now (the simplest spelling of each node); at an iteration's start, also
    which graphs are held into it, with their graph-only bytes (a note, if no later backward walks them).
    ``built_before``: read inside the first pass, only the graphs built before that sequence number are held
    into it."""
    sighting = len(recorder.sightings)
    recorder.sightings.append(torch._C._autograd._get_sequence_nr())
    at_start = bool(recorder.starts) and recorder.starts[-1] == sighting
    held_under: dict[str, dict[int, str]] | None = {} if at_start else None
    bounded: dict[str, tuple[int, set[int], set[str]]] | None = {} if at_start else None
    atoms: set[str] | None = set() if at_start else None
    nodes: dict[int, Node] = {}
    loop = recorder.loop.innermost
    lives = CodeSite(loop.code.co_filename, loop.code.co_firstlineno, loop.code.co_name) if loop is not None else None
    for named, node in names_holding_graphs(
        frame,
        recorder.skipped,
        sighting,
        recorder.roots,
        recorder.outermost,
        recorder.roots_where,
        held_under,
        lives,
        bounded,
        atoms,
    ):
        sequence = named.sequence
        nodes[sequence] = node
        known = recorder.names.get(sequence)
        if known is None:
            if len(recorder.names) >= _MAX_NAMES:
                dropped = next(iter(recorder.names))
                recorder.names.pop(dropped)
                recorder.held_from.pop(dropped, None)
            recorder.names[sequence] = named
        elif simpler(named.name, known.name) or (named.name == known.name and known.event == 0):
            recorder.names[sequence] = named  # a simpler name, or the loop's own frame over the watch's
        held_in = at_start and (built_before is None or sequence < built_before)
        if held_in:  # what holds it into the next iteration: the name a carried graph's fix uses
            carrier = named.holder if named.local and named.holder else named.name
            spellings = recorder.carriers.setdefault(sequence, [])  # each name that held it, simplest first: the
            for spelled in (carrier, *named.same):  # judge keeps one the loop reads before it assigns it
                if spelled not in spellings and len(spellings) < _CARRIER_SPELLINGS:  # (``smooth``, not ``loss``)
                    # a parameter by its module's path first (not ``p``, a setup loop's variable left holding it)
                    simplest = (i for i, known in enumerate(spellings) if simpler(spelled, known))
                    at = len(spellings) if named.container == "parameter" else next(simplest, len(spellings))
                    spellings.insert(at, spelled)
        holder = named.holder or named.name
        followed = recorder.held_per_name.get(holder, 0)
        # A function's own variable is rebound at its next call: what the loop holds is in its dicts, objects,
        # modules and globals. A node a backward walked without a retain has no buffers left (as written: with
        # keep_buffers the recorder keeps them, so they are left out here the same way). Read at a pass's first
        # event, what ran after the last pass's last event (``running_loss += loss`` after the step, a global or
        # the loop's own variable) dates from this pass: held too if its graph reaches back before the pass.
        late = at_start and not held_in and built_before is not None and recorder.loop.iterations_started() >= 2
        # where iterations=N stopped, pass N+1 will not rebind the loop's own variables: what they hold (a running
        # total local to a train() function) is read as a global's would be
        own = named.local and _in_the_loops_frame(recorder, named)
        if (
            ((held_in and (not named.local or (own and recorder.stopped))) or (late and (not named.local or own)))
            and sequence not in recorder.held_from
            and followed < _HELD_PER_NAME
        ):
            reached = python_walk([node])  # its bytes are counted only for a graph held into the pass
            if held_in or (built_before is not None and earliest(node, reached) < built_before):
                recorder.held_from[sequence] = held_graph(node, sighting, holder, recorder.key, reached)
                recorder.held_per_name[holder] = followed + 1
            elif followed:  # it held earlier passes' graphs, now this pass's alone: the loop reset it (``total = 0``)
                recorder.growth.setdefault(holder, Growth()).emptied = True
    if held_under and built_before is not None:  # read inside the pass: what it built is not held into it
        held_under = {name: {s: n for s, n in held.items() if s < built_before} for name, held in held_under.items()}
    note_growth(recorder.growth, held_under or {}, nodes, recorder.key)
    for name in (atoms or set()) & recorder.held_per_name.keys():  # a total that held graphs, set back to 0
        recorder.growth.setdefault(name, Growth()).emptied = True
    for queue, (maxlen, held, items) in (bounded or {}).items():  # full or not by its items (a dict of tensors each)
        if len(items) > 1:  # its maxlen bounds what it holds; not full yet (a short run), it says how many it would
            recorder.filling[queue] = (maxlen, frozenset(held), len(items))
        reads = recorder.full.setdefault(queue, []) if len(items) >= maxlen > 1 else None  # one graph: a rebinding
        if reads is not None and len(reads) < _FULL_READS:
            reads.append(frozenset(held))
