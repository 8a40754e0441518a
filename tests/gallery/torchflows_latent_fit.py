"""A normalizing flow fitted, with torchflows' `Flow.fit`, to an autoencoder's latent codes that still hold their graph.

Source: davidnabergoj/torchflows issue #8 (https://github.com/davidnabergoj/torchflows/issues/8, "Error with graph
in normalizing-flows/normalizing_flows/flows.py"): in "my implementation of a probabilistic autoencoder",
`train_loss.backward()` in `fit` raised "Trying to backward through the graph a second time"; changing it to
`train_loss.backward(retain_graph = True)` "did not rectify the error for me"; "The input to flow.fit is the latent
space of my autoencoder". The loop is `BaseFlow.fit` of normalizing_flows/flows.py (commit
03fe60fac49f93d6f40345cdb22ac59a27082be2): AdamW over the flow's parameters, per batch `optimizer.zero_grad()`,
`compute_batch_loss` (`-mean(log_prob * weights) / event_size`), `train_loss += self.regularization()`,
`train_loss.backward()`, `optimizer.step()`; `Flow.log_prob` (bijection forward, standard-normal base log-prob plus
log-det). The user's code is a screenshot, so its shape is retyped from the issue's words: an encoder's output on
the data, not detached, passed as `x_train`. Changed: the bijection is a small RealNVP of two affine couplings
(torchflows builds RealNVP from its own coupling and conditioner classes; retyped here as one class), latent size 4
(published 100), 24 made-up data points, batch size 8 (published 1024) so that an epoch has 3 batches, the
DataLoader of `create_data_loader` (shuffle, weights of ones) retyped as a seeded permutation split into batches and
indexing, which reaches `x_train` the same way its collate does; no validation data, no progress bar.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
LATENT = 4
BATCH_SIZE = 8

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "x_train", "line": "@latent"}],
    "notes": [],
    "modifies_in_place": [],
}


class AffineCoupling(nn.Module):
    def __init__(self, event_size, mask, hidden=16):
        super().__init__()
        self.register_buffer("mask", mask)
        self.conditioner = nn.Sequential(nn.Linear(event_size, hidden), nn.Tanh(), nn.Linear(hidden, 2 * event_size))

    def forward(self, x):
        log_scale, shift = self.conditioner(x * self.mask).chunk(2, dim=-1)
        log_scale = torch.tanh(log_scale) * (1 - self.mask)
        shift = shift * (1 - self.mask)
        z = x * torch.exp(log_scale) + shift
        return z, log_scale.sum(dim=-1)


class RealNVP(nn.Module):
    def __init__(self, event_size, n_layers=2):
        super().__init__()
        self.event_shape = (event_size,)
        mask = (torch.arange(event_size) % 2).float()
        self.layers = nn.ModuleList([AffineCoupling(event_size, mask if i % 2 == 0 else 1 - mask)
                                     for i in range(n_layers)])

    def forward(self, x, context=None):
        log_det = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, layer_log_det = layer(x)
            log_det = log_det + layer_log_det
        return x, log_det


class Flow(nn.Module):
    def __init__(self, bijection):
        super().__init__()
        self.event_shape = bijection.event_shape
        self.event_size = int(torch.prod(torch.as_tensor(self.event_shape)))
        self.base = torch.distributions.MultivariateNormal(loc=torch.zeros(self.event_size),
                                                           covariance_matrix=torch.eye(self.event_size))
        self.register_module('bijection', bijection)

    def regularization(self):
        return 0.0

    def log_prob(self, x, context=None):
        z, log_det = self.bijection.forward(x, context=context)
        log_base = self.base.log_prob(z)
        return log_base + log_det


def build() -> dict:
    torch.manual_seed(0)
    data = torch.randn(24, 12)
    encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, LATENT))
    decoder = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 12))
    x_train = encoder(data)  # @latent
    flow = Flow(RealNVP(LATENT))
    flow.train()
    w_train = torch.ones(len(x_train))
    order = torch.randperm(len(x_train))
    batches = list(order.split(BATCH_SIZE))
    optimizer = torch.optim.AdamW(flow.parameters(), lr=0.05)
    return {"encoder": encoder, "decoder": decoder, "flow": flow, "x_train": x_train, "w_train": w_train,
            "batches": batches, "optimizer": optimizer, "step": 0}


def compute_batch_loss(flow, batch_, reduction=torch.mean):
    batch_x, batch_weights = batch_[:2]
    batch_log_prob = flow.log_prob(batch_x)
    batch_loss = -reduction(batch_log_prob * batch_weights) / flow.event_size
    return batch_loss


def iteration(state: dict) -> None:
    flow, optimizer = state["flow"], state["optimizer"]
    idx = state["batches"][state["step"] % len(state["batches"])]
    train_batch = (state["x_train"][idx], state["w_train"][idx])
    optimizer.zero_grad()
    train_loss = compute_batch_loss(flow, train_batch, reduction=torch.mean)
    train_loss += flow.regularization()
    train_loss.backward()  # @backward
    optimizer.step()
    state["step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
