"""backward_twice/magic.py: %%diagnose runs a pasted loop body as the step, in the notebook's namespace, names its
lines as the cell's own, puts everything back, and refuses bad input with a clear message."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from test_diagnose import HOOKED_NET

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
        ("cell.nothing optimizer", BODY, "cell has no attribute 'nothing' that holds a model or optimizer"),
        ("trainer.model.missing", BODY, "trainer.model has no attribute 'missing'"),
        ("trainer.busy", BODY, "trainer has no attribute 'busy'"),  # a property: never run
        ("trainer.steps", BODY, "trainer.steps is an int"),
        # a line magic runs its statement in a scope of its own: what it binds would not reach the next line
        ("cell optimizer", f"%time {BODY}", "cell line 2 is an IPython magic (%time "),
    ],
)
def test_bad_input_is_a_usage_error_with_a_clear_message(shell, capsys, line, body, message) -> None:
    run(shell, TRAINER)
    result = run(shell, f"%%diagnose {line}\n{body}")
    assert result.result is None
    assert message in capsys.readouterr().err
    assert shell.user_ns["trainer"].ran == 0  # no property, no step ran


# A trainer object that keeps its model and optimizer and trains over chunks of a sequence in its own method, with
# its hidden state on itself, never detached: the chunk loop's passes are the iterations.
TRAINER = """
class Trainer:
    def __init__(self):
        self.model = torch.nn.ModuleDict({"cell": torch.nn.GRUCell(3, 4), "out": torch.nn.Linear(4, 1)})
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.steps, self.ran = 0, 0

    @property
    def busy(self):
        self.ran += 1
        return self.model

    def train_sequence(self, xs, ys):
        self.h = torch.zeros(2, 4)
        for t in range(0, len(xs), 2):
            self.opt.zero_grad()
            loss = 0
            for s in range(t, t + 2):
                self.h = self.model["cell"](xs[s], self.h)
                loss = loss + ((self.model["out"](self.h) - ys[s]) ** 2).mean()
            loss.backward()
            self.opt.step()

torch.manual_seed(0)
trainer = Trainer()
xs, ys = torch.randn(6, 2, 3), torch.randn(6, 2, 1)
"""


@pytest.mark.parametrize("line", ["trainer", "trainer.model trainer.opt", "trainer.model.cell trainer.opt"])
def test_the_models_may_be_named_through_the_object_that_holds_them(shell, line) -> None:
    """``%%diagnose trainer`` was "trainer is a Trainer", ``%%diagnose trainer.model`` "no variable named
    'trainer.model'": an object that holds the models, and a dotted name, are what a learner with a trainer class
    types. The method's chunk loop holds every backward and step: its passes are the iterations, as a watch finds."""
    run(shell, TRAINER)
    before = shell.user_ns["trainer"].model["cell"].weight_hh.detach().clone()
    result = run(shell, f"%%diagnose {line}\ntrainer.train_sequence(xs, ys)")
    shown = repr(result.result)
    assert shown.startswith("backward-twice: 1 thing to fix (2 iterations watched in 1 run of the cell;"), shown
    assert "fix: add `self.h = self.h.detach()` at the end of each iteration" in shown, shown
    assert torch.equal(shell.user_ns["trainer"].model["cell"].weight_hh, before)


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


def test_a_list_a_model_of_another_cell_fills_is_named_at_the_cells_append_with_its_own_fix(shell) -> None:
    """Paperspace's hooks post: ``activations.append(net.h)``, ``net.h`` set in the ``forward`` of an earlier cell. The
    note named that cell's line 9 (``h = F.relu(self.fc1(x))``, where the graph is built) with "keep a detached tensor
    (`.detach()`) instead": the line that grows the list was looked for in the forward's cell only. The truth, as
    ``bt.diagnose`` says of the same step in one file: the diagnosed cell's append, and its detach."""
    run(
        shell,
        HOOKED_NET + "net = Net()\nsgd = torch.optim.SGD(net.parameters(), lr=0.1)\nactivations = []\n",
    )
    body = "sgd.zero_grad()\nout = net(x)\nactivations.append(net.h)\nout.pow(2).mean().backward()\nsgd.step()"
    result = run(shell, f"%%diagnose net sgd\n{body}")
    shown = repr(result.result)
    assert f"Cell In[{result.execution_count}], line 4 | activations.append(net.h)" in shown, shown
    assert "keep in mind: `activations.append(net.h.detach())`" in shown, shown


