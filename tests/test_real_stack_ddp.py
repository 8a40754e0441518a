"""Notebook 06's two-rank DDP runner: what the ranks report, the time limit, and no process left behind
when the cell is interrupted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from helpers.lessons.real_stack import run_ddp
from helpers.lessons.real_stack.ddp import _source

ROOT = Path(__file__).resolve().parent.parent


class TwoHeads(torch.nn.Module):  # the notebook's
    def __init__(self):
        super().__init__()
        self.trunk, self.head_1, self.head_2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1), torch.nn.Linear(16, 1)

    def forward(self, x):
        features = torch.tanh(self.trunk(x))
        return self.head_1(features).pow(2).mean(), (self.head_2(features) - 1).pow(2).mean()


def two_backwards(model, optimizer, batch):
    optimizer.zero_grad()
    loss_1, loss_2 = model(batch)
    loss_1.backward(retain_graph=True)
    loss_2.backward()
    optimizer.step()


def one_backward(model, optimizer, batch):
    optimizer.zero_grad()
    loss_1, loss_2 = model(batch)
    (loss_1 + loss_2).backward()
    optimizer.step()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_two_backwards_raise_ready_only_once_and_one_backward_is_the_single_process_gradient() -> None:
    torch.manual_seed(0)
    batch = torch.randn(8, 8)
    runs = run_ddp(TwoHeads, batch, [("two", two_backwards, {}), ("one", one_backward, {})], iterations=2)
    assert runs["two"].raised_at == 0 and "Expected to mark a variable ready only once" in runs["two"].message
    with pytest.raises(RuntimeError, match="ready only once"):
        runs["two"].raise_error()
    assert runs["one"].raised_at is None and runs["one"].ranks_agree
    torch.manual_seed(0)
    reference = TwoHeads()
    sum(reference(batch)).backward()
    for name, p in reference.named_parameters():
        assert torch.allclose(runs["one"].gradients[name], p.grad, rtol=1e-4, atol=1e-7), name
    runs["one"].raise_error()  # a setting that ran raises nothing
    assert "iteration 0: RuntimeError: Expected to mark a variable ready only once." in repr(runs)


def test_both_flags_average_the_wrong_gradients_and_fail_one_iteration_later() -> None:
    """The READMEs' DDP row and the diagnosis's fix say "and": after iteration 0 the ranks already disagree, and
    iteration 1 raises (with zero_grad()'s default, set_to_none)."""
    from backward_twice.judge.verdicts import ERROR_FIXES

    torch.manual_seed(0)
    batch = torch.randn(8, 8)
    flags = [(name, two_backwards, {name: True}) for name in ("static_graph", "find_unused_parameters")]
    runs = run_ddp(TwoHeads, batch, flags, iterations=2)
    for name, _, _ in flags:
        assert runs[name].raised_at == 1 and not runs[name].ranks_agree, (name, runs[name].message)
    said = "they average the wrong gradients and fail one iteration later"
    assert said in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "它们平均出错误的梯度，并且晚一次迭代报错" in (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert "they average the wrong gradients and fail one iteration later" in ERROR_FIXES["DDP ready only once"]


class SharedOutput(torch.nn.Module):  # both losses from one output layer: the first reaches every parameter
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def forward(self, x):
        out = self.layers(x)
        return out[:, 0].pow(2).mean(), out[:, 1].abs().mean()


def test_a_setting_may_name_its_own_model_and_one_start_runs_both() -> None:
    torch.manual_seed(0)
    batch = torch.randn(8, 8)
    runs = run_ddp(
        TwoHeads, batch, [("two heads", two_backwards, {}), ("one head", two_backwards, {}, SharedOutput)], iterations=2
    )
    assert runs["two heads"].raised_at == 0  # a bucket still waits for head_2: refused
    assert runs["one head"].raised_at is None and not runs["one head"].ranks_agree  # silent, and the ranks drift
    assert set(runs["one head"].gradients) == {f"layers.{i}.{kind}" for i in (0, 2) for kind in ("weight", "bias")}


def test_bad_input_gets_a_clear_message() -> None:
    with pytest.raises(TypeError, match="the model's class"):
        run_ddp(TwoHeads(), torch.zeros(8, 8), [("one", one_backward, {})])
    with pytest.raises(ValueError, match=r"two equal halves|2 equal halves"):
        run_ddp(TwoHeads, torch.zeros(7, 8), [("one", one_backward, {})])
    with pytest.raises(ValueError, match="different label"):
        run_ddp(TwoHeads, torch.zeros(8, 8), [("one", one_backward, {}), ("one", two_backwards, {})])
    with pytest.raises(TypeError, match="the model's class"):
        run_ddp(TwoHeads, torch.zeros(8, 8), [("one", one_backward, {}, SharedOutput())])


def test_the_source_of_a_class_defined_in_a_cell_is_found(tmp_path: Path) -> None:
    """IPython keeps cells in linecache under a fake file name; inspect.getsource cannot find classes there."""
    import linecache

    cell = "class Cell(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    filename = "<ipython-input-cell-1>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(cell, filename, "exec"), namespace)
    assert _source(namespace["Cell"]).startswith("class Cell(torch.nn.Module):")


def test_the_source_of_a_subclass_that_only_sets_attributes_is_found() -> None:
    """Such a class has no method of its own to say which cell it is in (06's CheckpointedNonReentrant)."""
    import linecache

    cell = (
        "class Base(torch.nn.Module):\n    reentrant = True\n\n    def forward(self, x):\n        return x\n\n\n"
        "class Child(Base):\n    reentrant = False\n"
    )
    filename = "<ipython-input-cell-2>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(cell, filename, "exec"), namespace)
    assert _source(namespace["Child"]) == "class Child(Base):\n    reentrant = False"


DRIVER = textwrap.dedent("""
    import sys, time, torch
    import helpers.lessons.real_stack.ddp as ddp

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

    def stuck(model, optimizer, batch):
        import time
        time.sleep(120)

    started = ddp._start_rank
    def announce(*args, **kwargs):
        process = started(*args, **kwargs)
        print("RANK", process.pid, flush=True)
        return process
    ddp._start_rank = announce
    try:
        ddp.run_ddp(Tiny, torch.zeros(2, 2), [("stuck", stuck, {})], timeout=float(sys.argv[1]))
    except TimeoutError as error:
        print("TIMEOUT", error, flush=True)
""")


@contextlib.contextmanager
def driver_and_ranks(tmp_path: Path, timeout: float) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """A process calling run_ddp with a step that never ends, and the ranks it started; whatever the test
    leaves running is killed afterwards."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER, encoding="utf-8")
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # a killed driver runs no clean-up: its folder goes with the test's
    driver = subprocess.Popen(
        [sys.executable, str(script), str(timeout)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    pids: list[int] = []
    try:
        while len(pids) < 2:
            line = driver.stdout.readline()
            assert line, "the driver ended before starting two ranks"
            if line.startswith("RANK"):
                pids.append(int(line.split()[1]))
        yield driver, pids
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()
        driver.wait()


def wait_until_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def test_interrupting_the_cell_leaves_no_rank_running(tmp_path: Path) -> None:
    with driver_and_ranks(tmp_path, timeout=300) as (driver, pids):
        time.sleep(3)  # the ranks are importing torch or already waiting in the step
        assert all(alive(pid) for pid in pids)
        driver.send_signal(signal.SIGINT)  # what Jupyter's interrupt sends to the kernel
        driver.wait(timeout=30)
        assert driver.returncode != 0  # the KeyboardInterrupt went on up, after the clean-up
        assert wait_until_gone(pids, 10), "a DDP rank outlived the interrupted call"


def test_the_time_limit_stops_both_ranks(tmp_path: Path) -> None:
    with driver_and_ranks(tmp_path, timeout=8) as (driver, pids):
        out, _ = driver.communicate(timeout=60)
        assert "TIMEOUT The two DDP ranks did not finish within 8 s; both were stopped." in out
        assert not any(alive(pid) for pid in pids)


def test_a_rank_ends_itself_when_the_kernel_dies(tmp_path: Path) -> None:
    """A killed kernel runs no clean-up; the ranks notice that their parent is gone, and remove its folder (each run
    left a bt-ddp- folder in the temporary directory)."""
    with driver_and_ranks(tmp_path, timeout=300) as (driver, pids):
        time.sleep(1)
        assert list(tmp_path.glob("bt-ddp-*")), "the runner's folder is where the test looks for it"
        driver.kill()
        driver.wait(timeout=10)
        assert wait_until_gone(pids, 15), "a DDP rank outlived the process that started it"
        assert not list(tmp_path.glob("bt-ddp-*")), "the runner's folder outlived it"
