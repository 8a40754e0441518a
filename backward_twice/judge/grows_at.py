"""Where a note's name grows, as the learner's code spells it: the line that appends to it or adds to it
(:func:`growing_line`), the line that gives it another name's graphs (:func:`assigned_line`), and the local name a
function gives it before it grows it (:func:`local_alias`: ``losses`` of ``losses = state["losses"]``).

Used by :mod:`backward_twice.judge.notes` and :mod:`backward_twice.report.items`.
"""

from __future__ import annotations

import ast
import linecache
import re

from backward_twice.record.loops import innermost_loop_body
from backward_twice.record.sources import function_around, parsed

__all__ = ["Grows", "assigned_line", "beside", "either_quote", "growing_line", "growing_lines", "local_alias"]


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
    if not named:  # an expression of names without a call (``losses.append(loss / 4)``): it, in brackets
        computed: list[Grows] = [
            (n, code, f"({expression})", how) for n, code, _, how in tensors if (expression := _computed(code))
        ]
        named = computed if len(computed) == 1 else []
    return named or tensors[:1]


def _computed(code: str) -> str | None:
    """The argument of the one ``.append(...)`` or ``.appendleft(...)`` of the statement ``code`` when it computes from
    names with operators and calls nothing (``loss / 4``, ``-out[0]``); None otherwise."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if len(calls) != 1 or len(calls[0].args) != 1 or calls[0].keywords:
        return None
    called, argument = calls[0].func, calls[0].args[0]
    appends = isinstance(called, ast.Attribute) and called.attr in ("append", "appendleft")
    operators = isinstance(argument, (ast.BinOp, ast.UnaryOp))
    names = any(isinstance(node, ast.Name) for node in ast.walk(argument))
    return ast.unparse(argument) if appends and operators and names else None


def local_alias(name: str, filename: str, line: int) -> str | None:
    """The plain name a statement of the function of ``filename`` around ``line`` binds to what ``name`` ends in, when
    that name grows there: ``losses`` of ``model, opt, losses = state["model"], state["opt"], state["losses"]`` (or
    ``losses = st["losses"]``, the same list under a caller's name) for ``state['losses']``; None if none does."""
    tail = re.search(r"(\.\w+|\[[^\]]*\])$", name)
    tree = parsed(filename)
    if tail is None or tree is None:
        return None
    ending = tail.group(1).replace('"', "'")
    for node in ast.walk(function_around(tree, line)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (
            zip(target.elts, value.elts)
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts)
            else [(target, value)]
        )
        for bound, read in pairs:
            aliased = isinstance(read, (ast.Subscript, ast.Attribute)) and isinstance(bound, ast.Name)
            if aliased and ast.unparse(read).replace('"', "'").endswith(ending):
                assert isinstance(bound, ast.Name)
                if growing_line(bound.id, filename) is not None:  # somewhere: the line may lie in a helper
                    return bound.id
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
