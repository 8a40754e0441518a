"""A conditional GAN whose generator loss reuses the discriminator's graph after the discriminator has stepped.

Source: MorvanZhou/PyTorch-Tutorial, tutorial-contents/406_conditional_GAN.py (commit
4e5122c3734dcdc9ace164c2a87fbd412ca1d431), and its issue #98 (https://github.com/MorvanZhou/PyTorch-Tutorial/issues/98,
"retain_graph=True 相关问题"): "one of the variables needed for gradient computation has been modified by an inplace
operation: [torch.FloatTensor [128, 1]], which is output 0 of TBackward, is at version 2; expected version 1"; the
answer there: the discriminator is updated before the generator's gradient is computed. (The same ordering was fixed
in 406_GAN.py after issue #89, which gallery/simple_gan.py retypes; this file kept it.) As published: G
(Linear(N_IDEAS+1, 128), ReLU, Linear(128, ART_COMPONENTS)) on random ideas with the class label, D
(Linear(ART_COMPONENTS+1, 128), ReLU, Linear(128, 1), Sigmoid) on paintings with their labels, `D_score1 =
torch.log(1. - prob_artist1)` shared by `D_loss = - torch.mean(D_score0 + D_score1)` and `G_loss =
torch.mean(D_score1)`, then opt_D.zero_grad(), `D_loss.backward(retain_graph=True)      # reusing computational
graph`, opt_D.step(), opt_G.zero_grad(), G_loss.backward(), opt_G.step(). Retyped at CPU size: BATCH_SIZE 8
(published 64), 16 hidden units (published 128), ART_COMPONENTS 5 (published 15); seeds set (the published ones are
commented out); the plotting every 200 steps is left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3

# Hyper Parameters
BATCH_SIZE = 8
LR_G = 0.0001           # learning rate for generator
LR_D = 0.0001           # learning rate for discriminator
N_IDEAS = 5             # think of this as number of ideas for generating an art work (Generator)
ART_COMPONENTS = 5      # it could be total point G can draw in the canvas
PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@g_backward"},
    "retains": {"@d_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def artist_works_with_labels():     # painting from the famous artist (real target)
    a = np.random.uniform(1, 2, size=BATCH_SIZE)[:, np.newaxis]
    paintings = a * np.power(PAINT_POINTS, 2) + (a-1)
    labels = (a-1) > 0.5            # upper paintings (1), lower paintings (0), two classes
    paintings = torch.from_numpy(paintings).float()
    labels = torch.from_numpy(labels.astype(np.float32))
    return paintings, labels


def build() -> dict:
    torch.manual_seed(1)
    np.random.seed(1)
    G = nn.Sequential(                      # Generator
        nn.Linear(N_IDEAS+1, 16),           # random ideas (could from normal distribution) + class label
        nn.ReLU(),
        nn.Linear(16, ART_COMPONENTS),      # making a painting from these random ideas
    )

    D = nn.Sequential(                      # Discriminator
        nn.Linear(ART_COMPONENTS+1, 16),    # receive art work either from the famous artist or a newbie like G with label
        nn.ReLU(),
        nn.Linear(16, 1),
        nn.Sigmoid(),                       # tell the probability that the art work is made by artist
    )

    opt_D = torch.optim.Adam(D.parameters(), lr=LR_D)
    opt_G = torch.optim.Adam(G.parameters(), lr=LR_G)
    return {"G": G, "D": D, "opt_D": opt_D, "opt_G": opt_G}


def iteration(state: dict) -> None:
    G, D, opt_D, opt_G = state["G"], state["D"], state["opt_D"], state["opt_G"]
    artist_paintings, labels = artist_works_with_labels()           # real painting, label from artist
    G_ideas = torch.randn(BATCH_SIZE, N_IDEAS)                      # random ideas
    G_inputs = torch.cat((G_ideas, labels), 1)                      # ideas with labels
    G_paintings = G(G_inputs)                                       # fake painting w.r.t label from G

    D_inputs0 = torch.cat((artist_paintings, labels), 1)            # all have their labels
    D_inputs1 = torch.cat((G_paintings, labels), 1)
    prob_artist0 = D(D_inputs0)                 # D try to increase this prob
    prob_artist1 = D(D_inputs1)                 # D try to reduce this prob

    D_score0 = torch.log(prob_artist0)          # maximise this for D
    D_score1 = torch.log(1. - prob_artist1)     # maximise this for D
    D_loss = - torch.mean(D_score0 + D_score1)  # minimise the negative of both two above for D
    G_loss = torch.mean(D_score1)               # minimise D score w.r.t G

    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)      # reusing computational graph  # @d_backward
    opt_D.step()

    opt_G.zero_grad()
    G_loss.backward()  # @g_backward
    opt_G.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for step in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
