"""FactorVAE: the VAE step with retain_graph=True, then the discriminator's total-correlation step on permuted latents.

Source: 1Konny/FactorVAE, solver.py (commit 10d8a4c49937b8e94b88b6eb7ae293e99b521d50), Solver.train():
`x_recon, mu, logvar, z = self.VAE(x_true1)`, recon_loss and kl_divergence (ops.py), `D_z = self.D(z)`,
`vae_tc_loss = (D_z[:, :1] - D_z[:, 1:]).mean()`, `vae_loss = vae_recon_loss + vae_kld + self.gamma*vae_tc_loss`,
optim_VAE.zero_grad(), `vae_loss.backward(retain_graph=True)`, optim_VAE.step(); then
`z_prime = self.VAE(x_true2, no_dec=True)`, `z_pperm = permute_dims(z_prime).detach()`, `D_z_pperm =
self.D(z_pperm)`, `D_tc_loss = 0.5*(F.cross_entropy(D_z, zeros) + F.cross_entropy(D_z_pperm, ones))`,
optim_D.zero_grad(), D_tc_loss.backward(), optim_D.step(). model.py's FactorVAE1 (dSprites: its
reparametrize with `exp_()` and `add_(mu)`, ReLU(True)) and Discriminator (LeakyReLU(0.2, True), 2 logits),
ops.py's recon_loss (`size_average=False`, which torch 2.13 still takes, with a warning), kl_divergence and
permute_dims; main.py's defaults (gamma 6.4, Adam lr 1e-4 betas (0.9, 0.999) for the VAE, lr 1e-5 betas
(0.5, 0.9) for D). Retyped at CPU size: the conv stack keeps its kernels and strides on 64x64 inputs with
4/4/8/8/16 channels (published 32/32/64/64/128), z_dim 3 (published 10), the discriminator's five hidden
layers 16 wide (published 1000), normal_init kept; batch 4 of made-up binary images in place of dSprites
pairs; the printing, checkpoints and visdom are left out. As published, on torch 2.13 the discriminator's
backward walks D_z back into the encoder that optim_VAE.step() has just changed in place, and raises.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@d_tc_backward"},
    "retains": {"@vae_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def recon_loss(x, x_recon):
    n = x.size(0)
    loss = F.binary_cross_entropy_with_logits(x_recon, x, size_average=False).div(n)
    return loss


def kl_divergence(mu, logvar):
    kld = -0.5*(1+logvar-mu**2-logvar.exp()).sum(1).mean()
    return kld


def permute_dims(z):
    assert z.dim() == 2

    B, _ = z.size()
    perm_z = []
    for z_j in z.split(1, 1):
        perm = torch.randperm(B).to(z.device)
        perm_z_j = z_j[perm]
        perm_z.append(perm_z_j)

    return torch.cat(perm_z, 1)


class Discriminator(nn.Module):
    def __init__(self, z_dim):
        super(Discriminator, self).__init__()
        self.z_dim = z_dim
        self.net = nn.Sequential(
            nn.Linear(z_dim, 16),
            nn.LeakyReLU(0.2, True),
            nn.Linear(16, 16),
            nn.LeakyReLU(0.2, True),
            nn.Linear(16, 16),
            nn.LeakyReLU(0.2, True),
            nn.Linear(16, 16),
            nn.LeakyReLU(0.2, True),
            nn.Linear(16, 16),
            nn.LeakyReLU(0.2, True),
            nn.Linear(16, 2),
        )
        self.weight_init()

    def weight_init(self, mode='normal'):
        if mode == 'kaiming':
            initializer = kaiming_init
        elif mode == 'normal':
            initializer = normal_init

        for block in self._modules:
            for m in self._modules[block]:
                initializer(m)

    def forward(self, z):
        return self.net(z).squeeze()


class FactorVAE1(nn.Module):
    """Encoder and Decoder architecture for 2D Shapes data."""
    def __init__(self, z_dim=10):
        super(FactorVAE1, self).__init__()
        self.z_dim = z_dim
        self.encode = nn.Sequential(
            nn.Conv2d(1, 4, 4, 2, 1),
            nn.ReLU(True),
            nn.Conv2d(4, 4, 4, 2, 1),
            nn.ReLU(True),
            nn.Conv2d(4, 8, 4, 2, 1),
            nn.ReLU(True),
            nn.Conv2d(8, 8, 4, 2, 1),
            nn.ReLU(True),
            nn.Conv2d(8, 16, 4, 1),
            nn.ReLU(True),
            nn.Conv2d(16, 2*z_dim, 1)
        )
        self.decode = nn.Sequential(
            nn.Conv2d(z_dim, 16, 1),
            nn.ReLU(True),
            nn.ConvTranspose2d(16, 8, 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(8, 8, 4, 2, 1),
            nn.ReLU(True),
            nn.ConvTranspose2d(8, 4, 4, 2, 1),
            nn.ReLU(True),
            nn.ConvTranspose2d(4, 4, 4, 2, 1),
            nn.ReLU(True),
            nn.ConvTranspose2d(4, 1, 4, 2, 1),
        )
        self.weight_init()

    def weight_init(self, mode='normal'):
        if mode == 'kaiming':
            initializer = kaiming_init
        elif mode == 'normal':
            initializer = normal_init

        for block in self._modules:
            for m in self._modules[block]:
                initializer(m)

    def reparametrize(self, mu, logvar):
        std = logvar.mul(0.5).exp_()
        eps = std.data.new(std.size()).normal_()
        return eps.mul(std).add_(mu)

    def forward(self, x, no_dec=False):
        stats = self.encode(x)
        mu = stats[:, :self.z_dim]
        logvar = stats[:, self.z_dim:]
        z = self.reparametrize(mu, logvar)

        if no_dec:
            return z.squeeze()
        else:
            x_recon = self.decode(z).view(x.size())
            return x_recon, mu, logvar, z.squeeze()


def kaiming_init(m):
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        init.kaiming_normal_(m.weight)
        if m.bias is not None:
            m.bias.data.fill_(0)
    elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        m.weight.data.fill_(1)
        if m.bias is not None:
            m.bias.data.fill_(0)


def normal_init(m):
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        init.normal_(m.weight, 0, 0.02)
        if m.bias is not None:
            m.bias.data.fill_(0)
    elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        m.weight.data.fill_(1)
        if m.bias is not None:
            m.bias.data.fill_(0)


def build() -> dict:
    torch.manual_seed(1)
    batch_size, z_dim = 4, 3
    VAE = FactorVAE1(z_dim)
    D = Discriminator(z_dim)
    data_loader = [((torch.rand(batch_size, 1, 64, 64) > 0.8).float(), (torch.rand(batch_size, 1, 64, 64) > 0.8).float())
                   for _ in range(ITERATIONS)]
    state = {
        "VAE": VAE,
        "optim_VAE": optim.Adam(VAE.parameters(), lr=1e-4, betas=(0.9, 0.999)),
        "D": D,
        "optim_D": optim.Adam(D.parameters(), lr=1e-5, betas=(0.5, 0.9)),
        "gamma": 6.4,
        "data_loader": data_loader,
        "global_iter": 0,
        "ones": torch.ones(batch_size, dtype=torch.long),
        "zeros": torch.zeros(batch_size, dtype=torch.long),
    }
    for net in [VAE, D]:
        net.train()
    return state


def iteration(state: dict) -> None:
    VAE, D, optim_VAE, optim_D = state["VAE"], state["D"], state["optim_VAE"], state["optim_D"]
    ones, zeros = state["ones"], state["zeros"]
    x_true1, x_true2 = state["data_loader"][state["global_iter"] % len(state["data_loader"])]
    state["global_iter"] += 1

    x_recon, mu, logvar, z = VAE(x_true1)
    vae_recon_loss = recon_loss(x_true1, x_recon)
    vae_kld = kl_divergence(mu, logvar)

    D_z = D(z)
    vae_tc_loss = (D_z[:, :1] - D_z[:, 1:]).mean()

    vae_loss = vae_recon_loss + vae_kld + state["gamma"]*vae_tc_loss

    optim_VAE.zero_grad()
    vae_loss.backward(retain_graph=True)  # @vae_backward
    optim_VAE.step()

    z_prime = VAE(x_true2, no_dec=True)
    z_pperm = permute_dims(z_prime).detach()
    D_z_pperm = D(z_pperm)
    D_tc_loss = 0.5*(F.cross_entropy(D_z, zeros) + F.cross_entropy(D_z_pperm, ones))

    optim_D.zero_grad()
    D_tc_loss.backward()  # @d_tc_backward
    optim_D.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
