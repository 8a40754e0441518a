"""The "extremely minimalistic" DDPM: noise a batch at a random timestep, regress the noise, one backward per batch.

Source: cloneofsimo/minDiffusion, superminddpm.py (commit 8f530f4b77a7dbc08704e658a0acacd8cd884ad2). As published:
ddpm_schedules (linear betas, alphabar by cumsum of logs, sqrtab, sqrtmab, ...), DummyEpsModel (five Conv2d with
BatchNorm2d and ReLU, the timestep unused), DDPM (the schedules registered as buffers, forward: `_ts = torch.randint(0,
n_T - 1, ...)`, `eps = torch.randn_like(x)`, `x_t = sqrtab[_ts] * x + sqrtmab[_ts] * eps`, the MSE between eps and
the model's prediction), and train()'s batch loop: `optim.zero_grad()`, `loss = ddpm(x)`, `loss.backward()`, the
`loss_ema` bookkeeping from `loss.item()`, `optim.step()`, Adam at lr 1e-4, n_T 1000, betas (1e-4, 0.02). Retyped at
CPU size: made-up 1x8x8 images in [-0.5, 0.5] in batches of 4 (published MNIST 28x28, ToTensor and Normalize(0.5, 1.0),
batches of 1024 from a DataLoader), the conv widths 128/128/64/16 cut to 8/8/8/4; `.to(device)` dropped; tqdm's
progress bar (the ema goes to a list instead of `pbar.set_description`), and the epoch's end (ddpm.eval(), sampling
under no_grad, save_image) left out: an iteration is one batch.
"""

from collections.abc import Callable
from typing import Dict, Tuple

import torch
import torch.nn as nn

ITERATIONS = 3
WIDTH = 8

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def ddpm_schedules(beta1: float, beta2: float, T: int) -> Dict[str, torch.Tensor]:
    """
    Returns pre-computed schedules for DDPM sampling, training process.
    """
    assert beta1 < beta2 < 1.0, "beta1 and beta2 must be in (0, 1)"

    beta_t = (beta2 - beta1) * torch.arange(0, T + 1, dtype=torch.float32) / T + beta1
    sqrt_beta_t = torch.sqrt(beta_t)
    alpha_t = 1 - beta_t
    log_alpha_t = torch.log(alpha_t)
    alphabar_t = torch.cumsum(log_alpha_t, dim=0).exp()

    sqrtab = torch.sqrt(alphabar_t)
    oneover_sqrta = 1 / torch.sqrt(alpha_t)

    sqrtmab = torch.sqrt(1 - alphabar_t)
    mab_over_sqrtmab_inv = (1 - alpha_t) / sqrtmab

    return {
        "alpha_t": alpha_t,
        "oneover_sqrta": oneover_sqrta,
        "sqrt_beta_t": sqrt_beta_t,
        "alphabar_t": alphabar_t,
        "sqrtab": sqrtab,
        "sqrtmab": sqrtmab,
        "mab_over_sqrtmab": mab_over_sqrtmab_inv,
    }


class DummyEpsModel(nn.Module):
    """
    This should be unet-like, but let's don't think about the model too much :P
    """

    def __init__(self, n_channel: int) -> None:
        super(DummyEpsModel, self).__init__()
        self.conv = nn.Sequential(  # with batchnorm
            nn.Conv2d(n_channel, WIDTH, 7, padding=3),
            nn.BatchNorm2d(WIDTH),
            nn.ReLU(),
            nn.Conv2d(WIDTH, WIDTH, 7, padding=3),
            nn.BatchNorm2d(WIDTH),
            nn.ReLU(),
            nn.Conv2d(WIDTH, 8, 7, padding=3),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 4, 7, padding=3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, n_channel, 3, padding=1),
        )

    def forward(self, x, t) -> torch.Tensor:
        # Lets think about using t later
        return self.conv(x)


class DDPM(nn.Module):
    def __init__(
        self,
        eps_model: nn.Module,
        betas: Tuple[float, float],
        n_T: int,
        criterion: nn.Module = nn.MSELoss(),  # noqa: B008 (as published)
    ) -> None:
        super(DDPM, self).__init__()
        self.eps_model = eps_model
        self.vars = ddpm_schedules(betas[0], betas[1], n_T)
        # register
        for k, v in self.vars.items():
            self.register_buffer(k, v)

        self.n_T = n_T
        self.criterion = criterion

    def forward(self, x: torch.Tensor) -> torch.Tensor:

        _ts = torch.randint(0, self.n_T - 1, (x.shape[0],)).to(
            x.device
        )  # t ~ Uniform(0, n_T)
        eps = torch.randn_like(x)  # eps ~ N(0, 1)

        x_t = (
            self.sqrtab[_ts, None, None, None] * x
            + self.sqrtmab[_ts, None, None, None] * eps
        )

        return self.criterion(eps, self.eps_model(x_t, _ts / self.n_T))


def build() -> dict:
    torch.manual_seed(0)
    ddpm = DDPM(eps_model=DummyEpsModel(1), betas=(1e-4, 0.02), n_T=1000)
    dataloader = [(torch.rand(4, 1, 8, 8) - 0.5, torch.randint(0, 10, (4,))) for _ in range(6)]
    optim = torch.optim.Adam(ddpm.parameters(), lr=1e-4)
    ddpm.train()
    return {"ddpm": ddpm, "optim": optim, "dataloader": dataloader, "batch": 0, "loss_ema": None, "pbar": []}


def iteration(state: dict) -> None:
    ddpm, optim = state["ddpm"], state["optim"]
    x, _ = state["dataloader"][state["batch"] % len(state["dataloader"])]
    state["batch"] += 1
    loss_ema = state["loss_ema"]
    optim.zero_grad()
    loss = ddpm(x)
    loss.backward()
    if loss_ema is None:
        loss_ema = loss.item()
    else:
        loss_ema = 0.9 * loss_ema + 0.1 * loss.item()
    state["pbar"].append(f"loss: {loss_ema:.4f}")
    optim.step()
    state["loss_ema"] = loss_ema


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
