"""Barlow Twins: two views through one backbone and projector, the cross-correlation pushed to the identity, LARS.

Source: facebookresearch/barlowtwins, main.py (commit a655214c76c97d0150277b85d16e69328ea52fd9). As published:
BarlowTwins (backbone, projector Linear-BatchNorm1d-ReLU(inplace=True) ... Linear without bias, `self.bn` a
BatchNorm1d without affine; forward: `c = self.bn(z1).T @ self.bn(z2)`, `c.div_(batch_size)`, `on_diag =
torch.diagonal(c).add_(-1).pow_(2).sum()`, `off_diag = off_diagonal(c).pow_(2).sum()`), off_diagonal, LARS (weight
decay and the trust ratio filtered for 1-D parameters, momentum `mu`), the two parameter groups (weights; biases and
norm parameters), adjust_learning_rate (warm-up then cosine, the two groups' rates), and main_worker's step loop:
`adjust_learning_rate(...)`, `optimizer.zero_grad()`, the forward under autocast, `scaler.scale(loss).backward()`,
`scaler.step(optimizer)`, `scaler.update()`, the stats dict from `loss.item()` every print_freq steps. Retyped at CPU
size, one process: resnet50 (torchvision) replaced by a small Conv2d-BatchNorm2d-ReLU-pool backbone with a 16-wide
output, projector '32-32-32' (published 8192-8192-8192), made-up pairs of 3x8x8 views in batches of 8 (published
ImageNet with the Transform pair, batches of 2048), epochs 2 and 3 batches an epoch (so the warm-up's ten epochs are
under way); DistributedDataParallel, SyncBatchNorm and `torch.distributed.all_reduce(c)` (a sum over one process)
dropped, `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()` as `torch.autocast("cpu", enabled=False)` and
`torch.amp.GradScaler("cpu", enabled=False)` (no float16 on the CPU); checkpoints, stats file, SLURM handlers left out.
An iteration is one step of the batch loop.
"""

import math
from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import nn, optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def adjust_learning_rate(args, optimizer, loader, step):
    max_steps = args.epochs * len(loader)
    warmup_steps = 10 * len(loader)
    base_lr = args.batch_size / 256
    if step < warmup_steps:
        lr = base_lr * step / warmup_steps
    else:
        step -= warmup_steps
        max_steps -= warmup_steps
        q = 0.5 * (1 + math.cos(math.pi * step / max_steps))
        end_lr = base_lr * 0.001
        lr = base_lr * q + end_lr * (1 - q)
    optimizer.param_groups[0]['lr'] = lr * args.learning_rate_weights
    optimizer.param_groups[1]['lr'] = lr * args.learning_rate_biases


def off_diagonal(x):
    # return a flattened view of the off-diagonal elements of a square matrix
    n, m = x.shape
    assert n == m
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class BarlowTwins(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())

        # projector
        sizes = [16] + list(map(int, args.projector.split('-')))
        layers = []
        for i in range(len(sizes) - 2):
            layers.append(nn.Linear(sizes[i], sizes[i + 1], bias=False))
            layers.append(nn.BatchNorm1d(sizes[i + 1]))
            layers.append(nn.ReLU(inplace=True))
        layers.append(nn.Linear(sizes[-2], sizes[-1], bias=False))
        self.projector = nn.Sequential(*layers)

        # normalization layer for the representations z1 and z2
        self.bn = nn.BatchNorm1d(sizes[-1], affine=False)

    def forward(self, y1, y2):
        z1 = self.projector(self.backbone(y1))
        z2 = self.projector(self.backbone(y2))

        # empirical cross-correlation matrix
        c = self.bn(z1).T @ self.bn(z2)

        # sum the cross-correlation matrix between all gpus
        c.div_(self.args.batch_size)

        on_diag = torch.diagonal(c).add_(-1).pow_(2).sum()
        off_diag = off_diagonal(c).pow_(2).sum()
        loss = on_diag + self.args.lambd * off_diag
        return loss


class LARS(optim.Optimizer):
    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001,
                 weight_decay_filter=False, lars_adaptation_filter=False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                        eta=eta, weight_decay_filter=weight_decay_filter,
                        lars_adaptation_filter=lars_adaptation_filter)
        super().__init__(params, defaults)

    def exclude_bias_and_norm(self, p):
        return p.ndim == 1

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g['params']:
                dp = p.grad

                if dp is None:
                    continue

                if not g['weight_decay_filter'] or not self.exclude_bias_and_norm(p):
                    dp = dp.add(p, alpha=g['weight_decay'])

                if not g['lars_adaptation_filter'] or not self.exclude_bias_and_norm(p):
                    param_norm = torch.norm(p)
                    update_norm = torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.,
                                    torch.where(update_norm > 0,
                                                (g['eta'] * param_norm / update_norm), one), one)
                    dp = dp.mul(q)

                param_state = self.state[p]
                if 'mu' not in param_state:
                    param_state['mu'] = torch.zeros_like(p)
                mu = param_state['mu']
                mu.mul_(g['momentum']).add_(dp)

                p.add_(mu, alpha=-g['lr'])


def build() -> dict:
    torch.manual_seed(0)
    args = SimpleNamespace(epochs=2, batch_size=8, learning_rate_weights=0.2, learning_rate_biases=0.0048,
                           weight_decay=1e-6, lambd=0.0051, projector='32-32-32', print_freq=2, rank=0)
    model = BarlowTwins(args)
    param_weights = []
    param_biases = []
    for param in model.parameters():
        if param.ndim == 1:
            param_biases.append(param)
        else:
            param_weights.append(param)
    parameters = [{'params': param_weights}, {'params': param_biases}]
    optimizer = LARS(parameters, lr=0, weight_decay=args.weight_decay,
                     weight_decay_filter=True,
                     lars_adaptation_filter=True)
    loader = [((torch.randn(8, 3, 8, 8), torch.randn(8, 3, 8, 8)), torch.zeros(8)) for _ in range(3)]
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return {"args": args, "model": model, "optimizer": optimizer, "loader": loader, "scaler": scaler, "step": 0,
            "stats": []}


def iteration(state: dict) -> None:
    args, model, optimizer, loader, scaler = (
        state["args"], state["model"], state["optimizer"], state["loader"], state["scaler"])
    step = state["step"]
    epoch = step // len(loader)
    (y1, y2), _ = loader[step % len(loader)]
    adjust_learning_rate(args, optimizer, loader, step)
    optimizer.zero_grad()
    with torch.autocast("cpu", enabled=False):
        loss = model.forward(y1, y2)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % args.print_freq == 0:
        if args.rank == 0:
            stats = dict(epoch=epoch, step=step,
                         lr_weights=optimizer.param_groups[0]['lr'],
                         lr_biases=optimizer.param_groups[1]['lr'],
                         loss=loss.item())
            state["stats"].append(stats)
    state["step"] = step + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
