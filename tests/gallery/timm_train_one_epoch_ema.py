"""timm's train_one_epoch: gradient accumulation, a native AMP loss scaler, gradient clipping and a ModelEmaV3.

Source: huggingface/pytorch-image-models, train.py, train_one_epoch (commit
2aabaef039d918d453b58714ab84562609981112): `second_order = hasattr(optimizer, 'is_second_order') and
optimizer.is_second_order`, `has_no_sync = hasattr(model, "no_sync")`, `optimizer.zero_grad()` once, then per batch
`last_batch`, `need_update = last_batch or (batch_idx + 1) % accum_steps == 0`, `accum_steps = last_accum_steps` on
the last partial group, `_forward()` (`with amp_autocast(): output = model(input); loss = loss_fn(output, target)`,
`loss /= accum_steps` in place), `_backward(_loss)` through the loss scaler (`create_graph=second_order`,
`need_update=need_update`), `losses_m.update(loss.item() * accum_steps, ...)`, `continue` until `need_update`, then
`num_updates += 1`, `optimizer.zero_grad()`, `model_ema.update(model, step=num_updates)` (the ModelEmaV3 call of
later versions), `lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)`; main()'s epoch loop calls
train_one_epoch and then `lr_scheduler.step(epoch + 1, ...)`. NativeScaler as in timm/utils/cuda.py (its
`need_update` version: `self._scaler.scale(loss).backward(create_graph=create_graph)`, then, when `need_update`,
`unscale_`, `dispatch_clip_grad`, `self._scaler.step(optimizer)`, `self._scaler.update()`); ModelEmaV3 as in
timm/utils/model_ema.py (`deepcopy(model)`, `.eval()`, `@torch.no_grad() update`, `get_decay(step)` and
`apply_update_` with `torch._foreach_lerp_` over the float entries of the two state_dicts). Retyped at CPU size:
a conv-BN-ReLU-pool-linear net on 3x8x8 images (10 classes) for timm's create_model, AdamW (not second order:
`create_graph=False`), grad_accum_steps 2 over a list of 5 made-up batches of 4 (so the last batch is a group of
one), autocast on CPU in bfloat16 and `torch.amp.GradScaler("cpu")` inside NativeScaler (the published scaler is
CUDA's), clip_grad 1.0 in 'norm' mode (dispatch_clip_grad -> clip_grad_norm_), a step-per-update cosine lambda
standing in for create_scheduler_v2; logging, timing, savers and validate() left out. One epoch per iteration.
"""

import argparse
import math
from collections.abc import Callable
from copy import deepcopy
from functools import partial

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


class AverageMeter:
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


def dispatch_clip_grad(parameters, value, mode='norm', norm_type=2.0):
    if mode == 'norm':
        torch.nn.utils.clip_grad_norm_(parameters, value, norm_type=norm_type)
    elif mode == 'value':
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        assert False, f"Unknown clip mode ({mode})."  # noqa: B011 (as published)


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self, device='cpu'):
        self._scaler = torch.amp.GradScaler(device)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode='norm', parameters=None, create_graph=False,
                 need_update=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)  # @backward
        if need_update:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
                dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
            self._scaler.step(optimizer)
            self._scaler.update()


