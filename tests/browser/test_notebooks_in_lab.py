"""Every notebook, opened in JupyterLab in Chromium and run with Run All, renders what a learner needs.

No cell shows an error unless it is tagged ``raises-exception`` in the .ipynb file, every graph
drawing rendered as an image, and every widget panel rendered (no "Error displaying widget").
Notebooks are discovered with a glob, so new ones are covered automatically.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from labdriver import ERROR_TAG, NOTEBOOKS, LabPage, LearnerViewWarning

pytestmark = pytest.mark.browser

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# An SVG output (JupyterLab renders image/svg+xml as an <img> with a data: URL; accept inline <svg> too)
# counts as rendered when the browser decoded it to a picture of a readable size.
GRAPH_IMAGE_JS = """async (node) => {
    const inline = node.querySelector('svg');
    if (inline) { const r = inline.getBoundingClientRect(); return {kind: 'svg', width: r.width, height: r.height}; }
    const img = node.querySelector('img[src^="data:image/svg+xml"]');
    if (!img) return null;
    try { await img.decode(); } catch (error) { return {kind: 'img', width: 0, height: 0, error: String(error)}; }
    return {kind: 'img', width: img.naturalWidth, height: img.naturalHeight};
}"""


def test_every_notebook_is_found() -> None:
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_run_all_shows_no_unexpected_errors_and_renders_graphs_and_panels(
    notebook_page: Callable[[Path], LabPage], notebook: Path
) -> None:
    # Opened and run here (the first test of each notebook); its panel tests then click in this page.
    lab_page = notebook_page(notebook)
    nb = lab_page.notebook
    lab_page.screenshot_notebook(f"{notebook.stem}-after-run-all")
    states = lab_page.cell_states()
    assert len(states) == len(nb.cells), "JupyterLab shows a different number of cells than the .ipynb file holds"

    def where(state: dict) -> str:  # as the learner sees it: index in the .ipynb (from 0) and the prompt
        return f"cell {state['index']} [{state['count'] if state['count'] is not None else ' '}]"

    problems, never_ran = [], []
    for state in states:
        index = state["index"]
        assert state["type"] == nb.cells[index]["cell_type"], f"cell {index}: cells out of order"
        if state["type"] != "code":
            continue
        if state["count"] is None:
            never_ran.append(str(index))
        errors = [o for o in state["outputs"] if o["type"] == "error"]
        if errors and ERROR_TAG not in nb.tags(index):
            first = errors[0]
            problems.append(
                f"{where(state)} shows an error but is not tagged {ERROR_TAG}: "
                f"{first['ename']}: {first['evalue']}\n    source: {state['source'][:200]!r}"
            )
        # The page shows one output area child per output in the model: indices line up.
        rendered = lab_page.output_children(index).count()
        if rendered != len(state["outputs"]):
            problems.append(f"{where(state)}: {len(state['outputs'])} outputs in the model, {rendered} in the page")
    if never_ran:
        problems.append(
            f"{len(never_ran)} code cells never ran (Run All stopped before them): cells {', '.join(never_ran)}"
        )
    assert not problems, f"{notebook.name} after Run All:\n  " + "\n  ".join(problems)

    # Graph drawings: an image (SVG) in the output of every cell that draws and shows a graph.
    for index in nb.graph_cells():
        output = lab_page.outputs(index).last
        output.scroll_into_view_if_needed()
        image = output.evaluate(GRAPH_IMAGE_JS)
        assert image is not None, f"{notebook.name} cell {index} draws a graph but shows no SVG image"
        assert image["width"] > 50 and image["height"] > 50, (
            f"{notebook.name} cell {index}: the graph image did not render ({image})"
        )

    # Widget panels: every widget output rendered as a widget, never as "Error displaying widget".
    page_text = lab_page.page.evaluate("() => document.body.textContent")
    assert "Error displaying widget" not in page_text, f"{notebook.name}: a widget failed to render"
    for state in states:
        for position, output in enumerate(state["outputs"]):
            if WIDGET_MIME not in output["mimes"]:
                continue
            child = lab_page.output_children(state["index"]).nth(position)
            assert child.locator(".jupyter-widgets").count() > 0, (
                f"{notebook.name} {where(state)}: widget output {position} rendered no widget"
            )
    for index in nb.lab_cells():
        panels = lab_page.outputs(index).locator(".bt-lab")
        assert panels.count() >= 1, f"{notebook.name} cell {index} builds a BackwardLab but shows no panel"
    panels = lab_page.page.locator(".jp-Notebook .bt-lab")
    for number in range(panels.count()):
        panel = panels.nth(number)
        panel.scroll_into_view_if_needed()
        assert panel.is_visible(), f"{notebook.name}: widget panel {number} is not visible"
        box = panel.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100, (
            f"{notebook.name}: panel {number} is collapsed: {box}"
        )

    # Soft findings, reported as warnings in pytest's summary without failing the run.
    for finding in lab_page.learner_view_problems():
        warnings.warn(LearnerViewWarning(f"{notebook.name} {finding}"), stacklevel=1)
