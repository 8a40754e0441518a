"""Glow: ActNorm initialised from the first batch it sees, log-det terms summed over blocks, one backward per batch.

Source: rosinality/glow-pytorch, model.py (commit 490159d97d9ee6542f26707a4c44d3e5f080b044): ActNorm (loc and scale
copied into `.data` from the first input's per-channel mean and std under no_grad, `self.initialized` then True,
`logdet = height * width * torch.sum(log_abs)`), InvConv2dLU (`logdet = height * width * sum(self.w_s)`, Python's
`sum` over the parameter), ZeroConv2d, AffineCoupling (`s = F.sigmoid(log_s + 2)`), Flow, Block (squeeze, flows,
split with a learned prior), Glow returning `log_p_sum, logdet`; and the training loop of train.py as stored for the
same repository (commit 00039e6f4e98deb29c7c0aab9a97c133ee569806): per batch `optimizer.zero_grad()`, `noisy_image =
image`, `noisy_image += torch.rand_like(image) / n_bins` (dequantisation, in place on the loader's batch),
`model(noisy_image)`, `logdet = logdet.mean()`, calc_loss (`-log(n_bins) * n_pixel + logdet + log_p`, in bits per
dimension), `loss.backward()`, `optimizer.step()`, `train_losses.append(loss.item())`. That loop unpacks
`log_p, logdet, _` from a later model; this model returns two values and is unpacked as such. Retyped at CPU size:
1x8x8 made-up images in [-0.5, 0.5) (n_bits 5) in batches of 4, n_block 2, n_flow 2, coupling filter_size 512 cut to
8; scipy's `la.qr` and `la.lu` in InvConv2dLU's constructor replaced by torch.linalg.qr and torch.linalg.lu_factor's
same P, L, U (only torch, numpy and the standard library here); no delta noise (args.delta 0); the DataLoader's
collate (a fresh stacked batch each time) kept as a stack; sampling, validation and checkpoints left out.
"""

from collections.abc import Callable
from math import log, pi

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ITERATIONS = 3
IMG_SIZE = 8
N_BITS = 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

logabs = lambda x: torch.log(torch.abs(x))  # noqa: E731 (as published)


class ActNorm(nn.Module):
    def __init__(self, in_channel, logdet=True):
        super().__init__()

        self.loc = nn.Parameter(torch.zeros(1, in_channel, 1, 1))
        self.scale = nn.Parameter(torch.ones(1, in_channel, 1, 1))

        self.initialized = False
        self.logdet = logdet

    def initialize(self, input):
        with torch.no_grad():
            flatten = input.permute(1, 0, 2, 3).contiguous().view(input.shape[1], -1)
            mean = (
                flatten.mean(1)
                .unsqueeze(1)
                .unsqueeze(2)
                .unsqueeze(3)
                .permute(1, 0, 2, 3)
            )
            std = (
                flatten.std(1)
                .unsqueeze(1)
                .unsqueeze(2)
                .unsqueeze(3)
                .permute(1, 0, 2, 3)
            )

            self.loc.data.copy_(-mean)
            self.scale.data.copy_(1 / (std + 1e-6))

    def forward(self, input):
        _, _, height, width = input.shape

        if not self.initialized:
            self.initialize(input)
            self.initialized = True

        log_abs = logabs(self.scale)

        logdet = height * width * torch.sum(log_abs)

        if self.logdet:
            return self.scale * (input + self.loc), logdet

        else:
            return self.scale * (input + self.loc)


class InvConv2dLU(nn.Module):
    def __init__(self, in_channel):
        super().__init__()

        weight = np.random.randn(in_channel, in_channel)
        q, _ = torch.linalg.qr(torch.from_numpy(weight))
        w_p, w_l, w_u = torch.linalg.lu(q.float())
        w_p, w_l, w_u = w_p.numpy(), w_l.numpy(), w_u.numpy()
        w_s = np.diag(w_u)
        w_u = np.triu(w_u, 1)
        u_mask = np.triu(np.ones_like(w_u), 1)
        l_mask = u_mask.T

        w_p = torch.from_numpy(w_p)
        w_l = torch.from_numpy(w_l)
        w_s = torch.from_numpy(w_s.copy())
        w_u = torch.from_numpy(w_u)

        self.register_buffer('w_p', w_p)
        self.register_buffer('u_mask', torch.from_numpy(u_mask))
        self.register_buffer('l_mask', torch.from_numpy(l_mask.copy()))
        self.register_buffer('s_sign', torch.sign(w_s))
        self.register_buffer('l_eye', torch.eye(l_mask.shape[0]))
        self.w_l = nn.Parameter(w_l)
        self.w_s = nn.Parameter(logabs(w_s))
        self.w_u = nn.Parameter(w_u)

    def forward(self, input):
        _, _, height, width = input.shape

        weight = self.calc_weight()

        out = F.conv2d(input, weight)
        logdet = height * width * sum(self.w_s)

        return out, logdet

    def calc_weight(self):
        weight = (
            self.w_p
            @ (self.w_l * self.l_mask + self.l_eye)
            @ ((self.w_u * self.u_mask) + torch.diag(self.s_sign * torch.exp(self.w_s)))
        )

        return weight.unsqueeze(2).unsqueeze(3)


class ZeroConv2d(nn.Module):
    def __init__(self, in_channel, out_channel, padding=1):
        super().__init__()

        self.conv = nn.Conv2d(in_channel, out_channel, 3, padding=0)
        self.conv.weight.data.zero_()
        self.conv.bias.data.zero_()
        self.scale = nn.Parameter(torch.zeros(1, out_channel, 1, 1))

    def forward(self, input):
        out = F.pad(input, [1, 1, 1, 1], value=1)
        out = self.conv(out)
        out = out * torch.exp(self.scale * 3)

        return out


