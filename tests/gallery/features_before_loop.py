"""Features computed once before the loop, with grad, and a head trained on them with a retaining backward.

Source: the pattern of the PyTorch forum thread "RuntimeError: Trying to backward through the graph a
second time, but the buffers have already been freed" (discuss.pytorch.org/t/6795), as kept in
hughplay/memo, code/snippet/pytorch.py: `y = model(x)` computed once, then `out_1 = f(y)`,
`out_1.backward(retain_graph=True)`, `opt_1.step()`. Here that step is the loop body, repeated over
iterations on the same precomputed `y` (the snippet shows one pass; shared_features_two_heads.py keeps
its second head). Retyped at CPU size: model Linear(6, 4)+ReLU, f a Linear(4, 1) head with its own
SGD, 8 samples, 3 iterations.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {"@head_backward": {"verdict": "goes with the carried fix", "runs": 3, "needed_runs": 2}},
    "carried": [{"variable": "y", "line": "@features"}],
    "notes": [],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU())
    f = nn.Linear(4, 1)
    x = torch.randn(8, 6)
    y = model(x)  # @features
    return {"model": model, "f": f, "x": x, "y": y, "target": torch.randn(8, 1),
            "opt_1": torch.optim.SGD(f.parameters(), lr=0.1)}


def iteration(state: dict) -> None:
    model, f, y, opt_1 = state["model"], state["f"], state["y"], state["opt_1"]
    model.zero_grad()
    out_1 = ((f(y) - state["target"]) ** 2).mean()
    out_1.backward(retain_graph=True)  # @head_backward
    opt_1.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
