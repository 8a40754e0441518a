"""The loop's call that feeds an object of the learner's a tensor by one of its methods: a meter's
``losses.update(loss, images.size(0))``, a logger's ``logger.log("train/loss", loss)``; the line to change when the
object keeps each iteration's graph.

Used by :mod:`backward_twice.judge.notes` and :mod:`backward_twice.report.items`.
"""

from __future__ import annotations

import ast
import linecache
import re

__all__ = ["fed_line"]


def fed_line(name: str, filename: str, ran: frozenset[int] = frozenset()) -> tuple[int, str, str] | None:
    """The line of ``filename`` that feeds the object ``name`` a value by one of its methods (its first argument that
    is no literal, a name: ``loss`` of ``losses.update(loss, images.size(0))`` or ``logger.log("train/loss", loss)``),
    with that call written to feed it a number (``losses.update(loss.item(), images.size(0))``)."""
    called = re.compile(rf"(?<![\w.]){re.escape(name)}\.\w+\(")
    for number, text in enumerate((line.split("#", 1)[0].rstrip() for line in linecache.getlines(filename)), 1):
        if called.search(text) is None or (ran and number not in ran):
            continue
        fed = _fed_argument(text, name)
        if fed is not None:
            start, end = fed
            return number, text.strip(), (text[:start] + f"{text[start:end]}.item()" + text[end:]).strip()
    return None


def _fed_argument(text: str, name: str) -> tuple[int, int] | None:
    """Where, in the line ``text``, the value a call of ``name``'s method is fed lies: its first argument that is no
    literal, when that one is a name, an attribute or an item (``loss``, ``out.loss``, ``losses[-1]``)."""
    indent = len(text) - len(text.lstrip())
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:  # a statement spread over several lines
        return None
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if not (isinstance(func, ast.Attribute) and ast.unparse(func.value) == name):  # ``self.logger`` too
            continue
        assert isinstance(node, ast.Call)
        fed = next((arg for arg in node.args if not isinstance(arg, ast.Constant)), None)
        if isinstance(fed, (ast.Name, ast.Attribute, ast.Subscript)) and fed.end_col_offset is not None:
            return indent + fed.col_offset, indent + fed.end_col_offset
        return None
    return None
