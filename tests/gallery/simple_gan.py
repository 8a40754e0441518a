"""A simple GAN whose plotting keeps the last step's paintings, score and loss between steps.

Source: MorvanZhou/PyTorch-Tutorial, tutorial-contents/406_GAN.py: G and D as small Sequential MLPs,
the generator step first (G_loss.backward(), opt_G.step()), then D on `G_paintings.detach()` with
`D_loss.backward(retain_graph=True)      # reusing computational graph`. The plotting block (every 50
steps) reads `G_paintings`, `prob_artist0` and `D_loss`, script-level names that outlive their step;
they are kept in the state the same way, and the plot itself is left out. Retyped at CPU size:
BATCH_SIZE 8 (published 64), 16 hidden units (published 128), ART_COMPONENTS 5, 3 steps.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3
BATCH_SIZE = 8
LR_G = 0.0001
LR_D = 0.0001
N_IDEAS = 5
ART_COMPONENTS = 5
PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])

TRUTH = {
    "error": None,
    "retains": {"@d_backward": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [
        {"variable": "G_paintings", "line": "@g_paintings"},
        {"variable": "prob_artist0", "line": "@prob_artist0"},
        {"variable": "D_loss", "line": "@d_loss"},
    ],
    "modifies_in_place": [],
}


def artist_works():
    a = np.random.uniform(1, 2, size=BATCH_SIZE)[:, np.newaxis]
    paintings = a * np.power(PAINT_POINTS, 2) + (a - 1)
    paintings = torch.from_numpy(paintings).float()
    return paintings


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    G = nn.Sequential(nn.Linear(N_IDEAS, 16), nn.ReLU(), nn.Linear(16, ART_COMPONENTS))
    D = nn.Sequential(nn.Linear(ART_COMPONENTS, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
    return {
        "G": G,
        "D": D,
        "opt_D": torch.optim.Adam(D.parameters(), lr=LR_D),
        "opt_G": torch.optim.Adam(G.parameters(), lr=LR_G),
        "G_paintings": None,
        "prob_artist0": None,
        "D_loss": None,
    }


def iteration(state: dict) -> None:
    G, D, opt_D, opt_G = state["G"], state["D"], state["opt_D"], state["opt_G"]
    artist_paintings = artist_works()
    G_ideas = torch.randn(BATCH_SIZE, N_IDEAS, requires_grad=True)
    state["G_paintings"] = G(G_ideas)  # @g_paintings
    prob_artist1 = D(state["G_paintings"])
    G_loss = torch.mean(torch.log(1. - prob_artist1))
    opt_G.zero_grad()
    G_loss.backward()  # @g_backward
    opt_G.step()

    state["prob_artist0"] = D(artist_paintings)  # @prob_artist0
    prob_artist1 = D(state["G_paintings"].detach())
    state["D_loss"] = - torch.mean(torch.log(state["prob_artist0"]) + torch.log(1. - prob_artist1))  # @d_loss
    opt_D.zero_grad()
    state["D_loss"].backward(retain_graph=True)  # @d_backward
    opt_D.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for step in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
