"""World Models' MDN-RNN: an LSTM over latent/action sequences, a GMM head, the GMM + BCE + MSE loss.

Source: ctallec/world-models, trainmdrnn.py (commit 090534676e5d8cfaf26cc3b75f3f777a4922c5fb): to_latent (the
VAE's mu and logsigma under torch.no_grad(), `f.upsample` to RED_SIZE, a sample `mu + logsigma.exp() *
randn_like(mu)`), get_loss (every array transposed to sequence-first, `mus, sigmas, pi, rs, ds = mdrnn(action,
latent_obs)`, gmm_loss, `binary_cross_entropy_with_logits` on the terminals, `mse_loss` on the rewards, their sum
over LSIZE + 2), data_pass with train=True (zero_grad, `losses['loss'].backward()`, step, the cumulated losses as
floats); RMSprop lr 1e-3, alpha .9; and models/mdrnn.py (master): gmm_loss (Normal log_prob summed over features,
plus logpi, the max trick, `- torch.mean(log_prob)`), _MDRNNBase's gmm_linear, MDRNN (`nn.LSTM(latents +
actions, hiddens)`, `outs, _ = self.rnn(ins)`: each sequence starts from a zero hidden state, none is kept).
Retyped at CPU size: LSIZE 4 (published 32), ASIZE 3, RSIZE 8 (published 256), 5 Gaussians as published, BSIZE 2
(published 16), SEQ_LEN 4 (published 32), SIZE 8 and RED_SIZE 4 (published 96 and 64); the VAE is a CPU-size
stand-in with the published VAE's outputs (recon, mu, logsigma), randomly initialised instead of loaded from
best.tar; the RolloutSequenceDataset becomes 2 made-up batches (obs, action, reward, terminal, next_obs) of the
published shapes; one epoch per iteration, tqdm, the test pass and checkpoints are left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as f
from torch.distributions.normal import Normal

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

ASIZE, LSIZE, RSIZE, RED_SIZE, SIZE = 3, 4, 8, 4, 8
BSIZE = 2
SEQ_LEN = 4
device = torch.device("cpu")


def gmm_loss(batch, mus, sigmas, logpi, reduce=True):  # pylint: disable=too-many-arguments
    """Computes the gmm loss.

    Compute minus the log probability of batch under the GMM model described
    by mus, sigmas, pi. Precisely, with bs1, bs2, ... the sizes of the batch
    dimensions (several batch dimension are useful when you have both a batch
    axis and a time step axis), gs the number of mixtures and fs the number of
    features.
    """
    batch = batch.unsqueeze(-2)
    normal_dist = Normal(mus, sigmas)
    g_log_probs = normal_dist.log_prob(batch)
    g_log_probs = logpi + torch.sum(g_log_probs, dim=-1)
    max_log_probs = torch.max(g_log_probs, dim=-1, keepdim=True)[0]
    g_log_probs = g_log_probs - max_log_probs

    g_probs = torch.exp(g_log_probs)
    probs = torch.sum(g_probs, dim=-1)

    log_prob = max_log_probs.squeeze() + torch.log(probs)
    if reduce:
        return -torch.mean(log_prob)
    return -log_prob


class _MDRNNBase(nn.Module):
    def __init__(self, latents, actions, hiddens, gaussians):
        super().__init__()
        self.latents = latents
        self.actions = actions
        self.hiddens = hiddens
        self.gaussians = gaussians

        self.gmm_linear = nn.Linear(hiddens, (2 * latents + 1) * gaussians + 2)

    def forward(self, *inputs):
        pass


class MDRNN(_MDRNNBase):
    """MDRNN model for multi steps forward"""

    def __init__(self, latents, actions, hiddens, gaussians):
        super().__init__(latents, actions, hiddens, gaussians)
        self.rnn = nn.LSTM(latents + actions, hiddens)

    def forward(self, actions, latents):  # pylint: disable=arguments-differ
        """MULTI STEPS forward."""
        seq_len, bs = actions.size(0), actions.size(1)

        ins = torch.cat([actions, latents], dim=-1)
        outs, _ = self.rnn(ins)
        gmm_outs = self.gmm_linear(outs)

        stride = self.gaussians * self.latents

        mus = gmm_outs[:, :, :stride]
        mus = mus.view(seq_len, bs, self.gaussians, self.latents)

        sigmas = gmm_outs[:, :, stride : 2 * stride]
        sigmas = sigmas.view(seq_len, bs, self.gaussians, self.latents)
        sigmas = torch.exp(sigmas)

        pi = gmm_outs[:, :, 2 * stride : 2 * stride + self.gaussians]
        pi = pi.view(seq_len, bs, self.gaussians)
        logpi = f.log_softmax(pi, dim=-1)

        rs = gmm_outs[:, :, -2]

        ds = gmm_outs[:, :, -1]

        return mus, sigmas, logpi, rs, ds


class VAE(nn.Module):
    """A CPU-size stand-in for models/vae.py's VAE: the same outputs (recon_x, mu, logsigma)."""

    def __init__(self, img_channels, latent_size):
        super().__init__()
        self.fc_mu = nn.Linear(img_channels * RED_SIZE * RED_SIZE, latent_size)
        self.fc_logsigma = nn.Linear(img_channels * RED_SIZE * RED_SIZE, latent_size)
        self.fc_dec = nn.Linear(latent_size, img_channels * RED_SIZE * RED_SIZE)

    def forward(self, x):
        flat = x.view(x.size(0), -1)
        mu, logsigma = self.fc_mu(flat), self.fc_logsigma(flat)
        sigma = logsigma.exp()
        eps = torch.randn_like(sigma)
        z = eps.mul(sigma).add_(mu)
        recon_x = torch.sigmoid(self.fc_dec(z))
        return recon_x, mu, logsigma


