"""A line tracer over the learner's own code: which line built each autograd node, and where each pass of their
loops starts.

While a :class:`LineTracer` is on, a trace function (``sys.settrace``, and ``threading.settrace`` for the threads
started meanwhile) gets events from the learner's code only: a frame whose file lies outside torch, the tool,
the standard library and site-packages. For any other frame it returns None, so torch's own Python code runs
untraced. A function of the learner's that returned three times without ever building a node (a ``Dataset``'s
``__getitem__``, a collate function, a logging helper) is not traced again; a comprehension's frame sends no line
events (its lines are its statement's, logged as that runs). In a forked child (a ``DataLoader`` worker) the tracer
switches itself off.

* **Creation lines.** At each line, and when a learner's frame returns to another, it logs the engine's node
  counter (``torch._C._autograd._get_sequence_nr()``, passed in as ``counter``) with the line; consecutive entries
  at the same counter collapse into the last, since no node was built between them. A node built with sequence
  number ``s`` was built while the last entry at or below ``s`` ran (:meth:`LineTracer.line_of`). The log is
  bounded: past its size the older half goes, and those nodes' lines become unknown.
* **Lines that ran**, each once (:attr:`LineTracer.ran`): a line the learner wrote behind an ``if`` that was off
  (``if args.repackage: hidden = hidden.detach()``) is not where anything came in.
* **Calls that built nodes.** When a learner's function that built nodes returns, the counter span it ran in and the
  learner's line that called it are kept: :meth:`LineTracer.call_line_of` reads a node back to the line of the code
  the learner is looking at (the loop's ``value = critic(state)``, not the ``return self.out(x)`` of the model's
  ``forward``, which runs for every call of the critic). Bounded as the log is.
* **Passes.** A loop's pass starts where its header line runs and the next line of the same frame lies in its
  body (at the loop's end the header runs once more, and the next line lies after it: no pass). A ``for`` whose body
  starts on its header's line (``for x in data: h = cell(x, h); ...``) sends no line event in its body: its frame
  sends opcode events while it runs that line, and a pass starts at the first instruction after the loop's
  ``FOR_ITER`` and the stores of the names it binds (an item was taken and bound).
  ``on_pass(frame, loop, sequence)`` is called there, before the pass's first statement runs; if it returns an
  exception, that exception is raised into the learner's frame at that point, outside any ``try`` of the body: how
  a recorder stops between iterations. A loop whose body starts with ``try:`` is asked at its header instead
  (``at_header``, the same contract): from Python 3.11 on, an exception raised by a trace function at a ``try:``
  line escapes every handler of its frame, the ``with`` that started the watch included. A handler of the learner's
  that catches everything around the loop (a whole script in ``try: ... except:``) does not stop the stop
  (:mod:`backward_twice.record.past_handlers`). The last pass seen of each loop in each running frame is kept in
  :attr:`LineTracer.latest` (sequence counter and count), for the loop a recorder picks after its first pass began.

A library's module, the first time it is imported, runs untraced too (:mod:`backward_twice.record.imports`; given
``is_learners_file``): a script's ``import torchvision`` or torch's first import of ``torch._dynamo`` would
otherwise call the trace function at each of its thousands of calls. A recorder's own hooks run inside
``with tracer.untraced:``: up to Python 3.11 the trace function is off on that
thread meanwhile (each call of the hook's code would otherwise call it; from 3.12 setting it re-instruments code,
so it stays on). When another trace function is already set (a debugger, coverage), nothing is traced. An error
inside the tracer switches it off and goes to ``on_failure``: it never reaches the learner's code.

Used by :mod:`backward_twice.record.pass_stops`, :mod:`backward_twice.record.passes` and
:mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import bisect
import dis
import os
import sys
import threading
import types
import weakref
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backward_twice.record.coroutines import suspended
from backward_twice.record.imports import LibraryImports
from backward_twice.record.loops import Loop, loops_of
from backward_twice.record.past_handlers import PastHandlers
from backward_twice.record.unseen import real_gettrace, real_thread_gettrace

__all__ = ["LineTracer", "PassSeen"]

_MAX_ENTRIES = 1_000_000  # past it, the older half goes: those nodes' lines become unknown
_MAX_KEPT = 100_000  # calls that built nodes, and lines that ran: past it, the older half of the calls goes
_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})
_BINDING = ("UNPACK_SEQUENCE", "UNPACK_EX", "STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF")  # a for's names
_QUIET_CALLS = 3  # a function that returned this often in a row without building a node is not traced again
_ACTIVE: weakref.WeakSet[LineTracer] = weakref.WeakSet()
# Up to 3.11 setting the trace function flips a flag; from 3.12 it re-instruments every code object run after it
# (PEP 669), so a pause would cost more than it saves there.
_PAUSES_ARE_CHEAP = sys.version_info < (3, 12)
_FORK_HOOKED = False


@dataclass(slots=True)
class PassSeen:
    """The latest pass of one loop in one frame: the node counter when it started, how many passes so far, and the
    node counter when the first of them started."""

    sequence: int
    count: int
    first: int = 0


def _in_forked_child() -> None:
    """A forked child (a DataLoader worker) inherits the parent's trace function: nothing is traced there."""
    for tracer in list(_ACTIVE):
        tracer.forked = True
        tracer.stop()