def test_a_gans_second_backward_names_the_earlier_line_and_the_loss_to_detach_in(shell) -> None:
    """The DCGAN tutorial's step without ``fake.detach()`` in D's loss, its cells run without history (both "Cell
    In[3]", as a harness's ``run_cell(..., store_history=False)`` runs them): the fix was the conditional "...in the
    loss the earlier backward walks if it must not train ...", the line numbers read from "file:12: code" only. The
    truth, as ``bt.diagnose`` says: D's backward line, and that the step after it does not train G."""
    setup = (
        "netG, netD = torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Sigmoid())\n"
        "optD = torch.optim.Adam(netD.parameters())\n"
        "optG = torch.optim.Adam(netG.parameters())\n"
        "real, noise, criterion = torch.randn(4, 3), torch.randn(4, 2), torch.nn.BCELoss()\n"
        "ones, zeros = torch.ones(4, 1), torch.zeros(4, 1)\n"
    )
    assert shell.run_cell(setup, store_history=False).success
    body = (
        "netD.zero_grad()\n"
        "criterion(netD(real), ones).backward()\n"
        "fake = netG(noise)\n"
        "errD_fake = criterion(netD(fake), zeros)\n"
        "errD_fake.backward()\n"
        "optD.step()\n"
        "netG.zero_grad()\n"
        "errG = criterion(netD(fake), ones)\n"
        "errG.backward()\n"
        "optG.step()\n"
    )
    shown = repr(shell.run_cell(f"%%diagnose netG netD optD optG\n{body}", store_history=False).result)
    assert "1. a second backward through the graph that line 6's backward freed" in shown, shown
    fix = "fix: use `fake.detach()` at line 5 (`errD_fake = criterion(netD(fake), zeros)`): the step after line 6's"
    assert fix in shown, shown  # the line to change, where D's loss reads ``fake``


def test_a_running_term_set_in_an_earlier_cell_is_set_to_zero_before_the_cells_loop(shell) -> None:
    """A2C (RL-Adventure-2) with ``entropy = 0`` in the setup cell, ``entropy += dist.entropy().mean()`` in the rollout
    loop of the diagnosed cell: the fix was "add a number instead (`entropy += loss.item()`)", the loop around the
    ``+=`` not found in the cell. The truth, as ``bt.diagnose`` says: set it to 0 before that loop."""
    run(shell, "policy = torch.nn.Linear(3, 2)\nadam = torch.optim.Adam(policy.parameters())\nentropy = 0")
    body = (
        "for _ in range(2):\n"
        "    dist = torch.distributions.Categorical(logits=policy(x))\n"
        "    entropy += dist.entropy().mean()\n"
        "loss = policy(x).pow(2).mean() - 0.01 * entropy\n"
        "adam.zero_grad()\n"
        "loss.backward()\n"
        "adam.step()\n"
    )
    shown = repr(run(shell, f"%%diagnose policy adam\n{body}").result)
    assert "fix: set `entropy = 0` before line 2, so each iteration's backward walks only the terms it adds" in shown


def test_a_forward_both_losses_share_is_computed_again_after_the_step_with_both_lines(shell) -> None:
    """DDPG with both losses from one critic forward, ``critic_loss.backward(retain_graph=True)``, the critic's step,
    then the actor's backward: the fix was "compute line 3 again" (the critic's forward), which still raises, the
    actor's loss built from the old one. The truth, as ``bt.diagnose`` says: compute both lines again."""
    run(
        shell,
        "actor, critic = torch.nn.Linear(3, 1), torch.nn.Linear(4, 1)\n"
        "actor_opt = torch.optim.Adam(actor.parameters())\n"
        "critic_opt = torch.optim.Adam(critic.parameters())\n"
        "state, target = torch.randn(8, 3), torch.randn(8, 1)\n",
    )
    body = (
        "action = actor(state)\n"
        "current_Q = critic(torch.cat([state, action], 1))\n"
        "critic_loss = (current_Q - target).pow(2).mean()\n"
        "actor_loss = -current_Q.mean()\n"
        "critic_opt.zero_grad()\n"
        "critic_loss.backward(retain_graph=True)\n"
        "critic_opt.step()\n"
        "actor_opt.zero_grad()\n"
        "actor_loss.backward()\n"
        "actor_opt.step()\n"
    )
    shown = repr(run(shell, f"%%diagnose actor critic actor_opt critic_opt\n{body}").result)
    assert "fix: compute lines 3 and 5 again after the step at line 8" in shown, shown


