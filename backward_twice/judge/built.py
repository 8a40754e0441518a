"""Which of the learner's lines built a graph a name holds: "built at" in a carried graph's or a note's verdict.

:func:`built_line` asks the recorder's line tracer first (:meth:`backward_twice.record.lines.LineTracer.line_of`: the
innermost learner's line running when the node was built); for a node built before the recorder started, or one the
tracer did not see, it reads the source with ``ast`` for the assignment to the name: outside loops for a graph built
before the first iteration, in a loop otherwise.

:func:`rebinds_from_itself` tells a name each pass assigns from its own earlier value (``hidden = cell(x, hidden)``).
:func:`reads_on_line` tells a line that reads a name from one that only assigns it.

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.loop_body`, :mod:`backward_twice.judge.notes`,
:mod:`backward_twice.judge.stored` and :mod:`backward_twice.report.items`.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
import sys
from typing import TYPE_CHECKING

from backward_twice.judge.uses import without_grad
from backward_twice.record.learner import place, site_of
from backward_twice.record.loops import own_nodes
from backward_twice.record.names import CodeSite, NamedGraph
from backward_twice.record.sources import function_around, memo, parsed

if TYPE_CHECKING:
    from backward_twice.record.recorder import Recorder

__all__ = [
    "assigns_from_itself",
    "bound_names",
    "built_line",
    "function_span",
    "lines_built_before",
    "one_line_loop",
    "reads_on_line",
    "rebinds_from_itself",
    "spelled",
    "starts_without_a_tensor",
]


def built_line(named: NamedGraph, before_loop: bool, recorder: Recorder) -> str:
    """The learner's line that built ``named``'s node (:class:`backward_twice.record.lines.CreationLines`), as
    "file:line: code" (built before the loop: the line of the loop's code that called what built it); for a node
    built before the recorder started, the assignment to its variable: outside loops (the last one) for one built
    before the first iteration, in a loop otherwise; else where the name was found."""
    site = recorder.creation.line_of(named.sequence)
    link = recorder.loop.innermost
    if before_loop and site is not None and link is not None:  # the loop's code's line (``net.generate()``), not
        site = recorder.creation.call_line_of(named.sequence, (link.loop.filename, link.loop.header))  # a forward's
    elif site is not None and not _gives_the_name(*site, named.name):
        # the line that gave the variable its graph, of the calls it was built under (pix2pix's ``self.fake_B =
        # self.netG(self.real_A)``, not the ``return self.model(x)`` every U-Net block runs)
        lines = recorder.creation.call_lines_of(named.sequence)
        site = next((line for line in lines if _gives_the_name(*line, named.name)), site)
    if site is not None:
        return f"{place(*site)}: {linecache.getline(*site).strip()}"
    # Where the name was found, then the code the step was given in (a notebook: another cell, perhaps).
    places = [where for where in (named.frame, recorder.roots_where) if where is not None]
    module = re.search(r"(\w+)(?:\[[^\]]*\])*\.\w+$", named.name) if named.container == "parameter" else None
    update = _parameters_updated_in_place(places[0][0], module.group(1)) if places and module else None
    if update is not None:  # a parameter's graph, untraced (a framework's hook): the update that gave it one
        return f"{place(places[0][0], update)}: {linecache.getline(places[0][0], update).strip()}"
    for index, (filename, first_line, code_name) in enumerate(places):
        if index and filename == places[0][0]:
            continue
        tree = parsed(filename)
        if tree is None:
            continue
        line = memo(
            filename,
            ("assignment", named.name, named.is_global, first_line, code_name, before_loop),
            functools.partial(_assignment, tree, named, first_line, code_name, before_loop),
        )
        if line is not None:
            return f"{place(filename, line)}: {linecache.getline(filename, line).strip()}"
    for cell in reversed(_other_cells(places[0][0]) if places else []):  # a notebook's other cells, latest first:
        tree = parsed(cell)  # the name built in a cell run before (``logp_buf, ... = collect_rollouts()``)
        line = _assignment(tree, named, sys.maxsize, "<module>", before_loop) if tree is not None else None
        if line is not None:
            return f"{place(cell, line)}: {linecache.getline(cell, line).strip()}"
    if not places:
        return f"(the name {named.name})"
    filename, first_line, code_name = places[0]
    return f"{place(filename, first_line)} ({named.name}, {code_name})"


def _gives_the_name(filename: str, line: int, name: str) -> bool:
    """Whether the statement at ``line`` of ``filename`` assigns (or adds to) what ``name`` ends in: ``fake_B`` of
    ``model.fake_B``, ``h`` of ``h[0]``; as a target spells it (``self.fake_B = ...``, ``a, h = ...``)."""
    parts = [key or attribute for key, attribute in re.findall(r"\[['\"](\w+)['\"]\]|\.(\w+)", name)]
    last = parts[-1] if parts else re.split(r"\W", name, maxsplit=1)[0]
    tree = parsed(filename)
    if tree is None or not last:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno <= line <= (
            node.end_lineno or node.lineno
        ):
            targets: list[ast.expr] = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in bound_names(targets):
                spelled_target = ast.unparse(target)
                if re.search(rf"(?:^|\.|\[['\"]){re.escape(last)}(?:['\"]\])?$", spelled_target):
                    return True
    return False


def _parameters_updated_in_place(filename: str, module: str) -> int | None:
    """The first line of ``filename`` that changes in place, outside ``torch.no_grad()``, what a loop over a module's
    ``parameters()`` binds from another tensor it binds (an EMA's ``ema_p.mul_(decay).add_(p, ...)`` in a Lightning
    ``on_train_batch_end``), over ``module``'s parameters (``ema`` of ``self.ema.parameters()``)."""
    tree = parsed(filename)
    if tree is None:
        return None
    quiet = memo(filename, ("without grad",), functools.partial(without_grad, tree))
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For) or not re.search(rf"\b{module}\.parameters\(", ast.unparse(loop.iter)):
            continue
        bound = {node.id for node in ast.walk(loop.target) if isinstance(node, ast.Name)}
        for statement in loop.body:
            if statement.lineno in quiet or not isinstance(statement, ast.Expr):
                continue
            calls = [node for node in ast.walk(statement) if isinstance(node, ast.Call)]
            changed = [
                call.func.value
                for call in calls
                if isinstance(call.func, ast.Attribute)
                and call.func.attr.endswith("_")
                and call.func.attr[0] != "_"
                and call.func.attr not in ("requires_grad_", "share_memory_")  # no value changes
            ]
            names = {target.id for target in changed if isinstance(target, ast.Name) and target.id in bound}
            read = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name) and node.id in bound}
            if names and read - names:  # blended from another of the loop's tensors: ``.add_(p, alpha=...)``
                return statement.lineno
    return None


