"""Loop bodies measured for memory and time, each in its own run, so the instrument never enters the figure it explains.

:func:`growth_experiment` takes loop bodies written in a notebook, ``body(state)``, where ``state`` lives as
long as the loop (by default ``state.history`` a list and ``state.total`` ``0.0``; ``new_state`` makes
another), and runs each twice: a **bytes run** inside a :class:`SavedTensorMeter` (graph-only bytes after
every iteration and the autograd nodes its backward calls walked, exact integers, the same on every
machine) and a **time run** without it, the bodies' iterations interleaved round-robin so a machine's slow
drifts hit all alike. :func:`reachable_nodes` counts the nodes a backward from some tensors would walk.

Used by notebooks 02_multi_loss and 04_carried_state.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.record.learner import intercepting
from backward_twice.record.saved import python_walk
from helpers.display import Table
from helpers.figures import PngFigure
from helpers.measure import one_thread, time_round_robin

__all__ = ["GrowthResult", "growth_experiment", "new_loop_state", "reachable_nodes"]

Body = Callable[[SimpleNamespace], object]
WARM_UP_ITERATIONS = 3


def new_loop_state() -> SimpleNamespace:
    """What one loop keeps across its iterations: ``history`` (a list) and ``total`` (``0.0``)."""
    return SimpleNamespace(history=[], total=0.0)


@dataclass
class GrowthResult:
    """Per body name and iteration: graph-only bytes and the autograd nodes its backward calls walked
    (bytes run, exact counts), and seconds (time run).

    Used by notebooks 02_multi_loss and 04_carried_state.
    """

    iterations: int
    block: int
    graph_only_bytes: dict[str, list[int]] = field(default_factory=dict)
    backward_nodes: dict[str, list[int]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The bodies, in the order they were given."""
        return list(self.graph_only_bytes)

    def grows(self, name: str) -> bool:
        """True when the graph-only bytes after the last iteration exceed those after the first."""
        values = self.graph_only_bytes[name]
        return values[-1] > values[0]

    def growth_per_iteration(self, name: str) -> int:
        """Graph-only bytes added per iteration, averaged over the run and rounded down (0 when flat)."""
        values = self.graph_only_bytes[name]
        return (values[-1] - values[0]) // max(1, len(values) - 1)

    def block_milliseconds(self, name: str) -> list[float]:
        """The fastest iteration's milliseconds in each block of ``block`` consecutive iterations.

        The fastest rather than the median: other work on the machine only ever adds time, so the
        fastest iteration of a block is the one least disturbed by it.
        """
        times = self.seconds[name]
        return [
            min(times[start : start + self.block]) * 1e3 for start in range(0, len(times) - self.block + 1, self.block)
        ]

    def slowdown(self, name: str) -> float:
        """The last block's fastest iteration over the first block's (1.0: no slowdown)."""
        blocks = self.block_milliseconds(name)
        return blocks[-1] / blocks[0]

    def table(self, timing: bool = True) -> Table:
        """Per body: graph-only bytes at the end and per iteration; with ``timing``, the first and last
        block's fastest iteration and their ratio (machine-dependent, so leave it out where
        a notebook's output must be the same on every machine)."""
        headers = ["loop body", "graph-only bytes at the end", "growth per iteration"]
        if timing:
            headers += [f"ms/iteration, first {self.block}", f"ms/iteration, last {self.block}", "last / first"]
        rows = []
        for name in self.names:
            row: list[object] = [
                name,
                format_bytes(self.graph_only_bytes[name][-1]),
                format_bytes(self.growth_per_iteration(name)),
            ]
            if timing:
                blocks = self.block_milliseconds(name)
                row += [f"{blocks[0]:.2f}", f"{blocks[-1]:.2f}", f"{blocks[-1] / blocks[0]:.2f}"]
            rows.append(row)
        return Table(headers, rows)

    def chart(self) -> Figure:
        """Graph-only MiB per iteration (bytes run) and each block's fastest ms (time run), one line per body."""
        figure = PngFigure(figsize=(10, 3.4), dpi=90)
        memory_axes, time_axes = figure.subplots(1, 2)
        # Line styles as well as colours: bodies that grow alike draw on top of each other.
        styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1))]
        for index, name in enumerate(self.names):
            style = styles[index % len(styles)]
            values = self.graph_only_bytes[name]
            memory_axes.plot(
                range(1, len(values) + 1), [v / 2**20 for v in values], label=name, linestyle=style, linewidth=2
            )
            blocks = self.block_milliseconds(name)
            centres = [self.block * i + self.block / 2 for i in range(len(blocks))]
            time_axes.plot(centres, blocks, label=name, linestyle=style, marker="o", markersize=3)
        memory_axes.set_xlabel("iteration")
        memory_axes.set_ylabel("graph-only MiB")
        memory_axes.set_title("Memory kept alive by graphs (meter run)")
        time_axes.set_xlabel("iteration")
        time_axes.set_ylabel(f"ms per iteration (fastest of {self.block})")
        time_axes.set_title("Time per iteration (run without meter)")
        time_axes.set_ylim(bottom=0)
        memory_axes.legend(fontsize=8)
        figure.tight_layout()
        return figure


