"""What a loop's ``for`` names hold at an event, as tokens two events compare: whether a new pass began between them
(a batch is another object, a counter another number), and how many passes ran with no event between them.

Used by :mod:`backward_twice.record.passes`.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

from backward_twice.record.loops import Loop

__all__ = ["bound_tokens", "same_tokens", "skipped_passes"]

_SAME = object()  # a value a weak reference cannot hold: compared by identity, kept strongly one pass
_PLAIN = (int, float, str, bytes, bool)  # a value a ``for`` binds that is compared by value


def bound_tokens(frame: types.FrameType, loop: Loop, unread: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    """What the loop's ``for`` names hold now, as comparable tokens: a number or text by value, an object by a weak
    reference (or the object itself, when it takes none: a list, a tuple, a dict); ``unread`` names as a token equal
    to any (at a pass's start, those the body rebinds before its first event hold what it has not rebound yet)."""
    names = frame.f_locals if loop.targets else {}
    tokens: list[Any] = []
    for name in loop.targets:  # one its body rebinds tells nothing (``images = images.reshape(...)``): the others do
        if name in unread:
            tokens.append(("any", None))
            continue
        value = names.get(name, _SAME) if name not in loop.rebound or loop.rebound.issuperset(loop.targets) else None
        if value is _SAME:  # a name the function declares global (a cell's body run as one by ``%%diagnose``)
            value = frame.f_globals.get(name, _SAME)
        if value is None or isinstance(value, _PLAIN):
            tokens.append(("value", value))
        else:
            try:
                tokens.append(("ref", weakref.ref(value)))
            except TypeError:
                tokens.append(("object", value))
    return tuple(tokens)


def skipped_passes(loop: Loop, before: tuple[Any, ...], now: tuple[Any, ...]) -> int:
    """How many passes with no event ran between two events of a loop that counts its passes by one
    (``for i in range(n)``: ``i`` went from 3 to 6, so passes 4 and 5 ran without one, a ``continue`` or a step every
    other pass), from what its counter held at each; where its counter went back, or ``before`` is empty (a new call
    of its function), those of the new run before this event, for a counter that starts at 0."""
    index = loop.counter
    if index < 0 or index >= len(now) or loop.targets[index] in loop.assigned:  # rebound: counts nothing
        return 0
    kind_now, count_now = now[index]
    if kind_now != "value" or type(count_now) is not int:
        return 0
    if index >= len(before):
        return count_now if loop.from_zero else 0
    kind_before, count_before = before[index]
    if kind_before != "value" or type(count_before) is not int:
        return 0
    if count_now <= count_before:  # run again (a frame of the same id, its function called again)
        return count_now if loop.from_zero else 0
    return count_now - count_before - 1


def same_tokens(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two reads of a loop's names (:func:`bound_tokens`) hold the same values and objects."""
    for (kind_a, held_a), (kind_b, held_b) in zip(a, b):
        if kind_a == "any" or kind_b == "any":
            continue
        if kind_a != kind_b:
            return False
        if kind_a == "value" and held_a != held_b:
            return False
        if kind_a == "ref" and (held_a() is None or held_a() is not held_b()):
            return False
        if kind_a == "object" and held_a is not held_b:
            return False
    return len(a) == len(b)