def _other_cells(filename: str) -> list[str]:
    """The other notebook cells the kernel ran, in the order it ran them, when ``filename`` is a cell's; none else."""
    if not place(filename, 1).startswith("Cell "):
        return []
    return [cell for cell in list(linecache.cache) if cell != filename and place(cell, 1).startswith("Cell ")]


def _assignment(tree: ast.Module, named: NamedGraph, first_line: int, code_name: str, before_loop: bool) -> int | None:
    """The line of the assignment that built ``named``'s value, searched from the function it was found in
    outward: the functions around it (a step defined inside a test or a cell), the module's top level, then the
    whole file (``y = model(x)`` in a ``build()`` that returns ``{"y": y}``). Assignments that only alias a value
    (``y = state["y"]``) or cannot build a graph (``h = h.detach()``) do not count. Built in an iteration: the
    last one inside a loop (with none there, the last one of the name a loop aliases it to: ``hidden`` of
    ``h = hidden``); built before the first: the last one outside loops before the function's own line."""
    spelled = named.name
    root = re.split(r"\W", spelled, maxsplit=1)[0]  # the leading word: "state" of state['h'], "" of ['h']
    parts = [key or attribute for key, attribute in re.findall(r"\[['\"](\w+)['\"]\]|\.(\w+)", spelled)]
    names = [name for name in [*reversed(parts), root] if name]  # the last part first: what the graph was given to
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    around = (
        []
        if named.is_global or code_name == "<module>"
        else sorted(
            (
                node
                for node in ast.walk(tree)
                if isinstance(node, functions) and node.lineno <= first_line <= (node.end_lineno or node.lineno)
            ),
            key=lambda node: -node.lineno,
        )
    )
    scopes = [*((f, False, False) for f in around), (tree, False, False), (tree, True, False), (tree, True, True)]
    # last of all, an index of a tensor (``b1 = b[0]``), which may build a view's graph
    for scope, nested, indexing in scopes:
        # in each scope, the last part first (``state['model'].reg_loss``: an assignment to ``.reg_loss``), then the
        # parts before it (``state['actions'].logits``, set inside torch: ``actions = ...``)
        found = next((f for name in names if (f := _assignments_to({name}, scope, nested, indexing))), [])
        if not found:
            continue
        if before_loop:
            outside = [line for line, in_loop in found if not in_loop] or [line for line, _ in found]
            earlier = [line for line in outside if line < first_line]
            return earlier[-1] if earlier else outside[0]
        inside = [line for line, in_loop in found if in_loop]
        if not inside:  # ``h = hidden`` in the loop, the graph built as ``hidden = model(x) + h``: that line
            aliased = _aliased_in_loops(set(names), scope, nested)
            inside = [line for line, in_loop in _assignments_to(aliased, scope, nested, indexing) if in_loop]
        return (inside or [line for line, _ in found])[-1]
    return None


