"""Wide-ResNet on CIFAR whose `train(epoch)` builds a fresh SGD optimizer (momentum 0.9) at every epoch.

Source: bmsookim/wide-resnet.pytorch, main.py (train(epoch) starts with `optimizer = optim.SGD(net.parameters(),
lr=cf.learning_rate(args.lr, epoch), momentum=0.9, weight_decay=5e-4)`, then zero_grad, forward,
CrossEntropyLoss, backward, step per batch; the script's loop is `for epoch in ...: train(epoch); test(epoch)`)
and networks/wide_resnet.py (wide_basic, Wide_ResNet, conv_init). The re-created optimizer (its momentum
buffers start from zero every epoch) is asked about in the repository's issue #8, "Definition of Optimizer in
train function" (github.com/bmsookim/wide-resnet.pytorch/issues/8). config.py's learning_rate step schedule
(0.2x at epochs 60/120/160) is retyped as its forks keep it (config.py itself is not in the searched index).
Retyped at CPU size: depth 10, widen_factor 1 (published 28x10), dropout 0.3 as published, batches of 4
made-up 3x32x32 images with random labels, 2 training batches and 1 test batch per epoch, 3 epochs; the
DataLoaders, transforms, CUDA/DataParallel lines, the prints and progress writes to stdout and the checkpoint
file are left out (best_acc is still kept); `n = (depth-4)/6` is written `//` (the Python 2 division the
published code relies on: `[1]*(num_blocks-1)` needs an int); `Variable(...)` wrappers dropped (`volatile=True`
has had no effect since PyTorch 0.4, so test() builds a graph as the published script does today);
`loss.data[0]` is read as `.item()`; the deprecated `init.xavier_uniform`/`init.constant` are written
`xavier_uniform_`/`constant_`.
"""

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
import torch.optim as optim

ITERATIONS = 3
BATCH_SIZE = 4
NUM_CLASSES = 10
LR = 0.1

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def learning_rate(init, epoch):
    optim_factor = 0
    if (epoch > 160):
        optim_factor = 3
    elif (epoch > 120):
        optim_factor = 2
    elif (epoch > 60):
        optim_factor = 1
    return init * math.pow(0.2, optim_factor)


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=True)


def conv_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        init.xavier_uniform_(m.weight, gain=np.sqrt(2))
        init.constant_(m.bias, 0)
    elif classname.find('BatchNorm') != -1:
        init.constant_(m.weight, 1)
        init.constant_(m.bias, 0)


class wide_basic(nn.Module):
    def __init__(self, in_planes, planes, dropout_rate, stride=1):
        super(wide_basic, self).__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, padding=1, bias=True)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=True)

        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=True),
            )

    def forward(self, x):
        out = self.dropout(self.conv1(F.relu(self.bn1(x))))
        out = self.conv2(F.relu(self.bn2(out)))
        out += self.shortcut(x)

        return out


class Wide_ResNet(nn.Module):
    def __init__(self, depth, widen_factor, dropout_rate, num_classes):
        super(Wide_ResNet, self).__init__()
        self.in_planes = 16

        assert ((depth - 4) % 6 == 0), 'Wide-resnet depth should be 6n+4'
        n = (depth - 4) // 6
        k = widen_factor

        nStages = [16, 16 * k, 32 * k, 64 * k]

        self.conv1 = conv3x3(3, nStages[0])
        self.layer1 = self._wide_layer(wide_basic, nStages[1], n, dropout_rate, stride=1)
        self.layer2 = self._wide_layer(wide_basic, nStages[2], n, dropout_rate, stride=2)
        self.layer3 = self._wide_layer(wide_basic, nStages[3], n, dropout_rate, stride=2)
        self.bn1 = nn.BatchNorm2d(nStages[3], momentum=0.9)
        self.linear = nn.Linear(nStages[3], num_classes)

    def _wide_layer(self, block, planes, num_blocks, dropout_rate, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []

        for stride in strides:
            layers.append(block(self.in_planes, planes, dropout_rate, stride))
            self.in_planes = planes

        return nn.Sequential(*layers)

    def forward(self, x):
        out = self.conv1(x)
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = F.relu(self.bn1(out))
        out = F.avg_pool2d(out, 8)
        out = out.view(out.size(0), -1)
        out = self.linear(out)

        return out


def build() -> dict:
    torch.manual_seed(0)
    net = Wide_ResNet(10, 1, 0.3, NUM_CLASSES)
    net.apply(conv_init)
    trainloader = [(torch.randn(BATCH_SIZE, 3, 32, 32), torch.randint(0, NUM_CLASSES, (BATCH_SIZE,))) for _ in range(2)]
    testloader = [(torch.randn(BATCH_SIZE, 3, 32, 32), torch.randint(0, NUM_CLASSES, (BATCH_SIZE,)))]
    return {
        "net": net,
        "criterion": nn.CrossEntropyLoss(),
        "trainloader": trainloader,
        "testloader": testloader,
        "best_acc": 0,
        "epoch": 1,
    }


def train(state, epoch):
    net, criterion, trainloader = state["net"], state["criterion"], state["trainloader"]
    net.train()
    train_loss = 0
    correct = 0
    total = 0
    optimizer = optim.SGD(net.parameters(), lr=learning_rate(LR, epoch), momentum=0.9, weight_decay=5e-4)  # @optimizer

    for batch_idx, (inputs, targets) in enumerate(trainloader):
        optimizer.zero_grad()
        outputs = net(inputs)               # Forward Propagation
        loss = criterion(outputs, targets)  # Loss
        loss.backward()  # Backward Propagation  # @backward
        optimizer.step() # Optimizer update  # @step

        train_loss += loss.item()
        _, predicted = torch.max(outputs.data, 1)
        total += targets.size(0)
        correct += predicted.eq(targets.data).cpu().sum()


def test(state, epoch):
    net, criterion, testloader = state["net"], state["criterion"], state["testloader"]
    net.eval()
    test_loss = 0
    correct = 0
    total = 0
    for batch_idx, (inputs, targets) in enumerate(testloader):
        outputs = net(inputs)
        loss = criterion(outputs, targets)

        test_loss += loss.item()
        _, predicted = torch.max(outputs.data, 1)
        total += targets.size(0)
        correct += predicted.eq(targets.data).cpu().sum()

    # Save checkpoint when best model
    acc = 100. * correct / total
    if acc > state["best_acc"]:
        state["best_acc"] = acc


def iteration(state: dict) -> None:
    epoch = state["epoch"]
    train(state, epoch)
    test(state, epoch)
    state["epoch"] = epoch + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    start_epoch = state["epoch"]
    for epoch in range(start_epoch, start_epoch + iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
