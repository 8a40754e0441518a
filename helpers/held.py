"""What the loop holds into each iteration: a graph a name keeps at an iteration's start, and a name (a list, a
dict, an object) that holds one more graph at every start.

Used by :mod:`helpers.recorder` and :mod:`helpers.verdicts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.autograd.graph import Node

from helpers.saved import graph_only_bytes, python_walk
from helpers.walks import kept

__all__ = ["Growth", "HeldGraph", "held_graph", "note_growth"]


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


def held_graph(node: Node, sighting: int, holder: str, key: str) -> HeldGraph:
    """The graph under ``node`` as held at a sighting: its graph-only bytes (the buffers a recorder stamping under
    ``key`` saw kept) and the earliest node it reaches."""
    reached = python_walk([node])
    alive = [n for n in reached if kept(n, key)]
    earliest = min((n._sequence_nr() for n in reached), default=node._sequence_nr())
    return HeldGraph(sighting, graph_only_bytes(alive), holder, earliest)


def note_growth(growth: dict[str, Growth], held_under: dict[str, set[int]], nodes: dict[int, Node], key: str) -> None:
    """At an iteration's start: each name's count of graphs held (``held_under``), and how often it grew."""
    for name, held in held_under.items():
        grown = growth.setdefault(name, Growth())
        if len(held) > grown.count and grown.count:
            grown.grew += 1
            grown.newest = max(held)
            newest = nodes.get(grown.newest)
            reached = python_walk([newest]) if newest is not None else []
            grown.newest_bytes = graph_only_bytes([n for n in reached if kept(n, key)])
        grown.count = len(held)
