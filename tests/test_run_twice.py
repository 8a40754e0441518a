"""Every notebook survives a cell run twice: Shift+Enter pressed again is how most learners first meet
"Trying to backward through the graph a second time".

Each notebook in notebooks/ runs in one fresh kernel of this interpreter (the course's environment, as
``--nbval-current-env`` uses), every code cell twice in a row: cell 1, cell 1 again, cell 2, cell 2
again, ... The test fails when

* a cell's second run raises, unless the cell is tagged ``run-twice-raises`` and the learner is told;
* a cell's second run prints something else than its first among the outputs nbval compares (cells
  without ``nbval-ignore-output``; stdout and ``text/plain``, sanitized as nbval sanitizes them, and
  autograd's version counters, which rightly count every in-place update since the tensor was made).
  This is how a second run gives a silently wrong result: a ``.grad`` doubled, a counter that did not
  start again. A cell whose output is meant to change is tagged ``run-twice-changes`` and tells the learner;
* an error demo (``raises-exception``) does not raise the error its ``expected_error`` declares (the
  exception type, and a message matching its pattern) on its first run and again on its second;
* a cell raises on its first run (after every cell above it ran twice) without being an error demo;
* a ``run-twice-raises`` cell's second run works, or a ``run-twice-changes`` cell's repeats its first:
  the tag, and the text it requires, would then tell the learner something false.

"The learner is told" means the text the learner sees at the cell (its source, its outputs, the markdown
cells right above and right below it) says what a second run does, with a phrase that matches
``SAYS_WHAT_A_RERUN_DOES`` ("running it again raises ...", "a second run"), and which cell to run first,
matching ``SAYS_WHAT_TO_RUN_FIRST`` ("run the cell that builds ``loss`` first"). Cell numbers in the
messages count every cell of the notebook from 0, markdown included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import configparser
import re
from dataclasses import dataclass
from pathlib import Path

import ipykernel.kernelspec
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ERROR_DEMO_TAG = "raises-exception"
IGNORED_OUTPUT_TAG = "nbval-ignore-output"
RAISES_TAG = "run-twice-raises"
CHANGES_TAG = "run-twice-changes"
CELL_TIMEOUT_S = 300

SAYS_WHAT_A_RERUN_DOES = re.compile(
    r"\b(?:run|runs|running|ran|press|pressing)\b.{0,60}?\b(?:again|twice|a second time)\b"
    r"|\bsecond run\b|\bre-?run",
    re.IGNORECASE | re.DOTALL,
)
SAYS_WHAT_TO_RUN_FIRST = re.compile(r"\b(?:re-?)?run\b.{0,160}?\bfirst\b", re.IGNORECASE | re.DOTALL)

# A tensor's version counter counts its in-place updates since it was made; a second run of a cell that
# steps an optimizer rightly shows a higher one ("is at version 3; expected version 2").
VERSION_COUNTER = (re.compile(r"\bversion \d+"), "version N")


def nbval_sanitizers() -> list[tuple[re.Pattern[str], str]]:
    """The regex/replace pairs of tests/nbval_sanitize.cfg, the ones nbval applies before comparing."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tests" / "nbval_sanitize.cfg", encoding="utf-8")
    return [(re.compile(config[section]["regex"]), config[section]["replace"]) for section in config.sections()]


SANITIZERS = [*nbval_sanitizers(), VERSION_COUNTER]


