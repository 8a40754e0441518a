"""``with bt.watch() as w:`` around the learner's own loop: the loop runs as written, and afterwards ``w`` shows what
the recorder saw, judged (:mod:`backward_twice.judge.verdicts`) and reported (:mod:`backward_twice.report.rendering`):
in a notebook as HTML, printed as text, and as JSON for ``backward-twice watch --json``.

The loop is not changed: no re-run, no copy of parameters, gradients or optimizer state. An error the loop raises
goes on up with the diagnosis as a note under its traceback (Python 3.11's ``add_note``; a script and a notebook
cell both print it), and without the tool's own frames in it: the traceback is the one bare Python prints.
``SystemExit`` and ``KeyboardInterrupt`` go on up too, as how the loop ended, not as its error.
``watch(iterations=N)`` ends the block quietly at the top of the loop's pass N+1. A loop of no statement of the
learner's (a framework's) can mark its iterations with ``w.next_iteration()``; otherwise the report says how it
split them.

Nothing here raises into the learner's code: if the tool fails, the loop's own outcome stands and the report says
what went wrong.

Used by notebook 05_your_training_step, and by :mod:`backward_twice.cli`. ``backward-twice watch SCRIPT`` runs it on a
script.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from backward_twice.judge.failsafe import could_not_judge, judged
from backward_twice.judge.verdicts import Verdicts, judge
from backward_twice.record.learner import first_line, lend_timed_cell_source, place, without_tool_frames
from backward_twice.record.recorder import Recorder, StopRecording
from backward_twice.record.thread_stop import ThreadStop
from backward_twice.report.rendering import Report, build_report, render_html, render_text, report_json

__all__ = ["Watch", "dump_json", "verdicts_json", "watch"]


def _stopped_quietly(hook: Any, thread_stop: ThreadStop, recorder: Recorder) -> Any:
    """``hook`` (``threading.excepthook``), but silent for the stop of ``iterations=N`` in a thread that runs the
    loop: that thread ends there, as its loop would after N passes, and prints no traceback of the tool's; the
    watch's own thread stops too (``thread_stop``). An error that ends a thread left the learner's code uncaught."""

    def excepthook(args: Any) -> None:
        if not isinstance(args.exc_value, StopRecording):
            if args.exc_value is not None:
                recorder.caught.let_out(args.exc_value)
            hook(args)
        else:
            thread_stop.spread(args.exc_value)

    return excepthook


def _in_a_terminal() -> bool:
    """Whether the cells run in IPython's terminal, which shows a value as text (no evidence), not in a notebook."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "TerminalInteractiveShell"


class Watch:
    """What :func:`watch` returns: the recorder while the block runs, the diagnosis (``.verdicts``, ``.report``)
    after it."""

    def __init__(self, iterations: int | None = None, more: str | None = None) -> None:
        self.recorder = Recorder(iterations)
        self.ended_by: str | None = None  # "SystemExit: 0", "KeyboardInterrupt": how the loop ended, if so
        self.more = "`w` in a new cell shows the evidence" if more is None else more  # where the evidence is ("":
        # shown already)
        self._more_given = more is not None
        self._verdicts: Verdicts | None = None
        self._report: Report | None = None
        self._problem: str | None = None  # the tool's own failure to judge, if it had one
        self._excepthook = threading.excepthook
        self._quiet_hook: Any = None
        self._thread_stop = ThreadStop()
        self._take_back: Callable[[], None] = lambda: None

    def __enter__(self) -> Watch:
        self._verdicts = self._report = None
        caller = sys._getframe(1)
        self.recorder.boundary = caller
        self._take_back = lend_timed_cell_source(caller)  # a ``%%time`` cell's lines, while it runs
        if not self._more_given:
            name = _with_name(caller) or "w"
            in_a_cell = place(caller.f_code.co_filename, 1).startswith("Cell ")  # a script has no new cell
            shown = in_a_cell and not _in_a_terminal()  # a notebook shows ``w`` as HTML, its evidence included
            self.more = f"`{name}` in a new cell shows the evidence" if shown else f"print({name}.evidence())"
        self.recorder.__enter__()
        self._excepthook = threading.excepthook
        self._quiet_hook = threading.excepthook = _stopped_quietly(self._excepthook, self._thread_stop, self.recorder)
        if self.recorder.iterations is not None:
            self._thread_stop.arm()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        self._thread_stop.disarm()
        self.recorder.__exit__(kind, exc, tb)
        error = self.recorder.error
        if exc is None and error is not None and error.past_the_loop:  # the learner's check after training, caught
            error.after_the_loop = True
        if threading.excepthook is self._quiet_hook:  # a hook the code set meanwhile stays its own
            threading.excepthook = self._excepthook
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            self.ended_by = first_line(exc) if isinstance(exc, SystemExit) else "KeyboardInterrupt"
        elif exc is not None and self.recorder.error is not None and self.recorder.error.after_the_loop:
            self.ended_by = f"{first_line(exc, 200)} (raised after the loop)"
        self._verdicts, self._problem = judged(self.recorder, "this run")
        if self._problem is None:
            try:
                self._report = build_report(self._verdicts, ended_by=self.ended_by)
            except Exception as error:  # the loop's own outcome stands; the report says the tool failed
                self._problem = could_not_judge("this run", error)
        if self._problem is not None:  # what every part of the watch shows: nothing judged, and why
            self._report = Report(self._problem, (), (), self._problem)
        self._take_back()
        if isinstance(exc, Exception):
            exc.__traceback__ = without_tool_frames(exc.__traceback__)
            _without_the_stop(exc)
            if self._problem is None and not self.verdicts.calls:
                return False  # raised before any backward call (a missing import): Python's own error, alone
            note = self._problem or render_text(self.report, more=self.more)
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            else:  # Python 3.10: no notes; the diagnosis goes to stderr just before the traceback
                print(note, file=sys.stderr)
        return isinstance(exc, StopRecording)

    def next_iteration(self) -> None:
        """End an iteration here (for a loop that is no statement of yours, a framework's)."""
        self.recorder.next_iteration()

    @property
    def verdicts(self) -> Verdicts:
        return self._verdicts if self._verdicts is not None else judge(self.recorder)

    @property
    def report(self) -> Report:
        if self._report is None:
            self._report = build_report(self.verdicts, ended_by=self.ended_by)
        return self._report

    @property
    def healthy(self) -> bool:
        return not self.report.items and self.verdicts.calls > 0 and self._problem is None

    def evidence(self) -> str:
        """The report with its evidence: how the iterations were split, each backward's verdicts, bytes."""
        return self._problem or render_text(self.report, verbose=True)

    def to_json(self) -> dict[str, Any]:
        return {**report_json(self.report), **verdicts_json(self.verdicts)}

    def __str__(self) -> str:
        """The report as text; outside a notebook (a script, IPython's terminal), with where its evidence is."""
        return self._problem or render_text(self.report, more=self.more if self.more.startswith("print(") else "")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self._problem or render_html(self.report)


