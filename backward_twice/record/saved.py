"""What an autograd node saved for its backward, read without unpacking, and the bytes only the graph holds.

* :func:`saved_data`: the tensors behind a node's ``_raw_saved_*`` attributes (``.data`` of each
  ``SavedTensor``: no unpack, so nothing trips or switches off PyTorch's version check), or None once freed;
* :func:`graph_only_bytes`: the storages those tensors hold, each once, counted only when the graph alone holds
  them, as the course's saved-tensor meter counts (a parameter, or an input or activation a Python name still
  holds, is alive anyway); a saved 0-dim scalar counts too;
* :func:`python_walk`: every node a graph reaches from some roots, over ``next_functions``;
* :func:`weights_under`, :func:`weights_past`: the weights a graph trains, and those it still trains with the graphs
  built before a point cut off;
* :func:`grad_fn_of`: a tensor's ``grad_fn``, or None where PyTorch refuses the read;
* :func:`changed_in_place`: whether a node's backward would raise PyTorch's in-place error (the one read that
  unpacks, which is where PyTorch checks a saved tensor's version).

Used by :mod:`backward_twice.record.evidence`, :mod:`backward_twice.record.held`, :mod:`backward_twice.record.names`,
:mod:`backward_twice.record.objects`, :mod:`backward_twice.record.recorder`, :mod:`backward_twice.record.stale_step`,
:mod:`backward_twice.record.walks` and :mod:`helpers.growth`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import Node

__all__ = [
    "changed_in_place",
    "grad_fn_of",
    "graph_only_bytes",
    "has_saved_data",
    "python_walk",
    "saved_data",
    "saves_tensors",
    "weights_in",
    "weights_past",
    "weights_under",
]

_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
_saved_attributes: dict[type, tuple[str, ...]] = {}


def grad_fn_of(tensor: torch.Tensor) -> Node | None:
    """``tensor.grad_fn``, or None where PyTorch refuses to give it: a view of a function that returns several
    (``unbind``, ``split``, ``chunk``, ``for row in w``) whose base was changed in place raises on the read. Read past
    a subclass's ``__torch_function__``, which would see the tool's reads among the learner's calls (a counter)."""
    try:
        with unseen_by_subclasses():
            return tensor.grad_fn
    except RuntimeError:
        return None


def unseen_by_subclasses() -> contextlib.AbstractContextManager[Any]:
    """While inside, a tensor subclass's ``__torch_function__`` is not called for what the tool reads."""
    return _NO_SUBCLASS_FUNCTION()


_NO_SUBCLASS_FUNCTION = getattr(torch._C, "DisableTorchFunctionSubclass", contextlib.nullcontext)


class _Freed(Exception):
    """A custom Function's saved tensors, once freed: reading them raises."""


def _saved_items(node: Node) -> Iterator[Any]:
    """What each of ``node``'s saved slots holds (``.data`` of its ``SavedTensor``: None when it holds nothing)."""
    for name in _raw_names(type(node)):
        try:
            raw = getattr(node, name)
        except RuntimeError:
            raise _Freed from None
        for item in raw if isinstance(raw, (tuple, list)) else (raw,):
            yield getattr(item, "data", None)


def saved_data(node: Node) -> list[torch.Tensor] | None:
    """The tensors ``node`` holds for its backward (read without unpacking), or None once they are freed."""
    try:
        return [data for data in _saved_items(node) if isinstance(data, torch.Tensor)]
    except _Freed:
        return None


def has_saved_data(node: Node) -> bool:
    """Whether ``node`` still holds a tensor for its backward (stops at the first: cheaper than
    :func:`saved_data`)."""
    try:
        return any(data is not None for data in _saved_items(node))
    except _Freed:
        return False


def changed_in_place(node: Node) -> bool:
    """Whether a tensor ``node`` saved was changed in place since: unpacking it raises PyTorch's "modified by an
    inplace operation", as ``node``'s backward would (a node whose buffers were freed tells nothing: False)."""
    for name in _raw_names(type(node)):
        short = name[len("_raw_saved_") :]
        try:  # a custom Function's are its ``saved_tensors``
            getattr(node, "_saved_" + short) if hasattr(type(node), "_saved_" + short) else getattr(
                node, "saved_" + short
            )
        except RuntimeError as error:
            if "modified by an inplace operation" in str(error):
                return True
        except Exception:  # a slot PyTorch does not unpack for Python (an optional list): nothing to tell
            continue
    return False


