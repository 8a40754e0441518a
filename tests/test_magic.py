"""backward_twice/magic.py: %%diagnose runs a pasted loop body as the step, in the notebook's namespace, names its
lines as the cell's own, puts everything back, and refuses bad input with a clear message."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from backward_twice.steps.diagnose import Diagnosis

SETUP = """
import torch
cell = torch.nn.RNNCell(3, 4)
optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
h = torch.zeros(2, 4)
x = torch.ones(2, 3)
"""

BODY = """optimizer.zero_grad()
h = cell(x, h)
h.pow(2).sum().backward()
optimizer.step()"""


@pytest.fixture()
def shell():
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext backward_twice", store_history=True)
    shell.run_cell(SETUP, store_history=True)
    yield shell
    shell.run_cell("%unload_ext backward_twice")
    InteractiveShell.clear_instance()


def run(shell, text: str):
    return shell.run_cell(text, store_history=True)


def test_a_carried_hidden_state_is_found_at_the_cells_own_line_and_put_back(shell) -> None:
    weights = shell.user_ns["cell"].weight_hh.detach().clone()
    h_before = shell.user_ns["h"]
    result = run(shell, f"%%diagnose cell optimizer\n{BODY}")
    number = result.execution_count
    diagnosis = result.result
    assert isinstance(diagnosis, Diagnosis), result.error_in_exec
    assert diagnosis.carried.found and f"Cell In[{number}], line 3 | h = cell(x, h)" in repr(diagnosis)
    assert repr(diagnosis).startswith("backward-twice: 1 thing to fix (2 runs of the cell;")
    assert shell.user_ns["h"] is h_before and torch.equal(shell.user_ns["cell"].weight_hh, weights)


def test_a_step_that_detaches_is_healthy(shell) -> None:
    body = BODY.replace("h = cell(x, h)", "h = cell(x, h.detach())")
    diagnosis = run(shell, f"%%diagnose cell optimizer\n{body}").result
    assert diagnosis.healthy, repr(diagnosis)


@pytest.mark.parametrize(
    ("line", "body", "message"),
    [
        ("cell optimiser", BODY, "no variable named 'optimiser'"),
        ("cell x", BODY, "x is a Tensor"),
        ("cell optimizer", "   \n", "the cell is empty"),
        ("cell optimizer", "h = = 1", "the cell is not Python"),
    ],
)
def test_bad_input_is_a_usage_error_with_a_clear_message(shell, capsys, line, body, message) -> None:
    result = run(shell, f"%%diagnose {line}\n{body}")
    assert result.result is None
    assert message in capsys.readouterr().err


def test_a_state_set_to_none_in_an_earlier_cell_is_detached_at_the_end_of_each_iteration(shell) -> None:
    """MorvanZhou's RNN regressor in a notebook: ``h_state = None`` in one cell, the watched loop in the next. The
    fix was "add ``h_state = h_state.detach()`` before line 4" (where it comes in), which raises AttributeError on
    None in the first pass: only the loop's own cell was read for a constant start. The truth: the printed fix, put
    at the end of the loop's body, runs."""
    run(shell, "import backward_twice as bt\nrnn = torch.nn.RNN(1, 4)\nh_state = None")
    loop = """with bt.watch() as w:
    for step in range(3):
        x = torch.randn(1, 5, 1)
        out, h_state = rnn(x, h_state)
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        {fix}
"""
    run(shell, "optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)")
    result = run(shell, loop.replace("{fix}", ""))
    assert isinstance(result.error_in_exec, RuntimeError) and "second time" in str(result.error_in_exec)
    text = str(shell.user_ns["w"])
    assert "fix: add `h_state = h_state.detach()` at the end of each iteration" in text, text
    run(shell, "h_state = None")
    result = run(shell, loop.replace("{fix}", "h_state = h_state.detach()"))
    assert result.error_in_exec is None, result.error_in_exec
    assert str(shell.user_ns["w"]).startswith("backward-twice: healthy (3 iterations watched"), str(shell.user_ns["w"])


