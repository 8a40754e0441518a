"""How the learner's code reads and writes a name, statement by statement: where a carried graph comes in, which lines
a loss is computed through, how a list is used.

:func:`first_read` finds where a carried graph comes into an iteration: the first line of the loop's body (or of the
function the name was found in) that reads the name; :func:`read_first` tells whether the body reads a name before
it assigns it (a name assigned first, ``loss = ...``, brings nothing of an earlier iteration in); :func:`bound_in`
whether lines assign or grow it. :func:`list_use` tells a list rebound every iteration (``pred, mems = model(x,
mems)``) from one the loss is built from whole (``zip(policy.saved_log_probs, returns)``) and from one read by index
or slice (``bank[-4:]``). :func:`computed_again` gives the lines a loss is computed through from a forward an
optimizer step then changed; :func:`summed_over_steps` the total a backward walks that adds up losses from passes
an optimizer step came between; :func:`graph_cut` the line whose operation left a loss without a graph.

Used by :mod:`backward_twice.judge.built`, :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.fixes`,
:mod:`backward_twice.judge.frozen`, :mod:`backward_twice.judge.gan_retain`, :mod:`backward_twice.judge.second_backward`,
:mod:`backward_twice.judge.verdicts` and :mod:`backward_twice.report.error_item`.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from collections.abc import Callable, Collection, Iterator

from backward_twice.record.loops import innermost_loop_body, outermost_loop_without
from backward_twice.record.sources import function_around, memo, parsed

__all__ = [
    "assigned_in_the_loss",
    "bound_in",
    "computed_again",
    "computed_through",
    "first_read",
    "graph_cut",
    "list_use",
    "read_first",
    "read_in_the_loss",
    "summed_over_steps",
    "without_grad",
]


def first_read(
    spelled: str,
    spans: list[tuple[str, int, int]],
    a_list: bool = False,
    ran: Collection[tuple[str, int]] = (),
) -> tuple[str, int] | None:
    """(file, line) of the first line that reads ``spelled`` (``h``, ``state['h']``, ``self.hidden``) in the first of
    ``spans`` ((file, first line, last line): the loop's body, the function the name was found in) that reads it at
    all: where an earlier iteration's graph comes into this one. For a list (``a_list``), a line that only grows it
    (``bank.append(hidden)``) brings nothing in and is passed over. ``ran``: the lines the tracer saw run, when it
    saw any of a span's: a line that never ran (behind an ``if`` that was off) is passed over too, and so is a read
    under ``torch.no_grad()`` (SAC's target uses ``alpha`` there, and no graph comes in)."""
    for filename, first, last in spans:
        tree = parsed(filename)
        if tree is None:
            continue
        reads = memo(filename, ("reads",), functools.partial(_reads, tree))
        lines = sorted(line for line in reads.get(spelled, ()) if first <= line <= last)
        around = _scopes(filename, tree)
        owner = next((span[2] for span in _spans_of(filename, tree) if span[2].lineno == first), None) or around(first)
        # the span's own reads, not a function's it defines (a helper's parameter ``ctx`` is not the script's)
        lines = [line for line in lines if around(line) is owner] or lines
        if a_list:
            uses = memo(filename, ("list uses",), functools.partial(_list_uses, tree)).get(spelled, ())
            reading = {line for line, kind in uses if kind != "grown"}
            lines = [line for line in lines if line in reading]
        if any((filename, line) in ran for line in range(first, last + 1)):
            lines = [line for line in lines if (filename, line) in ran]
        quiet = memo(filename, ("without grad",), functools.partial(without_grad, tree))
        lines = [line for line in lines if line not in quiet] or lines
        if lines:
            return filename, lines[0]
    return None


def read_first(spelled: str, span: tuple[str, int, int]) -> bool | None:
    """Whether the code in ``span`` (file, first line, last line: a loop's body) reads ``spelled`` before it assigns
    it, statement by statement in the order they are written (a statement's right side before its targets, a
    ``+=`` a read): True for ``smooth = 0.9 * smooth + 0.1 * loss`` or ``h = cell(x, h)``, False for ``loss`` when
    ``loss = criterion(...)`` comes first; None when the code does neither."""
    filename, first, last = span
    tree = parsed(filename)
    if tree is None:
        return None
    for line, reads, writes in memo(filename, ("reads and writes",), functools.partial(_statements, tree)):
        if first <= line <= last:
            if spelled in reads:
                return True
            if spelled in writes:
                return False
    return None


def _statements(tree: ast.Module) -> list[tuple[int, frozenset[str], frozenset[str]]]:
    """(line, what it reads, what it assigns) of every statement, and of every loop's and branch's header, in the
    order they are written. A compound statement's body is its own statements."""
    found: list[tuple[int, frozenset[str], frozenset[str]]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        parts: list[ast.AST]
        if isinstance(node, (ast.For, ast.AsyncFor)):
            parts = [node.iter, node.target]
        elif isinstance(node, (ast.While, ast.If)):
            parts = [node.test]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            parts = list(node.items)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try)):
            continue
        else:
            parts = [node]
        reads: set[str] = set()
        writes: set[str] = set()
        for part in parts:
            for inner in ast.walk(part):
                if isinstance(inner, (ast.Name, ast.Attribute, ast.Subscript)):
                    spelled = ast.unparse(inner)
                    (writes if isinstance(inner.ctx, ast.Store) else reads).add(spelled)
        if isinstance(node, ast.AugAssign):  # ``x += y`` reads x first
            reads.add(ast.unparse(node.target))
        found.append((node.lineno, frozenset(reads), frozenset(writes)))
    found.sort(key=lambda entry: entry[0])
    return found


_GROWS = frozenset(
    {"append", "appendleft", "extend", "extendleft", "insert", "clear"}
)  # methods that change the list and read no item


def computed_again(filename: str, stale: int, loss: str, step: int, backward: int | None = None) -> list[int]:
    """The lines to compute again after an optimizer step at line ``step`` when a forward at line ``stale`` saved the
    weights it changed: ``stale`` itself, and, when ``loss`` (what the failing backward starts from) was assigned
    before the step too, each statement from ``stale`` to that assignment that the loss reads through (``prob =
    D(fake)``, ``score = torch.log(1 - prob)``, ``G_loss = torch.mean(score)``: not the D loss between them); assigned
    after the step (before ``backward``), each statement before the step that it reads through."""
    tree = parsed(filename)
    if tree is None:
        return [stale]
    statements = memo(filename, ("reads and writes",), functools.partial(_statements, tree))
    # a line inside a statement of several lines (``value_model(...)`` of ``values = \``): that statement's first
    simple = (n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body"))
    stale = next((n.lineno for n in simple if n.lineno < stale <= (n.end_lineno or 0)), stale)
    body = innermost_loop_body(filename, backward) if backward is not None and backward < step else None
    if body is not None and body[0] <= step <= body[1] and stale < body[0]:
        return _read_by_the_loop(statements, stale, body)
    window = [entry for entry in statements if stale <= entry[0] < step]
    assigned = [entry for entry in window if loss in entry[2]]
    after = [e for e in statements if step < e[0] < (backward or 0) and loss in e[2]] if not assigned else []
    if not assigned and not after:
        return [stale]
    # the loss assigned after the step from what lines before it computed (``loss = feats.pow(2).mean()``, where
    # ``feats = out.tanh()`` and ``out = model(x)`` came before it): those lines, each read through
    last, reads, _ = assigned[-1] if assigned else (step, after[-1][1], after[-1][2])
    needed, chain = set(reads), [last] if assigned else []
    for line, reading, writing in reversed(window):
        if line < last and writing & needed:
            chain.append(line)
            needed |= reading
    return sorted(chain) if stale in chain else [stale]


def _read_by_the_loop(
    statements: list[tuple[int, frozenset[str], frozenset[str]]], stale: int, body: tuple[int, int]
) -> list[int]:
    """The lines from ``stale`` to the loop whose ``body`` (first, last line) holds a backward and, after it, the step
    that changed what ``stale`` saved (AdvGAN's G steps on a ``perturbation`` made before them): ``stale`` and each
    line after it that computes from it what the loop reads (``adv_images``), not what reads it for another use (the
    D loss); the loop's own lines compute again in its next pass."""
    before = [entry for entry in statements if stale <= entry[0] < body[0] - 1]
    tainted, chain = set(before[0][2]) if before else set(), [stale]
    for line, reads, writes in before[1:]:
        if reads & tainted:
            chain.append(line)
            tainted |= writes
    needed: set[str] = set()
    assigned: set[str] = set()  # what the loop reads before it assigns it: what comes in from before it
    for line, reads, writes in statements:
        if body[0] <= line <= body[1]:
            needed |= reads - assigned
            assigned |= writes
    kept: list[int] = []
    for line, reads, writes in reversed([entry for entry in before if entry[0] in chain]):
        if writes & needed or line == stale:
            kept.append(line)
            needed |= reads
    return sorted(kept)


def summed_over_steps(filename: str, stale: int, step: int, backward: int) -> tuple[str, int] | None:
    """``(total, header)`` where the failing backward at line ``backward`` walks ``total``, which a line of the loop
    at ``header`` adds to in each pass, and that loop (the outermost of the function's loops that hold ``step`` and
    not ``backward``) holds the forward at ``stale`` too (an epoch's ``(0.1 * total).backward()`` after per-batch
    steps): each pass's step changed the weights the earlier passes' losses saved, so no line computed again after
    one step mends it. None for any other lines."""
    tree = parsed(filename)
    if tree is None or function_around(tree, step) is not function_around(tree, backward):
        return None
    header = outermost_loop_without(filename, step, backward)
    loop = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and n.lineno == header), None
    )
    if loop is None or not loop.body[0].lineno <= stale <= (loop.end_lineno or 0):
        return None
    first, last = loop.body[0].lineno, loop.end_lineno or loop.lineno
    statements = memo(filename, ("reads and writes",), functools.partial(_statements, tree))
    walked = set().union(*(reads for line, reads, _ in statements if line == backward))
    for line, reads, writes in reversed(statements):  # what it is computed from after the loop (``total =
        if last < line < backward and writes & walked:  # torch.stack(losses).sum()``)
            walked |= reads
    for line, reads, writes in statements:
        if first <= line <= last:
            grown = {name.rsplit(".", 1)[0] for name in reads if name.endswith((".append", ".extend"))}
            for total in sorted(walked & ((reads & writes) | grown)):  # ``total += loss``, ``losses.append(loss)``
                return total, loop.lineno
    return None