def _check_arguments(bodies: object, iterations: object, block: object) -> None:
    if not isinstance(bodies, Mapping) or not bodies:
        raise TypeError("growth_experiment() takes a non-empty dict of name -> loop body function.")
    for name, body in bodies.items():
        if not callable(body):
            raise TypeError(f"Loop body {name!r} is a {type(body).__name__}, not a function of one argument (state).")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 2:
        raise ValueError(f"iterations must be a whole number of at least 2, not {iterations!r}.")
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= iterations:
        raise ValueError(f"block must be a whole number from 1 to iterations ({iterations}), not {block!r}.")


def reachable_nodes(roots: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """How many autograd nodes a backward from ``roots`` walks: every node reachable from their grad_fn.

    Used by notebook 04_carried_state.
    """
    roots = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    return len(python_walk([t.grad_fn for t in roots if isinstance(t, torch.Tensor)]))


def _counting_backward_nodes(walked: list[int]) -> contextlib.AbstractContextManager[None]:
    """Inside: each ``backward()`` first appends to ``walked`` the number of nodes it is about to walk (through
    the one interception point, :func:`backward_twice.record.learner.intercepting`; ``torch.autograd.grad`` is not
    counted)."""

    def counting(engine: Callable[..., Any], outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kwargs.get("accumulate_grad", True):
            walked.append(reachable_nodes(outputs))
        return engine(outputs, *args, **kwargs)

    return intercepting(on_backward=counting)


@one_thread()
def growth_experiment(
    bodies: Mapping[str, Body],
    iterations: int = 100,
    block: int | None = None,
    progress: bool = True,
    new_state: Callable[[], Any] = new_loop_state,
) -> GrowthResult:
    """Run each loop body ``iterations`` times, once for bytes (with the meter) and once for time (without).

    Each body is called as ``body(state)``, with a fresh ``state = new_state()`` per body and per run
    (by default ``state.history == []``, ``state.total == 0.0``); everything a body kept is dropped before the
    next run. The time run calls every body :data:`WARM_UP_ITERATIONS` times untimed first, then
    interleaves them (:func:`helpers.measure.time_round_robin`). ``block`` (default: a tenth of the
    iterations) is the block size for the per-block figures of :class:`GrowthResult`. All of it runs on one of
    PyTorch's threads (:func:`helpers.measure.one_thread`).

    Used by notebooks 02_multi_loss and 04_carried_state.
    """
    block = max(1, iterations // 10) if block is None and isinstance(iterations, int) else block
    _check_arguments(bodies, iterations, block)
    assert block is not None
    result = GrowthResult(iterations, block)
    bar = tqdm(total=iterations * len(bodies), desc="bytes run", disable=not progress, leave=True)
    for name, body in bodies.items():
        meter, state, memory, nodes = SavedTensorMeter(), new_state(), [], []
        for _ in range(iterations):
            walked: list[int] = []
            with meter, _counting_backward_nodes(walked):
                body(state)
            memory.append(meter.graph_only_bytes)
            nodes.append(sum(walked))
            bar.update()
        result.graph_only_bytes[name] = memory
        result.backward_nodes[name] = nodes
        del state
    for body in bodies.values():
        warm = new_state()
        for _ in range(WARM_UP_ITERATIONS):
            body(warm)
        del warm
    bar.close()
    states = {name: new_state() for name in bodies}
    result.seconds = time_round_robin(
        {name: functools.partial(body, states[name]) for name, body in bodies.items()},
        iterations,
        progress=progress,
        desc="time run",
    )
    del states
    if progress:
        print(
            f"Ran {iterations} iterations of each of {len(bodies)} loop bodies, once with the meter "
            "(bytes) and once without (time)."
        )
    return result
