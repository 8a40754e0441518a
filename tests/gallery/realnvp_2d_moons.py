"""RealNVP on two moons (e-hulten/real-nvp-2d): affine couplings with a hand-written batch norm whose "running"
statistics are the last batch's mean and variance, kept on the module with their graph.

Source: e-hulten/real-nvp-2d, train.py and model.py (commit 094c7851ec181241bc0029fbac118569ccfeda80): RealNVP
(alternating masks, a CouplingLayer then a BatchNorm per layer in a plain list `self.coupling_layers`, also
wrapped in `self.model = nn.Sequential(...)`; `forward` sums `log_det_J` into `x.new_zeros(...)` in place;
`reverse`), CouplingLayer and ScaleTranslate as published, BatchNorm (`self.running_mean = m`,
`self.running_var = v` set at every forward, from the batch, without detach; `reverse` reads them), NegLogLik;
train.py's loop with `continue_training = False` (a new model): per epoch, for each batch `model.train()`,
`z, sum_log_det_J = model(batch)`, `loss = loss_log_det_J(z, sum_log_det_J)`, `optimizer.zero_grad()`,
`loss.backward()`, `optimizer.step()`; then (plot_interval 1) `model.eval()`, `z, _ = model(torch.from_numpy(x))`,
`z.detach().numpy()`, `x_n, _ = model.reverse(torch.from_numpy(z_norm))`, `x_n.detach().numpy()`. Retyped at CPU
size: 4 coupling layers (published 12), n_hidden 16 (published 100: the published RealNVP passes a literal
n_hidden=100 to CouplingLayer, here 16), 64 made-up two-moons points (data_loader's Dataset("moons") uses
sklearn; here the same two half circles with noise from numpy), batch 32 (published 100) in a fixed order
(published shuffle=True), 64 base samples for the reverse pass (published 2000); matplotlib / seaborn plots,
the GIF, printing and torch.save left out. One iteration is one epoch.
Not in TRUTH: each BatchNorm's `running_mean` / `running_var` (inside the list `model.coupling_layers`, deeper than
the probes look) hold the eval pass's graph, saved tensors unfreed, into the next epoch; no backward walks it and
detaching it changes nothing (a probe run by hand, outside the gallery; the tool does not note it either).
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3
N_HIDDEN = 16

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class RealNVP(nn.Module):
    def __init__(self, data_dim, n_c_layers=8, n_hidden=100, hidden_dims=2):
        super(RealNVP, self).__init__()
        assert (
            n_c_layers > 1
        ), "Need more than one coupling layer to transform all dimensions of x."

        self.base = torch.distributions.MultivariateNormal(
            torch.zeros(data_dim), torch.eye(data_dim)
        )

        self.mask = torch.arange(data_dim) % 2
        self.coupling_layers = []
        for _ in range(n_c_layers):
            self.coupling_layers.append(
                CouplingLayer(data_dim, self.mask, n_hidden=N_HIDDEN, hidden_dims=2)
            )
            self.coupling_layers.append(BatchNorm(data_dim))
            self.mask = 1 - self.mask

        self.model = nn.Sequential(*self.coupling_layers)

    def forward(self, x):
        sum_log_det_J = x.new_zeros(x.size(0))

        for i in range(len(self.coupling_layers)):
            x, log_det_J = self.coupling_layers[i](x)
            sum_log_det_J += log_det_J

        return x, sum_log_det_J

    def reverse(self, x):
        sum_log_det_J = x.new_zeros(x.size(0))
        for i in reversed(range(len(self.coupling_layers))):
            coupling_layer = self.coupling_layers[i]
            x, log_det_J = coupling_layer.reverse(x)
            sum_log_det_J += log_det_J

        return x, sum_log_det_J


class CouplingLayer(nn.Module):
    def __init__(self, data_dim, mask, n_hidden=100, hidden_dims=2):
        super(CouplingLayer, self).__init__()
        self.mask = mask
        self.scale = ScaleTranslate(data_dim, n_hidden, hidden_dims)
        self.translate = ScaleTranslate(data_dim, n_hidden, hidden_dims)

    def forward(self, x):
        x_m = x * self.mask

        s = self.scale(x_m)
        t = self.translate(x_m)
        s = s * (1 - self.mask)
        t = t * (1 - self.mask)

        z = x_m + (1.0 - self.mask) * x * torch.exp(s) + t
        log_det_J = torch.sum(s, 1)
        return z, log_det_J

    def reverse(self, x):
        x_m = x * self.mask
        s = self.scale(x_m)
        t = self.translate(x_m)
        z = x_m + (1.0 - self.mask) * (x - t) * torch.exp(-s)
        log_det_J = -torch.sum(s, 1)
        return z, log_det_J


class ScaleTranslate(nn.Module):
    def __init__(self, data_dim, n_hidden=256, hidden_dims=2):
        super(ScaleTranslate, self).__init__()
        self.layers = []

        self.layers.append(nn.Linear(data_dim, n_hidden))
        self.layers.append(nn.ReLU())
        for _ in range(1, hidden_dims):
            self.layers.append(nn.Linear(n_hidden, n_hidden))
            self.layers.append(nn.ReLU())
        self.layers.append(nn.Linear(n_hidden, data_dim))

        self.model = nn.Sequential(*self.layers)

    def forward(self, x):
        return self.model(x)


class BatchNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.zeros(1, dim).normal_(0, 0.05))
        self.beta = nn.Parameter(torch.zeros(1, dim).normal_(0, 0.05))
        self.running_mean = torch.zeros(1, dim)
        self.running_var = torch.ones(1, dim)

    def forward(self, x):
        m = x.mean(dim=0)
        v = torch.mean((x - m) ** 2, axis=0) + self.eps  # @batch_var
        self.running_mean = m
        self.running_var = v
        x_hat = (x - m) / torch.sqrt(v)
        x_hat = x_hat * torch.exp(self.gamma) + self.beta
        log_det = torch.sum(self.gamma) - 0.5 * torch.sum(torch.log(v))
        return x_hat, log_det

    def reverse(self, x):
        m = self.running_mean
        v = self.running_var

        x_hat = (x - self.beta) * torch.exp(-self.gamma) * torch.sqrt(v) + m
        log_det = torch.sum(-self.gamma + 0.5 * torch.log(v))
        return x_hat, log_det


class NegLogLik(nn.Module):
    def __init__(self, model):
        super(NegLogLik, self).__init__()
        self.base = model.base

    def __call__(self, z, sum_log_det_J):
        log_p = self.base.log_prob(z)
        return -(log_p + sum_log_det_J).mean()


def two_moons(n, noise=0.05, rng=None):
    """sklearn.datasets.make_moons(n, noise=...), written with numpy."""
    n_out = n // 2
    n_in = n - n_out
    outer = np.stack([np.cos(np.linspace(0, np.pi, n_out)), np.sin(np.linspace(0, np.pi, n_out))], 1)
    inner = np.stack([1 - np.cos(np.linspace(0, np.pi, n_in)), 1 - np.sin(np.linspace(0, np.pi, n_in)) - 0.5], 1)
    x = np.concatenate([outer, inner]) + rng.normal(scale=noise, size=(n, 2))
    return x.astype(np.float32)


def build() -> dict:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = two_moons(64, rng=rng)
    model = RealNVP(data_dim=x.shape[1], n_c_layers=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    loss_log_det_J = NegLogLik(model)
    train_loader = [torch.from_numpy(x[i:i + 32]) for i in range(0, len(x), 32)]
    z_norm = rng.multivariate_normal(np.zeros(2), np.eye(2), 64).astype(np.float32)
    return {"x": x, "model": model, "optimizer": optimizer, "loss_log_det_J": loss_log_det_J,
            "train_loader": train_loader, "z_norm": z_norm, "plots": []}


def iteration(state: dict) -> None:
    x, model, optimizer, loss_log_det_J, train_loader, z_norm = (
        state["x"], state["model"], state["optimizer"], state["loss_log_det_J"], state["train_loader"],
        state["z_norm"])
    for batch in train_loader:
        model.train()
        z, sum_log_det_J = model(batch)
        loss = loss_log_det_J(z, sum_log_det_J)

        optimizer.zero_grad()
        loss.backward()  # @backward
        optimizer.step()

    # plot_interval = 1: every epoch
    model.eval()
    z, _ = model(torch.from_numpy(x))
    z = z.detach().numpy()

    np.random.seed(0)
    x_n, _ = model.reverse(torch.from_numpy(z_norm))
    x_n = x_n.detach().numpy()
    state["plots"].append((z, x_n))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
