"""Which of the learner's names hold a tensor with a graph: the name a verdict uses for a node.

:func:`names_holding_graphs` looks in the learner's frames from one outward (a frame whose file lies outside
torch, the tool (and the course), the standard library and site-packages: its locals, then its globals) and in extra
roots (a step's closure and globals), each name's value walked down to where a learner's state lives
(:mod:`backward_twice.record.objects`: items of lists, tuples, deques and dicts, a module's tensor attributes and
buffers, an object's attributes, a trainer's callbacks of the learner's classes). Each node gets its simplest
spelling (``h`` before ``state['h']``). Frames are only read, never written (``f_locals`` is a snapshot up to Python
3.12 and a write-through view from 3.13: either way it is read item by item and left as it is).
:func:`unstepped_optimizers` reads the same frames for the optimizers they name.

Used by :mod:`backward_twice.judge.built`, :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.loop_body`,
:mod:`backward_twice.judge.states`, :mod:`backward_twice.record.evidence`, :mod:`backward_twice.record.held`,
:mod:`backward_twice.record.inside`, :mod:`backward_twice.record.recorder` and :mod:`backward_twice.steps.harness`.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import os
import re
import types
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch.autograd.graph import Node

from backward_twice.record.objects import ATOM_TYPES, ATOMS, graphs_under
from backward_twice.record.saved import unseen_by_subclasses

__all__ = [
    "LIST_ITEM",
    "CodeSite",
    "NamedGraph",
    "named_optimizers",
    "names_holding_graphs",
    "simpler",
    "site_of",
    "unstepped_optimizers",
    "unwrapped",
]


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
    container: str | None = None  # "tuple", "list" or "dict" when the name is an item of one; "parameter", "buffer"
    shape: tuple[int, ...] | None = None
    aliases: tuple[str, ...] = ()  # other spellings as simple, of a tensor with the same node (an LSTM cell's h, c)
    same: tuple[str, ...] = ()  # other names of this very tensor in that namespace (``smooth = loss``: ``smooth``)


_own_files: dict[str, bool] = {}


LIST_ITEM = re.compile(r"\[\d+\]$")  # a spelling that ends in a list's item


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
    return [
        f"{name} ({type(value).__name__})"
        for name, value in named_optimizers(frame, skipped)
        if id(unwrapped(value, stepped)) not in stepped
    ]


def named_optimizers(
    frame: types.FrameType | None, skipped: tuple[str, ...]
) -> Iterator[tuple[str, torch.optim.Optimizer]]:
    """(name, optimizer) of each optimizer the learner's code in the frames from ``frame`` out names."""
    while frame is not None:
        if site_of(frame, skipped, outward=False)[0]:
            code = frame.f_code
            for name in (*code.co_varnames, *code.co_names):
                value = frame.f_locals.get(name, frame.f_globals.get(name))
                if isinstance(value, torch.optim.Optimizer):
                    yield name, value
        frame = frame.f_back


