"""A weight-clipped WGAN whose generator step scores the critic's last batch of fakes instead of its own.

Source: eriklindernoren/PyTorch-GAN, implementations/wgan/wgan.py (commit 0484f457a013118f12e38da7e16819a19bd3f074),
and its issue #6 (https://github.com/eriklindernoren/PyTorch-GAN/issues/6, "wgan retrain_graph"): "Trying to
backward through the graph a second time" at `gen_validity.backward(valid)`; the author: "Oh, a typo had snuck in
there". The generator step makes `gen_imgs = generator(z)` but scores `gen_validity = discriminator(fake_imgs)`,
the fakes of the critic's last step, whose generator graph `fake_validity.backward(fake)` has already freed. As
published: Generator (Linear latent->128, LeakyReLU(0.2, inplace), then Linear + BatchNorm1d + LeakyReLU three
times, Linear to img_size**2, Tanh, view to an image), Discriminator (Linear img_size**2->512->256->1 with in-place
LeakyReLUs), `weights_init_normal` applied, two Adams (lr 0.0002, betas (0.5, 0.999)); per generator iteration
`opt.n_critic` critic steps, each: next batch, `valid` filled with -1 and `fake` with 1, optimizer_D.zero_grad(),
`fake_imgs = generator(z)`, `real_validity.backward(valid)`, `fake_validity.backward(fake)`, `d_loss =
real_validity - fake_validity`, optimizer_D.step(), `p.data.clamp_(-clip_value, clip_value)`; then the generator
step (optimizer_G.zero_grad(), `gen_imgs = generator(z)`, `gen_validity = discriminator(fake_imgs)`,
`gen_validity.backward(valid)`, optimizer_G.step()). Retyped at CPU size: img_size 4 (published 28), latent_dim 8
(published 100), widths 8/16/16/16 and 16/8 (published 128/256/512/1024 and 512/256), batches of 4 made-up images
in [-1, 1] in place of MNIST, n_critic 5 as published; `Variable` and `.cuda()` dropped, `Tensor(...).fill_(v)`
kept as `torch.FloatTensor(...).fill_(v)`, `data_iter.next()` as `next(data_iter)`; the print and save_image are
left out.
"""

import argparse
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 1, "line": "@g_backward"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

opt = argparse.Namespace(n_epochs=1, batch_size=4, lr=0.0002, b1=0.5, b2=0.999, latent_dim=8, img_size=4, channels=1,
                         n_critic=5, clip_value=0.01, sample_interval=1)

Tensor = torch.FloatTensor


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()

        self.model = nn.Sequential(
            nn.Linear(opt.latent_dim, 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(8, 16),
            nn.BatchNorm1d(16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 16),
            nn.BatchNorm1d(16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 16),
            nn.BatchNorm1d(16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, opt.img_size**2),
            nn.Tanh()
        )

    def forward(self, noise):
        img = self.model(noise)
        img = img.view(img.shape[0], opt.channels, opt.img_size, opt.img_size)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()

        self.model = nn.Sequential(
            nn.Linear(opt.img_size**2, 16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(8, 1)
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)

        return validity


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    generator = Generator()
    discriminator = Discriminator()

    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    mnist_loader = [(torch.rand(opt.batch_size, opt.channels, opt.img_size, opt.img_size) * 2 - 1,
                     torch.zeros(opt.batch_size, dtype=torch.long)) for _ in range(opt.n_critic * ITERATIONS)]

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    return {"generator": generator, "discriminator": discriminator, "optimizer_G": optimizer_G,
            "optimizer_D": optimizer_D, "mnist_loader": mnist_loader, "data_iter": iter(mnist_loader)}


def iteration(state: dict) -> None:
    generator, discriminator = state["generator"], state["discriminator"]
    optimizer_G, optimizer_D, data_iter = state["optimizer_G"], state["optimizer_D"], state["data_iter"]
    # Train discriminator for n_critic times
    for _ in range(opt.n_critic):
        (imgs, _) = next(data_iter)

        # Adversarial ground truths
        valid = Tensor(imgs.shape[0], 1).fill_(-1.0)
        fake = Tensor(imgs.shape[0], 1).fill_(1.0)

        real_imgs = imgs

        # ---------------------
        #  Train Discriminator
        # ---------------------

        optimizer_D.zero_grad()

        # Sample noise as generator input
        z = Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim)))

        # Generate a batch of images
        fake_imgs = generator(z)

        # Train on real images
        real_validity = discriminator(real_imgs)
        real_validity.backward(valid)  # @real_backward
        # Train on fake images
        fake_validity = discriminator(fake_imgs)
        fake_validity.backward(fake)  # @fake_backward

        d_loss = real_validity - fake_validity

        optimizer_D.step()

        # Clip weights of discriminator
        for p in discriminator.parameters():
            p.data.clamp_(-opt.clip_value, opt.clip_value)

    # -----------------
    #  Train Generator
    # -----------------

    optimizer_G.zero_grad()

    # Sample noise as generator input
    z = Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim)))

    # Generate a batch of images
    gen_imgs = generator(z)

    # Loss measures generator's ability to fool the discriminator
    # Train on fake images
    gen_validity = discriminator(fake_imgs)
    gen_validity.backward(valid)  # @g_backward

    optimizer_G.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
