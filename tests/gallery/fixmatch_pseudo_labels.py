"""FixMatch: labeled and unlabeled batches through one model, pseudo-labels from the weak view's logits.

Source: kekmodel/FixMatch-pytorch, train.py (commit 037b4461c16747971d2c52faacbcd3afb563ea22): `train()`
concatenates `inputs_x`, `inputs_u_w` and `inputs_u_s`, splits the logits with `logits[batch_size:].chunk(2)`,
`del logits`, `Lx = F.cross_entropy(...)`, then `pseudo_label = torch.softmax(logits_u_w.detach_(), dim=-1)`
as published at that commit (a later commit writes `.detach()`), the mask from `max_probs.ge(args.threshold)`,
`Lu` weighted by the mask, `loss = Lx + args.lambda_u * Lu`, `loss.backward()`, the running averages from
`.item()`, `optimizer.step()`, `scheduler.step()`, `ema_model.update(model)`, `model.zero_grad()`;
get_cosine_schedule_with_warmup and ModelEMA as published, SGD lr 0.03 momentum 0.9 nesterov, `model.zero_grad()`
before the epochs. On torch 2.13 `detach_()` of a `chunk` output raises "Can't detach views in-place" in the first
step. Retyped at CPU size: the WideResNet-28-2 becomes conv 3->4 + BatchNorm ("bn" in its name, as the
WideResNet's are, for ModelEMA's weight decay) + ReLU, average pool, Linear(4, 10); batch_size 2 (published
64), mu 2 (published 7), threshold 0.5 (published 0.95), 8x8 made-up images with made-up weak and strong views
(noise, a flip) in place of the CIFAR-10 loaders, args.iteration 3 and one epoch of three steps per iteration;
`.to(args.device)`, apex amp, the tqdm bar, test() and the checkpoints are left out.
"""

import argparse
import math
import time
from collections.abc import Callable
from copy import deepcopy

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import LambdaLR

ITERATIONS = 2

TRUTH = {
    "error": {"kind": "other", "iteration": 1, "line": "@detach_in_place"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


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


def get_cosine_schedule_with_warmup(
    optimizer, num_warmup_steps, num_training_steps, num_cycles=7.0 / 16.0, last_epoch=-1
):
    def _lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        no_progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, math.cos(math.pi * num_cycles * no_progress))

    return LambdaLR(optimizer, _lr_lambda, last_epoch)


class WideResNet(nn.Module):
    """A CPU-size stand-in for build_wideresnet(depth=28, widen_factor=2)."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.view(-1, 4)
        return self.fc(out)


class ModelEMA(object):
    def __init__(self, args, model, decay, device="", resume=""):
        self.ema = deepcopy(model)
        self.ema.eval()
        self.decay = decay
        self.device = device
        self.wd = args.lr * args.wdecay
        if device:
            self.ema.to(device=device)
        self.ema_has_module = hasattr(self.ema, "module")
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        needs_module = hasattr(model, "module") and not self.ema_has_module
        with torch.no_grad():
            msd = model.state_dict()
            for k, ema_v in self.ema.state_dict().items():
                if needs_module:
                    k = "module." + k
                model_v = msd[k].detach()
                if self.device:
                    model_v = model_v.to(device=self.device)
                ema_v.copy_(ema_v * self.decay + (1.0 - self.decay) * model_v)
                # weight decay
                if "bn" not in k:
                    msd[k] = msd[k] * (1.0 - self.wd)


def make_loaders(args):
    """Stands in for the CIFAR-10 loaders: (inputs_x, targets_x) and ((inputs_u_w, inputs_u_s), _)."""
    labeled, unlabeled = [], []
    for _ in range(args.iteration):
        labeled.append((torch.rand(args.batch_size, 3, 8, 8), torch.randint(0, args.num_classes, (args.batch_size,))))
        img = torch.rand(args.batch_size * args.mu, 3, 8, 8)
        weak = torch.flip(img, dims=[3])
        strong = img + 0.3 * torch.randn_like(img)
        unlabeled.append(((weak, strong), torch.zeros(args.batch_size * args.mu, dtype=torch.long)))
    return labeled, unlabeled


def train(args, labeled_trainloader, unlabeled_trainloader, model, optimizer, ema_model, scheduler, epoch):
    batch_time = AverageMeter()
    data_time = AverageMeter()
    losses = AverageMeter()
    losses_x = AverageMeter()
    losses_u = AverageMeter()
    end = time.time()

    train_loader = zip(labeled_trainloader, unlabeled_trainloader)
    model.train()
    for batch_idx, (data_x, data_u) in enumerate(train_loader):
        inputs_x, targets_x = data_x
        (inputs_u_w, inputs_u_s), _ = data_u
        data_time.update(time.time() - end)
        batch_size = inputs_x.shape[0]
        inputs = torch.cat((inputs_x, inputs_u_w, inputs_u_s))
        logits = model(inputs)
        logits_x = logits[:batch_size]
        logits_u_w, logits_u_s = logits[batch_size:].chunk(2)
        del logits

        Lx = F.cross_entropy(logits_x, targets_x, reduction="mean")

        pseudo_label = torch.softmax(logits_u_w.detach_(), dim=-1)  # @detach_in_place
        max_probs, targets_u = torch.max(pseudo_label, dim=-1)
        mask = max_probs.ge(args.threshold).float()

        Lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()

        loss = Lx + args.lambda_u * Lu

        loss.backward()  # @backward

        losses.update(loss.item())
        losses_x.update(Lx.item())
        losses_u.update(Lu.item())

        optimizer.step()
        scheduler.step()
        if args.use_ema:
            ema_model.update(model)
        model.zero_grad()

        batch_time.update(time.time() - end)
        end = time.time()
        mask_prob = mask.mean().item()
    return losses.avg, losses_x.avg, losses_u.avg, mask_prob


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(
        num_classes=10,
        epochs=1024,
        batch_size=2,
        lr=0.03,
        warmup=0,
        wdecay=5e-4,
        nesterov=True,
        use_ema=True,
        ema_decay=0.999,
        mu=2,
        lambda_u=1,
        threshold=0.5,
        k_img=6,
        world_size=1,
    )
    model = WideResNet(args.num_classes)
    labeled_trainloader, unlabeled_trainloader = make_loaders(argparse.Namespace(**vars(args), iteration=3))
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=args.nesterov)
    args.iteration = args.k_img // args.batch_size // args.world_size
    args.total_steps = args.epochs * args.iteration
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup * args.iteration, args.total_steps)
    ema_model = ModelEMA(args, model, args.ema_decay, "")
    model.zero_grad()
    return {
        "args": args,
        "model": model,
        "labeled_trainloader": labeled_trainloader,
        "unlabeled_trainloader": unlabeled_trainloader,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "ema_model": ema_model,
        "epoch": 0,
    }


def iteration(state: dict) -> None:
    train_loss, train_loss_x, train_loss_u, mask_prob = train(
        state["args"],
        state["labeled_trainloader"],
        state["unlabeled_trainloader"],
        state["model"],
        state["optimizer"],
        state["ema_model"],
        state["scheduler"],
        state["epoch"],
    )
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        train_loss, train_loss_x, train_loss_u, mask_prob = train(
            state["args"],
            state["labeled_trainloader"],
            state["unlabeled_trainloader"],
            state["model"],
            state["optimizer"],
            state["ema_model"],
            state["scheduler"],
            epoch,
        )


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
