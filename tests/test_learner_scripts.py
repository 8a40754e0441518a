"""Learner scripts run by ``backward-twice watch`` as a learner runs them (the installed command, in a folder of their
own), against ``python`` on the same script: the loop ends as Python ends it, the diagnosis is judged from what the
loop did. The kinds the tool was once wrong on: a loop in a thread, ``torch.compile``, ``DataLoader`` workers,
autocast with a ``GradScaler`` that skips steps, an optimizer re-created every iteration, optimizers held as a
trainer's attributes, a long run stopped by ``--iterations``, a scheduler stepped once an epoch, a ``while`` loop
whose inner loop accumulates gradients, and names each iteration rebinds (no note). (Exits, Ctrl-C, bad paths,
``iterations=N`` with work after the step and a bare ``except:`` are in tests/test_cli.py and tests/test_watch.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

COMMAND = Path(sys.executable).parent / "backward-twice"


def run(folder: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The script run by ``python`` and by ``backward-twice watch``, side by side (a core each), each in a folder of
    its own, so what one run writes (a checkpoint, a trainer's output folder) the other never sees."""
    started = []
    for name, command in (("python", [sys.executable]), ("watched", [str(COMMAND), "watch", *args])):
        where = folder / name
        where.mkdir(exist_ok=True)
        (where / "train.py").write_text(textwrap.dedent(script))
        started.append(
            subprocess.Popen(
                [*command, "train.py"], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    done = []
    for process in started:
        try:
            stdout, stderr = process.communicate(timeout=300)
        finally:
            process.kill()  # past the timeout: no run is left behind
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done[0], done[1]


# A linear model whose gradient hook raises on a non-finite gradient, and batches of which batch 1 is bad: the scripts
# of the tests of a backward's error the learner's code catches (or not).
GUARDED = """
import torch

torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


def guard(grad):
    if not torch.isfinite(grad).all():
        raise FloatingPointError("non-finite gradient")


net.weight.register_hook(guard)


def batch(i):
    x = torch.randn(8, 4)
    if i == 1:
        x[0, 0] = float("inf")
    return x
"""


def _guarded_loop(handler: str) -> str:
    """``GUARDED``'s loop over 4 batches, with a ``try:`` around the backward whose ``except`` runs ``handler``."""
    loop = (
        "for i in range(4):\n    x = batch(i)\n    opt.zero_grad()\n    try:\n        net(x).pow(2).mean().backward()\n"
        f"    except FloatingPointError as error:\n        {handler}\n    opt.step()\n"
    )
    return GUARDED + loop


# Training in a worker thread that hands each pass's loss to the main thread on a queue (an app's or a UI's loop).
QUEUED_TRAINING = """
import queue
import threading
import torch

torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
losses = queue.Queue()


def train():
    for i in range(3):
        opt.zero_grad()
        loss = net(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.put(f"iteration {i} loss {loss.item():.4f}")
    losses.put(None)
"""


def raises_then_runs(folder: Path, script: str, raised: str, printed: list[str], fix: str) -> str:
    """The truth for a printed fix: ``script`` with ``{fix}`` empty raises ``raised`` bare and watched, the diagnosis
    holds each of ``printed``, and with ``{fix}`` filled in as printed, it runs bare and watched, called healthy.
    Returns the diagnosis."""
    python, watched = run(folder, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and raised in python.stderr, python.stderr
    for text in printed:
        assert text in watched.stdout, watched.stdout
    python, fixed = run(folder, script.replace("{fix}", fix))
    assert python.returncode == fixed.returncode == 0, python.stderr
    assert "backward-twice: healthy" in fixed.stdout, fixed.stdout
    return watched.stdout


def test_a_loop_in_a_thread_is_judged_and_the_script_ends_as_python_ends_it(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import threading
        import torch

        class Trainer:
            def __init__(self):
                torch.manual_seed(0)
                self.lstm = torch.nn.LSTM(4, 8)
                self.optimizer = torch.optim.SGD(self.lstm.parameters(), lr=0.1)
                self.hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))

            def train(self):
                for step in range(3):
                    self.optimizer.zero_grad()
                    out, self.hidden = self.lstm(torch.randn(5, 2, 4), self.hidden)
                    out.pow(2).mean().backward()
                    self.optimizer.step()

        worker = threading.Thread(target=Trainer().train)
        worker.start()
        worker.join()
        print("joined")
        """,
    )
    assert python.returncode == watched.returncode == 0  # a thread's error does not end the script
    assert "second time" in python.stderr and "second time" in watched.stderr and "joined" in watched.stdout
    report = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert report.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "`self.hidden` carries iteration 1's graph into iteration 2" in report
    assert "out, self.hidden = self.lstm(torch.randn(5, 2, 4), self.hidden)" in report


def test_a_compiled_model_trains_healthy_and_a_retain_through_it_is_the_donated_buffers_error(tmp_path: Path) -> None:
    loop = """
        import torch

        torch.manual_seed(0)
        model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)),
                              backend="aot_eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 8)).sum().backward()  # a first, plain backward: its compiled backward may donate
        for step in range(3):
            optimizer.zero_grad()
            out = model(torch.randn(4, 8))
            {body}
            optimizer.step()
        """
    two = "out[:, 0].pow(2).mean().backward(retain_graph=True); out[:, 1].abs().mean().backward()"
    python, watched = run(tmp_path, loop.format(body=two))
    assert python.returncode == watched.returncode == 1 and "donated buffers" in python.stderr
    assert "backward-twice: 1 thing to fix" in watched.stderr and "donated buffers" in watched.stderr
    assert watched.stderr.count("which requires create_graph=False") == 1  # PyTorch's message once: the traceback's
    assert "fix: call backward() once per forward, on the sum of the losses" in watched.stderr
    python, watched = run(tmp_path, loop.format(body="out.pow(2).mean().backward()"))
    assert python.returncode == watched.returncode == 0
    # 4 backward calls of the script's own: none of the ones torch.compile makes while it traces the backward
    assert watched.stdout.startswith("backward-twice: healthy (3 iterations watched, 4 backward calls,")


def test_dataloader_workers_load_as_they_do_under_python(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, index):
                x = torch.full((4,), float(index % 7))
                return x, (x ** 2).sum(0, keepdim=True)

        if __name__ == "__main__":
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
            for x, y in DataLoader(Squares(), batch_size=8, num_workers=2):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            print(f"final loss {loss.item():.6f}")
        """,
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    final = [line for line in python.stdout.splitlines() if line.startswith("final loss")]
    assert final and final[0] in watched.stdout  # the same training, batch for batch
    assert "backward-twice: healthy (8 iterations watched, 8 backward calls" in watched.stdout


def test_autocast_with_a_grad_scaler_that_skips_a_step_counts_every_pass(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # the first steps overflow and are skipped
        for step in range(4):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(16, 8)).float().pow(2).mean() * 1e10
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        print("scale", scaler.get_scale())
        """,
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert "backward-twice: healthy (4 iterations watched, 4 backward calls" in watched.stdout


def test_an_optimizer_made_in_every_pass_and_a_carried_state_is_the_carried_fix(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import torch

        torch.manual_seed(0)
        rnn = torch.nn.GRU(4, 8)
        hidden = torch.zeros(1, 2, 8)
        for step in range(4):
            optimizer = torch.optim.Adam(rnn.parameters(), lr=0.01)  # the learner's: a new one every pass
            optimizer.zero_grad()
            output, hidden = rnn(torch.randn(5, 2, 4), hidden)
            output.pow(2).mean().backward(retain_graph=True)
            optimizer.step()
        """,
    )
    assert python.returncode == watched.returncode == 1 and "inplace operation" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert diagnosis.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "`hidden` carries iteration 1's graph into iteration 2; retain_graph=True only hides it" in diagnosis
    assert "fix: add `hidden = hidden.detach()` before line 10, and remove retain_graph=True at line 11" in diagnosis


def test_optimizers_held_as_attributes_and_a_loop_that_raises_before_one_steps(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import torch

        class GAN:
            def __init__(self):
                torch.manual_seed(0)
                self.G = torch.nn.Linear(2, 2)
                self.D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
                self.optim_G = torch.optim.Adam(self.G.parameters())
                self.optim_D = torch.optim.Adam(self.D.parameters())

            def train(self, steps):
                for step in range(steps):
                    fake = self.G(torch.randn(8, 2))
                    fake_out = self.D(fake)
                    d_loss = fake_out.mean() - self.D(torch.randn(8, 2)).mean()
                    self.optim_D.zero_grad()
                    d_loss.backward(retain_graph=True)
                    self.optim_D.step()
                    g_loss = -fake_out.mean()
                    self.optim_G.zero_grad()
                    g_loss.backward()
                    self.optim_G.step()

        GAN().train(3)
        """,
    )
    assert python.returncode == watched.returncode == 1 and "inplace operation" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert diagnosis.startswith("backward-twice: 1 thing to fix (1 iteration watched; the loop raised in iteration 1)")
    assert "carries" not in diagnosis  # no graph invented as carried
    assert "fake_out = self.D(fake)" in diagnosis and "self.optim_D.step()" in diagnosis


def test_five_thousand_iterations_stop_at_the_top_of_the_next_pass(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import torch

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        done = 0
        for step in range(6000):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            done += 1
        print("done", done)
        """,
        "--iterations",
        "5000",
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert "done 6000" in python.stdout and "done" not in watched.stdout  # stopped before the loop ended
    assert watched.stdout.startswith("backward-twice: healthy (5000 iterations watched, then stopped as asked,")


WHILE_HEADER = """
import torch

torch.manual_seed(0)
cell = torch.nn.RNNCell(4, 8)
optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
h = torch.zeros(2, 8)
"""
WHILE_BODY = """
step = 0
while step < 3:
    optimizer.zero_grad()
    h = cell(torch.randn(2, 4), h)
    h.pow(2).sum().backward()
    optimizer.step()
    step += 1
"""


@pytest.mark.parametrize("where", ["script", "function"])
def test_a_while_loop_is_the_iteration(tmp_path: Path, where: str) -> None:
    body = WHILE_BODY if where == "script" else "\ndef train(h):" + textwrap.indent(WHILE_BODY, "    ") + "\ntrain(h)\n"
    python, watched = run(tmp_path, WHILE_HEADER + body)
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert diagnosis.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "`h` carries iteration 1's graph into iteration 2" in diagnosis


def test_a_lightning_module_carrying_its_own_attribute_is_named_as_its_line_names_it(tmp_path: Path) -> None:
    python, watched = run(
        tmp_path,
        """
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Carry(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.rnn = torch.nn.GRUCell(8, 8)
                self.head = torch.nn.Linear(8, 1)
                self.h = torch.zeros(4, 8)

            def training_step(self, batch, batch_idx):
                x, y = batch
                self.h = self.rnn(x, self.h)
                return torch.nn.functional.mse_loss(self.head(self.h), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        torch.manual_seed(0)
        data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
        trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(Carry(), DataLoader(data, batch_size=4))
        """,
    )
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    # reached only through Lightning's private attributes (trainer._accelerator_connector.strategy._model.h): named
    # as training_step's own line names it
    assert "1. `self.h` carries iteration 1's graph into iteration 2" in diagnosis
    assert "fix: add `self.h = self.h.detach()` before line 16" in diagnosis
    assert "_accelerator_connector" not in diagnosis


LIGHTNING_KEEPS_HIDDEN = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 1)
        self.previous_hidden = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.previous_hidden is None:  # a start state, stored at the first step only
            self.previous_hidden = (torch.zeros(1, x.shape[0], 8), torch.zeros(1, x.shape[0], 8))
        out, hidden = self.lstm(x, self.previous_hidden)
        self.previous_hidden = hidden
{fix}        return torch.nn.functional.mse_loss(self.head(out[:, -1]), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 5, 4), torch.randn(16, 1))
    model = Model()  # a name of the caller's for the module: the fix is training_step's, as it spells it
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, DataLoader(data, batch_size=4))


