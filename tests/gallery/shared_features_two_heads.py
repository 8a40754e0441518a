"""Shared features computed before the loop and two heads: the first backward retains, the second does not.

Source: hughplay/memo, code/snippet/pytorch.py (its "Backward through the graph a second time" entry,
from discuss.pytorch.org/t/6795): `y = model(x)`, `model.zero_grad()`, `out_1 = f(y)`,
`out_1.backward(retain_graph=True)`, `opt_1.step()`, `model.zero_grad()`, `out_2 = g(y)`,
`out_2.backward()`, `opt_2.step()`, with `y` made once before the loop and the rest as the loop body.
Retyped at CPU size: model Linear(6, 4)+ReLU, heads f and g Linear(4, 1) each with its own SGD (opt_1
and opt_2 step only their head, so the shared model's weights never change under the saved graph).
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@out_1_backward"},
    "retains": {"@out_1_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [{"variable": "y", "line": "@features"}],
    "notes": [],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU())
    f, g = nn.Linear(4, 1), nn.Linear(4, 1)
    x = torch.randn(8, 6)
    y = model(x)  # @features
    return {"model": model, "f": f, "g": g, "x": x, "y": y,
            "opt_1": torch.optim.SGD(f.parameters(), lr=0.1), "opt_2": torch.optim.SGD(g.parameters(), lr=0.1)}


def iteration(state: dict) -> None:
    model, f, g, y, opt_1, opt_2 = state["model"], state["f"], state["g"], state["y"], state["opt_1"], state["opt_2"]
    model.zero_grad()
    out_1 = f(y).pow(2).mean()
    out_1.backward(retain_graph=True)  # @out_1_backward
    opt_1.step()
    model.zero_grad()
    out_2 = g(y).abs().mean()
    out_2.backward()  # @out_2_backward
    opt_2.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
