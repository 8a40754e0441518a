"""Where the learner's own update of the weights, written by hand under ``torch.no_grad()`` (``p -= lr * p.grad``),
changed a weight a forward had saved, when a later backward through that forward then raised the version check:
no optimizer step was seen, and an update under no_grad builds no node to find it by.

:func:`hand_update` finds the statement in the source, between the line that saved the weight and the raising
backward, and the oldest node of the walk that reads a weight that statement changes (``h = tanh(x @ w1)`` under
``out = h @ w2``: computing ``out`` again alone leaves ``h`` on the old ``w1``).

Used by :mod:`backward_twice.record.evidence`.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Callable, Iterator

import torch
from torch.autograd.graph import Node

from backward_twice.record.in_place import in_place_statement, saved_changed
from backward_twice.record.optimizers import plain_value
from backward_twice.record.sources import function_around, parsed

__all__ = ["hand_update"]


def hand_update(
    walked: list[Node],
    line_of: Callable[[int], tuple[str, int] | None],
    raised: tuple[str, int],
    frame: types.FrameType | None,
    since: int,
) -> tuple[tuple[str, int], int] | None:
    """((file, line) of the update, the sequence number of the oldest node built since ``since`` that reads a
    weight it changes), for the nearest node of ``walked`` whose saved weight (a leaf) was changed, when an in-place
    statement under ``torch.no_grad()`` of the raising function (``raised``) runs between the line that built that
    node and the raising one; None otherwise. ``frame``: the raising function's, where the update's loop names its
    weights (``for p in (w1, w2)``, ``for p in model.parameters()``)."""
    nearest = next((node for node in walked if _leaves_of(node) and saved_changed(node)), None)
    site = line_of(nearest._sequence_nr()) if nearest is not None else None
    if nearest is None or site is None or site[0] != raised[0] or not site[1] < raised[1]:
        return None
    tree = parsed(raised[0])
    scope = function_around(tree, raised[1]) if tree is not None else None
    if scope is None or function_around(tree, site[1]) is not scope:  # type: ignore[arg-type]
        return None
    update = next(
        (
            statement
            for statement in _under_no_grad(scope)
            if site[1] < statement.lineno < raised[1]
            and in_place_statement(raised[0], statement.lineno) is statement
            and not _changes_a_grad(statement)
        ),
        None,
    )
    changed = {id(leaf) for leaf in _leaves_of(nearest)}
    if update is not None and frame is not None and _foreach(update):  # ``torch._foreach_add_(params, grads)``
        changed |= _weights_in(update.value.args[0], frame)  # type: ignore[attr-defined]
    elif update is not None:
        changed |= _leaves_its_loop_names(scope, update, frame)
    else:  # ``sgd(model.parameters())``, ``model.update(lr)``: a function of the learner's that updates them
        called = _call_that_updates(scope, site[1], raised[1], frame)
        if called is None:
            return None
        update, weights = called
        changed |= weights
    oldest = nearest._sequence_nr()
    for node in walked:
        sequence = node._sequence_nr()
        if since <= sequence < oldest and any(id(leaf) in changed for leaf in _leaves_of(node)):
            oldest = sequence
    return (raised[0], update.lineno), oldest


def _foreach(statement: ast.stmt) -> bool:
    """Whether ``statement`` is a fused update of a list of weights: ``torch._foreach_add_(params, ...)``."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr.startswith("_foreach_")
        and bool(call.args)
    )


def _leaves_of(node: Node) -> list[torch.Tensor]:
    """The weights (leaves that require grad) ``node`` reads directly."""
    return [leaf for next_node, _ in node.next_functions if (leaf := getattr(next_node, "variable", None)) is not None]


def _under_no_grad(scope: ast.AST) -> Iterator[ast.stmt]:
    """The statements of ``scope`` inside a ``with torch.no_grad():`` block, in the order of their lines."""
    blocks = [
        node
        for node in ast.walk(scope)
        if isinstance(node, ast.With)
        and any(ast.unparse(item.context_expr).endswith("no_grad()") for item in node.items)
    ]
    inside = {id(s): s for block in blocks for s in ast.walk(block) if isinstance(s, ast.stmt) and s is not block}
    return iter(sorted(inside.values(), key=lambda statement: statement.lineno))


def _changes_a_grad(statement: ast.stmt) -> bool:
    """``p.grad.zero_()``, ``p.grad -= ...``: a change of a gradient, not of the weight a forward saved."""
    target: ast.expr | None = statement.target if isinstance(statement, ast.AugAssign) else None
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        target = func.value if isinstance(func, ast.Attribute) else None
    return isinstance(target, ast.Attribute) and target.attr == "grad"