class LineTracer:
    def __init__(
        self,
        counter: Callable[[], int],
        is_learners: Callable[[types.CodeType], bool],
        on_pass: Callable[[types.FrameType, Loop, int], BaseException | None] | None = None,
        on_failure: Callable[[str, BaseException], None] | None = None,
        at_header: Callable[[types.FrameType, Loop, int], BaseException | None] | None = None,
        is_learners_file: Callable[[str], bool] | None = None,
    ) -> None:
        self.counter, self.is_learners, self.on_pass, self.on_failure = counter, is_learners, on_pass, on_failure
        self.at_header = at_header
        self.sequences = array("Q")
        self.sites: list[tuple[str, int] | None] = []  # None: from here the tracer was off, the lines unknown
        # (counter when called, counter at its return, the caller's code, its line): calls of the learner's functions
        # that built nodes
        self.built_in_calls: list[tuple[int, int, types.CodeType, int]] = []
        self.ran: set[tuple[str, int]] = set()  # (file, line) of each of the learner's lines that ran while traced
        self.active = False
        self.forked = False
        self.latest: dict[tuple[int, int], PassSeen] = {}  # (id(frame), header line) -> its latest pass
        # by id(code), the code kept beside: a code object hashes its whole bytecode at each lookup
        self._headers: dict[int, tuple[types.CodeType, dict[int, Loop]]] = {}
        # id(frame) -> the loop whose header it just ran, and the node counter there: what the header builds (a
        # generator's next item, ``for feats, y in encoded(loader)``) is the pass's own
        self._pending: dict[int, tuple[Loop, int]] = {}
        # id(frame) -> (the frame, its one-line loop running, the offset where a pass starts): opcode events on
        self._one_line: dict[int, tuple[types.FrameType, Loop, int]] = {}
        self._pass_offsets: dict[tuple[int, int], tuple[types.CodeType, int]] = {}  # (id(code), header) -> offset
        self._entered: dict[int, int] = {}  # id(frame) -> the node counter when it was called
        self._quiet: dict[int, int] = {}  # id(code) -> calls in a row that built no node (its code in _headers)
        self._builders: set[int] = set()  # id(code) of code that built a node once: always traced
        # id(code) -> code never traced (not the learner's, or quiet): told apart without a call, as the global trace
        # function runs at every Python call of the thread, torch's and the libraries' included
        self._untraced_codes: dict[int, types.CodeType] = {}
        self._frames: list[types.FrameType] = []
        self._previous_thread_trace: Any = None
        self._thread = 0  # the thread that started it: the one whose trace function a learner's code may replace
        self._trace = self._global  # one bound method: what ``sys.gettrace()`` gives back is this very object
        self.untraced = _Untraced(self)  # ``with tracer.untraced:`` around a hook's own work
        self.past_handlers = PastHandlers()  # a stop's way past an ``except:`` around the loop, until the next stop()
        self._imports = None if is_learners_file is None else LibraryImports(is_learners_file, self.pause, self.resume)

    # -- on and off ------------------------------------------------------------------------------------------
    def start(self, frame: types.FrameType | None) -> bool:
        """Trace from now on, the learner's frames already running from ``frame`` out included; False (and no
        tracing) when another trace function is set."""
        global _FORK_HOOKED
        if real_gettrace() is not None:
            return False
        if not _FORK_HOOKED and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_in_forked_child)
            _FORK_HOOKED = True
        self.active = True
        self._thread = threading.get_ident()
        _ACTIVE.add(self)
        while frame is not None:
            if self.is_learners(frame.f_code):
                frame.f_trace = self._local
                self._frames.append(frame)
            frame = frame.f_back
        self._previous_thread_trace = real_thread_gettrace() if real_thread_gettrace is not None else None
        threading.settrace(self._trace)
        sys.settrace(self._trace)
        if self._imports is not None:
            self._imports.install()
        return True

    def stop(self) -> None:
        self.past_handlers.disarm()
        if not self.active:
            return
        self._log(None)  # the nodes built while it is off have no line
        self.active = False
        _ACTIVE.discard(self)
        if self._imports is not None:
            self._imports.uninstall()
        if real_gettrace() is self._trace:
            sys.settrace(None)
        if (real_thread_gettrace or (lambda: self._trace))() is self._trace:  # one the learner set stays
            threading.settrace(self._previous_thread_trace)
        for frame in self._frames:
            frame.f_trace = None
        self._frames.clear()  # frames hold their variables: none is kept past the watch
        for frame, _, _ in self._one_line.values():
            frame.f_trace_opcodes = False
        self._one_line.clear()
        self._untraced_codes.clear()  # told again (from the same tests) if it starts again
        self._pending.clear()
        self._entered.clear()
        self.untraced.local = threading.local()  # each thread's pauses: an exit while it is off resumes none

    def pause(self) -> bool:
        """While a recorder's own hook runs on this thread: no call into the trace function for each of the
        hook's calls (the hook's code is never the learner's). True if paused; give it to :meth:`resume`.
        ``with tracer.untraced:`` does both."""
        if not (_PAUSES_ARE_CHEAP and self.active and real_gettrace() is self._trace):
            return False
        sys.settrace(None)
        return True

    def resume(self, paused: bool) -> None:
        """After :meth:`pause`: trace again, unless the hook stopped the tracer meanwhile."""
        if paused and self.active and real_gettrace() is None:
            sys.settrace(self._trace)

    def displaced(self) -> None:
        """Off, if the learner's code set a trace function of its own (``sys.settrace(None)``, ``coverage.start()``)
        on the thread that started this one: the lines since its last logged one are unknown (the nodes built since
        were not built by that line), and the learner's trace function stays theirs. Checked at the recorder's hooks
        (a backward call, an optimizer step), outside any pause of its own."""
        if not self.active or threading.get_ident() != self._thread or real_gettrace() is self._trace:
            return
        if self.sites:
            self.sites[-1] = None
        self.stop()

    def _failed(self, where: str, error: BaseException) -> None:
        self.stop()
        if self.on_failure is not None:
            self.on_failure(where, error)

    # -- the trace functions ---------------------------------------------------------------------------------
    def _global(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        try:
            if not self.active:
                return None
            code = frame.f_code
            if self._untraced_codes.get(id(code)) is code:
                return None
            if self._quiet.get(id(code), 0) >= _QUIET_CALLS or not self.is_learners(code):
                self._untraced_codes[id(code)] = code
                return None
            self._headers_of(code)  # keeps the code alive while its id keys _quiet and _builders
            self._entered[id(frame)] = self.counter()
            if code.co_name in _COMPREHENSIONS:  # its lines are its statement's, logged as that ran: a line event
                frame.f_trace_lines = False  # per item would cost a call each (a Dataset's list of 64 values)
            return self._local
        except Exception as error:
            self._failed("the line tracer", error)
            return None

    def _local(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        stop = None
        try:
            if not self.active:
                return None
            if event == "line":
                stop = self._line(frame)
            elif event == "opcode":
                stop = self._opcode(frame)
            elif event == "return" and not suspended(frame):  # an ``await`` of an ``async def`` loop: it comes back
                self._return(frame)
        except Exception as error:
            self._failed("the line tracer", error)
            return None
        if stop is not None:
            self.stop()
            try:
                self.past_handlers.arm(frame, self.is_learners, stop)
            except Exception as error:  # the stop stays; an ``except:`` around the loop may catch it
                self.past_handlers.disarm()
                if self.on_failure is not None:
                    self.on_failure("carrying the stop past your handlers", error)
            raise stop  # into the learner's frame, at the top of a pass: the recorder stops here
        return self._local if self.active else None

    def _line(self, frame: types.FrameType) -> BaseException | None:
        line = frame.f_lineno
        site = (frame.f_code.co_filename, line)
        self._log(site)
        if len(self.ran) < _MAX_KEPT:
            self.ran.add(site)
        key = id(frame)
        stop = None
        if key in self._one_line and self._one_line[key][1].header != line:  # past its one-line loop
            self._one_line.pop(key)[0].f_trace_opcodes = False
        pending = self._pending.pop(key, None)
        if pending is not None and pending[0].holds(line):
            stop = self._pass_began(frame, *pending)
        loop = self._headers_of(frame.f_code).get(line)
        if loop is not None and stop is None and self.at_header is not None:
            stop = self.at_header(frame, loop, self.counter())
        if loop is not None and loop.kind == "for" and loop.body_first == line:
            offset = self._pass_offset(frame.f_code, loop)
            if offset >= 0:  # its passes are told by opcode events, from here while it runs
                self._one_line[key] = (frame, loop, offset)
                if not frame.f_trace_opcodes:
                    frame.f_trace_opcodes = True
                    if real_gettrace() is self._trace:  # from 3.12, a frame's opcode events start at the next settrace
                        sys.settrace(self._trace)
                return stop
        if loop is not None:
            self._pending[key] = (loop, self.counter())
        return stop

    def _opcode(self, frame: types.FrameType) -> BaseException | None:
        watched = self._one_line.get(id(frame))
        if watched is None:
            frame.f_trace_opcodes = False
            return None
        return self._pass_began(frame, watched[1], self.counter()) if frame.f_lasti == watched[2] else None

    def _pass_began(self, frame: types.FrameType, loop: Loop, sequence: int) -> BaseException | None:
        key = (id(frame), loop.header)
        seen = self.latest.get(key)
        if seen is None:
            self.latest[key] = PassSeen(sequence, 1, sequence)
        else:
            seen.sequence, seen.count = sequence, seen.count + 1
        return self.on_pass(frame, loop, sequence) if self.on_pass is not None else None

    def _pass_offset(self, code: types.CodeType, loop: Loop) -> int:
        """Where a pass of a one-line ``for`` starts: the offset of the first instruction after its ``FOR_ITER`` (of
        those on its line, the one that jumps farthest: a comprehension inlined in the line, from Python 3.12, loops
        inside it) and the stores of the names it binds (what the pass binds is read there); -1 when there is none."""
        known = self._pass_offsets.get((id(code), loop.header))
        if known is not None and known[0] is code:
            return known[1]
        lines = [(start, end) for start, end, number in code.co_lines() if number == loop.header]
        instructions = list(dis.get_instructions(code))
        offset, farthest = -1, -1
        for index, instruction in enumerate(instructions[:-1]):
            on_line = any(start <= instruction.offset < end for start, end in lines)
            if instruction.opname == "FOR_ITER" and on_line and instruction.argval > farthest:
                body = index + 1
                while body < len(instructions) - 1 and instructions[body].opname.startswith(_BINDING):
                    body += 1
                offset, farthest = instructions[body].offset, instruction.argval
        self._pass_offsets[(id(code), loop.header)] = (code, offset)
        return offset

    def _return(self, frame: types.FrameType) -> None:
        key = id(frame)
        self._pending.pop(key, None)
        self._one_line.pop(key, None)
        code = frame.f_code
        for header in self._headers_of(code):
            self.latest.pop((key, header), None)
        entered = self._entered.pop(key, None)
        now = self.counter()
        if entered is not None and id(code) not in self._builders:
            if now == entered:
                self._quiet[id(code)] = self._quiet.get(id(code), 0) + 1
            else:
                self._builders.add(id(code))
                self._quiet.pop(id(code), None)
        back = frame.f_back
        while back is not None and not self.is_learners(back.f_code):
            back = back.f_back
        if back is not None:
            line = back.f_lineno
            self._log((back.f_code.co_filename, line))
            if entered is not None and now != entered:
                if len(self.built_in_calls) >= _MAX_KEPT:
                    del self.built_in_calls[: _MAX_KEPT // 2]
                self.built_in_calls.append((entered, now, back.f_code, line))

    def _headers_of(self, code: types.CodeType) -> dict[int, Loop]:
        """``code``'s loops by header line, read once."""
        known = self._headers.get(id(code))
        if known is None or known[0] is not code:
            known = self._headers[id(code)] = (code, {loop.header: loop for loop in loops_of(code)})
        return known[1]

    def _log(self, site: tuple[str, int] | None) -> None:
        sequence = self.counter()
        sequences, sites = self.sequences, self.sites
        if sequences and sequences[-1] == sequence:
            sites[-1] = site
            return
        if len(sequences) >= _MAX_ENTRIES:
            del sequences[: _MAX_ENTRIES // 2]
            del sites[: _MAX_ENTRIES // 2]
        sequences.append(sequence)
        sites.append(site)

    # -- reading ---------------------------------------------------------------------------------------------
    def line_of(self, sequence: int) -> tuple[str, int] | None:
        """(file, line) of the learner's line that was running when node ``sequence`` was built; None if unknown."""
        position = bisect.bisect_right(self.sequences, sequence) - 1
        return self.sites[position] if position >= 0 else None  # None too where the tracer was off

    def call_line_of(self, sequence: int, site: tuple[str, int]) -> tuple[str, int] | None:
        """(file, line) of the call, in the code whose statement ``site`` is (a backward's line), that node
        ``sequence`` was built under: the loop's ``value = critic(state)`` for a node of the critic's ``forward``;
        :meth:`line_of` when it was built in that code itself, or no traced call of it leads there."""
        own = self.line_of(sequence)
        if own is None:
            return None
        # innermost first: a call returns before its caller
        for entered, returned, code, line in reversed(self.built_in_calls):
            if entered <= sequence < returned and code.co_filename == site[0] and _runs_line(code, site[1]):
                return code.co_filename, line
        return own

    def call_lines_of(self, sequence: int) -> list[tuple[str, int]]:
        """(file, line) of the learner's lines node ``sequence`` was built under, innermost first: :meth:`line_of`,
        then the line of each traced call around it (``return self.model(x)`` of a U-Net block, then ``self.fake_B
        = self.netG(self.real_A)``, then the loop's ``model.optimize_parameters()``)."""
        own = self.line_of(sequence)
        if own is None:
            return []
        around = [call for call in self.built_in_calls if call[0] <= sequence < call[1]]
        around.sort(key=lambda call: call[1] - call[0])
        return [own, *((code.co_filename, line) for _, _, code, line in around)]


def _runs_line(code: types.CodeType, line: int) -> bool:
    """Whether ``line`` is one of ``code``'s own statements (not one of a function defined in it)."""
    return any(number == line for _, _, number in code.co_lines())


class _Untraced:
    """:meth:`LineTracer.pause` on entry and :meth:`LineTracer.resume` on exit, nested uses and threads included
    (a trace function is per thread); next to nothing while the tracer is off, as it is for most of a run."""

    __slots__ = ("local", "tracer")

    def __init__(self, tracer: LineTracer) -> None:
        self.tracer, self.local = tracer, threading.local()

    def __enter__(self) -> None:
        if self.tracer.active:
            stack = getattr(self.local, "paused", None)
            if stack is None:
                stack = self.local.paused = []
            if not stack:
                self.tracer.displaced()
            stack.append(self.tracer.pause())

    def __exit__(self, *exc: object) -> None:
        if not self.tracer.active:  # nothing to resume (its stop dropped what the entries pushed)
            return
        stack = getattr(self.local, "paused", None)
        if stack and stack.pop():
            self.tracer.resume(True)
