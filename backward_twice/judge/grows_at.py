"""Where a note's name grows, as the learner's code spells it: the line that appends to it or adds to it
(:func:`growing_line`), the line that gives it another name's graphs (:func:`assigned_line`), and the local name a
function gives it before it grows it (:func:`local_alias`: ``losses`` of ``losses = state["losses"]``, or the
parameter of a helper it is passed to); what such a line appends to, as written (:func:`receiver`), and what a
``total += term`` adds (:func:`added_to`).

Used by :mod:`backward_twice.judge.notes` and :mod:`backward_twice.report.items`.
"""

from __future__ import annotations

import ast
import linecache
import re
from collections import Counter

from backward_twice.record.loops import innermost_loop_body
from backward_twice.record.sources import function_around, parsed

__all__ = [
    "Grows",
    "added_to",
    "assigned_line",
    "beside",
    "either_quote",
    "growing_line",
    "growing_lines",
    "local_alias",
]


def either_quote(name: str) -> str:
    """A pattern of ``name`` whose keys may be quoted either way (``self.totals["critic"]`` for
    ``self.totals['critic']``)."""
    return "".join("['\"]" if char in "'\"" else re.escape(char) for char in name)


def assigned_line(name: str, filename: str, ran: frozenset[int] = frozenset()) -> tuple[int, str] | None:
    """The last line of ``filename`` that assigns ``name`` a new value (``self.best = self.total``), of those that ran
    while traced when any did: where a name no line grows takes the graphs it holds."""
    pattern = re.compile(rf"(?<![\w.]){either_quote(name)}\s*=(?!=)")
    lines = enumerate((text.split("#", 1)[0] for text in linecache.getlines(filename)), 1)
    prose = _prose(filename)
    found = [(number, code.strip()) for number, code in lines if number not in prose and pattern.search(code)]
    found = [candidate for candidate in found if _reads_a_value(candidate[1])]  # not its start value (``Tracker()``)
    if any(number in ran for number, _ in found):
        found = [candidate for candidate in found if candidate[0] in ran]
    return found[-1] if found else None


def _reads_a_value(code: str) -> bool:
    """Whether the assignment ``code`` gives its target a value read from a name (``self.best = min(self.best,
    self.total)``), not one it makes (``self.best = torch.tensor(float("inf"))``)."""
    try:
        statement = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return False
    if not isinstance(statement, ast.Assign):
        return False
    called = {id(node.func) for node in ast.walk(statement.value) if isinstance(node, ast.Call)}
    modules = {id(node.value) for node in ast.walk(statement.value) if isinstance(node, ast.Attribute)}
    return any(
        isinstance(node, ast.Name) and id(node) not in called and id(node) not in modules
        for node in ast.walk(statement.value)
    ) or any(isinstance(node, ast.Attribute) and id(node) not in called for node in ast.walk(statement.value))


# (line number, its code, what it appends when that is a name or an attribute, the method that appends it)
Grows = tuple[int, str, str | None, str]


def growing_line(name: str, filename: str, ran: frozenset[int] = frozenset()) -> Grows | None:
    """The first of :func:`growing_lines`; None if no line grows ``name``."""
    found = growing_lines(name, filename, ran)
    return found[0] if found else None


