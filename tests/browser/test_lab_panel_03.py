"""The GAN step lab of notebook 03, its switches set by clicking in the page as a learner would.

The copied SRGAN combination raises the in-place error, the tempting fix (optimizerD.step() moved after
g_loss.backward()) runs and is silently wrong, the standard step is correct, and the panel keeps working
after the error; the code the panel shows always follows the switches, and the kernel agrees with the
page. Runs in the page notebook 03's Run All test left behind (one Run All).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from labdriver import NOTEBOOK_DIR, LabPage

from helpers.lessons.gan_step.steps import SRGAN_SETTINGS, STANDARD_SETTINGS, StepSettings

pytestmark = pytest.mark.browser

NOTEBOOK = NOTEBOOK_DIR / "03_gan_step.ipynb"
LAB_CELL = r"^lab\s*=\s*bt\.GanLab\("
MOVED_SETTINGS = dataclasses.replace(SRGAN_SETTINGS, d_step_first=False)  # the notebook's moved_step
ORDER_BUTTON = {True: "before g_loss.backward()", False: "after g_loss.backward()"}


def kernel_lab_state(lab_page: LabPage) -> dict:
    code = (
        "import json as _json, dataclasses as _dc; _c = lab.last_check; print(_json.dumps({"
        "'settings': _dc.asdict(lab.settings), 'outcome': _c and _c.outcome, "
        "'error_kind': _c and _c.error_kind, 'last_error': lab.last_error}))"
    )
    return json.loads(lab_page.kernel_execute(code).strip().splitlines()[-1])


def set_switches(panel: Any, expect: Any, settings: StepSettings) -> None:
    """Click the switches to ``settings`` (only those that differ), then wait until the code the panel
    shows, which the kernel writes on every switch change, is that combination's step."""
    for css, value in (
        ("bt-gan-retain", settings.retain_graph),
        ("bt-gan-detach", settings.detach),
        ("bt-gan-fresh-pass", settings.fresh_pass),
    ):
        panel.locator(f".{css} input[type=checkbox]").set_checked(value)
    order = panel.locator(".bt-gan-order button", has_text=ORDER_BUTTON[settings.d_step_first])
    order.click()
    expect(order).to_have_class(re.compile(r"\bmod-active\b"))
    code = panel.locator(".bt-gan-code pre")
    expect(code).to_have_text(settings.code)
    # The order shows in the code: optimizerD.step() before or after g_loss.backward().
    shown = code.inner_text()
    assert (shown.index("optimizerD.step()") < shown.index("g_loss.backward()")) == settings.d_step_first, shown


def run_and_expect(lab_page: LabPage, panel: Any, expect: Any, settings: StepSettings, verdict: str) -> dict:
    """Press Run one step; wait for the verdict and the status; return what the kernel says."""
    outcome = panel.locator(".bt-gan-outcome")
    panel.locator(".bt-gan-run").click()
    expect(outcome).to_contain_text(verdict)
    expect(panel.locator(".bt-gan-status")).to_have_text(f"Status: Ran: {settings.label}.")
    state = kernel_lab_state(lab_page)
    assert state["settings"] == dataclasses.asdict(settings), state
    assert state["last_error"] is None, state  # a step that raises is a verdict, not a panel error
    return state


def test_lab_03_gan_switches_by_clicking(notebook_page: Callable[[Path], LabPage], expect: Any) -> None:
    if not NOTEBOOK.exists():
        pytest.skip(f"{NOTEBOOK.name} is not in notebooks/")
    lab_page = notebook_page(NOTEBOOK)  # after Run All, shared with the Run All test of notebook 03
    panel, cell = lab_page.live_panel(LAB_CELL, "bt-gan-lab")
    outcome = panel.locator(".bt-gan-outcome")
    d_grad, g_grad = panel.locator(".bt-gan-value-d-grad"), panel.locator(".bt-gan-value-g-grad")
    peak = panel.locator(".bt-gan-value-peak-bytes")

    def shoot(name: str) -> None:
        lab_page.screenshot_element(lab_page.cell(cell).locator(".jp-Cell-outputArea"), name)

    # 1. The copied SRGAN step (the switches start there): optimizerD.step() changed D's weights in place.
    set_switches(panel, expect, SRGAN_SETTINGS)
    state = run_and_expect(lab_page, panel, expect, SRGAN_SETTINGS, "ERROR (in-place modification)")
    expect(outcome).to_contain_text("modified by an inplace operation")
    expect(d_grad).to_have_text("not computed: the step raised")
    expect(g_grad).to_have_text("not computed: the step raised")
    assert state["outcome"] == "error" and state["error_kind"] == "in-place modification", state
    shoot("03-gan-lab-after-srgan-error")

    # 2. The tempting fix, D's step moved after g_loss.backward(): no error, D's gradient wrong.
    set_switches(panel, expect, MOVED_SETTINGS)
    state = run_and_expect(lab_page, panel, expect, MOVED_SETTINGS, "SILENTLY WRONG")
    expect(d_grad).to_contain_text("WRONG")
    expect(g_grad).to_contain_text("matches")
    expect(outcome).not_to_contain_text("ERROR")
    assert state["outcome"] == "silently wrong" and state["error_kind"] is None, state
    shoot("03-gan-lab-after-silently-wrong")

    # 3. The standard step: both optimizers get the reference gradients, and the meter measured it.
    set_switches(panel, expect, STANDARD_SETTINGS)
    state = run_and_expect(lab_page, panel, expect, STANDARD_SETTINGS, "CORRECT")
    expect(d_grad).to_contain_text("matches")
    expect(g_grad).to_contain_text("matches")
    expect(outcome).not_to_contain_text("WRONG")
    expect(peak).not_to_have_text("not measured: the step raised")
    assert state["outcome"] == "correct", state
    shoot("03-gan-lab-after-correct")

    # 4. Back to SRGAN by clicking every switch: the error again, then Try all 16 still works.
    set_switches(panel, expect, SRGAN_SETTINGS)
    state = run_and_expect(lab_page, panel, expect, SRGAN_SETTINGS, "ERROR (in-place modification)")
    assert state["outcome"] == "error", state
    panel.locator(".bt-gan-run-all").click()
    expect(panel.locator(".bt-gan-status")).to_have_text(
        "Status: Tried all 16: 8 raise, 5 are silently wrong, 3 are correct."
    )
    expect(panel.locator(".bt-gan-summary tr")).to_have_count(17)  # a header and one row per combination
    shoot("03-gan-lab-after-try-all")
