"""The older WGAN-GP: backward with a gradient argument (`D_real.backward(mone)`), three backwards per
critic step, the critic's requires_grad switched off for the generator step.

Source: caogang/wgan-gp, gan_toy.py (the PyTorch port of the paper's toy experiments): per generator
iteration, `p.requires_grad = True` on netD, CRITIC_ITERS=5 critic steps of netD.zero_grad(),
D_real.backward(mone), a fake made from `autograd.Variable(netG(noisev).data)` (noisev volatile),
D_fake.backward(one), calc_gradient_penalty (autograd.grad with create_graph=True, only_inputs=True)
then gradient_penalty.backward(one), optimizerD.step(); then requires_grad False, netG.zero_grad(),
G.backward(mone), optimizerG.step(). Retyped at CPU size: DIM 8 (published 512), BATCH_SIZE 8
(published 256), 8-gaussians data from torch.randn instead of numpy, 2 generator iterations, no CUDA;
Python 2 idioms (xrange, data.next()) written in Python 3, `volatile=True` dropped (it is ignored
since 0.4; the `.data` detach that follows is kept). `one = torch.FloatTensor([1])` is kept too: on
torch 2.13 `D_real.backward(mone)` on a 0-dim mean raises "Mismatch in shape" (the later common fix
is `torch.tensor(1, dtype=torch.float)`), so the published loop stops at its first backward.
"""

from collections.abc import Callable

import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 2
DIM = 8
LAMBDA = .1
CRITIC_ITERS = 5
BATCH_SIZE = 8

TRUTH = {
    "error": {"kind": "other", "iteration": 1, "line": "@d_real_backward"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 2))

    def forward(self, noise):
        return self.main(noise)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 1))

    def forward(self, inputs):
        output = self.main(inputs)
        return output.view(-1)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Linear') != -1:
        m.weight.data.normal_(0.0, 0.02)
        m.bias.data.fill_(0)


def inf_train_gen():
    scale = 2.
    centers = torch.tensor([(1, 0), (-1, 0), (0, 1), (0, -1)], dtype=torch.float32) * scale
    while True:
        points = torch.randn(BATCH_SIZE, 2) * .02 + centers[torch.randint(4, (BATCH_SIZE,))]
        yield (points / 1.414).numpy()


def calc_gradient_penalty(netD, real_data, fake_data):
    alpha = torch.rand(BATCH_SIZE, 1)
    alpha = alpha.expand(real_data.size())
    interpolates = alpha * real_data + ((1 - alpha) * fake_data)
    interpolates = autograd.Variable(interpolates, requires_grad=True)
    disc_interpolates = netD(interpolates)
    gradients = autograd.grad(outputs=disc_interpolates, inputs=interpolates, grad_outputs=torch.ones(BATCH_SIZE), create_graph=True, only_inputs=True)[0]  # @gp_grad
    gradient_penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean() * LAMBDA
    return gradient_penalty


def build() -> dict:
    torch.manual_seed(1)
    netG = Generator()
    netD = Discriminator()
    netD.apply(weights_init)
    netG.apply(weights_init)
    one = torch.FloatTensor([1])
    mone = one * -1
    return {"netG": netG, "netD": netD,
            "optimizerD": optim.Adam(netD.parameters(), lr=1e-4, betas=(0.5, 0.9)),
            "optimizerG": optim.Adam(netG.parameters(), lr=1e-4, betas=(0.5, 0.9)),
            "one": one, "mone": mone, "data": inf_train_gen()}


def iteration(state: dict) -> None:
    netG, netD, optimizerD, optimizerG = state["netG"], state["netD"], state["optimizerD"], state["optimizerG"]
    one, mone, data = state["one"], state["mone"], state["data"]
    for p in netD.parameters():
        p.requires_grad = True

    for iter_d in range(CRITIC_ITERS):
        _data = next(data)
        real_data = torch.Tensor(_data)
        real_data_v = autograd.Variable(real_data)
        netD.zero_grad()

        D_real = netD(real_data_v)
        D_real = D_real.mean()
        D_real.backward(mone)  # @d_real_backward

        noise = torch.randn(BATCH_SIZE, 2)
        noisev = autograd.Variable(noise)
        fake = autograd.Variable(netG(noisev).data)
        inputv = fake
        D_fake = netD(inputv)
        D_fake = D_fake.mean()
        D_fake.backward(one)  # @d_fake_backward

        gradient_penalty = calc_gradient_penalty(netD, real_data_v.data, fake.data)
        gradient_penalty.backward(one)  # @gp_backward

        D = D_fake - D_real + gradient_penalty
        optimizerD.step()

    for p in netD.parameters():
        p.requires_grad = False
    netG.zero_grad()

    noise = torch.randn(BATCH_SIZE, 2)
    noisev = autograd.Variable(noise)
    fake = netG(noisev)
    G = netD(fake)
    G = G.mean()
    G.backward(mone)  # @g_backward
    optimizerG.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for iteration_number in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
