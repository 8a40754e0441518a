"""A running total kept for logging: `total_loss += loss` keeps every iteration's graph alive.

Source: PyTorch's FAQ, "My model reports 'cuda runtime error(2): out of memory'" (pytorch/pytorch
docs/source/notes/faq.rst, "Don't accumulate history across your training loop"): `total_loss = 0`,
then per iteration optimizer.zero_grad(), `output = model(input)`, `loss = criterion(output)`,
loss.backward(), optimizer.step(), `total_loss += loss`. Retyped at CPU size: model Linear(3, 1),
criterion a mean of squares, 4 inputs, SGD, 3 iterations instead of 10000.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "total_loss", "line": "@accumulate"}],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return {"model": model, "input": torch.randn(4, 3), "criterion": lambda output: (output ** 2).mean(),
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "total_loss": 0}


def iteration(state: dict) -> None:
    model, optimizer, criterion = state["model"], state["optimizer"], state["criterion"]
    optimizer.zero_grad()
    output = model(state["input"])
    loss = criterion(output)
    loss.backward()  # @backward
    optimizer.step()
    state["total_loss"] += loss  # @accumulate


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