def _leaves_its_loop_names(scope: ast.AST, update: ast.stmt, frame: types.FrameType | None) -> set[int]:
    """Ids of the weights the ``for`` loop around ``update`` runs over, where it names them plainly: a tuple or list
    of names (``(w1, w2)``) or a module's ``.parameters()``, read in ``frame`` without running the learner's code."""
    loop = max(
        (node for node in ast.walk(scope) if isinstance(node, ast.For) and any(s is update for s in ast.walk(node))),
        key=lambda node: node.lineno,
        default=None,
    )  # the innermost
    if loop is None or frame is None:
        return set()
    return _weights_in(loop.iter, frame)


def _weights_in(expression: ast.expr, frame: types.FrameType) -> set[int]:
    """Ids of the weights an expression names plainly: a tuple or list display of names (``(w1, w2)``), a name that
    holds a list, tuple or dict of them or a module (``params``, ``weights.values()``), a module's
    ``.parameters()``; read in ``frame`` without running the learner's code."""
    if isinstance(expression, (ast.Tuple, ast.List)):
        values: list[object] = [_looked_up(element, frame) for element in expression.elts]
    elif isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name) and expression.func.id == "zip":
        return set().union(*(_weights_in(argument, frame) for argument in expression.args))  # weights and buffers
    elif isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute) and not expression.args:
        owner = _looked_up(expression.func.value, frame)
        method = expression.func.attr
        if isinstance(owner, torch.nn.Module) and method in ("parameters", "named_parameters"):
            return {id(parameter) for parameter in owner.parameters()}
        values = list(owner.values()) if isinstance(owner, dict) and method == "values" else []
    else:
        held = _looked_up(expression, frame)
        if isinstance(held, torch.nn.Module):
            return {id(parameter) for parameter in held.parameters()}
        values = (
            list(held.values()) if isinstance(held, dict) else list(held) if isinstance(held, (list, tuple)) else []
        )
    return {id(value) for value in values if isinstance(value, torch.Tensor)}


def _call_that_updates(
    scope: ast.AST, saved: int, raised: int, frame: types.FrameType | None
) -> tuple[ast.stmt, set[int]] | None:
    """The statement between lines ``saved`` and ``raised`` of ``scope`` that calls a function or method of the
    learner's whose code changes tensors in place under ``torch.no_grad()`` (``sgd(model.parameters())``,
    ``model.update(0.1)``), and the ids of the weights it is handed (its arguments, a module method's own)."""
    if frame is None:
        return None
    for statement in sorted(
        (n for n in ast.walk(scope) if isinstance(n, ast.Expr) and saved < n.lineno < raised),
        key=lambda n: n.lineno,
    ):
        call = statement.value
        if not isinstance(call, ast.Call) or not isinstance(call.func, (ast.Name, ast.Attribute)):
            continue
        function = _looked_up(call.func, frame) if isinstance(call.func, ast.Name) else None
        owner = _looked_up(call.func.value, frame) if isinstance(call.func, ast.Attribute) else None
        if isinstance(owner, torch.nn.Module):  # a module's own method: found on its class, not run
            function = getattr(type(owner), call.func.attr, None) if isinstance(call.func, ast.Attribute) else None
        for _ in range(8):  # ``@torch.no_grad()``'s wrapper, a few levels at most (a wrapper may name itself)
            wrapped = getattr(function, "__wrapped__", None)
            if not isinstance(wrapped, types.FunctionType):
                break
            function = wrapped
        code = getattr(function, "__code__", None)
        if not isinstance(code, types.CodeType) or not _updates_under_no_grad(code):
            continue
        weights = set().union(*(_weights_in(argument, frame) for argument in call.args))
        if isinstance(owner, torch.nn.Module):
            weights |= {id(parameter) for parameter in owner.parameters()}
        return statement, weights
    return None


def _updates_under_no_grad(code: types.CodeType) -> bool:
    """Whether the function of ``code`` changes a tensor in place (not a ``.grad``) under ``torch.no_grad()``: in a
    ``with`` block, or throughout, decorated ``@torch.no_grad()``."""
    tree = parsed(code.co_filename)
    function = (
        next(
            (
                node
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and code.co_firstlineno in (node.lineno, *(d.lineno for d in node.decorator_list))
            ),
            None,
        )
        if tree is not None
        else None
    )
    if function is None:
        return False
    decorated = any(ast.unparse(d).endswith("no_grad()") for d in function.decorator_list)
    statements = (n for n in ast.walk(function) if isinstance(n, ast.stmt)) if decorated else _under_no_grad(function)
    return any(in_place_statement(code.co_filename, s.lineno) is s and not _changes_a_grad(s) for s in statements)


def _looked_up(expression: ast.expr, frame: types.FrameType) -> object:
    """:func:`.plain_value`, and where that finds nothing, a module's parameter, buffer or submodule (``model.l1``),
    kept in its dictionaries rather than its ``__dict__``: nothing the learner wrote runs."""
    value = plain_value(frame, expression)
    if value is None and isinstance(expression, ast.Attribute):
        owner = _looked_up(expression.value, frame)
        if isinstance(owner, torch.nn.Module):
            for kept in (owner._modules, owner._parameters, owner._buffers):
                if expression.attr in kept:
                    return kept[expression.attr]
    return value
