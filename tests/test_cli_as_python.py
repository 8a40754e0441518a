"""``backward-twice watch`` ends a script as ``python`` does, in what scripts do to the process around their loop: they
close or replace ``sys.stdout``, install their own ``sys.excepthook`` and ``threading.excepthook``, leave a thread
training after their body returns, fork a child, take ``--`` among their arguments. Each against ``python`` on the
same script; the diagnosis is added on the command's own stdout, or after the traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_learner_scripts import COMMAND, run

LOOP = """
import torch

weight = torch.zeros(3, requires_grad=True)
for x in torch.randn(3, 3):  # a loop on one line: its passes come from opcode events
    (weight @ x).pow(2).backward(); weight.data -= 0.1 * weight.grad; weight.grad = None
"""
HEALTHY = "backward-twice: healthy (3 iterations watched, 3 backward calls"


def test_a_script_that_closes_its_stdout_ends_as_python_ends_it(tmp_path: Path) -> None:
    """It was status 1 and the command's own ValueError ("I/O operation on closed file"), where python exits 0."""
    python, watched = run(tmp_path, LOOP + "print('trained', flush=True)\nimport sys\nsys.stdout.close()\n")
    assert python.returncode == watched.returncode == 0 and python.stderr == watched.stderr == "", watched.stderr
    assert python.stdout == "trained\n" and watched.stdout.startswith("trained\n" + HEALTHY), watched.stdout


def test_a_script_that_makes_a_log_file_its_stdout_keeps_its_log_and_the_diagnosis_comes_to_the_terminal(
    tmp_path: Path,
) -> None:
    """It was the diagnosis written into the learner's log, and nothing on the terminal."""
    redirect = "import sys\nsys.stdout = open('train.log', 'w')\n"
    python, watched = run(tmp_path, redirect + LOOP + "print('trained')\n")
    assert python.returncode == watched.returncode == 0, watched.stderr
    logs = [(tmp_path / name / "train.log").read_text() for name in ("python", "watched")]
    assert logs == ["trained\n", "trained\n"]
    assert python.stdout == "" and watched.stdout.startswith(HEALTHY), watched.stdout


def test_a_thread_left_training_after_the_script_body_is_waited_for_and_judged_with_the_scripts_hook(
    tmp_path: Path,
) -> None:
    """Python waits for a thread the script does not join before it exits. It was "no backward call seen", printed
    before the thread ended, and the thread's error went to the default hook, not the script's own."""
    script = """
        import threading, time, torch

        def hook(args):
            print("the script's thread hook:", args.exc_type.__name__, flush=True)

        threading.excepthook = hook
        cell = torch.nn.GRUCell(2, 3)
        optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)

        def train():
            time.sleep(0.3)  # still running when the script's body returns
            h = torch.zeros(1, 3)
            for step in range(3):
                optimizer.zero_grad()
                h = cell(torch.randn(1, 2), h)
                h.pow(2).mean().backward()
                optimizer.step()

        threading.Thread(target=train).start()
        print("body done", flush=True)
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    told = ["body done", "the script's thread hook: RuntimeError"]
    assert python.stdout.splitlines() == told and watched.stdout.splitlines()[:2] == told, watched.stdout
    assert "1. `h` carries iteration 1's graph into iteration 2" in watched.stdout, watched.stdout


def test_the_scripts_own_excepthook_prints_its_error_and_the_diagnosis_follows(tmp_path: Path) -> None:
    """It was python's plain traceback, where the script had installed a hook of its own (rich's, say)."""
    script = """
        import sys, torch

        sys.excepthook = lambda kind, error, tb: print("the script's hook:", kind.__name__, file=sys.stderr)
        cell = torch.nn.GRUCell(2, 3)
        h = torch.zeros(1, 3)
        for step in range(3):
            h = cell(torch.randn(1, 2), h)
            h.pow(2).mean().backward()
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1
    assert python.stderr == "the script's hook: RuntimeError\n", python.stderr
    assert watched.stderr.startswith("the script's hook: RuntimeError\nbackward-twice: 1 thing to fix"), watched.stderr
    assert "Traceback" not in watched.stderr


def test_a_forked_child_ending_reports_nothing_of_its_own(tmp_path: Path) -> None:
    """The parent reports the run; the child, ending through the command's code, printed a second diagnosis."""
    script = LOOP + "import os, sys\nif os.fork() == 0:\n    print('child done', flush=True)\n    sys.exit(0)\n"
    script += "os.wait()\nprint('parent done', flush=True)\n"
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout.splitlines() == ["child done", "parent done"]
    assert watched.stdout.splitlines()[:2] == ["child done", "parent done"]
    assert watched.stdout.count("backward-twice:") == 1, watched.stdout


def test_the_scripts_arguments_reach_it_as_given_a_leading_double_dash_included(tmp_path: Path) -> None:
    """``watch train.py -- --lr 1``: python gives the script ``['--', '--lr', '1']``; the command dropped the
    ``--``, and an argparse script that refuses it (status 2) trained instead."""
    (tmp_path / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    given = ["--", "--lr", "1", "--verbose"]
    python = subprocess.run([sys.executable, "train.py", *given], cwd=tmp_path, capture_output=True, text=True)
    watched = subprocess.run(
        [str(COMMAND), "watch", "--iterations", "2", "train.py", *given], cwd=tmp_path, capture_output=True, text=True
    )
    assert python.stdout.splitlines()[0] == watched.stdout.splitlines()[0] == str(given), watched.stdout


def test_a_trace_function_the_script_sets_stays_its_own_and_its_line_is_not_where_the_state_was_built(
    tmp_path: Path,
) -> None:
    """A script that turns a tracer of its own on (coverage's ``start()``, a profiler) replaces the watch's line
    tracer: the carried state was "built here" at the line that set it. The truth: it is built at the loop's line
    (which the script's tracer sees run), and the script's tracer is still its own at its end."""
    script = """
        import sys, torch

        seen = set()

        def tracer(frame, event, arg):
            seen.add(frame.f_lineno)
            return tracer

        sys.settrace(tracer); sys._getframe().f_trace = tracer
        cell = torch.nn.GRUCell(2, 3)
        h = torch.zeros(1, 3)
        try:
            for step in range(3):
                h = cell(torch.randn(1, 2), h)
                h.pow(2).mean().backward()
        finally:
            print("still the script's:", sys.gettrace() is tracer, "saw line 15:", 15 in seen)
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1
    told = "still the script's: True saw line 15: True"
    assert python.stdout.strip() == told and watched.stdout.startswith(told), watched.stdout
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "train.py:15 | h = cell(torch.randn(1, 2), h)" in diagnosis and "settrace" not in diagnosis, diagnosis


def test_in_a_process_of_its_own_the_command_waits_for_the_scripts_threads_only(tmp_path: Path) -> None:
    """``cli.main([...])`` in a kernel or a test runner, whose own threads outlive any script: waiting for every
    thread hung the run until a test timeout. The script's threads are its own; the process's others are not."""
    import threading
    import time

    from backward_twice import cli

    released = threading.Event()
    kernels = threading.Thread(target=released.wait, args=(60,))  # a thread of the process's, not the script's
    kernels.start()
    (tmp_path / "train.py").write_text(LOOP)
    started = time.monotonic()
    try:
        assert cli.main(["watch", str(tmp_path / "train.py")]) == 0
        took = time.monotonic() - started
    finally:
        released.set()
        kernels.join()
    assert took < 30, took
