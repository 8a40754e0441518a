"""torchvision's classification reference: AMP with a GradScaler, clip_grad_norm_ and an ExponentialMovingAverage.

Source: pytorch/vision, references/classification/train.py (train_one_epoch, evaluate, main) and
references/classification/utils.py (ExponentialMovingAverage, accuracy), as on main (the index holds commit
bde124ee2f3419fe31ad79c858af40206e8bf792, an older train.py without EMA or the GradScaler; the EMA, AMP and clipping
lines are retyped from the current reference): per batch `with torch.cuda.amp.autocast(enabled=scaler is not None):
output = model(image); loss = criterion(output, target)`, `optimizer.zero_grad()`, then `scaler.scale(loss).backward()`,
`scaler.unscale_(optimizer)` and `nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)` when clipping,
`scaler.step(optimizer)`, `scaler.update()`; `if model_ema and i % args.model_ema_steps == 0:
model_ema.update_parameters(model)` and, during warm-up, `model_ema.n_averaged.fill_(0)`; `utils.accuracy`,
`loss.item()`. main(): `criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)`, SGD with momentum
and weight decay, the EMA's decay from `adjust = args.world_size * args.batch_size * args.model_ema_steps /
args.epochs`, `model_ema = utils.ExponentialMovingAverage(model_without_ddp, device=device, decay=1.0 - alpha)`
(an `AveragedModel` with `ema_avg` and `use_buffers=True`), then per epoch train_one_epoch, `lr_scheduler.step()`,
`evaluate(model, ...)` and `evaluate(model_ema, ..., log_suffix="EMA")` under `torch.inference_mode()`. Retyped at
CPU size: a conv-BN-ReLU-pool-linear net on 3x8x8 images (10 classes) for `torchvision.models.get_model`, lists of 3
made-up training and 1 test batches of 4 for the DataLoaders, `torch.autocast("cpu", dtype=torch.bfloat16)` and
`torch.amp.GradScaler("cpu")` for the CUDA ones (`--amp` on), clip_grad_norm 1.0, model_ema_steps 2, lr_warmup_epochs
1 (so epoch 0 resets n_averaged), label smoothing 0.1, StepLR; MetricLogger, timing, checkpoints and mixup/cutmix
(off by default) left out. One epoch per iteration.
"""

import argparse
from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """Maintains moving averages of model parameters using an exponential decay.
    ``ema_avg = decay * avg_model_param + (1 - decay) * model_param``
    `torch.optim.swa_utils.AveragedModel <https://pytorch.org/docs/stable/optim.html#custom-averaging-strategies>`_
    is used to compute the EMA.
    """

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        if target.ndim == 2:
            target = target.max(dim=1)[1]

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])

        res = []
        for k in topk:
            correct_k = correct[:k].flatten().sum(dtype=torch.float32)
            res.append(correct_k * (100.0 / batch_size))
        return res


class TinyNet(nn.Module):
    """Stands in for torchvision.models.get_model(args.model, weights=args.weights, num_classes=10)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, model_ema=None, scaler=None):
    model.train()
    losses = []

    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)

        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()  # @backward
            if args.clip_grad_norm is not None:
                # we should unscale the gradients of optimizer's assigned params if do gradient clipping
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if args.clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()

        if model_ema and i % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch < args.lr_warmup_epochs:
                # Reset ema buffer to keep copying weights during warmup period
                model_ema.n_averaged.fill_(0)

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.append((loss.item(), acc1.item(), acc5.item(), optimizer.param_groups[0]["lr"]))


def evaluate(model, criterion, data_loader, device, print_freq=100, log_suffix=""):
    model.eval()
    results = []
    with torch.inference_mode():
        for image, target in data_loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)

            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            results.append((loss.item(), acc1.item(), acc5.item()))
    return sum(r[1] for r in results) / len(results)


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(lr=0.1, momentum=0.9, weight_decay=1e-4, label_smoothing=0.1, clip_grad_norm=1.0,
                              model_ema=True, model_ema_steps=2, model_ema_decay=0.99998, lr_warmup_epochs=1,
                              world_size=1, batch_size=4, epochs=4, amp=True, lr_step_size=1, lr_gamma=0.5)
    device = torch.device("cpu")
    data_loader = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(3)]
    data_loader_test = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))]
    model = TinyNet(num_classes=10)
    model.to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cpu") if args.amp else None
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma)
    model_without_ddp = model
    model_ema = None
    if args.model_ema:
        # Decay adjustment that aims to keep the decay independent of other hyper-parameters originally proposed at:
        # https://github.com/facebookresearch/pycls/blob/f8cd9627/pycls/core/net.py#L123
        adjust = args.world_size * args.batch_size * args.model_ema_steps / args.epochs
        alpha = 1.0 - args.model_ema_decay
        alpha = min(1.0, alpha * adjust)
        model_ema = ExponentialMovingAverage(model_without_ddp, device=device, decay=1.0 - alpha)
    return {"model": model, "model_ema": model_ema, "criterion": criterion, "optimizer": optimizer,
            "data_loader": data_loader, "data_loader_test": data_loader_test, "device": device, "args": args,
            "scaler": scaler, "lr_scheduler": lr_scheduler, "epoch": 0}


def epoch_body(state: dict, epoch: int) -> None:
    model, criterion, device, args = state["model"], state["criterion"], state["device"], state["args"]
    train_one_epoch(model, criterion, state["optimizer"], state["data_loader"], device, epoch, args,
                    state["model_ema"], state["scaler"])
    state["lr_scheduler"].step()
    evaluate(model, criterion, state["data_loader_test"], device=device)
    if state["model_ema"]:
        evaluate(state["model_ema"], criterion, state["data_loader_test"], device=device, log_suffix="EMA")


def iteration(state: dict) -> None:
    epoch_body(state, state["epoch"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        epoch_body(state, epoch)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
