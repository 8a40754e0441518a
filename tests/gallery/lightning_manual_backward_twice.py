"""Lightning's manual-optimization docs example that passes `retain_graph=True` through `self.manual_backward` and
backs the discriminator's loss twice before its optimizer steps.

Source: Lightning-AI/pytorch-lightning pull request #5771 ("Improve manual optimization API",
https://github.com/Lightning-AI/pytorch-lightning/pull/5771), docs/source/common/optimizers.rst, the manual
optimization example as reviewed there (and PR #4026's earlier `self.backward(loss_b, opt_d, retain_graph=True)`
version, https://github.com/Lightning-AI/pytorch-lightning/pull/4026): `opt_g, opt_d = self.optimizers()`, `loss_a =
...`, `self.manual_backward(loss_a)`, `opt_g.step()`, `opt_g.zero_grad()`, then `loss_b = ...`, "# pass in any args
that loss.backward() normally takes", `self.manual_backward(loss_b, retain_graph=True)`, `self.manual_backward(loss_b)`,
`opt_d.step()`, `opt_d.zero_grad()`. The optimizer argument of `manual_backward` (removed in Lightning 1.4) is left
out, as the 2.x API requires. The example's `loss_a = ...` and `loss_b = ...` are filled in with the generator and
discriminator losses of a small GAN (the docs' own GAN example: `g_X = self.G(z)`, the discriminator on the real
batch and on `g_X.detach()`, BCE-with-logits), at CPU size: data 6 features, latent 4, hidden 8, batches of 4;
`Trainer(accelerator="cpu", limit_train_batches=..., max_epochs=1)` with no logger, checkpointing, progress bar or
model summary.

All three backwards run from `training_step` in the learner's file (`self.manual_backward` calls `loss.backward()`).
"""

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = "lightning"
WAYS = ("watch", "command")  # Lightning runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
FEATURES = 6
LATENT = 4

TRUTH = {
    "error": None,
    "retains": {"@d_backward_retain": {"verdict": "needed", "runs": 3, "needed_runs": 3}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class GANModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Sequential(nn.Linear(LATENT, 8), nn.ReLU(), nn.Linear(8, FEATURES))
        self.D = nn.Sequential(nn.Linear(FEATURES, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        X, _ = batch
        batch_size = X.shape[0]
        real_label = torch.ones((batch_size, 1), device=self.device)
        fake_label = torch.zeros((batch_size, 1), device=self.device)

        # do anything you want
        z = torch.randn(batch_size, LATENT, device=self.device)
        g_X = self.G(z)
        loss_a = F.binary_cross_entropy_with_logits(self.D(g_X), real_label)
        self.manual_backward(loss_a)  # @g_backward
        opt_g.step()
        opt_g.zero_grad()

        # do anything you want
        errD_real = F.binary_cross_entropy_with_logits(self.D(X), real_label)
        errD_fake = F.binary_cross_entropy_with_logits(self.D(g_X.detach()), fake_label)
        loss_b = errD_real + errD_fake

        # pass in any args that loss.backward() normally takes
        self.manual_backward(loss_b, retain_graph=True)  # @d_backward_retain
        self.manual_backward(loss_b)  # @d_backward
        opt_d.step()
        opt_d.zero_grad()

    def configure_optimizers(self):
        g_opt = torch.optim.Adam(self.G.parameters(), lr=1e-3)
        d_opt = torch.optim.Adam(self.D.parameters(), lr=1e-3)
        return g_opt, d_opt


def build() -> dict:
    torch.manual_seed(0)
    data = torch.randn(4 * (ITERATIONS + 1), FEATURES)
    dataset = TensorDataset(data, torch.zeros(len(data), dtype=torch.long))
    return {"model": GANModule(), "train_dataloader": DataLoader(dataset, batch_size=4)}


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
