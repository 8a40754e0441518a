"""``backward-twice watch``: an unmodified training script run under the recorder, from a folder that has its own
``helpers.py`` (which stays theirs: nothing of the tool is named ``helpers``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
    assert "helpers/" not in done.stderr  # the traceback is the script's, as python prints it
    # the diagnosis ends the traceback (a note on the exception), and is not printed twice
    diagnosis = done.stderr[done.stderr.index("backward-twice: 1 thing to fix") :]
    assert diagnosis.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "1. `hidden` carries iteration 1's graph into iteration 2" in diagnosis
    assert "train.py:15 | output, hidden = rnn(inputs, hidden)" in diagnosis
    assert "fix: add `hidden = hidden.detach()` before line 15" in diagnosis
    assert diagnosis.rstrip().endswith("more: backward-twice watch --verbose train.py 3") and done.stdout == ""
    report = json.loads((project / "report.json").read_text())
    assert report["count"] == len(report["items"]) == 1 and report["headline"] in diagnosis
    assert report["error"]["kind"] == "backward a second time"
    assert [(c["variable"], c["iteration"], c["reached_from"]) for c in report["carried"]] == [("hidden", 1, 2)]
    assert report["lines"] == []
    verbose = _run(project, "watch", "--verbose", "train.py", "3")
    assert verbose.stdout.startswith("evidence:\n  iterations: one per pass of your loop at train.py:13:")
    assert "more:" not in verbose.stderr  # it said to run the very command that printed it


def test_iterations_stop_the_script_and_its_arguments_reach_it(project: Path) -> None:
    (project / "train.py").write_text(
        RNN_SCRIPT.replace("output, hidden = rnn(inputs, hidden)", "output, hidden = rnn(inputs, hidden.detach())")
    )
    done = _run(project, "watch", "--iterations", "2", "train.py", "5")
    assert done.returncode == 0, done.stderr
    assert "finished" not in done.stdout  # stopped after two of the five iterations
    assert done.stdout.startswith("backward-twice: healthy (2 iterations watched, then stopped as asked, ")
    whole = _run(project, "watch", "train.py", "2", "--flag")
    assert (
        "finished ['2', '--flag']" in whole.stdout and "backward-twice: healthy (2 iterations watched," in whole.stdout
    )


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
    assert done.stdout.startswith("backward-twice: healthy (2 iterations watched,")


def test_importing_the_tool_is_light_and_the_drawing_loads_graphviz_when_asked_for(project: Path) -> None:
    """``import backward_twice`` brings torch and the tool, none of the course; graphviz comes with the first
    ``bt.draw_graph``, and the project's own ``helpers`` stays its own throughout."""
    (project / "light.py").write_text(
        textwrap.dedent("""
        import sys
        import helpers
        import backward_twice as bt

        heavy = ("matplotlib", "IPython", "ipywidgets", "graphviz")
        print(sorted(name for name in heavy if name in sys.modules))
        print(callable(bt.diagnose), callable(bt.watch), sorted(n for n in sys.modules if n.startswith("helpers")))
        bt.draw_graph
        print("graphviz" in sys.modules, "matplotlib" in sys.modules, helpers.NAME, sys.modules["helpers"] is helpers)
    """)
    )
    done = subprocess.run([sys.executable, "light.py"], cwd=project, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[]",
        "True True ['helpers']",
        "True False the project's own helpers True",
    ]