def growing_lines(
    name: str, filename: str, ran: frozenset[int] = frozenset()
) -> list[tuple[int, str, str | None, str]]:
    """The lines of ``filename`` where ``name`` grows (``losses.append(loss)``, ``bank.appendleft(k)``,
    ``losses.append(outputs.loss)``, ``history += [loss]``, ``cache[key] = out``, ``total = total + loss``), with
    what it appends when that is a name or an attribute and the method that appends it; one that appends a number
    (``history.append(loss.item())``, a baseline before the loop) only if no other line grows it, one that appends no
    name (a fill before the loop: ``bank.appendleft(F.normalize(torch.randn(4, 4)))``) only if no line appends one;
    every line that appends a name (two appends a pass: ``recent.append(loss_a)``, ``recent.append(loss_b)``), else
    the first that grows it."""
    spelled = either_quote(name)
    keyed = re.fullmatch(r"(.+)\[(['\"])(\w+)\2\]", name)  # a dict's list, made at its first append
    if keyed is not None:  # ``self.log.setdefault("loss", []).append(v)`` grows ``self.log['loss']``
        made = rf"{either_quote(keyed.group(1))}\.setdefault\(\s*['\"]{keyed.group(3)}['\"]\s*,[^)]*\)"
        spelled = rf"(?:{spelled}|{made})"
    pattern = re.compile(
        rf"(?<![\w.]){spelled}\s*(\.(append|appendleft)\(([\w.]+(?:\[[\w'\"]+\])?)\)|\.append\(|\.appendleft\("
        rf"|\.extend\(|\[[^\]]*\]\s*=[^=]|\+=|=(?!=)[^#]*?(?:[-+*]\s*{spelled}(?![\w.(\[])"
        rf"|(?<![\w.]){spelled}\s*[-+*]))"
    )
    lines = enumerate((text.split("#", 1)[0] for text in linecache.getlines(filename)), 1)  # a comment quoting it: no
    prose = _prose(filename)  # nor a docstring
    found: list[Grows] = [
        (number, code.strip(), match.group(3), match.group(2) or "append")
        for number, code in lines
        if number not in prose and (match := pattern.search(code))
    ]
    if any(number in ran for number, _, _, _ in found):  # a branch that never ran is not where it grows
        found = [candidate for candidate in found if candidate[0] in ran]
    tensors = [f for f in found if not re.search(r"\.(item|tolist)\(\)|\bfloat\(", f[1])] or found[:1]
    named = [f for f in tensors if f[2]]  # a name appended (``bank.appendleft(k)``), not a fill before the loop
    if not named:  # an expression of names (``losses.append(loss / 4)``, ``log.append(out.mean())``)
        computed: list[Grows] = [
            (n, code, expression, how) for n, code, _, how in tensors if (expression := _computed(code))
        ]
        named = computed if len(computed) == 1 else []
    return named or tensors[:1]


def _computed(code: str) -> str | None:
    """The argument of the ``.append(...)`` or ``.appendleft(...)`` of the statement ``code`` when it computes from
    names with operators and calls nothing (``loss / 4`` and ``-out[0]``, given in brackets) or is a tensor method of
    a name called without arguments (``out.mean()``); None otherwise."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    appends = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("append", "appendleft")
        and len(node.args) == 1
        and not node.keywords
    ]
    if len(appends) != 1:
        return None
    argument = appends[0].args[0]
    names = any(isinstance(node, ast.Name) for node in ast.walk(argument))
    calls = [node for node in ast.walk(argument) if isinstance(node, ast.Call)]
    if isinstance(argument, (ast.BinOp, ast.UnaryOp)) and names and not calls:
        return f"({ast.unparse(argument)})"
    if not isinstance(argument, ast.Call) or argument.args or argument.keywords:
        return None
    method = isinstance(argument.func, ast.Attribute) and isinstance(argument.func.value, ast.Name)
    return ast.unparse(argument) if method else None


def added_to(code: str) -> tuple[str, str] | None:
    """(the total, the term) of the statement ``code`` when it is ``total += term`` with a term of names, attributes,
    items or method calls (``output.loss``, ``loss.sum()``); a term with operators in brackets; None otherwise."""
    try:
        statement = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(statement, ast.AugAssign) or not isinstance(statement.op, ast.Add):
        return None
    term = statement.value
    plain = isinstance(term, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    return ast.unparse(statement.target), ast.unparse(term) if plain else f"({ast.unparse(term)})"


def receiver(code: str, method: str) -> str | None:
    """What the statement ``code`` calls ``method`` on, as written: ``log.setdefault("loss", [])`` of
    ``log.setdefault("loss", []).append(loss)``, where the list's name ``log['loss']`` would raise a KeyError before
    the first append; None if ``code`` is no statement or calls no ``method``."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            return ast.get_source_segment(code, node.func.value)
    return None