def test_a_cells_own_loop_around_its_backward_splits_the_iterations_as_the_other_ways_do(shell) -> None:
    """Reptile's task as a cell: the inner loop's running total carried from pass 1 into pass 2 (with the forum's
    band-aid). The cell ran as one iteration: "compute lines 8 and 9 again after the step at line 11". The truth, as
    ``bt.watch`` and ``bt.diagnose`` say: ``task_loss`` carries pass 1's graph into pass 2."""
    run(shell, "model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))")
    body = (
        "fast = copy.deepcopy(model)\n"
        "inner_opt = torch.optim.SGD(fast.parameters(), lr=0.02)\n"
        "task_loss = 0\n"
        "for _ in range(2):\n"
        "    inner_opt.zero_grad()\n"
        "    pred = fast(x[:, :1])\n"
        "    task_loss = task_loss + (pred - 1).pow(2).mean()\n"
        "    task_loss.backward(retain_graph=True)\n"
        "    inner_opt.step()\n"
    )
    run(shell, "import copy")
    result = run(shell, f"%%diagnose model\n{body}")
    shown = repr(result.result)
    assert shown.startswith("backward-twice: 1 thing to fix (2 iterations watched in 1 run of the cell;"), shown
    assert "`task_loss` carries iteration 1's graph into iteration 2" in shown, shown
    assert f"Cell In[{result.execution_count}], line 8 | task_loss = task_loss + (pred - 1).pow(2).mean()" in shown


def test_the_way_to_the_evidence_the_diagnosis_names_runs_in_the_next_cell(shell, capsys) -> None:
    """Its last line said "more: print(diagnosis.evidence())", a name no cell binds (a NameError as printed). The
    diagnosis is the cell's output: the line names it as ``Out[n]``, which the next cell can print."""
    result = run(shell, f"%%diagnose cell optimizer\n{BODY}")
    more = repr(result.result).splitlines()[-1]
    assert more == f"more: print(Out[{result.execution_count}].evidence()) shows the evidence", more
    capsys.readouterr()
    shown = run(shell, more.removeprefix("more: ").removesuffix(" shows the evidence"))
    assert shown.error_in_exec is None, shown.error_in_exec
    assert "evidence:" in capsys.readouterr().out


