"""torchdiffeq's ode_demo: a neural ODE fitted to spiral trajectories, the true trajectory integrated once at import.

Source: rtqichen/torchdiffeq, examples/ode_demo.py (commit 01f1c190836a52588fef3fe5741d3ae5b029a23f): the module-level
`true_y0`, `t`, `true_A` and `true_y = odeint(Lambda(), true_y0, t)` under `torch.no_grad()`, get_batch (random
start indices by np.random.choice, `batch_y = torch.stack([true_y[s + i] ...])`), ODEFunc (`self.net(y ** 3)`,
Linear(2, 50), Tanh, Linear(50, 2), normal(0, 0.1) weights, zero biases), RunningAverageMeter, and the main loop:
`optimizer.zero_grad()`, `pred_y = odeint(func, batch_y0, batch_t)`, `loss = torch.mean(torch.abs(pred_y -
batch_y))`, `loss.backward()`, `optimizer.step()`, the time and loss meters (`loss.item()`), and every `test_freq`
iterations the whole-trajectory evaluation under `torch.no_grad()`. RMSprop(lr=1e-3), as published.
Retyped at CPU size: data_size 40 (published 1000), batch_time 5 (10), batch_size 4 (20), test_freq 2 (10), t in
[0, 1.0] (published [0, 25]: the fixed-step solver below stays stable); torchdiffeq is not imported: `odeint` is a
fixed-grid classic RK4 written here (torchdiffeq's method='rk4' on the grid of `t`; published default dopri5,
adaptive), the true trajectory integrated with it too; argparse defaults written as constants, visualisation off.
"""

import random
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

data_size = 40
batch_time = 5
batch_size = 4
test_freq = 2
device = torch.device('cpu')


def odeint(func, y0, t):
    """A fixed-grid RK4 in place of torchdiffeq.odeint (method='rk4'): the solution at each time of `t`."""
    ys = [y0]
    y = y0
    for t0, t1 in zip(t[:-1], t[1:]):  # noqa: RUF007 (torchdiffeq's grid walk)
        dt = t1 - t0
        k1 = func(t0, y)
        k2 = func(t0 + dt / 2, y + dt * k1 / 2)
        k3 = func(t0 + dt / 2, y + dt * k2 / 2)
        k4 = func(t1, y + dt * k3)
        y = y + dt * (k1 + 2 * k2 + 2 * k3 + k4) / 6
        ys.append(y)
    return torch.stack(ys)


true_y0 = torch.tensor([[2., 0.]]).to(device)
t = torch.linspace(0., 1., data_size).to(device)
true_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]]).to(device)


class Lambda(nn.Module):

    def forward(self, t, y):
        return torch.mm(y ** 3, true_A)


with torch.no_grad():
    true_y = odeint(Lambda(), true_y0, t)


def get_batch():
    s = torch.from_numpy(np.random.choice(np.arange(data_size - batch_time, dtype=np.int64), batch_size, replace=False))
    batch_y0 = true_y[s]  # (M, D)
    batch_t = t[:batch_time]  # (T)
    batch_y = torch.stack([true_y[s + i] for i in range(batch_time)], dim=0)  # (T, M, D)
    return batch_y0.to(device), batch_t.to(device), batch_y.to(device)


class ODEFunc(nn.Module):

    def __init__(self):
        super(ODEFunc, self).__init__()

        self.net = nn.Sequential(
            nn.Linear(2, 50),
            nn.Tanh(),
            nn.Linear(50, 2),
        )

        for m in self.net.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0, std=0.1)
                nn.init.constant_(m.bias, val=0)

    def forward(self, t, y):
        return self.net(y ** 3)


class RunningAverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, momentum=0.99):
        self.momentum = momentum
        self.reset()

    def reset(self):
        self.val = None
        self.avg = 0

    def update(self, val):
        if self.val is None:
            self.avg = val
        else:
            self.avg = self.avg * self.momentum + val * (1 - self.momentum)
        self.val = val


def build() -> dict:
    SEED = 42
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    func = ODEFunc().to(device)
    optimizer = optim.RMSprop(func.parameters(), lr=1e-3)
    end = time.time()
    time_meter = RunningAverageMeter(0.97)
    loss_meter = RunningAverageMeter(0.97)
    return {"func": func, "optimizer": optimizer, "end": end, "time_meter": time_meter, "loss_meter": loss_meter,
            "itr": 1, "ii": 0}


def iteration(state: dict) -> None:
    func, optimizer, time_meter, loss_meter, itr = (
        state["func"], state["optimizer"], state["time_meter"], state["loss_meter"], state["itr"])
    optimizer.zero_grad()
    batch_y0, batch_t, batch_y = get_batch()
    pred_y = odeint(func, batch_y0, batch_t).to(device)
    loss = torch.mean(torch.abs(pred_y - batch_y))
    loss.backward()  # @backward
    optimizer.step()

    time_meter.update(time.time() - state["end"])
    loss_meter.update(loss.item())

    if itr % test_freq == 0:
        with torch.no_grad():
            pred_y = odeint(func, true_y0, t)
            loss = torch.mean(torch.abs(pred_y - true_y))
            state["ii"] += 1

    state["end"] = time.time()
    state["itr"] = itr + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for itr in range(1, iterations + 1):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