def unwrapped(optimizer: torch.optim.Optimizer, stepped: Container[int]) -> torch.optim.Optimizer:
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
    bounded: dict[str, tuple[int, set[int], set[str]]] | None = None,
    atoms: set[str] | None = None,
) -> Iterator[tuple[NamedGraph, Node]]:
    """(name, node) for each node a name holds: the learner's frames from ``frame`` out (up to, not including,
    ``outermost``: a tool's own frame, beyond which lie its caller's names), then ``roots()``. ``held_under``, if
    given, gathers for each top-level name the nodes held under it, each with a spelling under that name
    (``losses``: the nodes of ``losses[0]``, ``losses[1]``, ...), so a caller can see a container that grows: names
    of globals, and the lists and objects of the function ``lives`` names (the one the iteration's loop runs
    in, whose variables live from pass to pass). ``bounded``, if given with it, gathers for each deque with a maxlen
    among those (a memory bank's queue) its maxlen and the nodes its items hold: full of graphs, it holds the last
    few, no more. ``atoms``, if given, gathers the names that hold a plain number or None (``total = 0``: reset)."""
    sources: list[_Namespace] = []
    globals_seen: set[int] = set()
    # Past the loop's own frame (or, with no loop of the learner's, past a framework's frame: a trainer's loop), a
    # function's frame runs the call that holds the whole loop: its lists and objects (``trainer`` in a ``main()``)
    # last from pass to pass, as the loop's own frame's do.
    outside = False
    while frame is not None and frame is not outermost:
        code = frame.f_code
        if site_of(frame, skipped, outward=False)[0]:
            where = CodeSite(code.co_filename, code.co_firstlineno, code.co_name)
            optimized = bool(code.co_flags & inspect.CO_OPTIMIZED)
            if optimized or frame.f_locals is not frame.f_globals:  # exec with its own namespace: the real one
                sources.append(_Namespace(where, False, dict(frame.f_locals.items()), optimized, outside))
            if id(frame.f_globals) not in globals_seen:
                globals_seen.add(id(frame.f_globals))
                sources.append(_Namespace(where, True, frame.f_globals, False))
            outside = outside or (lives is not None and where == lives)
        elif lives is None and not outside:
            outside = _in_a_framework(frame)
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
            if type(value) in ATOMS or name.startswith("__") or isinstance(value, _NOT_NAMES):
                if atoms is not None and type(value) in ATOMS:
                    atoms.add(name)
                continue
            # a function's own variables are rebound each call; an outer namespace's name is shadowed by an inner's
            lasting = not source.function or ((source.outside or source.frame == lives) and _grows_in_place(value))
            deques: dict[str, int] | None = {} if bounded is not None and lasting else None
            for spelled, tensor, node, kind in graphs_under(name, value, skipped, deques):
                sequence = node._sequence_nr()
                if held_under is not None and lasting and claimed.setdefault(name, source) is source:
                    under = held_under.setdefault(name, {})  # one tensor, two spellings: a list's item counts (a
                    if sequence not in under or (LIST_ITEM.search(spelled) and not LIST_ITEM.search(under[sequence])):
                        under[sequence] = spelled  # callback's list grows, though the trainer's last outputs hold it)
                    queue = re.sub(r"\[\d+\](?:\[[^\]]*\])*$", "", spelled)  # a deque's item, or in one: counted there
                    if bounded is not None and deques and queue in deques:
                        _, nodes, places = bounded.setdefault(queue, (deques[queue], set(), set()))
                        nodes.add(sequence)
                        places.add(spelled[len(queue) :].split("]", 1)[0])  # its place in the deque: ``[2]``
                # a function's own variable, or an item of a tuple it holds (``ret = model(x, *mems)``: made by
                # this call, it dies with it; what keeps the tensor is another name, ``mems``)
                bare = source.function and (isinstance(value, tuple) or ("[" not in spelled and "." not in spelled))
                if not bare and (sequence not in holders or simpler(spelled, holders[sequence])):
                    holders[sequence] = spelled
                known = best.get(sequence)
                alike.setdefault(sequence, {})[spelled] = id(tensor)
                if known is None or _better(spelled, kind, known):
                    with unseen_by_subclasses():
                        shape = tuple(tensor.shape)
                    best[sequence] = _Spelling(
                        spelled, node, bare and (known is None or known.local), kind, shape, id(tensor)
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


def _in_a_framework(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs an installed package's code other than torch's (a trainer's loop, accelerate's
    ``backward``): the learner's frame it returns to called into a library that runs their step."""
    package = str(frame.f_globals.get("__name__", "")).partition(".")[0]
    return package not in ("torch", "backward_twice") and "-packages" in frame.f_code.co_filename


@dataclass(frozen=True, slots=True)
class _Namespace:
    """A namespace searched for names: the code it belongs to (None: the harness's roots), whether it is a
    module's globals, the names, and whether they are a function frame's own variables (rebound at each call)."""

    frame: CodeSite | None
    is_global: bool
    names: dict[str, Any]
    function: bool
    outside: bool = False  # a function's frame that runs the call holding the whole loop (its variables last)


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


_SAME_NAMES = 8  # other names of one tensor kept
_NOT_NAMES = (types.ModuleType, type, types.FunctionType)  # what a namespace names that holds no state of the loop


def _grows_in_place(value: Any, depth: int = 0) -> bool:
    """Whether a function's variable can hold more graphs at each pass while it keeps its value: a list, or an
    object whose attributes do (grad-cam's ``ActivationsAndGradients``); a dict of a pass's values (a step's
    outputs) is rebuilt each pass, and gains keys as the first passes run, unless it holds lists (a history kept as
    ``defaultdict(list)``, whose lists grow), itself or in a dict it holds (``state["stats"]["fields"]``)."""
    if isinstance(value, dict):
        return any(
            isinstance(item, (list, collections.deque)) or (depth < 2 and _grows_in_place(item, depth + 1))
            for item in itertools.islice(value.values(), 64)
            if isinstance(item, (list, collections.deque, dict))
        )
    return isinstance(value, list) or not isinstance(value, (torch.Tensor, tuple, *ATOM_TYPES))