# what gives values without a gradient: indices, rounded or cast values, numbers, a copy without the graph
_CUTS = re.compile(
    r"\.(argmax|argmin|argsort|round|floor|ceil|sign|long|int|bool|item|detach|numpy|tolist)\(|\.(data)\b"
    r"|torch\.(argmax|argmin|argsort|round|floor|ceil|sign|tensor|from_numpy|as_tensor)\("
)


def graph_cut(
    filename: str, backward: int, ran: Collection[tuple[str, int]] = (), depth: int = 0
) -> tuple[int, str] | None:
    """``(line, operation)`` of the statement, among those the loss the backward at line ``backward`` is computed
    through (before it, in its function), whose operation gives values without a gradient (``.argmax()``, ``.item()``,
    ``.detach()``, ``.data``, ``torch.tensor(...)``) or that runs under ``torch.no_grad()``; None if none does.
    ``ran``: the lines the tracer saw run; where it saw some of the function's, a branch that did not run is passed
    over. A statement that calls a function of the same file (``l = compute_loss(net, x, y)``) is followed into what
    that function returns, two calls deep."""
    tree = parsed(filename)
    if tree is None:
        return None
    quiet = memo(filename, ("without grad",), functools.partial(without_grad, tree))
    lines = linecache.getlines(filename)
    rewrapped: tuple[int, str] | None = None  # ``torch.tensor(batch_loss)``: the cut is where that number came from
    for line, _ in computed_through(filename, tree, backward, ran):
        if line in quiet:
            return line, "torch.no_grad()"
        cuts = (
            [_operation(cut) for cut in _CUTS.finditer(lines[line - 1].split("#", 1)[0])] if line <= len(lines) else []
        )
        cut = next((op for op in cuts if op not in _REWRAPS), None)  # ``.tolist()`` inside ``torch.tensor(...)``
        if cut is not None:
            return line, cut
        rewrapped = rewrapped or ((line, cuts[0]) if cuts else None)
        inside = _cut_in_a_call(tree, filename, line, ran, depth) if depth < 2 else None
        if inside is not None:
            return inside
    return rewrapped


