"""Reptile on random sine waves: plain SGD on `param.data` per task, then an interpolation of the state_dict.

Source: John Schulman's gist reptile-sinewaves-demo.py
(https://gist.github.com/joschu/f503500cda64f2ce87c8288906b09e2d#file-reptile-sinewaves-demo-py), the PyTorch
example of OpenAI's Reptile blog post, as retyped in JosephKJ/PyTorch-MAML-and-Reptile (README.md: "Adapted from
John Schulman's GIST") and alok/rl_implementations (reptile/README.md). As published: the Tanh MLP 1-64-64-1,
gen_task (random phase and amplitude), train_on_batch (`model.zero_grad()`, MSE as `(ypred - y).pow(2).mean()`,
`loss.backward()`, `param.data -= innerstepsize * param.grad.data`), and the outer loop: `weights_before =
deepcopy(model.state_dict())`, a permutation of the 50 points, minibatches of 10 for `innerepochs`, then
`model.load_state_dict({name: weights_before[name] + (weights_after[name] - weights_before[name]) * outerstepsize
...})` with the linear schedule. Retyped at CPU size: hidden width 16 (published 64), 20 points (50) in minibatches
of 5 (10), 3 outer iterations of a schedule over `niterations = 3` (30000); `ag.Variable(torch.Tensor(x))` is
`torch.Tensor(x)`; the plotting and evaluation every 1000 iterations left out. An iteration is one outer
(meta) update: one task and its inner SGD.
"""

from collections.abc import Callable
from copy import deepcopy

import numpy as np
import torch
from torch import nn

ITERATIONS = 3
innerstepsize = 0.02  # stepsize in inner SGD
innerepochs = 1  # number of epochs of each inner SGD
outerstepsize0 = 0.1  # stepsize of outer optimization, i.e., meta-optimization
niterations = ITERATIONS  # number of outer updates; each iteration we sample one task and update on it
ntrain = 5  # Size of training minibatches

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def totorch(x):
    return torch.Tensor(x)


def build() -> dict:
    seed = 0
    rng = np.random.RandomState(seed)
    torch.manual_seed(seed)
    x_all = np.linspace(-5, 5, 20)[:, None]  # All of the x points
    # Define model. Reptile paper uses ReLU, but Tanh gives slightly better results
    model = nn.Sequential(
        nn.Linear(1, 16),
        nn.Tanh(),
        nn.Linear(16, 16),
        nn.Tanh(),
        nn.Linear(16, 1),
    )
    return {"model": model, "rng": rng, "x_all": x_all, "iteration": 0}


def gen_task(rng):
    phase = rng.uniform(low=0, high=2*np.pi)
    ampl = rng.uniform(0.1, 5)
    f_randomsine = lambda x: np.sin(x + phase) * ampl  # noqa: E731 (as published)
    return f_randomsine


def train_on_batch(model, x, y):
    x = totorch(x)
    y = totorch(y)
    model.zero_grad()
    ypred = model(x)
    loss = (ypred - y).pow(2).mean()
    loss.backward()
    for param in model.parameters():
        param.data -= innerstepsize * param.grad.data


def iteration(state: dict) -> None:
    model, rng, x_all, iteration = state["model"], state["rng"], state["x_all"], state["iteration"]
    weights_before = deepcopy(model.state_dict())
    # Generate task
    f = gen_task(rng)
    y_all = f(x_all)
    # Do SGD on this task
    inds = rng.permutation(len(x_all))
    for _ in range(innerepochs):
        for start in range(0, len(x_all), ntrain):
            mbinds = inds[start:start+ntrain]
            train_on_batch(model, x_all[mbinds], y_all[mbinds])
    # Interpolate between current weights and trained weights from this task
    # I.e. (weights_before - weights_after) is the meta-gradient
    weights_after = model.state_dict()
    outerstepsize = outerstepsize0 * (1 - iteration / niterations)  # linear schedule
    model.load_state_dict({name:
        weights_before[name] + (weights_after[name] - weights_before[name]) * outerstepsize
        for name in weights_before})
    state["iteration"] = iteration + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
