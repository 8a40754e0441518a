"""The loops a learner wrote, read from their source: which statement loops enclose a line of a function.

An iteration of the learner's training is one pass of their own loop: the innermost ``for`` or ``while`` of
their code that encloses the backward calls and the optimizer steps. This module gives the recorder the static
half of that, per code object (a function, a method, a script's or a notebook cell's top level), read once with
``ast`` from the lines ``linecache`` holds:

* :func:`loops_of`: the statement loops of the code's own scope (not of the functions, classes and lambdas
  nested in it; comprehensions are not statements), each a :class:`Loop` with its header line and body lines;
* :func:`enclosing`: the loops whose body holds a line, outermost first;
* :func:`step_calls`: the calls of the code's own scope to ``backward``, ``autograd.grad``, ``manual_backward`` or a
  ``step`` (with its receiver, for the caller to tell an optimizer's from a scheduler's), so a loop that holds only
  some of them (a critic's inner loop) is known not to be the iteration before the others run;
* :func:`outermost_loop_around`: the outermost loop that holds a line in a function the iteration's loop calls (where
  a carried state's detach goes, once a call);
* :func:`holds_a_backward`: whether a loop is, as written, the innermost one around a backward call of its code;
* :func:`calls_outside_loops`: the calls of a code's own scope that no loop of it holds (a step that calls the
  learner's ``train_sequence()``, whose own loop is the iteration's);
* :func:`loop_inside`: the loop, nested in the one that holds a backward, that holds a line of the same function
  (where a total of this iteration's losses is summed, and starts afresh).

Nothing here imports torch, reads a frame's variables or writes to a frame.

Used by :mod:`backward_twice.judge.built`, :mod:`backward_twice.judge.cached`, :mod:`backward_twice.judge.carried`,
:mod:`backward_twice.judge.closures`, :mod:`backward_twice.judge.errors_fix`, :mod:`backward_twice.judge.fixes`,
:mod:`backward_twice.judge.frozen`, :mod:`backward_twice.judge.grows_at`, :mod:`backward_twice.judge.hooks`,
:mod:`backward_twice.judge.loop_body`, :mod:`backward_twice.judge.stored`, :mod:`backward_twice.judge.uses`,
:mod:`backward_twice.record.bound`, :mod:`backward_twice.record.lines`, :mod:`backward_twice.record.pass_stops`,
:mod:`backward_twice.record.passes`, :mod:`backward_twice.record.recorder`, :mod:`backward_twice.record.stops` and
:mod:`backward_twice.steps.harness`.
"""

from __future__ import annotations

import ast
import linecache
import types
from collections.abc import Callable
from dataclasses import dataclass, replace

from backward_twice.record.sources import function_around, memo, parsed

__all__ = [
    "Loop",
    "StepCall",
    "calls_outside_loops",
    "enclosing",
    "holds_a_backward",
    "loop_inside",
    "loops_of",
    "outermost_loop_around",
    "outermost_loop_without",
    "own_nodes",
    "step_calls",
]

_STEP_NAMES = frozenset({"backward", "manual_backward", "step"})


@dataclass(frozen=True)
class Loop:
    """A statement loop: its file, header line (where each pass starts), the first and last lines of its body,
    its kind ("for" or "while"), and whether its body starts with a ``try`` (from Python 3.11 on, an exception
    raised by a trace function at a ``try:`` line escapes the handlers of its own frame: a recorder stops such a
    loop at its header instead)."""

    filename: str
    header: int
    body_first: int
    body_last: int
    kind: str
    starts_with_try: bool = False
    targets: tuple[str, ...] = ()  # the names a ``for`` binds at each pass (``batch``; ``x, y``)
    shadowed: bool = False  # a loop inside it binds one of those names too (``for _`` in ``for _``), or its body
    # rebinds each of them from values that do not read it (``_, tag = pair``): they tell no pass
    counter: int = -1  # which of ``targets`` counts the passes by one (``for i in range(n)``, ``enumerate``)
    rebound: frozenset[str] = frozenset()  # of ``targets``, those its body assigns (``images = images.reshape(...)``),
    # but not where each assignment comes before the body's first backward or step
    assigned: frozenset[str] = frozenset()  # of ``targets``, every one its body assigns
    from_zero: bool = False  # its counter starts at 0 (``range(n)``, ``enumerate(data)``): in a new call of its
    # function, the counter's value is how many passes ran before the first event there
    iterable: tuple[str, ...] = ()  # the names a ``for``'s iterable reads (``it`` of ``enumerate(it)``)

    def holds(self, line: int) -> bool:
        """Whether ``line`` lies in the loop's body (the header and an ``else:`` clause do not)."""
        return self.body_first <= line <= self.body_last


