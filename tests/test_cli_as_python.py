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


def test_a_progress_line_printed_without_its_end_is_not_glued_to_the_diagnosis(tmp_path: Path) -> None:
    """``print(f"\\rstep {i} ...", end="")``, the progress line of many scripts (or written to stderr, as tqdm does,
    which a terminal shows with stdout): the report began on that line ("...loss 0.1984backward-twice: healthy"). It
    begins on its own line; what the script printed is as python's; a
    script whose last line ended gets no blank line; a write to a closed stdout fails as python's, no frame of the
    tool's in its traceback."""
    progress = LOOP + "    print(f'\\rstep {weight.sum().item():.3f}', end='', flush=True)\n"
    python, watched = run(tmp_path, progress)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout.count("step") == 3 and not python.stdout.endswith("\n"), python.stdout  # text: \r as \n
    assert watched.stdout.startswith(python.stdout + "\n" + HEALTHY), watched.stdout
    python, watched = run(tmp_path, LOOP + "print('trained')\n")
    assert watched.stdout.startswith("trained\n" + HEALTHY), watched.stdout
    on_stderr = LOOP + "    sys.stderr.write(f'\\rstep {weight.sum().item():.3f}')\n"  # tqdm's way: one terminal
    python, watched = run(tmp_path, "import sys\n" + on_stderr)
    assert python.stderr.count("step") == 3 and watched.stderr == python.stderr, watched.stderr
    assert watched.stdout.startswith("\n" + HEALTHY), watched.stdout
    closed = LOOP + "import sys\nsys.stdout.close()\nprint('after')\n"
    python, watched = run(tmp_path, closed)
    assert python.returncode == watched.returncode == 1 and "I/O operation on closed file" in python.stderr
    assert watched.stderr.replace("/watched/", "/python/").startswith(python.stderr), watched.stderr


def test_anomaly_modes_traceback_of_the_forward_starts_at_the_script_as_under_python(tmp_path: Path) -> None:
    """``torch.autograd.set_detect_anomaly(True)`` prints, at the error, the stack of the forward call that built the
    failing node: under the command it began with five of the command's own frames (``backward-twice``,
    ``cli.py``...) above the script's line. It is python's, frame for frame; the diagnosis follows."""
    script = """
        import torch
        torch.autograd.set_detect_anomaly(True)
        model = torch.nn.Linear(3, 2)
        h = torch.zeros(4, 2)
        for x in torch.randn(3, 4, 3):
            h = model(x) + h
            h.pow(2).mean().backward()
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1, watched.stderr
    said = watched.stderr.replace("/watched/", "/python/")
    assert "Traceback of forward call that caused the error:" in python.stderr
    assert said.startswith(python.stderr), said
    assert "backward_twice" not in said[: said.index("backward-twice:")], said


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


def test_a_script_that_asks_whether_a_debugger_runs_is_told_what_python_tells_it(tmp_path: Path) -> None:
    """``debugging = sys.gettrace() is not None`` (a common idiom: one epoch while debugging, logging off) saw the
    watch's own line tracer: the script trained one epoch instead of two and saved other weights. Under the command,
    ``bt.watch()`` and ``iterations=N`` alike, the script sees what python shows it: no trace or profile function,
    at the loop's first passes too, where the watch's tracer runs."""
    script = """
        import sys, threading, torch
        import backward_twice as bt

        def asked():
            return (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile())

        torch.manual_seed(0)
        weight = torch.zeros(3, requires_grad=True)
        seen = [asked()]
        for epoch in range(2 if sys.gettrace() is None else 1):
            for x in torch.randn(3, 3):
                seen.append(asked())
                (weight @ x).pow(2).backward()
                weight.data -= 0.1 * weight.grad
                weight.grad = None
        with bt.watch(iterations=2):
            for x in torch.randn(3, 3):
                seen.append(asked())
                (weight @ x).pow(2).backward()
                seen.append(asked())
        print("seen:", set(seen), "trained:", [round(v, 6) for v in weight.tolist()])
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    told = python.stdout.strip()
    assert told.startswith("seen: {(None, None, None, None)} trained: ["), told
    assert watched.stdout.startswith(told + "\n"), watched.stdout


def test_a_trace_function_the_script_sets_is_what_it_reads_back_while_watched() -> None:
    """The other side of hiding the watch's hooks: a function the learner's code set is given back as it is, and
    the getters are python's own again once the watch ends."""
    import threading

    import torch

    from backward_twice import watch

    def theirs(frame: object, event: str, arg: object) -> None:
        return None

    getters = (sys.gettrace, sys.getprofile, threading.gettrace, threading.getprofile)
    weight = torch.zeros(2, requires_grad=True)
    with watch():
        for x in torch.randn(3, 2):
            assert sys.gettrace() is None
            sys.setprofile(theirs)
            assert sys.getprofile() is theirs
            sys.setprofile(None)
            (weight @ x).pow(2).backward()
    assert (sys.gettrace, sys.getprofile, threading.gettrace, threading.getprofile) == getters


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


def test_a_class_of_the_script_pickles_at_exit_and_in_a_thread_left_running(tmp_path: Path) -> None:
    """``torch.save`` of a model whose class the script defines, from an ``atexit`` function and from a thread the
    script does not join: under the command ``__main__`` was the command's again by then (PicklingError: attribute
    lookup on __main__ failed), and the thread left a truncated checkpoint."""
    script = (
        LOOP
        + """
import atexit, pickle, threading, time

class Config:
    lr = 0.1

def save(where):
    time.sleep(0.2)
    print(where, len(pickle.dumps(Config())), flush=True)

atexit.register(save, "at exit")
threading.Thread(target=save, args=("in a thread",)).start()
"""
    )
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0 and watched.stderr == "", watched.stderr
    for said in ("in a thread 37", "at exit 37"):
        assert said in python.stdout and said in watched.stdout, watched.stdout


