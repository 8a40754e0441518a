"""Which of the learner's lines built each autograd node, read afterwards from a node's sequence number.

While a :class:`CreationLines` is on, a trace function (``sys.settrace``) gets line events from the learner's own
code only (a frame whose file lies outside torch, ``helpers/``, the standard library and site-packages: for any
other frame it returns None, so torch's own Python code runs untraced). At each line, and when a learner's frame
returns to another, it logs the engine's node counter (``torch._C._autograd._get_sequence_nr()``) with the
line; consecutive entries at the same counter collapse into the last, since no node was built between them. A
node built with sequence number ``s`` was built while the last entry at or below ``s`` ran: the innermost
learner's line at that moment ("the first frame outside torch and the helpers", as tracebacks read).

Nodes built before it started (a graph built before the loop) have no entry: :meth:`CreationLines.line_of`
gives None. When another trace function is already set (a debugger, coverage), nothing is logged.

Used by :mod:`helpers.recorder`.
"""

from __future__ import annotations

import bisect
import linecache
import os
import sys
import types
from array import array
from typing import Any

import torch

from helpers.learner import skipped_dirs

__all__ = ["CreationLines"]

_MAX_ENTRIES = 1_000_000  # past it, the older half goes: those nodes' lines become unknown


class CreationLines:
    def __init__(self) -> None:
        self.sequences = array("Q")
        self.sites: list[tuple[str, int]] = []
        self.active = False
        self._own: dict[types.CodeType, bool] = {}
        self._skipped = skipped_dirs()
        self._frames: list[types.FrameType] = []
        # After an event that may end an iteration, the next loop header (``for``/``while``) that runs is where
        # the next iteration starts: ``on_loop_start(frame)`` is called there once.
        self.pending = False
        self.on_loop_start: Any = None
        self._headers: dict[tuple[str, int], bool] = {}

    def is_learners(self, code: types.CodeType) -> bool:
        own = self._own.get(code)
        if own is None:
            name = code.co_filename
            own = self._own[code] = (not name.startswith("<") or name.startswith("<ipython")) and not os.path.realpath(
                name
            ).startswith(self._skipped)
        return own

    def start(self, frame: types.FrameType | None) -> None:
        """Trace from now on, and the learner's frames already running from ``frame`` out."""
        if sys.gettrace() is not None:
            return
        counter = torch._C._autograd._get_sequence_nr
        sequences, sites, is_learners = self.sequences, self.sites, self.is_learners

        def log(site: tuple[str, int]) -> None:
            sequence = counter()
            if sequences and sequences[-1] == sequence:
                sites[-1] = site
                return
            if len(sequences) >= _MAX_ENTRIES:
                del sequences[: _MAX_ENTRIES // 2]
                del sites[: _MAX_ENTRIES // 2]
            sequences.append(sequence)
            sites.append(site)

        headers = self._headers

        def local(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                site = (frame.f_code.co_filename, frame.f_lineno)
                log(site)
                if self.pending:
                    header = headers.get(site)
                    if header is None:
                        text = linecache.getline(*site).lstrip()
                        header = headers[site] = text.startswith(("for ", "while ", "async for "))
                    if header:
                        self.pending = False
                        self.on_loop_start(frame)
            elif event == "return":
                back = frame.f_back
                while back is not None and not is_learners(back.f_code):
                    back = back.f_back
                if back is not None:
                    log((back.f_code.co_filename, back.f_lineno))
            return local

        def calls(frame: types.FrameType, event: str, arg: Any) -> Any:
            return local if is_learners(frame.f_code) else None

        self.active = True
        while frame is not None:
            if is_learners(frame.f_code):
                frame.f_trace = local
                self._frames.append(frame)
            frame = frame.f_back
        sys.settrace(calls)

    def stop(self) -> None:
        if not self.active:
            return
        sys.settrace(None)
        for frame in self._frames:
            frame.f_trace = None
        self._frames.clear()  # frames hold their variables: none is kept past the watch
        self.active = False

    def line_of(self, sequence: int) -> tuple[str, int] | None:
        """(file, line) of the learner's line that was running when node ``sequence`` was built; None if unknown."""
        position = bisect.bisect_right(self.sequences, sequence) - 1
        return self.sites[position] if position >= 0 else None
