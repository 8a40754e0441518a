"""Lightning's own basic GAN, trained with manual optimization: two optimizers and `self.manual_backward`.

Source: Lightning-AI/pytorch-lightning, examples/pytorch/domain_templates/generative_adversarial_net.py (the
LightningModule `GAN` with `self.automatic_optimization = False`; its `training_step` takes `opt_g, opt_d =
self.optimizers()`, trains the generator between `self.toggle_optimizer(opt_g)` and `self.untoggle_optimizer(opt_g)`
with `opt_g.zero_grad()`, `self.manual_backward(g_loss)`, `opt_g.step()`, then the discriminator on the real images
and on `self(z).detach()`, and logs both losses; `configure_optimizers` returns two Adams). Retyped at CPU size:
images 1x4x4 (published 1x28x28), latent 8 (100), the generator's blocks 16, 32 (128 to 1024) and the
discriminator's 32, 16 (512, 256); random images in [-1, 1] with dummy labels, batches of 4, stand in for
`MNISTDataModule`; `Trainer(accelerator="cpu", limit_train_batches=..., max_epochs=1)` with no logger,
checkpointing, progress bar or model summary; `import pytorch_lightning as pl` (the example's `lightning.pytorch`);
`@override` and `on_train_epoch_end` (a torchvision image grid for the loggers) left out.

Both backwards run from `training_step`, in the learner's file (`self.manual_backward` calls `loss.backward()` from
Lightning's `LightningModule.backward`); the optimizers' `step` calls go through Lightning's `LightningOptimizer`.
"""

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = "lightning"
WAYS = ("watch", "command")  # Lightning runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
IMG_SHAPE = (1, 4, 4)

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self, latent_dim: int = 8, img_shape: tuple = IMG_SHAPE):
        super().__init__()
        self.img_shape = img_shape

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim, 16, normalize=False),
            *block(16, 32),
            nn.Linear(32, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        return img.view(img.size(0), *self.img_shape)


class Discriminator(nn.Module):
    def __init__(self, img_shape):
        super().__init__()

        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 1),
        )

    def forward(self, img):
        img_flat = img.view(img.size(0), -1)
        return self.model(img_flat)


class GAN(pl.LightningModule):
    def __init__(
        self,
        img_shape: tuple = IMG_SHAPE,
        lr: float = 0.0002,
        b1: float = 0.5,
        b2: float = 0.999,
        latent_dim: int = 8,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False

        # networks
        self.generator = Generator(latent_dim=self.hparams.latent_dim, img_shape=img_shape)
        self.discriminator = Discriminator(img_shape=img_shape)

        self.validation_z = torch.randn(8, self.hparams.latent_dim)

        self.example_input_array = torch.zeros(2, self.hparams.latent_dim)

    def forward(self, z):
        return self.generator(z)

    @staticmethod
    def adversarial_loss(y_hat, y):
        return F.binary_cross_entropy_with_logits(y_hat, y)

    def training_step(self, batch):
        imgs, _ = batch

        opt_g, opt_d = self.optimizers()

        # sample noise
        z = torch.randn(imgs.shape[0], self.hparams.latent_dim)
        z = z.type_as(imgs)

        # Train generator
        # ground truth result (ie: all fake)
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)

        self.toggle_optimizer(opt_g)
        # adversarial loss is binary cross-entropy
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        opt_g.zero_grad()
        self.manual_backward(g_loss)  # @g_backward
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        # Train discriminator
        # Measure discriminator's ability to classify real from generated samples
        # how well can it label as real?
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)

        self.toggle_optimizer(opt_d)
        real_loss = self.adversarial_loss(self.discriminator(imgs), valid)

        # how well can it label as fake?
        fake = torch.zeros(imgs.size(0), 1)
        fake = fake.type_as(imgs)

        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)

        # discriminator loss is the average of these
        d_loss = (real_loss + fake_loss) / 2

        opt_d.zero_grad()
        self.manual_backward(d_loss)  # @d_backward
        opt_d.step()
        self.untoggle_optimizer(opt_d)

        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self):
        lr = self.hparams.lr
        b1 = self.hparams.b1
        b2 = self.hparams.b2

        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return opt_g, opt_d


def build() -> dict:
    torch.manual_seed(0)
    images = torch.rand(4 * (ITERATIONS + 1), *IMG_SHAPE) * 2 - 1
    dataset = TensorDataset(images, torch.zeros(len(images), dtype=torch.long))
    return {"model": GAN(), "train_dataloader": DataLoader(dataset, batch_size=4)}


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
