"""SimSiam: two views through one encoder and a predictor, the stop-gradient a `.detach()` of the projections.

Source: facebookresearch/simsiam, simsiam/builder.py and main_simsiam.py (commit
39ac33e618948b88cbe43a65e31f142537073e55), and the questions about where its stop-gradient is
(PatrickHua/SimSiam issue #22, lightly-ai/lightly issue #559, facebookresearch/simsiam issue #27). As published:
SimSiam (the encoder's fc bias `requires_grad = False`, the 3-layer projector with BatchNorm1d and
`ReLU(inplace=True)`, the last BatchNorm1d without affine, the 2-layer predictor; forward returns
`p1, p2, z1.detach(), z2.detach()`), `nn.CosineSimilarity(dim=1)`, SGD with momentum and weight decay over the
`fix_pred_lr` parameter groups, adjust_learning_rate's cosine schedule, and train()'s loop: model on the two
views, `loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5`, `losses.update(loss.item(), ...)`,
zero_grad, backward, step. Retyped at CPU size: one pass of train()'s batch loop is one iteration;
torchvision's resnet50 becomes a conv 3->4 + BatchNorm + ReLU, average pool and an `fc` Linear(4, dim) built
with the same `base_encoder(num_classes=dim, zero_init_residual=True)` call; dim 8, pred_dim 4 (published 2048
and 512); ImageFolder with TwoCropsTransform becomes two made-up noisy views of 4 made-up 8x8 images (published
224x224, batch 512); DistributedDataParallel (the published code raises without it) and `.cuda` dropped;
AverageMeter kept as a plain list, printing and checkpoints left out.
"""

import math
from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class SimSiam(nn.Module):
    """
    Build a SimSiam model.
    """
    def __init__(self, base_encoder, dim=2048, pred_dim=512):
        """
        dim: feature dimension (default: 2048)
        pred_dim: hidden dimension of the predictor (default: 512)
        """
        super(SimSiam, self).__init__()

        # create the encoder
        # num_classes is the output fc dimension, zero-initialize last BNs
        self.encoder = base_encoder(num_classes=dim, zero_init_residual=True)

        # build a 3-layer projector
        prev_dim = self.encoder.fc.weight.shape[1]
        self.encoder.fc.bias.requires_grad = False # not use bias as followed by BN
        self.encoder.fc = nn.Sequential(nn.Linear(prev_dim, prev_dim, bias=False),
                                        nn.BatchNorm1d(prev_dim),
                                        nn.ReLU(inplace=True), # first layer
                                        nn.Linear(prev_dim, prev_dim, bias=False),
                                        nn.BatchNorm1d(prev_dim),
                                        nn.ReLU(inplace=True), # second layer
                                        self.encoder.fc,
                                        nn.BatchNorm1d(dim, affine=False)) # output layer

        # build a 2-layer predictor
        self.predictor = nn.Sequential(nn.Linear(dim, pred_dim, bias=False),
                                        nn.BatchNorm1d(pred_dim),
                                        nn.ReLU(inplace=True), # hidden layer
                                        nn.Linear(pred_dim, dim)) # output layer

    def forward(self, x1, x2):
        # compute features for one view
        z1 = self.encoder(x1) # NxC
        z2 = self.encoder(x2) # NxC

        p1 = self.predictor(z1) # NxC
        p2 = self.predictor(z2) # NxC

        return p1, p2, z1.detach(), z2.detach()


class TinyResNet(nn.Module):
    def __init__(self, num_classes=1000, zero_init_residual=False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class args:
    lr = 0.05 * 4 / 256
    momentum = 0.9
    weight_decay = 1e-4
    fix_pred_lr = True
    epochs = 2


def adjust_learning_rate(optimizer, epoch, args):
    """Decay the learning rate based on schedule"""
    lr = args.lr * 0.5 * (1. + math.cos(math.pi * epoch / args.epochs))
    for param_group in optimizer.param_groups:
        if 'fix_lr' in param_group and param_group['fix_lr']:  # noqa: RUF019 (as published)
            param_group['lr'] = args.lr
        else:
            param_group['lr'] = lr


def build() -> dict:
    torch.manual_seed(0)
    model = SimSiam(TinyResNet, dim=8, pred_dim=4)
    criterion = nn.CosineSimilarity(dim=1)
    if args.fix_pred_lr:
        optim_params = [{'params': model.encoder.parameters(), 'fix_lr': False},
                        {'params': model.predictor.parameters(), 'fix_lr': True}]
    else:
        optim_params = model.parameters()
    optimizer = torch.optim.SGD(optim_params, args.lr,
                                momentum=args.momentum,
                                weight_decay=args.weight_decay)
    adjust_learning_rate(optimizer, 0, args)
    model.train()
    return {"model": model, "criterion": criterion, "optimizer": optimizer, "losses": []}


def iteration(state: dict) -> None:
    model, criterion, optimizer = state["model"], state["criterion"], state["optimizer"]
    base = torch.rand(4, 3, 8, 8)
    images = [base + 0.1 * torch.randn_like(base), torch.flip(base, dims=[3])]

    # compute output and loss
    p1, p2, z1, z2 = model(x1=images[0], x2=images[1])
    loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5

    state["losses"].append(loss.item())

    # compute gradient and do SGD step
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
