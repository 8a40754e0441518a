"""Labels built before the loop from tensors that require grad, then a hand-written SGD on W and b.

Source: zhangyu2234/Deep-learning-by-hand, "Chapter 1-Let's start with the simplest full connection/
1.3 Problems I encountered.ipynb" with utils/Common.py (DataLoader, loss, sgd, relu): the labels are
`Y = torch.mm(X, true_W) + true_b` where true_W and true_b were made with requires_grad=True, and the
loop `for x, y in dataloader: l = loss(fc(x, W, b), y); l.backward(); sgd([W, b], lr, batch_size)`
raised "Trying to backward through the graph a second time" (the notebook's saved output). Retyped at
CPU size: 40 samples instead of 4000, batches of 20 as published, one batch per iteration.
"""

from collections.abc import Callable
from random import shuffle

import torch

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "Y", "line": "@labels"}],
    "notes": [],
    "modifies_in_place": ["W", "b"],
}


class DataLoader:
    def __init__(self, data, labels, batch_size, shuffle=False):
        self.data = data
        self.batch_size = batch_size
        self.labels = labels
        self.indexes = list(range(len(self.data)))
        self.shuffle = shuffle

    def __iter__(self):
        self.start = 0
        if self.shuffle is True:
            shuffle(self.indexes)
        return self

    def __next__(self):
        start = self.start
        self.end = min(start + self.batch_size, len(self.data))
        if start >= self.end:
            raise StopIteration
        self.start += self.batch_size
        index = self.indexes[start:self.end]
        return self.data[index], self.labels[index]


def loss(y_hat, y):
    return torch.mean((y_hat.reshape(y.shape) - y) ** 2 / 2)


def sgd(params, lr, batch_size):
    with torch.no_grad():
        if isinstance(params, list):
            for i in range(len(params)):
                params[i] -= lr * params[i].grad / batch_size  # @sgd_update
                params[i].grad.zero_()
        else:
            params -= lr * params.grad / batch_size
            params.grad.zero_()


def relu(x):
    a = torch.zeros(x.shape)
    return torch.max(a, x)


def fc(x, w, b):
    return relu(torch.mm(x, w) + b)


def build() -> dict:
    import random

    torch.manual_seed(0)
    random.seed(0)
    num_samples = 40
    num_features = 2
    num_hiddens = 2
    X = torch.randn((num_samples, num_features), dtype=torch.float32)
    true_W = torch.randn((num_hiddens, 1), requires_grad=True, dtype=torch.float32)
    true_b = torch.randn(1, requires_grad=True, dtype=torch.float32)
    Y = torch.mm(X, true_W) + true_b  # @labels
    W = torch.normal(0, 0.01, size=(num_hiddens, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    batch_size = 20
    dataloader = DataLoader(X, Y, batch_size, shuffle=True)
    return {"X": X, "Y": Y, "true_W": true_W, "true_b": true_b, "W": W, "b": b, "lr": 0.01,
            "batch_size": batch_size, "dataloader": dataloader, "batches": iter(dataloader)}


def next_batch(state: dict):
    try:
        return next(state["batches"])
    except StopIteration:  # the next epoch of `for epoch in range(num_epochs): for x, y in dataloader:`
        state["batches"] = iter(state["dataloader"])
        return next(state["batches"])


def iteration(state: dict) -> None:
    W, b, lr, batch_size = state["W"], state["b"], state["lr"], state["batch_size"]
    x, y = next_batch(state)
    l = loss(fc(x, W, b), y)
    l.backward()  # @backward
    sgd([W, b], lr, batch_size)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
