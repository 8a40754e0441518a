"""Where the learner's code keeps a carried graph on an object for the next step, when no loop of theirs runs the
iterations (a framework's ``fit`` or ``train`` does): :func:`stored_at` finds the one statement of theirs that ran and
assigns the attribute (``self.previous_hidden = hidden`` in a Lightning ``training_step``), and :func:`as_stored`
spells the carrier as that statement does, with the line a detach goes after. :func:`as_the_line_names_it` spells a
carrier found only through a framework's private attributes as the learner's line that built it does (``self.h``).
:func:`before_inner_loop` places a detach before the loop over time steps of a function the iteration's loop calls.

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from backward_twice.judge.built import bound_names, spelled
from backward_twice.record.loops import outermost_loop_around
from backward_twice.record.sources import function_around, parsed

if TYPE_CHECKING:
    from backward_twice.record.passes import Link

__all__ = ["as_stored", "as_the_line_names_it", "before_inner_loop", "stored_at"]


def stored_at(
    attribute: str, ran: Collection[tuple[str, int]], built: tuple[str, int] | None = None
) -> tuple[str, int, str] | None:
    """(file, line, target as spelled) of the one statement in the learner's files that assigns ``attribute`` on
    an object (``self.previous_hidden = hidden``, ``self.h += ...``) among the lines that ``ran``, a constant
    (``self.previous_hidden = None``) left out, and a constructor's start value too when another statement stores it
    (``self.h = torch.zeros(...)`` in ``__init__``, ``self.h = self.cell(x, self.h)`` in the step); None when no such
    statement ran, or several did (the name is then not placed by one line), unless one of them comes first after
    the line that ``built`` the tensor, in its function (``self.h = h`` after ``h = self.cell(x, self.h)``, where
    ``self.h = torch.zeros(...)`` under an ``if self.h is None:`` ran once too). When none of them ran while the lines
    were followed (an epoch's end hook runs after the first steps, when the tracer is off), the one such statement
    of those files that lies outside an ``__init__``, ran or not."""
    lines: dict[str, set[int]] = {}
    for filename, line in ran:
        lines.setdefault(filename, set()).add(line)
    return _stored_at(attribute, lines, built=built) or _stored_at(attribute, dict.fromkeys(lines), outside_init=True)


def _stored_at(
    attribute: str,
    lines: Mapping[str, set[int] | None],
    outside_init: bool = False,
    built: tuple[str, int] | None = None,
) -> tuple[str, int, str] | None:
    """:func:`stored_at` over the lines that ran in each file (None: every line)."""
    found: dict[tuple[str, int, str], bool] = {}  # -> whether it lies in an __init__
    for filename, numbers in lines.items():
        tree = parsed(filename)
        inits = [
            (node.lineno, node.end_lineno or node.lineno)
            for node in (ast.walk(tree) if tree is not None else ())
            if isinstance(node, ast.FunctionDef) and node.name == "__init__"
        ]
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign):
                targets = bound_names(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets = [node.target]
            else:
                continue
            if isinstance(node.value, ast.Constant):
                continue
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            ran_here = numbers is None or any(line in numbers for line in span)
            for target in targets if ran_here else ():
                spelling = spelled(target)
                if isinstance(target, ast.Attribute) and target.attr == attribute and spelling is not None:
                    in_init = any(first <= node.lineno <= last for first, last in inits)
                    if not (in_init and outside_init):
                        found[(filename, node.lineno, spelling)] = in_init
    if len(found) > 1:
        found = {where: in_init for where, in_init in found.items() if not in_init}
    if len(found) > 1 and built is not None:
        tree = parsed(built[0])
        around = function_around(tree, built[1]) if tree is not None else None
        last = getattr(around, "end_lineno", None) or 0
        after = sorted(where for where in found if where[0] == built[0] and built[1] <= where[1] <= last)
        found = dict.fromkeys(after[:1], False)
    return next(iter(found)) if len(found) == 1 else None


def as_stored(
    name: str, ran: Collection[tuple[str, int]], built: tuple[str, int] | None = None
) -> tuple[str, tuple[str, int] | None, tuple[str, int] | None] | None:
    """A carrier found on an object (``state['model'].previous_hidden[0]``, through the names a framework's caller
    holds) as the one statement that ran and stored it spells it (``self.previous_hidden[0]``), with that statement's
    (file, line) and the (file, line) a detach goes after so that it cuts only what the next step reads: the same,
    or when the function reads the attribute again (a later line's loss needs it whole), the end of the statement of
    its body that reads it last (both None: that statement returns). None without an attribute in the name or such a
    single statement."""
    attribute = re.search(r"\.(\w+)((?:\[[^\]]*\])*)$", name)
    stored = stored_at(attribute.group(1), ran, built) if attribute is not None else None
    if attribute is None or stored is None:
        return None
    filename, line, spelling = stored
    tree = parsed(filename)
    function = function_around(tree, line) if tree is not None else None
    if tree is None or not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return spelling + attribute.group(2), None, None
    reads = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and node.attr == attribute.group(1)
        and node.lineno > line
    ]
    if not reads:
        return spelling + attribute.group(2), (filename, line), (filename, line)
    # read again after it is stored (``loss = loss + 0.01 * self.aux_total``): after the statement of the function's
    # body that reads it last, unless that statement returns (a ``return`` has no line after it)
    last = next((s for s in function.body if s.lineno <= max(reads) <= (s.end_lineno or s.lineno)), None)
    if last is None or isinstance(last, ast.Return) or any(isinstance(n, ast.Return) for n in ast.walk(last)):
        return spelling + attribute.group(2), None, None
    return spelling + attribute.group(2), (filename, line), (filename, last.end_lineno or last.lineno)


def as_the_line_names_it(name: str | None, built_at: str) -> str | None:
    """A name found only through a framework's private attributes (``trainer._accelerator_connector.strategy._model.h``
    under PyTorch Lightning), as the learner's own line that built it names it (``self.h``, when that line is
    ``self.h = self.rnn(x, self.h)``): the attribute the line assigns on ``self`` is the one the name ends in."""
    path = re.sub(r"(\.\w+)((?:\[[^\]]*\])*)$", "", name) if name is not None else ""  # a private attribute of its
    if name is None or not any(part.startswith("_") for part in re.split(r"[.\[]", path)):  # own is the learner's
        return name
    code = built_at.split(": ", 1)[-1]
    targets = re.split(r"(?<![=!<>])(?:\+|-|\*|/)?=(?!=)", code, maxsplit=1)
    attribute = re.search(r"\.(\w+)((?:\[[^\]]*\])*)$", name)
    if len(targets) < 2 or attribute is None or attribute.group(1) not in re.findall(r"\bself\.(\w+)", targets[0]):
        return name
    return f"self.{attribute.group(1)}{attribute.group(2)}"


def before_inner_loop(fix: str, entry: tuple[str, int] | None, loop: Link | None) -> str:
    """``fix`` placed before the loop that holds ``entry`` (where the old graph comes in) in a function the
    iteration's ``loop`` calls: ``hidden`` read in ``train()``'s loop over characters is detached before that loop,
    once a call (at the end of each iteration the name may not be in reach; at ``entry`` it would cut each sequence
    too)."""
    header = outermost_loop_around(*entry, loop.code) if entry is not None and loop is not None else None
    return fix if header is None else fix.replace(" at the end of each iteration", f" before line {header}")
