"""Does a training loop grow memory, time per iteration, or both? Loop bodies measured side by side.

The notebook writes each way of running an iteration as a small function ``body(state)``; ``state``
lives as long as the loop (``state.history`` is a list, ``state.total`` starts at ``0.0``), so the
lines that keep tensors alive stay on the notebook's page. :func:`growth_experiment` runs every body
twice, in two separate runs, so that the instrument never enters the figures it explains:

* a **bytes run**: each body's iterations inside a :class:`SavedTensorMeter`, graph-only bytes read
  after every iteration (exact integers, the same on every machine);
* a **time run**: no meter, the bodies' iterations interleaved round-robin (iteration 1 of every
  body, then iteration 2, ...) so that a machine's slow drifts hit all bodies alike, each call timed.

Used by notebook 02_multi_loss.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from matplotlib.figure import Figure
from tqdm.auto import tqdm

from helpers.figures import PngFigure
from helpers.meter import SavedTensorMeter, format_bytes
from helpers.tables import Table

__all__ = ["GrowthResult", "growth_experiment"]

Body = Callable[[SimpleNamespace], object]
WARM_UP_ITERATIONS = 3


def new_loop_state() -> SimpleNamespace:
    """What one loop keeps across its iterations: ``history`` (a list) and ``total`` (``0.0``)."""
    return SimpleNamespace(history=[], total=0.0)


@dataclass
class GrowthResult:
    """Graph-only bytes (bytes run) and seconds (time run) after each iteration, per body name.

    Used by notebook 02_multi_loss.
    """

    iterations: int
    block: int
    graph_only_bytes: dict[str, list[int]] = field(default_factory=dict)
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
        return [min(times[start:start + self.block]) * 1e3
                for start in range(0, len(times) - self.block + 1, self.block)]

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
            row: list[object] = [name, format_bytes(self.graph_only_bytes[name][-1]),
                                 format_bytes(self.growth_per_iteration(name))]
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
            memory_axes.plot(range(1, len(values) + 1), [v / 2**20 for v in values], label=name, linestyle=style,
                             linewidth=2)
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


def growth_experiment(
    bodies: Mapping[str, Body],
    iterations: int = 100,
    block: int | None = None,
    progress: bool = True,
) -> GrowthResult:
    """Run each loop body ``iterations`` times, once for bytes (with the meter) and once for time (without).

    Each body is called as ``body(state)``, with a fresh ``state`` per body and per run
    (``state.history == []``, ``state.total == 0.0``); everything a body kept is dropped before the
    next run. The time run calls every body :data:`WARM_UP_ITERATIONS` times untimed first, then
    interleaves them. ``block`` (default: a tenth of the iterations) is the block size for the
    per-block figures of :class:`GrowthResult`. Used by notebook 02_multi_loss.
    """
    block = max(1, iterations // 10) if block is None and isinstance(iterations, int) else block
    _check_arguments(bodies, iterations, block)
    assert block is not None
    result = GrowthResult(iterations, block)
    bar = tqdm(total=2 * iterations * len(bodies), desc="iterations", disable=not progress, leave=True)
    for name, body in bodies.items():
        meter, state, memory = SavedTensorMeter(), new_loop_state(), []
        for _ in range(iterations):
            with meter:
                body(state)
            memory.append(meter.graph_only_bytes)
            bar.update()
        result.graph_only_bytes[name] = memory
        del state
    for body in bodies.values():
        warm = new_loop_state()
        for _ in range(WARM_UP_ITERATIONS):
            body(warm)
        del warm
    states = {name: new_loop_state() for name in bodies}
    seconds: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(iterations):
        for name, body in bodies.items():
            start = time.perf_counter()
            body(states[name])
            seconds[name].append(time.perf_counter() - start)
        bar.update(len(bodies))
    del states
    bar.close()
    result.seconds = seconds
    if progress:
        print(f"Ran {iterations} iterations of each of {len(bodies)} loop bodies, once with the meter "
              "(bytes) and once without (time).")
    return result
