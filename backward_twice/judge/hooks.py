"""Functions only a framework calls: a Lightning module's ``training_step``, a ``Trainer``'s ``compute_loss``. Where
the framework's optimizer steps split the run (gradient accumulation: several calls of the hook per step), two calls
of a backward line such a hook holds outside any loop of its own are two calls of the hook, two passes of the
framework's loop: a later one that walks what the earlier one kept reaches it through state carried between them.

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast

from backward_twice.record.loops import own_nodes
from backward_twice.record.sources import function_around, parsed

__all__ = ["hook_around"]


def hook_around(filename: str, line: int) -> str | None:
    """The name of the function around ``line`` when ``line`` lies in no loop of that function and no code of the
    file calls it (a hook the framework calls); None otherwise."""
    tree = parsed(filename)
    function = function_around(tree, line) if tree is not None else None
    if tree is None or not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    loops = (node for node in own_nodes(function) if isinstance(node, (ast.For, ast.AsyncFor, ast.While)))
    if any(loop.lineno <= line <= (loop.end_lineno or loop.lineno) for loop in loops):
        return None
    name = function.name
    called = any(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
        for node in ast.walk(tree)
    )
    return None if called else name
