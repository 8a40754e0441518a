"""Consistency training (cloneofsimo/consistency_models): the online model against an EMA target network.

Source: cloneofsimo/consistency_models, main.py (commit 16ab9085996b5ba6ee75404ffeb0dd81456126fd) and
consistency_models/unet.py, utils.py (commit 292dd5cd9865db11b4db1ebb9ef692e789fadde2): ConsistencyModel (the
"ridiculous Unet": down / time_downs / mid / up blocks of GroupNorm(32) + SiLU + conv, sinusoidal time embedding,
the c_skip / c_out parametrisation; `loss` with the target `ema_model(x1, t1)` under `torch.no_grad()`; `sample`
under `@torch.no_grad()`), kerras_boundaries, Nk, the EMA class (`deepcopy(model).eval().requires_grad_(False)`,
`update` under `@torch.inference_mode()`: `ema_p.mul_(mu).add_(p, alpha=1 - mu)`), sample() (under
`torch.inference_mode()`, the model in eval mode, 5 and 2 steps), train(): AdamW eps 1e-5, OneCycleLR, per epoch
N = Nk(example_ct/total_ct) and its boundaries, per batch `optim.zero_grad()`, the loss, `loss.backward()`,
`loss_ema` from `loss.item()`, `optim.step()`, `scheduler.step()`, `ema.update(N)`. Retyped at CPU size: D 32
(published 256; GroupNorm's 32 groups need a multiple of 32), 8x8 one-channel images (published 32x32 MNIST),
made-up data in [-1, 1], 2 batches of 4 an epoch (published 128), 4 samples (published 64); mixed_precision off
(CPU: the published `autocast("cuda")` and GradScaler are for CUDA; its `else` branches run), wandb, save_image
and tqdm left out. One iteration is one epoch.
"""

import math
from collections.abc import Callable
from copy import deepcopy
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import OneCycleLR

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

config = SimpleNamespace(
    img_size=8,
    batch_size=4,
    dataset="mnist",
    lr=4e-4,
    n_epochs=ITERATIONS + 1,
    sample_every_n_epoch=1,
    device="cpu",
    mixed_precision=False,
    s_0=2,
    s_1=150,
    mu_0=0.9,
    ema_rate=0.999,
)


def kerras_boundaries(sigma, eps, N, T):
    # This will be used to generate the boundaries for the time discretization

    return torch.tensor(
        [
            (eps ** (1 / sigma) + i / (N - 1) * (T ** (1 / sigma) - eps ** (1 / sigma)))
            ** sigma
            for i in range(N)
        ]
    )


blk = lambda ic, oc: nn.Sequential(  # noqa: E731 (as published)
    nn.GroupNorm(32, num_channels=ic),
    nn.SiLU(),
    nn.Conv2d(ic, oc, 3, padding=1),
    nn.GroupNorm(32, num_channels=oc),
    nn.SiLU(),
    nn.Conv2d(oc, oc, 3, padding=1),
)


class ConsistencyModel(nn.Module):
    """
    This is ridiculous Unet structure, hey but it works!
    """

    def __init__(self, n_channel: int, eps: float = 0.002, D: int = 128) -> None:
        super(ConsistencyModel, self).__init__()

        self.eps = eps

        self.freqs = torch.exp(
            -math.log(10000) * torch.arange(start=0, end=D, dtype=torch.float32) / D
        )

        self.down = nn.Sequential(
            *[
                nn.Conv2d(n_channel, D, 3, padding=1),
                blk(D, D),
                blk(D, 2 * D),
                blk(2 * D, 2 * D),
            ]
        )

        self.time_downs = nn.Sequential(
            nn.Linear(2 * D, D),
            nn.Linear(2 * D, D),
            nn.Linear(2 * D, 2 * D),
            nn.Linear(2 * D, 2 * D),
        )

        self.mid = blk(2 * D, 2 * D)

        self.up = nn.Sequential(
            *[
                blk(2 * D, 2 * D),
                blk(2 * 2 * D, D),
                blk(D, D),
                nn.Conv2d(2 * D, 2 * D, 3, padding=1),
            ]
        )
        self.last = nn.Conv2d(2 * D + n_channel, n_channel, 3, padding=1)

    def forward(self, x, t) -> torch.Tensor:
        if isinstance(t, float):
            t = (
                torch.tensor([t] * x.shape[0], dtype=torch.float32)
                .to(x.device)
                .unsqueeze(1)
            )
        # time embedding
        args = t.float() * self.freqs[None].to(t.device)
        t_emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1).to(x.device)

        x_ori = x

        # perform F(x, t)
        hs = []
        for idx, layer in enumerate(self.down):
            if idx % 2 == 1:
                x = layer(x) + x
            else:
                x = layer(x)
                x = F.interpolate(x, scale_factor=0.5)
                hs.append(x)

            x = x + self.time_downs[idx](t_emb)[:, :, None, None]

        x = self.mid(x)

        for idx, layer in enumerate(self.up):
            if idx % 2 == 0:
                x = layer(x) + x
            else:
                x = torch.cat([x, hs.pop()], dim=1)
                x = F.interpolate(x, scale_factor=2, mode="nearest")
                x = layer(x)

        x = self.last(torch.cat([x, x_ori], dim=1))

        t = t - self.eps
        c_skip_t = 0.25 / (t.pow(2) + 0.25)
        c_out_t = 0.25 * t / ((t + self.eps).pow(2) + 0.25).pow(0.5)

        return c_skip_t[:, :, None, None] * x_ori + c_out_t[:, :, None, None] * x

    def loss(self, x, z, t1, t2, ema_model):
        x2 = x + z * t2[:, :, None, None]
        x2 = self(x2, t2)  # @online

        with torch.no_grad():
            x1 = x + z * t1[:, :, None, None]
            x1 = ema_model(x1, t1)  # @target

        return F.mse_loss(x1, x2)

    @torch.no_grad()
    def sample(self, x, ts):
        x = self(x, ts[0])

        for t in ts[1:]:
            z = torch.randn_like(x)
            x = x + math.sqrt(t**2 - self.eps**2) * z
            x = self(x, t)

        return x