main()
"""


def test_a_state_a_lightning_step_keeps_on_self_for_the_next_is_fixed_after_the_line_that_keeps_it(
    tmp_path: Path,
) -> None:
    """Lightning runs the loop (no loop of the learner's): "at the end of each iteration" has nowhere to go. The
    state is named as training_step spells it and detached right after the line that keeps it; the truth: the
    script raises as written and runs to its end with that line added (and neither `self.previous_hidden = None` in
    ``__init__`` nor the start state stored at the first step is where it is kept; nor is `model.previous_hidden`,
    as the function that calls ``fit`` names it, a name ``training_step`` can use)."""
    python, watched = run(tmp_path, LIGHTNING_KEEPS_HIDDEN.format(fix=""))
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "1. `self.previous_hidden` carries iteration 1's graph into iteration 2" in diagnosis, diagnosis
    assert "train.py:19 | self.previous_hidden = hidden" in diagnosis, diagnosis
    fix = "self.previous_hidden = tuple(s.detach() for s in self.previous_hidden)"
    assert f"fix: add `{fix}` after line 19" in diagnosis, diagnosis
    fixed = LIGHTNING_KEEPS_HIDDEN.format(fix=f"        {fix}\n")
    python, watched = run(tmp_path, fixed)
    assert python.returncode == watched.returncode == 0, python.stderr[-2000:]
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


LIGHTNING_STATE_STORES = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    aux_total = 0.0  # a start value of the class's

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(3, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 1)
        self.hiddens = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.hiddens is None:
            self.hiddens = torch.zeros(1, x.shape[0], 5)
{step}{fix}        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(8, 4, 3), torch.randn(8, 1))
trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(Model(), DataLoader(data, batch_size=2))
"""
_STATE_STORES = {
    # the hidden state stored by the statement that builds it (a tuple's target): the TBPTT page's loop on self
    "tuple target": (
        "        out, self.hiddens = self.gru(x, self.hiddens)\n"
        "        loss = torch.nn.functional.mse_loss(self.head(out[:, -1]), y)\n",
        "self.hiddens",
        20,
    ),
    # a running total on self that starts as the class's float and that a later line's loss reads (a Hugging Face
    # ``compute_loss`` keeping an auxiliary loss): no ``.detach()`` of a float before it, and none between the two
    "float start read later": (
        "        out, _ = self.gru(x)\n"
        "        self.aux_total = self.aux_total + out.pow(2).mean()\n"
        "        loss = torch.nn.functional.mse_loss(self.head(out[:, -1]), y) + 0.01 * self.aux_total\n",
        "self.aux_total",
        22,
    ),
}


@pytest.mark.parametrize("case", _STATE_STORES)
def test_a_state_a_framework_step_keeps_on_self_is_detached_after_the_step_last_reads_it(
    tmp_path: Path, case: str
) -> None:
    """It was "`model.hiddens` ... at the end of each iteration" (no loop of the learner's; the store in a tuple's
    target not seen as one), and "add `self.aux_total = self.aux_total.detach()` before line 21" where it starts as
    a float (AttributeError applied as printed). The truth: the script raises as written, and with the printed line
    added where the fix says it runs to its end."""
    step, name, after = _STATE_STORES[case]
    python, watched = run(tmp_path, LIGHTNING_STATE_STORES.format(step=step, fix=""))
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    fix = f"{name} = {name}.detach()"
    assert f"1. `{name}` carries iteration 1's graph into iteration 2" in diagnosis, diagnosis
    assert f"fix: add `{fix}` after line {after}" in diagnosis, diagnosis
    assert LIGHTNING_STATE_STORES.format(step=step, fix="").splitlines()[after - 1].startswith("        ")
    python, watched = run(tmp_path, LIGHTNING_STATE_STORES.format(step=step, fix=f"        {fix}\n"))
    assert python.returncode == watched.returncode == 0, python.stderr[-2000:]
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


LIGHTNING_EPOCH_MEAN = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.outputs = []
        self.previous_mean = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.previous_mean is not None:
            loss = loss + 0.1 * (loss - self.previous_mean) ** 2
        self.outputs.append(loss)
        return loss

    def on_train_epoch_end(self):
        epoch_mean = torch.stack(self.outputs).mean()
        self.previous_mean = epoch_mean
{fix}        self.outputs.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(Net(), DataLoader(data, batch_size=4))
print("weights", [round(v, 6) for v in trainer.lightning_module.layer.weight.flatten().tolist()])
"""


def test_a_tensor_an_epochs_end_keeps_for_the_next_epoch_is_named_not_the_list_it_was_made_from(
    tmp_path: Path,
) -> None:
    """The epoch's mean loss kept on ``self`` at the epoch's end and used in the next epoch's loss: the list of losses
    it was stacked from (cleared at the epoch's end) was named, with a fix after its ``[]`` in ``__init__`` that
    changed nothing. The truth: the script raises in the first step of epoch 2 as written, and with the printed line
    after ``self.previous_mean = epoch_mean`` it runs to the same weights as ``epoch_mean.detach()`` there."""
    python, watched = run(tmp_path, LIGHTNING_EPOCH_MEAN.format(fix=""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stdout
    assert "1. `self.previous_mean` carries iteration 3's graph into iteration 4" in diagnosis, diagnosis
    assert "train.py:24 | self.previous_mean = epoch_mean" in diagnosis, diagnosis
    fix = "self.previous_mean = self.previous_mean.detach()"
    assert f"fix: add `{fix}` after line 24" in diagnosis, diagnosis
    python, watched = run(tmp_path, LIGHTNING_EPOCH_MEAN.format(fix=f"        {fix}\n"))
    assert python.returncode == watched.returncode == 0, python.stderr[-2000:]
    weights = python.stdout.splitlines()[-1]
    assert weights.startswith("weights") and weights in watched.stdout
    truth = LIGHTNING_EPOCH_MEAN.replace("self.previous_mean = epoch_mean", "self.previous_mean = epoch_mean.detach()")
    (tmp_path / "truth.py").write_text(truth.format(fix=""))  # bare python only: the truth needs no tool
    python = subprocess.run([sys.executable, "truth.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert python.stdout.splitlines()[-1] == weights, python.stderr[-2000:]


LIGHTNING_MANUAL = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.cell = torch.nn.GRUCell(4, 8)
        self.head = torch.nn.Linear(8, 1)

    def on_train_epoch_start(self):
        self.h = torch.zeros(4, 8)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
{fix}        self.h = self.cell(x, self.h)
        loss = torch.nn.functional.mse_loss(self.head(self.h), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(Model(), DataLoader(data, batch_size=4))
"""


def test_manual_optimization_through_lightnings_optimizer_wrapper_counts_its_steps(tmp_path: Path) -> None:
    """``self.optimizers()`` is a LightningOptimizer, a wrapper with an id of its own around the SGD that steps: it
    is not an optimizer that "never stepped before the error" (which put both backward calls in one iteration and
    blamed a second backward within it). The state is built in a hook (``on_train_epoch_start``); the truth: the
    script raises in the second step as written, and runs with ``self.h = self.h.detach()`` before line 20."""
    python, watched = run(tmp_path, LIGHTNING_MANUAL.format(fix=""))
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "(2 iterations watched; the loop raised in iteration 2)" in diagnosis, diagnosis
    assert "1. `self.h` carries iteration 1's graph into iteration 2" in diagnosis, diagnosis
    assert "fix: add `self.h = self.h.detach()` before line 20" in diagnosis, diagnosis
    python, watched = run(tmp_path, LIGHTNING_MANUAL.format(fix="        self.h = self.h.detach()\n"))
    assert python.returncode == watched.returncode == 0, python.stderr[-2000:]
    assert watched.stdout.startswith("backward-twice: healthy (4 iterations watched"), watched.stdout


FORWARD_HOOK_KEEPS_OUTPUTS = """
import torch

activations = []


def save_activation(module, inputs, output):
    activations.append(output{fix})


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model[1].register_forward_hook(save_activation)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(6):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1)).backward()
        optimizer.step()
    print(len(activations), activations[0].shape[1], activations[0].grad_fn is not None)


if __name__ == "__main__":
    main()
"""


def test_outputs_a_forward_hook_keeps_are_a_growing_note_with_a_fix_that_fits_their_shape(tmp_path: Path) -> None:
    """A forward hook of the learner's keeps each (8, 16) output: a list that holds one more graph each iteration.
    The fix must fit a tensor of 16 numbers a row: ``.item()`` raises on it, ``.detach()`` keeps no graph (the truth:
    the graphs are held as written, none with ``.detach()``)."""
    python, watched = run(tmp_path, FORWARD_HOOK_KEEPS_OUTPUTS.format(fix=""))
    assert python.returncode == watched.returncode == 0 and python.stdout.split() == ["6", "16", "True"]
    assert "6 16 True\nbackward-twice: 1 note (6 iterations watched)\n" in watched.stdout, watched.stdout
    assert "1. `activations` keeps one more iteration's graph alive every iteration" in watched.stdout
    assert "train.py:8 | activations.append(output)" in watched.stdout, watched.stdout
    assert "keep in mind: `activations.append(output.detach())`" in watched.stdout, watched.stdout
    assert ".item()" not in watched.stdout
    python, watched = run(tmp_path, FORWARD_HOOK_KEEPS_OUTPUTS.format(fix=".detach()"))
    assert python.stdout.split() == ["6", "16", "False"]
    assert "6 16 False\nbackward-twice: healthy (6 iterations watched" in watched.stdout, watched.stdout


EPOCH_TOTAL = """
import torch


def held(total):  # how many passes' losses the total (0 + loss + loss ...) holds: one addition a pass
    count, node = 0, total.grad_fn
    while node is not None and type(node).__name__ == "AddBackward0":
        count, node = count + 1, node.next_functions[0][0]
    return count


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(5)]
for epoch in range(3):
    epoch_loss = 0
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        epoch_loss += loss
        print(held(epoch_loss), end=" ")
"""


def test_a_total_an_epoch_loop_resets_past_the_third_pass_is_not_said_to_hold_them_all(tmp_path: Path) -> None:
    """``epoch_loss += loss`` in the batch loop, set to 0 at each epoch's start (5 batches an epoch): the truth,
    walked without the tool, is a total that holds 1 to 5 passes' graphs, never more. The names are read at passes
    1-4 and 8: the drop shows only at pass 8's read, past the first three a name's graphs were followed into (which
    said "keeps one more iteration's graph alive every iteration")."""
    python, watched = run(tmp_path, EPOCH_TOTAL)
    assert python.returncode == watched.returncode == 0
    assert python.stdout.split() == ["1", "2", "3", "4", "5"] * 3
    assert "1. `epoch_loss` keeps several iterations' graphs alive at once" in watched.stdout, watched.stdout
    assert "holds them until the loop resets it" in watched.stdout and "holds them all" not in watched.stdout


HF_TRAINER_KEEPS_PREVIOUS = """
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator


class ConsistencyTrainer(Trainer):
    previous = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs.loss
        if self.previous is not None:
            loss = loss + 0.1 * (outputs.logits.mean() - self.previous).pow(2)
        self.previous = outputs.logits.mean()
{fix}        return (loss, outputs) if return_outputs else loss


torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, bos_token_id=99, eos_token_id=99)
model = GPT2LMHeadModel(config)
tokens = torch.randint(0, 99, (8, 8))
train_dataset = [{"input_ids": row, "labels": row.clone()} for row in tokens]
with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=2, max_steps=3, save_strategy="no",
                             logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = ConsistencyTrainer(
        model=model, args=args, data_collator=default_data_collator, train_dataset=train_dataset
    )
    trainer.train()
print("done")
"""


def test_a_value_a_trainers_compute_loss_keeps_for_the_next_step_is_detached_after_it_is_stored(tmp_path: Path) -> None:
    """A transformers ``Trainer`` whose ``compute_loss`` adds a consistency term with the previous step's mean logit,
    kept undetached on ``self.previous``. The line that stores it does not read it: the old graph does not come in
    there, and a detach before it would run after the loss already used the old value (it still raises). The truth:
    the script raises as written and runs with the detach after the line that stores it."""
    pytest.importorskip("transformers")

    def script(before: str = "", after: str = "") -> str:
        stored = "        self.previous = outputs.logits.mean()\n"
        return HF_TRAINER_KEEPS_PREVIOUS.replace(stored + "{fix}", before + stored + after)

    python, watched = run(tmp_path, script())
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "1. `self.previous` carries iteration 1's graph into iteration 2" in diagnosis, diagnosis
    assert "comes in here" not in diagnosis, diagnosis
    assert "fix: add `self.previous = self.previous.detach()` after line 19" in diagnosis, diagnosis
    detach = "self.previous = self.previous.detach()"
    before = f"        {detach} if self.previous is not None else None\n"
    assert run(tmp_path, script(before=before))[0].returncode == 1  # a detach before that line: it still raises
    python, watched = run(tmp_path, script(after=f"        {detach}\n"))
    assert python.returncode == watched.returncode == 0, python.stderr[-2000:]


def test_iterations_n_under_a_trainers_gradient_accumulation_stop_after_n_optimizer_steps(tmp_path: Path) -> None:
    """``gradient_accumulation_steps=2``: two backward calls per optimizer step. ``--iterations 1`` stopped at the
    second backward, before any step ("1 iteration ... at each call of trainer.train()"), where the whole run splits
    by ``AdamW.step()``. The truth: the trainer's own step count, 1 after two backward calls (3 bare); the code after
    ``trainer.train()`` does not run after the stop, as after a loop of the script's own."""
    pytest.importorskip("transformers")
    stored = "        self.previous = outputs.logits.mean()\n"
    script = HF_TRAINER_KEEPS_PREVIOUS.replace(
        stored + "{fix}", stored + "        self.previous = self.previous.detach()\n"
    )
    script = script.replace(
        "per_device_train_batch_size=2,", "per_device_train_batch_size=2, gradient_accumulation_steps=2,"
    )
    script = script.replace('print("done")', 'print("steps", trainer.state.global_step)')
    python, watched = run(tmp_path, script, "--iterations", "1", "--verbose")
    assert python.returncode == watched.returncode == 0, watched.stderr[-2000:]
    assert "\nsteps 3\n" in python.stdout and "\nsteps " not in watched.stdout, watched.stdout
    assert "(1 iteration watched, then stopped as asked, 2 backward calls" in watched.stdout, watched.stdout
    assert "iterations: by AdamW.step()" in watched.stdout, watched.stdout


def test_a_bank_of_features_in_a_script_is_the_carrier_not_the_name_the_loop_rebinds(tmp_path: Path) -> None:
    """At the top of pass 2 the script's global `hidden` still holds pass 1's features, as `bank[0]` does; the loop
    rebinds `hidden` before the backward reads `bank[-4:]`. Detaching `hidden` there would cut this pass's features
    off the loss (a harmful fix); the carrier is `bank`, read by slice: keep detached copies in it, appended as the
    script's own line appends them. The truth: the script raises as written and runs with that append."""
    script = """
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        bank = []
        for step in range(3):
            hidden = net[1](net[0](x))
            bank.append(hidden{fix})
            recent = torch.cat(bank[-4:])
            loss = torch.nn.functional.mse_loss(net[2](hidden), y) + 0.1 * (hidden @ recent.T).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""))
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "1. `bank` carries iteration 1's graph into iteration 2" in diagnosis, diagnosis
    assert "recent = torch.cat(bank[-4:])" in diagnosis  # where the old features come in, not bank.append(hidden)
    assert "fix: keep detached copies in `bank` (`bank.append(hidden.detach())`)" in diagnosis, diagnosis
    assert "hidden = hidden.detach()" not in diagnosis
    python, watched = run(tmp_path, script.replace("{fix}", ".detach()"))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_a_scheduler_stepped_once_an_epoch_leaves_the_batch_loop_the_iteration(tmp_path: Path) -> None:
    # pytorch/examples mnist/main.py's shape: train() loops over batches, main() over epochs with scheduler.step()
    script = """
        import torch

        def train(model, optimizer, batches, epoch):
            for batch, (x, y) in enumerate(batches):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                print(f"end of epoch {epoch} batch {batch}")

        def main():
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
            batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
            for epoch in range(1, 4):
                train(model, optimizer, batches, epoch)
                scheduler.step()

        if __name__ == "__main__":
            main()
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert "healthy (9 iterations watched, 9 backward calls" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, script, "--iterations", "2")
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.split("backward-twice:")[0].splitlines() == [
        "end of epoch 1 batch 0",
        "end of epoch 1 batch 1",
    ]
    assert "healthy (2 iterations watched, then stopped as asked, 2 backward calls" in watched.stdout


def test_a_while_loop_whose_inner_loop_accumulates_gradients_counts_every_pass(tmp_path: Path) -> None:
    # nanoGPT's train.py shape: `while True`, micro-steps in a `for`, the step after it, a counter and a break
    script = """
        import torch

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        iter_num = 0
        while True:
            for micro_step in range(2):
                loss = model(torch.randn(8, 4)).pow(2).mean() / 2
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            print(f"end of pass {iter_num}")
            if iter_num >= 6:
                break
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert "healthy (6 iterations watched, 12 backward calls" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, script, "--iterations", "4")
    assert watched.stdout.split("backward-twice:")[0].splitlines() == [f"end of pass {n}" for n in range(1, 5)]
    assert "healthy (4 iterations watched, then stopped as asked, 8 backward calls" in watched.stdout


def test_names_each_iteration_rebinds_get_no_note(tmp_path: Path) -> None:
    # hamiltonian-nn's train.py shape: an evaluation gradient built with create_graph=True each step, and a dict
    # entry overwritten each step; each holds one step's graph into the next and lets it go when rebound
    python, watched = run(
        tmp_path,
        """
        import gc
        import weakref
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, test_x = torch.randn(4, 3), torch.randn(4, 3, requires_grad=True)
        state = {"test_loss": None}
        graphs = []
        for step in range(4):
            state["loss"] = model(x).pow(2).mean()
            optimizer.zero_grad()
            state["loss"].backward()
            optimizer.step()
            test_dx = torch.autograd.grad(model(test_x).sum(), test_x, create_graph=True)[0]
            state["test_loss"] = model(x).pow(2).mean()
            graphs.append(weakref.ref(test_dx))  # the tensor that holds the graph
            gc.collect()
            print("graphs alive:", sum(graph() is not None for graph in graphs))
        """,
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout.splitlines() == ["graphs alive: 1"] * 4  # one held at a time
    assert "healthy (4 iterations watched, 8 backward calls" in watched.stdout, watched.stdout
    assert "note" not in watched.stdout


def test_a_list_of_losses_kept_on_an_object_is_named_as_the_line_that_grows_it(tmp_path: Path) -> None:
    """A trainer object keeps its losses in ``self.history["losses"]``: the note names that list as the learner's
    line spells it and shows the line that grows it (it named the object, ``trainer``, and showed the line that made
    the dict, whose ``{"losses": []}`` holds a colon). The truth, printed by the script: every loss kept holds its
    graph; with ``.item()`` none does."""
    script = """
        import torch

        torch.manual_seed(0)

        class Trainer:
            def __init__(self):
                self.net = torch.nn.Linear(8, 1)
                self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
                self.history = {"losses": []}

            def step(self, x, y):
                self.opt.zero_grad()
                loss = torch.nn.functional.mse_loss(self.net(x), y)
                self.history["losses"].append(loss{fix})
                loss.backward()
                self.opt.step()

        trainer = Trainer()
        data = [(torch.randn(8, 8), torch.randn(8, 1)) for _ in range(8)]
        for x, y in data:
            trainer.step(x, y)
        print("graphs kept:", sum(getattr(kept, "grad_fn", None) is not None for kept in trainer.history["losses"]))
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""))
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout == "graphs kept: 8\n"
    assert '1. `self.history["losses"]` keeps one more iteration\'s graph alive every iteration' in watched.stdout
    assert 'train.py:15 | self.history["losses"].append(loss)' in watched.stdout, watched.stdout
    assert 'keep in mind: `self.history["losses"].append(loss.item())`' in watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", ".item()"))
    assert python.stdout == "graphs kept: 0\n"
    assert watched.stdout.startswith("graphs kept: 0\nbackward-twice: healthy"), watched.stdout


