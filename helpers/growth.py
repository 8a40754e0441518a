"""When does memory grow over iterations? retain_graph on/off crossed with what the loop keeps.

A training loop runs N iterations per variant inside a :class:`SavedTensorMeter`; after each
iteration it records the graph-only bytes and the time the iteration took. The variants differ
only in ``retain_graph`` and in what the loop keeps of each loss: the tensor
(``history.append(loss)``), a running sum of tensors (``total += loss``) or the number
(``loss.item()``).

Used by notebook 02_multi_loss.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from helpers.figures import PngFigure
from helpers.meter import SavedTensorMeter, format_bytes
from helpers.tables import Table

__all__ = ["GrowthResult", "GrowthVariant", "growth_experiment"]

if sys.platform != "win32":
    import resource
else:  # pragma: no cover - the course runs on Linux and macOS; Windows has no getrusage
    resource = None

Keep = Literal["tensor", "sum", "value"]
KEEP_CODE = {"tensor": "history.append(loss)", "sum": "total += loss", "value": "history.append(loss.item())"}


@dataclass(frozen=True)
class GrowthVariant:
    """One way to write the loop: ``retain_graph`` on the backward, and what is kept of the loss.

    Used by notebook 02_multi_loss.
    """

    retain_graph: bool
    keep: Keep

    def __post_init__(self) -> None:
        if not isinstance(self.retain_graph, bool):
            raise TypeError(f"GrowthVariant.retain_graph must be True or False, not {self.retain_graph!r}.")
        if self.keep not in KEEP_CODE:
            raise ValueError(f"GrowthVariant.keep must be one of {list(KEEP_CODE)}, not {self.keep!r}.")

    @property
    def code(self) -> str:
        """The two lines of the loop this variant stands for."""
        return f"loss.backward(retain_graph={self.retain_graph}); {KEEP_CODE[self.keep]}"


@dataclass
class GrowthResult:
    """Graph-only bytes and seconds after each iteration, per variant name (notebook 02_multi_loss)."""

    iterations: int
    variants: dict[str, GrowthVariant]
    graph_only_bytes: dict[str, list[int]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    page_faults: dict[str, list[int]] = field(default_factory=dict)  # empty where getrusage is missing

    def growth_per_iteration(self, name: str) -> float:
        """Average bytes added per iteration over the run (0 when memory stays flat)."""
        values = self.graph_only_bytes[name]
        return (values[-1] - values[0]) / max(1, len(values) - 1)

    def grows(self, name: str) -> bool:
        """True when the graph-only bytes after the last iteration exceed those after the first."""
        values = self.graph_only_bytes[name]
        return values[-1] > values[0]

    def slowdown(self, name: str) -> float:
        """Median time of the last tenth of the iterations over that of the first tenth."""
        window = max(1, self.iterations // 10)
        times = self.seconds[name]
        return statistics.median(times[-window:]) / statistics.median(times[:window])

    def faults_per_iteration(self, name: str) -> float | None:
        """Minor page faults per iteration: memory the process had to get fresh from the system."""
        faults = self.page_faults.get(name)
        return None if not faults else sum(faults) / len(faults)

    def table(self) -> Table:
        """Per variant: final graph-only bytes, growth per iteration, the median time of the first and
        last tenth of the iterations with their ratio (above 1: later iterations were slower), and the
        minor page faults per iteration (fresh memory from the operating system)."""
        window = max(1, self.iterations // 10)
        rows = []
        for name, variant in self.variants.items():
            times = self.seconds[name]
            early, late = statistics.median(times[:window]), statistics.median(times[-window:])
            faults = self.faults_per_iteration(name)
            rows.append([name, variant.code, format_bytes(self.graph_only_bytes[name][-1]),
                         format_bytes(int(self.growth_per_iteration(name))),
                         f"{early * 1e3:.2f} ms", f"{late * 1e3:.2f} ms", f"{late / early:.2f}",
                         "-" if faults is None else f"{faults:.1f}"])
        return Table(["variant", "loop body", "graph-only bytes at the end", "growth per iteration",
                      f"time, first {window}", f"time, last {window}", "last / first",
                      "page faults per iteration"], rows)

    def chart(self) -> Figure:
        """Graph-only MiB and time per iteration (a moving median), one line per variant."""
        figure = PngFigure(figsize=(10, 3.4), dpi=90)
        memory_axes, time_axes = figure.subplots(1, 2)
        window = max(1, self.iterations // 20)
        # Line styles as well as colours: variants that grow alike draw on top of each other.
        styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]
        for index, name in enumerate(self.variants):
            style = styles[index % len(styles)]
            values = self.graph_only_bytes[name]
            memory_axes.plot(range(1, len(values) + 1), [v / 2**20 for v in values], label=name, linestyle=style,
                             linewidth=2)
            times = self.seconds[name]
            smooth = [statistics.median(times[max(0, i - window):i + 1]) * 1e3 for i in range(len(times))]
            time_axes.plot(range(1, len(smooth) + 1), smooth, label=name, linestyle=style)
        memory_axes.set_xlabel("iteration")
        memory_axes.set_ylabel("graph-only MiB")
        memory_axes.set_title("Memory kept alive by graphs")
        time_axes.set_xlabel("iteration")
        time_axes.set_ylabel("ms per iteration (moving median)")
        time_axes.set_title("Time per iteration")
        time_axes.set_ylim(bottom=0)
        memory_axes.legend(fontsize=8)
        figure.tight_layout()
        return figure


def growth_experiment(
    loss_fn: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    variants: Mapping[str, GrowthVariant],
    iterations: int = 100,
    progress: bool = True,
) -> GrowthResult:
    """Run ``iterations`` training steps per variant and record memory and time after each.

    ``loss_fn`` runs the forward pass and returns a scalar loss; each iteration is
    ``zero_grad``, ``loss_fn()``, backward with the variant's ``retain_graph``, ``optimizer.step()``
    and then the variant's way of keeping the loss. Everything a variant kept is dropped before
    the next variant starts. Three untimed warm-up steps run first. Used by notebook 02_multi_loss.
    """
    if not callable(loss_fn):
        raise TypeError(f"growth_experiment() needs a loss function, not {type(loss_fn).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"growth_experiment(optimizer=...) takes a torch optimizer, not {type(optimizer).__name__}.")
    if not isinstance(variants, Mapping) or not variants:
        raise TypeError("growth_experiment() takes a non-empty dict of name -> GrowthVariant.")
    for name, variant in variants.items():
        if not isinstance(variant, GrowthVariant):
            raise TypeError(f"Variant {name!r} is a {type(variant).__name__}, not a GrowthVariant.")
    if not isinstance(iterations, int) or iterations < 2:
        raise ValueError(f"iterations must be a whole number of at least 2, not {iterations!r}.")

    result = GrowthResult(iterations, dict(variants))
    for _ in range(3):  # warm up (the optimizer's first steps are slow), keeping nothing
        optimizer.zero_grad(set_to_none=True)
        loss_fn().backward()
        optimizer.step()
    bar = tqdm(total=iterations * len(variants), desc="iterations", disable=not progress, leave=True)
    for name, variant in variants.items():
        meter = SavedTensorMeter()
        history: list[object] = []
        total: torch.Tensor | float = 0.0
        memory, seconds, faults = [], [], []
        for _ in range(iterations):
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with meter:
                loss = loss_fn()
            loss.backward(retain_graph=variant.retain_graph)
            optimizer.step()
            if variant.keep == "tensor":
                history.append(loss)
            elif variant.keep == "sum":
                total += loss
            else:
                history.append(loss.item())
            seconds.append(time.perf_counter() - start)
            if resource:
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
            del loss
            memory.append(meter.graph_only_bytes)
            bar.update()
        result.graph_only_bytes[name] = memory
        result.seconds[name] = seconds
        if resource:
            result.page_faults[name] = faults
        del history, total
    bar.close()
    if progress:
        print(f"Ran {iterations} iterations for each of {len(variants)} variants.")
    return result
