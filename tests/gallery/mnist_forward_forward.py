"""Hinton's forward-forward algorithm on MNIST: each layer trained alone, on its predecessor's detached outputs.

Source: pytorch/examples, mnist_forward_forward/main.py (commit 16d4ca4c6d003109741fcc1b3810c4d174ae051c):
get_y_neg, overlay_y_on_x, Net (its layers kept in a plain list, not registered as submodules, and a `train`
method that replaces nn.Module.train), Layer (an nn.Linear with its own Adam, forward on the L2-normalized input,
`train` running `num_epochs` passes of the goodness loss `log1p(exp(cat([-g_pos + threshold, g_neg -
threshold]))).mean()`, zero_grad, backward, step, and returning `self.forward(x_pos).detach(),
self.forward(x_neg).detach()`), `net.train(x_pos, x_neg)` on one batch. Retyped at CPU size: 20 features (published
784), dims [20, 16, 16] (published [784, 500, 500]), one made-up batch of 32 (published 50000 MNIST images),
3 epochs per layer (published 1000); `args` and `device` (module globals in the published script, set under
`__main__`) are set at module level; the prints, the test set and predict's error rates left out. One iteration is
one pass of Net.train's loop over the layers (`h_pos, h_neg = layer.train(h_pos, h_neg)`).
"""

import argparse
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.optim import Adam

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

args = argparse.Namespace(epochs=3, lr=0.03, threshold=2, log_interval=10, seed=1)
device = torch.device("cpu")


def get_y_neg(y):
    y_neg = y.clone()
    for idx, y_samp in enumerate(y):
        allowed_indices = list(range(10))
        allowed_indices.remove(y_samp.item())
        y_neg[idx] = torch.tensor(allowed_indices)[
            torch.randint(len(allowed_indices), size=(1,))
        ].item()
    return y_neg.to(device)


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Net(torch.nn.Module):
    def __init__(self, dims):

        super().__init__()
        self.layers = []
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1]).to(device)]

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            h_pos, h_neg = layer.train(h_pos, h_neg)


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=args.lr)
        self.threshold = args.threshold
        self.num_epochs = args.epochs

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log1p(
                torch.exp(
                    torch.cat([-g_pos + self.threshold, g_neg - self.threshold])
                )
            ).mean()
            self.opt.zero_grad()
            loss.backward()  # @backward
            self.opt.step()
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()  # @detached


def build() -> dict:
    torch.manual_seed(args.seed)
    net = Net([20, 16, 16])
    x = torch.randn(32, 20)
    y = torch.randint(0, 10, (32,))
    x, y = x.to(device), y.to(device)
    x_pos = overlay_y_on_x(x, y)
    y_neg = get_y_neg(y)
    x_neg = overlay_y_on_x(x, y_neg)
    # the published net.train(x_pos, x_neg), one pass of its layer loop per iteration
    return {"net": net, "h_pos": x_pos, "h_neg": x_neg, "i": 0}


def iteration(state: dict) -> None:
    layer = state["net"].layers[state["i"]]
    state["h_pos"], state["h_neg"] = layer.train(state["h_pos"], state["h_neg"])
    state["i"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
