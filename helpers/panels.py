"""What every ipywidgets panel of the course shares: labelled controls, an error line, figures, a chart.

:class:`Panel` gives a subclass controls with a text label, a tooltip and a CSS class (stable selectors
for the browser tests), a status line that shows an error raised by any handler while the panel stays
usable (ipywidgets would swallow it), a column of named figures, and a chart that stays in the saved
notebook: drawn at once when a learner clicks in the browser, and once at the end of the cell when a
cell's code clicks the buttons.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets
from IPython import get_ipython
from IPython.display import Image, display

from helpers.figures import PngFigure

__all__ = ["Panel"]

_ERROR_BOX = "color:#b00020;background:#fdecea;border-left:4px solid #b00020;padding:4px 8px"


class Panel:
    """Base of the course's panels (:class:`helpers.lab.BackwardLab`, the GAN step lab).

    A subclass builds ``self.panel`` (a widget box) from :meth:`_button`, :meth:`_checkbox` and
    :meth:`_figure_rows`, and ``self.status`` from :meth:`_status_line`; it may override
    :meth:`chart_figure` to show a chart under the panel and :meth:`_after_error` to react to an error.
    """

    panel: widgets.Box
    status: widgets.HTML
    last_error: str | None = None
    _chart_handle: Any = None
    _chart_pending = False

    # -- controls --------------------------------------------------------------------------
    def _button(self, description: str, tooltip: str, css: str, handler: Callable[[], None]) -> widgets.Button:
        button = widgets.Button(description=description, tooltip=tooltip, layout=widgets.Layout(width="auto"))
        button.add_class(css)
        button.on_click(lambda _button: self._safely(handler))
        return button

    def _checkbox(
        self, description: str, tooltip: str, css: str, value: bool = False, on_change: Callable[[], None] | None = None
    ) -> widgets.Checkbox:
        box = widgets.Checkbox(
            value=value, description=description, tooltip=tooltip, indent=False, layout=widgets.Layout(width="auto")
        )
        box.add_class(css)
        if on_change is not None:
            box.observe(lambda _change: self._safely(on_change), names="value")
        return box

    @staticmethod
    def _iterations_box(value: int, maximum: int, tooltip: str) -> widgets.BoundedIntText:
        """The box for how many iterations a Run button runs (CSS class ``bt-iterations``)."""
        box = widgets.BoundedIntText(
            value=value,
            min=1,
            max=maximum,
            description="iterations",
            tooltip=tooltip,
            layout=widgets.Layout(width="180px"),
        )
        box.add_class("bt-iterations")
        return box

    @staticmethod
    def _figure_rows(
        figures: Sequence[tuple[str, str, str]], css: str, initial: str = ""
    ) -> tuple[dict[str, widgets.Label], widgets.VBox]:
        """One labelled row per ``(key, label, tooltip)``; returns the value labels by key, and the column."""
        values: dict[str, widgets.Label] = {}
        rows = []
        for key, label, tip in figures:
            name = widgets.Label(value=label, tooltip=tip, layout=widgets.Layout(width="190px"))
            value = widgets.Label(value=initial, tooltip=tip)
            value.add_class(f"{css}-{key}")
            values[key] = value
            rows.append(widgets.HBox([name, value]))
        return values, widgets.VBox(rows)

    @staticmethod
    def _status_line(css: str) -> widgets.HTML:
        status = widgets.HTML(value="")
        status.add_class(css)
        return status

    # -- errors ----------------------------------------------------------------------------
    def _safely(self, action: Callable[[], None]) -> None:
        # ipywidgets swallows exceptions raised in handlers; show them in the panel instead.
        try:
            action()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._show_error(self.last_error)
            self._after_error()

    def _show_error(self, error: str, advice: str = "the panel still works") -> None:
        # Dark red on a pale red box of its own, bordered: readable in light and dark themes alike (contrast
        # 6.4:1), and said in words ("Error"), not by colour alone. role=alert: screen readers announce it.
        self.status.value = (
            f"<div role='alert' style='{_ERROR_BOX}'><b>Error</b> ({html.escape(advice)})<br>"
            f"<code style='color:inherit;background:none'>{html.escape(error)}</code></div>"
        )

    def _after_error(self) -> None:
        """What a subclass does after showing an error (nothing by default)."""

    def _show_status(self, message: str) -> None:
        self.status.value = f"<span>Status: {html.escape(message)}</span>"

    def _show_status_or_error(self, message: str, error: str | None, advice: str) -> None:
        """The error with ``advice`` when there is one, else the status ``message``."""
        if error is not None:
            self._show_error(error, advice)
        else:
            self._show_status(message)

    # -- chart -----------------------------------------------------------------------------
    def chart_figure(self) -> PngFigure | None:
        """The chart under the panel, drawn from the figures now, or None for a panel without one."""
        return None

    def chart_png(self) -> bytes | None:
        """The chart under the panel as PNG bytes, or None for a panel without one."""
        figure = self.chart_figure()
        return None if figure is None else figure.to_png()

    def _chart_image(self) -> Image | None:
        figure = self.chart_figure()
        if figure is None:
            return None
        # The chart's description goes into the output's metadata, as a PngFigure shown on its own does.
        png, alt = figure.to_png(), figure.alt_text()
        return Image(data=png, format="png", metadata={"alt": alt})  # type: ignore[no-untyped-call]  # unannotated

    def _ipython_display_(self) -> None:
        # IPython.display's Image and display carry no annotations: mypy takes their calls as untyped.
        display(self.panel)  # type: ignore[no-untyped-call]
        image = self._chart_image()
        if image is not None:
            self._chart_handle = display(image, display_id=True)  # type: ignore[no-untyped-call]

    def _update_chart(self) -> None:
        if self._chart_handle is None:
            return
        shell = _shell_running_a_cell()
        if shell is None:  # a click in the browser: draw now
            self._draw_chart()
        elif not self._chart_pending:
            # Buttons clicked from a cell's code: draw once when the cell ends, not after every click.
            self._chart_pending = True
            shell.events.register("post_execute", self._draw_pending_chart)

    def _draw_chart(self) -> None:
        image = self._chart_image()
        if image is not None and self._chart_handle is not None:
            self._chart_handle.update(image)

    def _draw_pending_chart(self) -> None:
        shell = get_ipython()
        if shell is not None:
            shell.events.unregister("post_execute", self._draw_pending_chart)
        self._chart_pending = False
        self._draw_chart()


def _shell_running_a_cell() -> Any:
    """IPython's shell while it executes a cell's code (not while it handles a widget's click), else None."""
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        message_type = kernel.get_parent()["header"]["msg_type"]
    except (AttributeError, KeyError, TypeError):
        return None
    return shell if message_type == "execute_request" else None