def test_a_script_sees_the_globals_python_gives_it_and_a_symlinks_real_folder_first_on_its_path(
    tmp_path: Path,
) -> None:
    """``__annotations__`` was missing (NameError), ``__loader__`` None; a script reached through a symlink had the
    link's folder first on ``sys.path``, not its real folder, so it could not import the module beside it."""
    real, links = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    (real / "beside.py").write_text("WHAT = 'beside'\n")
    (real / "train.py").write_text(
        LOOP + "import beside\nprint(beside.WHAT, __annotations__, type(__loader__).__name__, __package__, __spec__)\n"
    )
    (links / "train.py").symlink_to(real / "train.py")
    said = "beside {} SourceFileLoader None None\n"
    for command in ([sys.executable], [str(COMMAND), "watch"]):
        done = subprocess.run([*command, "train.py"], cwd=links, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.startswith(said), done.stderr


def test_an_error_a_finally_raises_as_iterations_stops_the_loop_is_shown_without_the_stop(tmp_path: Path) -> None:
    """``--iterations 2`` on a loop in ``try:`` whose ``finally:`` raises: the traceback showed the recorder's
    StopRecording ("During handling of the above exception") and a frame of the tool, and the report "3 iterations
    watched" for 2."""
    script = """
import torch

model = torch.nn.Linear(2, 1)
try:
    for i in range(4):
        model(torch.randn(3, 2)).sum().backward()
finally:
    raise RuntimeError("cleanup failed")
"""
    python, watched = run(tmp_path, script, "--iterations", "2")
    assert python.returncode == watched.returncode == 1
    assert "StopRecording" not in watched.stderr and "During handling" not in watched.stderr, watched.stderr
    assert watched.stderr.endswith("RuntimeError: cleanup failed\n") or "backward-twice: healthy (2 iterations" in (
        watched.stderr + watched.stdout
    ), watched.stderr
    assert "(2 iterations watched, then stopped as asked" in watched.stderr + watched.stdout


def test_a_timer_the_script_set_for_a_later_pass_does_not_kill_the_command_after_the_stop(tmp_path: Path) -> None:
    """A loop that runs until ``signal.setitimer``'s alarm: ``--iterations 2`` ends it first, the report is printed,
    and the alarm then fired as the process ended, with the signals' default actions back: "Alarm clock", status
    142. The truth: python runs it to the alarm and exits 0."""
    script = """
import signal, time
import torch

model = torch.nn.Linear(4, 1)
stop = False

def on_alarm(signum, frame):
    global stop
    stop = True

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.3)
while not stop:
    model(torch.randn(2, 4)).sum().backward()
    time.sleep(0.02)
"""
    python, watched = run(tmp_path, script, "--iterations", "2")
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith("backward-twice: healthy (2 iterations watched, then stopped as asked")


def test_a_module_of_a_package_runs_as_python_m_runs_it(tmp_path: Path) -> None:
    """``backward-twice watch -m pkg.train``: it was argparse's "unrecognized arguments: -m", so a package whose
    training module imports its siblings relatively had no way in. The truth: ``python -m`` runs it as ``__main__``
    of its package, ``sys.argv[0]`` its file; a name that finds nothing is status 1."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text("SCALE = 0.5\n")
    (package / "train.py").write_text(
        "import sys\nfrom .scale import SCALE\n"
        + LOOP.replace("(weight @ x)", "(SCALE * weight @ x)")
        + "print(__name__, __package__, sys.argv[0].endswith('train.py'), sys.argv[1:])\n"
    )
    python = subprocess.run(
        [sys.executable, "-m", "pkg.train", "--lr", "1"], cwd=tmp_path, capture_output=True, text=True
    )
    watched = subprocess.run(
        [str(COMMAND), "watch", "-m", "pkg.train", "--lr", "1"], cwd=tmp_path, capture_output=True, text=True
    )
    assert python.returncode == watched.returncode == 0 and watched.stderr == "", watched.stderr
    assert python.stdout == "__main__ pkg True ['--lr', '1']\n", python.stdout
    assert watched.stdout.startswith(python.stdout + HEALTHY), watched.stdout
    missing = subprocess.run([str(COMMAND), "watch", "-m", "pkg.nosuch"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr == "backward-twice watch: No module named pkg.nosuch\n"


def test_the_standard_librarys_frames_between_the_script_and_its_loop_stay_in_the_traceback(tmp_path: Path) -> None:
    """``asyncio.run(train())`` with the hidden state carried: the traceback lost asyncio's three frames
    (``runners.py``, ``base_events.py``) between the script's line and the loop's, which python prints. Only the
    command's and runpy's leading frames go."""
    script = """
        import asyncio
        import torch
        cell = torch.nn.RNNCell(3, 4)
        async def train():
            h = torch.zeros(2, 4)
            for x in torch.randn(3, 2, 3):
                await asyncio.sleep(0)
                h = cell(x, h)
                h.pow(2).mean().backward()
        asyncio.run(train())
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1, watched.stderr
    assert "asyncio/runners.py" in python.stderr and "base_events.py" in python.stderr, python.stderr
    said = watched.stderr.replace("/watched/", "/python/")
    assert said.startswith(python.stderr), said
    assert "1. `h` carries iteration 1's graph into iteration 2" in said[len(python.stderr) :], said
