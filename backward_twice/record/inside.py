"""Backward calls made while another backward runs (a tensor hook's ``autograd.grad``, a custom Function's
``backward``, a Deep Equilibrium model's implicit solver): the recorder lets each through as written, unjudged, and
counts them here with the learner's line of the first, so a report never claims to have judged what it passed.

Used by :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from backward_twice.record.names import site_of

__all__ = ["InsideCalls"]


class InsideCalls:
    """How many backward calls ran inside another backward, and (file, line) of the learner's first one."""

    def __init__(self) -> None:
        self.count = 0
        self.first: tuple[str, int] | None = None

    def passed(
        self,
        depth: int,
        skipped: tuple[str, ...],
        engine: Callable[..., Any],
        outputs: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run the call as written (``engine``); counted when ``depth`` says another backward is running."""
        if depth:
            try:
                self.count += 1
                if self.first is None:
                    site = site_of(sys._getframe(1), skipped)  # from the recorder's hook out to the learner's code
                    self.first = site if site[0] else None
            except Exception:  # counting never stands between the learner's call and the engine
                pass
        return engine(outputs, *args, **kwargs)
