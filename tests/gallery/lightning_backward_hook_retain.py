"""A LightningModule under automatic optimization that overrides Lightning's `backward` hook to call
`loss.backward(retain_graph=True)` on the single loss its `training_step` returns.

Source: liyingyanUCAS/WoTE issue #4 ("A question about backword process",
https://github.com/liyingyanUCAS/WoTE/issues/4), asking why navsim/planning/training/agent_lightning_module.py line 60
sets `loss.backward(retain_graph=True)`; the hook was added to Lightning for exactly this, Lightning-AI/pytorch-lightning
issue #356 ("Support for retain_graph=True", https://github.com/Lightning-AI/pytorch-lightning/issues/356: "put a hook
for the backward pass and you can override if you need retain_graph"), today's `LightningModule.backward(self, loss,
*args, **kwargs)`. The module around it is navsim's `AgentLightningModule` (autonomousvision/navsim,
navsim/planning/training/agent_lightning_module.py, which WoTE builds on): `self.agent = agent`, `_step(batch,
logging_prefix)`: `features, targets = batch`, `prediction = self.agent.forward(features)`, `loss =
self.agent.compute_loss(features, targets, prediction)`, `self.log(...)`, `return loss`; `training_step` returns
`self._step(batch, "train")`; `configure_optimizers` returns `self.agent.get_optimizers()`. The backward override's
body is the line the issue quotes; the rest of WoTE's file could not be read, so nothing else is added to it.
Retyped at CPU size: the agent is a small MLP planner from 8 features to a trajectory of 3 poses (x, y, heading) with
an L1 loss against made-up targets and Adam (lr 1e-3); batches of 4; `Trainer(accelerator="cpu",
limit_train_batches=..., max_epochs=1)` with no logger, checkpointing, progress bar or model summary; `self.log` left
out (there is no logger).

Lightning calls `training_step` inside the closure it hands to `optimizer.step`, then the module's `backward` hook,
whose `loss.backward(retain_graph=True)` runs in the learner's file.
"""

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = "lightning"
WAYS = ("watch", "command")  # Lightning runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
FEATURES = 8
POSES = 3

TRUTH = {
    "error": None,
    "retains": {"@backward_retain": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.planner = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, POSES * 3))

    def forward(self, features):
        return {"trajectory": self.planner(features).view(-1, POSES, 3)}

    def compute_loss(self, features, targets, prediction):
        return F.l1_loss(prediction["trajectory"], targets)

    def get_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class AgentLightningModule(pl.LightningModule):
    def __init__(self, agent):
        super().__init__()
        self.agent = agent

    def _step(self, batch, logging_prefix):
        features, targets = batch
        prediction = self.agent.forward(features)
        loss = self.agent.compute_loss(features, targets, prediction)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def backward(self, loss, *args, **kwargs):
        loss.backward(retain_graph=True)  # @backward_retain

    def configure_optimizers(self):
        return self.agent.get_optimizers()


def build() -> dict:
    torch.manual_seed(0)
    features = torch.randn(4 * (ITERATIONS + 1), FEATURES)
    targets = torch.randn(4 * (ITERATIONS + 1), POSES, 3)
    dataset = TensorDataset(features, targets)
    return {"model": AgentLightningModule(Agent()), "train_dataloader": DataLoader(dataset, batch_size=4)}


def run(state: dict, iterations: int = ITERATIONS, callbacks=()) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=iterations,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(state["model"], state["train_dataloader"])  # @fit


if __name__ == "__main__":
    run(build())