class ThisInterpreter(KernelSpecManager):
    """Kernel specs that always start this interpreter, whatever kernels the user has installed."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self.kernel_spec_class(
            resource_dir=ipykernel.kernelspec.RESOURCES, **ipykernel.kernelspec.get_kernel_dict()
        )


@dataclass
class Run:
    outputs: list[dict]

    @property
    def error(self) -> dict | None:
        return next((o for o in self.outputs if o["output_type"] == "error"), None)

    def compared_text(self) -> str:
        """What nbval would compare: stdout and text/plain, sanitized."""
        parts = []
        for output in self.outputs:
            if output["output_type"] == "stream" and output["name"] == "stdout":
                parts.append(output["text"])
            elif "data" in output:
                parts.append(output["data"].get("text/plain", "") + "\n")
        text = "".join(parts)
        for pattern, replacement in SANITIZERS:
            text = pattern.sub(replacement, text)
        return text

    def shown_text(self) -> str:
        """Every text a learner reads in the output area, the error included."""
        parts = []
        for output in self.outputs:
            if output["output_type"] == "stream":
                parts.append(output["text"])
            elif output["output_type"] == "error":
                parts.append(f"{output['ename']}: {output['evalue']}")
            else:
                data = output.get("data", {})
                parts.extend(data.get(kind, "") for kind in ("text/plain", "text/markdown"))
        return "\n".join(parts)


@dataclass
class CellRuns:
    index: int  # among all cells, from 0
    cell: nbformat.NotebookNode
    first: Run
    second: Run

    @property
    def tags(self) -> list[str]:
        return self.cell.metadata.get("tags", [])

    def name(self) -> str:
        line = next((line for line in self.cell.source.splitlines() if line.strip()), "")
        return f"cell {self.index} ({line.strip()[:60]!r})"


def run_each_cell_twice(path: Path) -> tuple[nbformat.NotebookNode, list[CellRuns]]:
    notebook = nbformat.read(path, as_version=4)
    # A loop of its own in a thread of its own: in the full suite the browser tests' Playwright (sync API) keeps
    # an event loop running in this thread, where asyncio.run() refuses to start another.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return notebook, pool.submit(asyncio.run, _run_each_cell_twice(path, notebook)).result()


async def _run_each_cell_twice(path: Path, notebook: nbformat.NotebookNode) -> list[CellRuns]:
    kernel = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter())
    client = NotebookClient(
        notebook,
        km=kernel,
        timeout=CELL_TIMEOUT_S,
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    runs: list[CellRuns] = []
    try:
        async with client.async_setup_kernel():
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                await client.async_execute_cell(cell, index)
                first = Run(list(cell.outputs))
                await client.async_execute_cell(cell, index)
                runs.append(CellRuns(index, cell, first, Run(list(cell.outputs))))
                if first.error and ERROR_DEMO_TAG not in runs[-1].tags:
                    break  # every later cell would fail for this one's reason
    finally:
        if await kernel.is_alive():
            await kernel.shutdown_kernel(now=True)
    return runs


def first_sentence(error: dict) -> str:
    return f"{error['ename']}: {error['evalue'].split('. ')[0].splitlines()[0][:160]}"


def raises_as_declared(error: dict | None, expected: dict) -> bool:
    """The error an error demo's ``expected_error`` metadata names: its type, and a message matching it."""
    return (
        error is not None
        and error["ename"] == expected.get("ename", error["ename"])
        and re.search(expected.get("evalue", ""), error["evalue"]) is not None
    )


def learner_is_told(notebook: nbformat.NotebookNode, runs: CellRuns) -> bool:
    neighbours = [notebook.cells[i] for i in (runs.index - 1, runs.index + 1) if 0 <= i < len(notebook.cells)]
    text = "\n".join(
        [
            runs.cell.source,
            runs.first.shown_text(),
            runs.second.shown_text(),
            *(cell.source for cell in neighbours if cell.cell_type == "markdown"),
        ]
    )
    return bool(SAYS_WHAT_A_RERUN_DOES.search(text) and SAYS_WHAT_TO_RUN_FIRST.search(text))