@pytest.mark.parametrize("optimization", ["automatic", "manual"])
def test_outputs_a_lightning_step_keeps_for_the_epochs_end_are_the_same_note_as_in_a_loop_of_ones_own(
    tmp_path: Path, optimization: str
) -> None:
    """Lightning's own pattern, ``self.training_step_outputs.append(loss)`` cleared at the epoch's end, holds every
    step's graph until then, as a list in a loop of one's own does: the same note, named as ``training_step`` spells
    it (it was "healthy": without a loop of the learner's, the names were never read as an iteration's start). Under
    manual optimization the notes were named ``m`` and ``tr``, the names that reach the list, shown at the loss's
    line. The truth, printed by the script at each epoch's end: 4 graphs held; with ``.detach()``, none."""
    script = """
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(8, 1)
                self.training_step_outputs = []

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.net(x), y)
                self.training_step_outputs.append(loss{fix})
                return loss

            def on_train_epoch_end(self):
                print("graphs held:", sum(out.grad_fn is not None for out in self.training_step_outputs))
                self.training_step_outputs.clear()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        torch.manual_seed(0)
        data = TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
        trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(Model(), DataLoader(data, batch_size=4))
        """
    line = 16
    if optimization == "manual":
        script = script.replace(
            "self.training_step_outputs = []",
            "self.training_step_outputs = []\n" + " " * 16 + "self.automatic_optimization = False",
        ).replace(
            "                self.training_step_outputs.append",
            "".join(f"                {step}\n" for step in MANUAL_STEP)
            + "                self.training_step_outputs.append",
        )
        line = 21
    python, watched = run(tmp_path, script.replace("{fix}", ""))
    assert python.returncode == watched.returncode == 0, watched.stderr[-2000:]
    assert python.stdout.splitlines()[-2:] == ["graphs held: 4"] * 2
    report = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert report.startswith("backward-twice: 1 note (")
    # cleared at each epoch's end (a reset the run saw): it holds one epoch's graphs at most, not all of them
    assert "1. `self.training_step_outputs` keeps several iterations' graphs alive at once" in report, report
    assert "`self.training_step_outputs` holds them until the loop resets it" in report, report
    assert f"train.py:{line} | self.training_step_outputs.append(loss)" in report, report
    assert "_accelerator_connector" not in report
    python, watched = run(tmp_path, script.replace("{fix}", ".detach()"))
    assert python.stdout.splitlines()[-2:] == ["graphs held: 0"] * 2
    assert watched.stdout[watched.stdout.index("backward-twice:") :].startswith("backward-twice: healthy")


MANUAL_STEP = ("opt = self.optimizers()", "opt.zero_grad()", "self.manual_backward(loss)", "opt.step()")

IN_PLACE = {
    "augmented": ("h = torch.sigmoid(net(x))", "h += 1", "write line 9 out of place: `h = h + 1`"),
    "method": ("h = torch.tanh(net(x))\n    b = h * 2", "h.mul_(3)", "write line 10 out of place: `h = h.mul(3)`"),
    "item": ("h = torch.sigmoid(net(x))", "h[:, 0] = 0", "add `h = h.clone()` before line 9"),
}


