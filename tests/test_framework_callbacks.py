"""A callback of the learner's that a framework's trainer calls each step and that keeps the model's aux loss in a
list: a transformers ``TrainerCallback`` (``on_step_end``) and a Lightning ``Callback`` (``on_train_batch_end``). The
callback sits only in the trainer's own list of callbacks (``trainer.callback_handler.callbacks[1]``,
``trainer.callbacks[0]``), deeper than the names walk went (transformers) or past the objects it had read of the
trainer's internals (Lightning): both said "healthy ... nothing carried". The truth, read by plain Python after the
run: the list keeps one graph per step (none when it keeps ``.item()`` numbers or detached tensors). The scripts run
as a learner's script or notebook cell runs them: the trainer is a global."""

from __future__ import annotations

import os
import re
import runpy
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_learner_scripts import run

from backward_twice.watcher import watch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HF_CALLBACK_KEEPS_AUX = """
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback, TrainingArguments


class TinyMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(6, 2)
        self.experts = torch.nn.ModuleList([torch.nn.Linear(6, 3) for _ in range(2)])
        self.aux_loss = None

    def forward(self, x, labels=None):
        gate = F.softmax(self.router(x), -1)
        logits = sum(gate[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))
        self.aux_loss = (gate.mean(0) ** 2).sum() * 2
        return {"loss": F.cross_entropy(logits, labels) + 0.01 * self.aux_loss, "logits": logits}


class AuxLossCallback(TrainerCallback):
    def __init__(self):
        self.aux_history = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.aux_history.append(model.aux_loss)


torch.manual_seed(0)
x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
data = [{"x": x[i], "labels": y[i]} for i in range(16)]
with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(output_dir=output_dir, max_steps=4, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = Trainer(model=TinyMoE(), args=args, train_dataset=data, callbacks=[AuxLossCallback()])
    trainer.train()
kept = next(c for c in trainer.callback_handler.callbacks if isinstance(c, AuxLossCallback)).aux_history
print("graphs kept", sum(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in kept))
"""

LIGHTNING_CALLBACK_KEEPS_AUX = """
import torch
import pytorch_lightning as pl


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(6, 2)

    def training_step(self, batch, batch_idx):
        self.aux_loss = self.net.weight.pow(2).mean()
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]) + 0.01 * self.aux_loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


class AuxLosses(pl.Callback):
    def __init__(self):
        self.aux_losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.aux_losses.append(pl_module.aux_loss)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(16, 6), torch.randint(0, 2, (16,)))
trainer = pl.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", callbacks=[AuxLosses()])
trainer.fit(Lit(), torch.utils.data.DataLoader(data, batch_size=4))
kept = trainer.callbacks[0].aux_losses
print("graphs kept", sum(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in kept))
"""


def _watched(script: str, folder: Path, call: str) -> tuple[str, Any]:
    """``script`` run as a learner's script or notebook cell runs (its names are globals, its file is on disk), with
    ``bt.watch()`` around ``call`` (``trainer.train()``): what it printed as it ended, and the watch."""
    indent = script[: script.index(call)].rsplit("\n", 1)[1]
    source = script.replace(f"{indent}{call}\n", f"{indent}with watch() as w:\n{indent}    {call}\n", 1)
    path = folder / "cell.py"
    path.write_text(textwrap.dedent(source))
    namespace: dict[str, Any] = {"__name__": "__main__", "watch": watch}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    kept = namespace["kept"]
    return f"graphs kept {sum(getattr(t, 'grad_fn', None) is not None for t in kept)}", namespace["w"]


