"""The walk into one name's value: each tensor with a graph under it, spelled as the learner spells it.

:func:`graphs_under` follows a value down to where a learner's state lives: ``h``, ``state[0]``, ``buffers['h']``,
``model.memory``, ``trainer.hidden[0]``, ``past.layers[0].keys``: items of lists, tuples, deques and dicts, a
module's tensor attributes, buffers and parameters (an EMA's weights updated in place outside ``torch.no_grad()``)
and its weights' gradients with a graph (``backward(create_graph=True)``'s, ``model[0].weight.grad``),
a plain object's attributes (four levels at most, and a budget of objects per name: a dataset is not walked), and,
one level below a framework's trainer, the callbacks of the learner's classes in its callback lists (Lightning's
``trainer.callbacks``, transformers' ``trainer.callback_handler.callbacks``: an inline ``callbacks=[Cb()]`` has no
other name, and its list lies past the depth or the budget of the plain walk). A number or a string costs one visit
and no call. Objects are only read (their own ``__dict__``, no property runs); a tensor whose ``grad_fn`` PyTorch
refuses to give (an ``unbind`` view whose base changed in place) is skipped; what the walk found before one of the
learner's objects refused to be read (a ``__getattr__`` of its own) is kept, and the rest of that name is skipped,
never the loop. A module's submodules worth looking into are read once and again when they change
(:func:`_tree`), not at every walk.

Used by :mod:`backward_twice.record.names` and :mod:`backward_twice.steps.snapshot`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import Node

from backward_twice.record.learner import learners_class
from backward_twice.record.saved import grad_fn_of

__all__ = ["ATOMS", "ATOM_TYPES", "MODULE_OWN_ATTRIBUTES", "Found", "graphs_under"]

ATOM_TYPES = (int, float, complex, bool, str, bytes, type(None))
ATOMS = frozenset(ATOM_TYPES)  # values that hold no tensor, told by type
_OURS = "backward_twice."  # the tool's own modules (a learner's package may well be named helpers)
_MAX_DEPTH, _MAX_VISITS = 4, 256  # how far into a learner's objects a name is followed, and how many objects
_NOT_STATE = (  # an object with a ``__call__`` of its own is state (grad-cam's hooks holder), a function is not
    torch.optim.Optimizer,
    types.ModuleType,
    torch.utils.data.Dataset,
    torch.utils.data.DataLoader,
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    functools.partial,
)
# Where a trainer keeps its callbacks: Lightning's ``trainer.callbacks``, transformers' ``.callback_handler.callbacks``.
# A callback given inline (``callbacks=[Cb()]``) has no other name: its list lies past the depth (transformers) or
# past the objects budget (Lightning: its connectors, each naming the trainer again, come first) of the plain walk.
_CALLBACK_LISTS = (("callbacks",), ("callback_handler", "callbacks"))

Found = list[tuple[str, torch.Tensor, Node, "str | None"]]  # spelling, tensor, its node, the container it is in


def graphs_under(name: str, value: Any, skipped: tuple[str, ...], deques: dict[str, int] | None = None) -> Found:
    """(spelling, tensor, its node, the kind of container it is an item of) for each tensor with a graph under
    ``name``; ``skipped``: the folders whose code is not the learner's (a callback's class is told by them); into
    ``deques``, if given, each deque with a maxlen met on the way, by its spelling."""
    walk = _Walk(skipped, deques)
    with contextlib.suppress(Exception):
        walk.into(name, value, 0, None)
    return walk.found


@dataclass(slots=True)
class _Walk:
    """One name's walk: what it found, the objects it visited, and where deques with a maxlen lie."""

    skipped: tuple[str, ...]
    deques: dict[str, int] | None
    found: Found = field(default_factory=list)
    visits: int = 0

    def graph_of(self, name: str, tensor: torch.Tensor, kind: str | None) -> None:
        node = grad_fn_of(tensor)
        if node is not None:
            self.found.append((name, tensor, node, kind))

    def into(self, name: str, value: Any, depth: int, kind: str | None) -> None:
        if isinstance(value, torch.Tensor):
            self.graph_of(name, value, kind)
            return
        self.visits += 1
        if depth >= _MAX_DEPTH or self.visits > _MAX_VISITS:
            return
        if isinstance(value, (list, tuple, collections.deque)):  # a deque: a bounded queue of a memory bank's keys
            container = "list" if isinstance(value, collections.deque) else type(value).__name__
            if isinstance(value, collections.deque) and value.maxlen is not None and self.deques is not None:
                self.deques[name] = value.maxlen
            for i, item in enumerate(itertools.islice(value, 64)):
                if type(item) in ATOMS:
                    self.visits += 1
                else:
                    self.into(f"{name}[{i}]", item, depth + 1, container)
        elif isinstance(value, dict):
            for key, item in list(value.items())[:64]:
                if not isinstance(key, (str, int)):
                    continue
                if type(item) in ATOMS:
                    self.visits += 1
                else:
                    self.into(f"{name}[{key!r}]", item, depth + 1, "dict")
        elif isinstance(value, torch.nn.Module):
            self.module_tensors(name, value)
        elif (
            isinstance(getattr(value, "__dict__", None), dict)
            and not isinstance(value, _NOT_STATE)
            and not type(value).__module__.startswith(_OURS)  # a watch's own records hold no state of the loop
        ):
            attributes = vars(value)
            if "callbacks" in attributes or "callback_handler" in attributes:  # a trainer's (see ``_CALLBACK_LISTS``)
                for spelled, callback in _learners_callbacks(name, attributes, self.skipped):
                    self.into(spelled, callback, depth + 1, None)
            for key, item in list(attributes.items())[:64]:
                if isinstance(item, (torch.Tensor, list, tuple, dict, collections.deque)) or isinstance(
                    getattr(item, "__dict__", None), dict
                ):  # a deque: a plain object's queue (``bank.queue``), as a module's
                    self.into(f"{name}.{key}", item, depth + 1, None)

    def module_tensors(self, prefix: str, root: torch.nn.Module) -> None:
        """A module's tensor attributes (``self.memory``, ``self.hidden = (h, c)``, the first items of a list such
        as REINFORCE's ``self.saved_log_probs``, a deque's ``self.queue``), buffers and parameters with a graph,
        and its submodules' (only those that have any)."""
        tree = _tree(root)
        for suffix, module in tree.entries:
            attributes = module.__dict__
            for key in _keys(module):
                item = attributes.get(key)
                if isinstance(item, torch.Tensor):
                    if not isinstance(item, torch.nn.Parameter):
                        self.graph_of(f"{prefix}{suffix}.{key}", item, None)
                elif isinstance(item, (tuple, list, collections.deque)):  # self.hidden = (h, c); a list, a queue
                    if isinstance(item, collections.deque) and item.maxlen is not None and self.deques is not None:
                        self.deques[f"{prefix}{suffix}.{key}"] = item.maxlen
                    kind = "tuple" if isinstance(item, tuple) else "list"
                    for i, part in enumerate(itertools.islice(item, 8)):
                        if isinstance(part, torch.Tensor):
                            self.graph_of(f"{prefix}{suffix}.{key}[{i}]", part, kind)
                        elif isinstance(part, (tuple, list)):  # an NTM's ``self.previous_state = (reads, (h, c),
                            self.into(f"{prefix}{suffix}.{key}[{i}]", part, _MAX_DEPTH - 2, kind)  # heads)``
                elif isinstance(item, dict):  # self.shadow[name] = ...: an EMA kept by name
                    for entry, part in list(item.items())[:8]:
                        if isinstance(part, torch.Tensor):
                            self.graph_of(f"{prefix}{suffix}.{key}[{entry!r}]", part, "dict")
                        elif isinstance(part, (tuple, list)) and isinstance(entry, (str, int)):  # an (h, c) per key
                            self.into(f"{prefix}{suffix}.{key}[{entry!r}]", part, _MAX_DEPTH - 2, "dict")
            for key, item in module._buffers.items():  # one with a graph: an in-place update outside torch.no_grad()
                if item is not None:  # (a VQ-VAE codebook's EMA without its .data)
                    self.graph_of(f"{prefix}{suffix}.{key}", item, "buffer" if item.grad_fn is not None else None)
        for suffix, module in tree.modules:  # their own dicts, read now: a parameter replaced since is the new one
            for key, parameter in module._parameters.items():
                if parameter is None:
                    continue
                if parameter.grad_fn is not None:  # an in-place update outside torch.no_grad() (an EMA)
                    self.graph_of(f"{prefix}{suffix}.{key}", parameter, "parameter")
                    continue
                grad = parameter._grad  # a leaf's: no warning (a non-leaf's read warns)
                if grad is not None and grad.grad_fn is not None:  # what ``backward(create_graph=True)`` left there
                    self.graph_of(f"{prefix}{suffix}.{key}.grad", grad, "grad")


