"""Which of the learner's names hold a tensor with a graph: the name a verdict uses for a node.

:func:`names_holding_graphs` looks in the learner's frames from one outward (a frame whose file lies outside
torch, the tool (and the course), the standard library and site-packages: its locals, then its globals) and in extra
roots (a step's closure and globals), one and two levels in: items of lists, tuples, deques and dicts, a module's tensor
attributes and buffers, an object's tensor attributes. Each node gets its simplest spelling (``h`` before
``state['h']``). Frames are only read, never written (``f_locals`` is a snapshot up to Python 3.12 and a
write-through view from 3.13: either way it is read item by item and left as it is). A tensor whose ``grad_fn``
PyTorch refuses to give (an ``unbind`` view whose base changed in place) is skipped. :func:`unstepped_optimizers`
reads the same frames for the optimizers they name.

Used by :mod:`backward_twice.judge.built`, :mod:`backward_twice.judge.carried`, :mod:`backward_twice.record.evidence`,
:mod:`backward_twice.record.held`, :mod:`backward_twice.record.recorder` and :mod:`backward_twice.steps.harness`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import os
import re
import types
import weakref
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch.autograd.graph import Node

from backward_twice.record.saved import grad_fn_of

__all__ = ["CodeSite", "NamedGraph", "names_holding_graphs", "simpler", "site_of", "unstepped_optimizers"]


class CodeSite(NamedTuple):
    """The code a name was found in: its file, the code's first line and the code's name (a function's)."""

    filename: str
    first_line: int
    name: str


@dataclass(frozen=True)
class NamedGraph:
    """A name that held a tensor with a graph at an event: the name as the learner spells it (``h``,
    ``state[0]``, ``model.memory``, ``buffers["h"]``), the code of the learner's frame it was found in (None for
    a name the harness gave), whether it is a global, the event's
    index, the node's sequence number, and whether it is a function's own local variable (which the function
    rebinds each call, unlike an entry of a dict or an attribute it reaches)."""

    name: str
    frame: CodeSite | None
    is_global: bool
    event: int
    sequence: int
    local: bool = False
    holder: str | None = None  # the simplest spelling that is not a function's own variable (what keeps it)
    container: str | None = None  # "tuple", "list" or "dict" when the name is an item of one; "parameter"
    shape: tuple[int, ...] | None = None
    aliases: tuple[str, ...] = ()  # other spellings as simple, of a tensor with the same node (an LSTM cell's h, c)
    same: tuple[str, ...] = ()  # other names of this very tensor in that namespace (``smooth = loss``: ``smooth``)


_own_files: dict[str, bool] = {}


def site_of(frame: types.FrameType | None, skipped: tuple[str, ...], outward: bool = True) -> tuple[str, int]:
    """(file, line) of the first of the learner's frames from ``frame`` out (only ``frame`` if not ``outward``)."""
    while frame is not None:
        name = frame.f_code.co_filename
        own = _own_files.get(name)
        if own is None:
            own = _own_files[name] = (not name.startswith("<") or name.startswith("<ipython")) and not os.path.realpath(
                name
            ).startswith(skipped)
        if own:
            return name, frame.f_lineno
        if not outward:
            break
        frame = frame.f_back
    return "", 0


def unstepped_optimizers(frame: types.FrameType | None, skipped: tuple[str, ...], stepped: Container[int]) -> list[str]:
    """ "name (kind)" of each optimizer the learner's code in the frames from ``frame`` out names whose id is not in
    ``stepped``: at an error, the optimizers that never stepped because the loop raised before the end of its
    first cycle (a GAN's generator step never came)."""
    pending = []
    while frame is not None:
        if site_of(frame, skipped, outward=False)[0]:
            code = frame.f_code
            for name in (*code.co_varnames, *code.co_names):
                value = frame.f_locals.get(name, frame.f_globals.get(name))
                if isinstance(value, torch.optim.Optimizer) and id(_unwrapped(value, stepped)) not in stepped:
                    pending.append(f"{name} ({type(value).__name__})")
        frame = frame.f_back
    return pending


def _unwrapped(optimizer: torch.optim.Optimizer, stepped: Container[int]) -> torch.optim.Optimizer:
    """The optimizer a wrapper steps (Lightning's ``LightningOptimizer`` keeps it as ``_optimizer``, accelerate's
    ``AcceleratedOptimizer`` as ``optimizer``): the one whose step the hooks saw. Read from the instance's own dict:
    no property runs."""
    seen = {id(optimizer)}
    while id(optimizer) not in stepped:
        held = getattr(optimizer, "__dict__", None) or {}
        inner = held.get("_optimizer", held.get("optimizer"))
        if not isinstance(inner, torch.optim.Optimizer) or id(inner) in seen:
            break
        optimizer = inner
        seen.add(id(inner))
    return optimizer


def names_holding_graphs(
    frame: types.FrameType | None,
    skipped: tuple[str, ...],
    event: int,
    roots: Callable[[], list[tuple[str, Any]]] | None = None,
    outermost: types.FrameType | None = None,
    roots_where: CodeSite | None = None,
    held_under: dict[str, dict[int, str]] | None = None,
    lives: CodeSite | None = None,
    bounded: dict[str, tuple[int, set[int]]] | None = None,
) -> Iterator[tuple[NamedGraph, Node]]:
    """(name, node) for each node a name holds: the learner's frames from ``frame`` out (up to, not including,
    ``outermost``: a tool's own frame, beyond which lie its caller's names), then ``roots()``. ``held_under``, if
    given, gathers for each top-level name the nodes held under it, each with a spelling under that name
    (``losses``: the nodes of ``losses[0]``, ``losses[1]``, ...), so a caller can see a container that grows: names
    of globals, and the lists and objects of the function ``lives`` names (the one the iteration's loop runs
    in, whose variables live from pass to pass). ``bounded``, if given with it, gathers for each deque with a maxlen
    among those (a memory bank's queue) its maxlen and the nodes its items hold: full of graphs, it holds the last
    few, no more."""
    sources: list[_Namespace] = []
    globals_seen: set[int] = set()
    while frame is not None and frame is not outermost:
        code = frame.f_code
        if site_of(frame, skipped, outward=False)[0]:
            where = CodeSite(code.co_filename, code.co_firstlineno, code.co_name)
            optimized = bool(code.co_flags & inspect.CO_OPTIMIZED)
            if optimized or frame.f_locals is not frame.f_globals:  # exec with its own namespace: the real one
                sources.append(_Namespace(where, False, dict(frame.f_locals.items()), optimized))
            if id(frame.f_globals) not in globals_seen:
                globals_seen.add(id(frame.f_globals))
                sources.append(_Namespace(where, True, frame.f_globals, False))
        frame = frame.f_back
    if roots is not None:
        sources.append(_Namespace(roots_where, False, dict(roots()), False))
    found: dict[int, _Finding] = {}  # node's sequence number -> what the innermost namespace naming it found
    claimed: dict[str, _Namespace] = {}  # a top-level name -> the innermost namespace that binds it
    for source in sources:
        items = list(source.names.items())
        best: dict[int, _Spelling] = {}
        holders: dict[int, str] = {}
        alike: dict[int, dict[str, int]] = {}  # node -> spelling -> the tensor's id (one tensor, several names)
        for name, value in items:
            if type(value) in _ATOMS or name.startswith("__") or isinstance(value, _NOT_NAMES):
                continue
            # a function's own variables are rebound each call; an outer namespace's name is shadowed by an inner's
            lasting = not source.function or (source.frame == lives and _grows_in_place(value))
            deques: dict[str, int] | None = {} if bounded is not None and lasting else None
            for spelled, tensor, node, kind in _graphs_under(name, value, deques):
                sequence = node._sequence_nr()
                if held_under is not None and lasting and claimed.setdefault(name, source) is source:
                    held_under.setdefault(name, {}).setdefault(sequence, spelled)
                    queue = re.sub(r"\[\d+\]$", "", spelled)  # a tensor that is an item of a deque: counted there
                    if bounded is not None and deques and queue in deques:
                        bounded.setdefault(queue, (deques[queue], set()))[1].add(sequence)
                # a function's own variable, or an item of a tuple it holds (``ret = model(x, *mems)``: made by
                # this call, it dies with it; what keeps the tensor is another name, ``mems``)
                bare = source.function and (isinstance(value, tuple) or ("[" not in spelled and "." not in spelled))
                if not bare and (sequence not in holders or simpler(spelled, holders[sequence])):
                    holders[sequence] = spelled
                known = best.get(sequence)
                alike.setdefault(sequence, {})[spelled] = id(tensor)
                if known is None or _better(spelled, kind, known):
                    best[sequence] = _Spelling(
                        spelled, node, bare and (known is None or known.local), kind, tuple(tensor.shape), id(tensor)
                    )
                elif not bare:
                    best[sequence] = replace(known, local=False)
        for sequence, spelling in best.items():
            spelled, tensor_id = spelling.spelled, spelling.tensor_id
            entry = found.get(sequence)
            if entry is None:  # the innermost frame names it
                rank = (spelled.count("["), spelled.count("."))
                # other tensors of the same node (an LSTM cell's h and c), one spelling each; another name of the
                # very same tensor (a distribution's logits and _param) is no second finding
                others: dict[int, str] = {}
                for a, held in alike[sequence].items():
                    if (
                        held != tensor_id
                        and (a.count("["), a.count(".")) == rank
                        and (held not in others or simpler(a, others[held]))
                    ):
                        others[held] = a
                aliases = tuple(sorted(others.values()))
                same = tuple(sorted(a for a, held in alike[sequence].items() if held == tensor_id and a != spelled))
                found[sequence] = _Finding(
                    spelled,
                    source.frame,
                    source.is_global,
                    spelling.node,
                    spelling.local,
                    holders.get(sequence),
                    spelling.container,
                    spelling.shape,
                    aliases,
                    same[:_SAME_NAMES],
                )
            elif not spelling.local:
                entry.local = False
                entry.holder = entry.holder or holders.get(sequence)
    for sequence, finding in found.items():
        yield (
            NamedGraph(
                finding.name,
                finding.frame,
                finding.is_global,
                event,
                sequence,
                finding.local,
                finding.holder,
                finding.container,
                finding.shape,
                finding.aliases,
                finding.same,
            ),
            finding.node,
        )


@dataclass(frozen=True, slots=True)
class _Namespace:
    """A namespace searched for names: the code it belongs to (None: the harness's roots), whether it is a
    module's globals, the names, and whether they are a function frame's own variables (rebound at each call)."""

    frame: CodeSite | None
    is_global: bool
    names: dict[str, Any]
    function: bool


@dataclass(frozen=True, slots=True)
class _Spelling:
    """The simplest spelling one namespace has for a node so far: the spelling, the node, whether only a
    function's own variables name it, the kind of container it is an item of, the tensor's shape and id."""

    spelled: str
    node: Node
    local: bool
    container: str | None
    shape: tuple[int, ...]
    tensor_id: int


@dataclass(slots=True)
class _Finding:
    """A node as the innermost namespace naming it spelled it; ``local`` and ``holder`` are updated by the
    namespaces further out (a global naming it too means it is not only a function's own variable)."""

    name: str
    frame: CodeSite | None
    is_global: bool
    node: Node
    local: bool
    holder: str | None
    container: str | None
    shape: tuple[int, ...]
    aliases: tuple[str, ...]
    same: tuple[str, ...]


def _better(spelled: str, kind: str | None, known: _Spelling) -> bool:
    """Whether ``spelled`` names a node better than ``known``: a module's parameter by its module's path
    (``ema_model[2].bias``, not ``p``, a setup loop's variable left holding it), else the simpler spelling."""
    parameter, was = kind == "parameter", known.container == "parameter"
    return parameter > was or (parameter == was and simpler(spelled, known.spelled))


def simpler(a: str, b: str) -> bool:
    """Whether spelling ``a`` is simpler than ``b``: fewer private parts (``actions.logits`` before
    ``actions._param``; ``model.hidden`` before ``trainer._loop.model.hidden``), then fewer steps in, then fewer
    subscripts, fewer attributes, then shorter."""
    return _rank(a) < _rank(b)


@functools.lru_cache(maxsize=8192)  # a loop's spellings come back at every read
def _rank(spelled: str) -> tuple[int, int, int, int, int]:
    private = sum(1 for part in re.split(r"[.\[]", spelled) if part.startswith("_"))
    depth = spelled.count("[") + spelled.count(".")
    return private, depth, spelled.count("["), spelled.count("."), len(spelled)


_OURS = "backward_twice."  # the tool's own modules (a learner's package may well be named helpers)
_SAME_NAMES = 8  # other names of one tensor kept
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
_NOT_NAMES = (types.ModuleType, type, types.FunctionType)  # what a namespace names that holds no state of the loop
_ATOM_TYPES = (int, float, complex, bool, str, bytes, type(None))
_ATOMS = frozenset(_ATOM_TYPES)  # values that hold no tensor, told by type

_Found = list[tuple[str, torch.Tensor, Node, "str | None"]]


def _grows_in_place(value: Any) -> bool:
    """Whether a function's variable can hold more graphs at each pass while it keeps its value: a list, or an
    object whose attributes do (grad-cam's ``ActivationsAndGradients``); a dict of a pass's values (a step's
    outputs) is rebuilt each pass, and gains keys as the first passes run."""
    return isinstance(value, list) or not isinstance(value, (torch.Tensor, dict, tuple, *_ATOM_TYPES))


def _graphs_under(name: str, value: Any, deques: dict[str, int] | None = None) -> _Found:
    """(spelling, tensor, its node, the kind of container it is an item of) for each tensor with a graph under
    ``name`` (see :func:`_walk`); into ``deques``, if given, each deque with a maxlen met on the way. What the walk
    found before one of the learner's objects refused to be read (a property that raises, a ``__getattr__`` of its
    own) is kept; the rest of that name is skipped, never the loop."""
    found: _Found = []
    with contextlib.suppress(Exception):
        _walk(name, value, 0, None, found, [0], deques)
    return found


def _graph_of(name: str, tensor: torch.Tensor, kind: str | None, found: _Found) -> None:
    node = grad_fn_of(tensor)
    if node is not None:
        found.append((name, tensor, node, kind))


def _walk(
    name: str, value: Any, depth: int, kind: str | None, found: _Found, visits: list[int], deques: dict[str, int] | None
) -> None:
    """Gather into ``found`` a tensor, the items of a list, tuple or dict, a module's tensor attributes and buffers,
    and a plain object's attributes, down to where a learner's state lives: ``h``, ``state[0]``, ``buffers['h']``,
    ``model.memory``, ``trainer.hidden[0]``, ``past.layers[0].keys`` (four levels at most, and a budget of objects
    per name: a dataset is not walked). A number or a string costs one visit and no call. ``deques``: where a deque
    with a maxlen is kept, by its spelling, with that maxlen."""
    if isinstance(value, torch.Tensor):
        _graph_of(name, value, kind, found)
        return
    visits[0] += 1
    if depth >= _MAX_DEPTH or visits[0] > _MAX_VISITS:
        return
    if isinstance(value, (list, tuple, collections.deque)):  # a deque: a bounded queue of a memory bank's keys
        container = "list" if isinstance(value, collections.deque) else type(value).__name__
        if isinstance(value, collections.deque) and value.maxlen is not None and deques is not None:
            deques[name] = value.maxlen
        for i, item in enumerate(itertools.islice(value, 64)):
            if type(item) in _ATOMS:
                visits[0] += 1
            else:
                _walk(f"{name}[{i}]", item, depth + 1, container, found, visits, deques)
    elif isinstance(value, dict):
        for key, item in list(value.items())[:64]:
            if not isinstance(key, (str, int)):
                continue
            if type(item) in _ATOMS:
                visits[0] += 1
            else:
                _walk(f"{name}[{key!r}]", item, depth + 1, "dict", found, visits, deques)
    elif isinstance(value, torch.nn.Module):
        _module_tensors(name, value, found, deques)
    elif (
        isinstance(getattr(value, "__dict__", None), dict)
        and not isinstance(value, _NOT_STATE)
        and not type(value).__module__.startswith(_OURS)  # a watch's own records hold no state of the loop
    ):
        for key, item in list(vars(value).items())[:64]:
            if isinstance(item, (torch.Tensor, list, tuple, dict, collections.deque)) or isinstance(
                getattr(item, "__dict__", None), dict
            ):  # a deque: a plain object's queue (``bank.queue``), as a module's
                _walk(f"{name}.{key}", item, depth + 1, None, found, visits, deques)


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


def _module_tensors(prefix: str, root: torch.nn.Module, found: _Found, deques: dict[str, int] | None = None) -> None:
    """A module's tensor attributes (``self.memory``, ``self.hidden = (h, c)``, the first items of a list such as
    REINFORCE's ``self.saved_log_probs``), buffers and parameters (an EMA's weights updated in place outside
    ``torch.no_grad()``) with a graph, and its
    submodules' (only those that have any: the tree is read once and again when it changes, not at every look);
    into ``deques``, if given, each deque attribute with a maxlen (``self.queue``)."""
    tree = _tree(root)
    for suffix, module in tree.entries:
        attributes = module.__dict__
        for key in _keys(module):
            item = attributes.get(key)
            if isinstance(item, torch.Tensor):
                if not isinstance(item, torch.nn.Parameter):
                    _graph_of(f"{prefix}{suffix}.{key}", item, None, found)
            elif isinstance(item, (tuple, list, collections.deque)):  # self.hidden = (h, c); a list, a queue
                if isinstance(item, collections.deque) and item.maxlen is not None and deques is not None:
                    deques[f"{prefix}{suffix}.{key}"] = item.maxlen
                for i, part in enumerate(itertools.islice(item, 8)):
                    if isinstance(part, torch.Tensor):
                        _graph_of(
                            f"{prefix}{suffix}.{key}[{i}]", part, "tuple" if isinstance(item, tuple) else "list", found
                        )
            elif isinstance(item, dict):  # self.shadow[name] = ...: an EMA kept by name
                for entry, part in list(item.items())[:8]:
                    if isinstance(part, torch.Tensor):
                        _graph_of(f"{prefix}{suffix}.{key}[{entry!r}]", part, "dict", found)
        for key, item in module._buffers.items():
            if item is not None:
                _graph_of(f"{prefix}{suffix}.{key}", item, None, found)
    for suffix, module in tree.modules:  # their own dicts, read now: a parameter replaced since is the new one
        for key, parameter in module._parameters.items():
            if parameter is not None and parameter.grad_fn is not None:  # an in-place update outside
                _graph_of(f"{prefix}{suffix}.{key}", parameter, "parameter", found)  # torch.no_grad() (an EMA)