def Nk(step, s_0=config.s_0, s_1=config.s_1):
    return math.ceil(math.sqrt((step * ((s_1+1)**2 - s_0**2) ) + s_0**2) - 1) + 1


class EMA:
    def __init__(self, model, device=config.device):
        self.model = model
        self.ema_model = deepcopy(model).eval().requires_grad_(False).to(device)

    @torch.inference_mode()
    def update(self, N):
        mu = math.exp(config.s_0 * math.log(config.mu_0) / N)
        # update \theta_{-}
        for p, ema_p in zip(self.model.parameters(), self.ema_model.parameters()):
            ema_p.mul_(mu).add_(p, alpha=1 - mu)  # @ema_update


def sample(model, x, epoch, values=[5.0, 10.0, 20.0, 40.0, 80.0], n=64):  # noqa: B006 (as published)
    "Sample images from model"
    x = x[:n]
    model.eval()
    with torch.inference_mode():
        xh = model.sample(
            torch.randn_like(x).to(device=config.device) * 80.0,
            list(reversed(values)),
        )
        xh = (xh * 0.5 + 0.5).clamp(0, 1)
    return xh


def build() -> dict:
    torch.manual_seed(0)
    dataloader = [((torch.rand(4, 1, 8, 8) - 0.5) / 0.5, torch.zeros(4)) for _ in range(2)]
    n_channels = 3 if config.dataset == "cifar10" else 1
    model = ConsistencyModel(n_channels, D=32)
    model.to(config.device)
    optim = torch.optim.AdamW(model.parameters(), eps=1e-5)
    scheduler = OneCycleLR(optim, max_lr=config.lr,
                           steps_per_epoch=len(dataloader), epochs=config.n_epochs)
    ema = EMA(model, device=config.device)
    return {"dataloader": dataloader, "model": model, "optim": optim, "scheduler": scheduler, "ema": ema,
            "example_ct": 0, "total_ct": config.n_epochs * len(dataloader) * config.batch_size, "epoch": 1,
            "samples": []}


def iteration(state: dict) -> None:
    dataloader, model, optim, scheduler, ema = (
        state["dataloader"], state["model"], state["optim"], state["scheduler"], state["ema"])
    epoch = state["epoch"]
    N = Nk(state["example_ct"] / state["total_ct"])
    boundaries = kerras_boundaries(7.0, 0.002, N, 80.0).to(config.device)
    loss_ema = None
    model.train()
    for x, _ in dataloader:
        optim.zero_grad()
        x = x.to(config.device)
        z = torch.randn_like(x)
        t = torch.randint(0, N - 1, (x.shape[0], 1), device=config.device)
        t_0 = boundaries[t]
        t_1 = boundaries[t + 1]
        loss = model.loss(x, z, t_0, t_1, ema_model=ema.ema_model)
        loss.backward()  # @backward
        if loss_ema is None:
            loss_ema = loss.item()
        else:
            loss_ema = config.ema_rate * loss_ema + (1-config.ema_rate) * loss.item()
        optim.step()
        scheduler.step()
        ema.update(N)
        state["example_ct"] += len(x)

    if epoch % config.sample_every_n_epoch == 0:
        state["samples"].append(sample(model, x, epoch, values=[5.0, 10.0, 20.0, 40.0, 80.0]))
        state["samples"].append(sample(model, x, epoch, values=[5.0, 80.0]))
    state["epoch"] = epoch + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
