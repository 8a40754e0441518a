"""Gradients switched off before the forward a loss is computed from, and still off when it ran: a GAN's toggle
(``requires_grad(encoder, False)``, pix2pix's ``set_requires_grad(netD, False)``), ``model.requires_grad_(False)``,
``for p in net.parameters(): p.requires_grad = False``, or ``torch.set_grad_enabled(False)`` called as a function.
The loss then has no graph back to those weights, and its backward raises that it does not require grad; switched
on again after that forward (before the backward), the toggle changes nothing for it.

Used by :mod:`backward_twice.judge.verdicts` and :mod:`backward_twice.report.error_item`.
"""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Collection

from backward_twice.judge.uses import computed_through
from backward_twice.record.learner import learner_line_at, site_of
from backward_twice.record.loops import own_nodes
from backward_twice.record.sources import function_around, parsed

__all__ = [
    "FROZEN",
    "GRAD_OFF",
    "GRAD_OFF_BEFORE",
    "INFERENCE_BEFORE",
    "switched_off",
    "switched_off_at",
    "switched_off_elsewhere",
]

FROZEN = "requires_grad=False"  # the operation of weights switched off
GRAD_OFF = "torch.set_grad_enabled(False)"
GRAD_OFF_BEFORE = "autograd off before the code ran"  # left off by an earlier cell, or a caller's ``torch.no_grad()``
INFERENCE_BEFORE = "inference mode on before the code ran"  # a caller's ``torch.inference_mode()``
_GRAD_MODE = "grad mode"  # the target of ``torch.set_grad_enabled``: all of autograd


def switched_off(
    filename: str, backward: int, ran: Collection[tuple[str, int]] = ()
) -> tuple[int, str, tuple[tuple[str, int, int], ...]] | None:
    """(the first line, the operation, (name, the line that switched it off, the line that switched it on again or 0)
    each) of the toggles that were off when a statement the loss of the backward at line ``backward`` is computed
    through read what they switched off (of those switched on again before the backward, if any: the weights the
    loss was meant to train), or of autograd as a whole when the loss's last statement ran; None if none was.
    ``ran``: the lines the tracer saw run."""
    tree = parsed(filename)
    function = function_around(tree, backward) if tree is not None else None
    if tree is None or function is None:
        return None
    lines = sorted(line for line, _ in computed_through(filename, tree, backward, ran) if line != backward)
    # a branch the tracer did not see run counts too: it traces some passes only, and the raising one may be another
    every = _toggles_in(function)
    toggles = [toggle for toggle in every if toggle[0] < backward]
    if not every or not lines:
        return None
    off: dict[str, int] = {}  # a name switched off when a statement of the loss read it -> the line that did
    for line in lines:
        code = linecache.getline(filename, line).split("#", 1)[0]
        for name in {name for _, name, _ in every}:
            read = name == _GRAD_MODE or re.search(rf"(?<![\w.]){re.escape(name)}\b", code) is not None
            state = _state_at(every, name, line, backward)
            if state is not None and read and not state[1]:
                off.setdefault(name, state[0])
    grad_off = _state_at(every, _GRAD_MODE, lines[-1], backward)
    if grad_off is not None and not grad_off[1]:  # the loss itself computed with autograd off
        return grad_off[0], GRAD_OFF, ()
    frozen = sorted((line, name) for name, line in off.items() if name != _GRAD_MODE)
    again = {
        name: min((at for at, n, on in toggles if n == name and on and at > line), default=0) for line, name in frozen
    }
    wanted = [(line, name) for line, name in frozen if again[name]]
    frozen = wanted or frozen  # those switched on again before the backward: the ones the loss was meant to train
    if not frozen:
        return None
    return frozen[0][0], FROZEN, tuple((name, line, again[name]) for line, name in frozen)


def _state_at(toggles: list[tuple[int, str, bool]], name: str, line: int, backward: int) -> tuple[int, bool] | None:
    """(the toggle's line, on) of ``name`` when ``line`` runs: the last toggle before it; else, where none is before
    it, one an earlier pass left after the backward at line ``backward`` when no toggle of the function switches it
    on (``torch.set_grad_enabled(False)`` for an evaluation after the step, never undone); None if neither."""
    before = [(at, on) for at, toggled, on in toggles if toggled == name and at < line]
    if before:
        return before[-1]
    after = [(at, on) for at, toggled, on in toggles if toggled == name and at > backward]
    return after[-1] if after and not any(on for _, on in after) else None


