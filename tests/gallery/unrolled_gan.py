"""Unrolled GAN (Metz et al.) on the 2-D ring of Gaussians: D unrolled on G's batch, G trained on the unrolled D.

Source: andrewliao11/unrolled-gans, unrolled_gan.ipynb (commit 06f2a1aa1c86f7685649bec4ab46f2032d4f7a70; its code
cells as exported to a .py file) and mixture_gaussian.py (data_generator: 8 Gaussians of std 0.5 on a circle of
radius 5, `sample(N)` by np.random). d_loop (zero_grad, BCE on real and on `G(d_gen_input)` under no_grad,
`d_loss.backward()`, step); d_unrolled_loop, the same on G's own noise with `d_loss.backward(create_graph=True)`
as published; g_loop (`g_optimizer.zero_grad()`, `backup = copy.deepcopy(D)`, `unrolled_steps` calls of
d_unrolled_loop, G's BCE against ones through the unrolled D, `g_error.backward()`, `g_optimizer.step()`, then
`D.load(backup)`, which puts the backup's Linear weights back through `.data`, and `del backup`); the outer loop
(d_steps calls of d_loop, g_steps of g_loop, np.mean of their losses). Adam lr 1e-4 (D) and 1e-3 (G), betas
(0.5, 0.999), BCELoss, tanh G and relu/sigmoid D of three Linear layers each. Retyped at CPU size: z_dim 8
(published 256), hidden 16 (published 128), minibatch 16 (published 512), unrolled_steps 3 (published 10);
cuda, seaborn/matplotlib plotting and the weighting of the Gaussians (`random_distribution`) are left out;
np.random and torch are seeded in build().
"""

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

cuda = False


class data_generator(object):
    """generate 2d gaussian around a circle"""

    def __init__(self):
        n = 8
        radius = 5
        std = 0.5
        delta_theta = 2 * np.pi / n

        centers_x = []
        centers_y = []
        for i in range(n):
            centers_x.append(radius * np.cos(i * delta_theta))
            centers_y.append(radius * np.sin(i * delta_theta))

        centers_x = np.expand_dims(np.array(centers_x), 1)
        centers_y = np.expand_dims(np.array(centers_y), 1)

        self.size = 2
        self.n = n
        self.std = std
        self.centers = np.concatenate([centers_x, centers_y], 1)

    def sample(self, N):
        n = self.n
        std = self.std
        centers = self.centers

        ith_center = np.random.choice(n, N)
        sample_centers = centers[ith_center, :]
        sample_points = np.random.normal(loc=sample_centers, scale=std)
        return sample_points.astype("float32")


def noise_sampler(N, z_dim):
    return np.random.normal(size=[N, z_dim]).astype("float32")


def d_loop():
    # 1. Train D on real+fake
    d_optimizer.zero_grad()

    #  1A: Train D on real
    d_real_data = torch.from_numpy(dset.sample(minibatch_size))
    if cuda:
        d_real_data = d_real_data.cuda()
    d_real_decision = D(d_real_data)
    target = torch.ones_like(d_real_decision)
    if cuda:
        target = target.cuda()
    d_real_error = criterion(d_real_decision, target)  # ones = true

    #  1B: Train D on fake
    d_gen_input = torch.from_numpy(noise_sampler(minibatch_size, g_inp))
    if cuda:
        d_gen_input = d_gen_input.cuda()

    with torch.no_grad():
        d_fake_data = G(d_gen_input)
    d_fake_decision = D(d_fake_data)
    target = torch.zeros_like(d_fake_decision)
    if cuda:
        target = target.cuda()
    d_fake_error = criterion(d_fake_decision, target)  # zeros = fake

    d_loss = d_real_error + d_fake_error
    d_loss.backward()  # @d_backward
    d_optimizer.step()  # Only optimizes D's parameters; changes based on stored gradients from backward()
    return d_real_error.cpu().item(), d_fake_error.cpu().item()


def d_unrolled_loop(d_gen_input=None):
    # 1. Train D on real+fake
    d_optimizer.zero_grad()

    #  1A: Train D on real
    d_real_data = torch.from_numpy(dset.sample(minibatch_size))
    if cuda:
        d_real_data = d_real_data.cuda()
    d_real_decision = D(d_real_data)
    target = torch.ones_like(d_real_decision)
    if cuda:
        target = target.cuda()
    d_real_error = criterion(d_real_decision, target)  # ones = true

    #  1B: Train D on fake
    if d_gen_input is None:
        d_gen_input = torch.from_numpy(noise_sampler(minibatch_size, g_inp))
    if cuda:
        d_gen_input = d_gen_input.cuda()

    with torch.no_grad():
        d_fake_data = G(d_gen_input)
    d_fake_decision = D(d_fake_data)
    target = torch.zeros_like(d_fake_decision)
    if cuda:
        target = target.cuda()
    d_fake_error = criterion(d_fake_decision, target)  # zeros = fake

    d_loss = d_real_error + d_fake_error
    d_loss.backward(create_graph=True)  # @unrolled_backward
    d_optimizer.step()  # Only optimizes D's parameters; changes based on stored gradients from backward()
    return d_real_error.cpu().item(), d_fake_error.cpu().item()


