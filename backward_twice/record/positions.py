"""Where an event lies in a pass of a loop told by the lines its events come back to (a ``while``, or a ``for`` whose
names an inner loop rebinds): the line and instruction of each of the learner's frames from the loop's in, compared
level by level (two events on one line, ``loss.backward(); opt.step()``, are in one pass: the second is further on).
An optimizer's ``step`` comes after every event inside its call, and the events of one step (the backward calls of
a closure LBFGS runs several times, then the step's own) are one pass, though the loop's line comes back
(:class:`StepWindow`).

Used by :mod:`backward_twice.record.passes`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

from backward_twice.record.optimizers import OPTIMIZERS

__all__ = ["AFTER_ITS_CALL", "Frames", "Position", "StepWindow", "frames_between", "position_of"]

Position = tuple[tuple[int, int], ...]  # (line, instruction) of each learner's frame, from the loop's in
Frames = list[tuple[int, int, int]]  # (id of the frame, its line, its instruction), outermost first
AFTER_ITS_CALL: Position = ((sys.maxsize, 0),)  # a step's position: after each event its call ran


def frames_between(
    frame: types.FrameType | None, outer: types.FrameType | None, is_learners: Callable[[types.CodeType], bool]
) -> tuple[Frames, int]:
    """The learner's frames from ``outer`` (included) in to ``frame``, outermost first; and the id of the outermost
    optimizer frame between them (a closure LBFGS's ``step`` calls), else 0."""
    frames: Frames = []
    stepping = 0
    while frame is not None:
        if is_learners(frame.f_code):
            frames.append((id(frame), frame.f_lineno, frame.f_lasti))
        elif OPTIMIZERS in frame.f_code.co_filename:
            stepping = id(frame)
        if frame is outer:
            break
        frame = frame.f_back
    return frames[::-1], stepping


def position_of(inward: Frames, start: int, step: bool) -> Position:
    """The position of an event whose learner's frames are ``inward``, from the loop's (at ``start``) in."""
    return tuple((line, lasti) for _, line, lasti in inward[start:]) + (AFTER_ITS_CALL if step else ())


@dataclass
class StepWindow:
    """The optimizer step the last event ran inside (the id of its outermost optimizer frame; 0: none)."""

    stepping: int = 0

    def within(self, stepping: int, step: bool) -> bool:
        """Whether this event lies in the optimizer step of the last one (``stepping``: as :func:`frames_between`
        gives it): a closure's next backward, or the step's own event after them."""
        within = (not step and stepping != 0 and stepping == self.stepping) or (step and self.stepping != 0)
        self.stepping = 0 if step else stepping  # the step's own hook runs in its frame too: done, not inside
        return within