def _aliased_in_loops(wanted: set[str], scope: ast.AST, nested: bool) -> set[str]:
    """The names a loop in ``scope`` gives to one of ``wanted`` as they are (``h = hidden``: ``hidden``)."""
    aliased: set[str] = set()
    for loop in ast.walk(scope):
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)):
            continue
        for node in ast.walk(loop):
            if not nested and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and any(_binds(target, wanted) for target in node.targets)
            ):
                aliased.add(node.value.id)
    return aliased - wanted


def _assignments_to(wanted: set[str], scope: ast.AST, nested: bool, indexing: bool = False) -> list[tuple[int, bool]]:
    """(line, inside a loop) of each assignment in ``scope`` that binds one of ``wanted`` with a value that may
    build a graph (``indexing``: an index counts too); the functions, classes and lambdas inside ``scope`` are
    searched too only if ``nested``. An augmented assignment (``self.reg_loss += reg``) builds by itself."""
    found: list[tuple[int, bool]] = []
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, scopes) and child is not scope and not nested:
                continue  # a scope of its own: searched when it is around the name, or in the last pass
            loop = in_loop or isinstance(child, (ast.For, ast.While, ast.AsyncFor))
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _builds(child, indexing):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                if any(_binds(t, wanted) for t in targets):
                    found.append((child.lineno, in_loop))
            visit(child, loop)

    visit(scope, False)
    return found


def _builds(assignment: ast.Assign | ast.AugAssign | ast.AnnAssign, indexing: bool) -> bool:
    """Whether an assignment may give its target a graph (see :func:`_assignments_to`)."""
    if isinstance(assignment, ast.AugAssign) or _may_build(assignment.value):
        return True
    return indexing and isinstance(assignment, ast.Assign) and isinstance(assignment.value, ast.Subscript)


def _may_build(value: ast.AST | None) -> bool:
    """Whether an assignment's value can build a graph: not a constant, not a mere alias (``y = state["y"]``,
    ``a, b = x, y``), not ``x.detach()`` or ``x.item()``."""
    if value is None or isinstance(value, (ast.Constant, ast.Name, ast.Subscript, ast.Attribute)):
        return False
    if isinstance(value, ast.Tuple):
        return any(_may_build(item) for item in value.elts)
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in ("detach", "detach_", "item", "tolist", "numpy")
    )


