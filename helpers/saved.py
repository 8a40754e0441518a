"""What an autograd node saved for its backward, read without unpacking, and the bytes only the graph holds.

* :func:`saved_data`: the tensors behind a node's ``_raw_saved_*`` attributes (``.data`` of each
  ``SavedTensor``: no unpack, so nothing trips or switches off PyTorch's version check), or None once freed;
* :func:`graph_only_bytes`: the storages those tensors hold, each once, counted only when the graph alone holds
  them, as the course's saved-tensor meter counts (a parameter, or an input or activation a Python name still
  holds, is alive anyway); a saved 0-dim scalar counts too;
* :func:`python_walk`: every node a graph reaches from some roots, over ``next_functions``.

Used by :mod:`helpers.recorder`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["graph_only_bytes", "has_saved_data", "python_walk", "saved_data"]

_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
_saved_attributes: dict[type, tuple[str, ...]] = {}


def saved_data(node: Any) -> list[torch.Tensor] | None:
    """The tensors ``node`` holds for its backward (read without unpacking), or None once they are freed."""
    kind = type(node)
    names = _saved_attributes.get(kind)
    if names is None:
        names = _saved_attributes[kind] = tuple(n for n in dir(kind) if n.startswith("_raw_saved_"))
    tensors: list[torch.Tensor] = []
    for name in names:
        try:
            raw = getattr(node, name)
        except RuntimeError:  # a custom Function's saved tensors, once freed
            return None
        for item in (raw if isinstance(raw, (tuple, list)) else (raw,)):
            data = getattr(item, "data", None)
            if isinstance(data, torch.Tensor):
                tensors.append(data)
    return tensors


def has_saved_data(node: Any) -> bool:
    """Whether ``node`` still holds a tensor for its backward (stops at the first: cheaper than
    :func:`saved_data`)."""
    kind = type(node)
    names = _saved_attributes.get(kind)
    if names is None:
        names = _saved_attributes[kind] = tuple(n for n in dir(kind) if n.startswith("_raw_saved_"))
    for name in names:
        try:
            raw = getattr(node, name)
        except RuntimeError:  # a custom Function's saved tensors, once freed
            return False
        for item in (raw if isinstance(raw, (tuple, list)) else (raw,)):
            if getattr(item, "data", None) is not None:
                return True
    return False


def graph_only_bytes(nodes: list[Any]) -> int:
    """The bytes of the storages the saved tensors of ``nodes`` hold and nothing else does: one storage once; a
    leaf that requires grad (a parameter) or a tensor a Python name still holds is not the graph's alone."""
    if _storage_use_count is None:
        return 0
    storages: dict[int, list[Any]] = {}
    for node in nodes:
        for tensor in saved_data(node) or ():
            # getrefcount: the list, this name, the argument and the graph's own hold; more: someone else holds it.
            outside = (tensor.requires_grad and tensor.grad_fn is None) or sys.getrefcount(tensor) > 4
            storage = tensor.untyped_storage()
            entry = storages.setdefault(storage.data_ptr(), [storage, set(), False])
            entry[1].add(tensor._cdata)
            entry[2] = entry[2] or outside
    total = 0
    for storage, impls, outside in storages.values():
        if not outside and _storage_use_count(storage._cdata) - 1 == len(impls):  # -1: the wrapper held here
            total += storage.nbytes()
    return total


def python_walk(roots: list[Any]) -> list[Any]:
    order, seen, stack = [], set(), list(roots)
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(child for child, _ in node.next_functions)
    return order