def g_loop():
    # 2. Train G on D's response (but DO NOT train D on these labels)
    g_optimizer.zero_grad()

    gen_input = torch.from_numpy(noise_sampler(minibatch_size, g_inp))
    if cuda:
        gen_input = gen_input.cuda()

    if unrolled_steps > 0:
        backup = copy.deepcopy(D)
        for i in range(unrolled_steps):
            d_unrolled_loop(d_gen_input=gen_input)

    g_fake_data = G(gen_input)
    dg_fake_decision = D(g_fake_data)
    target = torch.ones_like(dg_fake_decision)
    if cuda:
        target = target.cuda()
    g_error = criterion(dg_fake_decision, target)  # we want to fool, so pretend it's all genuine
    g_error.backward()  # @g_backward
    g_optimizer.step()  # Only optimizes G's parameters

    if unrolled_steps > 0:
        D.load(backup)
        del backup

    return g_error.cpu().item()


# Model params (most of hyper-params follow the original paper: https://arxiv.org/abs/1611.02163)
z_dim = 8
g_inp = z_dim
g_hid = 16
g_out = 2

d_inp = g_out
d_hid = 16
d_out = 1

minibatch_size = 16

unrolled_steps = 3
d_learning_rate = 1e-4
g_learning_rate = 1e-3
optim_betas = (0.5, 0.999)
num_iterations = ITERATIONS
d_steps = 1
g_steps = 1


###### MODELS: Generator model and discriminator model
class Generator(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(Generator, self).__init__()
        self.map1 = nn.Linear(input_size, hidden_size)
        self.map2 = nn.Linear(hidden_size, hidden_size)
        self.map3 = nn.Linear(hidden_size, output_size)
        self.activation_fn = F.tanh
        # self.activation_fn = F.relu

    def forward(self, x):
        x = self.activation_fn(self.map1(x))
        x = self.activation_fn(self.map2(x))
        return self.map3(x)


class Discriminator(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(Discriminator, self).__init__()
        self.map1 = nn.Linear(input_size, hidden_size)
        self.map2 = nn.Linear(hidden_size, hidden_size)
        self.map3 = nn.Linear(hidden_size, output_size)
        self.activation_fn = F.relu

    def forward(self, x):
        x = self.activation_fn(self.map1(x))
        x = self.activation_fn(self.map2(x))
        return F.sigmoid(self.map3(x))

    def load(self, backup):
        for m_from, m_to in zip(backup.modules(), self.modules()):
            if isinstance(m_to, nn.Linear):
                m_to.weight.data = m_from.weight.data.clone()
                if m_to.bias is not None:
                    m_to.bias.data = m_from.bias.data.clone()


def build() -> dict:
    """The notebook's globals, made afresh: the data, G and D, the criterion and the two Adam optimizers."""
    global dset, G, D, criterion, d_optimizer, g_optimizer
    np.random.seed(0)
    torch.manual_seed(0)
    dset = data_generator()
    G = Generator(input_size=g_inp, hidden_size=g_hid, output_size=g_out)
    D = Discriminator(input_size=d_inp, hidden_size=d_hid, output_size=d_out)
    criterion = nn.BCELoss()  # Binary cross entropy: http://pytorch.org/docs/nn.html#bceloss
    d_optimizer = optim.Adam(D.parameters(), lr=d_learning_rate, betas=optim_betas)
    g_optimizer = optim.Adam(G.parameters(), lr=g_learning_rate, betas=optim_betas)
    return {"G": G, "D": D, "d_optimizer": d_optimizer, "g_optimizer": g_optimizer}


def iteration(state: dict) -> None:
    d_infos = []
    for d_index in range(d_steps):
        d_info = d_loop()
        d_infos.append(d_info)
    d_infos = np.mean(d_infos, 0)
    d_real_loss, d_fake_loss = d_infos

    g_infos = []
    for g_index in range(g_steps):
        g_info = g_loop()
        g_infos.append(g_info)
    g_infos = np.mean(g_infos)
    g_loss = g_infos


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for it in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
