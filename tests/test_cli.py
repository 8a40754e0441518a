"""``backward-twice watch``: an unmodified training script run under the recorder, from a folder that has its own
``helpers.py`` (which must keep shadowing nothing of ours, and stay theirs)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import helpers as helpers_package
from helpers.cli import main

COMMAND = Path(sys.executable).parent / "backward-twice"

PROJECT_HELPERS = """
import torch

NAME = "the project's own helpers"


def batches(count):
    torch.manual_seed(0)
    return [(torch.randn(5, 1, 4), torch.randn(5, 1, 8)) for _ in range(count)]
"""

RNN_SCRIPT = """
import sys

import torch

import helpers  # the project's own helpers.py, next to this script

assert helpers.NAME == "the project's own helpers", helpers
count = int(sys.argv[1])
rnn = torch.nn.RNN(4, 8)
optimizer = torch.optim.SGD(rnn.parameters(), lr=0.01)
hidden = torch.zeros(1, 1, 8)
for inputs, targets in helpers.batches(count):
    optimizer.zero_grad()
    output, hidden = rnn(inputs, hidden)
    loss = (output - targets).pow(2).mean()
    loss.backward()
    optimizer.step()
print("finished", sys.argv[1:])
"""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "helpers.py").write_text(PROJECT_HELPERS)
    (tmp_path / "train.py").write_text(RNN_SCRIPT)
    return tmp_path


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    assert COMMAND.exists(), "backward-twice is not installed: run `make setup` (pip install -e .)"
    return subprocess.run([str(COMMAND), *args], cwd=folder, capture_output=True, text=True, timeout=240)


def test_the_command_reports_the_carried_hidden_state_of_an_unmodified_script(project: Path) -> None:
    done = _run(project, "watch", "--json", "report.json", "train.py", "3")
    assert done.returncode == 1, done.stderr  # the script's own status: it raised
    assert 'File "' + str(project / "train.py") + '", line 17' in done.stderr and "loss.backward()" in done.stderr
    assert "helpers/cli.py" not in done.stderr  # the traceback is the script's, as python prints it
    out = done.stdout
    assert "Error (backward a second time) in iteration 2" in out
    assert "hidden: train.py:15: output, hidden = rnn(inputs, hidden)" in out
    assert "hidden = hidden.detach()" in out
    report = json.loads((project / "report.json").read_text())
    assert report["error"]["kind"] == "backward a second time"
    assert [(c["variable"], c["iteration"], c["reached_from"]) for c in report["carried"]] == [("hidden", 1, 2)]
    assert report["lines"] == []


def test_iterations_stop_the_script_and_its_arguments_reach_it(project: Path) -> None:
    (project / "train.py").write_text(
        RNN_SCRIPT.replace("output, hidden = rnn(inputs, hidden)", "output, hidden = rnn(inputs, hidden.detach())")
    )
    done = _run(project, "watch", "--iterations", "2", "train.py", "5")
    assert done.returncode == 0, done.stderr
    assert "finished" not in done.stdout  # stopped after two of the five iterations
    assert done.stdout.startswith("Watched 2 iterations") and "Healthy" in done.stdout
    whole = _run(project, "watch", "train.py", "2", "--flag")
    assert "finished ['2', '--flag']" in whole.stdout and "Watched 2 iterations" in whole.stdout


def test_a_learners_own_code_imports_the_tools_as_backward_twice_next_to_its_helpers_py(project: Path) -> None:
    (project / "mine.py").write_text(
        textwrap.dedent("""
        import torch
        import helpers
        import backward_twice as bt

        assert helpers.NAME == "the project's own helpers"
        import helpers as again
        assert again is helpers  # still theirs after the tools loaded
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with bt.watch() as w:
            for _ in range(2):
                optimizer.zero_grad()
                model(torch.randn(4, 3)).pow(2).mean().backward()
                optimizer.step()
        print(w)
    """)
    )
    done = subprocess.run([sys.executable, "mine.py"], cwd=project, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Watched 2 iterations") and "Healthy" in done.stdout


def test_in_a_kernel_that_imported_the_course_the_scripts_own_helpers_is_still_its_own(project: Path) -> None:
    """``main`` is the command, run in this process (as notebook 05 runs it), where ``helpers`` is the course's."""
    assert sys.modules["helpers"].__file__.endswith(os.path.join("helpers", "__init__.py"))
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(project)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            status = main(["watch", "--no-traceback", "train.py", "3"])
    finally:
        os.chdir(cwd)
    assert status == 1 and err.getvalue() == ""  # --no-traceback: the report alone
    assert "Error (backward a second time) in iteration 2" in out.getvalue()
    assert sys.modules["helpers"] is helpers_package and "helpers.recorder" in sys.modules


def test_bad_input_gets_a_clear_message(project: Path) -> None:
    missing = _run(project, "watch", "nothing.py")
    assert missing.returncode == 2 and "no such script: nothing.py" in missing.stderr
    zero = _run(project, "watch", "--iterations", "0", "train.py")
    assert zero.returncode == 2 and "--iterations must be 1 or more" in zero.stderr