def to_latent(obs, next_obs):
    """Transform observations to latent space."""
    with torch.no_grad():
        obs, next_obs = [
            f.upsample(x.view(-1, 3, SIZE, SIZE), size=RED_SIZE, mode="bilinear", align_corners=True)
            for x in (obs, next_obs)
        ]

        (obs_mu, obs_logsigma), (next_obs_mu, next_obs_logsigma) = [vae(x)[1:] for x in (obs, next_obs)]

        latent_obs, latent_next_obs = [
            (x_mu + x_logsigma.exp() * torch.randn_like(x_mu)).view(BSIZE, SEQ_LEN, LSIZE)
            for x_mu, x_logsigma in [(obs_mu, obs_logsigma), (next_obs_mu, next_obs_logsigma)]
        ]
    return latent_obs, latent_next_obs


def get_loss(latent_obs, action, reward, terminal, latent_next_obs):
    """Compute losses.

    (GMMLoss(latent_next_obs, GMMPredicted) + MSE(reward, predicted_reward) +
         BCE(terminal, logit_terminal)) / (LSIZE + 2)
    """
    latent_obs, action, reward, terminal, latent_next_obs = [
        arr.transpose(1, 0) for arr in [latent_obs, action, reward, terminal, latent_next_obs]
    ]
    mus, sigmas, pi, rs, ds = mdrnn(action, latent_obs)  # @mdrnn_forward
    gmm = gmm_loss(latent_next_obs, mus, sigmas, pi)
    bce = f.binary_cross_entropy_with_logits(ds, terminal)
    mse = f.mse_loss(rs, reward)
    loss = (gmm + bce + mse) / (LSIZE + 2)
    return dict(gmm=gmm, bce=bce, mse=mse, loss=loss)


def data_pass(epoch, train):  # pylint: disable=too-many-locals
    """One pass through the data"""
    if train:
        mdrnn.train()
        loader = train_loader
    else:
        mdrnn.eval()
        loader = test_loader

    cum_loss = 0
    cum_gmm = 0
    cum_bce = 0
    cum_mse = 0

    for i, data in enumerate(loader):
        obs, action, reward, terminal, next_obs = [arr.to(device) for arr in data]

        # transform obs
        latent_obs, latent_next_obs = to_latent(obs, next_obs)

        if train:
            losses = get_loss(latent_obs, action, reward, terminal, latent_next_obs)

            optimizer.zero_grad()
            losses["loss"].backward()  # @backward
            optimizer.step()
        else:
            with torch.no_grad():
                losses = get_loss(latent_obs, action, reward, terminal, latent_next_obs)

        cum_loss += losses["loss"].item()
        cum_gmm += losses["gmm"].item()
        cum_bce += losses["bce"].item()
        cum_mse += losses["mse"].item()

    return cum_loss * BSIZE / (len(loader) * BSIZE)


def rollout_batch():
    """Stands in for a RolloutSequenceDataset batch: obs, action, reward, terminal, next_obs."""
    obs = torch.rand(BSIZE, SEQ_LEN, 3, SIZE, SIZE)
    action = torch.randn(BSIZE, SEQ_LEN, ASIZE)
    reward = torch.randn(BSIZE, SEQ_LEN)
    terminal = (torch.rand(BSIZE, SEQ_LEN) < 0.2).float()
    next_obs = torch.rand(BSIZE, SEQ_LEN, 3, SIZE, SIZE)
    return obs, action, reward, terminal, next_obs


def build() -> dict:
    """The script's globals, made afresh: the VAE, the MDRNN, RMSprop and the loaders."""
    global vae, mdrnn, optimizer, train_loader, test_loader
    torch.manual_seed(0)
    vae = VAE(3, LSIZE).to(device)
    mdrnn = MDRNN(LSIZE, ASIZE, RSIZE, 5)
    mdrnn.to(device)
    optimizer = torch.optim.RMSprop(mdrnn.parameters(), lr=1e-3, alpha=0.9)
    train_loader = [rollout_batch() for _ in range(2)]
    test_loader = [rollout_batch()]
    return {"vae": vae, "mdrnn": mdrnn, "optimizer": optimizer, "train_loader": train_loader, "epoch": 0}


def iteration(state: dict) -> None:
    data_pass(state["epoch"], train=True)
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for e in range(iterations):
        data_pass(e, train=True)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
