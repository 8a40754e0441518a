"""The fix for the learner's statement that changed a saved tensor in place: that statement written out of place, in
their names (``h = h + 1``), or a copy made before it (``h = h.clone()`` before ``h[mask] = 0``); for a module's
buffer, from detached values (it lives on into the next iteration).

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import re

from backward_twice.record.in_place import in_place_statement, out_of_place
from backward_twice.record.learner import source_lines

__all__ = ["in_place_fix"]


def in_place_fix(filename: str, line: int) -> str:
    """The fix for the learner's in-place statement at ``line``: that statement written out of place, in their names
    (``h = h + 1``), or a copy made before it (``h = h.clone()`` before ``h[mask] = 0``)."""
    statement = in_place_statement(filename, line)
    rewritten = out_of_place(statement) if statement is not None else None
    if rewritten is None:
        return f"write line {line} out of place: a new tensor, not a change of the one the forward saved"
    changed = re.match(r"(?:self|\w+)\.(\w+) = ", rewritten)
    buffer = changed is not None and _a_buffer(filename, changed.group(1))
    if rewritten.endswith(".clone()") and buffer and isinstance(statement, ast.Assign):
        # the copy would take the stored value's graph into the next iteration (MoCo's queue written in the forward)
        stored = f"{ast.unparse(statement.targets[0])} = {ast.unparse(statement.value)}.detach()"
        return f"add `{rewritten}` before line {line}, and store a detached value there: `{stored}`"
    if rewritten.endswith(".clone()"):
        return f"add `{rewritten}` before line {line}"
    if buffer:
        # a module's buffer lives on into the next iteration: written from values with a graph, out of place alone
        # would carry that graph there (NPID's memory bank updated in the forward from ``x``, not ``x.data``)
        return f"write line {line} out of place, detached: `{rewritten}.detach()`"
    return f"write line {line} out of place: `{rewritten}`"


def _a_buffer(filename: str, attribute: str) -> bool:
    """Whether ``filename`` registers a module buffer named ``attribute`` (``self.register_buffer("memory", ...)``)."""
    registers = re.compile(rf"\.register_buffer\(\s*['\"]{re.escape(attribute)}['\"]")
    return any(registers.search(text) for text in source_lines(filename))