def problems_of(notebook: nbformat.NotebookNode, runs: CellRuns) -> list[str]:
    tags, name = runs.tags, runs.name()
    first, second = runs.first.error, runs.second.error
    untold = (
        "but neither the cell, its output nor the markdown next to it says what a second run does "
        "and which cell to run first"
    )
    if ERROR_DEMO_TAG in tags:
        expected = runs.cell.metadata.get("expected_error", {})
        declared = expected.get("ename", "an error")
        if not raises_as_declared(first, expected):
            outcome = "did not raise" if first is None else f"raised {first_sentence(first)}"
            return [f"{name} is an error demo of {declared}; its first run {outcome}"]
        if second is None:
            return [f"{name} is an error demo that raises {declared} only once: its second run worked"]
        if not raises_as_declared(second, expected):
            return [
                f"{name} is an error demo of {declared}; its second run raised another error: {first_sentence(second)}"
            ]
        return []
    if first is not None:
        return [f"{name} raised on its first run, after every cell above it ran twice: {first_sentence(first)}"]
    problems = []
    if second is not None:
        if RAISES_TAG not in tags:
            problems.append(
                f"{name} raises when run a second time: {first_sentence(second)}. "
                f"Make it survive a second run, or tag it {RAISES_TAG!r} and say so to the learner"
            )
        elif not learner_is_told(notebook, runs):
            problems.append(f"{name} is tagged {RAISES_TAG!r} {untold}")
    elif RAISES_TAG in tags:
        problems.append(f"{name} is tagged {RAISES_TAG!r} but its second run works: remove the tag and its warning")
    if second is None and IGNORED_OUTPUT_TAG not in tags:
        changed = runs.first.compared_text() != runs.second.compared_text()
        if changed and CHANGES_TAG not in tags:
            problems.append(
                f"{name} shows another output when run a second time:\n  first:  "
                f"{runs.first.compared_text()!r}\n  second: {runs.second.compared_text()!r}\n"
                f"Make it repeat itself, or tag it {CHANGES_TAG!r} and say so to the learner"
            )
        elif changed and not learner_is_told(notebook, runs):
            problems.append(f"{name} is tagged {CHANGES_TAG!r} {untold}")
        elif not changed and CHANGES_TAG in tags:
            problems.append(f"{name} is tagged {CHANGES_TAG!r} but its second run repeats its first: remove the tag")
    return problems


def drift_from_committed(committed: nbformat.NotebookNode, all_runs: list[CellRuns]) -> list[str]:
    """Cells whose first run, after every cell above ran twice, shows another compared output than the
    committed one: a state an earlier cell's second run changed without showing it (a ``.grad``
    accumulated twice). Stops at the first ``run-twice-changes`` cell, whose change may flow on."""
    problems = []
    for runs in all_runs:
        if CHANGES_TAG in runs.tags:
            break
        cell = committed.cells[runs.index]
        if (
            cell.get("execution_count") is None
            or {IGNORED_OUTPUT_TAG, ERROR_DEMO_TAG} & set(runs.tags)
            or runs.first.error
        ):
            continue
        before, now = Run(cell.outputs).compared_text(), runs.first.compared_text()
        if before != now:
            problems.append(
                f"{runs.name()}, run after every cell above it ran twice, shows another output than "
                f"the committed one:\n  committed: {before!r}\n  now:       {now!r}\n"
                "A cell above changed a state on its second run without showing it (if nbval fails "
                "on this cell too, the notebook was edited without being re-executed)"
            )
    return problems


def collect_problems(path: Path) -> tuple[list[str], int]:
    """Every problem of the notebook run cell by cell twice, and how many code cells ran."""
    committed = nbformat.read(path, as_version=4)
    notebook, all_runs = run_each_cell_twice(path)
    problems = [problem for runs in all_runs for problem in problems_of(notebook, runs)]
    return problems + drift_from_committed(committed, all_runs), len(all_runs)


def test_every_notebook_is_checked() -> None:
    assert "01_graph_buffers.ipynb" in [path.name for path in NOTEBOOKS], NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_cell_run_twice(path: Path) -> None:
    problems, cells_run = collect_problems(path)
    if problems:
        pytest.fail(f"{path.name}, each code cell run twice in a row:\n" + "\n".join(problems), pytrace=False)
    assert cells_run == sum(cell.cell_type == "code" for cell in nbformat.read(path, as_version=4).cells)


