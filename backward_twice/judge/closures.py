"""A graph a closure reads from the function around it: ``pred = model(x)`` computed once, then read by the
``closure`` an optimizer's ``step`` calls several times (LBFGS evaluates the loss again at each of its inner
iterations), where each call's backward frees the graph the last one walked. A detach cannot go in the closure (the
name would become its local); the forward goes in.

Used by :mod:`backward_twice.judge.carried` and :mod:`backward_twice.judge.second_backward`.
"""

from __future__ import annotations

import ast

from backward_twice.record.learner import site_of
from backward_twice.record.loops import own_nodes
from backward_twice.record.sources import function_around, parsed

__all__ = ["read_by_a_closure", "read_by_the_raising_closure"]


def read_by_a_closure(name: str | None, entry: tuple[str, int] | None, built_at: str) -> str | None:
    """The fix for ``name``, built at ``built_at`` and first read at ``entry`` inside a function defined beside it
    that an optimizer's ``step`` is handed (``optimizer.step(closure)``) and that never assigns it: compute it inside
    that function. None for any other carrier."""
    built = site_of(built_at)
    if name is None or entry is None or not name.isidentifier() or built is None or built[0] != entry[0]:
        return None
    tree = parsed(entry[0])
    closure = function_around(tree, entry[1]) if tree is not None else None
    if tree is None or not isinstance(closure, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    if closure.lineno <= built[1] <= (closure.end_lineno or closure.lineno):
        return None
    outer = function_around(tree, closure.lineno)
    if function_around(tree, built[1]) is not outer:
        return None
    assigned = {n.id for n in ast.walk(closure) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if name in assigned:
        return None
    own = list(own_nodes(outer if outer is not None else tree))
    if not any(_steps_with(node, closure.name) for node in own):  # ``optimizer.step(closure)``
        return None
    lines = _lines_it_comes_from(own, built[1])
    moved = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
    return (
        f"compute `{name}` inside `{closure.name}` (move {moved} into it, before line {entry[1]}): the "
        f"optimizer's step calls `{closure.name}` several times, and each call's backward needs a graph of its own"
    )


def _lines_it_comes_from(own: list[ast.AST], line: int) -> list[int]:
    """The line that builds the closure's name, and before it in its block each assignment of a name only the lines
    so taken read (``h = enc(x)`` before ``z = torch.tanh(h) * 2``): moved alone, the closure would still walk the
    graph ``h`` brought from outside."""
    blocks = [
        block
        for node in own
        for block in (getattr(node, "body", None), getattr(node, "orelse", None))
        if isinstance(block, list) and any(stmt.lineno == line for stmt in block)
    ]
    block = blocks[0] if blocks else []
    at = next((i for i, stmt in enumerate(block) if stmt.lineno == line), None)
    if at is None:
        return [line]
    taken = [block[at]]
    wanted = _read_in(block[at])
    for stmt in reversed(block[:at]):
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if not isinstance(target, ast.Name) or target.id not in wanted:
            continue
        readers = [n for n in own if isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Load)]
        if all(any(taker.lineno <= n.lineno <= (taker.end_lineno or taker.lineno) for taker in taken) for n in readers):
            taken.append(stmt)
            wanted |= _read_in(stmt)
    return sorted(stmt.lineno for stmt in taken)


def _read_in(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def read_by_the_raising_closure(name: str, raised_at: tuple[str, int]) -> str | None:
    """:func:`read_by_a_closure`'s fix for ``name`` where the backward at ``raised_at`` runs in the closure that reads
    it (LBFGS's second call of it walks the graph its first call's backward freed): built at the last assignment of
    ``name`` before the closure, in the function around it (or the script's top level)."""
    tree = parsed(raised_at[0])
    closure = function_around(tree, raised_at[1]) if tree is not None else None
    if tree is None or not isinstance(closure, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    outer = function_around(tree, closure.lineno)
    scope: ast.AST = outer if outer is not None else tree
    own = list(own_nodes(scope))
    if not any(_steps_with(node, closure.name) for node in own):  # no optimizer's step is handed it: no closure
        return None
    reads = [
        n.lineno for n in ast.walk(closure) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    ]
    built = [
        node
        for node in own
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and node.lineno < closure.lineno
        and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(node))
    ]
    if not reads or not built:
        return None
    last = max(built, key=lambda node: node.lineno)
    return read_by_a_closure(name, (raised_at[0], min(reads)), f"{raised_at[0]}:{last.lineno}: {ast.unparse(last)}")


def _steps_with(node: ast.AST, closure: str) -> bool:
    """Whether ``node`` is a ``.step(...)`` call handed ``closure`` (or one of two closures, by an expression)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and any(isinstance(n, ast.Name) and n.id == closure for arg in _arguments(node) for n in ast.walk(arg))
    )


def _arguments(call: ast.Call) -> list[ast.expr]:
    """What ``call`` is given, by position and by keyword."""
    return [*call.args, *(keyword.value for keyword in call.keywords)]