class ModelEmaV3(nn.Module):
    def __init__(self, model, decay=0.9999, min_decay=0.0, update_after_step=0, use_warmup=False,
                 warmup_gamma=1.0, warmup_power=2 / 3, device=None, foreach=True, exclude_buffers=False):
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.decay = decay
        self.min_decay = min_decay
        self.update_after_step = update_after_step
        self.use_warmup = use_warmup
        self.warmup_gamma = warmup_gamma
        self.warmup_power = warmup_power
        self.foreach = foreach
        self.device = device
        self.exclude_buffers = exclude_buffers

    def get_decay(self, step=None):
        if step is None:
            return self.decay
        step = max(0, step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        if self.use_warmup:
            decay = 1 - (1 + step / self.warmup_gamma) ** -self.warmup_power
            decay = max(min(decay, self.decay), self.min_decay)
        else:
            decay = self.decay
        return decay

    @torch.no_grad()
    def update(self, model, step=None):
        decay = self.get_decay(step)
        self.apply_update_(model, decay)

    def apply_update_(self, model, decay):
        if self.foreach:
            ema_lerp_values = []
            model_lerp_values = []
            for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
                if ema_v.is_floating_point():
                    ema_lerp_values.append(ema_v)
                    model_lerp_values.append(model_v)
                else:
                    ema_v.copy_(model_v)
            torch._foreach_lerp_(ema_lerp_values, model_lerp_values, weight=1. - decay)


class TinyNet(nn.Module):
    """Stands in for timm.create_model(args.model, num_classes=10)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv_stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU(inplace=True)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv_stem(x)))
        return self.head(self.global_pool(x).flatten(1))


def model_parameters(model, exclude_head=False):
    if exclude_head:
        return [p for p in model.parameters()][:-2]
    else:
        return model.parameters()


class StepUpdateScheduler:
    """Stands in for timm's CosineLRScheduler with t_in_epochs=False (step_update sets the lr per update)."""

    def __init__(self, optimizer, t_initial, lr_min=1e-5):
        self.optimizer = optimizer
        self.t_initial = t_initial
        self.lr_min = lr_min
        self.base_values = [group['lr'] for group in optimizer.param_groups]

    def step_update(self, num_updates, metric=None):
        for group, base in zip(self.optimizer.param_groups, self.base_values):
            group['lr'] = self.lr_min + 0.5 * (base - self.lr_min) * (1 + math.cos(math.pi * num_updates / self.t_initial))

    def step(self, epoch, metric=None):
        pass


def train_one_epoch(
        epoch,
        model,
        loader,
        optimizer,
        loss_fn,
        args,
        device=torch.device('cpu'),  # noqa: B008 (as published)
        lr_scheduler=None,
        amp_autocast=None,
        loss_scaler=None,
        model_ema=None,
        mixup_fn=None,
):
    second_order = hasattr(optimizer, 'is_second_order') and optimizer.is_second_order
    has_no_sync = hasattr(model, "no_sync")
    losses_m = AverageMeter()

    model.train()

    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    num_updates = epoch * updates_per_epoch
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps

    optimizer.zero_grad()
    update_sample_count = 0
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        update_idx = batch_idx // accum_steps
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps

        if not args.prefetcher:
            input, target = input.to(device), target.to(device)
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)

        def _forward():
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            if accum_steps > 1:
                loss /= accum_steps
            return loss

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(
                    _loss,
                    optimizer,
                    clip_grad=args.clip_grad,
                    clip_mode=args.clip_mode,
                    parameters=model_parameters(model, exclude_head='agc' in args.clip_mode),
                    create_graph=second_order,
                    need_update=need_update,
                )
            else:
                _loss.backward(create_graph=second_order)
                if need_update:
                    if args.clip_grad is not None:
                        dispatch_clip_grad(
                            model_parameters(model, exclude_head='agc' in args.clip_mode),
                            value=args.clip_grad,
                            mode=args.clip_mode,
                        )
                    optimizer.step()

        if has_no_sync and not need_update:
            with model.no_sync():
                loss = _forward()
                _backward(loss)
        else:
            loss = _forward()
            _backward(loss)

        if not args.distributed:
            losses_m.update(loss.item() * accum_steps, input.size(0))
        update_sample_count += input.size(0)

        if not need_update:
            continue

        num_updates += 1
        optimizer.zero_grad()
        if model_ema is not None:
            model_ema.update(model, step=num_updates)

        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)

        update_sample_count = 0

    return {'loss': losses_m.avg}


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(grad_accum_steps=2, clip_grad=1.0, clip_mode='norm', prefetcher=False,
                              distributed=False, model_ema_decay=0.9, lr=1e-2, weight_decay=0.05, epochs=4)
    model = TinyNet()
    model_ema = ModelEmaV3(model, decay=args.model_ema_decay)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    amp_autocast = partial(torch.autocast, device_type='cpu', dtype=torch.bfloat16)
    loss_scaler = NativeScaler(device='cpu')
    loader_train = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(5)]
    updates_per_epoch = (len(loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
    lr_scheduler = StepUpdateScheduler(optimizer, t_initial=args.epochs * updates_per_epoch)
    train_loss_fn = nn.CrossEntropyLoss()
    return {"model": model, "model_ema": model_ema, "optimizer": optimizer, "loader_train": loader_train,
            "train_loss_fn": train_loss_fn, "args": args, "lr_scheduler": lr_scheduler,
            "amp_autocast": amp_autocast, "loss_scaler": loss_scaler, "epoch": 0}


def epoch_body(state: dict, epoch: int) -> None:
    train_one_epoch(
        epoch,
        state["model"],
        state["loader_train"],
        state["optimizer"],
        state["train_loss_fn"],
        state["args"],
        lr_scheduler=state["lr_scheduler"],
        amp_autocast=state["amp_autocast"],
        loss_scaler=state["loss_scaler"],
        model_ema=state["model_ema"],
    )
    state["lr_scheduler"].step(epoch + 1)


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
