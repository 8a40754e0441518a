"""Where the learner's code changed in place a tensor the forward had saved, when a backward then raised the version
check: :func:`changed_in_place` finds, among the nodes the failing backward walked, the one whose saved tensor was
changed (reading it raises the same check) and the node of the learner's in-place statement that consumed it
(``h += 1``, ``h.mul_(2)``, ``h[mask] = 0``: an in-place change of a tensor that needs a gradient adds a node), and
:func:`out_of_place` writes that statement out of place, as the fix.

Used by :mod:`backward_twice.judge.in_place_fix`, :mod:`backward_twice.judge.notes`,
:mod:`backward_twice.record.evidence` and :mod:`backward_twice.record.hand_update`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from torch.autograd.graph import Node

from backward_twice.record.sources import function_around, parsed

__all__ = ["changed_in_place", "in_place_statement", "out_of_place", "saved_changed"]


def changed_in_place(walked: list[Node], line_of: Callable[[int], tuple[str, int] | None]) -> tuple[str, int] | None:
    """(file, line) of the learner's in-place statement that changed a tensor a node of ``walked`` saved, given
    ``line_of`` (a node's sequence number -> the learner's line that built it); None when no such node is found."""
    stale = [node for node in walked if saved_changed(node)]
    for node in walked:
        if not any(before is not None and before in stale for before, _ in node.next_functions):
            continue
        site = line_of(node._sequence_nr())
        if site is not None and in_place_statement(*site) is not None:
            return site
    for node in stale:  # no node of the change in what this backward walks (``uexp[:, 0] = 0`` after ``loss =
        site = line_of(node._sequence_nr())  # uexp.sum()``): a later statement that changes the name it was assigned
        later = _changed_later(*site) if site is not None else None
        if later is not None:
            return later
    for node in stale:  # or an object's attribute the saving line read, changed by another method of its class
        site = line_of(node._sequence_nr())  # (MoCo's ``einsum(..., [q, self.queue])``, then ``self.queue[:, i] =``)
        elsewhere = _attribute_changed_elsewhere(*site) if site is not None else None
        if elsewhere is not None:
            return elsewhere
    # or a tensor passed to the function that saved it, changed in place by its caller (an Euler step's ``y += dt *
    # func(t, y)``, ``func`` saving ``y``): the in-place statement of the learner's that built nodes since
    # (of two, the first to run after the function saved it: ``state += ...`` before ``state *= 0.9``)
    earliest = min((node._sequence_nr() for node in stale), default=None)
    after = sorted(node._sequence_nr() for node in walked if earliest is not None and node._sequence_nr() > earliest)
    for sequence in after:
        site = line_of(sequence)
        if site is not None and in_place_statement(*site) is not None:
            return site
    return None


def _attribute_changed_elsewhere(filename: str, line: int) -> tuple[str, int] | None:
    """(file, line) of the first in-place statement of ``filename`` that changes an attribute of ``self`` the
    statement at ``line`` reads (``self.queue``); None if there is none."""
    tree = parsed(filename)
    if tree is None:
        return None
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    saving = next((s for s in statements if s.lineno <= line <= (s.end_lineno or 0) and not _has_body(s)), None)
    read = {
        ast.unparse(node)
        for node in (ast.walk(saving) if saving is not None else ())
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Load)
    }
    for statement in sorted(statements, key=lambda node: node.lineno):
        if statement.lineno != line and _changes(statement) and _changed_name(statement) in read:
            return filename, statement.lineno
    return None


def _has_body(statement: ast.stmt) -> bool:
    return hasattr(statement, "body")


def _changed_later(filename: str, line: int) -> tuple[str, int] | None:
    """(file, line) of the first in-place statement after ``line`` of the same function (or module) that changes the
    name the statement at ``line`` assigns (``uexp = u.exp()``, then ``uexp[:, 0] = 0.0``); None if there is none."""
    tree = parsed(filename)
    if tree is None:
        return None
    statements = [node for node in ast.walk(function_around(tree, line)) if isinstance(node, ast.stmt)]
    assigned = next(
        (s for s in statements if isinstance(s, ast.Assign) and s.lineno <= line <= (s.end_lineno or 0)), None
    )
    names = (
        {ast.unparse(t) for t in assigned.targets if isinstance(t, (ast.Name, ast.Attribute))} if assigned else set()
    )
    for statement in sorted(statements, key=lambda node: node.lineno):
        if statement.lineno > line and _changes(statement) and _changed_name(statement) in names:
            return filename, statement.lineno
    return None


def _changed_name(statement: ast.stmt) -> str | None:
    """The name an in-place statement changes: ``h`` of ``h += 1``, ``h[mask] = 0`` or ``h.mul_(2)``."""
    if isinstance(statement, ast.AugAssign):
        target: ast.expr = statement.target
    elif isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Subscript):
        target = statement.targets[0].value
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        target = func.value if isinstance(func, ast.Attribute) else func
    else:
        return None
    return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute)) else None


def saved_changed(node: Node) -> bool:
    """Whether reading a tensor ``node`` saved raises the version check (it was changed in place since)."""
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                getattr(node, name)
            except RuntimeError as error:
                if "modified by an inplace operation" in str(error):
                    return True
            except Exception:  # freed, or not a tensor: not what changed
                continue
    return False


def in_place_statement(filename: str, line: int) -> ast.stmt | None:
    """The statement at ``line`` of ``filename`` if it changes a tensor in place: an augmented assignment
    (``h += 1``), an assignment into an item (``h[mask] = 0``), a call of a method ending in ``_`` (``h.mul_(2)``)
    or a call with ``out=``."""
    tree = parsed(filename)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno) and _changes(node):
            return node
    return None


def _changes(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.AugAssign):
        return True
    if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Subscript) for t in statement.targets):
        return True
    if isinstance(statement, (ast.Expr, ast.Assign)):
        for call in ast.walk(statement.value):
            if isinstance(call, ast.Call) and (
                (isinstance(call.func, ast.Attribute) and _in_place_method(call.func.attr))
                or any(keyword.arg == "out" for keyword in call.keywords)
            ):
                return True
    return False


def _in_place_method(name: str) -> bool:
    """``mul_``, ``add_``, and ``torch._foreach_add_`` (a fused optimizer update over a list of weights)."""
    return name.endswith("_") and (not name.startswith("_") or name.startswith("_foreach_"))


def out_of_place(statement: ast.stmt) -> str | None:
    """``statement`` written out of place: ``h = h + 1`` for ``h += 1``, ``h = h.mul(2)`` for ``h.mul_(2)``, and
    ``h = h.clone()`` to run before ``h[mask] = 0`` (the item is then set on a copy, and the saved tensor stays);
    None for any other form."""
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, (ast.Name, ast.Attribute)):
        changed = ast.unparse(statement.target)
        value = ast.BinOp(ast.Name(changed), statement.op, statement.value)
        return f"{changed} = {ast.unparse(value)}"
    call = statement.value if isinstance(statement, ast.Expr) else None
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and _in_place_method(call.func.attr)
        and not call.func.attr.startswith("_foreach_")  # ``torch._foreach_add_(ws, gs)``: no tensor to assign
        and isinstance(call.func.value, (ast.Name, ast.Attribute))
    ):
        fresh = ast.Call(ast.Attribute(call.func.value, call.func.attr[:-1]), call.args, call.keywords)
        return f"{ast.unparse(call.func.value)} = {ast.unparse(fresh)}"
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        item = statement.targets[0]
        if isinstance(item, ast.Subscript) and isinstance(item.value, (ast.Name, ast.Attribute)):
            whole = ast.unparse(item.value)
            return f"{whole} = {whole}.clone()"
    return None