@dataclass(frozen=True)
class StepCall:
    """A call that may be a training event: its line, the method (``backward``, ``manual_backward``, ``grad``,
    ``step``) and, for ``step``, the expression it is called on (``optimizer``, ``self.opt_g``, ``scheduler``)."""

    line: int
    method: str
    receiver: ast.expr | None = None


@dataclass(frozen=True)
class _Scope:
    loops: tuple[Loop, ...]
    steps: tuple[StepCall, ...]
    calls: tuple[tuple[int, str, str | None], ...] = ()  # (line, name, attribute): ``update()``, ``agent.learn()``


_EMPTY = _Scope((), ())


def _scope_node(tree: ast.Module, code: types.CodeType) -> ast.AST | None:
    """The AST node whose body is ``code``'s own: the module for top-level code and for the function a cell magic
    (``%%diagnose``) makes of a cell's body, else the def or lambda that starts on the code's first line (a decorated
    function's first line is its first decorator's)."""
    if code.co_name == "<module>" or (code.co_firstlineno == 1 and _under_a_cell_magic(code.co_filename)):
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            starts = {node.lineno, *(d.lineno for d in node.decorator_list)}
            if code.co_firstlineno in starts:
                return node
        elif isinstance(node, ast.Lambda) and code.co_name == "<lambda>" and node.lineno == code.co_firstlineno:
            return node
    return None


def _under_a_cell_magic(filename: str) -> bool:
    """Whether ``filename``'s lines are a notebook cell's under a cell magic (its first line ``%%diagnose ...``)."""
    lines = linecache.getlines(filename)
    return bool(lines) and lines[0].startswith("%%")


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope`` outside the functions, classes and lambdas nested in it."""
    found: list[ast.AST] = []
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, nested):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _step_call(call: ast.Call) -> StepCall | None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "step":
        return StepCall(call.lineno, "step", func.value)
    if func.attr in _STEP_NAMES:
        return StepCall(call.lineno, func.attr)
    owner = func.value  # torch.autograd.grad(...), autograd.grad(...)
    named = (isinstance(owner, ast.Name) and owner.id == "autograd") or (
        isinstance(owner, ast.Attribute) and owner.attr == "autograd"
    )
    return StepCall(call.lineno, "grad") if func.attr == "grad" and named else None


# id(code) -> (the code, what its scope holds): a code object is compiled from one source, so what it holds stays.
# By id, the code kept alive beside it: a code object hashes its whole bytecode at each lookup.
_by_code: dict[int, tuple[types.CodeType, _Scope]] = {}


def _scope(code: types.CodeType) -> _Scope:
    known = _by_code.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    scope = memo(code.co_filename, ("loops", code.co_firstlineno, code.co_name), lambda: _read_scope(code))
    if len(_by_code) > 4096:
        _by_code.clear()
    _by_code[id(code)] = (code, scope)
    return scope


def _read_scope(code: types.CodeType) -> _Scope:
    tree = parsed(code.co_filename)
    node = _scope_node(tree, code) if tree is not None else None
    if node is None:
        return _EMPTY
    loops, steps = [], []
    calls: list[tuple[int, str, str | None]] = []
    for child in own_nodes(node):
        if isinstance(child, (ast.For, ast.AsyncFor, ast.While)) and child.body:
            last = max(getattr(statement, "end_lineno", None) or statement.lineno for statement in child.body)
            kind = "while" if isinstance(child, ast.While) else "for"
            first_try = isinstance(child.body[0], (ast.Try, getattr(ast, "TryStar", ast.Try)))
            targets = (
                ()
                if isinstance(child, ast.While)
                else tuple(n.id for n in ast.walk(child.target) if isinstance(n, ast.Name))
            )
            counter = _counter(child) if isinstance(child, (ast.For, ast.AsyncFor)) else None
            loops.append(
                Loop(
                    code.co_filename,
                    child.lineno,
                    child.body[0].lineno,
                    last,
                    kind,
                    first_try,
                    targets,
                    shadowed=bool(targets) and _untied(child.body, set(targets)).issuperset(targets),
                    counter=targets.index(counter) if counter in targets else -1,
                    rebound=_rebound(child.body, set(targets)),
                    assigned=_assigned(child.body, set(targets)),
                    from_zero=counter in targets and isinstance(child, (ast.For, ast.AsyncFor)) and _from_zero(child),
                    iterable=(
                        ()
                        if isinstance(child, ast.While)
                        else tuple(dict.fromkeys(n.id for n in ast.walk(child.iter) if isinstance(n, ast.Name)))
                    ),
                )
            )
        elif isinstance(child, ast.Call):
            step = _step_call(child)
            if step is not None:
                steps.append(step)
            elif isinstance(child.func, ast.Name):
                calls.append((child.lineno, child.func.id, None))
            elif isinstance(child.func, ast.Attribute) and isinstance(child.func.value, ast.Name):
                calls.append((child.lineno, child.func.value.id, child.func.attr))
    loops = [
        replace(
            loop,
            shadowed=loop.shadowed
            or any(
                other is not loop and loop.holds(other.header) and set(other.targets) & set(loop.targets)
                for other in loops
            ),
        )
        for loop in loops
    ]
    by_line = tuple(sorted(steps, key=lambda s: s.line))
    ordered = tuple(sorted(calls, key=lambda call: (call[0], call[1], call[2] or "")))
    return _Scope(tuple(sorted(loops, key=lambda loop: loop.header)), by_line, ordered)


def _assigned(body: list[ast.stmt], names: set[str]) -> frozenset[str]:
    """Those of ``names`` that a statement of ``body`` (nested blocks too, not nested functions) assigns."""
    stored = (n for n in _body_nodes(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return frozenset(n.id for n in stored if n.id in names)


def _body_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """The statements of ``body`` and their nodes, outside the functions, classes and lambdas nested in it."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    return [
        node for statement in body if not isinstance(statement, nested) for node in (statement, *own_nodes(statement))
    ]


