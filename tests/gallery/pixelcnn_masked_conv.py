"""PixelCNN on MNIST (jzbontar): masked 7x7 convolutions, a 256-way softmax per pixel, sampling pixel by pixel.

Source: jzbontar/pixelcnn-pytorch, main.py (commit 2bf97108c6ffa294c8c9d15d70dd0f3d4a293936): MaskedConv2d (a
mask buffer of type 'A' or 'B', `self.weight.data *= self.mask` at every forward), the net of six masked convs
(one 'A', five 'B') with ReLU, SGD lr 0.01 momentum 0.9 nesterov; per epoch the training loop (`target =
(input.data[:,0] * 255).long()`, `loss = F.cross_entropy(net(input), target)`, `err.append(...)`,
`optimizer.zero_grad()`, `loss.backward()`, `optimizer.step()`), then sampling: `sample.fill_(0)` and for each
pixel `out = net(Variable(sample, volatile=True))`, `probs = F.softmax(out[:, :, i, j]).data`,
`sample[:, :, i, j] = torch.multinomial(probs, 1).float() / 255.`. Retyped for torch 2.13: `Variable(...)`
dropped (`volatile=True` has been a no-op since torch 0.4, so sampling records graphs as the published code now
does), `loss.data[0]` (an IndexError on a 0-dim tensor) is `loss.item()`, `F.softmax(..., dim=1)` (the implicit
dim of a 2-D input), `async=True` and `.cuda()` dropped. CPU size: fm 8 (published 32), 8x8 images (published
28x28), made-up pixels k/255 in place of MNIST, 2 batches of 4 an epoch (published 128), 4 samples (published
144); save_image and the print left out. One iteration is one epoch.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

ITERATIONS = 3
SIZE = 8

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class MaskedConv2d(nn.Conv2d):
    def __init__(self, mask_type, *args, **kwargs):
        super(MaskedConv2d, self).__init__(*args, **kwargs)
        assert mask_type in {'A', 'B'}
        self.register_buffer('mask', self.weight.data.clone())
        _, _, kH, kW = self.weight.size()
        self.mask.fill_(1)
        self.mask[:, :, kH // 2, kW // 2 + (mask_type == 'B'):] = 0
        self.mask[:, :, kH // 2 + 1:] = 0

    def forward(self, x):
        self.weight.data *= self.mask
        return super(MaskedConv2d, self).forward(x)


def build() -> dict:
    torch.manual_seed(0)
    fm = 8
    net = nn.Sequential(
        MaskedConv2d('A', 1,   fm, 7, 1, 3), nn.ReLU(True),
        MaskedConv2d('B', fm,  fm, 7, 1, 3), nn.ReLU(True),
        MaskedConv2d('B', fm,  fm, 7, 1, 3), nn.ReLU(True),
        MaskedConv2d('B', fm,  fm, 7, 1, 3), nn.ReLU(True),
        MaskedConv2d('B', fm,  fm, 7, 1, 3), nn.ReLU(True),
        MaskedConv2d('B', fm, 256, 7, 1, 3))
    tr = [torch.randint(0, 256, (4, 1, SIZE, SIZE)).float() / 255. for _ in range(2)]
    sample = torch.Tensor(4, 1, SIZE, SIZE)
    optimizer = optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    return {"net": net, "tr": tr, "sample": sample, "optimizer": optimizer, "mean_err": []}


def iteration(state: dict) -> None:
    net, tr, sample, optimizer = state["net"], state["tr"], state["sample"], state["optimizer"]
    # train
    err = []
    for input in tr:
        target = (input.data[:, 0] * 255).long()
        loss = F.cross_entropy(net(input), target)
        err.append(loss.item())
        optimizer.zero_grad()
        loss.backward()  # @backward
        optimizer.step()

    # sample
    sample.fill_(0)
    for i in range(SIZE):
        for j in range(SIZE):
            out = net(sample)
            probs = F.softmax(out[:, :, i, j], dim=1).data
            sample[:, :, i, j] = torch.multinomial(probs, 1).float() / 255.

    state["mean_err"].append(np.mean(err))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
