"""NPID (instance discrimination): a memory bank of one feature per image, updated inside the autograd backward.

Source: zhirongw/lemniscate.pytorch, cifar.py and lib/LinearAverage.py (commit
06c2d49de8a05a2034a0df2942f9121621f49dc0), the `--nce-k 0` path of the CIFAR script: `lemniscate =
LinearAverage(args.low_dim, ndata, args.nce_t, args.nce_m)` with `criterion = nn.CrossEntropyLoss()`.
LinearAverageOp is the published custom autograd Function: forward `out = torch.mm(x, memory.t())`,
`out.div_(T)`, the context's `data_for_backward`; backward scales the incoming gradient in place
(`gradOutput.data.div_(T)`), computes `gradInput`, and updates the non-parametric memory with
`memory.index_copy_(0, y, updated_weight)`. train(): `optimizer.zero_grad()`, `features = net(inputs)`,
`outputs = lemniscate(features, indexes)`, `loss = criterion(outputs, indexes)`, `loss.backward()`,
`optimizer.step()`; SGD lr 0.1, momentum 0.9, weight_decay 5e-4. Ported to current torch: the `Variable(...)`
wrappers are removed and `train_loss.update(loss.data[0], ...)` reads `loss.item()` (indexing a 0-dim tensor
raises since torch 0.4). Retyped at CPU size: ResNet18(low_dim=128) becomes conv 3->4 + BatchNorm + ReLU, average
pool, Linear(4, low_dim) and the published Normalize (lib/normalize.py, the l2 norm it ends with); low_dim 8,
ndata 8 made-up 8x8 images (CIFAR10Instance's (inputs, targets, indexes)) in 2 batches of 4, one epoch per
iteration; the timers' prints, kNN and the checkpoints are left out.
"""

import math
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Function

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class LinearAverageOp(Function):
    @staticmethod
    def forward(self, x, y, memory, params):
        T = params[0]
        batchSize = x.size(0)
        outputSize = memory.size(1)
        inputSize = memory.size(1)

        # inner product
        out = torch.mm(x, memory.t())
        out.div_(T)  # batchSize * N

        self.data_for_backward = x, memory, y, params

        return out

    @staticmethod
    def backward(self, gradOutput):
        x, memory, y, params = self.data_for_backward
        batchSize = gradOutput.size(0)
        T = params[0]
        momentum = params[1]

        # add temperature
        gradOutput.data.div_(T)

        # gradient of linear
        gradInput = torch.mm(gradOutput.data, memory)
        gradInput.resize_as_(x)

        # update the non-parametric data
        weight_pos = memory.index_select(0, y.view(-1)).resize_as_(x)
        weight_pos.mul_(momentum)
        weight_pos.add_(torch.mul(x, 1 - momentum))
        w_norm = weight_pos.pow(2).sum(1, keepdim=True).pow(0.5)
        updated_weight = weight_pos.div(w_norm)
        memory.index_copy_(0, y, updated_weight)

        return gradInput, None, None, None


class LinearAverage(nn.Module):
    def __init__(self, inputSize, outputSize, T=0.07, momentum=0.5):
        super(LinearAverage, self).__init__()
        stdv = 1 / math.sqrt(inputSize)
        self.nLem = outputSize

        self.register_buffer("params", torch.Tensor([T, momentum]))
        stdv = 1.0 / math.sqrt(inputSize / 3)
        self.register_buffer("memory", torch.rand(outputSize, inputSize).mul_(2 * stdv).add_(-stdv))

    def forward(self, x, y):
        out = LinearAverageOp.apply(x, y, self.memory, self.params)
        return out


class Normalize(nn.Module):
    def __init__(self, power=2):
        super(Normalize, self).__init__()
        self.power = power

    def forward(self, x):
        norm = x.pow(self.power).sum(1, keepdim=True).pow(1.0 / self.power)
        out = x.div(norm)
        return out


class ResNet(nn.Module):
    """A CPU-size stand-in for ResNet18(low_dim): conv, bn, relu, pool, linear, then the published l2norm."""

    def __init__(self, low_dim=128):
        super(ResNet, self).__init__()
        self.conv1 = nn.Conv2d(3, 4, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.linear = nn.Linear(4, low_dim)
        self.l2norm = Normalize(2)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = nn.functional.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        out = self.linear(out)
        out = self.l2norm(out)
        return out


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self):
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def build() -> dict:
    torch.manual_seed(0)
    low_dim, ndata, nce_t, nce_m, lr = 8, 8, 0.1, 0.5, 0.1
    images, targets = torch.rand(ndata, 3, 8, 8), torch.randint(0, 10, (ndata,))
    indexes = torch.arange(ndata)
    trainloader = [(images[i : i + 4], targets[i : i + 4], indexes[i : i + 4]) for i in range(0, ndata, 4)]
    net = ResNet(low_dim=low_dim)
    lemniscate = LinearAverage(low_dim, ndata, nce_t, nce_m)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    return {
        "net": net,
        "lemniscate": lemniscate,
        "criterion": criterion,
        "optimizer": optimizer,
        "trainloader": trainloader,
        "epoch": 0,
    }


# Training
def train(epoch, net, lemniscate, criterion, optimizer, trainloader):
    train_loss = AverageMeter()
    data_time = AverageMeter()
    batch_time = AverageMeter()

    # switch to train mode
    net.train()

    end = time.time()
    for batch_idx, (inputs, targets, indexes) in enumerate(trainloader):
        data_time.update(time.time() - end)
        optimizer.zero_grad()

        features = net(inputs)
        outputs = lemniscate(features, indexes)
        loss = criterion(outputs, indexes)

        loss.backward()  # @backward
        optimizer.step()

        train_loss.update(loss.item(), inputs.size(0))

        # measure elapsed time
        batch_time.update(time.time() - end)
        end = time.time()


def iteration(state: dict) -> None:
    train(
        state["epoch"], state["net"], state["lemniscate"], state["criterion"], state["optimizer"], state["trainloader"]
    )
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        train(epoch, state["net"], state["lemniscate"], state["criterion"], state["optimizer"], state["trainloader"])


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
