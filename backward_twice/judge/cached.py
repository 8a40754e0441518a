"""A graph cached, so that every later pass walks the graph of the pass that computed it:

* on an object built once before the loop: ``pi = Bernoulli(p)`` computes ``pi.logits`` at its first
  ``pi.log_prob(...)`` and keeps it (torch.distributions' lazy attributes; pytorch/pytorch#11192). Neither computing
  the attribute again (the object gives back what it cached) nor detaching it (the loss may train through nothing
  else) is the fix: the object is built inside the loop;
* by a method of the learner's, under an ``if`` that skips it once its cache is set (``if self._cell_cache is None
  or not torch.allclose(cell, self._cell_cache): self._kvectors = ...``; lab-cosmo/torch-pme#62): detaching it keeps
  the pass's gradient from flowing through this pass's inputs (a fresh ``cell`` each pass); the fix computes it on
  every call.

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

import ast
import re

import torch

from backward_twice.record.learner import site_of
from backward_twice.record.loops import own_nodes
from backward_twice.record.sources import function_around, parsed

__all__ = ["cached_on_an_object_fix"]


def cached_on_an_object_fix(name: str | None, built_at: str) -> str | None:
    """For ``holder.attribute`` (``name``), first computed at ``built_at``: where no line of the file assigns that
    attribute, and ``holder`` is assigned once in the code around ``built_at``, outside any loop and before the loop
    that holds ``built_at``, by a call of a torch.distributions class (or of a function of the file that returns
    one), the fix that moves that assignment into the loop; where ``built_at`` assigns ``self.attribute`` under an
    ``if`` that skips it once a cache is set (:func:`_guarded_cache_fix`), the fix that computes it every call; None
    otherwise."""
    guarded = _guarded_cache_fix(name, built_at)
    if guarded is not None:
        return guarded
    site = site_of(built_at)
    holder, _, attribute = (name or "").partition(".")
    tree = parsed(site[0]) if site is not None and holder.isidentifier() and attribute.isidentifier() else None
    if tree is None or site is None or _assigned_anywhere(tree, attribute):
        return None
    scope = function_around(tree, site[1])
    loops = [n for n in own_nodes(scope) if isinstance(n, (ast.For, ast.While)) and _holds(n, site[1])]
    if not loops:
        return None
    loop = min(loops, key=lambda n: n.lineno)  # the outermost loop of that code around the use
    assignments = [
        n
        for n in own_nodes(scope)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == holder for t in n.targets)
    ]
    if len(assignments) != 1 or assignments[0].lineno >= loop.lineno:
        return None
    if not _a_distribution(assignments[0].value) and not _returns_a_distribution(tree, assignments[0].value):
        return None
    built = assignments[0].lineno
    if any(_holds(n, built) for n in own_nodes(scope) if isinstance(n, (ast.For, ast.While))):
        return None
    return (
        f"build `{holder}` inside the loop (move line {built} into it): `{holder}` computes `{name}` at its first use "
        f"and keeps it, so each pass walks the graph of the pass that first used it"
    )


def _a_distribution(value: ast.expr) -> bool:
    """Whether ``value`` calls a class of torch.distributions by its name (``Bernoulli(p)``, ``D.Normal(m, s)``)."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    kind = getattr(torch.distributions, called, None) if called in torch.distributions.__all__ else None
    return isinstance(kind, type) and issubclass(kind, torch.distributions.Distribution)


def _returns_a_distribution(tree: ast.Module, value: ast.expr) -> bool:
    """Whether ``value`` calls a function of the file (``make_pi(p)``) that returns a torch.distributions class's
    call."""
    called = value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else None
    functions = (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == called)
    returns = (n for function in functions for n in own_nodes(function) if isinstance(n, ast.Return))
    return any(n.value is not None and _a_distribution(n.value) for n in returns)


def _holds(loop: ast.For | ast.While, line: int) -> bool:
    return loop.lineno <= line <= (loop.end_lineno or loop.lineno)


def _assigned_anywhere(tree: ast.AST, attribute: str) -> bool:
    """Whether a statement of ``tree`` assigns an ``attribute`` of any object (the learner's, then: not a cache)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Attribute) and target.attr == attribute for target in targets):
            return True
    return False


def _guarded_cache_fix(name: str | None, built_at: str) -> str | None:
    """Where ``built_at`` assigns ``self.<the attribute name ends in>`` in the body of an ``if`` whose test reads an
    attribute of ``self`` that body assigns (the cache's key, or the attribute itself: ``if self._kvectors is None``),
    the fix that computes that line on every call; None otherwise."""
    site = site_of(built_at)
    attribute = re.search(r"\.(\w+)$", name or "")
    tree = parsed(site[0]) if site is not None and attribute is not None else None
    if tree is None or site is None or attribute is None:
        return None
    guards = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and any(_assigns_self(statement, attribute.group(1)) and statement.lineno == site[1] for statement in node.body)
    ]
    for guard in guards:
        read = {n.attr for n in ast.walk(guard.test) if isinstance(n, ast.Attribute) and _on_self(n)}
        assigned = {
            target.attr
            for statement in guard.body
            if isinstance(statement, ast.Assign)
            for target in statement.targets
            if isinstance(target, ast.Attribute) and _on_self(target)
        }
        keys = sorted(read & assigned)
        if keys:
            return (
                f"compute line {site[1]} on every call (the `if` at line {guard.lineno} skips it once "
                f"`self.{keys[0]}` is set): each later pass reuses the graph of the pass that computed it"
            )
    return None


def _assigns_self(statement: ast.stmt, attribute: str) -> bool:
    """Whether ``statement`` assigns ``self.<attribute>``."""
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    return any(isinstance(t, ast.Attribute) and t.attr == attribute and _on_self(t) for t in targets)


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"
