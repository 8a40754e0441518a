"""The learner's step method a framework's trainer runs (PyTorch Lightning's ``training_step``, a Hugging Face
``Trainer``'s ``compute_loss``): for a backward the trainer runs, the learner's nearest line is the ``trainer.fit(...)``
call, which says nothing of the loss, where the ``return`` of their step method that ran gives the loss the backward
walked; a ``loss.backward()`` of the learner's own in that method, on the loss it returns, is one backward too many
(the trainer runs its own); and a graph built once in the class's ``__init__`` (a regulariser from the weights) is
computed in that method.

Used by :mod:`backward_twice.judge.carried` and :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection

from backward_twice.record.learner import learner_line_at, site_of
from backward_twice.record.sources import function_around, memo, parsed

__all__ = ["backward_of_the_returned_loss", "computed_in_the_step", "loss_returned_at"]

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


def _the_loss_returned(code: str) -> str | None:
    """The name of the loss a ``return`` statement hands the trainer: ``return loss``, ``return {"loss": loss, ...}``,
    ``return (loss, outputs) if return_outputs else loss``; None for any other."""
    spelled = (
        re.fullmatch(r"return\s+([\w.]+)", code)
        or re.match(r"return\s+\{\s*[\"']loss[\"']\s*:\s*([\w.]+)\s*[,}]", code)
        or re.fullmatch(r"return\s+\(?\s*([\w.]+)\s*,.*\)?\s+if\s+.+\s+else\s+\1", code)
    )
    return spelled.group(1) if spelled is not None else None


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


def backward_of_the_returned_loss(freed_at: str, returned: str | None) -> str | None:
    """The fix where the learner's step method calls backward on the loss it returns (``loss.backward()`` at
    ``freed_at``, ``return loss`` at ``returned``) and the trainer's own backward of that loss then raised: remove the
    learner's call. PyTorch Lightning zeroes the gradients between the step and its backward, and a Hugging Face
    ``Trainer`` adds its backward's to them: either way the trainer's backward is the one that trains. None for any
    other pair of backward calls."""
    freer, back = site_of(freed_at), site_of(returned) if returned is not None else None
    code = freed_at.split(": ", 1)[-1].split("#", 1)[0].strip()
    own = re.fullmatch(r"([\w.]+)\.backward\(\s*\)", code)
    tree = parsed(freer[0]) if freer is not None and back is not None and freer[0] == back[0] else None
    if tree is None or own is None or freer is None or back is None or returned is None:
        return None
    step = function_around(tree, back[1])
    if (
        not isinstance(step, ast.FunctionDef)
        or step.name not in _STEP_METHODS
        or function_around(tree, freer[1]) != step
    ):
        return None
    loss = _the_loss_returned(returned.split(": ", 1)[-1].split("#", 1)[0].strip())
    if loss is None:
        return None
    if loss != own.group(1):  # another loss: the one returned trains alone, and the learner's trains nothing
        return (
            f"remove `{code}` at line {freer[1]} and add `{own.group(1)}` to the loss `{step.name}` returns "
            f"(`{loss} + {own.group(1)}`, line {back[1]}): the trainer calls backward() only on that loss"
        )
    return (
        f"remove `{code}` at line {freer[1]}: the trainer calls backward() itself on the loss `{step.name}` returns "
        f"(line {back[1]})"
    )
