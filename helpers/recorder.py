"""The recorder: watch a learner's loop run as written and keep what the verdicts need, with nothing re-run.

:class:`Recorder` enters through :func:`helpers.learner.intercepting` (the one place that patches torch) and keeps:

* every backward and ``torch.autograd.grad`` call: the learner's line (:func:`helpers.learner.learner_line`), its
  ``retain_graph`` (as written), ``create_graph`` and ``inputs``, and what it walked. What a backward walks is
  the engine's own list (``torch._C._current_graph_task_execution_order()``, read in a prehook on the root with
  multithreading off; several roots: a walk over ``next_functions``). Each walked node that holds saved tensors
  (a ``_raw_saved_*`` attribute with data, read without unpacking, so PyTorch's version check stays on) gets
  a stamp in its ``node.metadata``: the last call that walked it and whether that call kept the buffers. The
  stamp dies with the graph: the recorder holds no node and no tensor between calls;
* the bytes the walked graph still holds after each call, counted as the saved-tensor meter counts them (one
  storage once, and only when the graph alone holds it);
* iterations: PyTorch's global optimizer step hooks, :meth:`Recorder.next_iteration`, or, without either, a new
  iteration at each call of the first backward line (:mod:`helpers.verdicts` decides which, afterwards, from
  the events kept here). Which iteration built a node comes from its ``_sequence_nr()`` against the engine's
  counter (``torch._C._autograd._get_sequence_nr()``) read at each event;
* the names that hold tensors with a graph at each event (the learner's frames, their globals, attributes of
  the modules and objects they hold, items of lists, tuples and dicts), so a verdict names the learner's own
  variable and the line that assigned it;
* the error a backward raised, with the call that freed the buffers it needed, or the optimizer step that changed
  a saved tensor in place.

With ``keep_buffers=True`` (the step tools' runs) every call keeps its buffers and the recorder raises PyTorch's own
error where the step as written would (a walk through a node a non-retaining call already walked): the runs
behave as written, and a graph built before the step is still usable afterwards.

Used by :mod:`helpers.harness`, :mod:`helpers.verdicts` and :mod:`helpers.watcher`.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import types
import weakref
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import Node

from helpers.iterations import EventKey, IterationEnd, StepEvent, split_iterations
from helpers.learner import first_line, intercepting, learner_line, raised_at, skipped_dirs
from helpers.lines import CreationLines
from helpers.names import CodeSite, NamedGraph, names_holding_graphs, simpler, site_of, unstepped_optimizers
from helpers.saved import graph_only_bytes, has_saved_data, python_walk, saved_data

__all__ = ["CallRecord", "ErrorRecord", "FreedEarlier", "HeldGraph", "Recorder", "StopRecording"]

STAMP, _RECORDERS = "backward_twice.recorder", itertools.count(1)  # each recorder stamps under STAMP.<n>
SECOND_TIME = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed). Saved intermediate values of the graph are freed when you call .backward() "
    "or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time "
    "or if you need to access saved tensors after calling backward."
)
_LEAF_SEQ = 2**63  # AccumulateGrad nodes carry 2**64 - 1
_MAX_OLD, _MAX_NAMES = 100_000, 50_000  # nodes of maybe earlier iterations kept per call; names kept


class StopRecording(BaseException):
    """Raised at the end of the iteration a recorder was told to stop after; :func:`helpers.watcher.watch` swallows
    it. Not an Exception: the learner's own ``except Exception`` must not catch it."""


@dataclass(frozen=True)
class FreedEarlier:
    """The first node a call walked that an earlier call had freed: its position in the walk, and that call."""

    position: int
    freed_by: int


@dataclass
class CallRecord:
    """One backward or ``torch.autograd.grad`` call as it ran."""

    index: int
    site: tuple[str, int]  # (file, line) of the learner's line
    line: str  # "file:line: code"
    function: str  # "backward" or "grad"
    retain_graph: bool  # as written (create_graph implies it)
    create_graph: bool
    inputs: int  # how many tensors inputs= named (0: none)
    start: int  # the sequence counter when the call began, and when it ended
    end: int = 0
    event: int = 0  # how many events (optimizer steps, marks) came before it
    walked: int = 0
    saved_nodes: int = 0
    held_after_bytes: int = 0
    needed_by: list[int] = field(default_factory=list)  # later calls that walked buffers this one kept
    frontier: array[int] = field(default_factory=lambda: array("Q"))  # of ``old``, those a new node points to
    old: array[int] = field(default_factory=lambda: array("Q"))  # sequence numbers of walked nodes built before
    # the call's last event: what a later rule may call an earlier iteration
    error: str | None = None
    first_freed: FreedEarlier | None = None


