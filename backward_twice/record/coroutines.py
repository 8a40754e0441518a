"""A coroutine's or a generator's frame that leaves and comes back: not a return, not a new call.

A trace or profile function gets a ``return`` event where an ``async def`` awaits (``x, y = await fetch(b)``) or a
generator yields, and a ``call`` event where it resumes, on the same frame, in the middle of its code. Taken for a
call's end and a new call, a training loop in an ``async def`` lost its passes at each ``await``, and the stop of
``iterations=N`` armed for "the next call of the step function" went off at the ``await`` after pass N's step,
before pass N's logging ran. :func:`suspended` tells a ``return`` event that is a suspension; :func:`resumed` a
``call`` event that is a resumption: the frame stands past its code's start, where a first call stands.

Used by :mod:`backward_twice.record.lines` and :mod:`backward_twice.record.stops`.
"""

from __future__ import annotations

import dis
import inspect
import types

__all__ = ["resumed", "suspended"]

_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
_YIELDS = frozenset({"YIELD_VALUE", "YIELD_FROM"})
_RETURNS = frozenset({"RETURN_VALUE", "RETURN_CONST"})
# by id(code), the code kept beside (a code object hashes its whole bytecode at each lookup): its instructions' names
# by offset, and where a first call stands (the first RESUME, from Python 3.11; -1 before it)
_read: dict[int, tuple[types.CodeType, dict[int, str], int]] = {}


def _instructions(code: types.CodeType) -> tuple[dict[int, str], int]:
    known = _read.get(id(code))
    if known is None or known[0] is not code:
        names = {instruction.offset: instruction.opname for instruction in dis.get_instructions(code)}
        start = min((offset for offset, name in names.items() if name == "RESUME"), default=-1)
        known = _read[id(code)] = (code, names, start)
    return known[1], known[2]


def suspended(frame: types.FrameType) -> bool:
    """Whether a ``return`` event of ``frame`` is its code yielding (an ``await``, a ``yield``), to come back: it
    stands at a yield (3.11, 3.12), just past one (3.13: at the RESUME after it) or just before one (3.10: at the
    LOAD_CONST before an ``await``'s YIELD_FROM), not at a return."""
    code = frame.f_code
    if not code.co_flags & _SUSPENDS:
        return False
    names, _ = _instructions(code)
    offset = frame.f_lasti
    if names.get(offset) in _RETURNS:
        return False
    return any(names.get(around) in _YIELDS for around in (offset, offset - 2, offset + 2))


def resumed(frame: types.FrameType) -> bool:
    """Whether a ``call`` event of ``frame`` is its code coming back after it yielded, not a new call: a first call
    stands at the code's start (its first RESUME, or -1), a resumed one past it."""
    code = frame.f_code
    if not code.co_flags & _SUSPENDS:
        return False
    return frame.f_lasti > _instructions(code)[1]
