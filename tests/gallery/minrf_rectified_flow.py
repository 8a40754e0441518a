"""Rectified flow (minRF): a class-conditional velocity model trained on straight noise-to-data paths.

Source: cloneofsimo/minRF, rf.py (commit 04d0c69eedc41b2be147d72531311077abc730e4): class RF (`forward`: logit-normal
t, `zt = (1 - texp) * x + texp * z1`, the batchwise MSE of `z1 - x - vtheta`, `tlist` from
`batchwise_mse.detach().cpu()` for the per-t loss bins; `sample` under `@torch.no_grad()`, Euler steps with
classifier-free guidance) and its `__main__` loop (Adam lr 2e-4, `optimizer.zero_grad()`, `loss, blsct =
rf.forward(x, c)`, `loss.backward()`, `optimizer.step()`, the `lossbin` / `losscnt` counts by t, and per epoch a
guided sample from the model in eval mode). Retyped at CPU size: dit.py's DiT_Llama (patch embedding, adaLN
transformer blocks, class embedding with a null class 10) becomes a small conditional conv net with the same
call `model(zt, t, cond)` (a timestep MLP and a class embedding, 11 classes, added to the features); 8x8
one-channel images (published 32x32 MNIST), made-up data of the same shape and range, batch 4 (published 256),
2 sampling steps (published 50), 4 samples (published 16); `.cuda()`, wandb, printing and the GIF left out.
One iteration is one batch; the epoch's sample is taken after every second batch.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3
BATCHES_PER_EPOCH = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class RF:
    def __init__(self, model, ln=True):
        self.model = model
        self.ln = ln

    def forward(self, x, cond):
        b = x.size(0)
        if self.ln:
            nt = torch.randn((b,)).to(x.device)
            t = torch.sigmoid(nt)
        else:
            t = torch.rand((b,)).to(x.device)
        texp = t.view([b, *([1] * len(x.shape[1:]))])
        z1 = torch.randn_like(x)
        zt = (1 - texp) * x + texp * z1
        vtheta = self.model(zt, t, cond)
        batchwise_mse = ((z1 - x - vtheta) ** 2).mean(dim=list(range(1, len(x.shape))))  # @mse
        tlist = batchwise_mse.detach().cpu().reshape(-1).tolist()
        ttloss = [(tv, tloss) for tv, tloss in zip(t, tlist)]
        return batchwise_mse.mean(), ttloss

    @torch.no_grad()
    def sample(self, z, cond, null_cond=None, sample_steps=2, cfg=2.0):
        b = z.size(0)
        dt = 1.0 / sample_steps
        dt = torch.tensor([dt] * b).to(z.device).view([b, *([1] * len(z.shape[1:]))])
        images = [z]
        for i in range(sample_steps, 0, -1):
            t = i / sample_steps
            t = torch.tensor([t] * b).to(z.device)

            vc = self.model(z, t, cond)
            if null_cond is not None:
                vu = self.model(z, t, null_cond)
                vc = vu + cfg * (vc - vu)

            z = z - dt * vc
            images.append(z)
        return images


class TinyConditionalNet(nn.Module):
    """Stands in for dit.py's DiT_Llama(1, 32, dim=64, n_layers=6, n_heads=4, num_classes=10): same call."""

    def __init__(self, in_channels=1, dim=8, num_classes=10):
        super().__init__()
        self.inp = nn.Conv2d(in_channels, dim, 3, padding=1)
        self.t_embedder = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.y_embedder = nn.Embedding(num_classes + 1, dim)  # the extra class is the null (unconditional) one
        self.mid = nn.Conv2d(dim, dim, 3, padding=1)
        self.out = nn.Conv2d(dim, in_channels, 3, padding=1)

    def forward(self, x, t, y):
        c = self.t_embedder(t[:, None]) + self.y_embedder(y)
        h = torch.nn.functional.silu(self.inp(x) + c[:, :, None, None])
        h = torch.nn.functional.silu(self.mid(h))
        return self.out(h)


def build() -> dict:
    torch.manual_seed(0)
    model = TinyConditionalNet(1, dim=8, num_classes=10)
    rf = RF(model)
    optimizer = optim.Adam(model.parameters(), lr=2e-4)
    criterion = torch.nn.MSELoss()
    # made-up MNIST-like batches, normalised to [-1, 1] as Normalize((0.5,), (0.5,)) does
    data = [((torch.rand(4, 1, 8, 8) - 0.5) / 0.5, torch.randint(0, 10, (4,))) for _ in range(BATCHES_PER_EPOCH)]
    return {"model": model, "rf": rf, "optimizer": optimizer, "criterion": criterion, "data": data,
            "lossbin": {i: 0 for i in range(10)}, "losscnt": {i: 1e-6 for i in range(10)}, "i": 0}


def iteration(state: dict) -> None:
    rf, optimizer = state["rf"], state["optimizer"]
    lossbin, losscnt = state["lossbin"], state["losscnt"]
    x, c = state["data"][state["i"] % BATCHES_PER_EPOCH]
    optimizer.zero_grad()
    loss, blsct = rf.forward(x, c)
    loss.backward()  # @backward
    optimizer.step()

    # count based on t
    for t, l in blsct:
        lossbin[int(t * 10)] += l
        losscnt[int(t * 10)] += 1

    state["i"] += 1
    if state["i"] % BATCHES_PER_EPOCH == 0:  # the end of an epoch: log, then sample
        state["logged"] = {f"lossbin_{i}": lossbin[i] / losscnt[i] for i in range(10)}
        rf.model.eval()
        with torch.no_grad():
            cond = torch.arange(0, 4) % 10
            uncond = torch.ones_like(cond) * 10

            init_noise = torch.randn(4, 1, 8, 8)
            images = rf.sample(init_noise, cond, uncond)
            state["last_img"] = (images[-1] * 0.5 + 0.5).clamp(0, 1)
        rf.model.train()
        state["lossbin"] = {i: 0 for i in range(10)}
        state["losscnt"] = {i: 1e-6 for i in range(10)}


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