def read_in_the_loss(filename: str, backward: int, name: str) -> int | None:
    """The line, before the backward at line ``backward`` in its function, of the last statement the loss it starts
    from is computed through that reads ``name`` (``errD_fake = criterion(netD(fake), zeros)`` for ``fake``)."""
    tree = parsed(filename)
    if tree is None:
        return None
    return next((line for line, reads in computed_through(filename, tree, backward) if name in reads), None)


def assigned_in_the_loss(filename: str, backward: int, name: str) -> tuple[int, frozenset[str]] | None:
    """(line, what it reads) of the statement the loss of the backward at line ``backward`` is computed through that
    assigns ``name`` (``d_fake = self.discriminator(fake)``), if any."""
    tree = parsed(filename)
    if tree is None:
        return None
    statements = memo(filename, ("reads and writes",), functools.partial(_statements, tree))
    writes = {line: assigned for line, _, assigned in statements}
    return next(
        ((line, reads) for line, reads in computed_through(filename, tree, backward) if name in writes.get(line, ())),
        None,
    )


def computed_through(
    filename: str, tree: ast.Module, backward: int, ran: Collection[tuple[str, int]] = ()
) -> Iterator[tuple[int, frozenset[str]]]:
    """(line, what it reads) of the backward's own statement at line ``backward``, then of each statement before it
    in its function (not a function it defines) that the loss it starts from is computed through, latest first.
    ``ran``: where the tracer saw some of the function's lines run, a branch that did not run is passed over."""
    statements = memo(filename, ("reads and writes",), functools.partial(_statements, tree))
    needed = set().union(*(reads for line, reads, _ in statements if line == backward))
    yield backward, frozenset(needed)
    scope, around = function_around(tree, backward), _scopes(filename, tree)
    own = [entry for entry in statements if entry[0] < backward and around(entry[0]) is scope]
    if any((filename, line) in ran for line, _, _ in own):
        own = [entry for entry in own if (filename, entry[0]) in ran]
    for line, reads, writes in reversed(own):
        if writes & needed:
            yield line, reads
            needed |= reads


