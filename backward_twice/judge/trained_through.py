"""A graph carried by the only way a loss trains anything: a detach there would leave the loss nothing to train
(REINFORCE's log-probs of an episode, kept in a list and sampled again for a second update, pytorch/examples#151:
``-log_prob.detach() * R`` has no gradient, and its backward raises). The fix computes the carried values again in
the iteration that walks them, from inputs the learner keeps.

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.fixes` and
:mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import ast
import re

from backward_twice.record.learner import lines_of_file, site_of
from backward_twice.record.sources import function_around, parsed

__all__ = [
    "another_pass_fix",
    "appended_to",
    "built_each_pass_fix",
    "computed_again_fix",
    "read_for_another_pass",
    "without_a_detach",
]


def appended_to(whole: str, built_at: str) -> tuple[str, int] | None:
    """What the line ``built_at`` (else the first line of its file that does) appends to the list ``whole``, with that
    line's number: the ``m.log_prob(action)`` of ``policy.saved_log_probs.append(m.log_prob(action))``."""
    grown = re.compile(rf"(?<![\w.]){re.escape(whole)}\.append\((.+)\)\s*$")
    site = site_of(built_at)
    appended = grown.search(built_at.split(": ", 1)[-1])
    if appended is not None:
        return appended.group(1), site[1] if site is not None else 0
    found = ((n, grown.search(text)) for n, text in enumerate(lines_of_file(built_at), 1))
    return next(((match.group(1), n) for n, match in found if match is not None), None)


def read_for_another_pass(whole: str, built_at: str) -> tuple[int, str, str] | None:
    """Where a loop after ``built_at``, over the items of the list ``whole``, reads in each pass another pass's item
    beside its own: ``outputs[j]`` beside ``outputs[i]`` in ``for i in range(model_num): ... F.softmax(outputs[j])``
    (mutual learning over a list of models, chxy95/Deep-Mutual-Learning#5): (its line, ``outputs[j]``,
    ``outputs[i]``); None if no loop there does."""
    site = site_of(built_at)
    tree = parsed(site[0]) if site is not None else None
    if site is None or tree is None:
        return None
    for loop in ast.walk(function_around(tree, site[1])):
        if not isinstance(loop, ast.For) or loop.lineno <= site[1] or not isinstance(loop.target, ast.Name):
            continue
        reads = [
            node
            for statement in loop.body
            for node in ast.walk(statement)
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == whole
        ]
        own = [read for read in reads if ast.unparse(read.slice) == loop.target.id]
        others = [read for read in reads if ast.unparse(read.slice) != loop.target.id]
        if own and others:
            return others[0].lineno, ast.unparse(others[0]), ast.unparse(own[0])
    return None


def _another_pass_detached(line: int, read: str, own: str) -> str:
    return (
        f"use `{read}.detach()` at line {line}: each pass's loss trains through `{own}`, and `{read}` is another pass's"
    )


def another_pass_fix(name: str | None, built_at: str) -> str | None:
    """The fix where ``name`` is an item of a list or dict built before the loop whose passes each read another
    pass's item beside their own (:func:`read_for_another_pass`: ``outputs[j]``, ``outputs[other]``); else None."""
    item = re.match(r"^(.*)\[[^\]]*\]$", name or "")
    other = read_for_another_pass(item.group(1), built_at) if item else _taken_beside_others(name, built_at)
    return _another_pass_detached(*other) if other else None


def _taken_beside_others(name: str | None, built_at: str) -> tuple[int, str, str] | None:
    """Where a loop after ``built_at`` takes ``name`` from what it iterates (``for i, (opt, out) in
    enumerate(zip(optimizers, outputs))``) and a loop inside it iterates that again, reading each other item
    (``for j, other in enumerate(outputs): ... F.softmax(other)``): (that read's line, ``other``, ``name``)."""
    site = site_of(built_at)
    tree = parsed(site[0]) if site is not None and name and name.isidentifier() else None
    if site is None or tree is None:
        return None
    for loop in ast.walk(function_around(tree, site[1])):
        if not isinstance(loop, ast.For) or loop.lineno <= site[1]:
            continue
        if name not in {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}:
            continue
        iterated = {n.id for n in ast.walk(loop.iter) if isinstance(n, ast.Name)}
        for inner in ast.walk(loop):
            if inner is loop or not isinstance(inner, ast.For):
                continue
            if not iterated & {n.id for n in ast.walk(inner.iter) if isinstance(n, ast.Name)}:
                continue
            bound = {n.id for n in ast.walk(inner.target) if isinstance(n, ast.Name)}
            reads = [
                argument
                for call in ast.walk(inner)
                if isinstance(call, ast.Call)
                for argument in call.args
                if isinstance(argument, ast.Name) and argument.id in bound
            ]
            if reads:
                return reads[0].lineno, reads[0].id, name
    return None


def built_each_pass_fix(whole: str, container: str | None, built_at: str) -> str:
    """The fix where the items of ``whole``, built before the loop, went stale when a step changed the weights their
    graphs saved (an episode's log-probs, then an update per item): each pass's item built inside the loop; where
    each pass reads another pass's item beside its own (:func:`read_for_another_pass`), that item detached."""
    other = read_for_another_pass(whole, built_at) if container == "list" else None
    if other is not None:
        return _another_pass_detached(*other)
    item = f"the `{whole}` item each pass reads" if container == "list" else f"`{whole}`"  # or the loop's ``for``
    return f"build {item} inside the loop: each backward walks a graph of its own"  # takes it


def computed_again_fix(name: str, container: str | None, built_at: str) -> str:
    """The fix where the loss trains only through ``name``'s graph of an earlier pass: compute it again where it is
    walked, not a detached copy."""
    site = site_of(built_at)
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    if item and container == "list":
        whole = item.group(1)
        other = read_for_another_pass(whole, built_at)
        if other is not None:  # its own item trains; another pass's, read as a target, that pass's backward frees
            return _another_pass_detached(*other)
        appended = appended_to(whole, built_at)
        what = f"`{appended[0]}` (line {appended[1]})" if appended else f"the items of `{whole}`"
        return (
            f"compute {what} again in the iteration that walks it, from inputs you keep: the loss trains through "
            f"nothing else, so detached copies in `{whole}` would train nothing"
        )
    line = site[1] if site is not None else "?"
    return (
        f"compute `{name}` (line {line}) again in each iteration that walks it: the loss trains through nothing "
        f"else, so `{name}.detach()` would train nothing"
    )


def without_a_detach(fix: str, name: str, container: str | None, built_at: str, built_before: bool) -> str:
    """``fix`` for a carrier the loss trains only through, without a detach: an alternative detach it offers (``(or
    `x.detach()`, if it needs no gradient)``: it needs one) dropped, and a fix that detaches (``keep detached copies``,
    ``add `x = x.detach()```) replaced by :func:`computed_again_fix`; one that computes it afresh is right as it is.
    ``built_before``: a graph built before the loop (not a list), whose fix computes it inside the loop already."""
    alternative = fix.find(" (or `")
    if alternative > 0 and ".detach()" in fix[alternative:] and fix.endswith(")"):
        return fix[:alternative]
    if not fix.startswith(("keep detached copies", "add `")) or ".detach()" not in fix:
        return fix
    if container != "list" and built_before:
        return fix
    return computed_again_fix(name, container, built_at)
