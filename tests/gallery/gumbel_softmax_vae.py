"""A categorical VAE trained with the straight-through Gumbel-softmax, its temperature annealed every 100 batches.

Source: YongfeiYan/Gumbel_Softmax_VAE, gumbel_softmax_vae.py (commit 272d6de4c37b3e5c897489b6b153c5877176ab4f),
and its issues #9 ("Unnecessary parameter": the `temp` given to VAE_gumbel's constructor) and #2 ("Temperature
reset after each epoch"). As published: sample_gumbel, gumbel_softmax_sample, the straight-through gumbel_softmax
(`y_hard.scatter_(1, ind.view(-1, 1), 1)` on a zeros_like, `y_hard = (y_hard - y).detach() + y`), VAE_gumbel
(fc1..fc6, ReLU, Sigmoid), loss_function (BCE with `size_average=False` over the batch, the KL to the uniform
categorical), Adam lr 1e-3, and train()'s loop: zero_grad, `model(data, temp)`, loss, backward, `train_loss +=
loss.item() * len(data)`, step, `temp = np.maximum(temp * np.exp(-ANNEAL_RATE * batch_idx), temp_min)` when
`batch_idx % 100 == 1`. Retyped at CPU size: one pass of train()'s batch loop is one iteration; MNIST through
torchvision becomes made-up images in [0, 1] of 64 pixels (published 784), batch 4 (published 100); fc sizes
64-32-16-(latent_dim * categorical_dim) (published 784-512-256-300), latent_dim 3, categorical_dim 4 (published
30 and 10); argparse's defaults as constants; printing, test() and save_image left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

ITERATIONS = 3
PIXELS = 64

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class args:
    batch_size = 4
    temp = 1.0
    cuda = False
    log_interval = 10


def sample_gumbel(shape, eps=1e-20):
    U = torch.rand(shape)
    if args.cuda:
        U = U.cuda()
    return -torch.log(-torch.log(U + eps) + eps)


def gumbel_softmax_sample(logits, temperature):
    y = logits + sample_gumbel(logits.size())
    return F.softmax(y / temperature, dim=-1)


def gumbel_softmax(logits, temperature):
    """
    ST-gumple-softmax
    input: [*, n_class]
    return: flatten --> [*, n_class] an one-hot vector
    """
    y = gumbel_softmax_sample(logits, temperature)
    shape = y.size()
    _, ind = y.max(dim=-1)
    y_hard = torch.zeros_like(y).view(-1, shape[-1])
    y_hard.scatter_(1, ind.view(-1, 1), 1)
    y_hard = y_hard.view(*shape)
    # Set gradients w.r.t. y_hard gradients w.r.t. y
    y_hard = (y_hard - y).detach() + y
    return y_hard.view(-1, latent_dim * categorical_dim)


class VAE_gumbel(nn.Module):
    def __init__(self, temp):
        super(VAE_gumbel, self).__init__()

        self.fc1 = nn.Linear(PIXELS, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, latent_dim * categorical_dim)

        self.fc4 = nn.Linear(latent_dim * categorical_dim, 16)
        self.fc5 = nn.Linear(16, 32)
        self.fc6 = nn.Linear(32, PIXELS)

        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()

    def encode(self, x):
        h1 = self.relu(self.fc1(x))
        h2 = self.relu(self.fc2(h1))
        return self.relu(self.fc3(h2))

    def decode(self, z):
        h4 = self.relu(self.fc4(z))
        h5 = self.relu(self.fc5(h4))
        return self.sigmoid(self.fc6(h5))

    def forward(self, x, temp):
        q = self.encode(x.view(-1, PIXELS))
        q_y = q.view(q.size(0), latent_dim, categorical_dim)
        z = gumbel_softmax(q_y, temp)
        return self.decode(z), F.softmax(q_y, dim=-1).reshape(*q.size())


latent_dim = 3
categorical_dim = 4  # one-of-K vector

temp_min = 0.5
ANNEAL_RATE = 0.00003


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, qy):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), size_average=False) / x.shape[0]

    log_ratio = torch.log(qy * categorical_dim + 1e-20)
    KLD = torch.sum(qy * log_ratio, dim=-1).mean()

    return BCE + KLD


def build() -> dict:
    torch.manual_seed(1)
    model = VAE_gumbel(args.temp)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    return {"model": model, "optimizer": optimizer, "train_loss": 0, "temp": args.temp, "batch_idx": 0}


def iteration(state: dict) -> None:
    model, optimizer, batch_idx, temp = state["model"], state["optimizer"], state["batch_idx"], state["temp"]
    data = torch.rand(args.batch_size, 1, 8, 8)
    optimizer.zero_grad()
    recon_batch, qy = model(data, temp)
    loss = loss_function(recon_batch, data, qy)
    loss.backward()  # @backward
    state["train_loss"] += loss.item() * len(data)
    optimizer.step()
    if batch_idx % 100 == 1:
        temp = np.maximum(temp * np.exp(-ANNEAL_RATE * batch_idx), temp_min)
    state["temp"], state["batch_idx"] = temp, batch_idx + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
