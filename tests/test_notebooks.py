"""The lesson notebooks: committed executed, and every error demo really raises its error.

nbval (configured in pyproject.toml) re-runs each notebook and compares its text outputs with the
committed ones. It does not compare tracebacks, and a ``raises-exception`` tag only *allows* an
error: every tagged cell declares in its ``expected_error`` metadata the error it raises, and
tests/test_run_twice.py, which executes every notebook with each cell run twice, requires that error on the
cell's first run and on its second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
ERROR_TAG = "raises-exception"


def code_cells(path: Path) -> list[dict]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_the_course_notebooks_exist() -> None:
    names = [path.name for path in NOTEBOOKS]
    assert "01_graph_buffers.ipynb" in names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_executed_in_order(path: Path) -> None:
    counts = [cell.get("execution_count") for cell in code_cells(path)]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name} is not committed executed top to bottom in a fresh kernel: {counts}. "
        "Run `make execute-notebooks`."
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_widget_state_saved_when_widgets_shown(path: Path) -> None:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    shows_widgets = any(
        "application/vnd.jupyter.widget-view+json" in output.get("data", {})
        for cell in code_cells(path)
        for output in cell.get("outputs", [])
    )
    if shows_widgets:
        state = notebook["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        assert state.get("state"), f"{path.name} shows widgets but saved no widget state"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_error_outputs_only_in_declared_error_demos(path: Path) -> None:
    for index, cell in enumerate(code_cells(path), start=1):
        tags = cell.get("metadata", {}).get("tags", [])
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if ERROR_TAG in tags:
            expected = cell["metadata"].get("expected_error")
            assert expected, f"{path.name} code cell {index} is tagged {ERROR_TAG} without expected_error metadata"
            assert errors, f"{path.name} code cell {index} should show its error in the committed outputs"
        else:
            assert not errors, f"{path.name} code cell {index} has an error output but is not an error demo"


# The timing tables the lessons commit ("<body>  ms per iteration: ...   last/first 1.02"): the bodies that
# cannot slow down, and those that must (each iteration's backward walks every earlier graph).
LAST_OVER_FIRST = re.compile(
    r"^(?P<body>\S.*?)\s+ms per iteration:.*last/first\s+(?P<ratio>\d+\.\d+)\s*$", re.MULTILINE
)
FLAT_AND_GROWING = {
    "02_multi_loss.ipynb": (
        {
            "retain, keep tensor",
            "retain, keep value",
            "no retain, keep tensor",
            "no retain, keep value",
            "retain, total += loss",
        },
        {"total.backward() every iteration"},
    ),
    "04_carried_state.ipynb": ({"h = h.detach()"}, {"retain_graph=True"}),
}


@pytest.mark.parametrize("name", sorted(FLAT_AND_GROWING))
def test_committed_timings_were_taken_on_a_quiet_machine(name: str) -> None:
    """The text calls these ratios near 1 and far above it. nbval ignores the timed outputs, so a run
    committed while the machine slowed down mid-cell would show a flat loop "slowing down" unnoticed."""
    text = "\n".join(
        "".join(output.get("text", ""))
        for cell in code_cells(NOTEBOOKS[0].parent / name)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    ratios = {match["body"]: float(match["ratio"]) for match in LAST_OVER_FIRST.finditer(text)}
    flat, growing = FLAT_AND_GROWING[name]
    assert flat | growing <= set(ratios), f"{name}: timing lines not found; found {sorted(ratios)}"
    noisy = {body: ratios[body] for body in flat if not 0.8 <= ratios[body] <= 1.25}
    assert not noisy, (
        f"{name} was committed with flat loops at last/first {noisy}: the machine was busy. "
        "Re-execute it on a quiet machine (make execute-notebooks)."
    )
    assert min(ratios[body] for body in growing) > 2 * max(ratios[body] for body in flat)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_error_demo_declares_the_error_it_raises(path: Path) -> None:
    """tests/test_run_twice.py runs each demo and requires the declared error on its first run and its second."""
    for index, cell in enumerate(code_cells(path), start=1):
        if ERROR_TAG in cell.get("metadata", {}).get("tags", []):
            expected = cell["metadata"].get("expected_error", {})
            assert expected.get("ename") and expected.get("evalue"), (
                f"{path.name} code cell {index} is tagged {ERROR_TAG!r} but its metadata's expected_error does not "
                "name the exception type (ename) and a pattern of its message (evalue)"
            )
            re.compile(expected["evalue"])
