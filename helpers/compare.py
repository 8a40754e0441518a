"""Run several ways of doing one training step side by side: gradients, time and memory.

Every pattern is a function that runs one full step (forward and backward) on the same model and
data, leaving gradients in ``.grad``. :func:`compare_patterns` checks each pattern's gradients
against a reference pattern, times them in alternating rounds (so machine noise hits all alike),
takes the peak graph-only bytes from a :class:`SavedTensorMeter` and cross-checks memory with
``torch.profiler``'s allocation events (the measurements themselves live in :mod:`helpers.measure`).

Used by notebooks 02_multi_loss and 03_gan_step.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.display import Table
from helpers.figures import PngFigure
from helpers.measure import compare_gradients, gradients_of, one_thread, profiler_peak_bytes, time_round_robin

__all__ = ["PatternComparison", "PatternResult", "compare_patterns"]

Step = Callable[[], None]


@dataclass(frozen=True)
class PatternResult:
    """One pattern's figures from :func:`compare_patterns` (notebooks 02_multi_loss and 03_gan_step)."""

    name: str
    gradients: str  # "bit-equal", "close (max diff ...)" or "DIFFERENT (max diff ...)"
    bit_equal: bool
    close: bool
    max_difference: float
    seconds_per_step: float
    time_ratio: float
    peak_graph_only_bytes: int
    profiler_peak_bytes: int


def _short_label(name: str) -> str:
    """``'(a) retain, then backward'`` -> ``'(a)'``; other names wrapped to fit under a bar."""
    if name.startswith("(") and ")" in name:
        return name[: name.index(")") + 1]
    return textwrap.fill(name, 16)


@dataclass
class PatternComparison:
    """What :func:`compare_patterns` measured, as a table and a chart (notebooks 02 and 03)."""

    reference: str
    results: list[PatternResult]
    rounds: int

    def __getitem__(self, name: str) -> PatternResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"No pattern {name!r}; the patterns are {[r.name for r in self.results]}.")

    def table(self, timing: bool = True) -> Table:
        """One row per pattern: gradients against the reference and the meter's peak; with ``timing``, also
        the time, the profiler's peak and the size of any gradient difference, which depend on the machine
        (leave them out where a notebook's output must be the same everywhere)."""
        columns = ["pattern", f"gradients vs {self.reference}"]
        columns += ["time per step", f"time / {self.reference}"] if timing else []
        columns += ["peak graph-only (meter)"] + (["peak allocated (profiler)"] if timing else [])
        rows = []
        for r in self.results:
            verdict = (
                r.gradients
                if timing
                else ("bit-equal" if r.bit_equal else "equal up to float rounding" if r.close else "DIFFERENT")
            )
            row = [r.name, verdict]
            if timing:
                row += [f"{r.seconds_per_step * 1e3:.2f} ms", f"{r.time_ratio:.2f}x"]
            row.append(format_bytes(r.peak_graph_only_bytes))
            if timing:
                row.append(format_bytes(r.profiler_peak_bytes))
            rows.append(row)
        return Table(columns, rows)

    def chart(self) -> Figure:
        """Bars: time relative to the reference, and the two memory figures, per pattern."""
        figure = PngFigure(figsize=(10, 3.4), dpi=90)
        names = [r.name for r in self.results]
        short = [_short_label(name) for name in names]
        time_axes, memory_axes = figure.subplots(1, 2)
        time_axes.bar(short, [r.time_ratio for r in self.results], color="tab:blue")
        time_axes.axhline(1.0, color="gray", linewidth=1, linestyle="--")
        time_axes.set_ylabel(f"time per step / {_short_label(self.reference)}")
        time_axes.set_title(f"Time (median of {self.rounds} rounds)")
        positions = range(len(names))
        width = 0.4
        memory_axes.bar(
            [p - width / 2 for p in positions],
            [r.peak_graph_only_bytes / 1024 for r in self.results],
            width,
            label="peak graph-only (meter)",
            color="tab:orange",
        )
        memory_axes.bar(
            [p + width / 2 for p in positions],
            [r.profiler_peak_bytes / 1024 for r in self.results],
            width,
            label="peak allocated (profiler)",
            color="tab:gray",
        )
        memory_axes.set_xticks(list(positions), short)
        memory_axes.set_ylabel("KiB")
        memory_axes.set_title("Memory during one step")
        top = max(max(r.peak_graph_only_bytes, r.profiler_peak_bytes) for r in self.results) / 1024
        memory_axes.set_ylim(0, top * 1.3)  # room for the legend above the bars
        memory_axes.legend(fontsize=8, loc="upper left", ncol=2)
        figure.tight_layout()
        return figure


@one_thread()
def compare_patterns(
    patterns: Mapping[str, Step],
    model: torch.nn.Module,
    reference: str,
    rounds: int = 30,
    progress: bool = True,
) -> PatternComparison:
    """Measure each pattern on ``model``: gradients vs ``reference``, time per step, memory.

    Each pattern runs one complete step (forward and backward, no optimizer step, so every
    pattern sees the same weights). Gradients are compared after one step from zeroed
    ``.grad``; time is the median over ``rounds`` alternating rounds; memory is the meter's peak
    graph-only bytes and the profiler's peak allocation over one step. All of it runs on one of
    PyTorch's threads (:func:`helpers.measure.one_thread`). Used by notebooks 02_multi_loss and
    03_gan_step.
    """
    if not isinstance(patterns, Mapping) or not patterns:
        raise TypeError("compare_patterns() takes a non-empty dict of name -> step function.")
    if reference not in patterns:
        raise ValueError(f"reference={reference!r} is not one of the patterns {list(patterns)}.")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compare_patterns(model=...) takes a torch.nn.Module, not {type(model).__name__}.")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive whole number, not {rounds!r}.")
    for name, step in patterns.items():
        if not callable(step):
            raise TypeError(f"Pattern {name!r} is not a function.")

    gradients: dict[str, dict[str, torch.Tensor | None]] = {}
    peaks: dict[str, int] = {}
    profiled: dict[str, int] = {}
    for name, step in patterns.items():
        model.zero_grad(set_to_none=True)
        meter = SavedTensorMeter()
        with meter:
            step()
        peaks[name] = meter.peak_graph_only_bytes
        gradients[name] = gradients_of(model)
        model.zero_grad(set_to_none=True)
        profiled[name] = profiler_peak_bytes(step)

    names = list(patterns)
    times = time_round_robin(patterns, rounds, before_each=lambda: model.zero_grad(set_to_none=True), progress=progress)
    model.zero_grad(set_to_none=True)

    reference_time = statistics.median(times[reference])
    results = []
    for name in names:
        match = compare_gradients(gradients[name], gradients[reference])
        if match.bit_equal:
            verdict = "bit-equal"
        elif match.close:
            verdict = f"close (max diff {match.max_difference:.1e})"
        else:
            verdict = f"DIFFERENT (max diff {match.max_difference:.1e})"
        median = statistics.median(times[name])
        results.append(
            PatternResult(
                name,
                verdict,
                match.bit_equal,
                match.close,
                match.max_difference,
                median,
                median / reference_time,
                peaks[name],
                profiled[name],
            )
        )
    if progress:
        print(f"Measured {len(names)} patterns: gradients, {rounds} timing rounds, meter and profiler memory.")
    return PatternComparison(reference, results, rounds)