def test_the_explanation_is_recognised() -> None:
    """What the two phrases accept and refuse, so a tag cannot stand on text that says nothing."""
    told = (
        "Run this cell once: running it again is a second backward through a freed graph. "
        "To repeat it, run the cell that builds `loss` first."
    )
    assert SAYS_WHAT_A_RERUN_DOES.search(told) and SAYS_WHAT_TO_RUN_FIRST.search(told)
    error_only = (
        "RuntimeError: Trying to backward through the graph a second time (or directly access saved "
        "tensors after they have already been freed)."
    )
    assert not SAYS_WHAT_A_RERUN_DOES.search(error_only)
    assert not SAYS_WHAT_TO_RUN_FIRST.search("A second run raises the error of section 1.")


def test_the_check_finds_each_kind_of_problem(tmp_path: Path) -> None:
    """A small notebook with one cell of each kind, run the same way: each problem is found, and only those."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    told = "Run the next cell once: running it again pops from an empty list. Run the cell above first."

    def committed_one() -> nbformat.NotebookNode:
        return code(
            "print(steps)", execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout", text="1\n")]
        )

    cases = [  # (cell, the phrase of the one problem it has, or None)
        (code("stack = [1]"), None),
        (code("stack.pop()"), "raises when run a second time: IndexError"),
        (code("stack = [1]"), None),
        (code("stack.pop()", metadata={"tags": [RAISES_TAG]}), "is tagged 'run-twice-raises' but neither"),
        (code("stack = [1]"), None),
        (md(told), None),
        (code("stack.pop()", metadata={"tags": [RAISES_TAG]}), None),
        (code("print('same every time')", metadata={"tags": [RAISES_TAG]}), "its second run works"),
        (code("steps = globals().get('steps', 0) + 1"), None),
        (committed_one(), "shows another output than the committed one"),
        (code("calls = globals().get('calls', 0) + 1\nprint(calls)"), "shows another output when run a second"),
        (code("print(calls)", metadata={"tags": [IGNORED_OUTPUT_TAG]}), None),
        (
            code(
                "1 / 0",
                metadata={
                    "tags": [ERROR_DEMO_TAG],
                    "expected_error": {"ename": "ZeroDivisionError", "evalue": "division"},
                },
            ),
            None,
        ),
        (
            code("[][0]", metadata={"tags": [ERROR_DEMO_TAG], "expected_error": {"ename": "KeyError", "evalue": ""}}),
            "its first run raised IndexError",
        ),
        (
            code(
                "again = 'again' in globals()\nraise (KeyError if again else ValueError)('bad value')",
                metadata={"tags": [ERROR_DEMO_TAG], "expected_error": {"ename": "ValueError", "evalue": "bad"}},
            ),
            "its second run raised another error",
        ),
        (
            code(
                "if 'once' not in globals():\n    once = True\n    raise ValueError('only once')",
                metadata={"tags": [ERROR_DEMO_TAG], "expected_error": {"ename": "ValueError", "evalue": "once"}},
            ),
            "raises ValueError only once",
        ),
        (md("Running the next cell again counts one more call; run the cell above first to start at 1."), None),
        (code("calls += 1\nprint(calls)", metadata={"tags": [CHANGES_TAG]}), None),
        (code("print('constant')", metadata={"tags": [CHANGES_TAG]}), "its second run repeats its first"),
        (committed_one(), None),  # after a declared change, drift from the committed output is allowed
        (code("raise RuntimeError('broken')"), "raised on its first run"),
        (code("print('not reached')"), None),
    ]
    path = tmp_path / "cases.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell for cell, _ in cases]), path)
    problems, cells_run = collect_problems(path)
    expected = [f"cell {index} " for index, (_, phrase) in enumerate(cases) if phrase]
    assert sorted(problem.split("(")[0] for problem in problems) == sorted(expected), problems
    for index, (_, phrase) in enumerate(cases):
        if phrase:
            assert any(problem.startswith(f"cell {index} ") and phrase in problem for problem in problems), (
                index,
                phrase,
                problems,
            )
    assert cells_run == sum(cell.cell_type == "code" for cell, _ in cases) - 1
