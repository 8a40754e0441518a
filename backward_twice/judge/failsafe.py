"""Judging that never raises into the learner's code: :func:`judged` judges a recording and, where the tool's own
code fails, gives verdicts that claim nothing (no finding, no line) and the sentence that says so.

Used by :mod:`backward_twice.steps.diagnose`, :mod:`backward_twice.steps.harness` and :mod:`backward_twice.watcher`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backward_twice.judge.verdicts import Verdicts, judge
from backward_twice.record.iterations import Split
from backward_twice.record.learner import first_line

if TYPE_CHECKING:
    from backward_twice.record.recorder import Recorder

__all__ = ["could_not_judge", "judged"]


def could_not_judge(what: str, error: BaseException) -> str:
    """The sentence every way in gives when its own code failed to judge ``what`` ("this run", "the runs of step")."""
    return f"backward-twice could not judge {what} (an error of its own: {first_line(error)})"


def judged(recorder: Recorder, what: str, runs: int = 0) -> tuple[Verdicts, str | None]:
    """The verdicts on ``recorder``'s recording and None; if judging raised, verdicts that claim nothing (``runs``
    and the backward calls counted, ``stopped_watching`` the reason) and :func:`could_not_judge`'s sentence."""
    try:
        return judge(recorder), None
    except Exception as error:  # the loop's own outcome stands; the report says the tool failed
        problem = could_not_judge(what, error)
        return Verdicts(Split("not judged", (), 0), runs, len(recorder.calls), stopped_watching=problem), problem