def _cut_in_a_call(
    tree: ast.Module, filename: str, line: int, ran: Collection[tuple[str, int]], depth: int
) -> tuple[int, str] | None:
    """:func:`graph_cut` in the functions of ``filename`` the statement at ``line`` calls, from their ``return``."""
    calls, returns = memo(filename, ("calls and returns",), functools.partial(_calls_and_returns, tree))
    quiet = memo(filename, ("without grad",), functools.partial(without_grad, tree))
    for name in calls.get(line, ()):
        for returned in returns.get(name, ()):
            text = linecache.getline(filename, returned.lineno).split("#", 1)[0]
            here = next((_operation(cut) for cut in _CUTS.finditer(text)), None)
            here = "torch.no_grad()" if returned.lineno in quiet else here
            found = (returned.lineno, here) if here else graph_cut(filename, returned.lineno, ran, depth + 1)
            if found is not None:
                return found
    return None


def _scopes(filename: str, tree: ast.Module) -> Callable[[int], ast.AST]:
    """:func:`function_around` for many lines of one file: the innermost function whose body holds a line."""
    functions = _spans_of(filename, tree)

    def around(line: int) -> ast.AST:
        holding = [span for span in functions if span[0] <= line <= span[1]]
        return max(holding, key=lambda span: span[0])[2] if holding else tree

    return around


