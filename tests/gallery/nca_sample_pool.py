"""Growing Neural Cellular Automata with a sample pool: a batch drawn from the pool, ranked by loss, the worst
reseeded and the best damaged, grown for a random number of steps, trained, and written back to the pool.

Source: chenmingxiang110/Growing-Neural-Cellular-Automata, training.ipynb and lib/CAModel.py, lib/utils_vis.py
(commit 2a84e167ff402f8de30b6e2d1d9a5e2e5a468d6f), a PyTorch port of Mordvintsev et al., "Growing Neural Cellular
Automata" (distill.pub/2020/growing-ca): `CAModel` (`alive` by max-pooling the alpha channel, `perceive` with
Sobel filters as grouped convolutions, `update` through `fc0`, ReLU, `fc1` zero-initialised, the stochastic fire mask
and the life masks, `forward` looping `update` over `steps`), `SamplePool` (numpy slots, `sample`, `commit`),
`make_seed`, `make_circle_masks`, and the notebook's `train(x, target, steps, optimizer, scheduler)` (`x = ca(x,
steps=steps)`, MSE on the RGBA channels, `optimizer.zero_grad()`, `loss.backward()`, `optimizer.step()`,
`scheduler.step()`, `return x, loss`), `loss_f`, and its loop body for the "Regenerating" experiment
(USE_PATTERN_POOL 1, DAMAGE_N 3): `loss_rank` by `loss_f(x0, pad_target).detach()...argsort()[::-1]`, `x0[:1] =
seed`, `x0[-DAMAGE_N:] *= damage`, `x, loss = train(x0, pad_target, np.random.randint(64,96), optimizer,
scheduler)`, `batch.x[:] = x.detach().cpu().numpy()`, `batch.commit()`, `loss_log.append(loss.item())`; Adam lr
2e-3, betas (0.5, 0.5), ExponentialLR 0.9999. Retyped at CPU size: 8 channels (published 16), hidden 16 (128), a
made-up 4x4 RGBA target padded by 2 (a 40x40 emoji padded by 16), pool 16 (1024), batches of 4 (8), DAMAGE_N 1 (3),
`np.random.randint(4, 8)` growth steps (64 to 96); `train` takes the notebook's global `ca` as its first argument;
`device` is the CPU, the checkpoint load and the plots every 100
steps are left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

CHANNEL_N = 8  # Number of CA state channels
TARGET_PADDING = 2  # Number of pixels used to pad the target image border
TARGET_SIZE = 4
lr = 2e-3
lr_gamma = 0.9999
betas = (0.5, 0.5)
BATCH_SIZE = 4
POOL_SIZE = 16
CELL_FIRE_RATE = 0.5
USE_PATTERN_POOL = 1
DAMAGE_N = 1  # Number of patterns to damage in a batch

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class CAModel(nn.Module):
    def __init__(self, channel_n, fire_rate, device, hidden_size=128):
        super(CAModel, self).__init__()

        self.device = device
        self.channel_n = channel_n

        self.fc0 = nn.Linear(channel_n * 3, hidden_size)
        self.fc1 = nn.Linear(hidden_size, channel_n, bias=False)
        with torch.no_grad():
            self.fc1.weight.zero_()

        self.fire_rate = fire_rate
        self.to(self.device)

    def alive(self, x):
        return F.max_pool2d(x[:, 3:4, :, :], kernel_size=3, stride=1, padding=1) > 0.1

    def perceive(self, x, angle):

        def _perceive_with(x, weight):
            conv_weights = torch.from_numpy(weight.astype(np.float32)).to(self.device)
            conv_weights = conv_weights.view(1, 1, 3, 3).repeat(self.channel_n, 1, 1, 1)
            return F.conv2d(x, conv_weights, padding=1, groups=self.channel_n)

        dx = np.outer([1, 2, 1], [-1, 0, 1]) / 8.0  # Sobel filter
        dy = dx.T
        c = np.cos(angle * np.pi / 180)
        s = np.sin(angle * np.pi / 180)
        w1 = c * dx - s * dy
        w2 = s * dx + c * dy

        y1 = _perceive_with(x, w1)
        y2 = _perceive_with(x, w2)
        y = torch.cat((x, y1, y2), 1)
        return y

    def update(self, x, fire_rate, angle):
        x = x.transpose(1, 3)
        pre_life_mask = self.alive(x)

        dx = self.perceive(x, angle)
        dx = dx.transpose(1, 3)
        dx = self.fc0(dx)
        dx = F.relu(dx)
        dx = self.fc1(dx)

        if fire_rate is None:
            fire_rate = self.fire_rate
        stochastic = torch.rand([dx.size(0), dx.size(1), dx.size(2), 1]) > fire_rate
        stochastic = stochastic.float().to(self.device)
        dx = dx * stochastic

        x = x + dx.transpose(1, 3)

        post_life_mask = self.alive(x)
        life_mask = (pre_life_mask & post_life_mask).float()
        x = x * life_mask
        return x.transpose(1, 3)

    def forward(self, x, steps=1, fire_rate=None, angle=0.0):
        for step in range(steps):
            x = self.update(x, fire_rate, angle)
        return x


class SamplePool:
    def __init__(self, *, _parent=None, _parent_idx=None, **slots):
        self._parent = _parent
        self._parent_idx = _parent_idx
        self._slot_names = slots.keys()
        self._size = None
        for k, v in slots.items():
            if self._size is None:
                self._size = len(v)
            assert self._size == len(v)
            setattr(self, k, np.asarray(v))

    def sample(self, n):
        idx = np.random.choice(self._size, n, False)
        batch = {k: getattr(self, k)[idx] for k in self._slot_names}
        batch = SamplePool(**batch, _parent=self, _parent_idx=idx)
        return batch

    def commit(self):
        for k in self._slot_names:
            getattr(self._parent, k)[self._parent_idx] = getattr(self, k)


def make_seed(shape, n_channels):
    seed = np.zeros([shape[0], shape[1], n_channels], np.float32)
    seed[shape[0] // 2, shape[1] // 2, 3:] = 1.0
    return seed


def make_circle_masks(n, h, w):
    x = np.linspace(-1.0, 1.0, w)[None, None, :]
    y = np.linspace(-1.0, 1.0, h)[None, :, None]
    center = np.random.random([2, n, 1, 1]) * 1.0 - 0.5
    r = np.random.random([n, 1, 1]) * 0.3 + 0.1
    x, y = (x - center[0]) / r, (y - center[1]) / r
    mask = (x * x + y * y < 1.0).astype(np.float32)
    return mask


def loss_f(x, target):
    return torch.mean(torch.pow(x[..., :4] - target, 2), [-2, -3, -1])


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    device = torch.device("cpu")
    target_img = np.random.rand(TARGET_SIZE, TARGET_SIZE, 4).astype(np.float32)
    p = TARGET_PADDING
    pad_target = np.pad(target_img, [(p, p), (p, p), (0, 0)])
    h, w = pad_target.shape[:2]
    pad_target = np.expand_dims(pad_target, axis=0)
    pad_target = torch.from_numpy(pad_target.astype(np.float32)).to(device)

    seed = make_seed((h, w), CHANNEL_N)
    pool = SamplePool(x=np.repeat(seed[None, ...], POOL_SIZE, 0))

    ca = CAModel(CHANNEL_N, CELL_FIRE_RATE, device, hidden_size=16).to(device)

    optimizer = optim.Adam(ca.parameters(), lr=lr, betas=betas)
    scheduler = optim.lr_scheduler.ExponentialLR(optimizer, lr_gamma)
    return {
        "ca": ca,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "pool": pool,
        "seed": seed,
        "pad_target": pad_target,
        "h": h,
        "w": w,
        "device": device,
        "loss_log": [],
    }


def train(ca, x, target, steps, optimizer, scheduler):
    x = ca(x, steps=steps)
    loss = F.mse_loss(x[:, :, :, :4], target)
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()
    scheduler.step()
    return x, loss


def iteration(state: dict) -> None:
    pool, seed, pad_target, device = state["pool"], state["seed"], state["pad_target"], state["device"]
    h, w = state["h"], state["w"]
    if USE_PATTERN_POOL:
        batch = pool.sample(BATCH_SIZE)
        x0 = torch.from_numpy(batch.x.astype(np.float32)).to(device)
        loss_rank = loss_f(x0, pad_target).detach().cpu().numpy().argsort()[::-1]
        x0 = batch.x[loss_rank]
        x0[:1] = seed
        if DAMAGE_N:
            damage = 1.0 - make_circle_masks(DAMAGE_N, h, w)[..., None]
            x0[-DAMAGE_N:] *= damage
    else:
        x0 = np.repeat(seed[None, ...], BATCH_SIZE, 0)
    x0 = torch.from_numpy(x0.astype(np.float32)).to(device)

    x, loss = train(state["ca"], x0, pad_target, np.random.randint(4, 8), state["optimizer"], state["scheduler"])

    if USE_PATTERN_POOL:
        batch.x[:] = x.detach().cpu().numpy()
        batch.commit()

    step_i = len(state["loss_log"])
    state["loss_log"].append(loss.item())


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
