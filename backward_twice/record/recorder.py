"""The recorder: watch a learner's loop run as written and keep what the verdicts need, with nothing re-run.

:class:`Recorder` enters through :func:`.learner.intercepting` (the one place that patches torch) and keeps:

* every backward and ``torch.autograd.grad`` call: the learner's line (:meth:`.learner.LearnersCode.site`), its
  ``retain_graph`` (as written), ``create_graph`` and ``inputs``, and what it walked: the engine's own list
  (``torch._C._current_graph_task_execution_order()``, read in a prehook on the root with multithreading off; several
  roots: a walk over ``next_functions``), stamped by :func:`.walks.stamp_walk` (the recorder holds no node and no tensor
  between calls), at every call but a plain line's past its first (:class:`.walks.WalkSampling`);
* the bytes the walked graph still holds after a retaining call, counted as the saved-tensor meter counts them (one
  storage once, and only when the graph alone holds it): at a line's first four such calls, then at its 8th, 16th, ...
  (a line builds a graph of the same size each time, and the count walks it);
* iterations: the passes of the learner's own loop (:mod:`.passes`: the line tracer of :mod:`.lines` for the first
  passes, then their first events); without one, the evidence (:mod:`.iterations`). Which iteration built a node comes
  from its ``_sequence_nr()`` against the engine's counter at each pass start (torch.compile's own calls are none of the
  loop's);
* the names that hold tensors with a graph at the start of iterations 1 to 4, then of the 8th, 16th, ... (the learner's
  frames, their globals, attributes of the modules and objects they hold, items of lists, tuples and dicts), so a
  verdict names the learner's own variable and the line that assigned it;
* the error a backward raised, with the call that freed the buffers it needed, or the optimizer step that changed a
  saved tensor in place (:mod:`.evidence`).

Over a long run, the records of older iterations (passes, or optimizer steps) that walked nothing of an earlier one fold
into counts (:mod:`.folds`): a watch's memory stays bounded; the verdicts read counts and records.

``iterations=N`` ends the run at the top of pass N+1 of the learner's loop, before its first statement (a
:class:`StopRecording` raised there, outside any ``try`` of the body), with what taking its item changed put back;
without a loop of theirs, a framework's loop is asked to end after step N (the stop then comes where the learner's call
into it, ``trainer.fit(...)``, returns), else the run stops at the next call of their step function, backward or step
(:mod:`.pass_stops`, :mod:`.stops`); a framework's iterations are its optimizer steps (gradient accumulation: several
backward calls each), never the calls of the first backward's line.

The recorder never breaks the loop it watches: every hook and trace function is guarded, and an error of its own
switches it off for the rest of the run (:attr:`Recorder.failure` says why); the loop goes on as bare Python would.

With ``keep_buffers=True`` (the step tools' runs) every call keeps its buffers, and the recorder raises PyTorch's own
error where the step as written would: the runs behave as written, and a graph built before them stays usable.

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.loop_body`,
:mod:`backward_twice.judge.verdicts`, :mod:`backward_twice.steps.harness` and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

import functools
import itertools
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.graph import Node

from backward_twice.common.error_kinds import about_autograd, error_kind
from backward_twice.record import forks, optimizers, pass_stops, stops, walks
from backward_twice.record.events import EventKey, Failure, IterationEnd, OptimizerKeys, StepEvent
from backward_twice.record.evidence import ErrorRecord, explain, outside_the_loop, raised_at, raised_in
from backward_twice.record.folds import CallLog, Folder, StepFolder, steps_kept
from backward_twice.record.held import Growth, HeldGraph, event_names, names_read_due, note_names
from backward_twice.record.inside import InsideCalls
from backward_twice.record.iterations import iteration_start, split_iterations
from backward_twice.record.learner import first_line, intercepting, learners_code, skipped_dirs
from backward_twice.record.lines import LineTracer
from backward_twice.record.loops import Loop
from backward_twice.record.names import CodeSite, NamedGraph, unstepped_optimizers
from backward_twice.record.nesting import CaughtErrors, Nesting
from backward_twice.record.passes import IterationLoop, PassStart
from backward_twice.record.saved import graph_only_bytes
from backward_twice.record.sources import refresh
from backward_twice.record.stops import StopRecording
from backward_twice.record.unseen import hooks_unseen
from backward_twice.record.walks import SECOND_TIME, CallRecord, WalkSampling, record_of, stamp_walk, stamped

__all__ = ["Failure", "Growth", "HeldGraph", "Recorder", "StopRecording"]

_sequence_nr = torch._C._autograd._get_sequence_nr  # the engine's node counter: read at every event
STAMP, _RECORDERS = "backward_twice.recorder", itertools.count(1)  # each recorder stamps under STAMP.<n>


class Recorder:
    """Watches backward calls, optimizer steps and the learner's loop in ``with recorder:`` (the module's docstring).

    ``iterations``: stop after that many. ``keep_buffers``: keep every graph's buffers and raise PyTorch's error
    where the code as written would. ``roots``: extra (name, object) pairs to look for named tensors in (a step's
    closure and globals), as a function called at each event."""

    def __init__(
        self,
        iterations: int | None = None,
        keep_buffers: bool = False,
        roots: Callable[[], list[tuple[str, Any]]] | None = None,
        on_leaf: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        if iterations is not None and (type(iterations) is not int or iterations < 1):  # a bool is not a count
            raise ValueError(f"watch: iterations must be a whole number from 1 up (or None), got {iterations!r}")
        self.iterations, self.keep_buffers, self.roots, self.on_leaf = iterations, keep_buffers, roots, on_leaf
        self.before_step: Callable[[torch.optim.Optimizer], None] | None = None  # called before each step()
        self.by_runs = False  # a harness's runs of a step: each run is one iteration, whatever steps inside
        self.outermost: types.FrameType | None = None  # a tool's frame: names beyond it are its caller's
        self.boundary: types.FrameType | None = None  # the frame whose `with` started the watch (its caller's)
        self.roots_where: CodeSite | None = None  # the code the roots' names belong to (a step's)
        self.calls = CallLog()  # a long run's older plain iterations are folded into counts (.folds)
        self._folder, self.step_folder = Folder(), StepFolder()  # a loop's passes; the steps, without one
        self.steps: list[StepEvent] = []
        self.optimizer_key = OptimizerKeys()  # the records' key of each optimizer (never a dead one's id)
        self.optimizer_kinds, self.optimizers_seen = self.optimizer_key.kinds, self.optimizer_key.seen
        self.marks: list[IterationEnd] = []  # where next_iteration() was called
        self.names: dict[int, NamedGraph] = {}  # node sequence number -> the name that held it
        self.held_from: dict[int, HeldGraph] = {}  # node sequence number -> when and how the loop first held it
        self.sightings: list[int] = []  # the sequence counter at each time names were read
        self.carriers: dict[int, list[str]] = {}  # node -> the names that held it at an iteration's start
        self.growth: dict[str, Growth] = {}  # a name whose count of graphs held at an iteration's start grew
        self.held_per_name: dict[str, int] = {}  # how many graphs each name was followed into
        self.full: dict[str, list[frozenset[int]]] = {}  # a deque full of graphs -> the nodes it held at starts
        self.filling: dict[str, tuple[int, frozenset[int], int]] = {}  # a deque not full: maxlen, nodes, items
        self.event_sightings: dict[EventKey, int] = {}  # an event -> its sighting
        self.starts: list[int] = []  # of those, the ones at an iteration's start
        self.error: ErrorRecord | None = None
        self.failure: Failure | None = None  # set when the recorder failed and switched itself off
        self.pending: list[str] = []  # optimizers the code names that never stepped before the error
        self.start, self.finish, self.stopped, self.inside = 0, 0, False, InsideCalls()
        self.stop_pass: PassStart | None = None  # the pass that never ran: where the last watched one ended
        self.skipped = skipped_dirs()
        learners = self.is_learners = learners_code(self.skipped)
        counter = torch._C._autograd._get_sequence_nr
        at_header = functools.partial(pass_stops.at_header, self)
        self.creation = LineTracer(counter, learners, self._pass_started, self.fail, at_header, learners.file)
        self.loop = IterationLoop(self.is_learners, optimizers.is_optimizer)
        self.key = f"{STAMP}.{next(_RECORDERS)}"  # another recorder's stamps (an earlier watch) mean nothing here
        self._lines: dict[tuple[str, int], str] = {}
        self._context: Any = None
        self._unseen: Any = None
        self._depth = self._boundary_line = 0
        self.off = False  # switched off by an error of its own (failure) or in a forked child
        forks.watching(self)
        self._last_event_end = 0  # the node counter at the end of the last event (a pass the tracer missed begins here)
        self._gap = 1  # the most passes from one with an event to the next one with an event, so far
        self.first_steps: dict[int, int] = {}  # optimizer -> the position of its first step
        self.step_counts: dict[int, int] = {}
        self._events = self.first_line_calls = 0  # optimizer steps and marks; backward calls at the first one's line
        self.first_site: tuple[str, int] | None = None
        self._retains_at: dict[tuple[str, int], int] = {}  # retaining calls per line so far
        self.sampling = WalkSampling()  # which calls' walks are read: all with keep_buffers or on_leaf
        # iterations=N without a loop of the learner's: a framework's loop asked to end, else before the step function
        self.step_call, self.framework_stop = stops.StepCallStop(), stops.FrameworkStop()
        self.taken = stops.TakenItem()  # what pass N+1's header changed as it took its item: put back at the stop
        self.nesting, self.caught = Nesting(), CaughtErrors()  # a tool of the learner's inside; an error it caught

    # -- entering and leaving ------------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        refresh()  # a script may have changed since an earlier watch read its loops
        self.nesting.enter(self)  # a script's own bt.watch or bt.diagnose under the command: it records alone
        self.start = self._last_event_end = torch._C._autograd._get_sequence_nr()
        caller = sys._getframe(1)
        if self.boundary is None:
            self.boundary = caller
        self._boundary_line = self.boundary.f_lineno
        before = self._before_step if self.iterations is not None or self.before_step is not None else None
        self._context = intercepting(self._on_backward, self._on_step, before)  # a hook less at every step
        self._context.__enter__()
        self._unseen = hooks_unseen()  # the tracer's and the stops' hooks: not the learner's sys.gettrace()'s
        self._unseen.__enter__()
        try:
            self.starts.append(0)
            note_names(self, caller)  # what the loop starts from: a graph built before it
            self.creation.start(caller)
            if self.by_runs:
                self.loop.unusable = "a tool's runs of a step"
        except Exception as error:
            self.fail("starting", error)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.finish = torch._C._autograd._get_sequence_nr()
        self.creation.stop()
        self.step_call.disarm()
        self.taken.forget()
        self.stopped = self.framework_stop.put_back() or self.stopped
        self._context.__exit__(None, None, None)
        self._unseen.__exit__(None, None, None)
        self.is_learners.let_go(sys._getframe(1))
        self.boundary = None  # a frame holds its variables: none is kept past the watch
        self.nesting.leave(self, sys._getframe(1))
        if isinstance(exc, Exception) and self.error is None:
            try:
                self.record_error(exc)
            except Exception as error:
                self.fail("reading the loop's error", error)
        if exc is not None:
            self.caught.let_out(exc)
        again = self.caught.raised_again_as  # an error of no autograd kind, raised again as another: that one ended
        if isinstance(again, Exception) and self.error is not None and error_kind(self.error.message) == "other":
            try:  # the loop (``raise ValueError("bad batch") from error``)
                self.record_error(again)
            except Exception as error:
                self.fail("reading the loop's error", error)
        if self.caught.caught(len(self.calls)) and self.error is not None:
            self.error.caught = True  # a backward raised it, and the loop went on past it

    def fail(self, where: str, error: BaseException) -> None:
        """Switch off for the rest of the run: the learner's code goes on as bare Python would."""
        if self.failure is None:
            self.failure = Failure(where, first_line(error, 200), len(self.calls))
        self.off = True
        self.creation.stop()

    def record_error(self, exc: BaseException) -> None:
        """Keep an error the loop raised outside a backward call (a backward's own is kept where it rose)."""
        after = (  # an autograd error the tools judge is a training error, raised in the passes or around them (an
            bool(self.loop.iteration_passes())  # average of weights in the epoch loop, outside the batch loop)
            and outside_the_loop(exc, self.loop.innermost)
            and not about_autograd(first_line(exc, 400))
        )
        self.error = ErrorRecord(first_line(exc, 400), raised_at(exc, self._lines), after_the_loop=after)
        if not after and not self.by_runs:  # a pass that raised before its first event is a pass too
            self.loop.saw_error(list(traceback.walk_tb(exc.__traceback__)), self.calls.count, self._last_event_end)
        self.pending = unstepped_optimizers(raised_in(exc), self.skipped, self.optimizer_key.live_ids())

    # -- iterations ----------------------------------------------------------------------------------------
    def next_iteration(self, between_runs: bool = False) -> None:
        """Mark the end of an iteration (a loop of no statement of yours, or none this watch can read).
        ``between_runs``: called between two calls of a step (the step's frame is gone), so this is also where
        the next iteration starts."""
        if self.off:
            return
        try:
            self.marks.append(IterationEnd(torch._C._autograd._get_sequence_nr(), len(self.calls), len(self.marks) + 1))
            self._events += 1
            self.event_sightings[("mark", len(self.marks) - 1)] = len(self.sightings)
            if between_runs:
                self.starts.append(len(self.sightings))
                note_names(self, sys._getframe(1))
            else:
                event_names(self, sys._getframe(1))
        except Exception as error:
            self.fail("a mark of next_iteration()", error)
            return
        without_a_loop = self.loop.innermost is None and not self.by_runs
        if self.iterations is not None and not self.stopped and without_a_loop and len(self.marks) >= self.iterations:
            self.stopped = True
            raise StopRecording(self.iterations)

    def iterations_done(self) -> int:
        return split_iterations(self).count

    def _pass_started(self, frame: types.FrameType, loop: Loop, sequence: int) -> BaseException | None:
        """The line tracer's ``on_pass``: a pass of one of the learner's loops starts (see
        :mod:`backward_twice.record.passes`)."""
        if self.off:
            return None
        try:
            role = self.loop.role(frame, loop)
            if role is None:  # before any event, the loop around a backward call as written stops at pass N+1 too
                early = stops.stop_before_any_event(self.loop, self.creation, self.iterations, frame, loop)
                return pass_stops.stop_here(self, sequence, frame, loop) if early else None
            if role == "iteration" and pass_stops.stop_due(self):
                return pass_stops.stop_here(self, sequence, frame, loop)
            start = PassStart(sequence, len(self.calls))
            self.loop.add_pass(frame, loop, start)
            if role == "iteration":
                start.sighting, start.looked = len(self.sightings), True
                self.starts.append(start.sighting)
                note_names(self, frame)
                count = self.loop.iterations_started()
                if count >= 2 and (self.iterations is None or count + self._gap <= self.iterations):
                    # Followed to its second pass (pass 1's lines are logged, and a graph it carries shows here):
                    # a tracer slows every Python call, so the passes are told at their first events from now on.
                    self.creation.stop()
        except Exception as error:
            self.fail("the start of a pass of your loop", error)
        return None

    def read_at_the_stop(self, frame: types.FrameType, built_before: int | None = None) -> None:
        """What pass N left held into pass N+1, read where the run stops (a list that grew in pass N as in pass 1);
        ``built_before``: read at pass N+1's first event, what it built so far is not held into it."""
        if self.stop_pass is not None and self.stop_pass.number > 1:
            self.starts.append(len(self.sightings))
            note_names(self, frame, built_before=built_before)

    def _saw_event(self, frame: types.FrameType, may_stop: bool = True, line: int = 0) -> list[PassStart]:
        """An event ran in ``frame`` (at ``line``, if known). ``may_stop``: a backward call, before it runs (a step is
        not stopped inside). Returns the iteration loop's passes (none: no loop splits the run)."""
        if self.by_runs:
            return []
        known = self.loop.chain is not None
        began = self.loop.saw_event(
            frame,
            self.boundary,
            self._boundary_line,
            self.creation,
            self.calls.count,
            self._last_event_end,
            line,
            step=not may_stop,
        )
        passes = self.loop.iteration_passes()
        if not passes:
            if self.loop.unusable is not None and not self.iterations:  # a framework's loop: tracing it costs
                self.creation.stop()  # every iteration and tells nothing; the lines seen so far stay
            return passes
        if not known:  # the loop is known now, in its first pass: what it holds from before it (a graph built
            self.starts.append(len(self.sightings))  # before the loop) is read here
            note_names(self, frame, built_before=passes[0].sequence)
            self._gap = passes[-1].number  # the passes before the first event: as many may come between two
        elif began:  # the first event of a new pass the tracer did not follow: what is held into it, from here
            self._first_event_of(passes, frame, may_stop)
        return passes

    def _first_event_of(self, passes: list[PassStart], frame: types.FrameType, may_stop: bool) -> None:
        """A new iteration's first event (its pass is the last of ``passes``), when the tracer no longer follows the
        loop: the names are read here (what an earlier iteration built and is still held), and for ``iterations=N``
        the tracer comes back for the last pass, to stop at the top of the next."""
        start = passes[-1]
        if may_stop and self.iterations is not None and start.number > self.iterations:  # its top went by unseen:
            passes.pop()  # stop before anything of it is recorded
            self.stopped, self.stop_pass, start.sighting = True, start, len(self.sightings)
            self.read_at_the_stop(frame, built_before=start.sequence)
            raise StopRecording(self.iterations)
        start.sighting = len(self.sightings)  # the names read next belong to this pass or a later one
        count = start.number
        if names_read_due(count):  # the first passes, then the 6th, 8th, 12th, 16th, ...: a read costs a walk of
            self.starts.append(start.sighting)  # the loop's objects; what grows keeps growing, what is held stays
            start.looked = True
            note_names(self, frame, built_before=start.sequence)
        self._gap = max(self._gap, count - passes[-2].number if len(passes) > 1 else 1)  # passes with no event
        if self.iterations is not None and count <= self.iterations < count + self._gap and not self.creation.active:
            self.creation.start(frame)  # (a backward every k-th pass): pass N+1 may begin before the next event
        if self._folder.due(passes):
            self._folder.fold(self.calls, passes)
            self.steps = steps_kept(self.steps, self.calls)

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.off:
            return
        try:
            self.optimizer_key.stepped(optimizer)
            if self.before_step is not None:
                self.before_step(optimizer)
            if stop := pass_stops.stop_without_a_loop(self, None):
                raise stop
        except Exception as error:
            self.fail("before an optimizer step", error)

    def _on_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.off:
            return
        caller = sys._getframe(2)  # past intercepting's lambda, the hook's own frame
        try:
            if self.creation.active:  # a pause costs two calls: only while the tracer is on (the first passes)
                with self.creation.untraced:
                    self._after_step(optimizer, caller)
            else:
                self._after_step(optimizer, caller)
        except Exception as error:
            self.fail("after an optimizer step", error)

    def _after_step(self, optimizer: torch.optim.Optimizer, caller: types.FrameType) -> None:
        line, key = self.is_learners.site(caller, self._lines)[1], self.optimizer_key.stepped(optimizer)
        loop = self.loop
        end = _sequence_nr()  # the last event's end stays the previous one's: a pass this step tells began there
        number = self.step_counts[key] = self.step_counts.get(key, 0) + 1
        by_steps = not loop.iteration_passes()  # split by steps, without a loop: where each one ended
        self.steps.append(StepEvent(key, end, self.calls.count, line, number, len(self.sightings) if by_steps else -1))
        if key not in self.first_steps:
            self.first_steps[key] = self._events
        self._events += 1
        if by_steps or self.creation.active or loop.told_by_lines() or not self.calls.count:  # else settled: the
            self._saw_event(caller, may_stop=False)  # backward calls tell passes by what the loop's ``for`` binds
        self._last_event_end = end
        if by_steps or loop.unusable is not None:  # else at the loop's passes' starts instead
            event_names(self, caller, opens=by_steps)
        if by_steps and pass_stops.stop_without_a_loop(self, None, mark=False):  # a framework: asked to end, else
            if self.framework_stop.ask(caller):  # and the learner's code stops where the framework's call returns
                stop, step = functools.partial(pass_stops.framework_returned, self), self.step_call.code
                self.framework_stop.stop_on_return(caller, self.is_learners, stop, step)
            self.step_call.arm(lambda: pass_stops.stop_without_a_loop(self, None))
        if by_steps and not self.marks and not self.by_runs:  # the steps split the run: fold as a loop's
            read, first = len(self.sightings), self.first_steps
            self.steps = self.step_folder.after_step(self.calls, self.steps, first, self.start, read)

    @property
    def events(self) -> int:
        """How many optimizer steps and marks came so far."""
        return self._events

    # -- backward calls ------------------------------------------------------------------------------------
    def _on_backward(
        self, engine: Callable[..., Any], outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._depth or self.off:  # a backward inside a backward (a hook's), counted: the outer call is judged
            return self.inside.passed(self._depth, self.skipped, engine, outputs, args, kwargs)
        caller = sys._getframe(2)  # past intercepting's wrapper, the engine entry's own frame
        try:
            if self.creation.active:  # a pause costs two calls: only while the tracer is on (the first passes)
                with self.creation.untraced:
                    prepared = self._before_backward(outputs, args, kwargs, caller)
            else:
                prepared = self._before_backward(outputs, args, kwargs, caller)
        except StopRecording:
            raise
        except Exception as error:
            self.fail("before a backward call", error)
            return engine(outputs, *args, **kwargs)
        if prepared is None:  # torch.compile tracing its backward: not the loop's
            return engine(outputs, *args, **kwargs)
        call, walked, handle, args, boundary = prepared
        self._depth += 1
        threaded = handle is not None and torch._C._is_multithreading_enabled()
        if handle is not None:  # the engine lists what it walks only on the calling thread
            torch._C._set_multithreading_enabled(False)
        try:
            if handle is walks.RAISES_AT_THE_CALL:  # several roots, walked before it: as written, this call raises
                raise RuntimeError(SECOND_TIME)
            result = engine(outputs, *args, **kwargs)
        except Exception as exc:
            try:
                if not call.read:  # a call whose walk was not read: the error's evidence reads it now
                    walks.walk_now(outputs, self._reader(call, walked, boundary))
                call.error = first_line(exc, 400)
                if self.error is None:
                    self.error = explain(self, exc, call, walked, caller)
                    self.caught.raised(exc, len(self.calls))
                    self.pending = unstepped_optimizers(caller, self.skipped, self.optimizer_key.live_ids())
            except Exception as error:
                self.fail("reading a backward's error", error)
            raise
        finally:
            self._depth -= 1
            if handle is not None:
                torch._C._set_multithreading_enabled(threaded)
                handle.remove()
            call.end = self._last_event_end = _sequence_nr()
        call.walked_kept = ()  # it returned: no error's evidence needs them
        try:
            if call.retain_graph:  # without a retain the engine freed all it walked (create_graph: given it)
                count = self._retains_at[call.site] = self._retains_at.get(call.site, 0) + 1
                if count <= 4 or count & (count - 1) == 0:  # a line's graph is the same size each time
                    with self.creation.untraced:  # only around the calls: a pause costs two
                        call.held_after_bytes = graph_only_bytes([n for n in walked if stamped(n, self.key)])
            if call.read:
                walked.clear()  # the recorder holds no node between calls
                self.sampling.walked(call)
            if not self.steps and not self.marks:
                self.event_sightings[("call", call.index)] = len(self.sightings)
                with self.creation.untraced:
                    event_names(self, caller)
        except Exception as error:
            self.fail("after a backward call", error)
        return result

    def _before_backward(
        self, outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any], caller: types.FrameType
    ) -> tuple[CallRecord, list[Node], Any, tuple[Any, ...], int] | None:
        site, line, compiled, learners = self.is_learners.site(caller, self._lines)
        if compiled:
            return None
        passes = self._saw_event(caller if learners is None else learners, line=site[1])
        if self.iterations is not None and not optimizers.inside_a_step(caller):  # never half-way through a step
            if stop := pass_stops.stop_without_a_loop(self, site, frame=caller):
                raise stop
            self.step_call.saw_backward(learners)
        call = record_of(self.calls.count, site, line, args, kwargs, self._events)
        self.calls.append(call)
        if self.first_site is None:
            self.first_site = site
        if site == self.first_site:
            self.first_line_calls += 1
        walked: list[Node] = []
        boundary = passes[-1].sequence if passes else iteration_start(self)
        every = self.keep_buffers or self.on_leaf is not None or self.creation.active
        handle = None
        if self.sampling.due(call, every, boundary):
            handle = walks.read_walk(outputs, self._reader(call, walked, boundary))
        if self.keep_buffers:  # torch passes (grad_tensors, keep_graph, create_graph, inputs, ...) by position
            args = (args[0], True, *args[2:]) if len(args) > 1 else args
        return call, walked, handle, args, boundary

    def _reader(self, call: CallRecord, walked: list[Node], boundary: int) -> Callable[[list[Node]], None]:
        """What reads ``call``'s walk into ``walked`` and stamps its nodes (keep_buffers: raises where it would)."""

        def look(order: list[Node]) -> None:
            if self.off:
                return
            second = False
            try:
                walked.extend(order)
                stamp = (self.key, self.calls, call, order, boundary, self.on_leaf, self.keep_buffers)
                if self.creation.active:  # a pause costs two calls: only while the tracer is on (the first passes)
                    with self.creation.untraced:
                        second = stamp_walk(*stamp)
                else:
                    second = stamp_walk(*stamp)
            except Exception as error:
                self.fail("reading what a backward walks", error)
            if second:
                raise RuntimeError(SECOND_TIME)  # keep_buffers: where the step as written raises

        return look