def _learners_callbacks(name: str, attributes: dict[str, Any], skipped: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """(spelling, callback) for each object of the learner's classes in the callbacks (``_CALLBACK_LISTS``) of an
    object with ``attributes``, read from the instances' own dicts (no property runs): ``trainer.callbacks[0]``."""
    for path in _CALLBACK_LISTS:
        held: Any = attributes.get(path[0])
        for part in path[1:]:
            inner = getattr(held, "__dict__", None)
            held = inner.get(part) if isinstance(inner, dict) else None
        if isinstance(held, list):
            for i, callback in enumerate(held[:64]):
                if learners_class(type(callback), skipped):
                    yield f"{name}.{'.'.join(path)}[{i}]", callback


# module -> (len(__dict__), the keys worth looking at); weak, so a module's id reused later finds nothing stale
_tensor_keys: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, tuple[str, ...]]] = weakref.WeakKeyDictionary()


@dataclass(slots=True)
class _Tree:
    """A module's submodules worth looking into (a tensor, tuple or None attribute, or a buffer), and all of them
    (for their parameters), with their spelling below it: read again when the module's own attributes or children
    change, or every 64 reads."""

    token: tuple[int, int]
    reads: int
    entries: list[tuple[str, torch.nn.Module]]
    modules: list[tuple[str, torch.nn.Module]]  # every submodule, for their parameters


