"""Fitting a polynomial with one Linear layer and a hand-written SGD update on the parameters, in place.

Source: pytorch/examples, regression/main.py at commit 1877b870cc42e8e50014fac432bf1e183f530b33 (the version of
https://github.com/pytorch/examples/issues/782, "Fix grad in-place operation issue remains in regression tests
after PR# 779", and PR #781): POLY_DEGREE 4, W_target and b_target, make_features, f, get_batch(batch_size=32),
`fc = torch.nn.Linear(W_target.size(0), 1)`, and `for batch_idx in count(1)`: get_batch, fc.zero_grad(),
`output = F.smooth_l1_loss(fc(batch_x), batch_y)`, `loss = output.item()`, output.backward(),
`param.add_(-0.1 * param.grad)` for each parameter (outside torch.no_grad(), as published then), and the stop at
loss < 1e-3. Retyped as published (it is already CPU size); W_target, b_target and fc, module globals made at import
in the published script, are made by build() after seeding; poly_desc and the final prints left out. One iteration
is one pass of `for batch_idx in count(1)`.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "other", "iteration": 1, "line": "@update"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

POLY_DEGREE = 4
W_target = None  # set by build(), as the published script sets them at import
b_target = None


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


def f(x):
    """Approximated function."""
    return x.mm(W_target) + b_target.item()


def get_batch(batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.randn(batch_size)
    x = make_features(random)
    y = f(x)
    return x, y


def build() -> dict:
    global W_target, b_target
    torch.manual_seed(0)
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5
    # Define model
    fc = torch.nn.Linear(W_target.size(0), 1)
    return {"fc": fc, "loss": None}


def iteration(state: dict) -> bool:
    fc = state["fc"]
    # Get data
    batch_x, batch_y = get_batch()

    # Reset gradients
    fc.zero_grad()

    # Forward pass
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    loss = output.item()
    state["loss"] = loss

    # Backward pass
    output.backward()  # @backward

    # Apply gradients
    for param in fc.parameters():
        param.add_(-0.1 * param.grad)  # @update

    # Stop criterion
    return loss < 1e-3


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for batch_idx in range(1, iterations + 1):
        if iteration(state):
            break


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