@dataclass
class ErrorRecord:
    """The error a call (or the loop) raised: its first line, the learner's line, the call (None: not a backward),
    and the recorder's evidence: the call that freed the buffers needed, the name it was reached through, the
    optimizer step that changed a saved tensor in place."""

    message: str
    line: str
    call: int | None = None
    freed_by: int | None = None
    reached_through: NamedGraph | None = None
    changed_by_step: str | None = None


@dataclass(frozen=True)
class HeldGraph:
    """A graph the loop held into an iteration: when it first did (a sighting), its graph-only bytes, its holder."""

    sighting: int
    graph_bytes: int
    holder: str


@dataclass(slots=True)
class _Stamp:
    """A walked node's stamp in its ``metadata``: the last call that walked it, and whether it kept the buffers."""

    call: int
    kept: bool


class Recorder:
    """Watches backward calls and optimizer steps while inside ``with recorder:`` (see the module's docstring).

    ``iterations``: raise :class:`StopRecording` once that many iterations ended. ``keep_buffers``: keep every
    graph's buffers and raise PyTorch's error where the code as written would. ``roots``: extra (name, object)
    pairs to look for named tensors in (a step's closure and globals), as a function called at each event."""

    def __init__(
        self,
        iterations: int | None = None,
        keep_buffers: bool = False,
        roots: Callable[[], list[tuple[str, Any]]] | None = None,
        on_leaf: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        if iterations is not None and (
            isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1
        ):
            raise ValueError(f"watch: iterations must be a whole number from 1 up (or None), got {iterations!r}")
        self.iterations, self.keep_buffers, self.roots, self.on_leaf = iterations, keep_buffers, roots, on_leaf
        self.before_step: Callable[[torch.optim.Optimizer], None] | None = None  # called before each step()
        self.by_runs = False  # a harness's runs of a step: each run is one iteration, whatever steps inside
        self.outermost: types.FrameType | None = None  # a tool's frame: names beyond it are its caller's
        self.roots_where: CodeSite | None = None  # the code the roots' names belong to (a step's)
        self.calls: list[CallRecord] = []
        self.steps: list[StepEvent] = []
        self.optimizer_kinds: dict[int, str] = {}
        # to read their parameters if an error needs them
        self._optimizers: dict[int, weakref.ref[torch.optim.Optimizer]] = {}
        self.marks: list[IterationEnd] = []  # where next_iteration() was called
        self.names: dict[int, NamedGraph] = {}  # node sequence number -> the name that held it
        self.held_from: dict[int, HeldGraph] = {}  # node sequence number -> when and how the loop first held it
        self.sightings: list[int] = []  # the sequence counter at each time names were read
        self.carriers: dict[int, str] = {}  # node -> the name that held it at an iteration's start
        self.event_sightings: dict[EventKey, int] = {}  # an event -> its sighting
        self.starts: list[int] = []  # of those, the ones at an iteration's start (a loop header after an event)
        self.error: ErrorRecord | None = None
        self.creation = CreationLines()  # which learner's line built each node
        self.pending: list[str] = []  # optimizers the code names that never stepped before the error
        self.start = self.finish = 0
        self.stopped = False
        self._key = f"{STAMP}.{next(_RECORDERS)}"  # another recorder's stamps (an earlier watch) mean nothing here
        self._lines: dict[tuple[str, int], str] = {}
        self._skipped = skipped_dirs()
        self._context: Any = None
        self._depth = 0

    # -- entering and leaving ------------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        self.start = torch._C._autograd._get_sequence_nr()
        self._context = intercepting(self._on_backward, self._on_step, self._before_step)
        self._context.__enter__()
        self.starts.append(0)
        self._note_names(sys._getframe(1))  # what the loop starts from: a graph built before it
        self.creation.on_loop_start = self._loop_start
        self.creation.start(sys._getframe(1))
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.finish = torch._C._autograd._get_sequence_nr()
        self.creation.stop()
        self._context.__exit__(None, None, None)
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None:  # the f_locals snapshots that tracing and naming made: none outlives the watch
            if frame.f_code.co_flags & inspect.CO_OPTIMIZED and self.creation.is_learners(frame.f_code):
                frame.f_locals.clear()
            frame = frame.f_back
        if exc is not None and not isinstance(exc, StopRecording) and self.error is None:
            self.record_error(exc)

    def record_error(self, exc: BaseException) -> None:
        """Keep an error the loop raised outside a backward call (a backward's own is kept where it rose)."""
        self.error = ErrorRecord(first_line(exc, 400), raised_at(exc, self._lines))
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        self.pending = unstepped_optimizers(None if tb is None else tb.tb_frame, self._skipped, self.optimizer_kinds)

    # -- iterations ----------------------------------------------------------------------------------------
    def next_iteration(self, between_runs: bool = False) -> None:
        """Mark the end of an iteration (a loop without an optimizer, or with a hand-written update).
        ``between_runs``: called between two calls of a step (the step's frame is gone), so this is also where
        the next iteration starts."""
        self.marks.append(IterationEnd(torch._C._autograd._get_sequence_nr(), len(self.calls)))
        self.event_sightings[("mark", len(self.marks) - 1)] = len(self.sightings)
        if between_runs:
            self.starts.append(len(self.sightings))
            self._note_names(sys._getframe(1))
        else:
            self._event_names(sys._getframe(1))
        self.creation.pending = not between_runs
        self._maybe_stop()

    def iterations_done(self) -> int:
        return split_iterations(self).count

    def _maybe_stop(self) -> None:
        if self.iterations is not None and not self.stopped and self.iterations_done() >= self.iterations:
            self.stopped = True
            raise StopRecording(self.iterations)

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer_kinds.setdefault(id(optimizer), type(optimizer).__name__)
        self._optimizers.setdefault(id(optimizer), weakref.ref(optimizer))
        if self.before_step is not None:
            self.before_step(optimizer)

    def _on_step(self, optimizer: torch.optim.Optimizer) -> None:
        line = learner_line(sys._getframe(1), self._lines, self._skipped)
        self.steps.append(StepEvent(id(optimizer), torch._C._autograd._get_sequence_nr(), len(self.calls), line))
        self.event_sightings[("step", len(self.steps) - 1)] = len(self.sightings)
        self._event_names(sys._getframe(1))
        self.creation.pending = True
        self._maybe_stop()

    @property
    def events(self) -> int:
        return len(self.steps) + len(self.marks)

    # -- backward calls ------------------------------------------------------------------------------------
    def _on_backward(
        self, engine: Callable[..., Any], outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._depth:  # a backward inside a backward (a hook's): the outer call is the learner's
            return engine(outputs, *args, **kwargs)
        keep = bool(args[1]) if len(args) > 1 else bool(kwargs.get("keep_graph", False))
        create = bool(args[2]) if len(args) > 2 else bool(kwargs.get("create_graph", False))
        inputs = args[3] if len(args) > 3 else kwargs.get("inputs", ())
        caller = sys._getframe(1)
        line = learner_line(caller, self._lines, self._skipped)
        site = site_of(caller, self._skipped)
        if self.marks == [] and self.steps == [] and self.calls and self.iterations is not None:
            self._fallback_stop(site, self.iterations)
        call = CallRecord(
            len(self.calls),
            site,
            line,
            "backward" if kwargs.get("accumulate_grad", True) else "grad",
            keep,
            create,
            0 if inputs is None else len(inputs),
            torch._C._autograd._get_sequence_nr(),
            event=self.events,
        )
        self.calls.append(call)
        nodes = [_node_of(o) for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,))]
        roots = [r for r in nodes if r is not None]
        walked: list[Node] = []
        boundary = self._last_event_sequence()

        def look(order: list[Node]) -> None:
            walked.extend(order)
            self._walk(call, order, boundary)

        handle = None
        if len(roots) == 1 and hasattr(roots[0], "register_prehook"):
            handle = roots[0].register_prehook(
                # torch's stub lacks this private binding: the engine's own list of the nodes it will run
                lambda grads: look(torch._C._current_graph_task_execution_order())  # type: ignore[attr-defined]
            )
        elif roots:
            look(python_walk(roots))
        if self.keep_buffers:  # torch passes (grad_tensors, keep_graph, create_graph, inputs, ...) by position
            args = (args[0], True, *args[2:]) if len(args) > 1 else args
        self._depth += 1
        try:
            with torch.autograd.set_multithreading_enabled(False):
                result = engine(outputs, *args, **kwargs)
        except Exception as exc:
            call.error = first_line(exc, 400)
            if self.error is None:
                self.error = self._explain(exc, call, walked, caller)
                self.pending = unstepped_optimizers(caller, self._skipped, self.optimizer_kinds)
            raise
        finally:
            self._depth -= 1
            if handle is not None:
                handle.remove()
            call.end = torch._C._autograd._get_sequence_nr()
        if keep or create:  # without a retain the engine freed every buffer it walked: nothing is held after it
            call.held_after_bytes = graph_only_bytes([n for n in walked if self._key in _metadata(n)])
        walked.clear()  # the recorder holds no node between calls
        if not self.steps and not self.marks:
            self.event_sightings[("call", call.index)] = len(self.sightings)
            self._event_names(caller)
            self.creation.pending = True
        return result

    def _walk(self, call: CallRecord, order: list[Node], boundary: int) -> None:
        """Stamp the walked nodes that hold saved tensors; note the buffers an earlier call kept, and the nodes
        built before the call's last event. With keep_buffers, raise where the code as written would."""
        walked = saved_nodes = 0
        needs: set[int] = set()

        def frontier() -> None:
            """The old nodes a new node points to: where this iteration's graph meets an earlier one (an LSTM
            cell's old h and old c both; not what lies under them). Only when there are old nodes at all."""
            if not call.old:
                return
            edges: set[int] = set()
            for node in order:
                sequence = node._sequence_nr()
                if boundary <= sequence < _LEAF_SEQ:
                    edges.update(
                        s
                        for s in (child._sequence_nr() for child, _ in node.next_functions if child is not None)
                        if s < boundary
                    )
            call.frontier = array("Q", sorted(edges))

        for position, node in enumerate(order):
            sequence = node._sequence_nr()
            if sequence >= _LEAF_SEQ:
                leaf = getattr(node, "variable", None)  # an AccumulateGrad node's
                if self.on_leaf is not None and isinstance(leaf, torch.Tensor):
                    self.on_leaf(leaf)  # before it accumulates: a leaf the caller could not name
                continue
            walked += 1
            if sequence < boundary and len(call.old) < _MAX_OLD:
                call.old.append(sequence)
            metadata = _metadata(node)
            stamp: _Stamp | None = metadata.get(self._key)
            if stamp is None:
                if not has_saved_data(node):
                    continue
                metadata[self._key] = _Stamp(call.index, call.retain_graph or call.create_graph)
            else:
                if not stamp.kept and call.first_freed is None:
                    call.first_freed = FreedEarlier(position, stamp.call)
                    if self.keep_buffers:
                        call.walked, call.saved_nodes = walked, saved_nodes + 1
                        frontier()
                        raise RuntimeError(SECOND_TIME)
                if stamp.kept:
                    needs.add(stamp.call)
                stamp.call, stamp.kept = call.index, call.retain_graph or call.create_graph
            saved_nodes += 1
        call.walked, call.saved_nodes = walked, saved_nodes
        frontier()
        for previous in needs:
            self.calls[previous].needed_by.append(call.index)

    def _last_event_sequence(self) -> int:
        """The sequence counter at the last event that may end an iteration: an optimizer step, a mark, or, while
        there is neither, the end of the last call."""
        candidates = [self.start]
        if self.steps:
            candidates.append(self.steps[-1].sequence)
        if self.marks:
            candidates.append(self.marks[-1].sequence)
        if self.calls and len(self.calls) > 1:
            candidates.append(self.calls[-2].end)
        return max(candidates)

    def _fallback_stop(self, site: tuple[str, int], iterations: int) -> None:
        """Without optimizer steps or marks, iteration N ends where the first backward line is called again."""
        first = self.calls[0].site
        if site == first and sum(1 for c in self.calls if c.site == first) >= iterations:
            self.stopped = True
            raise StopRecording(iterations)

    def _explain(
        self, exc: BaseException, call: CallRecord, walked: list[Node], caller: types.FrameType
    ) -> ErrorRecord:
        record = ErrorRecord(first_line(exc, 400), call.line, call.index)
        message = str(exc)
        if "backward through the graph a second time" in message and call.first_freed is not None:
            record.freed_by = call.first_freed.freed_by
            record.reached_through = self._through(walked, call.first_freed.position, call, caller)
        elif "modified by an inplace operation" in message:
            record.changed_by_step = self._step_that_changed(walked, call)
        return record

    def _through(
        self, walked: list[Node], position: int, call: CallRecord, caller: types.FrameType
    ) -> NamedGraph | None:
        """The name closest above the freed node in the walk: kept at an event, or held by a frame now."""
        live = {
            n.sequence: n
            for n, _ in names_holding_graphs(
                caller, self._skipped, self.events, self.roots, sys.gettrace() is not None, self.outermost
            )
        }
        for node in reversed(walked[: position + 1]):
            sequence = node._sequence_nr()
            named = self.names.get(sequence) or live.get(sequence)
            if named is not None:
                return named
        return None

    def _step_that_changed(self, walked: list[Node], call: CallRecord) -> str | None:
        """The learner's line of the last optimizer step whose parameters a walked node saved, if one stepped
        after that node was built."""
        stepped = {step.optimizer: step for step in self.steps}  # each optimizer's last step
        if not stepped:
            return None
        params: dict[int, int] = {}  # a parameter's storage -> the optimizer that steps it
        for optimizer_id in stepped:
            reference = self._optimizers.get(optimizer_id)
            optimizer = reference() if reference is not None else None
            for group in optimizer.param_groups if optimizer is not None else ():
                for p in group["params"]:
                    params[p.untyped_storage().data_ptr()] = optimizer_id
        for node in walked:
            for tensor in saved_data(node) or ():
                owner = params.get(tensor.untyped_storage().data_ptr())
                if owner is not None and stepped[owner].sequence > node._sequence_nr():
                    return stepped[owner].line
        return None

    # -- names ---------------------------------------------------------------------------------------------
    def _event_names(self, frame: types.FrameType) -> None:
        """At an event: with the line tracer on, the names are read where the loop comes round to its header
        instead (what is held there is what can carry a graph into the next iteration); without it, now."""
        if not self.creation.active or self.by_runs:  # a tool's runs: its loop is not the learner's code
            self._note_names(frame)

    def _loop_start(self, frame: types.FrameType) -> None:
        self.starts.append(len(self.sightings))
        self._note_names(frame)

    def _note_names(self, frame: types.FrameType | None) -> None:
        """Keep the names that hold graphs now (the simplest spelling of each node); at an iteration's start, also
        which graphs are held into it, with their graph-only bytes (a note, if no later backward walks them)."""
        sighting = len(self.sightings)
        self.sightings.append(torch._C._autograd._get_sequence_nr())
        at_start = bool(self.starts) and self.starts[-1] == sighting
        for named, node in names_holding_graphs(
            frame, self._skipped, sighting, self.roots, sys.gettrace() is not None, self.outermost, self.roots_where
        ):
            sequence = named.sequence
            known = self.names.get(sequence)
            if known is None:
                if len(self.names) >= _MAX_NAMES:
                    dropped = next(iter(self.names))
                    self.names.pop(dropped)
                    self.held_from.pop(dropped, None)
                self.names[sequence] = named
            elif simpler(named.name, known.name) or (named.name == known.name and known.event == 0):
                self.names[sequence] = named  # a simpler name, or the loop's own frame over the watch's
            if at_start:  # what holds it into the next iteration: the name a carried graph's fix uses
                carrier = named.holder if named.local and named.holder else named.name
                if sequence not in self.carriers or simpler(carrier, self.carriers[sequence]):
                    self.carriers[sequence] = carrier
            if at_start and not named.local and sequence not in self.held_from:  # a function's own variable
                # is rebound at its next call: what the loop holds is in its dicts, objects, modules and globals
                # A node a backward walked without a retain has no buffers left (as written: with keep_buffers the
                # recorder keeps them, so they are left out here the same way).
                alive = [n for n in python_walk([node]) if self._kept(n)]
                self.held_from[sequence] = HeldGraph(sighting, graph_only_bytes(alive), named.holder or named.name)

    def _kept(self, node: Node) -> bool:
        """Whether ``node`` still has its buffers: no call of this recorder walked it, or the last one kept them."""
        stamp: _Stamp | None = _metadata(node).get(self._key)
        return stamp is None or stamp.kept


def _metadata(node: Node) -> dict[str, Any]:
    """A node's ``metadata`` dict (an attribute of every C++ node; torch's ``Node`` declares it a method)."""
    metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict attribute, not the stub's method
    return metadata


def _node_of(output: Any) -> Node | None:
    node = getattr(output, "grad_fn", None)
    if node is None and hasattr(output, "node"):  # a GradientEdge
        node = output.node
    return node