@pytest.mark.parametrize("form", sorted(IN_PLACE))
def test_an_in_place_change_of_a_saved_tensor_is_shown_at_its_line_with_a_fix_that_makes_the_loop_run(
    tmp_path: Path, form: str
) -> None:
    """The version check raised by the learner's own in-place statement (no optimizer step between): the item shows
    that statement and writes it out of place, in the learner's names (it gave the generic "use the out-of-place
    form; after an optimizer.step() ..."). The truth: the script raises as written and runs with the printed fix."""
    forward, change, fix = IN_PLACE[form]
    script = textwrap.dedent(
        """
        import torch
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(4, 8)
            {forward}
            {change}
            loss = h.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    ).format(forward=forward, change=change)
    python, watched = run(tmp_path, script, "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "modified by an inplace operation" in python.stderr
    diagnosis = watched.stdout
    number = int(re.search(r"line (\d+)", fix).group(1))  # type: ignore[union-attr]
    assert f"1. line {number} changed in place a tensor this backward needs" in diagnosis, diagnosis
    assert f"train.py:{number} | {change}" in diagnosis, diagnosis
    assert f"fix: {fix}\n" in diagnosis, diagnosis
    lines = script.splitlines()
    statement = re.search(r"`(.+)`", fix).group(1)  # type: ignore[union-attr]
    if fix.startswith("add"):
        lines.insert(number - 1, f"    {statement}")
    else:
        lines[number - 1] = f"    {statement}"
    python, watched = run(tmp_path, "\n".join(lines))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_names_rebound_each_pass_whose_graph_reaches_one_built_before_the_loop_are_no_notes(tmp_path: Path) -> None:
    """A decoder conditioned on features computed once, before the loop (the captioning forum loops), with the
    forum's band-aid: each pass's ``out`` and ``loss`` reach that older graph, which was read as a graph spanning two
    iterations, so each got "keeps one more iteration's graph alive every iteration". The truth, printed by the
    script: one pass's graph is alive at a time; the carried ``features`` is the one finding."""
    python, watched = run(
        tmp_path,
        """
        import gc
        import weakref
        import torch

        torch.manual_seed(0)
        encoder, decoder = torch.nn.Linear(10, 6), torch.nn.Linear(6, 5)
        optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
        features = encoder(torch.randn(2, 10))
        graphs = []
        for step in range(4):
            out = decoder(features.relu())
            loss = out.pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
            graphs.append(weakref.ref(loss))  # the tensor that holds the pass's graph
            gc.collect()
            print("graphs alive:", sum(graph() is not None for graph in graphs))
        """,
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout.splitlines() == ["graphs alive: 1"] * 4
    report = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert report.startswith("backward-twice: 1 thing to fix (4 iterations watched)"), report
    assert "1. `features` carries the graph built before the loop into iteration 2" in report, report
    assert "note" not in report and "keeps one more" not in report, report


def test_a_state_read_in_a_loop_over_time_steps_of_a_called_step_is_detached_before_that_loop(tmp_path: Path) -> None:
    """A trainer's ``train_step`` runs an LSTM cell over time steps in a loop of its own; ``fit``'s loop calls it.
    The fix went before the line in the time loop that reads the state ("before line 15"), which detaches it at every
    step and silently cuts backpropagation through time. Now it goes before that loop, once a call. The truth: the
    script raises as written; with the printed fix it runs, and iteration 1's gradient is the bare one."""
    script = """
        import torch

        class Trainer:
            def __init__(self):
                torch.manual_seed(0)
                self.cell, self.fc = torch.nn.LSTMCell(3, 7), torch.nn.Linear(7, 3)
                self.optimizer = torch.optim.SGD([*self.cell.parameters(), *self.fc.parameters()], lr=0.05)
                self.hx, self.cx = torch.zeros(4, 7), torch.zeros(4, 7)

            def train_step(self, x):
                self.optimizer.zero_grad()
                loss = 0
                for t in range(x.size(0) - 1):
                    self.hx, self.cx = self.cell(x[t], (self.hx, self.cx))
                    loss = loss + (self.fc(self.hx) - x[t + 1]).pow(2).mean()
                loss.backward()
                print("gradient", round(self.cell.weight_hh.grad.norm().item(), 6))
                self.optimizer.step()

            def fit(self, batches):
                for batch in batches:
                    self.train_step(batch)

        torch.manual_seed(1)
        Trainer().fit([torch.randn(5, 4, 3) for _ in range(3)])
        """
    python, watched = run(tmp_path, script, "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    fix = "self.cx = self.cx.detach()` and `self.hx = self.hx.detach()"
    assert f"fix: add `{fix}` before line 14" in watched.stdout, watched.stdout
    lines = textwrap.dedent(script).splitlines()
    assert lines[13].strip().startswith("for t in range")
    lines.insert(13, "        self.cx = self.cx.detach(); self.hx = self.hx.detach()")
    fixed, _ = run(tmp_path, "\n".join(lines))
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.splitlines()[0] == python.stdout.splitlines()[0]  # iteration 1's gradient: the whole sequence


def test_per_layer_states_kept_in_lists_set_by_index_are_detached_item_by_item(tmp_path: Path) -> None:
    """Stacked LSTM cells whose states are lists set by layer (``hs[l], cs[l] = cell(...)``): the fix was "keep
    detached copies in `cs` (`cs.append(out.detach())`), or clear it each iteration", which does not fit (nothing is
    appended; cleared, the next ``hs[l]`` raises IndexError). The truth: the script raises as written and runs with
    the printed statements added at the end of each iteration."""
    script = """
        import torch

        torch.manual_seed(0)
        cells = torch.nn.ModuleList([torch.nn.LSTMCell(3, 5), torch.nn.LSTMCell(5, 5)])
        fc = torch.nn.Linear(5, 3)
        opt = torch.optim.SGD([*cells.parameters(), *fc.parameters()], lr=0.1)
        hs = [torch.zeros(2, 5) for _ in cells]
        cs = [torch.zeros(2, 5) for _ in cells]
        seq = torch.randn(20, 2, 3)
        for k in range(0, 16, 4):
            loss = 0
            for t in range(k, k + 4):
                inp = seq[t]
                for l, cell in enumerate(cells):
                    hs[l], cs[l] = cell(inp, (hs[l], cs[l]))
                    inp = hs[l]
                loss = loss + (fc(inp) - seq[t + 1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    python, watched = run(tmp_path, script, "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    fix = "cs = [m.detach() for m in cs]` and `hs = [m.detach() for m in hs]"
    assert f"fix: add `{fix}` at the end of each iteration" in watched.stdout, watched.stdout
    fixed = textwrap.dedent(script) + "    cs = [m.detach() for m in cs]\n    hs = [m.detach() for m in hs]\n"
    python, watched = run(tmp_path, fixed)
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_iterations_n_stop_a_loop_in_a_thread_quietly_with_the_state_of_n_passes(tmp_path: Path) -> None:
    """A loop run in a thread (an app's ``threading.Thread(target=train)``) under ``--iterations 2``: the stop ended
    the thread with "Exception in thread ... StopRecording: 2" and a traceback through the tool's lines.py; then the
    thread ended silently and the main thread went on past its ``join()``. Now the whole script stops after 2 passes,
    as a loop of the main thread's does: the truth is what 2 bare passes print, and nothing after them."""
    script = """
        import threading
        import torch

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 4), torch.randn(16, 1)

        def train():
            for step in range({passes}):
                optimizer.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                optimizer.step()
                print("checksum", round(sum(p.sum().item() for p in model.parameters()), 6), flush=True)

        thread = threading.Thread(target=train)
        thread.start()
        thread.join()
        print("after the join")
        """
    bare, _ = run(tmp_path, script.replace("{passes}", "2"))
    _, watched = run(tmp_path, script.replace("{passes}", "6"), "--iterations", "2")
    assert watched.returncode == 0 and watched.stderr == "", watched.stderr
    assert watched.stdout.splitlines()[:2] == bare.stdout.splitlines()[:2] and "after the join" in bare.stdout
    assert "after the join" not in watched.stdout, watched.stdout
    assert "2 iterations watched, then stopped as asked" in watched.stdout, watched.stdout


def test_iterations_n_stop_the_main_thread_that_waits_for_a_threads_losses_on_a_queue(tmp_path: Path) -> None:
    """Training in a worker thread that hands each pass's loss to the main thread on a queue, ``--iterations 1``:
    the stop ended the worker alone, the main thread waited for the next loss for ever, and no report came (the run
    hung; in-process ``watch(iterations=1)`` too). The truth: python prints each pass's loss; stopped after pass 1,
    the script prints pass 1's loss and stops, with the report."""
    script = QUEUED_TRAINING + textwrap.dedent(
        """
        threading.Thread(target=train).start()
        while (message := losses.get()) is not None:
            print(message, flush=True)
        print("training finished")
        """
    )
    python, watched = run(tmp_path, script, "--iterations", "1")
    assert python.stdout.splitlines()[-1] == "training finished", python.stdout
    assert watched.returncode == 0 and watched.stderr == "", watched.stderr
    assert watched.stdout.splitlines()[0] == python.stdout.splitlines()[0], watched.stdout
    assert "training finished" not in watched.stdout, watched.stdout
    assert "1 iteration watched, then stopped as asked" in watched.stdout, watched.stdout


def test_a_gan_that_steps_g_before_d_is_told_to_detach_fake_in_ds_loss(tmp_path: Path) -> None:
    """G's backward first, then D's loss on the same ``fake``, not detached (Lightning's basic GAN tutorial order):
    the fix said to detach ``fake`` in the loss of the earlier backward, G's own, which then trains nothing ("element
    0 of tensors does not require grad"). The truth: the script raises as written and runs with ``fake.detach()`` in
    D's loss, the later backward's."""
    script = """
        import torch

        torch.manual_seed(0)
        netG, netD = torch.nn.Linear(4, 6), torch.nn.Sequential(torch.nn.Linear(6, 1), torch.nn.Sigmoid())
        opt_g, opt_d = torch.optim.Adam(netG.parameters()), torch.optim.Adam(netD.parameters())
        bce = torch.nn.functional.binary_cross_entropy
        for step in range(3):
            real = torch.randn(8, 6)
            fake = netG(torch.randn(8, 4))
            g_loss = bce(netD(fake), torch.ones(8, 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
            d_loss = (bce(netD(real), torch.ones(8, 1)) + bce(netD(fake{fix}), torch.zeros(8, 1))) / 2
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    assert "fix: use `fake.detach()` at line 15 (`d_loss = " in watched.stdout, watched.stdout
    assert "`): a GAN's D loss must not train what `fake` comes from" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", ".detach()"))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_a_global_state_tested_for_none_comes_in_where_the_encoder_reads_it(tmp_path: Path) -> None:
    """The seq2seq tutorial's ``train()`` with its encoder state kept as a global (``global encoder_hidden``, started
    by ``if encoder_hidden is None:``), called from ``train_iters()``'s loop. "Comes in here" was that ``is None``
    test, and the fix went "at the end of each iteration" of ``train_iters()``, where the name is local and raises
    UnboundLocalError. Now it comes in at the encoder's call, and the detach goes before ``train()``'s own loop over
    the input. The truth: the script raises as written and runs with the printed fix."""
    script = """
        import torch

        torch.manual_seed(0)
        encoder, decoder = torch.nn.GRUCell(3, 5), torch.nn.Linear(5, 3)
        optimizer = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        encoder_hidden = None

        def train(inputs, target):
            global encoder_hidden
            if encoder_hidden is None:
                encoder_hidden = torch.zeros(1, 5)
            optimizer.zero_grad()
            for step in range(inputs.size(0)):
                encoder_hidden = encoder(inputs[step], encoder_hidden)
            loss = (decoder(encoder_hidden) - target).pow(2).mean()
            loss.backward()
            optimizer.step()

        def train_iters(pairs):
            for inputs, target in pairs:
                train(inputs, target)

        train_iters([(torch.randn(4, 1, 3), torch.randn(1, 3)) for _ in range(3)])
        """
    python, watched = run(tmp_path, script, "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    assert "train.py:15 | encoder_hidden = encoder(inputs[step], encoder_hidden)" in watched.stdout, watched.stdout
    assert "fix: add `encoder_hidden = encoder_hidden.detach()` before line 14" in watched.stdout, watched.stdout
    lines = textwrap.dedent(script).splitlines()
    lines.insert(13, "    encoder_hidden = encoder_hidden.detach()")
    python, watched = run(tmp_path, "\n".join(lines))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_iterations_n_stop_a_manual_lightning_step_before_it_moves_its_state_on(tmp_path: Path) -> None:
    """Lightning's manual optimization keeps a step counter and a hidden state on ``self`` and calls the backward
    itself (``self.manual_backward``). ``--iterations 2`` stopped at step 3's backward, after ``training_step`` had
    already counted it and moved ``self.hidden`` on; it now stops as ``training_step`` is called the third time. The
    truth: the state then equals a bare fit limited to 2 batches."""
    script = """
        import atexit
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.rnn, self.head = torch.nn.GRU(3, 8, batch_first=True), torch.nn.Linear(8, 1)
                self.hidden, self.steps = None, 0

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                x, y = batch
                self.steps += 1
                out, self.hidden = self.rnn(x, self.hidden)
                loss = torch.nn.functional.mse_loss(self.head(out[:, -1]), y)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                self.hidden = self.hidden.detach()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.05)


        torch.manual_seed(0)
        model = Model()
        atexit.register(lambda: print("state", model.steps, round(model.hidden.sum().item(), 5)))
        data = TensorDataset(torch.randn(48, 5, 3), torch.randn(48, 1))
        trainer = pl.Trainer(max_epochs=1, limit_train_batches={batches}, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        trainer.fit(model, DataLoader(data, batch_size=8))
        """
    bare, _ = run(tmp_path, script.replace("{batches}", "2"))
    _, watched = run(tmp_path, script.replace("{batches}", "6"), "--iterations", "2")
    assert bare.returncode == watched.returncode == 0, watched.stderr[-2000:]
    state = [line for line in bare.stdout.splitlines() if line.startswith("state")]
    assert state and state[0].startswith("state 2 ")
    assert [line for line in watched.stdout.splitlines() if line.startswith("state")] == state, watched.stdout
    assert "2 iterations watched, then stopped as asked" in watched.stdout, watched.stdout


def test_iterations_n_let_the_last_optimizer_of_a_manual_lightning_step_step_before_stopping(tmp_path: Path) -> None:
    """Lightning's manual optimization with two optimizers and gradient accumulation (the docs' "Use Multiple
    Optimizers (like GANs)" with "Gradient Accumulation"): ``--iterations 1`` asked the trainer to stop at D's first
    step, then raised the stop at G's backward in the same ``training_step`` (G never stepped: a state no bare run
    has). The truth: the state equals a bare fit limited to 2 batches, where both optimizers stepped once."""
    script = """
        import atexit
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class GAN(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.G, self.D = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                g_opt, d_opt = self.optimizers()
                x, _ = batch
                fake = self.G(torch.randn(x.shape[0], 2))
                self.toggle_optimizer(d_opt)
                d_loss = (self.D(x).sigmoid().log().mean() + (1 - self.D(fake.detach()).sigmoid()).log().mean()) / 2
                self.manual_backward(-d_loss)
                if (batch_idx + 1) % 2 == 0:
                    d_opt.step()
                    d_opt.zero_grad()
                self.untoggle_optimizer(d_opt)
                self.toggle_optimizer(g_opt)
                self.manual_backward(-self.D(fake).sigmoid().log().mean() / 2)
                if (batch_idx + 1) % 2 == 0:
                    g_opt.step()
                    g_opt.zero_grad()
                self.untoggle_optimizer(g_opt)

            def configure_optimizers(self):
                return [torch.optim.Adam(self.G.parameters(), lr=1e-2), torch.optim.Adam(self.D.parameters(), lr=1e-2)]


        torch.manual_seed(0)
        model = GAN()
        atexit.register(lambda: print("state", [round(p.sum().item(), 6) for p in model.parameters()]))
        trainer = pl.Trainer(max_epochs=1, limit_train_batches={batches}, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        trainer.fit(model, DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=4))
        """
    bare, _ = run(tmp_path, script.replace("{batches}", "2"))
    _, watched = run(tmp_path, script.replace("{batches}", "6"), "--iterations", "1")
    assert bare.returncode == watched.returncode == 0, watched.stderr[-2000:]
    state = [line for line in bare.stdout.splitlines() if line.startswith("state")]
    assert state and [line for line in watched.stdout.splitlines() if line.startswith("state")] == state, watched.stdout
    assert "1 iteration watched, then stopped as asked, 4 backward calls" in watched.stdout, watched.stdout


def test_teacher_outputs_cached_before_the_loop_are_one_item_with_the_scripts_own_names(tmp_path: Path) -> None:
    """Knowledge distillation with the teacher's outputs computed once, before the training loop, and kept with
    their graphs (haitongli/knowledge-distillation-pytorch's fetch_teacher_outputs, without its ``.data``): the items
    of that one list, built on two lines, were two items, and the fix appended ``out``, a name the script does not
    have. The truth: the script raises in the second epoch, and runs with ``output_teacher_batch.detach()``."""
    script = """
        import torch
        import torch.nn.functional as F

        def fetch_teacher_outputs(teacher_model, dataloader):
            teacher_outputs = []
            for data_batch in dataloader:
                output_teacher_batch = teacher_model(data_batch)
                teacher_outputs.append(output_teacher_batch{fix})
            return teacher_outputs

        def train_kd(model, teacher_outputs, optimizer, dataloader):
            for i, train_batch in enumerate(dataloader):
                output_teacher_batch = teacher_outputs[i]
                loss = F.kl_div(F.log_softmax(model(train_batch), dim=1), F.softmax(output_teacher_batch, dim=1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

        torch.manual_seed(0)
        teacher, student = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
        optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
        batches = [torch.randn(4, 6) for _ in range(3)]
        teacher_outputs = fetch_teacher_outputs(teacher, batches)
        for epoch in range(2):
            train_kd(student, teacher_outputs, optimizer, batches)
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    headline = "backward-twice: 1 thing to fix (4 iterations watched; the loop raised in iteration 4)"
    assert watched.stdout.startswith(headline), watched.stdout
    assert "(`teacher_outputs.append(output_teacher_batch.detach())`)" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", ".detach()"))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_a_meta_loss_summed_over_tasks_starts_at_0_each_meta_iteration(tmp_path: Path) -> None:
    """MAML's meta loss summed over a meta-batch's tasks (vmikulik/maml-pytorch's ``main_loop``), with its reset
    moved out of the loop: the fix was ``meta_loss += loss.item()`` (no ``loss`` in the script; a number would train
    nothing). The truth: the script raises as written; with ``meta_loss = 0`` before the loop over tasks, as printed,
    it runs and ends with the weights of the published order. A total of one term a pass keeps its number fix, in
    the script's name for the term."""
    script = """
        import torch

        torch.manual_seed(0)
        weights = [torch.nn.Parameter(torch.randn(1, 8)), torch.nn.Parameter(torch.randn(8, 1))]
        meta_optimiser = torch.optim.Adam(weights, 0.01)

        def inner_loop():
            x = torch.randn(5, 1)
            temp = [w - 0.01 * g for w, g in zip(weights, torch.autograd.grad(
                torch.relu(x @ weights[0]).matmul(weights[1]).pow(2).mean(), weights, create_graph=True))]
            return torch.relu(x @ temp[0]).matmul(temp[1]).pow(2).mean()

        meta_loss = 0
        for iteration in range(3):
        {reset}
            for task in range(2):
                meta_loss += inner_loop()
            meta_grads = torch.autograd.grad(meta_loss, weights)
            for w, g in zip(weights, meta_grads):
                w.grad = g
            meta_optimiser.step()
        print(round(sum(w.sum().item() for w in weights), 6))
        """
    python, watched = run(tmp_path, script.replace("{reset}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    assert "fix: set `meta_loss = 0` before line 17, so each iteration's backward walks only the losses" in (
        watched.stdout
    ), watched.stdout
    fixed = script.replace("{reset}", "    meta_loss = 0")
    assert fixed.splitlines()[16].strip() == "for task in range(2):"  # line 17: the script starts with a newline
    published = fixed.replace("meta_loss = 0\n        for iteration in range(3):", "for iteration in range(3):")
    python, watched = run(tmp_path, fixed)
    truth, _ = run(tmp_path, published)
    assert python.returncode == watched.returncode == truth.returncode == 0, python.stderr
    assert python.stdout == truth.stdout and watched.stdout.startswith(truth.stdout + "backward-twice: healthy")

    python, watched = run(
        tmp_path,
        """
        import torch

        torch.manual_seed(0)
        model, total = torch.nn.Linear(3, 1), 0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            batch_loss = model(torch.randn(4, 3)).pow(2).mean()
            total += batch_loss
            total.backward()
            optimizer.step()
        """,
        "--no-traceback",
    )
    assert python.returncode == watched.returncode == 1
    assert "fix: add a number instead (`total += batch_loss.item()`) and call backward() on this iteration's loss" in (
        watched.stdout
    ), watched.stdout


FRAMEWORK_STOPS = {
    "lightning": """
        import atexit
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Watchdog(pl.Callback):
            def on_exception(self, trainer, pl_module, exception):
                print("crashed with", type(exception).__name__)

            def on_train_end(self, trainer, pl_module):
                print("finished at step", trainer.global_step)


        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net, self.calls = torch.nn.Linear(4, 1), 0

            def training_step(self, batch, batch_idx):
                self.calls += 1
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


        torch.manual_seed(0)
        model = Model()
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        trainer = pl.Trainer(max_epochs=1, {limit}, accumulate_grad_batches=2, logger=False, callbacks=[Watchdog()],
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator="cpu")
        atexit.register(lambda: print("state", model.calls, trainer.global_step, trainer.state.status.value,
                                      round(sum(p.sum().item() for p in model.parameters()), 6)))
        trainer.fit(model, DataLoader(data, batch_size=8))
        """,
    "transformers": """
        import atexit
        import torch
        from transformers import Trainer, TrainingArguments


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 1)

            def forward(self, x, labels=None):
                return {"logits": self.net(x)}


        class MyTrainer(Trainer):
            calls = 0

            def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
                MyTrainer.calls += 1
                out = model(inputs["x"])
                loss = torch.nn.functional.mse_loss(out["logits"], inputs["labels"])
                return (loss, out) if return_outputs else loss


        torch.manual_seed(0)
        rows = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(64)]
        args = TrainingArguments(output_dir="out", {limit}, per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, report_to=[], save_strategy="no", logging_strategy="no",
                                 use_cpu=True, disable_tqdm=True, seed=0, data_seed=0,
                                 lr_scheduler_type="constant")
        model = Model()
        trainer = MyTrainer(model=model, args=args, train_dataset=rows)
        atexit.register(lambda: print("state", MyTrainer.calls, trainer.state.global_step,
                                      round(sum(p.sum().item() for p in model.parameters()), 6)))
        trainer.train()
        """,
}
LIMITS = {"lightning": ("max_steps=2", "max_steps=-1"), "transformers": ("max_steps=2", "num_train_epochs=1")}


@pytest.mark.parametrize("framework", FRAMEWORK_STOPS)
def test_iterations_n_end_a_frameworks_own_loop_as_its_step_limit_does(tmp_path: Path, framework: str) -> None:
    """A framework's loop with gradient accumulation and the loss in the learner's hook (Lightning's automatic
    ``training_step``, a transformers ``Trainer``'s ``compute_loss``): ``--iterations 2`` raised its stop into the
    framework at the next optimizer step or backward, after the third pass's first batch had run (Lightning then
    called ``on_exception``, where an ``OnExceptionCheckpoint`` writes a checkpoint). Now the framework is asked to stop
    after the second step, as its own early stop asks. The truth: the state and the hooks run equal a bare run with
    ``max_steps=2``."""
    limited, whole = LIMITS[framework]
    bare, _ = run(tmp_path, FRAMEWORK_STOPS[framework].replace("{limit}", limited))
    _, watched = run(tmp_path, FRAMEWORK_STOPS[framework].replace("{limit}", whole), "--iterations", "2")
    assert bare.returncode == watched.returncode == 0, watched.stderr[-2000:]
    told = [line for line in bare.stdout.splitlines() if line.startswith(("state", "finished", "crashed"))]
    assert told and told[-1].startswith("state 4 2 "), bare.stdout
    assert [line for line in watched.stdout.splitlines() if line.startswith(("state", "finished", "crashed"))] == told
    assert "2 iterations watched, then stopped as asked" in watched.stdout, watched.stdout


@pytest.mark.parametrize("framework", FRAMEWORK_STOPS)
def test_iterations_n_let_a_frameworks_loop_that_ends_after_n_steps_on_its_own_end_as_it_does(
    tmp_path: Path, framework: str
) -> None:
    """The same loops, limited to 2 optimizer steps by their own ``max_steps``, under ``--iterations 2``: the stop was
    raised where ``fit()`` / ``train()`` returned, though no pass 3 was to come, and the script's code after it never
    ran ("then stopped as asked"), where python runs it. The truth: the bare run prints its line after the call."""
    limited, _ = LIMITS[framework]
    script = FRAMEWORK_STOPS[framework].replace("{limit}", limited).rstrip() + '\n        print("after the call")\n'
    bare, watched = run(tmp_path, script, "--iterations", "2")
    assert bare.returncode == watched.returncode == 0, watched.stderr[-2000:]
    assert "after the call" in bare.stdout and "after the call" in watched.stdout, watched.stdout
    told = [line for line in bare.stdout.splitlines() if line.startswith("state")]
    assert [line for line in watched.stdout.splitlines() if line.startswith("state")] == told
    assert "backward-twice: healthy (2 iterations watched, 4 backward calls" in watched.stdout, watched.stdout


ACCUMULATED = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(6):
        losses.append(torch.nn.functional.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 1)) / 2)
        if (i + 1) % 2 == 0:
            sum(losses).backward()
            opt.step()
            opt.zero_grad()
            {reset}
    print(round(sum(p.sum().item() for p in model.parameters()), 6))
    """


def test_losses_kept_for_the_next_passs_backward_are_gradient_accumulation_not_a_carried_graph(tmp_path: Path) -> None:
    """Gradient accumulation by a list of losses summed every second pass and emptied after the step (a forum
    answer's form): it runs, yet the tool said "`losses` carries iteration 1's graph into iteration 2" with a fix
    (``losses = [m.detach() for m in losses]``) that makes it raise "does not require grad". A graph built in a pass
    that runs no backward, walked once by the next backward, is not carried. Without the reset the loop raises, and
    the graph iteration 2's backward freed is named as such."""
    python, watched = run(tmp_path, ACCUMULATED.replace("{reset}", "losses = []"))
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout == python.stdout + (
        "backward-twice: healthy (6 iterations watched, 3 backward calls, nothing carried, no retain_graph=True to "
        "drop)\n"
    )
    python, watched = run(tmp_path, ACCUMULATED.replace("{reset}", "pass"), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    assert "1. `losses` carries iteration 1's graph into iteration 4" in watched.stdout, watched.stdout
    assert "which iteration 2's backward already freed" in watched.stdout


def test_a_filters_state_updated_as_x_plus_a_term_is_a_state_not_a_running_total(tmp_path: Path) -> None:
    """A differentiable Kalman filter (the shape of mone27/meteo_imp) carries its state ``x, P`` across time steps
    and updates ``x = x + K @ y``: that spelling got the running total's fix, "``x += loss.item()``" (no ``loss`` in
    the script; applied, NameError). A total is one number; ``x`` is a vector. The truth: the script raises as
    written and runs with the printed detaches before line 11."""
    script = """
        import torch

        torch.manual_seed(0)
        log_q, log_r = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        F, H = torch.tensor([[1.0, 1.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
        optimizer = torch.optim.Adam([log_q, log_r], lr=0.05)
        x, P = torch.zeros(2, 1), torch.eye(2)
        for z in torch.cumsum(torch.randn(4), 0):
        {fix}
            x, P = F @ x, F @ P @ F.T + torch.diag(log_q.exp())
            S = H @ P @ H.T + log_r.exp().view(1, 1)
            K = P @ H.T @ torch.linalg.inv(S)
            y = z.view(1, 1) - H @ x
            x = x + K @ y
            P = (torch.eye(2) - K @ H) @ P
            nll = 0.5 * (y.T @ torch.linalg.inv(S) @ y + torch.logdet(S)).squeeze()
            optimizer.zero_grad()
            nll.backward()
            optimizer.step()
        """
    assert script.splitlines()[10].strip().startswith("x, P = F @ x")  # line 11
    printed = ["fix: add `x = x.detach()` before line 11", "fix: add `P = P.detach()` before line 11"]
    diagnosis = raises_then_runs(tmp_path, script, "second time", printed, "    x = x.detach(); P = P.detach()")
    assert "item()" not in diagnosis


def test_a_layers_state_in_a_sequential_is_named_as_python_spells_it(tmp_path: Path) -> None:
    """A hand-written batch norm inside ``nn.Sequential`` keeps running statistics with their graphs: the name was
    ``model.1.running_mean``, and the fix built on it was a SyntaxError. The truth: the script raises as written and
    runs with the printed fix, ``model[1].running_mean = model[1].running_mean.detach()``."""
    script = """
        import torch


        class MyBN(torch.nn.Module):
            def __init__(self, n):
                super().__init__()
                self.gamma, self.running_mean = torch.nn.Parameter(torch.ones(n)), torch.zeros(n)

            def forward(self, x):
                self.running_mean = 0.9 * self.running_mean + 0.1 * x.mean(0)
                return self.gamma * (x - self.running_mean)


        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), MyBN(4), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            loss = model(torch.randn(8, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        {fix}
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    fix = "model[1].running_mean = model[1].running_mean.detach()"
    assert f"fix: add `{fix}` at the end of each iteration" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", f"    {fix}"))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


@pytest.mark.parametrize("where", ["append after the step", "append before the backward"])
def test_losses_kept_in_a_list_of_the_function_that_runs_the_loop_are_a_note(tmp_path: Path, where: str) -> None:
    """The PyTorch FAQ's history that accumulates (``losses.append(loss)``) in a ``main()`` the script calls: the
    same loop at the top level got the note, in a function "healthy": the list's growth was looked for in globals
    only, and a function's variables are rebound at each call, except the function the loop runs in. The truth: each
    kept loss still holds its graph (``grad_fn``), which ``loss.item()`` would not."""
    steps = ["loss.backward()", "optimizer.step()", "losses.append(loss)"]
    if where == "append before the backward":
        steps = steps[2:] + steps[:2]
    python, watched = run(
        tmp_path,
        """
        import torch


        def main():
            torch.manual_seed(0)
            model = torch.nn.Linear(6, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
            losses = []
            for step in range(6):
                loss = torch.nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 1))
                optimizer.zero_grad()
                {steps}
            print(len(losses), all(kept.grad_fn is not None for kept in losses))


        if __name__ == "__main__":
            main()
        """.replace("{steps}", ("\n" + " " * 16).join(steps)),
    )
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert python.stdout == "6 True\n"
    assert watched.stdout.startswith("6 True\nbackward-twice: 1 note (6 iterations watched)\n"), watched.stdout
    assert "1. `losses` keeps one more iteration's graph alive every iteration" in watched.stdout


def test_two_names_of_a_graph_built_before_the_loop_are_both_in_the_fix(tmp_path: Path) -> None:
    """cleanrl's PPO with the advantages and returns computed with autograd on (no ``torch.no_grad()``), then
    flattened on one line: the item named ``b_advantages`` and ``b_returns``, and its fix changed only the first,
    which still raised. The truth: the script raises as written and runs with both detached, as printed."""
    script = """
        import torch

        torch.manual_seed(0)
        agent = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
        out = agent(torch.randn(16, 3))
        advantages, returns = out[:, 0] * 0.9, out[:, 1] + 1.0
        b_advantages = advantages.reshape(-1); b_returns = returns.reshape(-1)
        {fix}
        for epoch in range(3):
            new = agent(torch.randn(16, 3))
            loss = -(new[:, 0] * b_advantages).mean() + 0.5 * ((new[:, 1] - b_returns) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    both = "`b_advantages = b_advantages.detach()` and `b_returns = b_returns.detach()`"
    moved = "with lines 7 to 9 that they come from"  # the forward too: moved alone, they raise the same
    assert (
        f"fix: compute `b_advantages` and `b_returns` inside the loop, {moved} (or {both}, if they" in watched.stdout
    ), watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", both.replace("` and `", "; ").strip("`")))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_a_parameter_a_setup_loops_variable_still_holds_is_named_by_its_modules_path(tmp_path: Path) -> None:
    """The mean teacher's EMA written without ``torch.no_grad()`` (CuriousAI/mean-teacher#28), after a setup loop
    ``for p in ema_model.parameters(): p.requires_grad_(False)`` that leaves ``p`` holding the last parameter: the
    item named ``p`` beside ``ema_model[0].weight``. The truth: the script raises as written and runs with the
    update under ``torch.no_grad()``, as printed."""
    script = """
        import copy
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        ema_model = copy.deepcopy(model)
        for p in ema_model.parameters():
            p.requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            x = torch.randn(6, 4)
            out, ema_out = model(x), ema_model(x)
            loss = out.pow(2).mean() + ((out.softmax(1) - ema_out.softmax(1)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            {guard}for ema_param, param in zip(ema_model.parameters(), model.parameters()):
                {indent}ema_param.copy_(0.9 * ema_param + 0.1 * param)
        """
    python, watched = run(tmp_path, script.replace("{guard}", "").replace("{indent}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    label = watched.stdout.splitlines()[1]
    assert label.startswith("1. `ema_model[i].weight` and `ema_model[i].bias` (i = 0, 2) carry"), watched.stdout
    assert "`p`" not in watched.stdout and "fix: run line 19 under `with torch.no_grad():`" in watched.stdout
    fixed = script.replace("{guard}", "with torch.no_grad():\n                ").replace("{indent}", "    ")
    python, watched = run(tmp_path, fixed)
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: healthy"), watched.stdout


def test_an_item_set_after_the_loss_was_built_is_found_by_the_name_the_saved_tensor_was_assigned(
    tmp_path: Path,
) -> None:
    """A forum question (discuss.pytorch.org/t/169583): ``uexp = u.exp()``, ``loss = uexp.sum()``, then
    ``uexp[:, 0] = 0.0`` before the backward. The change adds no node to the graph the backward walks, so the item was
    the generic in-place advice; the saved tensor's own line names it, and a later line of the same code changes it
    in place. The truth: the script raises as written and runs with the printed copy."""
    script = """
        import torch

        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        for it in range(3):
            u = lin(torch.randn(2, 3))
            uexp = u.exp()
            loss = uexp.sum()
            {fix}uexp[:, 0] = 0.0
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    printed = [
        "1. line 11 changed in place a tensor this backward needs",
        "train.py:11 | uexp[:, 0] = 0.0",
        "fix: add `uexp = uexp.clone()` before line 11\n",
    ]
    fix = "uexp = uexp.clone()\n" + " " * 12
    raises_then_runs(tmp_path, script, "modified by an inplace operation", printed, fix)


@pytest.mark.parametrize("iterations", [2, 8])
def test_iterations_n_stop_a_loop_whose_backward_calls_start_late_after_n_passes(
    tmp_path: Path, iterations: int
) -> None:
    """cleanrl's DQN trains only once ``global_step > learning_starts``, every ``train_frequency`` steps: the loop was
    not known as the iteration's until its first backward, so ``--iterations 2`` ran 7 passes here ("7 iterations
    watched, then stopped as asked"). The loop that holds the backward call, as written, stops at pass N+1 from its
    first pass. The truth: the passes printed are the first N, as a bare loop of N passes prints them."""
    script = """
        import torch

        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([w], lr=0.1)
        for global_step in range(10):
            if global_step > 4 and global_step % 3 == 0:
                loss = (w * torch.randn(3)).pow(2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            print("pass", global_step, round(w.sum().item(), 6))
        """
    bare, _ = run(tmp_path, script.replace("range(10)", f"range({iterations})"))
    _, watched = run(tmp_path, script, "--iterations", str(iterations))
    assert bare.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith(bare.stdout + "backward-twice: "), watched.stdout
    assert f"({iterations} iterations watched, then stopped as asked" in watched.stdout, watched.stdout


def test_a_regulariser_a_model_computes_once_in_its_init_is_computed_inside_the_loop_not_the_model(
    tmp_path: Path,
) -> None:
    """DeepCTR-Torch#69: ``self.reg_loss`` computed once in ``__init__``, added to every loss, and
    ``retain_graph=True`` to quiet the first error. The fix was "build `model` inside the loop": a model built afresh
    each pass never trains. The truth: the script raises as written; with ``model.reg_loss`` computed at the top of
    the loop and the retain removed, it runs and the weights move."""
    script = """
        import torch


        class BaseModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(5, 1)
                self.reg_loss = 1e-3 * torch.sum(self.linear.weight**2)


        torch.manual_seed(0)
        model = BaseModel()
        optim = torch.optim.Adagrad(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 5), torch.randint(0, 2, (16, 1)).float()
        before = model.linear.weight.detach().clone()
        for epoch in range(3):
            {fix}
            loss = torch.nn.functional.binary_cross_entropy(torch.sigmoid(model.linear(x)), y)
            total_loss = loss + model.reg_loss
            optim.zero_grad()
            total_loss.backward({retain})
            optim.step()
        print("moved", not torch.equal(before, model.linear.weight.detach()))
        """
    python, watched = run(
        tmp_path, script.replace("{fix}", "").replace("{retain}", "retain_graph=True"), "--no-traceback"
    )
    assert python.returncode == watched.returncode == 1 and "modified by an inplace operation" in python.stderr
    assert "fix: compute `model.reg_loss` inside the loop (or `model.reg_loss = model.reg_loss.detach()`" in (
        watched.stdout
    ), watched.stdout
    assert "build `model`" not in watched.stdout
    fixed = script.replace("{fix}", "model.reg_loss = 1e-3 * torch.sum(model.linear.weight**2)").replace("{retain}", "")
    python, watched = run(tmp_path, fixed)
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("moved True\nbackward-twice: healthy"), watched.stdout


def test_a_perturbation_whose_gradient_the_loop_asks_for_stays_a_leaf_in_the_fix(tmp_path: Path) -> None:
    """The "free" adversarial training of mahyarnajibi/FreeAdversarialTraining (main_free.py) with the perturbation's
    update written out of place: ``global_noise_data`` carries the graph into the next minibatch. The fix was
    ``global_noise_data.detach()``, after which ``torch.autograd.grad(loss, global_noise_data)`` raises "One of the
    differentiated Tensors does not require grad". The truth: the script raises as written and runs with the printed
    ``.detach().requires_grad_()``."""
    script = """
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        global_noise_data = torch.zeros(8, 10, requires_grad=True)
        for i in range(3):
            inputs, target = torch.randn(8, 10), torch.randint(0, 3, (8,))
            {fix}
            loss = torch.nn.functional.cross_entropy(model(inputs + global_noise_data), target)
            optimizer.zero_grad()
            (grad,) = torch.autograd.grad(loss, global_noise_data, retain_graph=True)
            loss.backward()
            global_noise_data = torch.clamp(global_noise_data + 0.1 * torch.sign(grad), -0.3, 0.3)
            optimizer.step()
        """
    fix = "global_noise_data = global_noise_data.detach().requires_grad_()"
    printed = [f"fix: add `{fix}` before line 11"]
    raises_then_runs(tmp_path, script, "second time", printed, fix)


def test_a_list_of_totals_that_starts_as_zeros_is_detached_item_by_item_where_a_tensor(tmp_path: Path) -> None:
    """dragen1860's MAML keeps ``losses_q = [0 for _ in range(update_step + 1)]`` and adds each step's query loss
    into it; kept on ``self`` across meta-iterations, it carries the graph. The fix ``[m.detach() for m in ...]``
    raised AttributeError on the items still 0. The truth: the script raises as written and runs with the printed
    fix."""
    script = """
        import torch


        class Meta:
            def __init__(self):
                self.losses_q = [0 for _ in range(3)]

            def forward(self, w, x):
                losses_q = self.losses_q
                losses_q[0] += (w * x).pow(2).mean()
                losses_q[2] += (w * x).abs().mean()
                return losses_q[-1]


        torch.manual_seed(0)
        meta, w = Meta(), torch.nn.Parameter(torch.ones(4))
        optimizer = torch.optim.SGD([w], lr=0.1)
        for step in range(3):
            loss = meta.forward(w, torch.randn(4))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            {fix}
        """
    fix = "meta.losses_q = [m.detach() if torch.is_tensor(m) else m for m in meta.losses_q]"
    raises_then_runs(tmp_path, script, "second time", [f"fix: add `{fix}` at the end of each iteration"], fix)


def test_a_running_total_a_manual_lightning_step_keeps_on_self_is_a_note(tmp_path: Path) -> None:
    """Lightning's manual optimization with ``self.running_loss = 0`` in ``__init__`` and ``self.running_loss +=
    loss`` after ``manual_backward`` (for its log): "healthy". The module's attributes worth reading were kept by the
    size of its ``__dict__``, which stays when a number becomes a tensor. The truth, printed by the script: the total
    chains every step's graph (one addition node a step)."""
    script = """
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.net, self.running_loss = torch.nn.Linear(5, 1), 0

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.net(x), y)
                {manual}
                self.running_loss += loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        torch.manual_seed(0)
        model, chained = Model(), 0
        data = TensorDataset(torch.randn(48, 5), torch.randn(48, 1))
        trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(model, DataLoader(data, batch_size=8))
        node = model.running_loss.grad_fn
        while node is not None and type(node).__name__ == "AddBackward0":
            chained, node = chained + 1, node.next_functions[0][0]
        print("chained", chained)
        """.replace("{manual}", ("\n" + " " * 16).join(MANUAL_STEP))
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr[-2000:]
    assert "chained 6" in python.stdout  # 6 steps, one addition each (the first onto 0)
    report = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert report.startswith("backward-twice: 1 note (6 iterations watched)"), report
    assert "1. `self.running_loss` keeps one more iteration's graph alive every iteration" in report, report


def test_an_ensembles_backward_on_an_item_of_a_growing_list_is_told_to_use_this_passs_loss(tmp_path: Path) -> None:
    """discuss.pytorch.org/t/120497: an ensemble's losses appended to ``list_of_loss``, which is never cleared, and
    ``list_of_loss[i].backward()`` for model ``i``: from the second batch on, item ``i`` is an earlier pass's loss.
    The fix was "keep detached copies ..., or clear it each iteration" (detached: no gradient; cleared: IndexError),
    and a note on the same list repeated the item. The truth: the script raises as written and runs with
    ``loss.backward()``, as printed."""
    script = """
        import torch

        torch.manual_seed(0)
        models = [torch.nn.Linear(16, 3) for _ in range(3)]
        optimizers = [torch.optim.Adam(model.parameters(), lr=1e-3) for model in models]
        list_of_loss = []
        for j in range(3):
            images, labels = torch.randn(4, 16), torch.randint(0, 3, (4,))
            for i in range(3):
                loss = torch.nn.functional.cross_entropy(models[i](images), labels)
                list_of_loss.append(loss)
                optimizers[i].zero_grad()
                {backward}.backward()
                optimizers[i].step()
        """
    python, watched = run(tmp_path, script.replace("{backward}", "list_of_loss[i]"), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr
    assert watched.stdout.startswith("backward-twice: 1 thing to fix (4 iterations watched;"), watched.stdout
    assert "fix: call `loss.backward()`: `list_of_loss[...]` reads an item an earlier pass appended" in watched.stdout
    python, watched = run(tmp_path, script.replace("{backward}", "loss"))
    assert python.returncode == watched.returncode == 0, python.stderr
    assert watched.stdout.startswith("backward-twice: 1 note"), watched.stdout  # the list still grows: a note


def test_a_state_a_second_loop_carries_under_another_name_is_shown_where_that_loop_builds_it(tmp_path: Path) -> None:
    """A first loop trains; a second carries ``h`` through an alias (``hidden = model(x) + h``, then ``h = hidden``).
    The tracer follows only the first loop's first passes, so the line comes from the source: it was ``h =
    torch.zeros(4, 2)`` before the loop, a leaf, "built here". The truth: ``h = h.detach()`` before line 14 runs."""
    python, watched = run(
        tmp_path,
        """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(4)]
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        h = torch.zeros(4, 2)
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            hidden = model(x) + h
            h = hidden
            ((hidden - y) ** 2).mean().backward()
            opt.step()
        """,
    )
    assert python.returncode == watched.returncode == 1 and "a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "train.py:14 | hidden = model(x) + h" in diagnosis and "built here" not in diagnosis, diagnosis
    assert "fix: add `h = h.detach()` before line 14" in diagnosis, diagnosis


@pytest.mark.parametrize(
    ("script", "fix"),
    [
        (  # the alias at the pass's end, after the step: read after the step, ``pred`` alone held the graph
            """
            import torch
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(4)]
            for x, y in data:
                opt.zero_grad(); ((model(x) - y) ** 2).mean().backward(); opt.step()
            prev = torch.zeros(4, 2)
            for x, y in data:
                opt.zero_grad()
                pred = model(x) + prev
                ((pred - y) ** 2).mean().backward()
                opt.step()
                prev = pred
            """,
            ("prev", 12),
        ),
        (  # in functions: the warm-up's loop stayed the innermost one, and the fix went before the second loop
            """
            import torch
            def warmup(model, opt, data):
                for x, y in data:
                    opt.zero_grad(); ((model(x) - y) ** 2).mean().backward(); opt.step()
            def train(model, opt, data):
                memory = torch.zeros(4, 2)
                for x, y in data:
                    opt.zero_grad()
                    out = torch.tanh(model(x)) * 0.5 + memory
                    memory = out
                    ((out - y) ** 2).mean().backward()
                    opt.step()
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(4)]
            warmup(model, opt, data)
            train(model, opt, data)
            """,
            ("memory", 10),
        ),
    ],
)
def test_after_an_earlier_loop_the_state_the_next_pass_reads_is_named_and_detached_where_it_comes_in(
    tmp_path: Path, script: str, fix: tuple[str, int]
) -> None:
    """Backward calls in two loops one after the other: the run is split by the optimizer's steps, untraced, and
    the names are read after each step. The item named the alias the pass assigns first (``pred``, ``out``) with a
    fix that, applied, still raised, or put the detach before the second loop (it runs once). The truth: the name
    the pass reads before it assigns it, detached where it comes in, runs (checked here as printed)."""
    name, line = fix
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1 and "a second time" in python.stderr
    diagnosis = watched.stderr[watched.stderr.index("backward-twice:") :]
    printed = f"fix: add `{name} = {name}.detach()` before line {line}"
    assert f"`{name}` carries" in diagnosis and printed in diagnosis, diagnosis
    lines = textwrap.dedent(script).split("\n")
    indent = re.match(r"\s*", lines[line - 1]).group(0)  # type: ignore[union-attr]
    fixed = "\n".join([*lines[: line - 1], f"{indent}{name} = {name}.detach()", *lines[line - 1 :]])
    done = subprocess.run([sys.executable, "-c", fixed], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # the fix as printed runs


def test_a_script_that_runs_bt_diagnose_itself_is_judged_by_its_own_loop_under_the_command(tmp_path: Path) -> None:
    """A script that calls ``bt.diagnose(step)`` before its loop, under ``backward-twice watch``: the command's report
    named "retain_graph=True at line 9 keeps buffers no backward uses" in a script with no retain at all (diagnose's
    runs keep the buffers, and the command saw them as the script's), and counted diagnose's runs as iterations (6).
    The truth: the loop is 3 plain passes; the command judges those, diagnose's own report its runs."""
    script = """
        import torch
        import backward_twice as bt

        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(8, 4)

        def step():
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()

        print(bt.diagnose(step, models=[net], optimizers=[opt]))
        for i in range(3):
            step()
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    diagnosed = "backward-twice: healthy (3 runs of step, 3 backward calls, nothing carried"
    assert python.stdout.startswith(diagnosed) and watched.stdout.startswith(diagnosed), watched.stdout
    last = watched.stdout.strip().splitlines()[-1]
    assert last.startswith("backward-twice: healthy (3 iterations watched, 3 backward calls, nothing carried"), last
    assert "retain_graph=True at line" not in watched.stdout, watched.stdout


def test_a_scripts_own_watch_with_iterations_stops_where_it_does_under_python(tmp_path: Path) -> None:
    """A script with ``with bt.watch(iterations=2):`` around its loop, run by ``backward-twice watch``: the command's
    line tracer left the script's watch none of its own, so its stop came at pass 3's first backward, after pass 3's
    random draw and its ``zero_grad()`` (the gradients after it: None). The truth: python stops at the top of pass 3;
    the command's report says the script's own watch judged the loop."""
    script = """
        import torch
        import backward_twice as bt

        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with bt.watch(iterations=2) as w:
            for i in range(5):
                print("top of pass", i + 1)
                x = torch.randn(8, 4)
                opt.zero_grad()
                net(x).pow(2).mean().backward()
                opt.step()
        print("grad after the stop:", None if net.weight.grad is None else "kept", torch.rand(1).item())
        print(w)
        """
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    lines = watched.stdout.strip().splitlines()
    assert lines[:-1] == python.stdout.strip().splitlines(), watched.stdout
    assert "top of pass 3" not in python.stdout and "kept" in python.stdout, python.stdout
    assert lines[-1].startswith("backward-twice: no backward call seen outside your code's own bt.watch"), lines[-1]


def test_an_error_a_backward_raises_that_the_script_catches_is_a_note_not_the_loops_error(tmp_path: Path) -> None:
    """A gradient hook that raises on a bad batch and a ``try:`` around the backward that skips it: the run ended
    with status 0, and the report said "1 thing to fix (...; the loop raised in iteration 2) ... fix this error first".
    The truth: python prints the skip and "done"; the loop went on past the error, as written."""
    script = _guarded_loop('print(f"iteration {i}: skipped ({error})")\n        continue') + 'print("done")\n'
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith(python.stdout), watched.stdout
    report = watched.stdout[len(python.stdout) :]
    headline = "backward-twice: 1 note (4 iterations watched; a backward raised in iteration 2, and your code caught"
    assert report.startswith(headline), report
    assert "1. a backward raised FloatingPointError in iteration 2, and your code caught it" in report, report
    assert "fix this error first" not in report and "to fix" not in report, report


def test_a_gan_whose_g_steps_first_with_its_graph_retained_makes_ds_fake_after_gs_step(tmp_path: Path) -> None:
    """Lightning's basic GAN order, G's backward first with ``retain_graph=True`` (the forum's band-aid for D's
    second walk through ``fake``), then G's step, then D's loss on the same ``fake``: D's backward raises the in-place
    error (G's step changed the weights G's forward saved). The fix's hint was "(a GAN: G's loss on a fresh
    D(fake))", G's advice, for D's backward. D's loss trains D, and reaches G only through ``fake``: the truth is
    the GAN's own fix, ``fake.detach()`` in D's loss, with the band-aid gone (the script raises as written, and runs
    as printed, healthy)."""
    script = """
        import torch

        torch.manual_seed(0)
        netG = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
        netD = torch.nn.Sequential(torch.nn.Linear(6, 1), torch.nn.Sigmoid())
        opt_g, opt_d = torch.optim.Adam(netG.parameters()), torch.optim.Adam(netD.parameters())
        bce = torch.nn.functional.binary_cross_entropy
        for step in range(3):
            real, z = torch.randn(8, 6), torch.randn(8, 4)
            fake = netG(z)
            g_loss = bce(netD(fake), torch.ones(8, 1))
            opt_g.zero_grad()
            g_loss.backward(retain_graph=True)
            opt_g.step()
        {fix}
            d_loss = bce(netD(real), torch.ones(8, 1)) + bce(netD(fake), torch.zeros(8, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "modified by an inplace" in python.stderr, python.stderr
    fix = (
        "fix: use `fake.detach()` in the loss line 19's backward walks: the step at line 15 changed the weights `fake` "
        "comes from, and this loss does not train them; remove retain_graph=True at line 14"
    )
    assert fix in watched.stdout, watched.stdout
    as_printed = script.replace("{fix}", "").replace("netD(fake), torch.zeros", "netD(fake.detach()), torch.zeros")
    python, fixed = run(tmp_path, as_printed.replace("backward(retain_graph=True)", "backward()"))
    assert python.returncode == fixed.returncode == 0, python.stderr
    assert "backward-twice: healthy" in fixed.stdout, fixed.stdout


def test_an_error_caught_around_the_whole_loop_ended_the_loop(tmp_path: Path) -> None:
    """A ``try:`` around the call that runs the whole loop (``train()``), the error logged and the script done: the
    report said the loop "went on past it", a note. The truth: the loop ended at iteration 2; nothing ran after."""
    script = GUARDED + textwrap.dedent(
        """
        def train():
            for i in range(4):
                x = batch(i)
                opt.zero_grad()
                net(x).pow(2).mean().backward()
                opt.step()

        try:
            train()
        except FloatingPointError as error:
            print("training aborted:", error)
        """
    )
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith(python.stdout), watched.stdout
    report = watched.stdout[len(python.stdout) :]
    assert report.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "caught" not in report, report


def test_a_running_total_backwarded_after_each_micro_batch_is_kept_as_a_number(tmp_path: Path) -> None:
    """Gradient accumulation written as ``total = total + loss_term; total.backward()`` in the micro-batch loop, the
    optimizer's step after it: the second micro-batch's backward walks the first's freed terms. The fix was "build
    `total` inside the loop that runs line 10's backward, or use `total.detach()` there", read as nonsense (it is
    built there). The truth: the script raises as written, and runs with each micro-batch's loss named and
    backwarded alone, the total a number."""
    script = """
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
        adam = torch.optim.Adam(net.parameters(), lr=0.01)
        X, Y = torch.randn(12, 4), torch.randn(12, 1)
        for epoch in range(3):
            adam.zero_grad()
            total = 0
            for xb, yb in zip(X.split(4), Y.split(4)):
                {fix}
            adam.step()
        """
    broken = "total = total + ((net(xb) - yb) ** 2).mean()\n                total.backward()"
    fixed = "loss = ((net(xb) - yb) ** 2).mean()\n                loss.backward()\n                total += loss.item()"
    printed = (
        "fix: name this iteration's loss (`loss = ((net(xb) - yb) ** 2).mean()`), call `loss.backward()`, and add a "
        "number instead (`total += loss.item()`)"
    )
    python, watched = run(tmp_path, script.replace("{fix}", broken), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr, python.stderr
    assert printed in watched.stdout, watched.stdout
    python, healthy = run(tmp_path, script.replace("{fix}", fixed))
    assert python.returncode == healthy.returncode == 0, python.stderr
    assert healthy.stdout.startswith("backward-twice: healthy"), healthy.stdout


def test_an_error_a_backward_raises_that_the_loop_raises_again_as_another_is_named_as_the_traceback_ends(
    tmp_path: Path,
) -> None:
    """A gradient hook's FloatingPointError, caught and raised again as ``ValueError("bad batch 1") from error``: the
    report named the FloatingPointError ("the error says: non-finite gradient"), where python's traceback ends with
    the ValueError that ended the loop."""
    script = _guarded_loop('raise ValueError(f"bad batch {i}") from error')
    python, watched = run(tmp_path, script, "--no-traceback")
    assert python.returncode == watched.returncode == 1, watched.stderr
    assert python.stderr.strip().endswith("ValueError: bad batch 1"), python.stderr
    assert "1. the loop raised ValueError\n" in watched.stdout, watched.stdout
    assert 'raised "bad batch 1"' in watched.stdout and "non-finite" not in watched.stdout, watched.stdout


RUNNING_TOTAL = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    running_loss = 0.0
    for batch_idx in range(6):
        if batch_idx % 2 == 0:
            optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
        loss.backward()
        if (batch_idx + 1) % 2 == 0:
            optimizer.step()
        running_loss += {kept} * 3
    print("total", round(float(running_loss), 4))
    """


def _in_a_function(script: str) -> str:
    """The script's loop in a ``train()`` of its own, its total a local (accelerate's examples' ``total_loss``)."""
    head, loop = script.split("    running_loss = 0.0\n")
    body = textwrap.indent("running_loss = 0.0\n" + textwrap.dedent(loop).replace("print(", "return print("), "    ")
    return head + textwrap.indent("def train():\n" + body + "\n\ntrain()\n", "    ")


@pytest.mark.parametrize("where", ["global", "local"])
@pytest.mark.parametrize("iterations", [[], ["--iterations", "2"], ["--iterations", "3"]])
def test_a_running_total_kept_as_a_tensor_is_a_note_however_long_the_watch(
    tmp_path: Path, iterations: list, where: str
) -> None:
    """Gradient accumulation with its running total kept as a tensor (a forum thread's loop, ``loss.item()`` dropped):
    the whole run gave "`running_loss` keeps one more iteration's graph alive every iteration", ``--iterations 2``
    "healthy ... nothing carried" (for a total local to the function that runs the loop, ``--iterations 3`` too).
    Read where the watch stops, the total holds a graph reaching back over both iterations, which no backward walks
    again: the same note. The total kept as a number is healthy either way."""
    shaped = _in_a_function if where == "local" else (lambda script: script)
    python, watched = run(tmp_path, shaped(RUNNING_TOTAL.replace("{kept}", "loss")), *iterations)
    assert python.returncode == watched.returncode == 0, watched.stderr
    assert "1. `running_loss` keeps one more iteration's graph alive every iteration" in watched.stdout, watched.stdout
    python, watched = run(tmp_path, shaped(RUNNING_TOTAL.replace("{kept}", "loss.item()")), *iterations)
    assert "backward-twice: healthy" in watched.stdout, watched.stdout


def test_a_backward_lightning_runs_raises_at_the_training_steps_return_not_at_trainer_fit(tmp_path: Path) -> None:
    """A hidden state kept on the module across batches under automatic optimization (Lightning issue #655, without
    its detach): the line shown raising was ``trainer.fit(...)``, the learner's nearest frame to Lightning's
    backward. It is the ``return loss`` of the ``training_step`` whose loss that backward walked. The truth: python
    raises in the second batch; with the printed detach, it runs."""
    script = """
        import pytorch_lightning as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.rnn = torch.nn.GRU(4, 4, batch_first=True)
                self.previous_hidden = None

            def training_step(self, batch, batch_idx):
                x, y = batch
                output, hidden = self.rnn(x, self.previous_hidden)
                self.previous_hidden = hidden{fix}
                loss = torch.nn.functional.mse_loss(output, y)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        torch.manual_seed(0)
        data = TensorDataset(torch.randn(16, 3, 4), torch.randn(16, 3, 4))
        trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(Model(), DataLoader(data, batch_size=4))
        """
    python, watched = run(tmp_path, script.replace("{fix}", ""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    assert "train.py:18 | return loss" in watched.stdout, watched.stdout
    assert 'its backward raised "Trying to backward through the graph a second time"' in watched.stdout, watched.stdout
    assert "trainer.fit(" not in watched.stdout, watched.stdout
    assert "fix: add `self.previous_hidden = self.previous_hidden.detach()` after line 16" in watched.stdout
    python, watched = run(tmp_path, script.replace("{fix}", ".detach()"))
    assert python.returncode == watched.returncode == 0, python.stderr


def test_a_regulariser_a_trainer_builds_once_in_its_init_is_computed_in_compute_loss(tmp_path: Path) -> None:
    """A Hugging Face ``Trainer`` subclass that builds an L2 term from the weights in ``__init__`` and adds it in
    ``compute_loss``: the fix detached it after its line, which runs but trains nothing through it (the weights end as
    with the term's weight 0), and the error was shown at ``trainer.train()``. The truth: python raises at step 2; the
    term computed in ``compute_loss`` runs and trains other weights than without it."""
    script = """
        import torch
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


        class RegTrainer(Trainer):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.l2_penalty = sum(p.pow(2).sum() for p in self.model.parameters())

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                outputs = model(**inputs)
                loss = outputs.loss + 0.5 * {penalty}
                return (loss, outputs) if return_outputs else loss


        class ToyData(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return {"input_ids": torch.arange(i, i + 4) % 20, "labels": torch.tensor(i % 2)}


        torch.manual_seed(0)
        config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=8, max_position_embeddings=8, num_labels=2)
        model = BertForSequenceClassification(config)
        args = TrainingArguments(output_dir="out", max_steps=2, per_device_train_batch_size=4, report_to="none",
                                 use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
        trainer = RegTrainer(model=model, args=args, train_dataset=ToyData())
        trainer.train()
        print("final", round(sum(float(p.sum()) for p in model.parameters()), 6))
        """
    python, watched = run(tmp_path, script.replace("{penalty}", "self.l2_penalty"), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "backward through the graph a second time" in python.stderr
    assert "return (loss, outputs) if return_outputs else loss" in watched.stdout, watched.stdout
    assert "trainer.train()" not in watched.stdout, watched.stdout
    assert "fix: compute `self.l2_penalty` in `compute_loss` (line 11), from each step's weights" in watched.stdout
    inside = script.replace("{penalty}", "sum(p.pow(2).sum() for p in model.parameters())")
    python, _ = run(tmp_path, inside)
    without, _ = run(tmp_path, script.replace("{penalty}", "0"))
    assert python.returncode == without.returncode == 0, python.stderr + without.stderr
    assert python.stdout.split("final")[-1] != without.stdout.split("final")[-1], python.stdout


LIGHTNING_RUNNING_TOTAL = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.running_loss = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
{fix}        self.running_loss = self.running_loss + loss
        return self.running_loss / (batch_idx + 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
model = Regressor()
trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(model, DataLoader(data, batch_size=4))
print(model.net.weight.sum().item())
"""


def test_a_running_total_a_lightning_step_returns_is_started_again_at_a_line_of_training_step(tmp_path: Path) -> None:
    """A running mean of the losses kept on ``self`` and returned (Lightning-AI/pytorch-lightning#9336): the fix was
    "add `self.running_loss = self.running_loss.detach()` at the end of each iteration", which Lightning's loop has
    no line for (placed before the ``return``, the step's loss has no graph). The truth: the total set to 0 before
    the line that adds to it, each step's backward walks its own loss, the weights those of the detach in an
    ``on_train_batch_end`` hook (the only place it runs)."""
    python, watched = run(tmp_path, LIGHTNING_RUNNING_TOTAL.format(fix=""), "--no-traceback")
    assert python.returncode == watched.returncode == 1 and "second time" in python.stderr, python.stderr[-2000:]
    assert "fix: set `self.running_loss = 0` before line 16, so each iteration's backward" in watched.stdout, (
        watched.stdout
    )
    fixed, watched = run(tmp_path, LIGHTNING_RUNNING_TOTAL.format(fix="        self.running_loss = 0\n"))
    assert fixed.returncode == watched.returncode == 0, fixed.stderr[-2000:]
    assert watched.stdout.split("\n")[0] == fixed.stdout.strip() and "backward-twice: healthy" in watched.stdout
    hook = "    def on_train_batch_end(self, *args):\n        self.running_loss = self.running_loss.detach()\n\n"
    by_hand = LIGHTNING_RUNNING_TOTAL.format(fix="").replace(
        "    def configure_optimizers", f"{hook}    def configure_optimizers"
    )
    python, _ = run(tmp_path, by_hand)
    assert python.returncode == 0 and python.stdout == fixed.stdout, (python.stdout, fixed.stdout)
