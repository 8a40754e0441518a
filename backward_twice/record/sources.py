"""The learner's source files, read and parsed once: every tool that reads their code with ``ast`` asks here.

:func:`parsed` gives a file's parsed module (None when it cannot be read or parsed), cached on the very list of lines
``linecache`` holds: when linecache reads the file again (an edited script, a notebook cell run anew under the same
name), the list is a new one and the file is parsed again. :func:`refresh` asks linecache to look at the files on
disk again (a recorder does so when it starts). :func:`memo` keeps what a caller computed from a tree, for as long
as that tree is the file's. :func:`function_around` finds the function a line belongs to.

Used by :mod:`backward_twice.judge.built`, :mod:`backward_twice.judge.cached`, :mod:`backward_twice.judge.carried`,
:mod:`backward_twice.judge.closures`, :mod:`backward_twice.judge.errors_fix`, :mod:`backward_twice.judge.fixes`,
:mod:`backward_twice.judge.frozen`, :mod:`backward_twice.judge.gan_retain`, :mod:`backward_twice.judge.grows_at`,
:mod:`backward_twice.judge.hooks`, :mod:`backward_twice.judge.kept_by`, :mod:`backward_twice.judge.notes`,
:mod:`backward_twice.judge.returned`, :mod:`backward_twice.judge.second_backward`, :mod:`backward_twice.judge.stored`,
:mod:`backward_twice.judge.trained_through`, :mod:`backward_twice.judge.uses`, :mod:`backward_twice.judge.verdicts`,
:mod:`backward_twice.record.evidence`, :mod:`backward_twice.record.hand_update`, :mod:`backward_twice.record.in_place`,
:mod:`backward_twice.record.loops`, :mod:`backward_twice.record.past_handlers` and
:mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import ast
import linecache
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["function_around", "memo", "parsed", "refresh"]

_MAX_FILES = 64
_T = TypeVar("_T")
# filename -> (the lines object it was parsed from, the tree, what callers computed from it)
_parsed: OrderedDict[str, tuple[list[str], ast.Module | None, dict[Hashable, Any]]] = OrderedDict()


_checked: dict[str, int] = {}  # filename -> the generation linecache last looked at it in
_generation = [0]


def _entry(filename: str) -> tuple[list[str], ast.Module | None, dict[Hashable, Any]]:
    if _checked.get(filename) != _generation[0]:
        linecache.checkcache(filename)  # one stat of the file, once per recorder
        _checked[filename] = _generation[0]
    lines = linecache.getlines(filename)
    entry = _parsed.get(filename)
    if entry is None or entry[0] is not lines:
        # a cell that starts with a cell magic (``%%diagnose model optimizer``): its body is the Python
        text = ["#\n", *lines[1:]] if lines and lines[0].startswith("%%") else lines
        try:
            parsed: ast.Module | None = ast.parse("".join(text)) if text else None
        except (SyntaxError, ValueError):
            parsed = None
        entry = _parsed[filename] = (lines, parsed, {})
        if len(_parsed) > _MAX_FILES:
            _parsed.popitem(last=False)
    _parsed.move_to_end(filename)
    return entry


def parsed(filename: str) -> ast.Module | None:
    """The parsed module of ``filename`` (its lines as linecache holds them; a notebook cell's first line, when it
    is a cell magic, left out), or None."""
    return _entry(filename)[1]


def memo(filename: str, key: Hashable, compute: Callable[[], _T]) -> _T:
    """``compute()``, kept under ``key`` for as long as ``filename`` is unchanged."""
    results = _entry(filename)[2]
    if key not in results:
        results[key] = compute()
    result: _T = results[key]
    return result


def refresh() -> None:
    """Let linecache look at each file on disk again when it is next asked for (a script edited since)."""
    _generation[0] += 1


def class_around(site: tuple[str, int]) -> ast.ClassDef | None:
    """The innermost class of the file ``site[0]`` whose body holds the line ``site[1]``."""
    tree = parsed(site[0])
    classes = [
        node
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, ast.ClassDef) and node.lineno <= site[1] <= (node.end_lineno or 0)
    ]
    return max(classes, key=lambda node: node.lineno, default=None)


def function_around(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function of ``tree`` whose body holds ``line`` (its ``def`` line and defaults run in the scope
    around it); the module itself outside any."""
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body[0].lineno <= line <= (node.end_lineno or 0)
    ]
    return max(functions, key=lambda node: node.lineno, default=tree)
