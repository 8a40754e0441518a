"""BEGAN: the equilibrium term k carried from batch to batch, and a convergence measure read with `.data[0]`.

Source: eriklindernoren/PyTorch-GAN, implementations/began/began.py (commit
c5d6be170013db8975d96806084df573d87e5d26): per batch the generator's step on
`torch.mean(torch.abs(discriminator(gen_imgs) - gen_imgs))`, then the discriminator's on
`d_loss_real - k * d_loss_fake` (the fakes detached), then `diff = torch.mean(gamma * d_loss_real - d_loss_fake)`,
`k = k + lambda_k * diff.item()`, `k = min(max(k, 0), 1)` (a Python float carried to the next batch), and the
convergence measure `M = (d_loss_real + torch.abs(diff)).data[0]`. Generator, Discriminator and
weights_init_normal as published (`opt.img_size` 8, published 32; latent 8, published 62; one channel), batches of
4 made-up images in [-1, 1] in place of MNIST; the printout and save_image left out (the printout is after M).
On torch 2.13 `.data[0]` of a 0-dim tensor raises IndexError ("invalid index of a 0-dim tensor") at the first
batch: the loop as published stops there.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
from torch.autograd import Variable

ITERATIONS = 2

TRUTH = {
    "error": {"kind": "other", "iteration": 1, "line": "@M"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Opt:
    lr = 0.0002
    b1 = 0.5
    b2 = 0.999
    latent_dim = 8
    img_size = 8
    channels = 1


opt = Opt()
img_shape = (opt.channels, opt.img_size, opt.img_size)
cuda = False


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find('BatchNorm2d') != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()

        self.init_size = opt.img_size // 4
        self.l1 = nn.Sequential(nn.Linear(opt.latent_dim, 128*self.init_size**2))

        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(128),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(128, 128, 3, stride=1, padding=1),
            nn.BatchNorm2d(128, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(128, 64, 3, stride=1, padding=1),
            nn.BatchNorm2d(64, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(64, opt.channels, 3, stride=1, padding=1),
            nn.Tanh()
        )

    def forward(self, noise):
        out = self.l1(noise)
        out = out.view(out.shape[0], 128, self.init_size, self.init_size)
        img = self.conv_blocks(out)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()

        # Upsampling
        self.down = nn.Sequential(
            nn.Conv2d(opt.channels, 64, 3, 2, 1),
            nn.ReLU(),
        )
        # Fully-connected layers
        self.down_size = (opt.img_size // 2)
        down_dim = 64 * (opt.img_size // 2)**2
        self.fc = nn.Sequential(
            nn.Linear(down_dim, 32),
            nn.BatchNorm1d(32, 0.8),
            nn.ReLU(inplace=True),
            nn.Linear(32, down_dim),
            nn.BatchNorm1d(down_dim),
            nn.ReLU(inplace=True)
        )
        # Upsampling
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2),
            nn.Conv2d(64, opt.channels, 3, 1, 1)
        )

    def forward(self, img):
        out = self.down(img)
        out = self.fc(out.view(out.size(0), -1))
        out = self.up(out.view(out.size(0), 64, self.down_size, self.down_size))
        return out


Tensor = torch.FloatTensor


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    generator = Generator()
    discriminator = Discriminator()
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    batches = [torch.rand(4, *img_shape) * 2 - 1 for _ in range(3)]
    # BEGAN hyper parameters
    return {"generator": generator, "discriminator": discriminator, "optimizer_G": optimizer_G,
            "optimizer_D": optimizer_D, "dataloader": iter(batches), "gamma": 0.75, "lambda_k": 0.001, "k": 0.,
            "M": None}


def iteration(state: dict) -> None:
    generator, discriminator, optimizer_G, optimizer_D = (
        state["generator"], state["discriminator"], state["optimizer_G"], state["optimizer_D"])
    gamma, lambda_k, k = state["gamma"], state["lambda_k"], state["k"]
    imgs = next(state["dataloader"])

    # Configure input
    real_imgs = Variable(imgs.type(Tensor))

    # -----------------
    #  Train Generator
    # -----------------

    optimizer_G.zero_grad()

    # Sample noise as generator input
    z = Variable(Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim))))

    # Generate a batch of images
    gen_imgs = generator(z)

    # Loss measures generator's ability to fool the discriminator
    g_loss = torch.mean(torch.abs(discriminator(gen_imgs) - gen_imgs))

    g_loss.backward()
    optimizer_G.step()

    # ---------------------
    #  Train Discriminator
    # ---------------------

    optimizer_D.zero_grad()

    # Measure discriminator's ability to classify real from generated samples
    d_real = discriminator(real_imgs)
    d_fake = discriminator(gen_imgs.detach())

    d_loss_real = torch.mean(torch.abs(d_real - real_imgs))
    d_loss_fake = torch.mean(torch.abs(d_fake - gen_imgs.detach()))
    d_loss = d_loss_real - k * d_loss_fake

    d_loss.backward()
    optimizer_D.step()

    # ----------------
    # Update weights
    # ----------------

    diff = torch.mean(gamma * d_loss_real - d_loss_fake)

    # Update weight term for fake samples
    k = k + lambda_k * diff.item()
    k = min(max(k, 0), 1)  # Constraint to interval [0, 1]
    state["k"] = k

    # Update convergence metric
    state["M"] = (d_loss_real + torch.abs(diff)).data[0]  # @M


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