def switched_off_at(
    backward: str, ran: Collection[tuple[str, int]] = ()
) -> tuple[tuple[str, str] | None, tuple[tuple[str, int, int], ...]]:
    """(("file:line: code", operation), what was switched off) of :func:`switched_off` for the backward at the
    learner's line ``backward`` ("file:line: code"); (None, ()) if nothing was."""
    site = site_of(backward)
    off = switched_off(*site, ran=ran) if site is not None else None
    return ((learner_line_at(site[0], off[0]), off[1]), off[2]) if site is not None and off is not None else (None, ())


def switched_off_elsewhere(backward: str, inference: bool, after_a_backward: bool) -> tuple[str, str]:
    """("file:line: code", operation) for a loss computed with autograd off where no line of the backward's own
    function turned it off: inference mode on (the backward's line); where an earlier backward ran (autograd was on
    then), the first ``torch.set_grad_enabled(False)`` of another function of its file, or of its top level, that
    nothing after it in that code turns on again (an ``evaluate()`` the loop calls); else autograd off before the
    code ran (the backward's line: an earlier cell's, a caller's)."""
    site = site_of(backward)
    tree = parsed(site[0]) if site is not None and not inference and after_a_backward else None
    if tree is None or site is None:
        return backward, INFERENCE_BEFORE if inference else GRAD_OFF_BEFORE
    own = function_around(tree, site[1])
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    left_off: list[int] = []
    for scope in (scope for scope in scopes if scope is not own):
        grad = [(line, on) for line, name, on in _toggles_in(scope) if name == _GRAD_MODE]
        if grad and not grad[-1][1]:
            left_off.append(grad[-1][0])
    if not left_off:
        return backward, GRAD_OFF_BEFORE
    return learner_line_at(site[0], min(left_off)), GRAD_OFF


def _toggles_in(scope: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, name, switched on) of each toggle among ``scope``'s own statements, in the order the code runs them."""
    statements = sorted((n for n in own_nodes(scope) if isinstance(n, ast.stmt)), key=lambda s: s.lineno)
    return [(statement.lineno, name, on) for statement in statements for name, on in _toggles(statement)]


def _toggles(statement: ast.stmt) -> list[tuple[str, bool]]:
    """(the name, switched on) of each toggle ``statement`` itself is (an ``Expr`` call, an assignment, or a ``for``
    over ``X.parameters()`` that assigns each one's ``requires_grad``)."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        return _called(statement.value)
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0], statement.value
        if isinstance(target, ast.Attribute) and target.attr == "requires_grad" and isinstance(value, ast.Constant):
            return [(ast.unparse(target.value), bool(value.value))]
    if isinstance(statement, ast.For) and isinstance(statement.target, ast.Name):
        each = statement.target.id
        flags = [
            bool(node.value.value)
            for node in statement.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(ast.unparse(t) == f"{each}.requires_grad" for t in node.targets)
        ]
        owners = [
            ast.unparse(node.func.value)
            for node in ast.walk(statement.iter)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parameters"
        ]
        return [(owner, flags[-1]) for owner in owners] if flags else []
    return []


def _called(call: ast.Call) -> list[tuple[str, bool]]:
    """The toggles of one call: ``requires_grad(net, False)``, ``set_requires_grad([netD_A, netD_B], False)``,
    ``net.requires_grad_(False)``, ``torch.set_grad_enabled(False)``."""
    func = ast.unparse(call.func)
    flag = _flag(call)
    if func in ("torch.set_grad_enabled", "set_grad_enabled") and flag is not None:
        return [(_GRAD_MODE, flag)]
    if isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_":
        return [(ast.unparse(call.func.value), True if not call.args and not call.keywords else bool(flag))]
    flag = True if flag is None and len(call.args) == 1 and not call.keywords else flag  # ``requires_grad(net)``
    if "requires_grad" in func.rsplit(".", 1)[-1] and call.args and flag is not None:
        first = call.args[0]
        targets = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
        return [(ast.unparse(target), flag) for target in targets]
    return []


def _flag(call: ast.Call) -> bool | None:
    """The bool a toggle passes (its last positional argument, else its ``requires_grad``/``flag``/``mode``/
    ``requires`` keyword); None where it passes none the code spells."""
    spelled = [k.value for k in call.keywords if k.arg in ("requires_grad", "flag", "mode", "requires")]
    value = spelled[-1] if spelled else (call.args[-1] if call.args else None)
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) else None
