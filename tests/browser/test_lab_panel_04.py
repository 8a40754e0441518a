"""The carried-state lab of notebook 04 (section 6), clicked in the page as a learner would.

Carrying h with a plain backward: the run stops in iteration 2 with PyTorch's error, shown in the panel,
which keeps working after Reset. Retaining without a step: the nodes and bytes grow by one batch per
iteration, to the byte what the kernel's lab holds. Detaching: the counters stay flat and the chart under
the panel changes. Runs in the page notebook 04's Run All test left behind (one Run All).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from labdriver import NOTEBOOK_DIR, SECOND_TIME, LabPage, byte_count

pytestmark = pytest.mark.browser

NOTEBOOK = NOTEBOOK_DIR / "04_carried_state.ipynb"
LAB_CELL = r"^lab\s*=\s*bt\.CarriedLab\("


def kernel_lab_state(lab_page: LabPage) -> dict:
    code = (
        "import json as _json; print(_json.dumps({'nodes': lab.nodes, 'bytes': lab.graph_only_bytes, "
        "'outcome': lab.outcome, 'toggles': [lab.detach.value, lab.retain.value, lab.step.value]}))"
    )
    return json.loads(lab_page.kernel_execute(code).strip().splitlines()[-1])


def test_lab_04_carried_state_by_clicking(notebook_page: Callable[[Path], LabPage], expect: Any) -> None:
    if not NOTEBOOK.exists():
        pytest.skip(f"{NOTEBOOK.name} is not in notebooks/")
    lab_page = notebook_page(NOTEBOOK)
    panel, cell = lab_page.live_panel(LAB_CELL, "bt-carried-lab")
    status, loop = panel.locator(".bt-status"), panel.locator(".bt-loop")
    toggles = {name: panel.locator(f".bt-{name} input[type=checkbox]") for name in ("detach", "retain", "step")}
    values = {
        key: panel.locator(f".bt-value-{key}") for key in ("iteration", "nodes", "graph-only-bytes", "backward-ms")
    }
    reset, run = panel.locator(".bt-reset"), panel.locator(".bt-run")
    iterations = panel.locator(".bt-iterations input")

    def set_toggles(detach: bool, retain: bool, step: bool) -> None:
        for name, value in (("detach", detach), ("retain", retain), ("step", step)):
            toggles[name].set_checked(value)

    def run_for(count: int) -> None:
        iterations.fill(str(count))
        iterations.press("Tab")  # the text box sends its value on change
        run.click()

    # 1. Carry h, plain backward, with the step: iteration 2 raises; the panel shows it and stays usable.
    reset.click()
    expect(status).to_contain_text("Reset")
    set_toggles(detach=False, retain=False, step=True)
    expect(loop).not_to_contain_text("h.detach()")
    run_for(3)
    expect(status).to_contain_text("Error")
    expect(status).to_contain_text(SECOND_TIME)
    expect(values["iteration"]).to_have_text("1")
    assert kernel_lab_state(lab_page)["outcome"] == "iteration 2: backward a second time"
    lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), "04-lab-after-error")

    # 2. Reset, retain without a step: each iteration walks and keeps one more batch.
    reset.click()
    expect(values["iteration"]).to_have_text("0")
    set_toggles(detach=False, retain=True, step=False)
    expect(loop).to_contain_text("retain_graph=True")
    run_for(4)
    expect(status).to_contain_text("Ran 4 iterations.")
    state = kernel_lab_state(lab_page)
    nodes, kept = state["nodes"], state["bytes"]
    assert len(nodes) == 4 and len({b - a for a, b in pairwise(nodes)}) == 1 and nodes[1] > nodes[0], nodes
    assert kept == [kept[0] * k for k in (1, 2, 3, 4)], kept
    expect(values["nodes"]).to_have_text(str(nodes[-1]))
    assert byte_count(values["graph-only-bytes"].inner_text()) == kept[-1]
    float(values["backward-ms"].inner_text())
    chart_before = lab_page.outputs(cell).locator("img").last.get_attribute("src")

    # 3. Reset, detach with the step: flat counters, no bytes kept, and a new chart.
    reset.click()
    set_toggles(detach=True, retain=False, step=True)
    expect(loop).to_contain_text("h = h.detach()")
    run_for(3)
    expect(status).to_contain_text("Ran 3 iterations.")
    state = kernel_lab_state(lab_page)
    assert state["toggles"] == [True, False, True] and len(set(state["nodes"])) == 1 and state["bytes"] == [0] * 3
    expect(values["graph-only-bytes"]).to_have_text("0 B")
    expect(lab_page.outputs(cell).locator("img").last).not_to_have_attribute("src", chart_before)
    lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), "04-lab-after-detach")
