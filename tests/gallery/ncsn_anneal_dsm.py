"""NCSN: denoising score matching over annealed noise levels, one backward per batch.

Source: ermongroup/ncsn, runners/anneal_runner.py (commit 2df29af64788d87323bb3b7200d6bf2d557bdb76), AnnealRunner.train:
per batch `step += 1`, `score.train()`, the dequantisation `X = X / 256. * 255. + torch.rand_like(X) / 256.`,
`labels = torch.randint(0, len(sigmas), ...)`, `loss = anneal_dsm_score_estimation(score, X, labels, sigmas,
anneal_power)`, `optimizer.zero_grad()`, `loss.backward()`, `optimizer.step()`, the `loss.item()` logging; `sigmas`, the
geometric noise levels, made once before the loop with `torch.tensor(np.exp(np.linspace(...))).float()`; and
losses/dsm.py (same commit), anneal_dsm_score_estimation as published. The score network CondRefineNetDilated is
retyped at CPU size as a two-conv network with the repository's ConditionalInstanceNorm2dPlus (an nn.Embedding per
noise level for gamma, alpha, beta) and ELU between them (ngf 64 cut to 8); made-up 1x8x8 images in [0, 1] in
batches of 4 (published MNIST 28x28 from a DataLoader), 10 noise levels from 1 to 0.01 (the anneal.yml values), Adam at
lr 0.001. Left out: DataParallel, tensorboardX, the every-100-steps test loss under no_grad, checkpoints; the annealed
Langevin sampler runs in `test()`, after training, under no_grad, and is not part of this loop.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def anneal_dsm_score_estimation(scorenet, samples, labels, sigmas, anneal_power=2.):
    used_sigmas = sigmas[labels].view(samples.shape[0], *([1] * len(samples.shape[1:])))
    perturbed_samples = samples + torch.randn_like(samples) * used_sigmas
    target = - 1 / (used_sigmas ** 2) * (perturbed_samples - samples)
    scores = scorenet(perturbed_samples, labels)
    target = target.view(target.shape[0], -1)
    scores = scores.view(scores.shape[0], -1)
    loss = 1 / 2. * ((scores - target) ** 2).sum(dim=-1) * used_sigmas.squeeze() ** anneal_power

    return loss.mean(dim=0)


class ConditionalInstanceNorm2dPlus(nn.Module):
    def __init__(self, num_features, num_classes, bias=True):
        super().__init__()
        self.num_features = num_features
        self.bias = bias
        self.instance_norm = nn.InstanceNorm2d(num_features, affine=False, track_running_stats=False)
        if bias:
            self.embed = nn.Embedding(num_classes, num_features * 3)
            self.embed.weight.data[:, :2 * num_features].normal_(1, 0.02)  # Initialise scale at N(1, 0.02)
            self.embed.weight.data[:, 2 * num_features:].zero_()  # Initialise bias at 0
        else:
            self.embed = nn.Embedding(num_classes, 2 * num_features)
            self.embed.weight.data.normal_(1, 0.02)

    def forward(self, x, y):
        means = torch.mean(x, dim=(2, 3))
        m = torch.mean(means, dim=-1, keepdim=True)
        v = torch.var(means, dim=-1, keepdim=True)
        means = (means - m) / (torch.sqrt(v + 1e-5))
        h = self.instance_norm(x)

        if self.bias:
            gamma, alpha, beta = self.embed(y).chunk(3, dim=-1)
            h = h + means[..., None, None] * alpha[..., None, None]
            out = gamma.view(-1, self.num_features, 1, 1) * h + beta.view(-1, self.num_features, 1, 1)
        else:
            gamma, alpha = self.embed(y).chunk(2, dim=-1)
            h = h + means[..., None, None] * alpha[..., None, None]
            out = gamma.view(-1, self.num_features, 1, 1) * h
        return out


class TinyCondScoreNet(nn.Module):
    """CondRefineNetDilated at CPU size: begin_conv, a conditional norm, ELU, end_conv (as its first and last layers)."""

    def __init__(self, channels=1, ngf=8, num_classes=10):
        super().__init__()
        self.begin_conv = nn.Conv2d(channels, ngf, 3, stride=1, padding=1)
        self.normalizer = ConditionalInstanceNorm2dPlus(ngf, num_classes)
        self.act = nn.ELU()
        self.end_conv = nn.Conv2d(ngf, channels, 3, stride=1, padding=1)

    def forward(self, x, y):
        x = 2 * x - 1.
        output = self.begin_conv(x)
        output = self.normalizer(output, y)
        output = self.act(output)
        output = self.end_conv(output)
        return output


def build() -> dict:
    torch.manual_seed(0)
    score = TinyCondScoreNet()
    optimizer = optim.Adam(score.parameters(), lr=0.001, weight_decay=0.0, betas=(0.9, 0.999), amsgrad=False)
    sigmas = torch.tensor(np.exp(np.linspace(np.log(1.0), np.log(0.01), 10))).float()
    dataloader = [(torch.rand(4, 1, 8, 8), torch.randint(0, 10, (4,))) for _ in range(6)]
    return {"score": score, "optimizer": optimizer, "sigmas": sigmas, "dataloader": dataloader, "step": 0,
            "log": []}


def iteration(state: dict) -> None:
    score, optimizer, sigmas = state["score"], state["optimizer"], state["sigmas"]
    X, y = state["dataloader"][state["step"] % len(state["dataloader"])]
    state["step"] += 1
    score.train()
    X = X / 256. * 255. + torch.rand_like(X) / 256.

    labels = torch.randint(0, len(sigmas), (X.shape[0],), device=X.device)
    loss = anneal_dsm_score_estimation(score, X, labels, sigmas, 2.)

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    state["log"].append("step: {}, loss: {}".format(state["step"], loss.item()))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
