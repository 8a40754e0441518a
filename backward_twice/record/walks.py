"""What one backward call walked: its record, and the stamps it leaves on the nodes that hold saved tensors.

Each walked node gets a stamp in its ``node.metadata`` under a recorder's own key: the last call that walked it and
whether that call kept the buffers. The stamp dies with the graph, so nothing here holds a node or a tensor between
calls. Whether a node saved tensors (a ``_raw_saved_*`` attribute with data, read without unpacking, so PyTorch's
version check stays on) is read only when a node is walked again: that is when it matters, and the first walk of
every node of every iteration stays cheap. From the stamps, :func:`stamp_walk` tells which earlier call's kept
buffers a call walked (that retain was needed), the first node an earlier call had freed, and the nodes built
before the call's iteration (and, of those, the frontier: the old nodes a new node points to). Which calls' walks
are read at all is :class:`WalkSampling`'s: past the first calls, a plain line's at some calls only.

Used by :mod:`backward_twice.record.evidence`, :mod:`backward_twice.record.folds`, :mod:`backward_twice.record.held`
and :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.autograd.graph import Node

from backward_twice.record.saved import changed_in_place, has_saved_data, python_walk, saves_tensors

__all__ = [
    "RAISES_AT_THE_CALL",
    "SECOND_TIME",
    "CallRecord",
    "CallsSoFar",
    "FreedEarlier",
    "WalkSampling",
    "kept",
    "node_of",
    "read_walk",
    "record_of",
    "stamp_walk",
    "stamped",
    "walk_now",
]

SECOND_TIME = (  # PyTorch's own message, raised with keep_buffers where the code as written raises it
    "Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed). Saved intermediate values of the graph are freed when you call .backward() "
    "or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time "
    "or if you need to access saved tensors after calling backward."
)
_sequence_nr = torch._C._autograd._get_sequence_nr  # the engine's node counter
_LEAF_SEQ = 2**63  # AccumulateGrad nodes carry 2**64 - 1


class CallsSoFar(Protocol):
    """What :func:`stamp_walk` reads of the calls before one (a :class:`backward_twice.record.folds.CallLog`): a
    kept call's record, or a note that a folded one's buffers were needed later."""

    def record(self, index: int) -> CallRecord | None: ...

    def needed_later(self, index: int, by: int) -> None: ...


_MAX_OLD = 100_000  # nodes of maybe earlier iterations kept per call
_MAX_KEPT = 256  # nodes whose kept buffers a call walked, listed for its error's evidence (emptied when it returns)


@dataclass(frozen=True)
class FreedEarlier:
    """The first node a call walked that an earlier call had freed: its position in the walk, and that call."""

    position: int
    freed_by: int


@dataclass(slots=True)
class CallRecord:
    """One backward or ``torch.autograd.grad`` call as it ran."""

    index: int
    site: tuple[str, int]  # (file, line) of the learner's line
    line: str  # "file:line: code"
    function: str  # "backward" or "grad"
    retain_graph: bool  # what the engine was given: as written, else create_graph
    create_graph: bool
    inputs: int  # how many tensors inputs= named (0: none)
    start: int  # the sequence counter when the call began, and when it ended
    end: int = 0
    event: int = 0  # how many events (optimizer steps, marks) came before it
    walked: int = 0
    held_after_bytes: int = 0  # measured at a line's first 4 retaining calls, then at its 8th, 16th, ...
    # (empty tuples until there is something: a long run keeps one small record per call)
    needed_by: list[int] | tuple[int, ...] = ()  # later calls that walked buffers this one kept
    frontier: tuple[int, ...] = ()  # of ``old``, those a new node points to
    old: list[int] | tuple[int, ...] = ()  # sequence numbers of walked nodes built before the call's iteration (or
    # its last event): what a later rule may call an earlier iteration
    again: list[int] | tuple[int, ...] = ()  # of ``old``, those an earlier call walked too
    error: str | None = None
    first_freed: FreedEarlier | None = None
    read: bool = True  # its walk was read and stamped (:class:`WalkSampling`)
    # the position of the first node of its walk an earlier call walked without retaining, saved tensors or none
    # (with keep_buffers, ``first_freed`` is the first that saved some: where the engine as written raises)
    first_walked_again: int = -1
    # the nodes it walked whose buffers an earlier call kept (sequence numbers): read if it raises, emptied when it
    # returns (kept for the error's evidence only)
    walked_kept: list[int] | tuple[int, ...] = ()
    # the nodes it walked that the call of ``first_freed`` freed and that saved tensors (sequence numbers): where the
    # walk reaches freed buffers, the first and others past it (two losses each reading the other's output)
    freed_seen: list[int] | tuple[int, ...] = ()


def record_of(
    index: int, site: tuple[str, int], line: str, args: tuple[Any, ...], kwargs: dict[str, Any], event: int
) -> CallRecord:
    """The record of call ``index`` at the learner's ``site`` (``line``) from what the engine entry was given:
    ``args`` (grad_tensors, keep_graph, create_graph, inputs, ...) and ``kwargs`` (``accumulate_grad``: False for
    ``torch.autograd.grad``), ``event`` the optimizer steps and marks so far; it begins at the node counter now."""
    given = len(args)
    keep = bool(args[1]) if given > 1 else bool(kwargs.get("keep_graph", False))
    create = bool(args[2]) if given > 2 else bool(kwargs.get("create_graph", False))
    inputs = args[3] if given > 3 else kwargs.get("inputs", ())
    function = "backward" if kwargs.get("accumulate_grad", True) else "grad"
    count = 0 if inputs is None else len(inputs)
    return CallRecord(index, site, line, function, keep, create, count, _sequence_nr(), 0, event)


# A walked node's stamp in its ``metadata`` (under a recorder's key): (the last call that walked it, whether that call
# kept the buffers). A tuple, not an object: every node of every backward call gets one.
_Stamp = tuple[int, bool]


def stamp_walk(
    key: str,
    calls: CallsSoFar,
    call: CallRecord,
    order: list[Node],
    boundary: int,
    on_leaf: Callable[[torch.Tensor], None] | None = None,
    keep_buffers: bool = False,
) -> bool:
    """Stamp (under ``key``) the nodes ``call`` walks that hold saved tensors; note in ``calls`` the buffers an
    earlier call kept, and the nodes built before ``boundary`` (the call's iteration's start). ``on_leaf`` sees each
    leaf before it accumulates. True where, with ``keep_buffers`` (every call made to retain), the code as written
    would have raised: the walk reaches a node an earlier non-retaining call walked."""
    leaves = 0
    needs: set[int] = set()
    mine: _Stamp = (call.index, call.retain_graph)  # what the engine was given: create_graph=True with an explicit
    # retain_graph=False frees the buffers
    for node in order:  # every node of every call: the position and count are worked out where they are needed
        sequence = node._sequence_nr()
        if sequence >= _LEAF_SEQ:
            leaves += 1
            if on_leaf is not None:
                leaf = getattr(node, "variable", None)  # an AccumulateGrad node's
                if isinstance(leaf, torch.Tensor):
                    on_leaf(leaf)  # before it accumulates: a leaf the caller could not name
            continue
        if sequence < boundary and len(call.old) < _MAX_OLD:
            if not isinstance(call.old, list):
                call.old = []
            call.old.append(sequence)
        metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict attribute, not a method
        stamp: _Stamp | None = metadata.get(key)
        metadata[key] = mine
        if stamp is None:  # a node first walked: stamped whatever it saved (read only if it is walked again)
            continue
        if sequence < boundary and len(call.again) < _MAX_OLD:
            if not isinstance(call.again, list):
                call.again = []
            call.again.append(sequence)
        # A node walked again: what an earlier call did to it matters only if it holds (or held) saved tensors. As
        # written, a node an earlier call freed raises in the engine itself when it held some; with keep_buffers
        # its buffers are still there to tell.
        earlier, kept_then = stamp
        if not kept_then and call.first_walked_again < 0:
            call.first_walked_again = next(i for i, walked in enumerate(order) if walked is node)
        if not kept_then and call.first_freed is None and (not keep_buffers or has_saved_data(node)):
            position = next(i for i, walked in enumerate(order) if walked is node)
            call.first_freed = FreedEarlier(position, earlier)
            # as written, a node the engine runs first whose saved tensor was changed in place raises PyTorch's
            # in-place error before this one is reached: with its buffers kept, the engine raises it itself
            if keep_buffers and not any(changed_in_place(before) for before in order[:position]):
                metadata[key] = stamp  # as written the engine stops here: this call walks it no further
                call.walked = position + 1 - leaves
                call.frontier = _frontier(order, boundary) if call.old else ()
                call.freed_seen = [sequence, *_freed_past(order[position + 1 :], key, earlier)]
                return True
        if not kept_then and call.first_freed is not None and earlier == call.first_freed.freed_by:
            _note_freed(call, node, sequence)
        if kept_then and earlier not in needs and has_saved_data(node):
            needs.add(earlier)
        if kept_then and len(call.walked_kept) < _MAX_KEPT:
            if not isinstance(call.walked_kept, list):
                call.walked_kept = []
            call.walked_kept.append(sequence)
    call.walked = len(order) - leaves
    call.frontier = _frontier(order, boundary) if call.old else ()
    for previous in needs:
        earlier_call = calls.record(previous)
        if earlier_call is None:  # folded: a long run's older iteration, counted with its line's retains
            calls.needed_later(previous, call.index)
            continue
        if not isinstance(earlier_call.needed_by, list):
            earlier_call.needed_by = []
        earlier_call.needed_by.append(call.index)
    return False


def _note_freed(call: CallRecord, node: Node, sequence: int) -> None:
    """Note in ``call.freed_seen`` a node the call of its ``first_freed`` freed, if it saved tensors (by its kind:
    freed, they cannot be read)."""
    if len(call.freed_seen) < _MAX_KEPT and saves_tensors(node):
        if not isinstance(call.freed_seen, list):
            call.freed_seen = []
        call.freed_seen.append(sequence)


def _freed_past(order: list[Node], key: str, freer: int) -> list[int]:
    """The nodes of ``order`` (the rest of a walk the engine as written stops before) whose stamp says call
    ``freer`` freed them, and that still hold saved tensors (with keep_buffers nothing is freed)."""
    found = []
    for node in order:
        stamp: _Stamp | None = _metadata(node).get(key)
        if stamp is not None and stamp == (freer, False) and has_saved_data(node):
            found.append(node._sequence_nr())
            if len(found) >= _MAX_KEPT:
                break
    return found


def stamped(node: Node, key: str) -> bool:
    """Whether a call of the recorder stamping under ``key`` walked ``node``."""
    return key in _metadata(node)


def kept(node: Node, key: str) -> bool:
    """Whether ``node`` still has its buffers: no call stamping under ``key`` walked it, or the last one kept them."""
    stamp: _Stamp | None = _metadata(node).get(key)
    return stamp is None or stamp[1]


def _frontier(order: list[Node], boundary: int) -> tuple[int, ...]:
    """The old nodes a new node points to: where this iteration's graph meets an earlier one (an LSTM cell's old h
    and old c both; not what lies under them)."""
    edges: set[int] = set()
    for node in order:
        sequence = node._sequence_nr()
        if boundary <= sequence < _LEAF_SEQ:
            children = (child._sequence_nr() for child, _ in node.next_functions if child is not None)
            edges.update(s for s in children if s < boundary)
    return tuple(sorted(edges))


def _metadata(node: Node) -> dict[str, Any]:
    """A node's ``metadata`` dict (an attribute of every C++ node; torch's ``Node`` declares it a method)."""
    metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict attribute, not the stub's method
    return metadata


def node_of(output: Any) -> Node | None:
    node = getattr(output, "grad_fn", None)
    if node is None and hasattr(output, "node"):  # a GradientEdge
        node = output.node
    return node


def read_walk(outputs: Any, look: Callable[[list[Node]], None]) -> Any:
    """Give ``look`` the nodes a backward from ``outputs`` walks. One root: the engine's own list, read in a prehook
    on it as the engine starts (which needs multithreading off), and the hook's handle is returned, to remove after
    the call; several: a walk over ``next_functions`` now (and None)."""
    roots = _roots(outputs)
    if len(roots) == 1 and hasattr(roots[0], "register_prehook"):
        # torch's stub lacks this private binding: the engine's own list of the nodes it will run
        return roots[0].register_prehook(lambda grads: look(torch._C._current_graph_task_execution_order()))  # type: ignore[attr-defined]
    if roots:
        try:
            look(python_walk(roots))
        except RuntimeError as error:  # keep_buffers, where the step as written raises: before the engine runs,
            if str(error) != SECOND_TIME:  # so the call itself raises it (:data:`RAISES_AT_THE_CALL`)
                raise
            return RAISES_AT_THE_CALL
    return None


class _RaisesAtTheCall:
    """The handle :func:`read_walk` gives for several roots whose walk found where the step as written raises."""

    def remove(self) -> None:
        """Nothing to remove: no hook was registered."""


RAISES_AT_THE_CALL = _RaisesAtTheCall()


def walk_now(outputs: Any, look: Callable[[list[Node]], None]) -> None:
    """Give ``look`` the nodes a graph reaches from ``outputs``, over ``next_functions``: after a backward that was
    not walked raised (its error's evidence reads the walk)."""
    roots = _roots(outputs)
    if roots:
        look(python_walk(roots))


def _roots(outputs: Any) -> list[Node]:
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [root for root in map(node_of, outputs) if root is not None]


class WalkSampling:
    """Which backward calls' walks are read. Reading one costs a Python object per node: on a small model, a third
    of the backward itself. A line builds the same graph at each call, so past the first calls a plain line is read
    at some calls only, as the names are read at some passes only:

    * every call while the line tracer follows the loop's first passes, every call of a run that called a retaining
      backward (a later call may walk what it kept: that is when its retain was needed), and every call of a line
      once a walk of it reached a node of an earlier iteration or call;
    * else a line's first 4 calls, its 8th, 16th, ..., and each call after its iteration built a different number of
      nodes than at the line's last call read (a graph of another shape: a branch taken, something kept aside).

    A call not read walks no node of an earlier call (its line's walks did not, and nothing was kept); if it raises,
    the graph is walked then (:func:`walk_now`), for the error's evidence."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, int], int] = {}  # a line -> its calls so far (-1: read at every call)
        self._built: dict[tuple[str, int], int] = {}  # a line -> the nodes built in the iteration before its last read
        self.retained = False

    def due(self, call: CallRecord, every: bool, boundary: int) -> bool:
        """Whether ``call``'s walk is read (``every``: read every call, as while the line tracer follows the loop's
        passes; ``boundary``: the node counter where its iteration started). A call not read is marked so: if it
        raises, its graph is walked then, with :func:`walk_now`."""
        built = call.start - boundary
        if self._due(call, built) or every:
            self._built[call.site] = built
            return True
        call.read = False
        return False

    def _due(self, call: CallRecord, built: int) -> bool:
        if call.retain_graph:
            self.retained = True
        count = self._calls.get(call.site, 0)
        if count < 0:
            return True
        count = self._calls[call.site] = count + 1
        return self.retained or count <= 4 or count & (count - 1) == 0 or self._built.get(call.site) != built

    def walked(self, call: CallRecord) -> None:
        """After a call whose walk was read: a line whose walk reached back is read at every call from now on."""
        if call.old or call.first_freed is not None:
            self._calls[call.site] = -1