def test_a_cell_that_rebinds_its_batch_reads_the_same_batch_at_every_run(shell) -> None:
    """A capsule network's loop body (higgsfield/Capsule-Network-Tutorial) turns its labels into one-hot rows,
    ``target = torch.eye(10).index_select(dim=0, index=target)``: run 2 read run 1's one-hot floats as the index, and
    the diagnosis was "the loop raised IndexError ... fix this error first", for a loop that never raises. A loop's
    header gives each pass a fresh batch: the cell's inputs without a graph are put back between its runs (a state
    with a graph, a hidden ``h``, stays as the last run left it)."""
    run(shell, "model = torch.nn.Linear(3, 4)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    run(shell, "target = torch.tensor([0, 3])")
    body = (
        "target = torch.eye(4).index_select(dim=0, index=target)\n"
        "loss = ((model(x) - target) ** 2).mean()\n"
        "optimizer.zero_grad()\nloss.backward()\noptimizer.step()"
    )
    shown = repr(run(shell, f"%%diagnose model optimizer\n{body}").result)
    assert shown.startswith("backward-twice: healthy (3 runs of the cell, 3 backward calls"), shown
    assert torch.equal(shell.user_ns["target"], torch.tensor([0, 3]))  # put back, as after any diagnosis


def test_a_cell_that_changes_its_first_tensor_and_rebinds_it_carries_the_rebound_one_into_the_next_run(shell) -> None:
    """Fast FGSM's loop body (locuslab/fast_adversarial, CIFAR10/train_fgsm.py): ``delta`` is filled in place, made to
    require grad, then rebound to its detached copy. The first ``delta`` was put back between runs as a fresh batch,
    changed by run 1 (it required grad now), and run 2 raised "a leaf Variable that requires grad is being used in an
    in-place operation", where the cell run again by hand runs (as do ``bt.watch`` and ``bt.diagnose``)."""
    run(shell, "model = torch.nn.Linear(6, 3)\nopt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)")
    run(shell, "X, y = torch.rand(4, 6), torch.tensor([0, 1, 2, 0])\ndelta = torch.zeros(4, 6)\neps = 8 / 255")
    body = (
        "delta.uniform_(-eps, eps)\n"
        "delta.requires_grad = True\n"
        "loss = torch.nn.functional.cross_entropy(model(X + delta), y)\n"
        "loss.backward()\n"
        "delta.data = (delta + 1.25 * eps * torch.sign(delta.grad.detach())).clamp(-eps, eps)\n"
        "delta = delta.detach()\n"
        "loss = torch.nn.functional.cross_entropy(model(X + delta), y)\n"
        "opt.zero_grad()\nloss.backward()\nopt.step()"
    )
    for _ in range(3):  # the truth: the cell run again by hand
        assert run(shell, body).error_in_exec is None
    run(shell, "delta = torch.zeros(4, 6)")
    first = shell.user_ns["delta"]
    shown = repr(run(shell, f"%%diagnose model opt\n{body}").result)
    assert shown.startswith("backward-twice: healthy (3 runs of the cell, 6 backward calls"), shown
    assert shell.user_ns["delta"] is first and not first.requires_grad, shell.user_ns["delta"]  # put back
    assert torch.equal(first, torch.zeros(4, 6))


def test_a_loop_cell_run_again_after_it_raised_detaches_the_state_the_last_run_left(shell) -> None:
    """A learner adds ``hidden = hidden.detach()`` at the end of the loop body and runs the cell again: ``hidden``
    still holds the graph of the run that raised, and iteration 1 raises. The fix was "compute `hidden` inside the
    loop", which it is, and the why "which that iteration's backward already freed" (no iteration of this run freed
    it). The truth: a detach where it comes in runs, as printed."""
    run(shell, "import backward_twice as bt\nrnn = torch.nn.RNN(3, 5, batch_first=True)")
    run(shell, "optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)\nhidden = torch.zeros(1, 2, 5)")
    run(shell, "loader = [(torch.randn(2, 4, 3), torch.randn(2, 4, 5)) for _ in range(3)]")
    loop = (
        "with bt.watch() as w:\n    for inputs, targets in loader:\n        {entry}optimizer.zero_grad()\n"
        "        output, hidden = rnn(inputs, hidden)\n        loss = ((output - targets) ** 2).mean()\n"
        "        loss.backward()\n        optimizer.step()\n        hidden = hidden.detach()\n"
    )
    assert isinstance(
        run(shell, loop.replace("hidden = hidden.detach()\n", "").format(entry="")).error_in_exec, Exception
    )
    again = run(shell, loop.format(entry=""))
    assert isinstance(again.error_in_exec, RuntimeError) and "second time" in str(again.error_in_exec)
    [item] = shell.user_ns["w"].report.items
    assert item.fix == "add `hidden = hidden.detach()` before line 4", item.fix
    assert item.why.endswith("into the graph built before the loop, which an earlier backward already freed"), item
    fixed = run(shell, loop.format(entry="hidden = hidden.detach()\n        "))
    assert fixed.error_in_exec is None and shell.user_ns["w"].healthy, str(shell.user_ns["w"])


WATCHED_CELL = """
import torch, backward_twice as bt
rnn = torch.nn.RNNCell(3, 4); h = torch.zeros(2, 4)
try:
    with bt.watch() as w:
        for x in torch.randn(3, 2, 3):
            h = rnn(x, h); h.pow(2).mean().backward()
except RuntimeError:
    pass
print(repr(w.more))
print("evidence:" in repr(w))
print(repr(w).splitlines()[-1])
"""


def test_the_way_to_a_watchs_evidence_in_ipythons_terminal_prints_it(tmp_path) -> None:
    """In IPython's terminal the report said "more: `w` in a new cell shows the evidence", and ``w`` in a new cell
    shows the report as text, without the evidence (a notebook shows it as HTML, the evidence included). There the
    line says ``print(w.evidence())``, which does; and ``w`` shown there, or printed, ends with it (it ended at the fix:
    only the traceback's note said where the evidence was)."""
    import subprocess
    import sys
    from pathlib import Path

    ipython = Path(sys.executable).with_name("ipython")
    shown = subprocess.run(
        [str(ipython), "--no-banner", "--colors=nocolor", "-c", WATCHED_CELL],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert shown.stdout.splitlines()[-3:] == ["'print(w.evidence())'", "False", "more: print(w.evidence())"], (
        shown.stdout + shown.stderr
    )


def test_a_shell_line_in_the_cell_runs_as_ipython_runs_it(shell) -> None:
    """A ``!true`` line in the cell (valid IPython, as ``%time`` is): "the cell is not Python: invalid syntax". It runs
    as IPython runs it, once per run of the cell."""
    run(shell, "model = torch.nn.Linear(3, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    run(shell, "x = torch.randn(4, 3)")
    body = "optimizer.zero_grad()\n!true\nloss = model(x).pow(2).mean()\nloss.backward()\noptimizer.step()"
    shown = repr(run(shell, f"%%diagnose model optimizer\n{body}").result)
    assert shown.startswith("backward-twice: healthy (3 runs of the cell"), shown


def test_an_interrupt_in_the_cell_propagates_with_the_cells_frames_not_the_tools(shell) -> None:
    """``raise KeyboardInterrupt`` inside a ``%%diagnose`` cell: it propagates (and the state is put back), but its
    traceback showed the tool's own frames (magic.py, diagnose.py, harness.py) above the cell's line."""
    import traceback

    run(shell, "model = torch.nn.Linear(3, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    run(shell, "x, runs = torch.randn(4, 3), []")
    body = "optimizer.zero_grad()\nmodel(x).pow(2).mean().backward()\nruns.append(1)\nraise KeyboardInterrupt"
    error = run(shell, f"%%diagnose model optimizer\n{body}").error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    assert not any("backward_twice" in name for name in files), files
