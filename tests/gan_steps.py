"""GAN pieces shared by the tests of helpers/lessons/gan_step (tests/test_gan_step_*.py,
tests/test_gan_claims.py, tests/test_gan_step_catalogue.py): the losses, the networks, the
notebook's step functions, written out here independently of the package, and small seeded GANs.

tests/conftest.py loads this module as a pytest plugin, so its fixtures (``gan``, ``checker``,
``one_thread``) reach every test by name; a module that wants one thread asks for it with
``pytestmark = pytest.mark.usefixtures("one_thread")``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helpers as bt
from helpers.lessons.gan_step.checker import GanStepChecker
from helpers.lessons.gan_step.data import ring_of_gaussians

IN_PLACE = "modified by an inplace operation"
SECOND_TIME = "backward through the graph a second time"
bce = F.binary_cross_entropy_with_logits


def d_loss_fn(real_out, fake_out):
    return bce(real_out, torch.ones_like(real_out)) + bce(fake_out, torch.zeros_like(fake_out))


def g_loss_fn(fake_out):
    return bce(fake_out, torch.ones_like(fake_out))


def mlp(n_in, n_out, hidden=64):
    return torch.nn.Sequential(
        torch.nn.Linear(n_in, hidden),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(hidden, hidden),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(hidden, n_out),
    )


def small_mlp(n_in: int, n_out: int) -> torch.nn.Sequential:
    """Smaller than the notebook's networks: the unit tests judge logic, not learning."""
    return torch.nn.Sequential(
        torch.nn.Linear(n_in, 16),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(16, 16),
        torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(16, n_out),
    )


@pytest.fixture
def gan():
    """A small seeded GAN and a batch: ``(netG, netD, optimizerG, optimizerD, real, z)``."""
    torch.manual_seed(0)
    netG, netD = small_mlp(2, 2), small_mlp(2, 1)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-2)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    real, z = ring_of_gaussians(32, generator=generator), torch.randn(32, 2, generator=generator)
    return netG, netD, optimizerG, optimizerD, real, z


@pytest.fixture
def checker(gan):
    return GanStepChecker(*gan, d_loss_fn, g_loss_fn)


def make_gan(seed=0):
    bt.seed_everything(seed)
    netG, netD = mlp(2, 2), mlp(2, 1)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=3e-3, betas=(0.5, 0.999))
    optimizerD = torch.optim.Adam(netD.parameters(), lr=3e-3, betas=(0.5, 0.999))
    return netG, netD, optimizerG, optimizerD


# The notebook's steps, as written there.
def srgan_step(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    real_out, fake_out = netD(real), netD(fake)
    d_loss = d_loss_fn(real_out, fake_out)
    d_loss.backward(retain_graph=True)
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(fake_out)
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def moved_step(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    real_out, fake_out = netD(real), netD(fake)
    d_loss = d_loss_fn(real_out, fake_out)
    d_loss.backward(retain_graph=True)
    netG.zero_grad()
    g_loss = g_loss_fn(fake_out)
    g_loss.backward()
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def standard_step(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    netD.zero_grad()
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def single_forward_step(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    fake_out = netD(fake)
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_params, g_params = list(netD.parameters()), list(netG.parameters())
    d_grads = torch.autograd.grad(d_loss, d_params, retain_graph=True)
    g_grads = torch.autograd.grad(g_loss, g_params)
    for p, grad in zip(d_params + g_params, d_grads + g_grads):
        p.grad = grad
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def inputs_step(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny networks: one thread is steadier (and, on a busy machine, much faster) than two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
