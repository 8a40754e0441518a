"""A vanilla MNIST GAN whose discriminator puts an in-place Dropout after an in-place LeakyReLU.

Source: dreamgonfly/GAN-tutorial, GAN.ipynb (commit 0922497f8de1adb670e149c2303bdf4f3275a07b), and its
issue #1 (https://github.com/dreamgonfly/GAN-tutorial/issues/1, "Train Backward 과정에서 오류"): `D_loss.backward()`
raises "one of the variables needed for gradient computation has been modified by an inplace operation"; the
answer there is to drop `inplace=True` from LeakyReLU and Dropout. The notebook's Generator (Linear 100->256->512
->1024->784 with `nn.LeakyReLU(0.2, inplace=True)`, Tanh, `.view(-1, 1, 28, 28)`) and Discriminator (Linear
784->1024->512->256->1, each hidden layer followed by `nn.LeakyReLU(0.2, inplace=True)` and
`nn.Dropout(inplace=True)`, Sigmoid), BCELoss, two Adams (lr 0.0002, betas (0.5, 0.999)), and the training loop
as published: D on real data, `fake_data = G(z)` (not detached), `D_loss = D_loss_real + D_loss_fake`,
`D.zero_grad()`, `D_loss.backward()`, `D_optimizer.step()`, then a fresh z, `G_loss = criterion(D(G(z)),
target_real)`, `G.zero_grad()`, `G_loss.backward()`, `G_optimizer.step()`. Retyped at CPU size: 4x4 images
(published 28x28), hidden widths 16/16/16 (published 256/512/1024 and 1024/512/256), z of 8 (published 100),
batches of 4 made-up images in [-1, 1] in place of MNIST; `Variable` wrappers and `.cuda()` dropped,
`D_loss.data[0]` / `G_loss.data[0]` as `.item()`, the image logging left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.optim import Adam

ITERATIONS = 3
Z_DIM = 8
SIDE = 4
BATCH = 4

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@d_backward"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):

    def __init__(self):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(in_features=Z_DIM, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(in_features=16, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(in_features=16, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(in_features=16, out_features=SIDE*SIDE),
            nn.Tanh())

    def forward(self, inputs):
        return self.main(inputs).view(-1, 1, SIDE, SIDE)


class Discriminator(nn.Module):

    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(in_features=SIDE*SIDE, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(inplace=True),
            nn.Linear(in_features=16, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(inplace=True),
            nn.Linear(in_features=16, out_features=16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(inplace=True),
            nn.Linear(in_features=16, out_features=1),
            nn.Sigmoid())

    def forward(self, inputs):
        inputs = inputs.view(-1, SIDE*SIDE)
        return self.main(inputs)


def build() -> dict:
    torch.manual_seed(0)
    G = Generator()
    D = Discriminator()
    criterion = nn.BCELoss()
    G_optimizer = Adam(G.parameters(), lr=0.0002, betas=(0.5, 0.999))
    D_optimizer = Adam(D.parameters(), lr=0.0002, betas=(0.5, 0.999))
    dataloader = [(torch.rand(BATCH, 1, SIDE, SIDE) * 2 - 1, torch.zeros(BATCH, dtype=torch.long)) for _ in range(ITERATIONS)]
    return {"G": G, "D": D, "criterion": criterion, "G_optimizer": G_optimizer, "D_optimizer": D_optimizer,
            "dataloader": dataloader, "D_losses": [], "G_losses": [], "batch": 0}


def iteration(state: dict) -> None:
    G, D, criterion = state["G"], state["D"], state["criterion"]
    G_optimizer, D_optimizer = state["G_optimizer"], state["D_optimizer"]
    real_data, _ = state["dataloader"][state["batch"] % len(state["dataloader"])]
    state["batch"] += 1
    batch_size = real_data.size(0)

    target_real = torch.ones(batch_size, 1)
    target_fake = torch.zeros(batch_size, 1)

    D_result_from_real = D(real_data)
    D_loss_real = criterion(D_result_from_real, target_real)

    z = torch.randn((batch_size, Z_DIM))

    fake_data = G(z)

    D_result_from_fake = D(fake_data)
    D_loss_fake = criterion(D_result_from_fake, target_fake)

    D_loss = D_loss_real + D_loss_fake

    D.zero_grad()
    D_loss.backward()  # @d_backward
    D_optimizer.step()

    state["D_losses"].append(D_loss.item())

    z = torch.randn((batch_size, Z_DIM))

    fake_data = G(z)
    D_result_from_fake = D(fake_data)
    G_loss = criterion(D_result_from_fake, target_real)

    G.zero_grad()
    G_loss.backward()  # @g_backward
    G_optimizer.step()

    state["G_losses"].append(G_loss.item())


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
