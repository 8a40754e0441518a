"""A hand-written update: `w1 -= learning_rate * w1.grad` under no_grad, no model, no optimizer.

Source: the PyTorch tutorial "Learning PyTorch with Examples", PyTorch: Tensors and autograd
(pytorch/tutorials beginner_source/examples_autograd/two_layer_net_autograd.py): two weight tensors
that require grad, the forward `x.mm(w1).clamp(min=0).mm(w2)`, `loss.backward()`, then the manual
update and `grad.zero_()` inside `torch.no_grad()`. Retyped at CPU size: N, D_in, H, D_out = 8, 10, 6, 3
(the tutorial uses 64, 1000, 100, 10) and 3 iterations instead of 500.
"""

from collections.abc import Callable

import torch

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": ["w1", "w2"],
}


def build() -> dict:
    torch.manual_seed(0)
    dtype = torch.float
    device = torch.device("cpu")
    N, D_in, H, D_out = 8, 10, 6, 3
    return {
        "x": torch.randn(N, D_in, device=device, dtype=dtype),
        "y": torch.randn(N, D_out, device=device, dtype=dtype),
        "w1": torch.randn(D_in, H, device=device, dtype=dtype, requires_grad=True),
        "w2": torch.randn(H, D_out, device=device, dtype=dtype, requires_grad=True),
        "learning_rate": 1e-6,
        "t": 0,
    }


def iteration(state: dict) -> None:
    x, y, w1, w2, learning_rate = state["x"], state["y"], state["w1"], state["w2"], state["learning_rate"]
    t = state["t"]
    y_pred = x.mm(w1).clamp(min=0).mm(w2)
    loss = (y_pred - y).pow(2).sum()
    if t % 100 == 99:
        print(t, loss.item())
    loss.backward()  # @backward
    with torch.no_grad():
        w1 -= learning_rate * w1.grad  # @update_w1
        w2 -= learning_rate * w2.grad  # @update_w2
        w1.grad.zero_()
        w2.grad.zero_()
    state["t"] = t + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
