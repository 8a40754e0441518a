"""Synaptic Intelligence: a running path integral of the gradients, turned into a quadratic penalty at each task's end.

Source: aimagelab/mammoth, models/si.py at commit 0151ba0b21e5189f5d67aa9c1428a322dac8ce66 (the class SI), with
ContinualModel's `opt` (SGD over the backbone) and the backbone's `get_params`/`get_grads` (one flat `torch.cat` of
the parameters, of their `.grad`) from the same repository, and the shape of utils/training.py's `train` (per task:
each batch through `observe`, then `end_task`). `observe` adds `c * penalty()` (`big_omega * (params - checkpoint)**2`,
a zero tensor before the first task ends), clips the gradients to 1, steps, and accumulates `small_omega += lr *
grads.data ** 2`; `end_task` folds it into `big_omega` and stores `checkpoint = params.data.clone()`. Retyped at CPU
size: an MLP 8-6-4, batch 4, 2 batches per task, 3 tasks (one task per iteration), c 0.5, xi 1.0, lr 0.1; data made up.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
INPUT, HIDDEN, CLASSES, BATCH, BATCHES = 8, 6, 4, 4, 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(INPUT, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.classifier(torch.relu(self.fc1(x)))

    def get_params(self) -> torch.Tensor:
        params = []
        for pp in list(self.parameters()):
            params.append(pp.view(-1))
        return torch.cat(params)

    def get_grads(self) -> torch.Tensor:
        grads = []
        for pp in list(self.parameters()):
            grads.append(pp.grad.view(-1))
        return torch.cat(grads)


class Args:
    c = 0.5
    xi = 1.0
    lr = 0.1


class SI(nn.Module):
    NAME = 'si'

    def __init__(self, backbone, loss, args):
        super(SI, self).__init__()
        self.net = backbone
        self.loss = loss
        self.args = args
        self.device = 'cpu'
        self.opt = torch.optim.SGD(self.net.parameters(), lr=self.args.lr)

        self.checkpoint = self.net.get_params().data.clone().to(self.device)
        self.big_omega = None
        self.small_omega = 0

    def get_parameters(self):
        return self.net.parameters()

    def penalty(self):
        if self.big_omega is None:
            return torch.tensor(0.0).to(self.device)
        else:
            penalty = (self.big_omega * ((self.net.get_params() - self.checkpoint) ** 2)).sum()
            return penalty

    def end_task(self, dataset):
        # big omega calculation step
        if self.big_omega is None:
            self.big_omega = torch.zeros_like(self.net.get_params()).to(self.device)

        self.big_omega += self.small_omega / ((self.net.get_params().data - self.checkpoint) ** 2 + self.args.xi)

        # store parameters checkpoint and reset small_omega
        self.checkpoint = self.net.get_params().data.clone().to(self.device)
        self.small_omega = 0

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):
        self.opt.zero_grad()
        outputs = self.net(inputs)
        penalty = self.penalty()
        loss = self.loss(outputs, labels) + self.args.c * penalty
        loss.backward()
        nn.utils.clip_grad.clip_grad_value_(self.get_parameters(), 1)
        self.opt.step()

        self.small_omega += self.args.lr * self.net.get_grads().data ** 2

        return loss.item()


def build() -> dict:
    torch.manual_seed(0)
    model = SI(Backbone(), nn.CrossEntropyLoss(), Args())
    tasks = []
    for t in range(ITERATIONS):
        batches = [(torch.randn(BATCH, INPUT) + t, torch.randint(0, CLASSES, (BATCH,))) for _ in range(BATCHES)]
        tasks.append(batches)
    return {"model": model, "tasks": tasks, "t": 0}


def iteration(state: dict) -> None:
    model, t = state["model"], state["t"]
    train_loader = state["tasks"][t]
    model.net.train()
    for epoch in range(1):
        for i, data in enumerate(train_loader):
            inputs, labels = data
            not_aug_inputs = inputs
            loss = model.observe(inputs, labels, not_aug_inputs, epoch=epoch)
    model.end_task(train_loader)
    state["t"] = t + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
