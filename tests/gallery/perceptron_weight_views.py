"""A perceptron whose weight is unpacked into two views before training, kept while SGD changes the weight.

Source: getarun4t/OpenCV_Learning, PyTorch-Perceptrons/pytorch_perceptrons.py, in its version with the model and
training cells (commit 51a8913f33d70596745cccd1bfa0dfa3c2faedc9 of that path holds only the data cells; the later
text, same "# Headers" / "# Creating datasets" comments, is the one retyped here). The same script is the
"Perceptron" lesson of the PyTorch for Deep Learning and Computer Vision course and of javatpoint's "Testing of
Perceptron Model" (www.javatpoint.com/pytorch-testing-of-perceptron-model): `[w, b] = model.parameters()`, `w1,
w2 = w.view(2)` (unpacking a tensor iterates it: both are outputs of one unbind, views of the weight), `b1 =
b[0]`, `get_params()` reads `w1.item(), w2.item(), b[0].item()` for `plot_fit`, then BCELoss, SGD(lr=0.02) and
1000 epochs of forward / loss / zero_grad / backward / step. The views are made once, before the loop, and the
loop never touches them: SGD changes `w` in place under them, and the script runs to the end. Retyped at CPU
size: the published 100 points of `datasets.make_blobs` around [-0.5, 0.5] and [0.5, -0.5] (std 0.4) are made up
with torch.randn at the same centres and shapes, three epochs; printing and plotting left out (build() calls get_params() once, as
plot_fit("Model") does). `w`, `b`, `w1`, `w2` and `b1` are module globals that get_params reads, as in the
published script.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
w = b = w1 = w2 = b1 = None  # set by build(); get_params reads them as the published script does

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [
        {"variable": "w1", "line": "@unpack_weight"},
        {"variable": "w2", "line": "@unpack_weight"},
        {"variable": "b1", "line": "@select_bias"},
    ],
    "modifies_in_place": [],
}


class Model(nn.Module):
    def __init__(self, input_size, output_size):
        super().__init__()
        self.linear = nn.Linear(input_size, output_size)

    def forward(self, X):
        pred = torch.sigmoid(self.linear(X))
        return pred


def get_params():
    return (w1.item(), w2.item(), b[0].item())


def build() -> dict:
    global w, b, w1, w2, b1
    torch.manual_seed(2)
    n_pts = 100
    centers = torch.tensor([[-0.5, 0.5], [0.5, -0.5]])
    y = torch.arange(n_pts) % 2
    X_data = centers[y] + 0.4 * torch.randn(n_pts, 2)
    y_data = y.float().reshape(100, 1)

    model = Model(2, 1)
    [w, b] = model.parameters()
    w1, w2 = w.view(2)  # @unpack_weight
    b1 = b[0]  # @select_bias
    get_params()

    criterion = nn.BCELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    return {"model": model, "X_data": X_data, "y_data": y_data, "criterion": criterion,
            "optimizer": optimizer, "losses": []}


def epoch(state: dict) -> None:
    model, criterion, optimizer = state["model"], state["criterion"], state["optimizer"]
    y_pred = model.forward(state["X_data"])
    loss = criterion(y_pred, state["y_data"])

    state["losses"].append(loss.item())
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        epoch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: epoch(state)


if __name__ == "__main__":
    run(build())
