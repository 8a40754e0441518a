"""The learner's step method a framework's trainer runs (PyTorch Lightning's ``training_step``, a Hugging Face
``Trainer``'s ``compute_loss``): for a backward the trainer runs, the learner's nearest line is the ``trainer.fit(...)``
call, which says nothing of the loss, where the ``return`` of their step method that ran gives the loss the backward
walked; and a graph built once in the class's ``__init__`` (a regulariser from the weights) is computed in that method.

Used by :mod:`backward_twice.judge.carried` and :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection

from backward_twice.record.learner import learner_line_at, site_of
from backward_twice.record.sources import function_around, memo, parsed

__all__ = ["computed_in_the_step", "loss_returned_at"]

_STEP_METHODS = frozenset({"training_step", "compute_loss"})  # Lightning's, the Hugging Face Trainer's
_A_BACKWARD = re.compile(r"\bbackward\s*\(|\.grad\s*\(")


def loss_returned_at(line: str, ran: Collection[tuple[str, int]]) -> str | None:
    """ "file:line: code" of the ``return`` of the learner's ``training_step`` or ``compute_loss`` that ran (``ran``:
    the lines the tracer saw), when the backward's learner's ``line`` calls no backward itself (a framework's call);
    None otherwise."""
    site = site_of(line)
    if site is None or _A_BACKWARD.search(line.split(": ", 1)[-1]):
        return None
    for filename in sorted({file for file, _ in ran} | {site[0]}):
        tree = parsed(filename)
        returns = memo(filename, ("step returns",), functools.partial(_step_returns, tree)) if tree else []
        seen = [number for number in returns if (filename, number) in ran]
        if seen or returns:
            return learner_line_at(filename, (seen or returns)[-1])
    return None


def _step_returns(tree: ast.Module) -> list[int]:
    """The lines of the ``return`` statements with a value of each ``training_step`` and ``compute_loss``."""
    return sorted(
        node.lineno
        for function in ast.walk(tree)
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name in _STEP_METHODS
        for node in ast.walk(function)
        if isinstance(node, ast.Return) and node.value is not None
    )


def computed_in_the_step(name: str | None, built_at: str) -> str | None:
    """The fix for ``self.X`` carried from the ``__init__`` that built it (``self.l2_penalty = sum(p.pow(2).sum() for p
    in self.model.parameters())``) into each step of a framework's trainer: compute it in the class's step method,
    from each step's weights; detached once, it would no longer train them. None for any other carrier."""
    site = site_of(built_at)
    tree = parsed(site[0]) if site is not None and name is not None and name.startswith("self.") else None
    if tree is None or site is None:
        return None
    built_in = function_around(tree, site[1])
    if not isinstance(built_in, ast.FunctionDef) or built_in.name != "__init__":
        return None
    step = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in _STEP_METHODS), None)
    if step is None:
        return None
    return (
        f"compute `{name}` in `{step.name}` (line {step.lineno}), from each step's weights (or add `{name} = "
        f"{name}.detach()` after line {site[1]}, if it needs no gradient)"
    )