def test_a_list_a_transformers_callback_keeps_the_aux_loss_in_is_a_note_at_its_append(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    truth, w = _watched(HF_CALLBACK_KEEPS_AUX, tmp_path, "trainer.train()")
    assert truth == "graphs kept 4"
    said = str(w)
    assert said.startswith("backward-twice: 1 note (4 iterations watched)"), said
    assert "1. `self.aux_history` keeps one more iteration's graph alive every iteration" in said, said
    assert "cell.py:31 | self.aux_history.append(model.aux_loss)\n" in said, said
    assert "^^^^^^^^^^^^^^^^ grows here" in said, said
    fix = "`self.aux_history.append(model.aux_loss.item())`, or `model.aux_loss.detach()` if you need the tensor"
    assert f"keep in mind: {fix}" in said, said


@pytest.mark.parametrize("kept", ["model.aux_loss.item()", "model.aux_loss.detach()"])
def test_a_transformers_callback_that_keeps_numbers_or_detached_tensors_is_healthy(kept: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = HF_CALLBACK_KEEPS_AUX.replace("append(model.aux_loss)", f"append({kept})")
    truth, w = _watched(script, tmp_path, "trainer.train()")
    assert truth == "graphs kept 0"
    assert w.healthy and str(w).startswith("backward-twice: healthy (4 iterations watched"), str(w)


def test_a_list_a_lightning_callback_keeps_the_aux_loss_in_is_a_note_at_its_append(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    call = "trainer.fit(Lit(), torch.utils.data.DataLoader(data, batch_size=4))"
    truth, w = _watched(LIGHTNING_CALLBACK_KEEPS_AUX, tmp_path, call)
    assert truth == "graphs kept 4"
    said = str(w)
    assert "1. `self.aux_losses` keeps one more iteration's graph alive every iteration" in said, said
    assert "cell.py:24 | self.aux_losses.append(pl_module.aux_loss)\n" in said, said
    assert "keep in mind: `self.aux_losses.append(pl_module.aux_loss.item())`" in said, said


def test_a_lightning_callback_that_keeps_numbers_is_healthy(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    script = LIGHTNING_CALLBACK_KEEPS_AUX.replace("append(pl_module.aux_loss)", "append(pl_module.aux_loss.item())")
    call = "trainer.fit(Lit(), torch.utils.data.DataLoader(data, batch_size=4))"
    truth, w = _watched(script, tmp_path, call)
    assert truth == "graphs kept 0"
    assert w.healthy, str(w)


def test_a_list_a_transformers_callback_keeps_graphs_in_is_a_note_under_the_command(tmp_path: Path) -> None:
    """The probe's script, unmodified, under ``backward-twice watch``: the callback is only in the trainer's list."""
    pytest.importorskip("transformers")
    python, watched = run(tmp_path, HF_CALLBACK_KEEPS_AUX)
    assert python.returncode == watched.returncode == 0, watched.stderr[-2000:]
    assert "graphs kept 4" in python.stdout and "graphs kept 4" in watched.stdout
    said = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert said.startswith("backward-twice: 1 note (4 iterations watched)"), said
    assert "1. `self.aux_history` keeps one more iteration's graph alive every iteration" in said, said
    assert "train.py:31 | self.aux_history.append(model.aux_loss)\n" in said, said
    fix = "`self.aux_history.append(model.aux_loss.item())`, or `model.aux_loss.detach()` if you need the tensor"
    assert f"keep in mind: {fix}" in said, said


def _in_a_main(script: str, first: str) -> str:
    """``script`` with its lines from ``first`` on moved into ``def main():`` and a call of it (as many HF scripts
    are written): the trainer is then a variable of ``main``, not a global."""
    head, rest = script.split(first, 1)
    return head + "def main():\n" + textwrap.indent(first + rest, "    ") + "\n\nmain()\n"


@pytest.mark.parametrize("keeps", ["model.aux_loss", "model.aux_loss.item()"])
def test_a_transformers_callback_in_a_trainer_that_main_holds_is_judged_as_one_a_global_holds(
    keeps: str, tmp_path: Path
) -> None:
    """``def main(): trainer = Trainer(..., callbacks=[AuxLossCallback()]); trainer.train()``: the trainer was a
    function's variable, taken as rebound at each call, so the callback's growing list was never counted: "healthy".
    ``main``'s frame runs the call that holds the trainer's whole loop: its variables last as a script's globals do.
    The truth (plain Python after the run): 4 graphs kept; none with ``.item()``."""
    pytest.importorskip("transformers")
    script = _in_a_main(HF_CALLBACK_KEEPS_AUX.replace("append(model.aux_loss)", f"append({keeps})"), "torch.manual")
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 0, watched.stderr[-2000:]
    kept = 0 if keeps.endswith("item()") else 4
    assert f"graphs kept {kept}" in python.stdout and f"graphs kept {kept}" in watched.stdout
    said = watched.stdout[watched.stdout.index("backward-twice:") :]
    if kept:
        assert said.startswith("backward-twice: 1 note (4 iterations watched)"), said
        assert "1. `self.aux_history` keeps one more iteration's graph alive every iteration" in said, said
    else:
        assert said.startswith("backward-twice: healthy (4 iterations watched"), said


# Lightning's automatic optimization, an auxiliary loss backpropagated in ``on_train_batch_end`` after Lightning's own
# backward and step, with the backward overridden to retain (Lightning-AI/pytorch-lightning#356, #1771).
HOOKS_AFTER_THE_STEP = """    def backward(self, loss, *args, **kwargs):
        loss.backward(retain_graph=True)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        outputs["aux"].backward()
        opt.step()
"""
LIGHTNING_AUX_AFTER_THE_STEP = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class TwoHeads(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.main_head, self.aux_head = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        feats = self.trunk(x)
        return {"loss": F.mse_loss(self.main_head(feats), y), "aux": F.mse_loss(self.aux_head(feats), y.abs())}

HOOKS
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
x = torch.randn(12, 4)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(TwoHeads(), torch.utils.data.DataLoader(data, batch_size=4))
""".replace("HOOKS", HOOKS_AFTER_THE_STEP)


def test_a_backward_in_a_hook_after_the_frameworks_step_is_that_steps_iteration(tmp_path: Path) -> None:
    """The iterations were split at each optimizer step, so the hook's backward of the first batch's outputs came
    in iteration 2: "a tensor no name of yours holds carries iteration 1's graph into iteration 2; retain_graph=True
    only hides it". The truth: bare Python raises the in-place error at the first batch, in the hook's backward,
    after Lightning's step changed the weights the trunk's forward saved; no graph is carried (nothing of batch 1 is
    read by batch 2). An iteration begins with its forward: the hook's calls belong to the step before them."""
    pytest.importorskip("pytorch_lightning")
    python, watched = run(tmp_path, LIGHTNING_AUX_AFTER_THE_STEP)
    assert python.returncode == watched.returncode == 1
    assert "modified by an inplace operation" in python.stderr.splitlines()[-1], python.stderr[-400:]
    said = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert said.startswith("backward-twice: 1 thing to fix (1 iteration watched; the loop raised in iteration 1)"), said
    assert "carries" not in said and "computed with the old weights" in said, said


# A Lightning module that sums its losses on ``self`` for an epoch-end log, with tensors (not ``.item()``).
LIGHTNING_LOSS_SUMMED_ON_SELF = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.epoch_loss = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.epoch_loss = self.epoch_loss + loss
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
state = {"model": Reg()}
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
with watch() as w:
    trainer.fit(state["model"], torch.utils.data.DataLoader(data, batch_size=4))
"""


@pytest.mark.parametrize("summed", ["self.epoch_loss + loss", "loss + self.epoch_loss", "self.epoch_loss * 0.9 + loss"])
def test_a_total_a_lightning_step_sums_on_self_is_named_as_the_step_spells_it(summed: str, tmp_path: Path) -> None:
    """The note named the total by the script's own path to the module, `state['model'].epoch_loss`, though the line
    it quotes, where the learner changes it, reads ``self.epoch_loss = self.epoch_loss + loss`` (or ``loss +
    self.epoch_loss``, or a decayed sum). The truth (plain Python after the run): the total's graph reaches the loss of
    each of the 4 steps."""
    pytest.importorskip("pytorch_lightning")
    path = tmp_path / "cell.py"
    path.write_text(LIGHTNING_LOSS_SUMMED_ON_SELF.replace("self.epoch_loss + loss", summed))
    namespace: dict[str, Any] = {"__name__": "__main__", "watch": watch}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    todo, seen = [namespace["state"]["model"].epoch_loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(child for child, _ in node.next_functions)
    assert sum(type(node).__name__ == "MseLossBackward0" for node in seen) == 4
    [note] = [item for item in namespace["w"].report.items if "epoch_loss" in item.label]
    assert note.label.startswith("`self.epoch_loss` keeps one more iteration's graph alive"), note.label
    assert "`self.epoch_loss`" in note.why and "state[" not in note.why + note.fix, note


# The auxiliary loss kept on self by ``training_step`` and backpropagated in ``on_after_backward``, after Lightning's
# own backward of the returned loss freed the trunk's buffers the two share.
LIGHTNING_AUX_AFTER_BACKWARD = LIGHTNING_AUX_AFTER_THE_STEP.replace(
    'return {"loss": F.mse_loss(self.main_head(feats), y), "aux": F.mse_loss(self.aux_head(feats), y.abs())}',
    "self.aux = F.mse_loss(self.aux_head(feats), y.abs())\n        return F.mse_loss(self.main_head(feats), y)",
).replace(
    HOOKS_AFTER_THE_STEP,
    """    def on_after_backward(self):
        self.aux.backward()
""",
)


def test_a_second_backward_after_the_frameworks_own_is_fixed_in_the_loss_the_step_returns(tmp_path: Path) -> None:
    """The fix read "add retain_graph=True to line 42's backward only", line 42 being ``trainer.fit(...)``: applied,
    a TypeError. The truth: bare Python raises at the first batch's hook; returning ``main + self.aux`` from the step
    (one backward) runs."""
    pytest.importorskip("pytorch_lightning")
    assert "on_after_backward" in LIGHTNING_AUX_AFTER_BACKWARD and "self.aux = " in LIGHTNING_AUX_AFTER_BACKWARD
    python, watched = run(tmp_path, LIGHTNING_AUX_AFTER_BACKWARD)
    assert python.returncode == watched.returncode == 1
    assert "backward through the graph a second time" in python.stderr.splitlines()[-1], python.stderr[-400:]
    said = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "the graph the framework's backward freed" in said, said
    fix = re.search(r"fix: add `self.aux` to the loss your step returns and remove the backward at line (\d+)", said)
    assert fix is not None and "retain_graph" not in said, said
    assert LIGHTNING_AUX_AFTER_BACKWARD.split("\n")[int(fix.group(1)) - 1].strip() == "self.aux.backward()", said
    summed = LIGHTNING_AUX_AFTER_BACKWARD.replace(
        "return F.mse_loss(self.main_head(feats), y)", "return F.mse_loss(self.main_head(feats), y) + self.aux"
    ).replace("        self.aux.backward()\n", "        pass\n")
    (tmp_path / "fixed").mkdir()
    fixed, _ = run(tmp_path / "fixed", summed)
    assert fixed.returncode == 0, fixed.stderr[-400:]


HF_STEP_OVERRIDE_AUX_BACKWARD = """
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x, labels=None):
        feats = torch.tanh(self.trunk(x))
        return {"loss": F.cross_entropy(self.head(feats), labels), "feats": feats}


class AuxTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        self.aux = outputs["feats"].pow(2).mean()
        loss = outputs["loss"]
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.aux.backward()
        return loss


torch.manual_seed(0)
x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
data = [{"x": x[i], "labels": y[i]} for i in range(12)]
with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(output_dir=output_dir, max_steps=3, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = AuxTrainer(model=Net(), args=args, train_dataset=data)
    trainer.train()
print("trained", float(trainer.model.trunk.weight.sum()))
"""


def test_a_trainers_step_override_with_a_second_backward_is_fixed_in_the_loss_compute_loss_returns(
    tmp_path: Path,
) -> None:
    """A Hugging Face ``Trainer`` subclass whose ``training_step`` calls ``super().training_step`` and then
    ``self.aux.backward()``: the fix read "add `self.aux` to the loss your step returns", the loss that step
    returns being the detached one the framework already backpropagated (added there, the aux trains nothing). The
    truth (no helpers): bare Python raises at the first step; ``compute_loss`` returning ``loss + self.aux``, the
    hook's backward removed, runs."""
    pytest.importorskip("transformers")
    summed = HF_STEP_OVERRIDE_AUX_BACKWARD.replace(
        "        return (loss, outputs) if return_outputs else loss",
        "        loss = loss + self.aux\n        return (loss, outputs) if return_outputs else loss",
    ).replace("        self.aux.backward()\n", "")
    said = _said_then_fixed_runs(tmp_path, HF_STEP_OVERRIDE_AUX_BACKWARD, summed)
    fix = re.search(
        r"fix: add `self.aux` to the loss `compute_loss` returns \(line (\d+)\) and remove the backward at line (\d+)",
        said,
    )
    assert fix is not None, said
    lines = HF_STEP_OVERRIDE_AUX_BACKWARD.split("\n")
    assert lines[int(fix.group(1)) - 1].strip() == "return (loss, outputs) if return_outputs else loss", said
    assert lines[int(fix.group(2)) - 1].strip() == "self.aux.backward()", said


def _said_then_fixed_runs(tmp_path: Path, script: str, fixed_script: str) -> str:
    """What the tool said of ``script``, which raises "a second time" under python and the tool alike, once
    ``fixed_script`` (its fix applied) is seen to run to its end under python."""
    python, watched = run(tmp_path, script)
    assert python.returncode == watched.returncode == 1
    assert "backward through the graph a second time" in python.stderr.splitlines()[-1], python.stderr[-400:]
    (tmp_path / "fixed").mkdir()
    fixed, _ = run(tmp_path / "fixed", fixed_script)
    assert fixed.returncode == 0 and "trained" in fixed.stdout, fixed.stderr[-400:]
    return watched.stderr[watched.stderr.index("backward-twice:") :]


HF_CALLBACK_AUX_BACKWARD = (
    HF_STEP_OVERRIDE_AUX_BACKWARD.replace(
        '        return {"loss": F.cross_entropy(self.head(feats), labels), "feats": feats}',
        "        self.aux = feats.pow(2).mean()\n"
        '        return {"loss": F.cross_entropy(self.head(feats), labels), "feats": feats}',
    )
    .replace(
        "class AuxTrainer(Trainer):",
        "class AuxBackward(TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, model=None, **kwargs):\n"
        "        model.aux.backward()\n\n\n"
        "class AuxTrainer(Trainer):",
    )
    .replace("args=args, train_dataset=data)", "args=args, train_dataset=data, callbacks=[AuxBackward()])")
)


def test_a_trainer_callbacks_second_backward_is_fixed_in_the_loss_the_model_returns(tmp_path: Path) -> None:
    """A ``TrainerCallback.on_step_end`` backpropagating ``model.aux`` after the ``Trainer``'s own backward: "add
    `self.aux` (`model.aux` here) to the loss your step returns", a step the learner never wrote, whose returned loss
    is detached. The truth (no helpers): bare Python raises at the first step; the model's forward returning its
    loss plus ``self.aux``, the callback's backward removed, runs."""
    pytest.importorskip("transformers")
    script = HF_CALLBACK_AUX_BACKWARD.replace(
        "import Trainer, TrainingArguments", "import Trainer, TrainerCallback, TrainingArguments"
    )
    script = script.replace("    def training_step", "    def unused_step")  # the Trainer's own step runs
    assert "on_step_end" in script and "unused_step" in script
    summed = script.replace(
        '"loss": F.cross_entropy(self.head(feats), labels),',
        '"loss": F.cross_entropy(self.head(feats), labels) + self.aux,',
    ).replace("        model.aux.backward()\n", "        pass\n")
    said = _said_then_fixed_runs(tmp_path, script, summed)
    assert "fix: add `self.aux` (`model.aux` here) to the loss your model's forward returns" in said, said


# A learner's step that calls backward on the loss it returns: the trainer then runs its own on the same loss.
LIGHTNING_STEP_WITH_ITS_OWN_BACKWARD = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        loss.backward()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
model = Reg()
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
"""

HF_COMPUTE_LOSS_WITH_ITS_OWN_BACKWARD = """
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class Reg(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x, labels=None):
        return {"logits": self.net(x)}


class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(inputs["x"])
        loss = F.mse_loss(outputs["logits"], inputs["labels"])
        loss.backward()
        return (loss, outputs) if return_outputs else loss


torch.manual_seed(0)
x, y = torch.randn(16, 4), torch.randn(16, 1)
data = [{"x": x[i], "labels": y[i]} for i in range(16)]
model = Reg()
with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(output_dir=output_dir, max_steps=4, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = MyTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
"""

OWN_BACKWARD_IN_THE_STEP = {
    "lightning": ("pytorch_lightning", LIGHTNING_STEP_WITH_ITS_OWN_BACKWARD, "trainer.fit("),
    "transformers": ("transformers", HF_COMPUTE_LOSS_WITH_ITS_OWN_BACKWARD, "trainer.train()"),
}


def _fitted(script: str, path: Path, call: str = "") -> dict[str, Any]:
    """``script`` run from ``path`` (``call``: the line to watch, under ``with watch() as w:``): its names."""
    if call:
        indent = script[: script.index(call)].rsplit("\n", 1)[1]
        script = script.replace(f"{indent}{call}", f"{indent}with watch() as w:\n{indent}    {call}", 1)
    path.write_text(textwrap.dedent(script))
    namespace: dict[str, Any] = {"__name__": "__main__", "watch": watch}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("framework", OWN_BACKWARD_IN_THE_STEP)
def test_a_step_that_calls_backward_on_the_loss_it_returns_is_told_to_remove_that_call(
    framework: str, tmp_path: Path
) -> None:
    """``loss.backward()`` in a Lightning ``training_step`` (or a ``Trainer``'s ``compute_loss``) that returns the
    loss (VinAIResearch/PSENet-Image-Enhancement#1): the fix was "add retain_graph=True to the earlier backward only",
    which keeps a backward that trains nothing, and a graph, every step. The truth (no helpers): as written the
    trainer's own backward raises; without the learner's call it trains (the thread's fix)."""
    package, script, call = OWN_BACKWARD_IN_THE_STEP[framework]
    pytest.importorskip(package)
    with pytest.raises(RuntimeError, match="second time"):
        _fitted(script, tmp_path / "as_written.py")
    removed = _fitted(script.replace("        loss.backward()\n", ""), tmp_path / "removed.py")
    torch = removed["torch"]
    torch.manual_seed(0)
    assert not torch.equal(removed["model"].net[0].weight, removed["Reg"]().net[0].weight)  # it trained
    with pytest.raises(RuntimeError, match="second time") as raised:
        _fitted(script, tmp_path / "watched.py", call)
    line = script.splitlines().index("        loss.backward()") + 1
    returned = next(
        i for i, text in enumerate(script.splitlines(), 1) if text.strip().startswith("return") and "loss" in text
    )
    step = "training_step" if framework == "lightning" else "compute_loss"
    fix = (
        f"remove `loss.backward()` at line {line}: the trainer calls backward() itself on the loss `{step}` returns "
        f"(line {returned})"
    )
    assert f"fix: {fix}" in "\n".join(raised.value.__notes__), raised.value.__notes__


def test_a_lightning_step_that_calls_backward_on_another_loss_returns_their_sum_instead(tmp_path: Path) -> None:
    """``aux_loss.backward()`` in a ``training_step`` that returns ``loss`` (the two share a trunk): the fix offered
    a retain on the learner's call, which runs, but Lightning zeroes the gradients before its own backward, so the
    auxiliary loss trained nothing. The truth (no helpers): as written Lightning's backward raises; returning the
    sum trains the auxiliary head."""
    pytest.importorskip("pytorch_lightning")
    script = LIGHTNING_STEP_WITH_ITS_OWN_BACKWARD.replace(
        "        loss = F.mse_loss(self.net(x), y)\n        loss.backward()\n",
        "        h = self.net[:2](x)\n        loss = F.mse_loss(self.net[2](h), y)\n"
        "        aux_loss = h.pow(2).mean()\n        aux_loss.backward()\n",
    )
    assert "aux_loss.backward()" in script
    with pytest.raises(RuntimeError, match="second time") as raised:
        _fitted(script, tmp_path / "watched.py", "trainer.fit(")
    lines = script.splitlines()
    line, returned = lines.index("        aux_loss.backward()") + 1, lines.index("        return loss") + 1
    fix = (
        f"remove `aux_loss.backward()` at line {line} and add `aux_loss` to the loss `training_step` returns "
        f"(`loss + aux_loss`, line {returned}): the trainer calls backward() only on that loss"
    )
    assert f"fix: {fix}" in "\n".join(raised.value.__notes__), raised.value.__notes__
    as_a_dict = script.replace("        return loss\n", '        return {"loss": loss, "aux": aux_loss.detach()}\n')
    with pytest.raises(RuntimeError, match="second time") as raised:  # the dict's loss is the one it trains
        _fitted(as_a_dict, tmp_path / "dict.py", "trainer.fit(")
    assert f"fix: {fix}" in "\n".join(raised.value.__notes__), raised.value.__notes__
    summed = script.replace("        aux_loss.backward()\n", "").replace(
        "        return loss\n", "        return loss + aux_loss\n"
    )
    fitted = _fitted(summed, tmp_path / "summed.py")
    assert fitted["trainer"].global_step == 4


ACTOR_CRITIC_ACCELERATED = """
import torch
import torch.nn.functional as F
from accelerate import Accelerator
torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
actor = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
critic = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-2)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
actor, critic, actor_opt, critic_opt = accelerator.prepare(actor, critic, actor_opt, critic_opt)
for s, r in [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]:
    action = actor(s)
    actor_loss = -critic(torch.cat([s, action], 1)).mean()
    actor_opt.zero_grad()
    accelerator.backward(actor_loss)
    actor_opt.step()
    q = critic(torch.cat([s, action], 1))
    critic_loss = F.mse_loss(q, r)
    critic_opt.zero_grad()
    accelerator.backward(critic_loss)
    critic_opt.step()
"""


def test_a_critic_loss_on_the_actors_output_under_accelerate_detaches_it_as_without_accelerate(tmp_path: Path) -> None:
    """accelerate's prepared optimizers wrap the torch ones: the actor's wrapper was taken for an optimizer that did
    not step and trains the actor, so the fix was "compute `action` again after line 17's step" (the critic's loss
    then trains the actor too), where the same loop without accelerate, or in a function, got `action.detach()`. The
    truth (no helpers): as written, "a second time" at the critic's backward; with `action.detach()` in the critic's
    input, it runs."""
    pytest.importorskip("accelerate")
    script = tmp_path / "actor_critic.py"
    script.write_text(ACTOR_CRITIC_ACCELERATED)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        runpy.run_path(str(script))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        runpy.run_path(str(script))
    [item] = w.report.items
    line = ACTOR_CRITIC_ACCELERATED.split("\n").index("    q = critic(torch.cat([s, action], 1))") + 1
    assert item.fix.startswith(f"use `action.detach()` at line {line} "), item.fix
    script.write_text(
        ACTOR_CRITIC_ACCELERATED.replace(
            "critic(torch.cat([s, action], 1))\n", "critic(torch.cat([s, action.detach()], 1))\n"
        )
    )
    runpy.run_path(str(script))


# A Lightning module with manual optimization that accumulates two batches per step and carries a GRU's hidden state
# between its training_step calls on ``self`` (truncated BPTT by hand, as Lightning-AI/pytorch-lightning#17848
# sketches it), with the forum's ``retain_graph=True``; FIX switches in the detach.
LIGHTNING_ACCUMULATED_HIDDEN = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Seq(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.rnn = torch.nn.GRU(3, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 1)
        self.hidden = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        out, self.hidden = self.rnn(x, self.hidden)
        loss = F.mse_loss(self.head(out), y) / 2
        self.manual_backward(loss, retain_graph=RETAIN)
        if (batch_idx + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        FIX

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(8, 4, 3), torch.randn(8, 4, 1))
model = Seq()
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=4, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=2))
print("weights", [round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()])
"""


def test_a_retain_a_later_training_step_of_one_accumulated_step_needs_goes_with_the_carried_fix(tmp_path: Path) -> None:
    """Two batches per optimizer step: the framework's iteration holds two calls of ``training_step``, and the second
    walks the first's graph through ``self.hidden``. The retain was "needed: a later backward of the same iteration
    walks the buffers it kept", beside the carried item's detach of ``self.hidden``. The truth (no helpers): as
    written the in-place error at batch 3; without the retain "a second time" at batch 2; with the detach, the retain
    kept or removed trains to the same weights."""
    pytest.importorskip("pytorch_lightning")
    as_written = LIGHTNING_ACCUMULATED_HIDDEN.replace("RETAIN", "True").replace("        FIX\n", "")
    for folder in ("as_written", "kept", "removed"):
        (tmp_path / folder).mkdir()
    python, watched = run(tmp_path / "as_written", as_written, "--verbose")
    assert python.returncode == watched.returncode == 1
    assert "modified by an inplace operation" in python.stderr.splitlines()[-1], python.stderr[-400:]
    said = watched.stderr[watched.stderr.index("backward-twice:") :]
    fix = "fix: add `self.hidden = self.hidden.detach()` after line 18, and remove retain_graph=True at line 20"
    assert fix in said, said
    evidence = watched.stdout.splitlines()  # --verbose: the evidence after the traceback's diagnosis
    retain = next(line for line in evidence if "retain_graph=True at" in line and "manual_backward" in line)
    assert "goes with the carried fix" in retain and "a later call of `training_step` needs it" in retain, retain
    assert "needed in" not in retain, retain
    fixed = LIGHTNING_ACCUMULATED_HIDDEN.replace("        FIX\n", "        self.hidden = self.hidden.detach()\n")
    kept, _ = run(tmp_path / "kept", fixed.replace("RETAIN", "True"))
    removed, _ = run(tmp_path / "removed", fixed.replace("RETAIN", "False"))
    assert kept.returncode == removed.returncode == 0, kept.stderr[-400:] + removed.stderr[-400:]
    weights = [line for line in kept.stdout.splitlines() if line.startswith("weights")]
    assert weights and weights == [line for line in removed.stdout.splitlines() if line.startswith("weights")]


LIGHTNING_LOCAL_STATE = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.cell = torch.nn.GRUCell(3, 4)
        self.head = torch.nn.Linear(4, 1)
        self.h = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        h = self.cell(x, self.h)
        self.h = h
        loss = F.mse_loss(self.head(h), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        FIX

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
model = M()
before = model.cell.weight_ih.detach().clone()
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=4, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=2))
print("cell trained:", not torch.equal(before, model.cell.weight_ih))
"""


def test_a_state_a_lightning_step_keeps_on_self_is_detached_on_self_not_as_the_steps_local(tmp_path: Path) -> None:
    """``h = self.cell(x, self.h); self.h = h``: the fix named the step's local, "add `h = h.detach()` before line
    19", after which the loss reads a detached ``h`` and the cell never trains (a probe: its weights unchanged). The
    local ends with each call; ``self.h`` carries the graph into the next. The truth (no helpers): as written "a
    second time" at batch 2; with ``self.h`` detached after line 19 it runs and the cell trains."""
    pytest.importorskip("pytorch_lightning")
    for folder in ("as_written", "fixed"):
        (tmp_path / folder).mkdir()
    python, watched = run(tmp_path / "as_written", LIGHTNING_LOCAL_STATE.replace("        FIX\n", ""))
    assert python.returncode == watched.returncode == 1
    assert "backward through the graph a second time" in python.stderr.splitlines()[-1], python.stderr[-400:]
    said = watched.stderr[watched.stderr.index("backward-twice:") :]
    assert "fix: add `self.h = self.h.detach()` after line 19" in said, said
    fixed, _ = run(
        tmp_path / "fixed",
        LIGHTNING_LOCAL_STATE.replace("        FIX\n", "").replace(
            "        self.h = h\n", "        self.h = h\n        self.h = self.h.detach()\n"
        ),
    )
    assert fixed.returncode == 0 and "cell trained: True" in fixed.stdout, fixed.stderr[-400:]


@pytest.mark.parametrize("framework", ["transformers", "pytorch_lightning"])
def test_a_callbacks_list_is_a_note_where_iterations_2_stops_the_frameworks_loop(
    framework: str, tmp_path: Path
) -> None:
    """The callback appends after the optimizer step, where the names were last read, and a framework's stop read
    nothing more: at ``--iterations 2`` the list held one graph at each read and the run was "healthy", though it
    holds 2 graphs when the framework's call returns (the bare run with ``max_steps=2`` keeps 2). The stop now reads
    what step 2 left held, as a loop of the learner's own does."""
    pytest.importorskip(framework)
    script = HF_CALLBACK_KEEPS_AUX if framework == "transformers" else LIGHTNING_CALLBACK_KEEPS_AUX
    (tmp_path / "bare").mkdir()
    (tmp_path / "watched").mkdir()
    python, _ = run(tmp_path / "bare", script.replace("max_steps=4", "max_steps=2"))
    assert python.returncode == 0 and "graphs kept 2" in python.stdout, python.stderr[-2000:]
    _, watched = run(tmp_path / "watched", script, "--iterations", "2")
    assert watched.returncode == 0, watched.stderr[-2000:]
    said = watched.stdout[watched.stdout.index("backward-twice:") :]
    assert said.startswith("backward-twice: 1 note (2 iterations watched, then stopped as asked)"), said
    listed = "self.aux_history" if framework == "transformers" else "self.aux_losses"
    assert f"1. `{listed}` keeps one more iteration's graph alive every iteration" in said, said