def test_a_state_a_model_of_another_cell_reads_comes_in_at_the_diagnosed_cells_line(shell) -> None:
    """The model's ``forward``, defined in an earlier cell, reads ``h`` too: the diagnosis named that cell's line 10
    and its fix went there ("before line 10"), with the retain's notes for ``out`` and ``loss`` as "(out,
    _diagnosed_step)" and no code. The cell's own line 3 is where iteration 1's graph comes in; ``out`` and ``loss``,
    rebound each run, only grow through ``h``: one item."""
    run(
        shell,
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.cell, self.head = torch.nn.RNNCell(3, 4), torch.nn.Linear(4, 1)\n"
        "    def forward(self, x, h):\n"
        "        h = self.cell(x, h)\n"
        "        return self.head(h), h\n"
        "model = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    )
    body = "optimizer.zero_grad()\nout, h = model(x, h)\nloss = out.pow(2).mean()\n"
    result = run(shell, f"%%diagnose model optimizer\n{body}loss.backward(retain_graph=True)\noptimizer.step()")
    shown = repr(result.result)
    assert shown.startswith("backward-twice: 1 thing to fix (3 runs of the cell; run 3 raised)"), shown
    assert f"Cell In[{result.execution_count}], line 3 | out, h = model(x, h)" in shown, shown
    assert "fix: add `h = h.detach()` before line 3, and remove retain_graph=True at line 5" in shown, shown


def test_names_the_cell_binds_that_the_notebook_did_not_have_are_not_left_behind(shell) -> None:
    """``loss`` and ``xb``, bound by the pasted body and new to the notebook, were left holding the third run's
    values (a ``loss`` with its graph); a name the notebook had (``h``) is put back. The truth: the notebook's
    names before the cell."""
    body = "xb = x * 2\noptimizer.zero_grad()\nh = cell(xb, h.detach())\nloss = h.pow(2).sum()\nloss.backward()\n"
    before = set(shell.user_ns)
    h_before = shell.user_ns["h"]
    assert isinstance(run(shell, f"%%diagnose cell optimizer\n{body}optimizer.step()").result, Diagnosis)
    assert not {"xb", "loss"} & set(shell.user_ns)
    assert all(name.startswith("_") for name in set(shell.user_ns) - before)  # IPython's own: _, _i3, _3
    assert shell.user_ns["h"] is h_before


def test_tensors_an_earlier_cell_built_in_one_line_are_one_item_built_at_that_cells_line(shell) -> None:
    """A PPO update pasted under ``%%diagnose``, its rollout buffers built with a graph in the cell before: three
    items, each "built" at the diagnosed cell's first line, the second and third saying the backward "walks it
    again" where it raised. ``bt.diagnose`` on the same step gave one item. The truth: the buffers come from one
    line; detached there, the update runs twice."""
    run(shell, "policy = torch.nn.Linear(3, 2)\nadam = torch.optim.Adam(policy.parameters())\nobs = torch.randn(4, 3)")
    rollout = run(shell, "logp_buf, ret_buf = policy(obs).unbind(1)")
    body = "out = policy(obs)\nratio = out[:, 0] - logp_buf\nvalue = out[:, 1] - ret_buf\nloss = (ratio * value).mean()"
    body += "\n"
    diagnosis = run(shell, f"%%diagnose policy adam\nadam.zero_grad()\n{body}loss.backward()\nadam.step()").result
    assert isinstance(diagnosis, Diagnosis)
    [item] = diagnosis.items
    assert item.label.endswith("carry the graph built before the loop into iteration 2"), repr(diagnosis)
    assert {"`logp_buf`", "`ret_buf`"} <= set(item.label.split()), repr(diagnosis)
    assert "walks it again" not in repr(diagnosis)
    evidence = diagnosis.evidence()
    assert f"built before the loop at Cell In[{rollout.execution_count}], line 1" in evidence, evidence