def local_alias(name: str, filename: str, line: int) -> str | None:
    """The plain name a statement of the function of ``filename`` around ``line`` binds to what ``name`` ends in, when
    that name grows there: ``losses`` of ``model, opt, losses = state["model"], state["opt"], state["losses"]`` (or
    ``losses = st["losses"]``, the same list under a caller's name) for ``state['losses']``; else the parameter of a
    function the list is passed to that grows it; None if none does."""
    tail = re.search(r"(\.\w+|\[[^\]]*\])$", name)
    tree = parsed(filename)
    if tree is None:
        return None
    ending = tail.group(1).replace('"', "'") if tail is not None else None
    for node in ast.walk(function_around(tree, line)) if ending is not None else ():
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (
            zip(target.elts, value.elts)
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts)
            else [(target, value)]
        )
        for bound, read in pairs:
            if not isinstance(read, (ast.Subscript, ast.Attribute)) or not isinstance(bound, ast.Name):
                continue
            same = ending and ast.unparse(read).replace('"', "'").endswith(ending)
            if same and growing_line(bound.id, filename) is not None:  # somewhere: the line may lie in a helper
                return bound.id
            rest = _past(ast.unparse(read), name)  # ``stats = state["stats"]``: ``stats["fields"]``, as it grows
            grown = growing_line(bound.id + rest, filename) if rest else None
            if grown is not None:
                spelled = re.search(either_quote(bound.id + (rest or "")), grown[1])
                return spelled.group(0) if spelled is not None else bound.id + (rest or "")
    return _parameter_it_is_passed_as(name, filename, tree, function_around(tree, line))


def _past(read: str, name: str) -> str | None:
    """What ``name`` reads past what ``read`` does, when ``read``'s keys and attributes (its root aside) begin
    ``name``'s: ``['fields']`` of ``st['stats']['fields']`` past ``state["stats"]``; None otherwise."""
    steps = re.compile(r"\.\w+|\[[^\]]*\]")
    took, wanted = steps.findall(read.replace('"', "'")), steps.findall(name.replace('"', "'"))
    fits = 0 < len(took) < len(wanted) and wanted[: len(took)] == took
    return "".join(wanted[len(took) :]) if fits else None


def _parameter_it_is_passed_as(name: str, filename: str, tree: ast.Module, caller: ast.AST) -> str | None:
    """The parameter of a function of ``filename`` that grows what ``caller`` passes it as ``name`` (``self.recent``
    for ``trainer.recent`` too): ``store`` of ``def record(store, a, b): store.append(a)`` called
    ``record(recent, loss_a, loss_b)``; None if none does, or the function is called from elsewhere as well (a fix
    of its appends would change every list it grows: REINFORCE's log-probs beside the losses)."""
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    called = Counter(
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    )
    wanted = name.replace('"', "'")
    methods = {
        f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body if isinstance(f, ast.FunctionDef)
    }
    for call in (node for node in ast.walk(caller) if isinstance(node, ast.Call)):
        callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        function = functions.get(callee) if isinstance(callee, str) else None
        if function is None or called[callee] > 1:
            continue
        shift = 1 if isinstance(call.func, ast.Attribute) and function.name in methods else 0  # ``self``
        params = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]][shift:]
        passed = [(params[i] if i < len(params) else None, value) for i, value in enumerate(call.args)]
        passed += [(keyword.arg, keyword.value) for keyword in call.keywords]
        for param, value in passed:
            spelled = ast.unparse(value).replace('"', "'")
            mine = spelled.startswith("self.") and spelled[4:] == re.sub(r"^\w+", "", wanted)  # a method's own
            if param is None or (spelled != wanted and not mine):
                continue
            grows = growing_line(param, filename)
            if grows is not None and function.lineno <= grows[0] <= (function.end_lineno or function.lineno):
                return param
    return None


def _prose(filename: str) -> frozenset[int]:
    """The lines of ``filename`` that only a string statement spans (a docstring quoting ``losses.append(loss)``)."""
    tree = parsed(filename)
    if tree is None:
        return frozenset()
    strings = (
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    )
    return frozenset(line for node in strings for line in range(node.lineno, (node.end_lineno or node.lineno) + 1))


def beside(filename: str, line: int, other: int) -> bool:
    """Whether ``other`` runs with ``line`` each pass: in the body of the innermost loop of ``filename`` around
    ``line`` (:func:`.loops.innermost_loop_body`), or, with none, in the same function."""
    body = innermost_loop_body(filename, line)
    if body is not None:
        return body[0] <= other <= body[1]
    tree = parsed(filename)
    return tree is not None and function_around(tree, other) is function_around(tree, line)
