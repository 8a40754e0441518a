"""``bt.watch()`` in an IPython cell under ``%%time``: IPython compiles the cell as ``<timed exec>`` and keeps no
source for it; the watch reads the cell's lines while it runs, stops ``iterations=N`` at the top of pass N+1 as in
any cell, names the cell's lines as IPython's traceback does, and leaves ``linecache`` as it found it."""

from __future__ import annotations

import linecache

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
import backward_twice as bt
torch.manual_seed(0)
lin = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
xs = torch.randn(6, 3, 4)
trace = []
"""

LOOP = """for i in range(6):
    trace.append(f"top {i}")
    opt.zero_grad()
    loss = lin(xs[i]).pow(2).mean()
    loss.backward()
    opt.step()
    trace.append(f"stepped {i}")"""


@pytest.fixture()
def shell():
    shell = InteractiveShell.instance()
    shell.run_cell(SETUP)
    yield shell
    InteractiveShell.clear_instance()


def test_iterations_under_time_stop_at_the_top_of_the_next_pass(shell) -> None:
    """It stopped inside pass 3 (h72c): its ``zero_grad()`` and forward ran, ``.grad`` was None, and ``w`` still
    said "healthy (2 iterations watched, then stopped as asked"; without ``%%time`` the same cell stops right."""
    watched = "%%time\nwith bt.watch(iterations=2) as w:\n" + "\n".join(f"    {line}" for line in LOOP.split("\n"))
    result = shell.run_cell(watched)
    assert result.error_in_exec is None, result.error_in_exec
    watched_state = (list(shell.user_ns["trace"]), shell.user_ns["i"], shell.user_ns["lin"].weight.detach().clone())
    assert shell.user_ns["lin"].weight.grad is not None
    assert str(shell.user_ns["w"]).startswith("backward-twice: healthy (2 iterations watched, then stopped as asked")
    shell.run_cell(SETUP)
    shell.run_cell(LOOP.replace("range(6)", "range(2)"))
    assert (
        watched_state[:2]
        == (shell.user_ns["trace"], shell.user_ns["i"])
        == (
            ["top 0", "stepped 0", "top 1", "stepped 1"],
            1,
        )
    )
    assert torch.equal(watched_state[2], shell.user_ns["lin"].weight)
    assert "<timed exec>" not in linecache.cache


def test_a_carried_state_under_time_is_named_at_the_cells_lines(shell) -> None:
    """The note named ``h = torch.zeros(3, 8)`` of another cell ("built here", a tensor with no graph) and IPython's
    own ``run_cell_magic`` call as the line that raised."""
    shell.run_cell("h = torch.zeros(3, 4)\nrnn = torch.nn.RNNCell(4, 4)")
    body = "for i in range(5):\n    h = rnn(xs[i], h)\n    loss = h.pow(2).mean()\n    loss.backward()"
    result = shell.run_cell("%%time\nwith bt.watch() as w:\n" + "\n".join(f"    {line}" for line in body.split("\n")))
    error = result.error_in_exec
    assert isinstance(error, RuntimeError) and "backward through the graph a second time" in str(error)
    note = "\n".join(getattr(error, "__notes__", []))
    assert "1. `h` carries iteration 1's graph into iteration 2\n" in note, note
    assert "<timed exec>:3 | h = rnn(xs[i], h)\n" in note and "<timed exec>:5 | loss.backward()\n" in note, note
    assert "run_cell_magic" not in note and "torch.zeros" not in note, note
    assert "fix: add `h = h.detach()` before line 3" in note, note
    assert "<timed exec>" not in linecache.cache
