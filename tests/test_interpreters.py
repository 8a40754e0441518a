"""The line tracer on every Python the README promises (3.10 on), where the interpreter's tracing differs.

``backward_twice/record/lines.py`` and ``backward_twice/record/loops.py`` (the passes of the learner's loops, and the
stop at the top of pass N+1), and ``backward_twice/record/stops.py`` (without a loop of the learner's, the stop at a
profile function's call event), depend on how an interpreter reports line and call events: which lines a ``for``
and a ``while`` header report at each pass, and where an exception a trace function raises can be caught (from 3.11
on, one raised at a ``try:`` line escapes its frame's handlers: the tracer then stops at the loop's header; a loop
on one line sends no line event in its body, and its passes come from opcode events). They need no torch, so each
interpreter installed here (pyenv's, or ``pythonX.Y`` on the PATH) runs them on one script with no package but
the standard library: the passes seen and where each stop lands must be the same on every one. An interpreter
that is not installed is skipped, and this file's own interpreter always runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, sys, types
sys.path.insert(0, ROOT)
for name in ("backward_twice", "backward_twice.record"):  # the tracer's modules alone: the __init__s import torch
    package = types.ModuleType(name)
    package.__path__ = [ROOT + "/" + name.replace(".", "/")]
    sys.modules[name] = package
from backward_twice.record.lines import LineTracer
from backward_twice.record.stops import StepCallStop

SCRIPT = __file__
passes = []
counter = iter(range(10**9))


class Stop(BaseException):
    pass


def on_pass(frame, loop, sequence):
    passes.append([frame.f_code.co_name, loop.kind, loop.header - FIRST])
    if frame.f_code.co_name == STOP_IN and sum(p[0] == STOP_IN for p in passes) == 3:
        return Stop()
    return None


def at_header(frame, loop, sequence):
    if frame.f_code.co_name == STOP_IN and sum(p[0] == STOP_IN for p in passes) >= 2:
        return Stop()
    return None


def tracer():
    return LineTracer(lambda: next(counter), lambda code: code.co_filename == SCRIPT, on_pass, None, at_header)


FIRST = sys._getframe().f_lineno


def for_loop(ran):
    for i in range(4):
        ran.append(i)


def while_loop(ran):
    i = 0
    while i < 4:
        ran.append(i)
        i += 1


def try_body(ran):
    for i in range(4):
        try:
            ran.append(i)
        except Exception:
            ran.append("caught")


def bare_except(ran):
    for i in range(4):
        try:
            ran.append(i)
        except:  # the learner's own bare except: the stop must not land in it
            ran.append("swallowed")


def nested(ran):
    for epoch in range(2):
        for i in range(2):
            ran.append((epoch, i))


def one_line(ran):
    for i, twice in [(i, [2 * i for _ in range(2)]) for i in range(4)]: ran.append(i); ran.append(twice[0])


results = {}
for function in (for_loop, while_loop, try_body, bare_except, nested, one_line):
    for STOP_IN in ("", function.__name__):
        passes.clear()
        ran = []
        line_tracer = tracer()
        line_tracer.start(sys._getframe())
        stopped = False
        try:
            function(ran)
        except Stop:
            stopped = True
        finally:
            line_tracer.stop()
        results[f"{function.__name__} stop={bool(STOP_IN)}"] = [passes[:], ran, stopped]


def step(ran, i, call_stop):  # a learner's step function, which a framework's loop calls
    call_stop.saw_backward(sys._getframe())
    ran.append(i)


def framework(ran, call_stop):
    for i in range(4):
        step(ran, i, call_stop)
        if i == 1:  # iteration 2 ended: the next call of the step stops before its first line
            call_stop.arm(Stop)


ran, call_stop = [], StepCallStop()
try:
    framework(ran, call_stop)
except Stop:
    ran.append("stopped")
results["step call stop"] = [ran, sys.getprofile() is None]
print(json.dumps(results))
"""


def _interpreters() -> dict[str, str]:
    """Each Python 3.10+ installed here: version -> its executable (this file's own among them)."""
    found = {f"{sys.version_info.major}.{sys.version_info.minor}": sys.executable}
    pyenv = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
    for minor in range(10, 15):
        version = f"3.{minor}"
        if version in found:
            continue
        candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}")) if pyenv.is_dir() else []
        path = str(candidates[-1]) if candidates else shutil.which(f"python{version}")
        if path:
            found[version] = path
    return dict(sorted(found.items(), key=lambda item: int(item[0].split(".")[1])))


def _run(python: str, tmp_path: Path) -> dict[str, list]:
    script = tmp_path / "probe.py"
    script.write_text(f"ROOT = {str(ROOT)!r}\n" + PROBE, encoding="utf-8")
    done = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    results: dict[str, list] = json.loads(done.stdout)
    return results


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    return _run(sys.executable, tmp_path_factory.mktemp("probe"))


def test_the_passes_and_the_stops_are_the_ones_the_loops_run(expected: dict[str, list]) -> None:
    """On this interpreter: one pass per iteration, a stop before the third pass's first statement, and at the
    header (not inside the handler) where the body starts with ``try:``."""
    passes, ran, stopped = expected["for_loop stop=False"]
    assert [p[1] for p in passes] == ["for"] * 4 and ran == [0, 1, 2, 3] and not stopped
    assert expected["for_loop stop=True"][1:] == [[0, 1], True]  # two whole passes, then the stop
    assert expected["while_loop stop=True"][1:] == [[0, 1], True]
    assert expected["try_body stop=True"][1:] == [[0, 1], True]  # no "caught": the stop was outside the try
    assert expected["bare_except stop=True"][1:] == [[0, 1], True]  # no "swallowed"
    # a loop on one line (no line event in its body): a pass at each item, the stop after two whole passes
    one_line_passes, one_line_ran, _ = expected["one_line stop=False"]
    assert len(one_line_passes) == 4 and one_line_ran == [0, 0, 1, 2, 2, 4, 3, 6]
    assert expected["one_line stop=True"][1:] == [[0, 0, 1, 2], True]
    # without a loop of the learner's: the stop at the third call of the step function, before its first line
    assert expected["step call stop"] == [[0, 1, "stopped"], True]
    nested_passes = [p[2] for p in expected["nested stop=False"][0]]
    assert len(nested_passes) == 6 and len(set(nested_passes)) == 2  # 2 outer passes, 4 inner ones


@pytest.mark.parametrize("version", list(_interpreters()))
def test_every_interpreter_sees_the_same_passes_and_stops(
    version: str, expected: dict[str, list], tmp_path: Path
) -> None:
    assert _run(_interpreters()[version], tmp_path) == expected