_trees: weakref.WeakKeyDictionary[torch.nn.Module, _Tree] = weakref.WeakKeyDictionary()


# What every module's ``__dict__`` holds from ``nn.Module.__init__`` (``_compiled_call_impl``, None until compiled)
MODULE_OWN_ATTRIBUTES = frozenset(("training", "_compiled_call_impl")) | frozenset(
    name for name in getattr(torch.nn.Module, "__annotations__", {}) if name.startswith("_")
)


def _keys(module: torch.nn.Module) -> tuple[str, ...]:
    """Which of a module's own attributes can hold a tensor with a graph, read once per size of its ``__dict__``."""
    attributes = module.__dict__
    cached = _tensor_keys.get(module)
    if cached is None or cached[0] != len(attributes):
        own = not type(module).__module__.startswith("torch.")  # a learner's module: a number may become a tensor
        keys = tuple(
            k
            for k, v in attributes.items()
            if (isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter))
            # a tuple, list or None that is not torch's own (_compiled_call_impl); a number of a learner's module
            # (``self.running_loss = 0``, then ``+= loss``: the size of ``__dict__`` stays)
            or ((isinstance(v, (tuple, list, collections.deque)) or v is None) and not k.startswith("_"))
            or (own and type(v) in (int, float, dict) and not k.startswith("_"))  # an EMA's ``self.shadow = {}``
            # a learner's private cache, None until a forward fills it (``self._kvectors``): the size stays
            or (own and v is None and k not in MODULE_OWN_ATTRIBUTES)
        )
        cached = _tensor_keys[module] = (len(attributes), keys)
    return cached[1]


def _child(suffix: str, module: torch.nn.Module, key: str) -> str:
    """A submodule's spelling in Python: ``.encoder``, ``[1]`` of a Sequential or ModuleList, ``['1']`` of a dict."""
    if key.isdigit() and isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)):
        return f"{suffix}[{key}]"
    return f"{suffix}.{key}" if key.isidentifier() else f"{suffix}[{key!r}]"


def _tree(root: torch.nn.Module) -> _Tree:
    token = (len(root.__dict__), len(root._modules))
    tree = _trees.get(root)
    if tree is None or tree.token != token or tree.reads % 64 == 63:
        entries: list[tuple[str, torch.nn.Module]] = []
        modules: list[tuple[str, torch.nn.Module]] = []
        stack: list[tuple[str, torch.nn.Module, int]] = [("", root, 0)]
        while stack:
            suffix, module, depth = stack.pop()
            modules.append((suffix, module))
            if _keys(module) or module._buffers:
                entries.append((suffix, module))
            if depth < 8:
                stack.extend(
                    (_child(suffix, module, key), child, depth + 1)
                    for key, child in reversed(module._modules.items())
                    if child is not None
                )
        tree = _trees[root] = _Tree(token, 0, entries, modules)
    tree.reads += 1
    return tree