class AffineCoupling(nn.Module):
    def __init__(self, in_channel, filter_size=8, affine=True):
        super().__init__()

        self.affine = affine

        self.net = nn.Sequential(
            nn.Conv2d(in_channel // 2, filter_size, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(filter_size, filter_size, 1),
            nn.ReLU(),
            ZeroConv2d(filter_size, in_channel if self.affine else in_channel // 2),
        )

        self.net[0].weight.data.normal_(0, 0.05)
        self.net[0].bias.data.zero_()

        self.net[2].weight.data.normal_(0, 0.05)
        self.net[2].bias.data.zero_()

    def forward(self, input):
        in_a, in_b = input.chunk(2, 1)

        if self.affine:
            log_s, t = self.net(in_a).chunk(2, 1)
            # s = torch.exp(log_s)
            s = F.sigmoid(log_s + 2)
            # out_a = s * in_a + t
            out_b = (in_b + t) * s

            logdet = torch.sum(torch.log(s).view(input.shape[0], -1), 1)

        else:
            net_out = self.net(in_a)
            out_b = in_b + net_out
            logdet = None

        return torch.cat([in_a, out_b], 1), logdet


class Flow(nn.Module):
    def __init__(self, in_channel, affine=True, conv_lu=True):
        super().__init__()

        self.actnorm = ActNorm(in_channel)
        self.invconv = InvConv2dLU(in_channel)
        self.coupling = AffineCoupling(in_channel, affine=affine)

    def forward(self, input):
        out, logdet = self.actnorm(input)
        out, det1 = self.invconv(out)
        out, det2 = self.coupling(out)

        logdet = logdet + det1
        if det2 is not None:
            logdet = logdet + det2

        return out, logdet


def gaussian_log_p(x, mean, log_sd):
    return -0.5 * log(2 * pi) - log_sd - 0.5 * (x - mean) ** 2 / torch.exp(2 * log_sd)


class Block(nn.Module):
    def __init__(self, in_channel, n_flow, split=True, affine=True, conv_lu=True):
        super().__init__()

        squeeze_dim = in_channel * 4

        self.flows = nn.ModuleList()
        for i in range(n_flow):
            self.flows.append(Flow(squeeze_dim, affine=affine, conv_lu=conv_lu))

        self.split = split

        if split:
            self.prior = ZeroConv2d(in_channel * 2, in_channel * 4)

        else:
            self.prior = ZeroConv2d(in_channel * 4, in_channel * 8)

    def forward(self, input):
        b_size, n_channel, height, width = input.shape
        squeezed = input.view(b_size, n_channel, height // 2, 2, width // 2, 2)
        squeezed = squeezed.permute(0, 1, 3, 5, 2, 4)
        out = squeezed.contiguous().view(b_size, n_channel * 4, height // 2, width // 2)

        logdet = 0

        for flow in self.flows:
            out, det = flow(out)
            logdet = logdet + det

        if self.split:
            out, z_new = out.chunk(2, 1)
            mean, log_sd = self.prior(out).chunk(2, 1)
            log_p = gaussian_log_p(z_new, mean, log_sd)
            log_p = log_p.view(b_size, -1).sum(1)

        else:
            zero = torch.zeros_like(out)
            mean, log_sd = self.prior(zero).chunk(2, 1)
            log_p = gaussian_log_p(out, mean, log_sd)
            log_p = log_p.view(b_size, -1).sum(1)
            z_new = out

        return out, logdet, log_p


class Glow(nn.Module):
    def __init__(self, in_channel, n_flow, n_block, affine=True, conv_lu=True):
        super().__init__()

        self.blocks = nn.ModuleList()
        n_channel = in_channel
        for i in range(n_block - 1):
            self.blocks.append(Block(n_channel, n_flow, affine=affine, conv_lu=conv_lu))
            n_channel *= 2
        self.blocks.append(Block(n_channel, n_flow, split=False, affine=affine))

    def forward(self, input):
        log_p_sum = 0
        logdet = 0
        out = input

        for block in self.blocks:
            out, det, log_p = block(out)
            logdet = logdet + det

            if log_p is not None:
                log_p_sum = log_p_sum + log_p

        return log_p_sum, logdet


def calc_loss(log_p, logdet, image_size, n_bins, n_channels):
    n_pixel = image_size * image_size * n_channels

    loss = -log(n_bins) * n_pixel
    loss = loss + logdet + log_p

    return (
        (-loss / (log(2) * n_pixel)).mean(),
        (log_p / (log(2) * n_pixel)).mean(),
        (logdet / (log(2) * n_pixel)).mean(),
    )


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    model = Glow(1, 2, 2, affine=True, conv_lu=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    n_bins = 2.0 ** N_BITS
    images = torch.floor(torch.rand(24, 1, IMG_SIZE, IMG_SIZE) * n_bins) / n_bins - 0.5
    return {"model": model, "optimizer": optimizer, "images": images, "n_bins": n_bins, "batch": 0,
            "train_losses": []}


def iteration(state: dict) -> None:
    model, optimizer, n_bins = state["model"], state["optimizer"], state["n_bins"]
    start = 4 * (state["batch"] % 6)
    image = torch.stack(list(state["images"][start:start + 4]))  # the DataLoader's collate
    state["batch"] += 1
    optimizer.zero_grad()
    noisy_image = image
    noisy_image += torch.rand_like(image) / n_bins
    log_p, logdet = model(noisy_image)

    logdet = logdet.mean()
    loss, log_p, log_det = calc_loss(log_p, logdet, IMG_SIZE, n_bins, 1)
    loss.backward()
    optimizer.step()
    state["train_losses"].append(loss.item())


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
