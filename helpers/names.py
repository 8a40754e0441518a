"""Which of the learner's names hold a tensor with a graph: the name a verdict uses for a node.

:func:`names_holding_graphs` looks in the learner's frames from one outward (a frame whose file lies outside
torch, ``helpers/``, the standard library and site-packages: its locals, then its globals) and in extra roots (a
step's closure and globals), one and two levels in: items of lists, tuples and dicts, a module's tensor
attributes and buffers, an object's tensor attributes. Each node gets its simplest spelling (``h`` before
``state['h']``). A function frame's ``f_locals`` is a snapshot that would keep every tensor in it alive after the
learner deletes or rebinds the name: it is emptied after reading (the frame's own variables are untouched).

Used by :mod:`helpers.recorder`.
"""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NamedGraph", "names_holding_graphs", "site_of"]


@dataclass(frozen=True)
class NamedGraph:
    """A name that held a tensor with a graph at an event: the name as the learner spells it (``h``,
    ``state[0]``, ``model.memory``, ``buffers["h"]``), the learner's frame it was found in ((file, first line
    of the code, the code's name), None for a name the harness gave), whether it is a global, the event's
    index and the node's sequence number."""

    name: str
    frame: tuple[str, int, str] | None
    is_global: bool
    event: int
    sequence: int


_own_files: dict[str, bool] = {}


def site_of(frame: types.FrameType | None, skipped: tuple[str, ...], outward: bool = True) -> tuple[str, int]:
    """(file, line) of the first of the learner's frames from ``frame`` out (only ``frame`` if not ``outward``)."""
    while frame is not None:
        name = frame.f_code.co_filename
        own = _own_files.get(name)
        if own is None:
            own = _own_files[name] = ((not name.startswith("<") or name.startswith("<ipython"))
                                      and not os.path.realpath(name).startswith(skipped))
        if own:
            return name, frame.f_lineno
        if not outward:
            break
        frame = frame.f_back
    return "", 0


def names_holding_graphs(frame: types.FrameType | None, skipped: tuple[str, ...], event: int,
                         roots: Callable[[], list[tuple[str, Any]]] | None = None
                         ) -> Iterator[tuple[NamedGraph, Any]]:
    """(name, node) for each node a name holds: the learner's frames from ``frame`` out, then ``roots()``."""
    sources: list[tuple[tuple[str, int, str] | None, bool, dict[str, Any], bool]] = []
    globals_seen: set[int] = set()
    while frame is not None:
        code = frame.f_code
        if site_of(frame, skipped, outward=False)[0]:
            where = (code.co_filename, code.co_firstlineno, code.co_name)
            optimized = bool(code.co_flags & inspect.CO_OPTIMIZED)
            if optimized or frame.f_locals is not frame.f_globals:  # exec with its own namespace: the real one
                sources.append((where, False, frame.f_locals, optimized))
            if id(frame.f_globals) not in globals_seen:
                globals_seen.add(id(frame.f_globals))
                sources.append((where, True, frame.f_globals, False))
        frame = frame.f_back
    if roots is not None:
        sources.append((None, False, dict(roots()), False))
    seen: set[int] = set()
    for where, is_global, namespace, snapshot in sources:
        items = list(namespace.items())
        if snapshot:
            namespace.clear()
        best: dict[int, tuple[str, Any]] = {}
        for name, value in items:
            if name.startswith("__") or isinstance(value, (types.ModuleType, type, types.FunctionType)):
                continue
            for spelled, tensor in _tensors_under(name, value):
                node = tensor.grad_fn
                if node is None:
                    continue
                sequence = node._sequence_nr()
                if sequence in seen:
                    continue
                known = best.get(sequence)
                if known is None or _simpler(spelled, known[0]):
                    best[sequence] = (spelled, node)
        for sequence, (spelled, node) in best.items():
            seen.add(sequence)
            yield NamedGraph(spelled, where, is_global, event, sequence), node


def _simpler(a: str, b: str) -> bool:
    return (a.count("["), a.count("."), len(a)) < (b.count("["), b.count("."), len(b))


def _tensors_under(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(spelling, tensor) for a tensor, the items of a list, tuple or dict, a module's tensor attributes and an
    object's, two levels deep: ``h``, ``state[0]``, ``buffers['h']``, ``model.memory``."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif depth >= 2:
        return
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:64]):
            yield from _tensors_under(f"{name}[{i}]", item, depth + 1)
    elif isinstance(value, dict):
        for key, item in list(value.items())[:64]:
            if isinstance(key, (str, int)):
                yield from _tensors_under(f"{name}[{key!r}]", item, depth + 1)
    elif isinstance(value, torch.nn.Module):
        for prefix, module in value.named_modules(prefix=name):
            for key, item in vars(module).items():
                if isinstance(item, torch.Tensor) and not isinstance(item, torch.nn.Parameter):
                    yield f"{prefix}.{key}", item
            for key, item in module._buffers.items():
                if item is not None:
                    yield f"{prefix}.{key}", item
    elif hasattr(value, "__dict__") and not callable(value) and not isinstance(value, torch.optim.Optimizer):
        for key, item in list(vars(value).items())[:64]:
            if isinstance(item, torch.Tensor):
                yield f"{name}.{key}", item
