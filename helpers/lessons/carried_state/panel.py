"""CarriedLab: a panel that runs a recurrent training loop with a hidden state carried from batch to batch,
with toggles for ``h.detach()``, ``retain_graph`` and the optimizer step, and live counters per iteration.

The loop runs twice, on two identical copies of the model, so that the instrument never enters the figure
it explains: the **counted copy** runs inside a :class:`SavedTensorMeter` (graph-only bytes after each
iteration) and counts the autograd nodes each backward walks; the **timed copy** runs without the meter
and times each ``backward()`` alone. Both do the same float operations in the same order, so they fail
at the same iteration; the timed copy runs only after the counted one succeeded.

Used by notebook 04_carried_state.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import ipywidgets as widgets
import torch

from backward_twice.common.error_kinds import error_kind
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.display import exact_bytes
from helpers.figures import PngFigure, style_count_axes
from helpers.growth import reachable_nodes
from helpers.panels import Panel

__all__ = ["CarriedLab"]

ChunkLoss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
LEARNING_RATE = 0.1
Value = TypeVar("Value")


def _last(values: Sequence[Value], text: Callable[[Value], str]) -> str:
    """The last value as ``text`` writes it, or "-" before the first iteration."""
    return text(values[-1]) if values else "-"


class _Copy:
    """One copy of the model with its SGD optimizer and the hidden state it carries."""

    def __init__(self, model: torch.nn.Module, h0: torch.Tensor) -> None:
        self.model = copy.deepcopy(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.h = h0.clone()


class CarriedLab(Panel):
    """A panel around ``chunk_loss(model, h, inputs, targets) -> (loss, h)``, one chunk of a sequence.

    Each iteration takes the next batch (cycling through ``batches``) and runs, with the toggles' values::

        if detach: h = h.detach()
        loss, h = chunk_loss(model, h, inputs, targets)
        optimizer.zero_grad()
        loss.backward(retain_graph=retain)
        if step: optimizer.step()

    on copies of ``model`` (the model given is never changed), ``h`` starting at zeros of shape
    ``(batch, hidden_size)``. **Run** runs the number of iterations in the box, continuing from where the
    last run stopped; an error stops the run and shows in the panel, which stays usable (**Reset** starts
    again from the first batch). Counters show the iteration, the autograd nodes the last backward walked,
    the graph-only bytes after it and its milliseconds; a chart of all three per iteration stays in the
    saved notebook.

    Drive it by clicking, or from Python: ``lab.detach.value = True``, ``lab.iterations.value = 5``,
    ``lab.run_button.click()``; read ``lab.nodes``, ``lab.graph_only_bytes``, ``lab.backward_ms``.

    Used by notebook 04_carried_state.
    """

    def __init__(
        self,
        chunk_loss: ChunkLoss,
        model: torch.nn.Module,
        batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        hidden_size: int,
        iterations: int = 10,
        title: str = "Carried state lab",
    ) -> None:
        if not callable(chunk_loss):
            raise TypeError(
                f"CarriedLab needs a function chunk_loss(model, h, inputs, targets) -> (loss, h), "
                f"not {type(chunk_loss).__name__}."
            )
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"CarriedLab(model=...) takes a torch.nn.Module, not {type(model).__name__}.")
        if (
            not isinstance(batches, Sequence)
            or not batches
            or not all(
                isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b)
                for b in batches
            )
        ):
            raise TypeError("CarriedLab(batches=...) takes a non-empty list of (inputs, targets) tensor pairs.")
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"CarriedLab(hidden_size=...) must be a positive whole number, not {hidden_size!r}.")
        inputs = batches[0][0]
        if inputs.dim() < 2:
            raise ValueError(
                f"CarriedLab: each batch's inputs must be (steps, batch, ...), got shape {tuple(inputs.shape)}."
            )
        self._chunk_loss, self._model, self._batches = chunk_loss, model, list(batches)
        self._h0 = torch.zeros(inputs.shape[1], hidden_size)
        self._build_widgets(title, iterations)
        self._start()
        self._refresh("Press Run: the toggles set how the loop treats h.")

    # -- widgets ---------------------------------------------------------------------------
    def _build_widgets(self, title: str, iterations: int) -> None:
        self.detach = self._checkbox(
            "h = h.detach() before each chunk",
            "Cut the graph at the batch boundary: truncated backpropagation through time",
            "bt-detach",
            on_change=self._show_loop,
        )
        self.retain = self._checkbox(
            "loss.backward(retain_graph=True)",
            "Keep every buffer the backward goes through, instead of freeing it",
            "bt-retain",
            on_change=self._show_loop,
        )
        self.step = self._checkbox(
            "optimizer.step()",
            "Update the weights in place after each backward",
            "bt-step",
            value=True,
            on_change=self._show_loop,
        )
        self.iterations = self._iterations_box(iterations, 200, "How many iterations one press of Run runs")
        self.run_button = self._button(
            "Run",
            "Run that many iterations, continuing from the last one",
            "bt-run",
            lambda: self.run(self.iterations.value),
        )
        self.reset_button = self._button(
            "Reset", "Start again: fresh copies of the model, h = zeros, first batch", "bt-reset", self.reset
        )
        self.loop = widgets.HTML()
        self.loop.add_class("bt-loop")
        self.values, figures = self._figure_rows(
            [
                ("iteration", "iterations run", "Iterations that finished since the last reset"),
                ("nodes", "nodes walked", "Autograd nodes reachable from the last loss: what its backward walks"),
                (
                    "graph-only-bytes",
                    "graph-only bytes",
                    "Saved bytes only graphs keep alive after the last iteration (the meter, on the counted copy)",
                ),
                ("backward-ms", "backward ms", "The last backward's milliseconds (the timed copy, without the meter)"),
            ],
            css="bt-value",
        )
        self.status = self._status_line("bt-status")
        self.panel = widgets.VBox(
            [
                widgets.HTML(f"<b>{title}</b>"),
                widgets.HBox([self.detach, self.retain, self.step]),
                self.loop,
                widgets.HBox([self.iterations, self.run_button, self.reset_button]),
                figures,
                self.status,
            ]
        )
        self.panel.add_class("bt-carried-lab")
        self._show_loop()

    def _show_loop(self) -> None:
        lines = ["for inputs, targets in batches:"]
        if self.detach.value:
            lines.append("    h = h.detach()")
        lines += [
            "    loss, h = chunk_loss(model, h, inputs, targets)",
            "    optimizer.zero_grad()",
            f"    loss.backward({'retain_graph=True' if self.retain.value else ''})",
        ]
        if self.step.value:
            lines.append("    optimizer.step()")
        self.loop.value = "<pre style='margin:2px 0'>" + "\n".join(lines) + "</pre>"

    # -- actions ---------------------------------------------------------------------------
    def _start(self) -> None:
        self.counted, self.timed = _Copy(self._model, self._h0), _Copy(self._model, self._h0)
        self.meter = SavedTensorMeter()
        self.nodes: list[int] = []
        self.graph_only_bytes: list[int] = []
        self.backward_ms: list[float] = []
        self.last_error: str | None = None

    def reset(self) -> None:
        """Fresh copies of the model and optimizer, ``h`` zeros, the first batch, no counters, no error."""
        self._start()
        self._refresh("Reset: fresh model copies, h = zeros, first batch.")
        self._update_chart()

    def _iteration(self, run: _Copy, inputs: torch.Tensor, targets: torch.Tensor, counted: bool) -> None:
        if self.detach.value:
            run.h = run.h.detach()
        with self.meter if counted else contextlib.nullcontext():
            loss, run.h = self._chunk_loss(run.model, run.h, inputs, targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise TypeError("chunk_loss must return (loss, h), loss a one-number tensor with a graph.")
        run.optimizer.zero_grad()
        if counted:
            self.nodes.append(reachable_nodes(loss))
            loss.backward(retain_graph=self.retain.value)
        else:
            start = time.perf_counter()
            loss.backward(retain_graph=self.retain.value)
            self.backward_ms.append((time.perf_counter() - start) * 1e3)
        if self.step.value:
            run.optimizer.step()
        if counted:
            del loss
            self.graph_only_bytes.append(self.meter.graph_only_bytes)

    def run(self, iterations: int) -> None:
        """Run ``iterations`` more iterations on both copies; stop at the first error, naming its iteration."""
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive whole number, not {iterations!r}.")
        if self.last_error is not None:
            raise RuntimeError("the last run stopped with an error and h still carries its graph: press Reset.")
        try:
            for _ in range(iterations):
                number = len(self.backward_ms) + 1
                inputs, targets = self._batches[(number - 1) % len(self._batches)]
                try:
                    self._iteration(self.counted, inputs, targets, counted=True)
                except RuntimeError as exc:
                    del self.nodes[number - 1 :]
                    raise RuntimeError(f"iteration {number}: {exc}") from exc
                self._iteration(self.timed, inputs, targets, counted=False)
        finally:
            self._update_chart()
        self._refresh(f"Ran {iterations} iterations.")

    def _after_error(self) -> None:
        self._refresh(error=self.last_error)
        self._update_chart()

    def _refresh(self, message: str = "", error: str | None = None) -> None:
        self.values["iteration"].value = str(len(self.backward_ms))
        self.values["nodes"].value = _last(self.nodes, str)
        self.values["graph-only-bytes"].value = _last(self.graph_only_bytes, exact_bytes)
        self.values["backward-ms"].value = _last(self.backward_ms, lambda ms: f"{ms:.2f}")
        self._show_status_or_error(message, error, "the panel still works: press Reset to start again")

    @property
    def outcome(self) -> str:
        """ "ran N iterations" since the last reset, or the iteration that failed and the error's kind."""
        if self.last_error is None:
            return f"ran {len(self.backward_ms)} iterations"
        return f"iteration {len(self.backward_ms) + 1}: {error_kind(self.last_error)}"

    # -- chart -----------------------------------------------------------------------------
    def chart_figure(self) -> PngFigure:
        """Nodes walked, graph-only KiB and backward ms per iteration, side by side."""
        figure = PngFigure(figsize=(9, 2.5), dpi=90)
        series: list[tuple[Sequence[float], str]] = [
            (self.nodes, "nodes walked by backward"),
            ([b / 1024 for b in self.graph_only_bytes], "graph-only KiB (meter)"),
            (self.backward_ms, "backward ms (no meter)"),
        ]
        for axes, (values, label) in zip(figure.subplots(1, 3), series):
            axes.plot(range(1, len(values) + 1), values, marker="o", markersize=3)
            style_count_axes(axes, label, "iteration", title_size=10)
        figure.tight_layout()
        return figure