def _untied(body: list[ast.stmt], names: set[str]) -> frozenset[str]:
    """Those of ``names`` that a statement of ``body`` assigns from a value that does not read the name itself
    (``_, tag = pair``: the same object each pass, whatever the ``for`` bound), where ``x = x.to(device)`` and DINO's
    ``it = len(data_loader) * epoch + it`` stay tied to it: what such a name holds at an event tells no pass."""
    found: set[str] = set()
    for node in _body_nodes(body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            read = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            bound = node.targets if isinstance(node, ast.Assign) else [node.target]
            stored = {n.id for target in bound for n in ast.walk(target) if isinstance(n, ast.Name)}
            found |= (stored & names) - read
    return frozenset(found)


def _rebound(body: list[ast.stmt], names: set[str]) -> frozenset[str]:
    """Those of ``names`` that ``body`` assigns where two events of one pass may read different values: every one it
    assigns, unless each assignment comes before the body's first backward or step (DINO's ``it = len(data_loader) *
    epoch + it`` at the top: read at each event, such a name changes once a pass)."""
    first = next(
        (
            index
            for index, statement in enumerate(body)
            if any(isinstance(n, ast.Call) and _step_call(n) is not None for n in ast.walk(statement))
        ),
        0,
    )
    return _assigned(body[first:], names)


def _counter(loop: ast.For | ast.AsyncFor) -> str | None:
    """The name that counts the loop's passes by one: ``i`` of ``for i in range(n)`` (or ``range(a, b)``) and of
    ``for i, batch in enumerate(...)``."""
    call = loop.iter
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return None
    target = loop.target
    if call.func.id == "range" and 1 <= len(call.args) <= 2 and not call.keywords and isinstance(target, ast.Name):
        return target.id
    if call.func.id == "enumerate" and isinstance(target, ast.Tuple) and isinstance(target.elts[0], ast.Name):
        return target.elts[0].id
    return None


def _from_zero(loop: ast.For | ast.AsyncFor) -> bool:
    """Whether the loop's counter (:func:`_counter`) starts at 0: ``range(n)``, ``enumerate(data)``."""
    call = loop.iter
    return isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords


def loops_of(code: types.CodeType) -> tuple[Loop, ...]:
    """The statement loops of ``code``'s own scope, by header line (empty when its source cannot be read)."""
    return _scope(code).loops


def enclosing(code: types.CodeType, line: int) -> list[Loop]:
    """The loops of ``code`` whose body holds ``line``, outermost first."""
    return [loop for loop in loops_of(code) if loop.holds(line)]


def step_calls(code: types.CodeType) -> tuple[StepCall, ...]:
    """The calls of ``code``'s own scope to ``.backward(``, ``.manual_backward(``, ``autograd.grad(`` and
    ``.step(``, by line."""
    return _scope(code).steps


def calls_outside_loops(code: types.CodeType) -> tuple[tuple[str, str | None], ...]:
    """The calls of ``code``'s own scope outside any loop of it, as (name, attribute): ``("trainer",
    "train_sequence")`` for ``trainer.train_sequence(xs, ys)``, ``("train", None)`` for ``train()``."""
    return tuple((name, attribute) for line, name, attribute in _scope(code).calls if not enclosing(code, line))


def holds_a_backward(
    code: types.CodeType, loop: Loop, resolve: Callable[[str, str | None], types.CodeType | None] | None = None
) -> bool:
    """Whether ``loop`` is the innermost loop of ``code``'s own scope around one of its backward calls (``backward``,
    ``manual_backward``, ``autograd.grad``), as written: the iteration's loop, before any of them has run. With
    ``resolve`` (a called name, and attribute, to the learner's function's code), also around a call of a function
    of theirs that runs one outside any loop of its own (a DQN's ``optimize_model()``, which returns early until its
    buffer fills)."""
    if any(
        call.method != "step" and loop.holds(call.line) and enclosing(code, call.line)[-1] == loop
        for call in step_calls(code)
    ):
        return True
    if resolve is None:
        return False
    for line, name, attribute in _scope(code).calls:
        if loop.holds(line) and enclosing(code, line)[-1] == loop:
            called = resolve(name, attribute)
            if called is not None and any(
                call.method != "step" and not enclosing(called, call.line) for call in step_calls(called)
            ):
                return True
    return False


def loop_inside(filename: str, line: int, outer_line: int) -> int | None:
    """The header line of the outermost loop that holds ``line`` and not ``outer_line``, nested in a loop that holds
    both, in the one function that holds both (``meta_loss += ...`` in a loop over tasks, inside the loop whose
    pass backwards ``meta_loss``); None for any other lines."""
    tree = parsed(filename)
    if tree is None:
        return None
    function = function_around(tree, line)
    if function is not function_around(tree, outer_line):
        return None
    loops = [node for node in own_nodes(function) if isinstance(node, (ast.For, ast.AsyncFor, ast.While))]
    holding = [
        (node, node.body[0].lineno <= outer_line <= (node.end_lineno or 0))
        for node in loops
        if node.body[0].lineno <= line <= (node.end_lineno or 0)
    ]
    if not any(both for _, both in holding):
        return None
    return min((node.lineno for node, both in holding if not both), default=None)


def outermost_loop_without(filename: str, line: int, other: int) -> int | None:
    """The header of the outermost loop of the function around ``line`` that holds ``line`` and not ``other`` (the
    rollout loop that adds a term each step, not the update's backward after it); None if there is none."""
    tree = parsed(filename)
    if tree is None:
        return None
    function = function_around(tree, line)
    headers = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        and node.body[0].lineno <= line <= (node.end_lineno or node.lineno)
        and not node.lineno <= other <= (node.end_lineno or node.lineno)
        and function_around(tree, node.lineno) is function
    ]
    return min(headers, default=None)


