"""Variational Recurrent Neural Network (VRNN) on MNIST rows: KL + Bernoulli NLL, the state cut inside the sequence.

Source: emited/VariationalRecurrentNeuralNetwork, model.py and train.py (commit
2c30f0399179d878a644dc7576056b763d4bc792), and its issue #1
(https://github.com/emited/VariationalRecurrentNeuralNetwork/issues/1, "Repackaging of states necessary?": the
`_repackage_state` call at the top of each time step cuts the gradients behind h_{t-1}). As published: the VRNN
(phi_x, phi_z, enc/enc_mean/enc_std, prior/prior_mean/prior_std, dec/dec_mean/dec_std, a GRU recurrence), `h`
made fresh at the start of every `forward`, repackaged at each time step, `_reparameterized_sample` as
`eps.mul(std).add_(mean)`, `_kld_gauss`, `_nll_bernoulli`; train(): the per-batch min-max scaling,
`optimizer.zero_grad()`, `kld_loss, nll_loss, _, _ = model(data)`, `loss = kld_loss + nll_loss`, `loss.backward()`,
`optimizer.step()`, then `nn.utils.clip_grad_norm(model.parameters(), clip)` (after the step, as published).
Retyped at CPU size: rows of 8 pixels (published 28), 6 time steps (28), h_dim 16 (100), z_dim 4 (16), batches
of 4 (128) of made-up images in [0, 1] in place of MNIST; `Variable(h.data)` is `h.detach()` (the same cut: a
leaf without gradient), `.data[0]` is `.item()`, `torch.FloatTensor(size).normal_()` is `torch.randn(size)`;
printing, sampling, plotting, test and checkpoints left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
X_DIM, H_DIM, Z_DIM, N_LAYERS, SEQ, BATCH = 8, 16, 4, 1, 6, 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class VRNN(nn.Module):
    def __init__(self, x_dim, h_dim, z_dim, n_layers, bias=False):
        super(VRNN, self).__init__()

        self.x_dim = x_dim
        self.h_dim = h_dim
        self.z_dim = z_dim
        self.n_layers = n_layers

        #feature-extracting transformations
        self.phi_x = nn.Sequential(
            nn.Linear(x_dim, h_dim),
            nn.ReLU(),
            nn.Linear(h_dim, h_dim),
            nn.ReLU())
        self.phi_z = nn.Sequential(
            nn.Linear(z_dim, h_dim),
            nn.ReLU())

        #encoder
        self.enc = nn.Sequential(
            nn.Linear(h_dim + h_dim, h_dim),
            nn.ReLU(),
            nn.Linear(h_dim, h_dim),
            nn.ReLU())
        self.enc_mean = nn.Linear(h_dim, z_dim)
        self.enc_std = nn.Sequential(
            nn.Linear(h_dim, z_dim),
            nn.Softplus())

        #prior
        self.prior = nn.Sequential(
            nn.Linear(h_dim, h_dim),
            nn.ReLU())
        self.prior_mean = nn.Linear(h_dim, z_dim)
        self.prior_std = nn.Sequential(
            nn.Linear(h_dim, z_dim),
            nn.Softplus())

        #decoder
        self.dec = nn.Sequential(
            nn.Linear(h_dim + h_dim, h_dim),
            nn.ReLU(),
            nn.Linear(h_dim, h_dim),
            nn.ReLU())
        self.dec_std = nn.Sequential(
            nn.Linear(h_dim, x_dim),
            nn.Softplus())
        self.dec_mean = nn.Sequential(
            nn.Linear(h_dim, x_dim),
            nn.Sigmoid())

        #recurrence
        self.rnn = nn.GRU(h_dim + h_dim, h_dim, n_layers, bias)

    def forward(self, x):

        all_enc_mean, all_enc_std = [], []
        all_dec_mean, all_dec_std = [], []
        kld_loss = 0
        nll_loss = 0

        h = torch.zeros(self.n_layers, x.size(1), self.h_dim)
        for t in range(x.size(0)):

            h = self._repackage_state(h)

            phi_x_t = self.phi_x(x[t])

            #encoder
            enc_t = self.enc(torch.cat([phi_x_t, h[-1]], 1))
            enc_mean_t = self.enc_mean(enc_t)
            enc_std_t = self.enc_std(enc_t)

            #prior
            prior_t = self.prior(h[-1])
            prior_mean_t = self.prior_mean(prior_t)
            prior_std_t = self.prior_std(prior_t)

            #sampling and reparameterization
            z_t = self._reparameterized_sample(enc_mean_t, enc_std_t)
            phi_z_t = self.phi_z(z_t)

            #decoder
            dec_t = self.dec(torch.cat([phi_z_t, h[-1]], 1))
            dec_mean_t = self.dec_mean(dec_t)
            dec_std_t = self.dec_std(dec_t)

            #recurrence
            _, h = self.rnn(torch.cat([phi_x_t, phi_z_t], 1).unsqueeze(0), h)

            #computing losses
            kld_loss += self._kld_gauss(enc_mean_t, enc_std_t, prior_mean_t, prior_std_t)
            nll_loss += self._nll_bernoulli(dec_mean_t, x[t])

            all_enc_std.append(enc_std_t)
            all_enc_mean.append(enc_mean_t)
            all_dec_mean.append(dec_mean_t)
            all_dec_std.append(dec_std_t)

        return kld_loss, nll_loss, \
            (all_enc_mean, all_enc_std), \
            (all_dec_mean, all_dec_std)

    def _repackage_state(self, h):
        if isinstance(h, torch.Tensor):
            return h.detach()
        else:
            return tuple(self._repackage_state(v) for v in h)

    def _reparameterized_sample(self, mean, std):
        """using std to sample"""
        eps = torch.randn(std.size())
        return eps.mul(std).add_(mean)

    def _kld_gauss(self, mean_1, std_1, mean_2, std_2):
        """Using std to compute KLD"""

        kld_element = (2 * torch.log(std_2) - 2 * torch.log(std_1) +
            (std_1.pow(2) + (mean_1 - mean_2).pow(2)) /
            std_2.pow(2) - 1)
        return 0.5 * torch.sum(kld_element)

    def _nll_bernoulli(self, theta, x):
        return - torch.sum(x*torch.log(theta) + (1-x)*torch.log(1-theta))


def build() -> dict:
    torch.manual_seed(128)
    model = VRNN(X_DIM, H_DIM, Z_DIM, N_LAYERS)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.rand(ITERATIONS * 2, BATCH, 1, SEQ, X_DIM)
    return {"model": model, "optimizer": optimizer, "images": images, "batch_idx": 0, "clip": 10,
            "train_loss": 0.0}


def iteration(state: dict) -> None:
    model, optimizer, clip = state["model"], state["optimizer"], state["clip"]
    data = state["images"][state["batch_idx"] % len(state["images"])]
    state["batch_idx"] += 1

    #transforming data
    data = data.squeeze().transpose(0, 1)
    data = (data - data.min().item()) / (data.max().item() - data.min().item())

    #forward + backward + optimize
    optimizer.zero_grad()
    kld_loss, nll_loss, _, _ = model(data)
    loss = kld_loss + nll_loss
    loss.backward()
    optimizer.step()

    #grad norm clipping, only in pytorch version >= 1.10
    nn.utils.clip_grad_norm_(model.parameters(), clip)

    state["train_loss"] += loss.item()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