def _binds(target: ast.AST, wanted: set[str]) -> bool:
    """Whether an assignment target binds one of ``wanted``: a name, an attribute or a string key."""
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and node.id in wanted and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Attribute) and node.attr in wanted and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in wanted:
            return True
    return False


def starts_without_a_tensor(spelled: str, filename: str) -> bool:
    """Whether the file assigns ``spelled`` (``beta``, ``self.hidden``) a constant somewhere (``beta = 0``,
    ``self.hidden = None``, ``{"hidden": None}`` for ``state["hidden"]``): then it may hold no tensor in the first
    iteration, and a ``.detach()`` there fails. In a notebook, any cell the kernel ran may have assigned it
    (``h_state = None`` in the cell before the loop's)."""
    entry = re.sub(r"^.+?(?=\[['\"][^\]]*\]$)", "*", spelled)  # ``s['mem']['h']``: any dict's entry ``*['h']``
    for file in [filename, *_other_cells(filename)]:
        tree = parsed(file)
        constants = memo(file, ("constants",), functools.partial(_assigned_constants, tree)) if tree else frozenset()
        if spelled in constants or entry in constants:
            return True
    return False


def _assigned_constants(tree: ast.Module) -> frozenset[str]:
    """What the file assigns a constant, as spelled (``beta``, ``self.hidden``, ``state['h']``; ``*['h']`` for an
    entry a dict is made with: ``{"h": None}``), and for a class's own attribute (``aux_total = 0.0`` in its body)
    also as its methods read it (``self.aux_total``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets: list[ast.expr] = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, (ast.Name, ast.Attribute, ast.Subscript)):
                        found.add(ast.unparse(part))
        if isinstance(node, ast.Dict):  # ``{"hidden": None, ...}``, returned by ``build()`` and read as
            found.update(  # ``state["hidden"]`` elsewhere: any dict's entry by that key
                f"*[{ast.unparse(key)}]"
                for key, value in zip(node.keys, node.values)
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
            )
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):  # ``gamma, alpha = 0.99,
            for target in node.targets:  # 0.2``: each name given a constant of the tuple
                if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == len(node.value.elts):
                    found.update(
                        ast.unparse(name)
                        for name, value in zip(target.elts, node.value.elts)
                        if isinstance(value, ast.Constant)
                        and isinstance(name, (ast.Name, ast.Attribute, ast.Subscript))
                    )
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, (ast.Assign, ast.AnnAssign)) and isinstance(statement.value, ast.Constant):
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    found.update(f"self.{target.id}" for target in targets if isinstance(target, ast.Name))
    return frozenset(found)


_MOST_NODES_READ = 10_000  # of a graph built before the loop, read for the lines that built it


def lines_built_before(recorder: Recorder, nodes: list[int], built_at: str) -> tuple[int, ...]:
    """The lines of the function ``built_at``'s line is in, up to that line, that built ``nodes`` (a graph built
    before the loop, by sequence number), each by the call of that function's code that built it: Karpathy's
    ``logits = xenc @ W`` to ``loss = -prob[...].log().mean()``, which must all move into the loop, where a line that
    makes a leaf (``W = torch.randn(..., requires_grad=True)``) built no node and must not."""
    site = site_of(built_at)
    tree = parsed(site[0]) if site is not None else None
    if site is None or tree is None:
        return ()
    function = function_around(tree, site[1])
    first = function.body[0].lineno if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else 1
    lines = set()
    for sequence in nodes[:_MOST_NODES_READ]:
        line = recorder.creation.call_line_of(sequence, site)
        if line is not None and line[0] == site[0] and first <= line[1] <= site[1]:
            lines.add(line[1])
    return tuple(sorted(lines))


def function_span(where: CodeSite) -> tuple[str, int, int] | None:
    """(file, first line, last line) of the function ``where`` names (the module's code: the whole file)."""
    filename, first_line, name = where
    tree = parsed(filename)
    if tree is None:
        return None
    lines = linecache.getlines(filename)
    if name == "<module>" or (lines and lines[0].startswith("%%") and first_line == 1):
        return filename, 1, len(lines)  # a module, or the body of a cell under a cell magic (``%%diagnose``)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            starts = {node.lineno, *(d.lineno for d in node.decorator_list)}
            if first_line in starts:
                return filename, node.lineno, node.end_lineno or node.lineno
    return None


def rebinds_from_itself(named: NamedGraph) -> bool:
    """Whether the code ``named`` was found in assigns that name from an expression that reads it
    (``hidden = cell(x, hidden)``, ``h, c = lstm(x, (h, c))``, ``total += loss``, ``self.hidden = self.rnn(x,
    self.hidden)``, ``state[0] = cell(x, state[0])``): a name that carries its own earlier value on, where
    ``loss = criterion(out, y)`` does not. The name is compared as the code spells it."""
    return assigns_from_itself(named.name, named.frame)


def assigns_from_itself(name: str, frame: CodeSite | None) -> bool:
    """:func:`rebinds_from_itself` for ``name`` as the code ``frame`` names spells it."""
    span = function_span(frame) if frame is not None else None
    tree = parsed(span[0]) if span is not None else None
    if span is None or tree is None:
        return False
    first, last = span[1], span[2]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    scope = next((n for n in ast.walk(tree) if isinstance(n, functions) and n.lineno == first), tree)
    for node in own_nodes(scope):  # not a function it defines (Deep SVDD's ``init_center_c`` adds to its own ``c``)
        if not first <= getattr(node, "lineno", 0) <= last:
            continue
        if isinstance(node, ast.AugAssign) and spelled(node.target) == name:
            return True
        if (
            isinstance(node, ast.Assign)
            and any(spelled(target) == name for target in bound_names(node.targets))
            and any(spelled(read) == name for read in ast.walk(node.value))
        ):
            return True
    return False


def bound_names(targets: list[ast.expr]) -> list[ast.expr]:
    """Each name an assignment binds: the items of a tuple or list target (``h, c = ...``), one by one."""
    found: list[ast.expr] = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(bound_names(target.elts))
        else:
            found.append(target.value if isinstance(target, ast.Starred) else target)
    return found


def spelled(node: ast.AST) -> str | None:
    """A name as a verdict spells it (``hidden``, ``self.hidden``, ``state[0]``, ``buffers['h']``), for a name, an
    attribute chain or a constant subscript; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = spelled(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        owner = spelled(node.value)
        return None if owner is None else f"{owner}[{node.slice.value!r}]"
    return None


def one_line_loop(filename: str, line: int) -> bool:
    """Whether ``line`` of ``filename`` is a loop whose body starts on its header's line (``for x in data: h =
    cell(x, h); ...``): a statement added before that line runs once, not at each pass."""
    tree = parsed(filename)
    loops = (ast.For, ast.AsyncFor, ast.While)
    return tree is not None and any(
        isinstance(node, loops) and node.lineno == line and node.body[0].lineno == line for node in ast.walk(tree)
    )


def reads_on_line(code: str, name: str) -> bool:
    """Whether ``code``, one line of source, reads ``name`` (``self.h = self.rnn(x, self.h)``, ``total += loss``), not
    only assigns it (``self.previous = outputs.logits.mean()``); a line that does not parse alone (part of a longer
    statement) is taken to read it."""
    try:
        tree = ast.parse(code.strip().rstrip(":") or "pass")
    except SyntaxError:
        return True
    return any(
        (isinstance(node, ast.AugAssign) and spelled(node.target) == name)
        or (
            isinstance(node, (ast.Name, ast.Attribute, ast.Subscript))
            and isinstance(node.ctx, ast.Load)
            and spelled(node) == name
        )
        for node in ast.walk(tree)
    )
