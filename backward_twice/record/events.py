"""The events a recording cuts iterations at, as plain records: an optimizer step, the end of an iteration, and the
key of an event the recorder read the learner's names at; an optimizer's key in them (:class:`OptimizerKeys`); and
where a recorder failed (:class:`Failure`).

Used by :mod:`backward_twice.record.evidence`, :mod:`backward_twice.record.folds`,
:mod:`backward_twice.record.iterations`, :mod:`backward_twice.record.pass_stops`, :mod:`backward_twice.record.recorder`
and :mod:`backward_twice.record.stale_step`.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

__all__ = ["EventKey", "Failure", "IterationEnd", "OptimizerKeys", "StepEvent"]

# an event the recorder saw: ("mark" or "call", its index among its kind; a step keeps its own)
EventKey = tuple[str, int]


@dataclass(frozen=True)
class IterationEnd:
    """Where an iteration ends: the engine's sequence counter there (nodes numbered below it were built before),
    how many backward calls were made before it, and which iteration it ends (1-based: a long run's folded
    iterations, :mod:`backward_twice.record.folds`, leave gaps between the ends it keeps)."""

    sequence: int
    calls: int
    iteration: int


class StepEvent(NamedTuple):
    """An optimizer step the recorder saw: the optimizer's id, the engine's sequence counter then, how many
    backward calls came before it, the learner's line that called ``step()``, which step of its optimizer it is
    (1-based: a long run's folded steps, :mod:`backward_twice.record.folds`, leave gaps), and the recorder's sighting
    there when the steps split the run (-1: a loop of the learner's did). A named tuple: one is made at every step,
    and a tuple is made faster than a frozen dataclass."""

    optimizer: int
    sequence: int
    calls: int
    line: str
    number: int = 0
    sighting: int = -1


@dataclass(frozen=True)
class Failure:
    """Where the recorder failed and switched itself off: what it was doing, its error, the backward calls seen."""

    where: str
    error: str
    calls: int


class OptimizerKeys:
    """Each optimizer's key in the records: its ``id()``, unless an optimizer seen before, gone since, had that id (a
    pretraining function's ``SGD``, then a fine-tuning function's ``Adam`` at the same address): then a key of its
    own, so the two are never counted as one."""

    def __init__(self) -> None:
        self._keys: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._taken: set[int] = set()
        self._fresh = itertools.count(-1, -1)
        self._last: tuple[weakref.ref[Any], int] | None = None  # the last one asked (one optimizer steps each time)
        self.kinds: dict[int, str] = {}  # of those that stepped, by key: the class's name
        self.seen: dict[
            int, weakref.ref[torch.optim.Optimizer]
        ] = {}  # and a weak reference, to read their parameters later

    def __call__(self, optimizer: Any) -> int:
        last = self._last
        if last is not None and last[0]() is optimizer:
            return last[1]
        key = self._keys.get(optimizer)
        if key is None:
            key = id(optimizer) if id(optimizer) not in self._taken else next(self._fresh)
            self._keys[optimizer] = key
            self._taken.add(key)
        self._last = (weakref.ref(optimizer), key)
        return key

    def stepped(self, optimizer: torch.optim.Optimizer) -> int:
        """The key of an optimizer that steps, its kind and a weak reference to it kept the first time."""
        key = self(optimizer)
        if key not in self.seen:
            self.kinds.setdefault(key, type(optimizer).__name__)
            self.seen[key] = weakref.ref(optimizer)
        return key

    def live_ids(self) -> set[int]:
        """The ids of the optimizers seen that are still alive."""
        return {id(optimizer) for optimizer in list(self._keys.keys())}
