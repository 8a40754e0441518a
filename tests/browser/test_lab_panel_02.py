"""The two-loss retain_graph lab of notebook 02 (section 4), clicked in the page as a learner would.

No retain: Forward, l1.backward(), l2.backward() -> the second backward hits PyTorch's error, shown in
the panel, which keeps working. Reset, retain_graph for l1 only: both backward calls work, and the
graph-only bytes left are l1's head buffers (above 0, below the full graph), to the byte what the
kernel's meter says. Then retain on both, a history list and Run iterations: the bytes grow by a
whole graph per iteration. Runs in the page notebook 02's Run All test left behind (one Run All).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from labdriver import NOTEBOOK_DIR, SECOND_TIME, LabPage, byte_count

pytestmark = pytest.mark.browser

NOTEBOOK = NOTEBOOK_DIR / "02_multi_loss.ipynb"
LAB_CELL = r"^lab\s*=\s*bt\.BackwardLab\("
ITERATIONS = 4


def kernel_lab_state(lab_page: LabPage) -> dict:
    code = (
        "import json as _json; print(_json.dumps({'graph_only_bytes': lab.meter.graph_only_bytes, "
        "'backward_calls': lab.backward_calls, 'retain': {k: v.value for k, v in lab.retain.items()}, "
        "'kept': sum(len(losses) for losses in lab.kept), 'last_error': lab.last_error}))"
    )
    return json.loads(lab_page.kernel_execute(code).strip().splitlines()[-1])


def chart_source(lab_page: LabPage, cell: int) -> str:
    """The src of the lab's chart (the PNG the cell shows under the panel)."""
    image = lab_page.outputs(cell).locator("img").last
    return image.get_attribute("src") or ""


def test_lab_02_two_losses_by_clicking(notebook_page: Callable[[Path], LabPage], expect: Any) -> None:
    if not NOTEBOOK.exists():
        pytest.skip(f"{NOTEBOOK.name} is not in notebooks/")
    lab_page = notebook_page(NOTEBOOK)  # after Run All, shared with the Run All test of notebook 02
    panel, cell = lab_page.live_panel(LAB_CELL, "bt-lab")
    status = panel.locator(".bt-status")
    calls = panel.locator(".bt-value-backward-calls")
    graph_only = panel.locator(".bt-value-graph-only-bytes")
    history_count = panel.locator(".bt-value-history")
    retain = {name: panel.locator(f".bt-retain-{name} input[type=checkbox]") for name in ("l1", "l2")}
    backward = {name: panel.locator(f".bt-backward-{name}") for name in ("l1", "l2")}
    history = panel.locator(".bt-keep-history input[type=checkbox]")
    forward, reset, run = (panel.locator(f".{css}") for css in ("bt-forward", "bt-reset", "bt-run"))
    expect(panel.locator(".bt-retain-l1")).to_contain_text("retain_graph for l1")
    expect(panel.locator(".bt-retain-l2")).to_contain_text("retain_graph for l2")

    # The notebook's own cell after the panel left it mid-story: start clean.
    reset.click()
    expect(status).to_contain_text("Reset: no graph")
    expect(calls).to_have_text("0")
    expect(graph_only).to_have_text("0 B")
    for box in (retain["l1"], retain["l2"], history):
        box.set_checked(False)

    # 1. No retain: the first backward frees the trunk's buffers, the second one needs them.
    forward.click()
    expect(status).to_contain_text("Forward built a new graph")
    full_graph = byte_count(graph_only.inner_text())
    assert full_graph > 0, "Forward built a graph that saves nothing?"
    backward["l1"].click()
    expect(status).to_contain_text("l1.backward(retain_graph=False) worked")
    expect(calls).to_have_text("1")
    backward["l2"].click()
    expect(status).to_contain_text(SECOND_TIME)
    expect(status).to_contain_text("Error")
    expect(calls).to_have_text("1")
    state = kernel_lab_state(lab_page)
    assert state["backward_calls"] == 1 and SECOND_TIME in (state["last_error"] or ""), state
    lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), "02-lab-after-error")

    # ... and the panel still works: a new graph, and l2.backward() on it succeeds.
    forward.click()
    expect(status).to_contain_text("Forward built a new graph")
    backward["l2"].click()
    expect(status).to_contain_text("l2.backward(retain_graph=False) worked")
    expect(calls).to_have_text("2")

    # 2. Reset, retain_graph for l1 only (the first backward): both work.
    reset.click()
    expect(status).to_contain_text("Reset: no graph")
    expect(calls).to_have_text("0")
    retain["l1"].set_checked(True)
    forward.click()
    expect(status).to_contain_text("Forward built a new graph")
    assert byte_count(graph_only.inner_text()) == full_graph, "the same forward pass saved a different amount"
    backward["l1"].click()
    expect(status).to_contain_text("l1.backward(retain_graph=True) worked")
    expect(calls).to_have_text("1")
    assert byte_count(graph_only.inner_text()) == full_graph, "retained, yet l1.backward() freed buffers"
    backward["l2"].click()
    expect(status).to_contain_text("l2.backward(retain_graph=False) worked")
    expect(calls).to_have_text("2")
    expect(status).not_to_contain_text("Error")

    # What is left is l1's head: l2's plain backward freed the trunk and its own head, never l1's.
    shown = byte_count(graph_only.inner_text())
    state = kernel_lab_state(lab_page)
    assert state == {
        "graph_only_bytes": shown,
        "backward_calls": 2,
        "retain": {"l1": True, "l2": False},
        "kept": 0,
        "last_error": None,
    }, state
    assert 0 < shown < full_graph, f"graph-only bytes after both backward calls: {shown} (full graph {full_graph})"
    lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), "02-lab-after-retain-l1")

    # 3. Retain on both, keep each loss in a history list, run N iterations: every graph stays alive.
    chart_before = chart_source(lab_page, cell)
    history.set_checked(True)
    retain["l2"].set_checked(True)
    iterations = panel.locator(".bt-iterations input")
    iterations.fill(str(ITERATIONS))
    iterations.press("Tab")  # the text box sends its value on change
    run.click()
    expect(status).to_contain_text(f"Ran {ITERATIONS} iterations.")
    expect(calls).to_have_text(str(2 + 2 * ITERATIONS))
    expect(history_count).to_have_text(str(2 * ITERATIONS))  # two losses kept per iteration
    grown = byte_count(graph_only.inner_text())
    state = kernel_lab_state(lab_page)
    assert state == {
        "graph_only_bytes": grown,
        "backward_calls": 2 + 2 * ITERATIONS,
        "retain": {"l1": True, "l2": True},
        "kept": 2 * ITERATIONS,
        "last_error": None,
    }, state
    assert grown > shown, f"graph-only bytes did not grow: {shown} -> {grown}"
    assert grown >= ITERATIONS * full_graph, (
        f"{ITERATIONS} retained graphs kept in the history should hold at least {ITERATIONS} x {full_graph} B; "
        f"the panel shows {grown} B"
    )
    assert byte_count(panel.locator(".bt-value-peak-bytes").inner_text()) >= grown
    expect(lab_page.outputs(cell).locator("img").last).not_to_have_attribute("src", chart_before)
    lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), "02-lab-after-run-iterations")
