"""A learner's step as the tools take it: the names it holds, and the input refused before any work is done.

* :func:`known_names`, :func:`name_bindings` and :func:`held_bindings` are the only code that reads a step's
  closure and globals: the names it knows objects by, and a way to bind each name to its object again;
  :func:`code_reached` is the code a step runs as written (nested functions, a factory's arguments), and
  :func:`global_namespace` the dict its globals live in;
* :func:`check_step` and :func:`as_items` refuse bad input with a message naming the tool and what is wrong: a
  step that needs arguments, models that are not modules, optimizers that are not optimizers.

Used by :mod:`backward_twice.record.learner`, :mod:`backward_twice.steps.harness`, :mod:`backward_twice.steps.snapshot`,
:mod:`helpers.measure`,
:mod:`helpers.lessons.carried_state.checks`, :mod:`helpers.lessons.carried_state.loop_watch` and
:mod:`helpers.lessons.your_training_step`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "NameBinding",
    "as_items",
    "check_step",
    "code_reached",
    "global_namespace",
    "held_bindings",
    "hook_owners",
    "known_names",
    "name_bindings",
]

_CALLEES_READ = 16  # functions of the step's module whose globals are read, the step's own included


@dataclass(frozen=True)
class NameBinding:
    """A name a step holds (a variable of its closure, or a global it reads): ``read()`` gives what the name holds
    now, ``put(value)`` binds the name to that very object again, and ``value`` is what it held when read."""

    read: Callable[[], Any]
    put: Callable[[Any], None]
    value: Any


def _cell_binding(cell: types.CellType, value: Any) -> NameBinding:
    def put(new: Any) -> None:
        cell.cell_contents = new

    return NameBinding(lambda: cell.cell_contents, put, value)


def _global_binding(namespace: dict[str, Any], name: str, value: Any) -> NameBinding:
    return NameBinding(lambda: namespace.get(name), functools.partial(namespace.__setitem__, name), value)


def _code_or_kind(value: Any) -> bool:
    """A function, method, class or module: not state the runs may change (an object with ``__call__`` may be)."""
    return inspect.isroutine(value) or isinstance(value, (type, types.ModuleType, functools.partial))


def name_bindings(step: Callable[[], Any]) -> list[NameBinding]:
    """A :class:`NameBinding` for each name the step holds in its closure and each global it reads (not functions,
    classes or modules)."""
    bindings: list[NameBinding] = []
    code = getattr(step, "__code__", None)
    for _, cell in zip(code.co_freevars if code is not None else (), getattr(step, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        bindings.append(_cell_binding(cell, value))
    namespace = getattr(step, "__globals__", {})
    closure = set(code.co_freevars) if code is not None else set()
    for name, value in known_names(step).items():
        if name not in closure and namespace.get(name) is value and not _code_or_kind(value):
            bindings.append(_global_binding(namespace, name, value))
    return bindings


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def hook_owners(step: Callable[[], Any], models: Iterable[torch.nn.Module]) -> list[tuple[str, Any]]:
    """(name, object) for what the hooks on ``models`` write to that the step never names: the object of a bound
    method registered as a hook (grad-cam's ``ActivationsAndGradients``, a ``SaveFeatures``), a list a hook function
    appends to (``acts.append(o)``), each by the global name the learner gave it (else its class's name)."""
    namespace = getattr(step, "__globals__", None) or {}
    names = {id(value): name for name, value in namespace.items() if not name.startswith("__")}
    found: dict[int, tuple[str, Any]] = {}
    for model in models:
        for module in model.modules():
            for hooks in (getattr(module, key, None) or {} for key in _HOOKS):
                for hook in list(hooks.values()):
                    owner = getattr(hook, "__self__", None)
                    if owner is not None and not isinstance(owner, (torch.nn.Module, types.ModuleType)):
                        found.setdefault(id(owner), (names.get(id(owner), type(owner).__name__), owner))
                    hook_globals = getattr(hook, "__globals__", None) or {}
                    for read in getattr(getattr(hook, "__code__", None), "co_names", ()):
                        value = hook_globals.get(read)
                        if isinstance(value, (list, dict)):
                            found.setdefault(id(value), (read, value))
    return list(found.values())


def held_bindings(step: Callable[[], Any]) -> list[tuple[Callable[[Any], None], Any]]:
    """(put it back, value) for each of :func:`name_bindings`: calling ``put(value)`` binds the name to that very
    object again."""
    return [(binding.put, binding.value) for binding in name_bindings(step)]


def code_reached(function: Callable[..., Any]) -> list[types.CodeType]:
    """The code of ``function``, of the functions nested in it, and, through its closure, of the functions it was
    made with (a factory's arguments, a wrapper's target)."""
    functions, seen, codes = [function], set(), []
    while functions:
        current = functions.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for cell in getattr(current, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                if isinstance(cell.cell_contents, types.FunctionType):
                    functions.append(cell.cell_contents)
        stack = [getattr(current, "__code__", None)]
        while stack:
            code = stack.pop()
            if isinstance(code, types.CodeType):
                codes.append(code)
                stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return codes


def known_names(step: Callable[[], Any]) -> dict[str, Any]:
    """The names the step knows objects by: a method's ``self``, its closure's variables, the globals it reads, and
    those the functions of its module it names read (a few levels down)."""
    code = getattr(step, "__code__", None)
    if code is None:
        return {}
    known: dict[str, Any] = {code.co_varnames[0]: step.__self__} if inspect.ismethod(step) and code.co_argcount else {}
    for name, cell in zip(code.co_freevars, getattr(step, "__closure__", None) or ()):
        try:
            known[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    namespace = step.__globals__
    codes, seen = [code], {id(code)}
    while codes and len(seen) <= _CALLEES_READ:
        current = codes.pop(0)
        for name in (n for c in (current, *(c for c in current.co_consts if inspect.iscode(c))) for n in c.co_names):
            if name not in namespace or name in known:
                continue
            value = known[name] = namespace[name]
            # a function of the same module the step calls (``lambda: step(batch)``): the globals it reads are the
            # step's too (Deep SVDD's centre ``c``), as that module spells them
            callee = getattr(value, "__code__", None) if inspect.isfunction(value) else None
            if callee is not None and value.__globals__ is namespace and id(callee) not in seen:
                seen.add(id(callee))
                codes.append(callee)
    return known


def global_namespace(function: Callable[..., Any]) -> dict[str, Any] | None:
    """The dict a function's globals live in (its module's, a notebook's), or None for what has none (a builtin)."""
    namespace = getattr(function, "__globals__", None)
    return namespace if isinstance(namespace, dict) else None


def check_step(step: object, who: str = "audit_retain_graph") -> None:
    """Refuse anything but a function of no arguments (``who`` names the tool in the message)."""
    if not callable(step):
        raise TypeError(
            f"{who} takes a step: a function of no arguments that runs one training "
            f"iteration; got {type(step).__name__}"
        )
    try:
        parameters = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let the run tell
        return
    needs = [p for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needs:
        name = getattr(step, "__name__", "step")
        name = "step" if name.startswith("<") else name
        call = ", ".join(f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name for p in needs)
        raise TypeError(
            f"{who} takes a step with no arguments; yours needs "
            f"({', '.join(p.name for p in needs)}): wrap it, e.g. lambda: {name}({call})"
        )


def as_items(value: object, kind: type, what: str, label: str, who: str = "audit_retain_graph") -> tuple[Any, ...]:
    """One ``kind``, an iterable of them or a dict whose values they are, as a tuple; anything else refused,
    naming ``what`` and ``who``."""
    single = not isinstance(value, Iterable) or isinstance(value, (torch.nn.Module, torch.Tensor, str, bytes))
    items = (value,) if single else tuple(value.values() if isinstance(value, Mapping) else value)  # type: ignore
    wrong = [item for item in items if not isinstance(item, kind)]
    if wrong:
        raise TypeError(f"{who}: {what} must be a {label} or a list of them; got {type(wrong[0]).__name__}")
    return items
