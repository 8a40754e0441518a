"""A fully connected GAN whose generator step reuses the discriminator step's `fake`, kept alive by retain_graph=True.

Source: aladdinpersson/Machine-Learning-Collection, ML/Pytorch/GANs/1. SimpleGAN/fc_gan.py (commit
65b8c8049560b19ace11ef754cb4dbe5aa415296), the loop its pull request #155 ("added retain_graph=True in
Discriminator", https://github.com/aladdinpersson/Machine-Learning-Collection/pull/155) is about: `fake =
gen(noise)` is fed to `disc(fake)` without `.detach()`, `lossD.backward(retain_graph=True)` keeps the
generator's graph so that the generator step's `output = disc(fake).view(-1)` can backward through it again
(the band-aid: `disc(fake.detach())` in the discriminator step is the usual fix). Discriminator and Generator
as published (Linear, LeakyReLU(0.01), Sigmoid; Linear, LeakyReLU(0.01), Tanh), Adam lr 3e-4, BCELoss.
Retyped at CPU size: image_dim 16 (published 784), z_dim 4 (published 64), hidden 8 and 16 (published 128 and
256), batch_size 4 (published 32), a loader of 3 made-up batches in [-1, 1] in place of MNIST, one batch per
iteration; the tensorboard writers and their image grids are left out (the print at batch 0 is kept), and
`.to(device)` is dropped.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {"@d_backward": {"verdict": "needed", "runs": 3, "needed_runs": 3}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Discriminator(nn.Module):
    def __init__(self, in_features):
        super().__init__()
        self.disc = nn.Sequential(
            nn.Linear(in_features, 8),
            nn.LeakyReLU(0.01),
            nn.Linear(8, 1),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.disc(x)


class Generator(nn.Module):
    def __init__(self, z_dim, img_dim):
        super().__init__()
        self.gen = nn.Sequential(
            nn.Linear(z_dim, 16),
            nn.LeakyReLU(0.01),
            nn.Linear(16, img_dim),
            nn.Tanh(),  # normalize inputs to [-1, 1] so make outputs [-1, 1]
        )

    def forward(self, x):
        return self.gen(x)


# Hyperparameters etc.
lr = 3e-4
z_dim = 4
image_dim = 4 * 4 * 1  # 16
batch_size = 4
num_epochs = 1


def build() -> dict:
    torch.manual_seed(0)
    disc = Discriminator(image_dim)
    gen = Generator(z_dim, image_dim)
    loader = [(torch.rand(batch_size, 1, 4, 4) * 2 - 1, torch.zeros(batch_size)) for _ in range(ITERATIONS)]
    return {
        "disc": disc,
        "gen": gen,
        "loader": loader,
        "opt_disc": optim.Adam(disc.parameters(), lr=lr),
        "opt_gen": optim.Adam(gen.parameters(), lr=lr),
        "criterion": nn.BCELoss(),
        "batch_idx": 0,
    }


def iteration(state: dict) -> None:
    disc, gen, criterion = state["disc"], state["gen"], state["criterion"]
    opt_disc, opt_gen, batch_idx = state["opt_disc"], state["opt_gen"], state["batch_idx"]
    real, _ = state["loader"][batch_idx % len(state["loader"])]
    real = real.view(-1, 16)
    batch_size = real.shape[0]

    ### Train Discriminator: max log(D(x)) + log(1 - D(G(z)))
    noise = torch.randn(batch_size, z_dim)
    fake = gen(noise)
    disc_real = disc(real).view(-1)
    lossD_real = criterion(disc_real, torch.ones_like(disc_real))
    disc_fake = disc(fake).view(-1)
    lossD_fake = criterion(disc_fake, torch.zeros_like(disc_fake))
    lossD = (lossD_real + lossD_fake) / 2
    disc.zero_grad()
    lossD.backward(retain_graph=True)  # @d_backward
    opt_disc.step()

    ### Train Generator: min log(1 - D(G(z))) <-> max log(D(G(z))
    # where the second option of maximizing doesn't suffer from
    # saturating gradients
    output = disc(fake).view(-1)
    lossG = criterion(output, torch.ones_like(output))
    gen.zero_grad()
    lossG.backward()  # @g_backward
    opt_gen.step()

    if batch_idx == 0:
        print(
            f"Epoch [0/{num_epochs}] Batch {batch_idx}/{len(state['loader'])} \
                  Loss D: {lossD:.4f}, loss G: {lossG:.4f}"
        )
    state["batch_idx"] = batch_idx + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
