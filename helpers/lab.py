"""BackwardLab: a panel to toggle retain_graph on each backward and watch the saved bytes.

Used by notebooks 01_graph_buffers and 02_multi_loss. Notebook 01 gives it one loss, notebook 02 several.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import torch

from backward_twice.instruments.meter import SavedTensorMeter
from helpers.display import exact_bytes
from helpers.figures import PngFigure, style_count_axes
from helpers.panels import Panel

__all__ = ["BackwardLab"]

# More labels than this would run into each other under the chart: label one point in every few.
_MOST_LABELS = 48
# PyTorch's error for a backward through buffers that an earlier backward freed.
_FREED = "backward through the graph a second time"

ForwardFn = Callable[[], "torch.Tensor | Mapping[str, torch.Tensor]"]


def _css_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", name).strip("-") or "loss"


class BackwardLab(Panel):
    """An ipywidgets panel around a forward function that returns one or more named losses.

    Buttons run forward (inside a :class:`SavedTensorMeter`), each loss's backward with its own
    ``retain_graph`` checkbox, ``zero_grad``, reset (back to the panel's defaults, every box
    unticked), and N iterations (optionally keeping every loss in a history list, the way memory
    really grows). Live figures show the meter's saved, graph-only and peak bytes, the number of
    backward calls and the watched parameter's accumulated ``.grad``; errors are shown in the panel,
    which stays usable, and a ``retain_graph`` ticked after the backward that freed the buffers is
    told that the flag acts on that earlier backward. A chart of graph-only bytes after each action,
    each point labelled with its action (F, B, R, ...), is kept as an image in the saved notebook.

    Drive it by clicking, or from Python: ``lab.forward_button.click()``,
    ``lab.retain[name].value = True``, ``lab.backward_buttons[name].click()``.

    Used by notebooks 01_graph_buffers and 02_multi_loss.
    """

    def __init__(
        self,
        forward: ForwardFn,
        model: torch.nn.Module,
        watch: str | None = None,
        title: str = "retain_graph lab",
        iterations: int = 20,
    ) -> None:
        if not callable(forward):
            raise TypeError(f"BackwardLab needs a forward function, not {type(forward).__name__}.")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"BackwardLab(model=...) takes a torch.nn.Module, not {type(model).__name__}.")
        parameters = dict(model.named_parameters())
        if not parameters:
            raise ValueError("BackwardLab(model=...): the model has no parameters to watch.")
        if watch is None:
            watch = next(iter(parameters))
        if watch not in parameters:
            raise ValueError(f"BackwardLab(watch={watch!r}): no such parameter; choose one of {sorted(parameters)}.")
        self._forward = forward
        self.model = model
        self.watch = watch
        self.meter = SavedTensorMeter()
        self.loss_names = list(self._validated(forward()).keys())
        self.losses: dict[str, torch.Tensor] | None = None
        self.kept: list[dict[str, torch.Tensor]] = []
        self.backward_calls = 0
        self.last_error: str | None = None
        self.actions: list[tuple[str, int]] = [("start", self.meter.graph_only_bytes)]
        self._first_grad: float | None = None
        self._freed_by: str | None = None  # a loss whose backward ran without retain_graph since the last forward
        self._running = False
        self._build_widgets(title, iterations)
        self._refresh("Press Forward to build a graph.")

    # -- validation ------------------------------------------------------------------------
    @staticmethod
    def _validated(result: Any) -> dict[str, torch.Tensor]:
        if isinstance(result, torch.Tensor):
            losses = {"loss": result}
        elif isinstance(result, Mapping) and result:
            losses = dict(result)
        else:
            raise TypeError(
                "The lab's forward function must return a scalar loss tensor or a dict of named "
                f"scalar losses, not {type(result).__name__}."
            )
        for name, loss in losses.items():
            if not isinstance(name, str):
                raise TypeError(f"Loss names must be strings; got {name!r}.")
            if not isinstance(loss, torch.Tensor):
                raise TypeError(f"Loss {name!r} is a {type(loss).__name__}, not a tensor.")
            if loss.numel() != 1:
                raise ValueError(
                    f"Loss {name!r} has shape {tuple(loss.shape)}; backward() without a gradient "
                    "argument needs a single number. Reduce it with .mean() or .sum()."
                )
            if loss.grad_fn is None:
                raise ValueError(
                    f"Loss {name!r} has no autograd graph: nothing it was computed from requires "
                    "grad (or it ran under torch.no_grad()). Compute it from the model's parameters."
                )
        return losses

    # -- widgets ---------------------------------------------------------------------------
    def _build_widgets(self, title: str, iterations: int) -> None:
        self.forward_button = self._button(
            "Forward",
            "Run the forward pass inside the meter: builds a new graph that saves tensors for backward",
            "bt-forward",
            self.forward,
        )
        # Alone in the panel's column it would stretch into a full-width bar that reads as a header.
        self.forward_button.layout.align_self = "flex-start"
        self.retain: dict[str, widgets.Checkbox] = {}
        self.backward_buttons: dict[str, widgets.Button] = {}
        loss_rows = []
        for name in self.loss_names:
            css = _css_name(name)
            checkbox = self._checkbox(
                f"retain_graph for {name}",
                f"Keep the graph's buffers after {name}.backward()",
                f"bt-retain-{css}",
                on_change=functools.partial(self._retain_changed, name),
            )
            self.retain[name] = checkbox
            button = self._button(
                f"{name}.backward()",
                f"Backpropagate {name} with the retain_graph setting beside it",
                f"bt-backward-{css}",
                functools.partial(self.backward, name),
            )
            self.backward_buttons[name] = button
            loss_rows.append(widgets.HBox([button, checkbox]))
        self.zero_grad_button = self._button(
            "zero_grad()", "Set every parameter's .grad to None", "bt-zero-grad", self.zero_grad
        )
        self.reset_button = self._button(
            "Reset",
            "Back to the start: drop every graph and loss, clear .grad and the counters, untick every box",
            "bt-reset",
            self.reset,
        )
        self.keep_history = self._checkbox(
            "keep each loss in a history list",
            "Like history.append(loss): the list keeps every iteration's graph reachable",
            "bt-keep-history",
        )
        self.iterations = self._iterations_box(iterations, 1000, "How many forward + backward iterations to run")
        self._default_iterations = iterations
        self.run_button = self._button(
            "Run iterations",
            "Forward, then every loss's backward, repeated",
            "bt-run",
            lambda: self.run(self.iterations.value),
        )
        self.run_button.layout.margin = "2px 2px 2px 14px"  # apart from the history checkbox's label
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="progress", layout=widgets.Layout(width="300px")
        )
        self.progress.add_class("bt-progress")

        self.values, figures = self._figure_rows(
            [
                (
                    "saved-tensors",
                    "saved tensors",
                    "Saved tensors alive now (a buffer saved by two nodes counts twice)",
                ),
                (
                    "saved-bytes",
                    "saved bytes",
                    "Distinct storages held by saved tensors, parameters and inputs included",
                ),
                (
                    "graph-only-bytes",
                    "graph-only bytes",
                    "Saved bytes nothing but the graph keeps alive: what backward() frees",
                ),
                ("peak-bytes", "peak graph-only bytes", "Highest graph-only bytes since the last reset"),
                ("backward-calls", "backward calls", "How many backward() calls succeeded since the last reset"),
                ("grad", f"{self.watch}.grad", "The watched parameter's accumulated gradient"),
                ("history", "losses kept in history", "Loss tensors the history list keeps (with their graphs)"),
            ],
            css="bt-value",
        )
        self.status = self._status_line("bt-status")
        self.panel = widgets.VBox(
            [
                widgets.HTML(f"<b>{title}</b>"),
                self.forward_button,
                *loss_rows,
                widgets.HBox([self.zero_grad_button, self.reset_button]),
                widgets.HBox([self.iterations, self.keep_history, self.run_button]),
                self.progress,
                figures,
                self.status,
            ]
        )
        self.panel.add_class("bt-lab")

    # -- actions ---------------------------------------------------------------------------
    def _after_error(self) -> None:
        # A failed backward may already have freed part of the graph: chart that too.
        self.actions.append(("error", self.meter.graph_only_bytes))
        self._refresh(error=self.last_error)
        if not self._running:
            self._update_chart()

    def forward(self) -> None:
        """Build a new graph inside the meter (the previous one is dropped unless kept in history)."""
        with self.meter:
            losses = self._validated(self._forward())
        if list(losses) != self.loss_names:
            raise ValueError(f"The forward function returned losses {list(losses)}; expected {self.loss_names}.")
        if self.keep_history.value:
            self.kept.append(losses)
        self.losses = losses
        self._freed_by = None
        self._record("forward", "Forward built a new graph.")

    def backward(self, name: str) -> None:
        """``losses[name].backward(retain_graph=<its checkbox>)``."""
        if name not in self.loss_names:
            raise ValueError(f"No loss named {name!r}; the losses are {self.loss_names}.")
        if self.losses is None:
            raise RuntimeError("There is no graph yet: press Forward first, then backward.")
        retain = self.retain[name].value
        try:
            self.losses[name].backward(retain_graph=retain)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        except RuntimeError as exc:
            if retain and self._freed_by is not None and _FREED in str(exc):
                raise RuntimeError(f"{exc}\n{self._too_late(name)}") from exc
            raise
        if not retain:
            self._freed_by = name
        self.backward_calls += 1
        grad = self._watched().grad
        if self._first_grad is None and grad is not None:
            self._first_grad = float(grad.flatten()[0])
        self._record(
            f"{name}.backward({'retain' if retain else 'free'})", f"{name}.backward(retain_graph={retain}) worked."
        )

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to ``None``."""
        self.model.zero_grad(set_to_none=True)
        self._first_grad = None
        self._record("zero_grad", "Gradients cleared.")

    def reset(self) -> None:
        """Back to the panel's defaults: drop every loss and graph, clear gradients, counters, the chart and
        the error, untick every box and set the iterations back to their first value."""
        self.losses = None
        self._freed_by = None
        self.kept.clear()
        for checkbox in (*self.retain.values(), self.keep_history):
            checkbox.value = False
        self.iterations.value = self._default_iterations
        self.model.zero_grad(set_to_none=True)
        self._first_grad = None
        self.backward_calls = 0
        self.last_error = None
        self.meter.reset_peak()
        self.actions = [("reset", self.meter.graph_only_bytes)]
        self.progress.value = 0
        self._refresh("Reset: no graph, no gradients, every box unticked.")
        self._update_chart()

    def _too_late(self, name: str) -> str:
        freer = self._freed_by
        return (
            f"retain_graph for {name} is ticked, but the flag acts on the backward that frees the buffers: here the "
            f"earlier {freer}.backward(), which ran without it and freed the buffers it went through. Ticked now, it "
            f"brings nothing back: press Forward for a new graph, with retain_graph for {freer} ticked before "
            f"{freer}.backward()."
        )

    def _retain_changed(self, name: str) -> None:
        if self.retain[name].value and self.losses is not None and self._freed_by is not None:
            self._show_status(self._too_late(name))

    def run(self, iterations: int) -> None:
        """Forward, then each loss's backward with its checkbox, ``iterations`` times."""
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive whole number, not {iterations!r}.")
        self.progress.max = iterations
        self.progress.value = 0
        self._running = True  # one chart at the end, not one per action
        try:
            for i in range(iterations):
                try:
                    self.forward()
                    for name in self.loss_names:
                        self.backward(name)
                except RuntimeError as exc:
                    raise RuntimeError(f"stopped at iteration {i + 1} of {iterations}: {exc}") from exc
                self.progress.value = i + 1
        finally:
            self._running = False
            self._update_chart()
        self._refresh(f"Ran {iterations} iterations.")

    # -- figures ---------------------------------------------------------------------------
    def _watched(self) -> torch.Tensor:
        return dict(self.model.named_parameters())[self.watch]

    def _grad_text(self) -> str:
        grad = self._watched().grad
        if grad is None:
            return "None (no backward since the last zero_grad)"
        text = f"first element {float(grad.flatten()[0]):+.6f}, norm {float(grad.norm()):.6f}"
        ratio = self.gradient_ratio
        return text if ratio is None else text + f" ({ratio:.2f}× the first backward)"

    def _record(self, action: str, message: str) -> None:
        self.actions.append((action, self.meter.graph_only_bytes))
        self.last_error = None
        self._refresh(message)
        if not self._running:
            self._update_chart()

    def _refresh(self, message: str = "", error: str | None = None) -> None:
        reading = self.meter.reading()
        self.values["saved-tensors"].value = str(reading.saved_tensors)
        self.values["saved-bytes"].value = exact_bytes(reading.saved_bytes)
        self.values["graph-only-bytes"].value = exact_bytes(reading.graph_only_bytes)
        self.values["peak-bytes"].value = exact_bytes(reading.peak_graph_only_bytes)
        self.values["backward-calls"].value = str(self.backward_calls)
        self.values["grad"].value = self._grad_text()
        self.values["history"].value = str(self.losses_kept)
        self._show_status_or_error(message, error, "the panel still works: press Forward for a new graph, or Reset")

    # -- figures as numbers ----------------------------------------------------------------
    @property
    def saved_tensors(self) -> int:
        """Saved tensors alive now, from the lab's meter."""
        return self.meter.saved_tensors

    @property
    def graph_only_bytes(self) -> int:
        """Bytes only the graphs keep alive now: what the next backward or ``del`` can free."""
        return self.meter.graph_only_bytes

    @property
    def peak_graph_only_bytes(self) -> int:
        """The highest ``graph_only_bytes`` since the last reset."""
        return self.meter.peak_graph_only_bytes

    @property
    def gradient_ratio(self) -> float | None:
        """The watched ``.grad`` over what the first backward since ``zero_grad`` left in it (2.0 after two
        backward calls through one graph); None before a backward, or with several losses, whose
        backward calls add different gradients."""
        grad = self._watched().grad
        if grad is None or len(self.loss_names) != 1 or self._first_grad in (None, 0.0):
            return None
        return float(grad.flatten()[0]) / self._first_grad

    @property
    def losses_kept(self) -> int:
        """Loss tensors the history list keeps (each with its graph)."""
        return sum(len(losses) for losses in self.kept)

    def chart_figure(self) -> PngFigure:
        """The chart of graph-only bytes over the actions."""
        figure = PngFigure(figsize=(7, 2.6), dpi=90)
        axes = figure.add_subplot()
        values = [nbytes / 1024 for _, nbytes in self.actions]
        axes.step(range(len(values)), values, where="post", marker="o", markersize=3)
        codes = [self._action_code(action) for action, _ in self.actions]
        every = -(-len(codes) // _MOST_LABELS)  # one point in `every` gets its label: they stay readable
        if every > 1 and every % (len(self.loss_names) + 1) == 0:
            every += 1  # not the same step of every iteration (a forward and its backward calls) each time
        legend = ", ".join(f"{code} {meaning}" for code, meaning in self._code_meanings() if code in codes)
        if every > 1:
            legend += f"; one point in {every} labelled"
        style_count_axes(axes, "Bytes only the graph keeps alive, after each action", f"action ({legend})")
        axes.set_xticks(range(0, len(codes), every), codes[::every], fontsize=7)
        axes.set_ylabel("graph-only KiB")
        figure.tight_layout()
        return figure

    def _code_meanings(self) -> list[tuple[str, str]]:
        """The chart's label for each kind of action, and what it stands for, in the legend's order."""
        backward = [(self._backward_code(name), f"{name}.backward()") for name in self.loss_names]
        if len(backward) == 1:
            backward = [("B", "backward")]
        return [("S", "start"), ("F", "forward"), *backward, ("E", "error"), ("Z", "zero_grad"), ("R", "reset")]

    def _backward_code(self, name: str) -> str:
        return "B" if len(self.loss_names) == 1 else f"B{self.loss_names.index(name) + 1}"

    def _action_code(self, action: str) -> str:
        """'forward' -> 'F', 'loss.backward(free)' -> 'B' (with several losses 'B1', 'B2', ...), ..."""
        name, dot, _ = action.rpartition(".backward(")
        if dot:
            return self._backward_code(name)
        return {"start": "S", "forward": "F", "error": "E", "zero_grad": "Z", "reset": "R"}[action]
