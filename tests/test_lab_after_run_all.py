"""Notebook 01's lab after Run All, followed the way its "Try, in order" list tells the learner.

Run All (which the notebook suggests) also runs the cells under the panel, which click it and leave
``retain_graph`` and the history box ticked. The notebook runs here in one fresh kernel of this interpreter,
then, in that kernel, a last cell clicks the panel's widgets step by step as the list says, after **Reset**,
and reports what the panel shows at each step. Each step must show what the text promises: the error in
step 1 (and, with ``retain_graph`` ticked too late, why it did not help), 2.00× in step 2, zero graph-only
bytes and then one graph's buffers per iteration in step 3.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from test_run_twice import CELL_TIMEOUT_S, ThisInterpreter

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_graph_buffers.ipynb"
SECOND_TIME = "backward through the graph a second time"
TOO_LATE = "the flag acts on the backward that frees the buffers: here the earlier loss.backward()"

# The learner's clicks, in the kernel that ran every cell: what the panel shows after each step.
FOLLOW_THE_STEPS = """
import json as _json

def _shown(step):
    return {"step": step, "error": lab.last_error or "", "status": lab.status.value,
            "graph_only": lab.values["graph-only-bytes"].value, "grad": lab.values["grad"].value,
            "calls": lab.backward_calls, "kept": lab.losses_kept, "iterations": lab.iterations.value,
            "retain": lab.retain["loss"].value, "history": lab.keep_history.value}

_seen = [_shown("after Run All")]
lab.reset_button.click()
lab.forward_button.click()
lab.backward_buttons["loss"].click()
lab.backward_buttons["loss"].click()
_seen.append(_shown("1. backward twice"))
lab.retain["loss"].value = True
_seen.append(_shown("1. retain_graph ticked"))
lab.backward_buttons["loss"].click()
_seen.append(_shown("1. backward once more"))
lab.reset_button.click()
lab.retain["loss"].value = True
lab.forward_button.click()
lab.backward_buttons["loss"].click()
lab.backward_buttons["loss"].click()
_seen.append(_shown("2. retain_graph, backward twice"))
lab.keep_history.value = True
lab.retain["loss"].value = False
lab.run_button.click()
_seen.append(_shown("3. history, retain off"))
lab.retain["loss"].value = True
lab.run_button.click()
_seen.append(_shown("3. history, retain on"))
print(_json.dumps(_seen))
"""


def _bytes(shown: str) -> int:
    """'66,560 B (65.0 KiB)' -> 66560."""
    return int(shown.split(" B", 1)[0].replace(",", ""))


def run_all_then(path: Path, code: str) -> str:
    """Execute the notebook in a fresh kernel, then ``code`` in the same kernel; what ``code`` printed."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(code))
    client = NotebookClient(
        notebook,
        km=AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter()),
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    # A thread of its own: with the browser tests in the run, Playwright keeps an event loop in this one.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(client.execute).result()
    return "".join(output.get("text", "") for output in notebook.cells[-1].outputs if output.get("name") == "stdout")


def try_in_order() -> list[str]:
    """The numbered steps of the markdown cell that says "Try, in order"."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    text = next(
        cell.source for cell in notebook.cells if cell.cell_type == "markdown" and "Try, in order" in cell.source
    )
    steps = re.split(r"^\d\. ", text.split("Try, in order:", 1)[1], flags=re.MULTILINE)[1:]
    return [" ".join(step.split()) for step in steps]


@pytest.fixture(scope="module")
def seen() -> dict[str, dict]:
    if not NOTEBOOK.exists():
        pytest.skip(f"{NOTEBOOK.name} is not in notebooks/")
    printed = run_all_then(NOTEBOOK, FOLLOW_THE_STEPS)
    return {shown["step"]: shown for shown in json.loads(printed.strip().splitlines()[-1])}


def test_the_text_lists_the_steps_this_test_follows() -> None:
    one, two, three = try_in_order()
    assert one.startswith("**Reset**, then **Forward**, **loss.backward()**, **loss.backward()**")
    assert "the error appears" in one and "the flag acts on the backward that frees the buffers" in one
    assert two.startswith("**Reset**, tick **retain_graph for loss**") and "*2.00× the first backward*" in two
    assert "untick **retain_graph for loss**" in three and "end at zero" in three
    assert "Tick retain_graph and run again: they climb by one graph's buffers with every iteration" in three


def test_run_all_leaves_the_panel_mid_story(seen: dict[str, dict]) -> None:
    """Why step 1 starts with Reset: the cells under the panel leave both boxes ticked and graphs held."""
    after = seen["after Run All"]
    assert after["retain"] and after["history"] and _bytes(after["graph_only"]) > 0, after


def test_step_1_reset_then_backward_twice_shows_the_error(seen: dict[str, dict]) -> None:
    step = seen["1. backward twice"]
    assert (step["retain"], step["history"]) == (False, False), step
    assert SECOND_TIME in step["error"] and "Error" in step["status"], step
    assert step["calls"] == 1 and step["graph_only"] == "0 B", step


def test_step_1_retain_graph_ticked_too_late_says_why(seen: dict[str, dict]) -> None:
    ticked = seen["1. retain_graph ticked"]
    assert TOO_LATE in ticked["status"] and "Error" not in ticked["status"], ticked
    again = seen["1. backward once more"]
    assert SECOND_TIME in again["error"] and TOO_LATE in again["error"] and again["calls"] == 1, again


def test_step_2_retain_graph_doubles_the_gradient(seen: dict[str, dict]) -> None:
    step = seen["2. retain_graph, backward twice"]
    assert step["error"] == "" and step["calls"] == 2, step
    assert "2.00× the first backward" in step["grad"], step
    assert _bytes(step["graph_only"]) > 0, step  # the retained graph: one graph's buffers


def test_step_3_zero_bytes_without_retain_then_one_graph_per_iteration(seen: dict[str, dict]) -> None:
    one_graph = _bytes(seen["2. retain_graph, backward twice"]["graph_only"])
    off = seen["3. history, retain off"]
    assert off["error"] == "" and off["graph_only"] == "0 B" and off["kept"] == off["iterations"], off
    on = seen["3. history, retain on"]
    assert on["error"] == "" and on["kept"] == 2 * on["iterations"], on
    assert _bytes(on["graph_only"]) == on["iterations"] * one_graph, (on, one_graph)
