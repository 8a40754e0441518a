"""GradNorm: per-task losses, autograd.grad of each weighted loss on a shared layer, the task weights updated.

Source: LucasBoTang/GradNorm, gradnorm.py (commit 6104a30f15ab1073cb15e0a1cf9246cd28fdf3b6), gradNorm(net,
layer, alpha, dataloader, num_epochs, lr1, lr2): `loss = net(*data)` (one loss per task), at iters == 0 the
task weights `torch.nn.Parameter(torch.ones_like(loss))`, T and l0 = loss.detach(), optimizer2 on the
weights; then `weighted_loss = weights @ loss`, optimizer1.zero_grad(), `weighted_loss.backward(retain_graph=True)`,
per task `torch.autograd.grad(weights[i]*loss[i], layer.parameters(), retain_graph=True, create_graph=True)[0]`
and its norm, the loss ratios, `gradnorm_loss = torch.abs(gw - constant).sum()`, optimizer2.zero_grad(),
gradnorm_loss.backward(), optimizer1.step(), optimizer2.step(), the weights renormalised into a new Parameter
with a new Adam. model.py's fcNet (fc1..fc4 + one Linear head per task) inside mtlNet (MSE per task), data.py's
toyDataset, and the README's call `gradNorm(net=mtlnet, layer=net.fc4, alpha=0.12, ..., lr1=1e-5, lr2=1e-4)`.
Retyped at CPU size: 6 features (published 250), 4 labels (published 100), 2 tasks with scalars [1, 100] as
in the README, 16 data points in batches of 4 (a list of batches stands in for the DataLoader), the log
left out; one pass of the `for data in dataloader` body per iteration. As published, gradnorm_loss.backward()
goes through the create_graph'd task gradients into the whole network too (fc1..fc4 and the heads get its
gradient on top of the weighted loss's before optimizer1.step()), and optimizer2 is a new Adam every pass.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {
        "@weighted_backward": {"verdict": "needed", "runs": 3, "needed_runs": 3},
        "@task_grad": {"verdict": "can go", "runs": 6, "needed_runs": 0},
    },
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class fcNet(nn.Module):

    def __init__(self, dim_features, dim_labels, n_tasks):
        super(fcNet, self).__init__()
        # main layers
        self.fc1 = nn.Linear(dim_features, dim_labels)
        self.fc2 = nn.Linear(dim_labels, dim_labels)
        self.fc3 = nn.Linear(dim_labels, dim_labels)
        self.fc4 = nn.Linear(dim_labels, dim_labels)
        # heads for multitask
        self.heads = nn.ModuleList([nn.Linear(dim_labels, dim_labels) for _ in range(n_tasks)])

    def forward(self, x):
        # prediction
        h = F.relu(self.fc1(x))
        h = F.relu(self.fc2(h))
        h = F.relu(self.fc3(h))
        h = F.relu(self.fc4(h))
        # mse loss per task
        ys = []
        for i, head in enumerate(self.heads):
            y = head(h)
            ys.append(y)
        ys = torch.stack(ys, axis=1)
        return ys


class mtlNet(nn.Module):

    def __init__(self, net):
        super(mtlNet, self).__init__()
        self.net = net
        self.mse = nn.MSELoss()

    def forward(self, x, y):
        # prediction
        yp = self.net(x)
        # loss
        loss = []
        for i in range(yp.shape[1]):
            loss.append(self.mse(y[:, i], yp[:, i]))
        return torch.stack(loss)


class toyDataset:
    """data.py's toy example: tasks sharing B, each with its own epsilon and scale."""

    def __init__(self, num_data, dim_features, dim_labels, scalars):
        self.n = num_data
        self.p = dim_features
        self.d = dim_labels
        self.sigmas = np.array(scalars)
        self.B = np.random.normal(scale=10, size=(self.p, self.d))
        self.epsilons = np.random.normal(scale=3.5, size=(len(self.sigmas), self.p, self.d))
        self.x = np.random.uniform(0, 1, size=(self.n, self.p))
        ys = []
        for i in range(len(self.sigmas)):
            y = self.sigmas[i] * np.tanh(self.x @ (self.B + self.epsilons[i]))
            ys.append(y)
        self.ys = np.stack(ys, axis=1)

    def __len__(self):
        return self.n

    def __getitem__(self, ind):
        return torch.FloatTensor(self.x[ind]), torch.FloatTensor(self.ys[ind])


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    dataset = toyDataset(num_data=16, dim_features=6, dim_labels=4, scalars=[1, 100])
    dataloader = [dataset[slice(i, i + 4)] for i in range(0, len(dataset), 4)]
    net = fcNet(6, 4, 2)
    mtlnet = mtlNet(net)
    lr1, lr2 = 1e-5, 1e-4
    optimizer1 = torch.optim.Adam(mtlnet.parameters(), lr=lr1)
    mtlnet.train()
    return {"net": mtlnet, "layer": net.fc4, "alpha": 0.12, "dataloader": dataloader, "lr2": lr2,
            "optimizer1": optimizer1, "iters": 0, "weights": None, "T": None, "optimizer2": None, "l0": None}


def iteration(state: dict) -> None:
    net, layer, alpha, optimizer1 = state["net"], state["layer"], state["alpha"], state["optimizer1"]
    data = state["dataloader"][state["iters"] % len(state["dataloader"])]
    # forward pass
    loss = net(*data)
    # initialization
    if state["iters"] == 0:
        # init weights
        weights = torch.ones_like(loss)
        weights = torch.nn.Parameter(weights)
        state["T"] = weights.sum().detach()  # sum of weights
        # set optimizer for weights
        state["optimizer2"] = torch.optim.Adam([weights], lr=state["lr2"])
        # set L(0)
        state["l0"] = loss.detach()
        state["weights"] = weights
    weights, optimizer2, l0, T = state["weights"], state["optimizer2"], state["l0"], state["T"]
    # compute the weighted loss
    weighted_loss = weights @ loss
    # clear gradients of network
    optimizer1.zero_grad()
    # backward pass for weigthted task loss
    weighted_loss.backward(retain_graph=True)  # @weighted_backward
    # compute the L2 norm of the gradients for each task
    gw = []
    for i in range(len(loss)):
        dl = torch.autograd.grad(weights[i]*loss[i], layer.parameters(), retain_graph=True, create_graph=True)[0]  # @task_grad
        gw.append(torch.norm(dl))
    gw = torch.stack(gw)
    # compute loss ratio per task
    loss_ratio = loss.detach() / l0
    # compute the relative inverse training rate per task
    rt = loss_ratio / loss_ratio.mean()
    # compute the average gradient norm
    gw_avg = gw.mean().detach()
    # compute the GradNorm loss
    constant = (gw_avg * rt ** alpha).detach()
    gradnorm_loss = torch.abs(gw - constant).sum()
    # clear gradients of weights
    optimizer2.zero_grad()
    # backward pass for GradNorm
    gradnorm_loss.backward()  # @gradnorm_backward
    # update model weights
    optimizer1.step()
    # update loss weights
    optimizer2.step()
    # renormalize weights
    weights = (weights / weights.sum() * T).detach()
    weights = torch.nn.Parameter(weights)
    state["weights"] = weights
    state["optimizer2"] = torch.optim.Adam([weights], lr=state["lr2"])
    # update iters
    state["iters"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
