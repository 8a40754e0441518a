"""Deep SVDD, soft-boundary objective: the hypersphere centre c computed from the network before training, R per batch.

Source: lukasruff/Deep-SVDD-PyTorch, src/optim/deepSVDD_trainer.py (commit 01f089c2a8b5665c4bf01c9e592dc331ed356d8c)
and src/networks/mnist_LeNet.py: DeepSVDDTrainer.train() (Adam with weight decay, MultiStepLR stepped at the top of
each epoch, `self.c = self.init_center_c(train_loader, net)` before the loop: the mean of the network's outputs
over the training set under `net.eval()` and `torch.no_grad()`; then per batch `optimizer.zero_grad()`,
`dist = torch.sum((outputs - self.c) ** 2, dim=1)`, the soft-boundary loss `self.R ** 2 + (1 / self.nu) *
torch.mean(torch.max(torch.zeros_like(scores), scores))`, `loss.backward()`, `optimizer.step()`, and
`self.R.data = torch.tensor(get_radius(dist, self.nu), device=self.device)`, the (1 - nu)-quantile of the batch's
distances through numpy), `get_radius`, and MNIST_LeNet's shape (bias-free convolutions, BatchNorm2d with
`affine=False`, leaky ReLU, max pooling, a bias-free linear `rep_dim` output). `net.train()` is called once before
the epochs, as published (init_center_c leaves the net in eval mode until then).
Retyped at CPU size: one conv (1->4, 5x5, padding 2) on 1x8x8 images (published two convs on 28x28), rep_dim 8
(published 32), two batches of 4 made-up images per epoch in place of the MNIST one-class loader (each batch the
published (inputs, labels, idx) triple), nu = 0.1, 3 epochs; logging and timing left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class MNIST_LeNet(nn.Module):

    def __init__(self):
        super().__init__()

        self.rep_dim = 8
        self.pool = nn.MaxPool2d(2, 2)

        self.conv1 = nn.Conv2d(1, 4, 5, bias=False, padding=2)
        self.bn1 = nn.BatchNorm2d(4, eps=1e-04, affine=False)
        self.fc1 = nn.Linear(4 * 4 * 4, self.rep_dim, bias=False)

    def forward(self, x):
        x = self.conv1(x)
        x = self.pool(F.leaky_relu(self.bn1(x)))
        x = x.view(x.size(0), -1)
        x = self.fc1(x)
        return x


def init_center_c(train_loader, net, device='cpu', eps=0.1):
    """Initialize hypersphere center c as the mean from an initial forward pass on the data."""
    n_samples = 0
    c = torch.zeros(net.rep_dim, device=device)

    net.eval()
    with torch.no_grad():
        for data in train_loader:
            # get the inputs of the batch
            inputs, _, _ = data
            inputs = inputs.to(device)
            outputs = net(inputs)
            n_samples += outputs.shape[0]
            c += torch.sum(outputs, dim=0)

    c /= n_samples

    # TODO: Make sure elements of center c are not initialized too close to 0 using eps?

    return c


def get_radius(dist: torch.Tensor, nu: float):
    """Optimally solve for radius R via the (1-nu)-quantile of distances."""
    return np.quantile(dist.clone().data.cpu().numpy(), 1-nu)


def build() -> dict:
    torch.manual_seed(0)
    device = 'cpu'
    net = MNIST_LeNet().to(device)
    train_loader = [(torch.randn(4, 1, 8, 8), torch.zeros(4, dtype=torch.long), torch.arange(4 * b, 4 * b + 4))
                    for b in range(2)]
    # Set optimizer (Adam optimizer for now)
    optimizer = optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-6)
    # Set learning rate scheduler
    milestones = [50]
    scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
    R = torch.tensor(0.0, device=device)  # radius R initialized with 0 by default.
    # Initialize hypersphere center c (if c not loaded)
    c = init_center_c(train_loader, net, device)
    net.train()
    return {"net": net, "train_loader": train_loader, "optimizer": optimizer, "scheduler": scheduler,
            "milestones": milestones, "R": R, "c": c, "nu": 0.1, "objective": "soft-boundary", "device": device}


def iteration(state: dict) -> None:
    net, train_loader, optimizer, scheduler, c, nu, device = (
        state["net"], state["train_loader"], state["optimizer"], state["scheduler"], state["c"], state["nu"],
        state["device"])
    scheduler.step()

    loss_epoch = 0.0
    n_batches = 0
    for data in train_loader:
        inputs, _, _ = data
        inputs = inputs.to(device)

        # Zero the network parameter gradients
        optimizer.zero_grad()

        # Update network parameters via backpropagation: forward + backward + optimize
        outputs = net(inputs)
        dist = torch.sum((outputs - c) ** 2, dim=1)
        if state["objective"] == 'soft-boundary':
            scores = dist - state["R"] ** 2
            loss = state["R"] ** 2 + (1 / nu) * torch.mean(torch.max(torch.zeros_like(scores), scores))
        else:
            loss = torch.mean(dist)
        loss.backward()  # @backward
        optimizer.step()

        # Update hypersphere radius R on mini-batch distances
        if state["objective"] == 'soft-boundary':
            state["R"].data = torch.tensor(get_radius(dist, nu), device=device)

        loss_epoch += loss.item()
        n_batches += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
