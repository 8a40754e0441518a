"""Where the command's report starts on the terminal: on a line of its own after a script's progress line printed
without its end (:class:`LineEnd`), and on the command's stdout though the script closed or replaced ``sys.stdout``
(:func:`say`).

Used by :mod:`backward_twice.cli`.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, TextIO

from backward_twice.record.learner import without_tool_frames

__all__ = ["LineEnd", "say"]


class LineEnd:
    """Whether the script's last write to the terminal's streams (the command's stdout, and stderr) ended its line: a
    progress line printed with ``end=""`` (``print(f"\\rstep {i} ...", end="")``, or written to stderr as tqdm does)
    would have the report glued to its end. While entered, each stream's ``write`` is looked up on the stream itself
    (an instance attribute, as ``print`` finds it) and passes each text on unchanged; its errors are the stream's
    own, without this frame."""

    def __init__(self, *streams: TextIO | None) -> None:
        self.streams = list({id(stream): stream for stream in streams if stream is not None}.values())
        self.ended = True
        self._written: list[tuple[TextIO, Any]] = []

    @property
    def opening(self) -> str:
        """What the report starts with: a line end, if the script's last line has none."""
        return "" if self.ended else "\n"

    def __enter__(self) -> None:
        for stream in self.streams:
            write = stream.write

            def written(text: str, write: Any = write) -> Any:
                try:
                    count = write(text)
                except BaseException as error:  # as the stream raised it (a closed stdout's ValueError)
                    error.__traceback__ = without_tool_frames(error.__traceback__)
                    raise
                if text:
                    self.ended = text[-1] == "\n"
                return count  # what the stream's own write returns

            with contextlib.suppress(AttributeError, TypeError):  # a stream that takes no attribute: as before
                stream.write = written  # type: ignore[method-assign]
                self._written.append((stream, written))

    def __exit__(self, *exc: object) -> None:
        for stream, written in self._written:
            if getattr(stream, "__dict__", {}).get("write") is written:
                with contextlib.suppress(AttributeError, TypeError):
                    del stream.write
        self._written.clear()


def say(stdout: TextIO, text: str) -> None:
    """Print ``text`` where the command's own output goes, though the script closed or replaced ``sys.stdout``; a
    stdout that takes nothing more (closed, a broken pipe) is left as python leaves it: without a word."""
    for stream in (stdout, sys.__stdout__):
        try:
            if stream is not None and not stream.closed:
                print(text, file=stream, flush=True)
                return
        except (OSError, ValueError):
            continue
    with contextlib.suppress(OSError, ValueError), open(1, "w", closefd=False) as fresh:
        print(text, file=fresh, flush=True)