def watch(iterations: int | None = None) -> Watch:
    """Watch the loop inside ``with watch() as w:`` as it runs, unchanged: every backward and
    ``torch.autograd.grad`` call with the learner's line, what each walks, the bytes the graph still holds, the
    iterations (the passes of your loop), and the error, if one rises (it goes on up, with the diagnosis as a note).
    ``iterations``: end the block quietly at the top of pass N+1. Afterwards ``w`` shows what to fix, one item per
    cause: a graph carried into a later iteration, an error, a ``retain_graph=True`` that can go, a name that keeps
    more graphs alive every iteration, each with your line and the fix in your own variable names.

    Used by notebook 05_your_training_step."""
    return Watch(iterations)


def _with_name(frame: types.FrameType) -> str | None:
    """The ``as`` name of the ``with`` statement on the frame's current line (``with bt.watch() as w:``)."""
    import linecache

    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    match = re.search(r"\bwatch\(.*?\)\s+as\s+(\w+)", line) or re.search(r"\bas\s+(\w+)\s*[:,]", line)
    return match.group(1) if match else None


def verdicts_json(v: Verdicts) -> dict[str, Any]:
    """Everything the verdicts hold, for tools: iterations, the split, the error, carried graphs, per-line retains,
    and the graphs held into a later iteration that no backward walked."""
    e = v.error
    return {
        "iterations": v.iterations_run,
        "split": v.split.how,
        "calls": v.calls,
        "error": None
        if e is None
        else {
            "kind": e.kind,
            "message": e.message,
            "line": e.line,
            "iteration": e.iteration,
            "evidence": e.evidence,
            "fix": e.fix,
        },
        "carried": [
            {
                "variable": c.name,
                "built_at": c.built_at,
                "iteration": c.iteration,
                "used_at": c.used_at,
                "reached_from": c.reached_from,
                "iterations_walked": c.times,
                "fix": c.fix,
            }
            for c in v.carried
        ],
        "lines": [
            {
                "line": line.line,
                "verdict": line.verdict,
                "runs": line.runs,
                "needed_runs": line.needed_runs,
                "held_bytes": line.held_bytes,
                "why": line.why,
                "fix": line.fix,
            }
            for line in v.lines
        ],
        "notes": [
            {
                "variable": n.name,
                "built_at": n.built_at,
                "held_bytes": n.held_bytes,
                "grows": n.grows,
                "keeps_last": n.bound or None,  # a deque full of graphs: the iterations' graphs it holds, no more
            }
            for n in v.notes
        ],
        "inside": {"calls": v.inside[0], "first": v.inside[1]},  # backward calls inside another backward, unjudged
    }


def dump_json(watched: Watch, path: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(watched.to_json(), file, indent=2)
        file.write("\n")


def _without_the_stop(error: BaseException) -> None:
    """An error the code raised while the stop of ``iterations=N`` unwound it (in a ``finally:`` after the loop) is
    shown as python shows it without the tool: not "During handling of the above exception" the recorder's stop."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error.__context__, StopRecording) and error.__cause__ is None:
            error.__suppress_context__ = True
            return
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
