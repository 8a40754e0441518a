"""A graph built before the loop that another name, built once from it, keeps: ``dist = Normal(loc=mean,
scale=std)`` read by each pass (``dist.rsample()``), ``loader = DataLoader(TensorDataset(feats, y))`` whose batches
the loop takes. Computed again or detached inside the loop, the carrier alone changes nothing the loop reads: that
name still holds its first tensor, and each backward walks the graph the first one freed.

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

import ast

from backward_twice.record.learner import site_of
from backward_twice.record.sources import function_around, parsed

__all__ = ["kept_by_a_name_fix"]


def kept_by_a_name_fix(
    name: str | None, entry: tuple[str, int] | None, built_at: str, lines_before: tuple[int, ...]
) -> str | None:
    """The fix for ``name``'s graph, built before the loop (at ``built_at``, from ``lines_before``), where ``entry``,
    the line its old graph comes in at, runs once, in no loop, and builds another name from it: a ``for`` that takes
    its items from that name gets ``name`` detached once, after the line that built it (a dataset's tensors train
    nothing across passes); any other is computed in the loop with ``name`` (or ``name`` detached once, if it needs
    no gradient). None for any other carrier."""
    kept = _kept_by(name, entry) if name is not None and entry is not None else None
    built = site_of(built_at)
    if kept is None or built is None or name is None:
        return None
    holder, line, iterated = kept
    if iterated:
        return (
            f"add `{name} = {name}.detach()` after line {built[1]}: `{holder}` (line {line}) keeps it, and each pass "
            "of the loop walks its graph again"
        )
    moved = sorted({*lines_before, built[1], line})
    lines = ", ".join(map(str, moved[:-1])) + f" and {moved[-1]}"
    return (
        f"compute `{name}` and `{holder}` inside the loop (move lines {lines} into it), or add `{name} = "
        f"{name}.detach()` after line {built[1]} if it needs no gradient"
    )


def _kept_by(name: str, entry: tuple[str, int]) -> tuple[str, int, bool] | None:
    """(the name, its line, whether a ``for`` takes its items from it) that the assignment at ``entry`` builds from
    ``name``, where no loop runs that line and a later loop of the same code reads that name; None for any other
    line (a step function's, which the loop around its calls runs each pass)."""
    tree = parsed(entry[0]) if name.isidentifier() else None
    if tree is None:
        return None
    line = entry[1]
    statement = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno <= line <= (n.end_lineno or n.lineno)),
        None,
    )
    if statement is None or len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name):
        return None
    holder = statement.targets[0].id
    if holder == name or not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(statement.value)):
        return None
    scope = function_around(tree, line)
    loops = [n for n in ast.walk(scope) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]
    if any(loop.lineno <= line <= (loop.end_lineno or loop.lineno) for loop in loops):
        return None
    later = [loop for loop in loops if loop.lineno > line and function_around(tree, loop.lineno) is scope]
    reading = [loop for loop in later if any(isinstance(n, ast.Name) and n.id == holder for n in ast.walk(loop))]
    if not reading:  # the loop that reads it is no later loop of the same code (a step function's own line)
        return None
    iterated = any(
        isinstance(loop, (ast.For, ast.AsyncFor))
        and any(isinstance(n, ast.Name) and n.id == holder for n in ast.walk(loop.iter))
        for loop in reading
    )
    return holder, statement.lineno, iterated
