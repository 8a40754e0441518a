"""Steps timed side by side, round robin, for notebook 06's time comparisons."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from helpers.measure import time_round_robin

__all__ = ["best_milliseconds"]


def best_milliseconds(steps: Mapping[str, Callable[[], object]], rounds: int = 20) -> dict[str, float]:
    """The fastest of ``rounds`` calls of each step, in milliseconds, the steps taking turns to run first
    (so a busy moment of the machine slows every step alike). Each step runs once untimed first.

    Used by notebook 06_real_stack.
    """
    if not steps or rounds < 1:
        raise ValueError("best_milliseconds() needs at least one step and one round.")
    for step in steps.values():
        step()
    times = time_round_robin(steps, rounds)
    return {name: 1000 * min(seconds) for name, seconds in times.items()}