def innermost_loop_body(filename: str, line: int) -> tuple[int, int] | None:
    """(first, last line) of the body of the innermost loop that holds ``line`` in its own scope (the function, or the
    module, around it), read from the source; None when none does or the file cannot be read."""
    tree = parsed(filename)
    if tree is None:
        return None
    scope = function_around(tree, line)
    holding = [
        node
        for node in own_nodes(scope)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        and node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno)
    ]
    if not holding:
        return None
    inner = max(holding, key=lambda node: node.lineno)
    return inner.body[0].lineno, inner.body[-1].end_lineno or inner.body[-1].lineno


def outermost_loop_around(filename: str, line: int, unless_in: types.CodeType) -> int | None:
    """The header line of the outermost loop that holds ``line`` in the innermost function of ``filename`` around it
    (an encoder's loop over time steps in a ``train()`` the iteration's loop calls); None outside a function, in
    ``unless_in``'s own function (the iteration loop's: its nested loops are told apart there), or when no loop of
    that function holds it."""
    tree = parsed(filename)
    functions = [
        node
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body[0].lineno <= line <= (node.end_lineno or 0)
    ]
    if not functions:
        return None
    function = max(functions, key=lambda node: node.lineno)
    if function.name == unless_in.co_name and unless_in.co_firstlineno in {
        function.lineno,
        *(decorator.lineno for decorator in function.decorator_list),
    }:
        return None
    headers = [
        node.lineno
        for node in own_nodes(function)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        and node.body[0].lineno <= line <= (node.end_lineno or 0)
    ]
    return min(headers, default=None)