def saves_tensors(node: Node) -> bool:
    """Whether ``node``'s kind saves tensors for its backward (read from its type: a node whose buffers a backward
    freed still tells)."""
    return bool(_raw_names(type(node)))


def _raw_names(kind: type) -> tuple[str, ...]:
    """A node type's ``_raw_saved_<name>`` attributes (custom Functions: ``_raw_saved_tensors``), read once."""
    names = _saved_attributes.get(kind)
    if names is None:
        names = _saved_attributes[kind] = tuple(n for n in dir(kind) if n.startswith("_raw_saved_"))
    return names


@dataclass(slots=True)
class _Storage:
    """A storage saved tensors share: the storage, the tensors (their ``_cdata``) that hold it in the graph, and
    whether one of them is held outside the graph too."""

    storage: torch.UntypedStorage
    impls: set[int] = field(default_factory=set)
    outside: bool = False


def graph_only_bytes(nodes: Sequence[Node]) -> int:
    """The bytes of the storages the saved tensors of ``nodes`` hold and nothing else does: one storage once; a
    leaf that requires grad (a parameter) or a tensor a Python name still holds is not the graph's alone."""
    if _storage_use_count is None:
        return 0
    storages: dict[int, _Storage] = {}
    for node in nodes:
        for tensor in saved_data(node) or ():
            # getrefcount: the list, this name, the argument and the graph's own hold; more: someone else holds it.
            outside = (tensor.requires_grad and not tensor._is_view() and grad_fn_of(tensor) is None) or (
                sys.getrefcount(tensor) > 4
            )
            if tensor.layout != torch.strided:  # sparse, nested: no one storage to count (not counted)
                continue
            storage = tensor.untyped_storage()
            entry = storages.get(storage.data_ptr())
            if entry is None:
                entry = storages[storage.data_ptr()] = _Storage(storage)
            entry.impls.add(tensor._cdata)
            entry.outside = entry.outside or outside
    total = 0
    for entry in storages.values():
        # -1: the wrapper held here
        if not entry.outside and _storage_use_count(entry.storage._cdata) - 1 == len(entry.impls):
            total += entry.storage.nbytes()
    return total


def storage_address(tensor: torch.Tensor) -> int:
    """The address of the storage that holds ``tensor``'s values (a sparse tensor's: its values'); its id where no
    storage can be read (a nested tensor)."""
    try:
        if tensor.layout == torch.sparse_coo:
            tensor = tensor._values()
        elif tensor.layout != torch.strided:
            tensor = tensor.values()
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return id(tensor)


def python_walk(roots: Sequence[Node | None], avoiding: Node | None = None) -> list[Node]:
    """Every node reachable from ``roots`` over ``next_functions``, each once, a layer at a time; none through
    ``avoiding`` (what a walk still reaches once that node's tensor is detached)."""
    seen: dict[int, Node] = {} if avoiding is None else {id(avoiding): avoiding}
    layer = [root for root in roots if root is not None]
    while layer:
        fresh = {id(node): node for node in layer if id(node) not in seen}
        seen.update(fresh)
        layer = [child for node in fresh.values() for child, _ in node.next_functions if child is not None]
    return [node for node in seen.values() if node is not avoiding]


def weights_in(nodes: list[Node]) -> frozenset[int]:
    """The ids of the tensors whose gradients ``nodes`` accumulate (their ``AccumulateGrad`` nodes' weights)."""
    return frozenset(id(n.variable) for n in nodes if hasattr(n, "variable"))


def weights_under(node: Node) -> frozenset[int]:
    """The ids of the tensors whose gradients the graph under ``node`` accumulates (the weights it trains)."""
    return weights_in(python_walk([node]))


def weights_past(root: Node, since: int) -> frozenset[int]:
    """The ids of the weights the graph under ``root`` trains through nodes built at or after engine sequence number
    ``since`` alone: what a loss still trains once each graph built before (an earlier pass's) is detached. A weight's
    ``AccumulateGrad`` node carries the largest sequence number, so no weight is cut off for its own node's age."""
    seen: dict[int, Node] = {}
    layer = [root] if root._sequence_nr() >= since else []
    while layer:
        fresh = {id(node): node for node in layer if id(node) not in seen}
        seen.update(fresh)
        layer = [
            child
            for node in fresh.values()
            for child, _ in node.next_functions
            if child is not None and child._sequence_nr() >= since
        ]
    return weights_in(list(seen.values()))