def _spans_of(filename: str, tree: ast.Module) -> list[tuple[int, int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """:func:`_function_spans` of ``filename``, read once per version of the file."""
    return memo(filename, ("function spans",), functools.partial(_function_spans, tree))


def _function_spans(tree: ast.Module) -> list[tuple[int, int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(first line of its body, last line, the node) of each function of ``tree``: :func:`function_around`'s answer
    for many lines at once (the innermost span that holds a line; none: the module)."""
    return [
        (node.body[0].lineno, node.end_lineno or 0, node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _calls_and_returns(tree: ast.Module) -> tuple[dict[int, set[str]], dict[str, list[ast.Return]]]:
    """The names each line calls (``compute_loss`` of ``l = compute_loss(net, x, y)``), and each function's
    ``return`` statements that return a value, by the function's name."""
    calls: dict[int, set[str]] = {}
    returns: dict[str, list[ast.Return]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):  # a method's too
            called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr  # (self.compute_loss)
            calls.setdefault(node.lineno, set()).add(called)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            returns.setdefault(node.name, []).extend(found)
    return calls, returns


_REWRAPS = frozenset({"torch.tensor()", "torch.as_tensor()", "torch.from_numpy()"})  # numbers made a tensor again


def _operation(cut: re.Match[str]) -> str:
    """How an operation ``_CUTS`` matched is spelled in a diagnosis: ``.argmax()``, ``.data``, ``torch.tensor()``."""
    name = next(group for group in cut.groups() if group)
    return ".data" if name == "data" else f"torch.{name}()" if cut[0].startswith("torch.") else f".{name}()"


def bound_in(spelled: str, span: tuple[str, int, int]) -> bool:
    """Whether lines ``first`` to ``last`` of ``filename`` (``span``) assign ``spelled``, an item of it, or grow it
    (``alpha = log_alpha.exp()``, ``self.reg += ...``, ``outputs.append(...)``); True where the file cannot be read.
    An attribute chain is matched by its last attribute (``model.h`` found, ``self.h`` written)."""
    filename, first, last = span
    tree = parsed(filename)
    if tree is None:
        return True
    by_spelling = memo(filename, ("list uses",), functools.partial(_list_uses, tree))
    tail = re.search(r"\.(\w+)$", spelled)
    uses = list(by_spelling.get(spelled, ()))
    if tail is not None:
        uses += [use for key, found in by_spelling.items() if key.endswith(f".{tail.group(1)}") for use in found]
    return any(first <= line <= last and kind in ("rebound", "grown", "alias") for line, kind in uses)


def list_use(spelled: str, spans: list[tuple[str, int, int]]) -> str | None:
    """How the first of ``spans`` that uses the list ``spelled`` uses it: ``"rebound"`` (assigned there, a new list
    every iteration: ``pred, mems = model(x, mems)``, or its items set: ``hs[layer], cs[layer] = cell(...)``),
    ``"whole"`` (only read whole: iterated, passed to ``torch.cat``, ``zip`` or ``sum``), ``"indexed"`` (read by
    index or slice: ``bank[-4:]``). Growing it (``.append(x)``) is no use here, nor naming it after an object's
    attribute (``saved_actions = model.saved_actions``). None when no span uses it. A list found as
    ``state['policy'].saved_log_probs`` and read through a function's own ``policy`` is matched by its last
    attribute."""
    tail = re.search(r"\.(\w+)$", spelled)
    for filename, first, last in spans:
        tree = parsed(filename)
        if tree is None:
            continue
        by_spelling = memo(filename, ("list uses",), functools.partial(_list_uses, tree))
        uses = list(by_spelling.get(spelled, ()))
        if not uses and tail is not None:
            ending = f".{tail.group(1)}"
            uses = [use for key, found in by_spelling.items() if key.endswith(ending) for use in found]
        kinds = {kind for line, kind in uses if first <= line <= last and kind not in ("grown", "alias")}
        if kinds:
            return "rebound" if "rebound" in kinds else "whole" if kinds == {"whole"} else "indexed"
    return None


def _list_uses(tree: ast.Module) -> dict[str, list[tuple[int, str]]]:
    """Each name or attribute chain the file uses -> (line, "rebound" | "indexed" | "grown" | "whole" | "alias") for
    each use ("alias": ``saved_actions = model.saved_actions``, a name for the list an object holds)."""
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):  # mems, self.mems, state['mems']
            continue
        if isinstance(node.ctx, ast.Store):
            assigned = parents.get(id(node))
            value = assigned.value if isinstance(assigned, ast.Assign) and len(assigned.targets) == 1 else None
            named_after = isinstance(node, ast.Name) and isinstance(value, ast.Attribute) and value.attr == node.id
            kind = "alias" if named_after else "rebound"  # saved_actions = model.saved_actions: the same list
        elif not isinstance(node.ctx, ast.Load):
            continue
        else:
            parent = parents.get(id(node))
            if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, ast.Del):
                kind = "grown"  # ``del saved_log_probs[:]``: a change of the list, as ``.clear()``, not a read
            elif isinstance(parent, ast.Subscript) and parent.value is node:  # an item set (hs[layer] = ...): each
                kind = "rebound" if isinstance(parent.ctx, ast.Store) else "indexed"  # iteration puts new ones in
            elif isinstance(parent, ast.Attribute) and parent.value is node:
                kind = "grown" if parent.attr in _GROWS else "indexed"  # a method or attribute of the list
            else:
                kind = "whole"
        found.setdefault(ast.unparse(node), []).append((node.lineno, kind))
    return found


def without_grad(tree: ast.Module) -> frozenset[int]:
    """The lines of the bodies of ``with torch.no_grad():`` and ``with torch.inference_mode():``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(_no_grad(item.context_expr) for item in node.items):
            for statement in node.body:
                lines.update(range(statement.lineno, (statement.end_lineno or statement.lineno) + 1))
    return frozenset(lines)


def _no_grad(expression: ast.expr) -> bool:
    called = expression.func if isinstance(expression, ast.Call) else expression
    name = called.attr if isinstance(called, ast.Attribute) else called.id if isinstance(called, ast.Name) else ""
    return name in ("no_grad", "inference_mode")


def _reads(tree: ast.Module) -> dict[str, list[int]]:
    """Each name, attribute chain and subscript the file reads (``h``, ``self.hidden``, ``state['h']``, the target
    of a ``+=``) -> its lines; a test of it alone (``if hidden is None:``, ``if mems:``, ``h if h is not None else
    ...``'s test) is no read, nor is ``loss.item()``: no graph comes in there."""
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        augmented = isinstance(parent := parents.get(id(node)), ast.AugAssign) and parent.target is node  # ``+=``
        read = isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and (
            isinstance(node.ctx, ast.Load) or augmented  # reads the old value, as ``total = total + ...`` does
        )
        if read and isinstance(node, ast.expr) and not _only_tested(node, parents) and not _no_graph_of(node, parents):
            found.setdefault(ast.unparse(node), []).append(node.lineno)
    return found


# what reading them gives holds no graph: ``print(loss.item())`` brings none in
_NO_GRAPH = frozenset({"item", "tolist", "numpy", "detach", "shape", "size", "dtype", "device", "ndim", "dim"})
_NUMBER_OF = frozenset({"len", "isinstance", "type", "id"})  # ``len(features)``: a number, no graph


def _no_graph_of(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` is read only for a number, a copy without its graph or its shape, at the end of a chain of
    calls on it (``loss.item()``, ``h.norm().item()``, ``h.detach().cpu()``), or its length (``len(h)``)."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in _NUMBER_OF:
        return True
    while (isinstance(parent, ast.Attribute) and parent.value is node) or (
        isinstance(parent, ast.Call) and parent.func is node
    ):
        if isinstance(parent, ast.Attribute) and parent.attr in _NO_GRAPH:
            return True
        node, parent = parent, parents.get(id(parent))
    return False


def _only_tested(node: ast.expr, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` is only compared by identity (``is None``) or tested for truth (an ``if``'s test)."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops):
        return True
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        node, parent = parent, parents.get(id(parent))
    return isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is node
