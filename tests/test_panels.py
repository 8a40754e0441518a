"""helpers.panels: labelled controls, an error line that leaves the panel usable, figures, a chart per cell."""

from __future__ import annotations

import ipywidgets as widgets
import pytest

import helpers.panels as panels_module
from helpers.figures import PngFigure
from helpers.panels import Panel


class Counter(Panel):
    """The smallest panel: a button that counts, one that fails, a checkbox, two figures and a chart."""

    def __init__(self) -> None:
        self.count = 0
        self.reacted: list[str] = []
        self.add = self._button("Add", "Add one", "bt-test-add", self.increment)
        self.fail = self._button("Fail", "Raise an error", "bt-test-fail", self.broken)
        self.toggle = self._checkbox("double", "Add two instead", "bt-test-double", on_change=self.redraw)
        self.values, figures = self._figure_rows(
            [("count", "count", "How many"), ("twice", "twice", "Twice")], css="bt-test-value", initial="-"
        )
        self.status = self._status_line("bt-test-status")
        self.panel = widgets.VBox([self.add, self.fail, self.toggle, figures, self.status])

    def increment(self) -> None:
        self.count += 2 if self.toggle.value else 1
        self.values["count"].value = str(self.count)
        self._show_status(f"count is {self.count} <ok>")
        self._update_chart()

    def broken(self) -> None:
        raise ValueError("no such thing <here>")

    def redraw(self) -> None:
        self.reacted.append("toggle")

    def _after_error(self) -> None:
        self.reacted.append("error")

    def chart_figure(self) -> PngFigure:
        figure = PngFigure(figsize=(1, 1), dpi=20)
        figure.add_subplot().set_title(f"count {self.count}")
        return figure


def test_controls_carry_their_label_tooltip_and_css_class() -> None:
    panel = Counter()
    assert panel.add.description == "Add" and panel.add.tooltip == "Add one"
    assert "bt-test-add" in panel.add._dom_classes and "bt-test-double" in panel.toggle._dom_classes
    assert set(panel.values) == {"count", "twice"} and panel.values["twice"].value == "-"
    assert "bt-test-value-count" in panel.values["count"]._dom_classes


def test_an_error_in_a_handler_is_shown_escaped_and_the_panel_keeps_working() -> None:
    panel = Counter()
    panel.fail.click()
    assert panel.last_error == "ValueError: no such thing <here>"
    assert "no such thing &lt;here&gt;" in panel.status.value and "still works" in panel.status.value
    assert panel.reacted == ["error"]
    panel.add.click()
    assert panel.count == 1 and "count is 1 &lt;ok&gt;" in panel.status.value
    panel.toggle.value = True
    panel.add.click()
    assert panel.count == 3 and panel.reacted == ["error", "toggle"]


class FakeShell:
    """Just enough of IPython inside ipykernel: the message being handled, and the post_execute hook."""

    def __init__(self, message_type: str) -> None:
        self.kernel = type("Kernel", (), {"get_parent": lambda _self: {"header": {"msg_type": message_type}}})()
        self.callbacks: list = []
        self.events = self

    def register(self, event: str, callback) -> None:
        assert event == "post_execute"
        self.callbacks.append(callback)

    def unregister(self, event: str, callback) -> None:
        self.callbacks.remove(callback)


class Handle:
    def __init__(self) -> None:
        self.images: list[bytes] = []

    def update(self, image) -> None:
        self.images.append(image.metadata["alt"])


@pytest.mark.parametrize("message_type", ["execute_request", "comm_msg"])
def test_the_chart_is_drawn_at_once_for_a_browser_click_and_once_per_cell_for_clicks_in_code(
    monkeypatch, message_type
) -> None:
    panel = Counter()
    shell = FakeShell(message_type)
    monkeypatch.setattr(panels_module, "get_ipython", lambda: shell)
    panel._chart_handle = handle = Handle()
    for _ in range(3):
        panel.add.click()
    if message_type == "comm_msg":
        assert handle.images == ["Chart. count 1.", "Chart. count 2.", "Chart. count 3."]
    else:
        assert handle.images == [] and len(shell.callbacks) == 1
        shell.callbacks[0]()
        assert handle.images == ["Chart. count 3."] and shell.callbacks == []


def test_outside_a_kernel_nothing_is_deferred_and_a_panel_without_a_chart_draws_none() -> None:
    assert panels_module._shell_running_a_cell() is None
    bare = Panel()
    assert bare.chart_png() is None