def test_python_dash_m_backward_twice_is_the_command(project: Path) -> None:
    """``python -m backward_twice`` (how notebook 05 runs it, in a process of its own): the same command."""
    done = subprocess.run(
        [sys.executable, "-m", "backward_twice", "watch", "--no-traceback", "train.py", "3"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1 and done.stderr == ""  # --no-traceback: the diagnosis alone
    assert done.stdout.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in")
    assert "add `hidden = hidden.detach()` before line 15" in done.stdout


def test_bad_input_gets_a_clear_message_before_the_script_runs(project: Path) -> None:
    missing = _run(project, "watch", "nothing.py")
    assert missing.returncode == 2 and missing.stderr == "backward-twice watch: no such script: nothing.py\n"
    none = _run(project, "watch")  # it said "required: script, args", though a script takes none
    assert none.returncode == 2 and none.stderr.endswith("error: the following arguments are required: script\n")
    assert "-m module [args ...]" in _run(project, "watch", "--help").stdout  # python -m's way in, which it takes
    zero = _run(project, "watch", "--iterations", "0", "train.py")
    assert zero.returncode == 2 and zero.stderr == "backward-twice watch: --iterations must be 1 or more\n"
    (project / "empty").mkdir()
    folder = _run(project, "watch", "empty")  # python: "can't find '__main__' module", status 1
    assert folder.returncode == 1 and folder.stderr == "backward-twice watch: no __main__.py in folder: empty\n"
    unwritable = [("/proc/report.json", "cannot write it")] if os.path.isdir("/proc/self") else []  # root too
    for path, words in [("nowhere/report.json", "no such folder"), ("empty", "is a folder"), *unwritable]:
        done = _run(project, "watch", "--json", path, "train.py", "2")
        assert done.returncode == 2 and words in done.stderr and done.stdout == "", done.stderr
        assert "finished" not in done.stdout  # refused before the script ran


SCRIPTS = {  # a script's ending -> (its text after the loop's setup, python's exit status, what stderr shows)
    "sys.exit(0)": ("sys.exit(0)", 0, ""),
    "sys.exit(3)": ("sys.exit(3)", 3, ""),
    "sys.exit(message)": ("sys.exit('bad config')", 1, "bad config\n"),
    # an exit object whose str() raises: python prints an empty line (the command printed its own traceback)
    "sys.exit(no str)": ("sys.exit(type('Status', (), {'__str__': lambda self: 1 / 0})())", 1, "\n"),
    "Ctrl-C": ("raise KeyboardInterrupt", -2, "KeyboardInterrupt"),  # python dies of SIGINT (a shell shows 130)
}
LOOP = """
import atexit
import sys
import torch
atexit.register(print, "the script's atexit ran")
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.randn(4, 3)).pow(2).mean().backward()
    optimizer.step()
    if step == 1:
        {ending}
"""


@pytest.mark.parametrize("ending", SCRIPTS)
def test_the_script_exits_as_python_does_and_the_diagnosis_of_what_ran_is_kept(project: Path, ending: str) -> None:
    text, status, stderr = SCRIPTS[ending]
    (project / "ends.py").write_text(LOOP.format(ending=text))
    python = subprocess.run([sys.executable, "ends.py"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "ends.py")
    assert done.returncode == python.returncode == status, done.stderr  # -2: killed by SIGINT, as python is
    assert stderr in python.stderr and stderr in done.stderr
    assert done.stdout.startswith("backward-twice: healthy (2 iterations watched; "), done.stdout
    assert " ended the run," in done.stdout.splitlines()[0], done.stdout
    assert "Error" not in done.stdout and "thing to fix" not in done.stdout
    assert "the script's atexit ran" in python.stdout and "the script's atexit ran" in done.stdout  # Ctrl-C too


def test_a_syntax_error_or_a_missing_import_is_reported_as_python_reports_it(project: Path) -> None:
    (project / "broken.py").write_text("import torch\nfor x in range(3)\n    pass\n")
    (project / "missing.py").write_text("import torch\nimport not_a_module_anywhere\n")
    for script in ("broken.py", "missing.py"):
        python = subprocess.run([sys.executable, script], cwd=project, capture_output=True, text=True, timeout=240)
        done = _run(project, "watch", script)
        assert done.returncode == python.returncode == 1
        assert done.stderr.splitlines()[-1] == python.stderr.splitlines()[-1]  # SyntaxError / ModuleNotFoundError
        assert "backward_twice" not in done.stderr and "backward-twice" not in done.stderr and done.stdout == ""


def test_the_scripts_builtins_are_the_module_as_under_python(project: Path) -> None:
    """line_profiler's fallback, ``__builtins__.profile = lambda f: f``, common in scripts: python's ``__main__``
    holds the builtins module there (the command gave exec's dict, and the script died with AttributeError)."""
    (project / "profiled.py").write_text(
        'if not hasattr(__builtins__, "profile"):\n    __builtins__.profile = lambda f: f\n\n'
        + LOOP.format(ending="pass").replace("import torch\n", "import torch\n\n@profile\ndef unused():\n    pass\n", 1)
    )
    python = subprocess.run([sys.executable, "profiled.py"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "profiled.py")
    assert python.returncode == done.returncode == 0, done.stderr
    assert done.stdout.startswith("backward-twice: healthy (3 iterations watched,"), done


def test_an_error_the_script_raises_after_its_loop_is_not_the_loops(project: Path) -> None:
    """``raise ValueError`` after the training loop ended: the loop ran its 3 passes and is healthy; it was "the
    loop raised in iteration 4 ... fix this error first". The error stays Python's: its traceback, exit status 1."""
    (project / "after.py").write_text(LOOP.format(ending="pass") + 'raise ValueError("after training")\n')
    python = subprocess.run([sys.executable, "after.py"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "after.py")
    assert python.returncode == done.returncode == 1
    assert "ValueError: after training" in python.stderr and "ValueError: after training" in done.stderr
    diagnosis = done.stderr[done.stderr.index("backward-twice:") :]
    ended = "ValueError: after training (raised after the loop) ended the run"
    assert diagnosis.startswith(f"backward-twice: healthy (3 iterations watched; {ended}"), diagnosis
    assert "fix" not in diagnosis


WRAPPED = """
import torch

model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(5):
        optimizer.zero_grad()
        model(torch.randn(2, 3)).pow(2).mean().backward()
        optimizer.step()
        print("step", step)
except:
    print("training failed: saving a checkpoint")
finally:
    print("closing the log")
print("trained")
"""


def test_a_bare_except_around_the_whole_script_does_not_catch_the_stop(project: Path) -> None:
    """``--iterations 2`` on a script whose loop sits in ``try: ... except:`` (a learner's "save on failure"): the
    stop is no failure of the script's, so its handler does not run; its ``finally:`` does, as for Ctrl-C."""
    (project / "wrapped.py").write_text(WRAPPED)
    python = subprocess.run([sys.executable, "wrapped.py"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "--iterations", "2", "wrapped.py")
    assert python.returncode == done.returncode == 0, done.stderr
    assert python.stdout.splitlines()[-2:] == ["closing the log", "trained"]
    assert done.stdout.splitlines()[:3] == ["step 0", "step 1", "closing the log"], done.stdout
    assert "training failed" not in done.stdout and "trained" not in done.stdout.splitlines()
    assert "backward-twice: healthy (2 iterations watched, then stopped as asked" in done.stdout


SUPPRESSED = """
import contextlib
import torch

model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with contextlib.suppress(BaseException):  # "never let a crash lose the checkpoint"
    for step in range(5):
        optimizer.zero_grad()
        model(torch.randn(2, 3)).pow(2).mean().backward()
        optimizer.step()
        print("step", step)
print("saving the checkpoint")
"""


def test_a_suppress_base_exception_around_the_loop_does_not_swallow_the_stop(project: Path) -> None:
    """``--iterations 2`` on a loop inside ``with contextlib.suppress(BaseException):``: the stop was swallowed by
    its exit, and the script went on to save the half-trained model as if training had ended."""
    (project / "suppressed.py").write_text(SUPPRESSED)
    python = subprocess.run([sys.executable, "suppressed.py"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "--iterations", "2", "suppressed.py")
    assert python.returncode == done.returncode == 0, done.stderr
    assert python.stdout.splitlines()[-2:] == ["step 4", "saving the checkpoint"]
    assert done.stdout.splitlines()[:2] == ["step 0", "step 1"], done.stdout
    assert "saving the checkpoint" not in done.stdout and "step 2" not in done.stdout
    assert "backward-twice: healthy (2 iterations watched, then stopped as asked" in done.stdout


def test_a_folder_runs_its_main_as_python_does(project: Path) -> None:
    (project / "app").mkdir()
    (project / "app" / "__main__.py").write_text(LOOP.format(ending="pass"))
    done = _run(project, "watch", "app")
    assert done.returncode == 0 and done.stdout.startswith("backward-twice: healthy (3 iterations watched,"), done


def test_a_zip_app_runs_its_main_as_python_does(project: Path) -> None:
    """``python app.pyz`` runs the archive's ``__main__.py`` (a zipapp); the command compiled the archive's bytes
    as a script ("SyntaxError: source code string cannot contain null bytes", status 1). An archive without one:
    status 1, as python's "can't find '__main__' module"."""
    import zipfile

    with zipfile.ZipFile(project / "app.pyz", "w") as archive:
        archive.writestr("__main__.py", LOOP.format(ending="pass"))
    with zipfile.ZipFile(project / "empty.zip", "w") as archive:
        archive.writestr("other.py", "")
    python = subprocess.run([sys.executable, "app.pyz"], cwd=project, capture_output=True, text=True, timeout=240)
    done = _run(project, "watch", "app.pyz")
    assert python.returncode == done.returncode == 0 and python.stdout == "the script's atexit ran\n", done.stderr
    assert done.stdout.startswith("backward-twice: healthy (3 iterations watched,"), done.stdout
    missing = _run(project, "watch", "empty.zip")
    assert missing.returncode == 1 and missing.stderr == "backward-twice watch: no __main__.py in archive: empty.zip\n"


@pytest.mark.parametrize("given", ["where.py", "./where.py", "app"])
def test_the_scripts_argv_and_path_are_as_under_python(tmp_path: Path, given: str) -> None:
    """``sys.argv[0]`` is the path as typed, relative or not, as python gives it (it was the absolute path, which
    changes what a script that prints its own usage or derives names from ``argv[0]`` does); a folder's
    ``__main__`` gets python's ``__file__``, ``sys.path[0]`` and ``__spec__`` too."""
    (tmp_path / "app").mkdir()
    where = "[sys.argv, __file__, sys.path[0], __spec__ and [__spec__.name, __spec__.origin]]"
    script = f"import json, sys\nprint(json.dumps({where}))\n" + LOOP.format(ending="pass")
    for path in (tmp_path / "where.py", tmp_path / "app" / "__main__.py"):
        path.write_text(script)
    python = subprocess.run([sys.executable, given, "x"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    done = _run(tmp_path, "watch", given, "x")
    assert python.returncode == done.returncode == 0, done.stderr
    seen, truth = json.loads(done.stdout.splitlines()[0]), json.loads(python.stdout.splitlines()[0])
    assert seen[0] == [given, "x"]
    assert seen[1:] == truth[1:] or given == "./where.py"  # python's __file__ keeps the ./ there; ours is normalised
    assert seen[0] == truth[0]


README_LOOP = """import torch
import backward_twice as bt

torch.manual_seed(0)
model = torch.nn.GRU(4, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
hidden = torch.zeros(1, 3, 8)
batches = [(torch.randn(5, 3, 4), torch.randn(5, 3, 8)) for _ in range(3)]
criterion = torch.nn.MSELoss()


# the README's loop, at the lines its example names
with bt.watch() as w:
    for inputs, targets in batches:
        optimizer.zero_grad()
        output, hidden = model(inputs, hidden)
        loss = criterion(output, targets)
        loss.backward()
        optimizer.step()
"""


def test_the_readme_shows_what_a_script_with_the_watch_prints(tmp_path: Path) -> None:
    """The example under "Bring your own training step" is this loop's own traceback ending, as printed."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("```\nRuntimeError: Trying to backward through the graph a second time")
    shown = readme[start + 4 : readme.index("```", start + 4)].splitlines()
    (tmp_path / "train.py").write_text(README_LOOP)
    assert README_LOOP.splitlines()[15].strip() == "output, hidden = model(inputs, hidden)"
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    printed = done.stderr.splitlines()
    assert done.returncode == 1 and printed[-len(shown) + 1 :] == shown[1:], done.stderr
    assert printed[-len(shown)].startswith(shown[0].removesuffix("..."))


def test_state_kept_on_an_object_of_a_learners_own_helpers_package_is_named(tmp_path: Path) -> None:
    """A learner's package may be named ``helpers`` too: its objects hold the loop's state like any other."""
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "state.py").write_text("class State:\n    def __init__(self, h):\n        self.h = h\n")
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""
        import torch
        from helpers.state import State

        rnn = torch.nn.RNN(4, 8)
        state = State(torch.zeros(1, 1, 8))
        for _ in range(3):
            output, state.h = rnn(torch.randn(5, 1, 4), state.h)
            output.pow(2).mean().backward()
    """)
    )
    done = _run(tmp_path, "watch", "--no-traceback", "train.py")
    assert done.returncode == 1, done.stderr
    assert "1. `state.h` carries iteration 1's graph into iteration 2" in done.stdout, done.stdout


MOCO_DEQUE = """
import collections

import torch

torch.manual_seed(0)
encoder_q, encoder_k = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
optimizer = torch.optim.SGD(encoder_q.parameters(), lr=0.03)


class Bank:
    def __init__(self):
        self.queue = collections.deque([torch.randn(4, 4)] * 2, maxlen=MAXLEN)

    def enqueue(self, keys):
        self.queue.append(keys)


bank = Bank()
for _ in range(4):
    q, k = encoder_q(torch.randn(4, 6)), encoder_k(torch.randn(4, 6))
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ torch.cat(list(bank.queue)).T.detach()], dim=1)
    loss = torch.nn.functional.cross_entropy(logits, torch.zeros(4).long())
    bank.enqueue(k)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("maxlen", "headline"),
    [
        (2, "keeps the last 2 iterations' graphs alive"),
        (8, "keeps up to the last 8 iterations' graphs alive"),
    ],
)
def test_a_deque_of_key_graphs_is_one_note_of_what_it_holds(tmp_path: Path, maxlen: int, headline: str) -> None:
    """A MoCo-style queue as a deque, the keys enqueued with their graphs: with maxlen 2 it was "healthy" (read at
    each pass's first event, the deque had pushed its oldest graph out, so its count never grew), although it
    holds the last 2 passes' graphs; with maxlen 8 it still fills up in the 4 passes watched: it was "one more
    iteration's graph alive every iteration", "holds them all", where its maxlen keeps at most 8 (the 4 it holds; no
    count: the passes are read at their first events, and none sees the run's end)."""
    (tmp_path / "train.py").write_text(MOCO_DEQUE.replace("MAXLEN", str(maxlen)))
    done = _run(tmp_path, "watch", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backward-twice: 1 note (4 iterations watched)"), done.stdout
    assert f"1. `self.queue` {headline}\n" in done.stdout, done.stdout
    assert "train.py:16 | self.queue.append(keys)" in done.stdout, done.stdout
    assert "keep in mind: `self.queue.append(keys.detach())`" in done.stdout, done.stdout


RECENT_LOSSES = """
import collections

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
recent = collections.deque(maxlen=3)
for _ in range(6):
    optimizer.zero_grad()
    loss = (model(torch.randn(8, 4)) - torch.randn(8, 1)).pow(2).mean()
    loss.backward()
    optimizer.step()
    recent.append(loss)
print("graphs held:", sum(item.grad_fn is not None for item in recent))
"""


@pytest.mark.parametrize(
    ("iterations", "headline"),
    [
        ("2", "keeps up to the last 3 iterations' graphs alive (2 so far)"),
        ("3", "keeps the last 3 iterations' graphs alive"),
        ("6", "keeps the last 3 iterations' graphs alive"),
    ],
)
def test_a_deque_not_yet_full_when_the_run_stops_keeps_up_to_its_maxlen(
    tmp_path: Path, iterations: str, headline: str
) -> None:
    """A learner's last losses in ``collections.deque(maxlen=3)``: at ``--iterations 2`` it was "keeps one more
    iteration's graph alive every iteration ... holds them all", which the deque's maxlen makes false (the bare run
    holds 3 graphs after 6 passes, not 6); what it holds after 2 passes is 2 graphs."""
    (tmp_path / "train.py").write_text(RECENT_LOSSES)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.stdout == "graphs held: 3\n", bare.stderr
    done = _run(tmp_path, "watch", "--iterations", iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert f"1. `recent` {headline}\n" in done.stdout, done.stdout
    assert "holds them until newer ones push them out" in done.stdout, done.stdout
    assert "holds them all" not in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("maxlen", "passes", "item", "held", "kept"),
    [
        (4, 7, "loss", 4, "the last 4"),  # full at pass 6's read
        (7, 7, "loss", 7, "up to the last 7"),  # full at the end: the last read, at pass 6's backward, saw 5
        (10, 6, '{"loss": loss, "mean": out.mean()}', 6, "up to the last 10"),  # ``out.mean()``: built after the step
    ],
)
def test_a_deque_watched_to_its_end_tells_no_count_its_reads_did_not_see(
    tmp_path: Path, maxlen: int, passes: int, item: str, held: int, kept: str
) -> None:
    """A deque of losses (h71a): ``deque(maxlen=4)`` over 7 passes was "up to the last 4 ... (3 so far)" where the
    bare run ends holding 4 (read at passes 1-4 and 8; now 6 too: full); a ``deque(maxlen=10)`` of dicts with a tensor
    built after the step, over 6 passes, was "one more iteration's graph alive every iteration ... holds them all",
    where its maxlen bounds it at 10. A count its reads did not see is not given."""
    source = RECENT_LOSSES.replace("maxlen=3", f"maxlen={maxlen}").replace("range(6)", f"range({passes})")
    source = source.replace("    loss = (model(", "    out = model(torch.randn(8, 4))\n    loss = (model(")
    source = source.replace("recent.append(loss)", f"recent.append({item})").replace(".grad_fn is not None", "")
    source = source.replace("sum(item for item in recent)", "len(recent)")
    (tmp_path / "train.py").write_text(source)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.stdout == f"graphs held: {held}\n", bare.stderr
    done = _run(tmp_path, "watch", "train.py")
    assert done.returncode == 0, done.stderr
    assert f"1. `recent` keeps {kept} iterations' graphs alive\n" in done.stdout, done.stdout
    assert "holds them until newer ones push them out" in done.stdout, done.stdout


LOSSES_IN_STATE = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "losses": []}


def iteration(state):
    model, opt, losses = state["model"], state["opt"], state["losses"]
    opt.zero_grad()
    loss = model(torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    losses.append(loss / 4)
    opt.step()


def run(state, iterations=3):
    for _ in range(iterations):
        iteration(state)


if __name__ == "__main__":
    run(build())
"""


@pytest.mark.parametrize("iterations", [(), ("--iterations", "2"), ("--iterations", "3")])
def test_a_list_grown_under_a_functions_own_name_is_named_at_its_append_at_every_run_length(
    tmp_path: Path, iterations: tuple[str, ...]
) -> None:
    """Past the two passes the line tracer follows, the list's newest graph has no logged line: the note named
    ``def iteration(state):`` with no code ("train.py:11 (losses[1], iteration) |"); and, grown as the function's own
    ``losses``, the list got the generic fix. The line is iteration 1's twin's, the name the one the line grows."""
    (tmp_path / "train.py").write_text(LOSSES_IN_STATE)
    done = _run(tmp_path, "watch", *iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert "1 note (" in done.stdout.splitlines()[0], done.stdout
    assert "1. `losses` keeps one more iteration's graph alive every iteration\n" in done.stdout, done.stdout
    assert "train.py:16 | losses.append(loss / 4)\n" in done.stdout, done.stdout
    assert "keep in mind: `losses.append((loss / 4).item())`, or `(loss / 4).detach()`" in done.stdout, done.stdout
    assert "(losses[" not in done.stdout, done.stdout


def test_a_list_a_caller_names_otherwise_is_one_note_in_process(tmp_path: Path) -> None:
    """The caller holds the state as ``st``, the loop as ``state``: two notes of one list (``state['losses']`` and
    ``st['losses']``), where the docs promise one item per graph."""
    (tmp_path / "losses_in_state.py").write_text(LOSSES_IN_STATE)
    (tmp_path / "drive.py").write_text(
        "import backward_twice as bt\nimport losses_in_state as m\n"
        "st = m.build()\nwith bt.watch() as w:\n    m.run(st)\nprint(w)\n"
    )
    done = subprocess.run([sys.executable, "drive.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backward-twice: 1 note (3 iterations watched)\n"), done.stdout
    assert "losses_in_state.py:16 | losses.append(loss / 4)\n" in done.stdout, done.stdout


def _printed_by_python(tmp_path: Path, source: str) -> str:
    """What ``source``, run by python as ``fixed.py`` in ``tmp_path`` (a fix applied as printed), prints."""
    (tmp_path / "fixed.py").write_text(source)
    bare = subprocess.run([sys.executable, "fixed.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0, bare.stderr
    return bare.stdout


LOOP_NAME_REUSED = """
import torch

torch.manual_seed(0)
net = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
pair = (net, "unused")
losses = []
for _ in range(6):
    _, tag = pair
    loss = net(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
    print("pass done")
"""


@pytest.mark.parametrize(("iterations", "passes"), [((), 6), (("--iterations", "3"), 3)])
def test_a_loop_whose_body_rebinds_its_name_to_one_object_is_told_by_its_lines(
    tmp_path: Path, iterations: tuple[str, ...], passes: int
) -> None:
    """``for _ in range(6):`` with ``_, tag = pair`` in the body (h73a): "healthy (2 iterations watched, 6 backward
    calls)", and ``--iterations 3`` ran all 6 passes: what ``_`` held at each event was the same object every pass,
    so no new pass was seen. The truth: 6 passes, ``losses`` holds 6 graphs."""
    (tmp_path / "train.py").write_text(LOOP_NAME_REUSED)
    done = _run(tmp_path, "watch", *iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("pass done\n") == passes, done.stdout
    stopped = ", then stopped as asked" if iterations else ""
    assert f"backward-twice: 1 note ({passes} iterations watched{stopped})\n" in done.stdout, done.stdout
    assert "1. `losses` keeps one more iteration's graph alive every iteration\n" in done.stdout, done.stdout


RECORDED_BY_A_HELPER = """
import torch


def record(store, a, b):
    store.append(a)
    store.append(b)


def train(passes):
    torch.manual_seed(0)
    encoder, head_a, head_b = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head_a.parameters(), *head_b.parameters()], lr=0.1)
    recent = []
    for _ in range(passes):
        optimizer.zero_grad()
        h = encoder(torch.randn(8, 4))
        loss_a, loss_b = head_a(h).pow(2).mean(), head_b(h).abs().mean()
        (loss_a + loss_b).backward()
        optimizer.step()
        record(recent, loss_a, loss_b)
    return recent


recent = train(4)
print("graphs held", sum(t.grad_fn is not None for t in recent if torch.is_tensor(t)))
"""


@pytest.mark.parametrize("iterations", [(), ("--iterations", "2")])
def test_a_list_a_helper_grows_is_named_at_the_helpers_appends(tmp_path: Path, iterations: tuple[str, ...]) -> None:
    """``record(recent, loss_a, loss_b)`` appending both to its parameter ``store`` (h71a): the note sat at the loss
    line ("each iteration's graph starts here") with the generic fix. The truth (no helpers): the list holds 8
    graphs after 4 passes; with the printed lines in place of the helper's appends, none."""
    (tmp_path / "train.py").write_text(RECORDED_BY_A_HELPER)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.stdout == "graphs held 8\n", bare.stderr
    done = _run(tmp_path, "watch", *iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert "train.py:6 | store.append(a)\n" in done.stdout and "train.py:7 | store.append(b)\n" in done.stdout
    fix = "keep in mind: `store.append(a.item())` and `store.append(b.item())`\n"
    assert fix in done.stdout, done.stdout
    fixed = RECORDED_BY_A_HELPER.replace("store.append(a)", "store.append(a.item())")
    assert _printed_by_python(tmp_path, fixed.replace("store.append(b)", "store.append(b.item())")) == "graphs held 0\n"


RECORDED_BY_A_METHOD = """
import torch


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.recent = []

    def record(self, store, loss):
        store.append(loss)

    def fit(self, passes):
        for _ in range(passes):
            self.optimizer.zero_grad()
            loss = self.net(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            self.record(self.recent, loss)


t = Trainer()
t.fit(6)
"""

RECORDED_BESIDE_LOG_PROBS = """
import torch


def record(store, a):
    store.append(a)


torch.manual_seed(0)
policy = torch.nn.Linear(4, 3)
optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
history = []
for episode in range(6):
    log_probs, rewards = [], []
    for t in range(4):
        dist = torch.distributions.Categorical(logits=policy(torch.randn(4)))
        action = dist.sample()
        record(log_probs, dist.log_prob(action))
        rewards.append(float(action == 1))
    loss = -(torch.stack(log_probs) * torch.tensor(rewards)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    record(history, loss)
"""


def test_a_helper_method_is_one_note_and_a_helper_that_grows_two_lists_gets_no_fix_of_its_own(tmp_path: Path) -> None:
    """h73a: ``self.record(self.recent, loss)`` was two notes of one list (``store`` at the helper's append, and
    ``t.recent`` at the loss line); a ``record()`` that also fills REINFORCE's ``log_probs`` got
    ``store.append(a.item())``, which, applied, raised at ``torch.stack(log_probs)`` ("expected Tensor")."""
    (tmp_path / "method.py").write_text(RECORDED_BY_A_METHOD)
    done = _run(tmp_path, "watch", "method.py")
    assert done.stdout.startswith("backward-twice: 1 note (6 iterations watched)\n"), done.stdout
    assert "keep in mind: `store.append(loss.item())`, or `loss.detach()` if you need the tensor" in done.stdout
    (tmp_path / "shared.py").write_text(RECORDED_BESIDE_LOG_PROBS)
    done = _run(tmp_path, "watch", "shared.py")
    assert done.stdout.startswith("backward-twice: 1 note (6 iterations watched)\n"), done.stdout
    assert "store.append(" not in done.stdout, done.stdout
    applied = RECORDED_BESIDE_LOG_PROBS.replace("    store.append(a)", "    store.append(a.item())")
    (tmp_path / "applied.py").write_text(applied)
    bare = subprocess.run([sys.executable, "applied.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "expected Tensor" in bare.stderr, bare.stderr


FIELDS_IN_NESTED_STATE = """
import torch


def build():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return {"net": net, "opt": torch.optim.Adam(net.parameters(), 1e-3), "stats": {"fields": []}}


def iteration(state):
    net, opt, stats = state["net"], state["opt"], state["stats"]
    loss = net(torch.randn(16, 2)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    field = net(torch.randn(16, 2))
    stats["fields"].append(field)


def run(state, iterations=4):
    for _ in range(iterations):
        iteration(state)


if __name__ == "__main__":
    state = build()
    run(state)
    print("graphs held", sum(t.grad_fn is not None for t in state["stats"]["fields"]))
"""


@pytest.mark.parametrize("iterations", [(), ("--iterations", "2")])
def test_a_list_in_a_dict_of_the_state_is_a_note_at_its_append(tmp_path: Path, iterations: tuple[str, ...]) -> None:
    """``stats["fields"].append(field)`` with ``stats = state["stats"]`` (h72b, the HNN's test fields): "healthy",
    the list two dicts down in a variable of the loop's function was never read as growing. The truth (no helpers):
    4 graphs held after 4 passes; with the printed line in place, none."""
    (tmp_path / "train.py").write_text(FIELDS_IN_NESTED_STATE)
    done = _run(tmp_path, "watch", *iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert '1. `stats["fields"]` keeps one more iteration\'s graph alive every iteration\n' in done.stdout, done.stdout
    assert 'keep in mind: `stats["fields"].append(field.detach())`\n' in done.stdout, done.stdout
    (tmp_path / "fixed.py").write_text(FIELDS_IN_NESTED_STATE.replace(".append(field)", ".append(field.detach())"))
    for script, held in (("train.py", 4), ("fixed.py", 0)):
        bare = subprocess.run([sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert bare.stdout == f"graphs held {held}\n", bare.stderr


IMPLICIT_BACKWARD = """
import torch

torch.manual_seed(0)
layer = torch.nn.Linear(3, 3)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(4, 3)
    z = torch.tanh(layer(x))
    z0 = z.clone().detach().requires_grad_()
    f0 = torch.tanh(layer(z0))

    def backward_hook(grad):
        for _ in range(2):
            grad = torch.autograd.grad(f0, z0, grad, retain_graph=RETAIN)[0] + grad
        return grad

    z.register_hook(backward_hook)
    loss = z.pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_backward_calls_inside_a_backwards_hook_are_counted_and_said_unjudged(tmp_path: Path) -> None:
    """A Deep Equilibrium model's implicit backward: a tensor hook runs ``autograd.grad(f0, z0, y,
    retain_graph=True)`` once per solver step. The recorder passes such calls through unjudged, and the report said
    "no retain_graph=True to drop" as if it had judged that one; its retain is needed (without it the second solver
    step raises). The headline now says how many calls it passed and where the first is."""
    (tmp_path / "without.py").write_text(IMPLICIT_BACKWARD.replace("RETAIN", "False"))
    bare = subprocess.run([sys.executable, "without.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "backward through the graph a second time" in bare.stderr, bare.stderr
    (tmp_path / "deq.py").write_text(IMPLICIT_BACKWARD.replace("RETAIN", "True"))
    done = _run(tmp_path, "watch", "--json", "report.json", "deq.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "backward-twice: healthy (3 iterations watched, 3 backward calls, nothing carried, no retain_graph=True to "
        "drop; 6 backward calls inside another backward (line 15) not judged)\n"
    ), done.stdout
    inside = json.loads((tmp_path / "report.json").read_text())["inside"]
    assert inside["calls"] == 6 and inside["first"].startswith("deq.py:15: grad = torch.autograd.grad("), inside


LOSSES_PER_EPOCH = """\"\"\"Keeps each epoch's losses for its mean: epoch_losses.append(loss) in the loop below.\"\"\"
import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epoch_losses = []
for epoch in range(2):
    for _ in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(2, 3)).pow(2).mean()
        loss.backward()
        optimizer.step()
        epoch_losses.append(loss)
    print("epoch mean", round(torch.stack(epoch_losses).mean().item(), 4), len(epoch_losses))
    epoch_losses.clear()
"""


@pytest.mark.parametrize(
    ("iterations", "headline", "why"),
    [
        ("2", "keeps one more iteration's graph alive every iteration", "holds them all"),
        ("6", "keeps several iterations' graphs alive at once", "holds them until the loop resets it"),
        ("8", "keeps several iterations' graphs alive at once", "holds them until the loop resets it"),
    ],
)
def test_a_list_cleared_each_epoch_is_named_at_its_append_and_said_to_be_reset(
    tmp_path: Path, iterations: str, headline: str, why: str
) -> None:
    """The note named line 1, the module's docstring that quotes ``epoch_losses.append(loss)`` (h69a); and once
    the list had been cleared at an epoch's end it still "holds them all", where the bare run shows it holds one
    epoch's graphs at most (4, then 4)."""
    (tmp_path / "train.py").write_text(LOSSES_PER_EPOCH)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert [line.split()[-1] for line in bare.stdout.splitlines()] == ["4", "4"], bare.stderr
    done = _run(tmp_path, "watch", "--iterations", iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert f"1. `epoch_losses` {headline}\n" in done.stdout, done.stdout
    assert "train.py:14 | epoch_losses.append(loss)\n" in done.stdout, done.stdout
    assert f"but `epoch_losses` {why}" in done.stdout, done.stdout


TWO_LISTS_IN_ONE_DICT = """
import torch

torch.manual_seed(0)
encoder, head = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
history = {"parts": [], "totals": []}
for _ in range(6):
    optimizer.zero_grad()
    h = encoder(torch.randn(8, 4))
    reconstruction, penalty = head(h).pow(2).mean(), h.pow(2).mean() * 0.01
    (reconstruction + penalty).backward()
    optimizer.step()
    history["parts"].extend([reconstruction / 2, penalty / 2])
    history["totals"] += [reconstruction + penalty]
print("graphs held", *(sum(t.grad_fn is not None for t in kept) for kept in history.values()))
"""


def test_two_lists_of_one_dict_that_both_grow_are_two_notes(tmp_path: Path) -> None:
    """A dict of two lists, both given tensors with their graphs each pass (h69c): only the list of the newest
    graph was a note; the other showed only once that one was fixed. The bare run holds 12 and 6 graphs."""
    (tmp_path / "train.py").write_text(TWO_LISTS_IN_ONE_DICT)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.stdout == "graphs held 12 6\n", bare.stderr
    done = _run(tmp_path, "watch", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("graphs held 12 6\nbackward-twice: 2 notes (6 iterations watched)\n"), done.stdout
    assert '`history["totals"]` keeps one more iteration\'s graph alive every iteration' in done.stdout, done.stdout
    assert '`history["parts"]` keeps one more iteration\'s graph alive every iteration' in done.stdout, done.stdout
    assert 'train.py:14 | history["parts"].extend([reconstruction / 2, penalty / 2])' in done.stdout, done.stdout


TWO_APPENDS = """
import torch

torch.manual_seed(0)
encoder, head_a, head_b = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD([*encoder.parameters(), *head_a.parameters(), *head_b.parameters()], lr=0.1)
recent = []
for _ in range(4):
    optimizer.zero_grad()
    h = encoder(torch.randn(8, 4))
    loss_a, loss_b = head_a(h).pow(2).mean(), head_b(h).abs().mean()
    (loss_a + loss_b).backward()
    optimizer.step()
    recent.append(loss_a)
    recent.append(loss_b)
print("graphs held", sum(t.grad_fn is not None for t in recent if torch.is_tensor(t)))
"""


def test_a_list_given_two_tensors_a_pass_is_named_at_both_appends_and_fixed_at_both(tmp_path: Path) -> None:
    """Two appends a pass (h69c): the note named the first line only, and its fix as printed left the second
    append keeping a graph every pass (the bare run with that fix still holds 4 graphs; with both, none)."""
    (tmp_path / "train.py").write_text(TWO_APPENDS)
    done = _run(tmp_path, "watch", "train.py")
    assert done.returncode == 0, done.stderr
    assert (
        "train.py:14 | recent.append(loss_a)\n" in done.stdout
        and "train.py:15 | recent.append(loss_b)\n" in done.stdout
    )
    fix = "keep in mind: `recent.append(loss_a.item())` and `recent.append(loss_b.item())`\n"
    assert fix in done.stdout, done.stdout
    fixed = TWO_APPENDS.replace("recent.append(loss_a)", "recent.append(loss_a.item())")
    fixed = fixed.replace("recent.append(loss_b)", "recent.append(loss_b.item())")
    assert _printed_by_python(tmp_path, fixed) == "graphs held 0\n"


DEQUE_OF_DICTS = """
import collections

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
log = collections.deque(maxlen=3)
for _ in range(7):
    optimizer.zero_grad()
    out = model(torch.randn(8, 4))
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()
    log.append({"loss": loss, "pred_mean": out.mean()})
print("graphs held", sum(item["loss"].grad_fn is not None for item in log))
"""


@pytest.mark.parametrize(
    ("iterations", "headline"),
    [
        ((), "keeps the last 3 iterations' graphs alive"),
        (("--iterations", "2"), "keeps up to the last 3 iterations' graphs alive (2 so far)"),
        (("--iterations", "3"), "keeps the last 3 iterations' graphs alive"),
    ],
)
def test_a_deque_of_dicts_of_tensors_is_one_note_of_its_last_items(
    tmp_path: Path, iterations: tuple[str, ...], headline: str
) -> None:
    """A ``deque(maxlen=3)`` of dicts of tensors (h69c): 6 notes, one per entry of each slot, each "one more
    iteration's graph alive every iteration", where the bare run holds the last 3 passes' graphs."""
    (tmp_path / "train.py").write_text(DEQUE_OF_DICTS)
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bare.stdout == "graphs held 3\n", bare.stderr
    done = _run(tmp_path, "watch", *iterations, "train.py")
    assert done.returncode == 0, done.stderr
    assert "backward-twice: 1 note (" in done.stdout, done.stdout
    assert f"1. `log` {headline}\n" in done.stdout, done.stdout


LOG_BY_SETDEFAULT = """
import torch


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.log = {}

    def fit(self, passes):
        for _ in range(passes):
            loss = self.model(torch.randn(8, 4)).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.log.setdefault("loss", []).append(loss)


trainer = Trainer()
trainer.fit(6)
print("graphs held", sum(t.grad_fn is not None for t in trainer.log["loss"]))
"""


def test_a_list_a_dict_makes_at_its_first_append_is_one_note_at_that_append(tmp_path: Path) -> None:
    """``self.log.setdefault("loss", []).append(loss)`` (h70a): two notes, ``self.log['loss']`` and
    ``trainer.log['loss']``, each at the loss line, for one list (6 graphs in the bare run)."""
    (tmp_path / "train.py").write_text(LOG_BY_SETDEFAULT)
    done = _run(tmp_path, "watch", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("graphs held 6\nbackward-twice: 1 note (6 iterations watched)\n"), done.stdout
    assert 'train.py:18 | self.log.setdefault("loss", []).append(loss)\n' in done.stdout, done.stdout


LOSS_AND_MEAN = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = {"loss": [], "mean": []}
for _ in range(6):
    out = model(torch.randn(8, 4))
    loss = out.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history["loss"].append(loss)
    history["mean"].append(out.mean())
"""


def test_an_item_of_a_growing_list_is_no_note_of_its_own_at_a_later_start(tmp_path: Path) -> None:
    """``history['loss']`` and ``history['mean']`` grow (h70a): at ``--iterations 3`` a third note named one item,
    ``history['loss'][1]``, at the loss line."""
    (tmp_path / "train.py").write_text(LOSS_AND_MEAN)
    done = _run(tmp_path, "watch", "--iterations", "3", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backward-twice: 2 notes (3 iterations watched, then stopped as asked)\n"), (
        done.stdout
    )
    assert "][" not in done.stdout.split("more:")[0].replace("[]", ""), done.stdout


WHERE_AM_I = """
import json
import sys

import torch

main = sys.modules["__main__"]
print(json.dumps([__name__, __file__, sys.argv, main.__file__, main.__dict__ is globals(), __package__, __spec__]))
weight = torch.ones(2, requires_grad=True)
for _ in range(2):
    (weight * 3).sum().backward()
"""


def test_the_script_is_compiled_once_and_runs_as_python_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The truth: ``python script.py`` on the same file. The file is compiled once (for the syntax check and the
    run), and needs none of runpy's private steps (those are for a folder's ``__main__``)."""
    from backward_twice import cli

    script = tmp_path / "where.py"
    script.write_text(WHERE_AM_I)
    python = subprocess.run([sys.executable, str(script), "x"], capture_output=True, text=True, timeout=240)
    compiled: list[str] = []
    real_compile = compile

    def counting(source, filename, *args, **kwargs):  # type: ignore[no-untyped-def]
        if filename == str(script):
            compiled.append(filename)
        return real_compile(source, filename, *args, **kwargs)

    monkeypatch.setattr("builtins.compile", counting)
    monkeypatch.setattr(cli, "_RUN_CODE", None)
    assert cli.main(["watch", str(script), "x"]) == 0
    printed = capsys.readouterr().out.splitlines()
    seen, truth = json.loads(printed[0]), json.loads(python.stdout.splitlines()[0])
    assert seen == truth  # name, file, argv, the __main__ module, package and spec as python's
    assert printed[1].startswith("backward-twice: healthy (2 iterations watched,"), printed
    assert len(compiled) == 1


ONE_LINE_LOOP = """import torch
torch.manual_seed(0)
model = torch.nn.RNNCell(4, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
h = torch.zeros(1, 8)
data = [torch.randn(1, 4) for _ in range(5)]
{before}for x in data: h = model(x, h); loss = h.pow(2).sum(); opt.zero_grad(); loss.backward(); opt.step(){after}
"""


def test_a_carry_in_a_one_line_loop_is_fixed_at_the_end_of_each_iteration_not_before_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The truth: the loop raises as written and with a detach added before its line; it runs with the detach at the
    end of its line."""
    from backward_twice import cli

    def bare(before: str = "", after: str = "") -> int:
        (tmp_path / "probe.py").write_text(ONE_LINE_LOOP.format(before=before, after=after))
        return subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, capture_output=True, timeout=240).returncode

    assert bare() == 1 and bare(before="h = h.detach()\n") == 1 and bare(after="; h = h.detach()") == 0
    (tmp_path / "train.py").write_text(ONE_LINE_LOOP.format(before="", after=""))
    assert cli.main(["watch", "--no-traceback", str(tmp_path / "train.py")]) == 1  # as python: the loop raised
    printed = capsys.readouterr().out
    assert "`h` carries iteration 1's graph into iteration 2" in printed, printed
    assert "fix: add `h = h.detach()` at the end of each iteration" in printed, printed
