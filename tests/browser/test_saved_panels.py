"""A committed notebook opened as `make lab` opens it (trusted, see the Makefile), before any cell runs: JupyterLab
draws each saved widget panel from the widget state the notebook holds, not its text "VBox(children=...)"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from labdriver import NOTEBOOK_DIR, LabPage, LabServer

pytestmark = pytest.mark.browser

SAVED = NOTEBOOK_DIR / "01_graph_buffers.ipynb"  # not NOTEBOOK: this test runs before the Run All tests


def test_the_saved_lab_panel_draws_before_its_cell_runs(
    browser_context: Any, lab_server: LabServer, artifacts: Path
) -> None:
    lab_server.shutdown_sessions()  # a fresh kernel: no cell of it ran, so a panel drawn is the saved one
    page = browser_context.new_page()
    try:
        lab = LabPage(page, lab_server, artifacts)
        notebook = lab.open(SAVED)
        lab.mark_cells()
        [index] = notebook.lab_cells()
        panel = lab.output_children(index).locator(".widget-vbox.bt-lab").first
        panel.wait_for(state="visible", timeout=60_000)
        assert "jupyter-widgets-disconnected" in (panel.get_attribute("class") or "")  # drawn from the saved state
        assert panel.locator(".bt-forward").count() == 1  # its buttons too
        assert "VBox(children" not in lab.cell(index).inner_text()
        lab.screenshot_element(panel, "01-saved-panel-before-running")
    finally:
        page.close()
        lab_server.shutdown_sessions()
