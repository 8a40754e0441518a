"""timm's train_one_epoch with `--opt adahessian --grad-accum-steps 2`: second_order, so backward(create_graph=True).

Source: huggingface/pytorch-image-models, train.py, train_one_epoch (commit
2aabaef039d918d453b58714ab84562609981112), as in timm_train_one_epoch_ema.py, here without AMP (`loss_scaler` None,
`amp_autocast` suppress: the `_loss.backward(create_graph=second_order)` branch) and with timm's own Adahessian
(timm/optim/adahessian.py: `is_second_order` True, `p.hess = 0.0` and `self.state[p]["hessian step"] = 0` per
parameter, `zero_hessian`, `@torch.no_grad() set_hessian` with its seeded Rademacher `zs` and
`torch.autograd.grad(grads, params, grad_outputs=zs, retain_graph=i < self.n_samples - 1)`, the AdamW-like
`@torch.no_grad() step` with `p.mul_(1 - lr * weight_decay)`, `exp_hessian_diag_sq.addcmul_(p.hess, p.hess, ...)`
and `p.addcdiv_`), what `create_optimizer_v2(model, opt='adahessian', ...)` builds. So micro-batch 1's backward
leaves `.grad` with its graph (create_graph), micro-batch 2's backward adds to it, and the Hessian-vector product in
`optimizer.step()` walks both micro-batches' graphs: the accumulation is meant. Retyped at CPU size as in
timm_train_one_epoch_ema.py (a conv-BN-ReLU-pool-linear net, 5 made-up batches of 4, grad_accum_steps 2, no clipping
(timm's default), ModelEmaV3); n_samples 1, update_each 1, lr 0.1 (timm's defaults). One epoch per iteration. `retain_graph=i < self.n_samples - 1` is written
`retain = i < self.n_samples - 1` and `retain_graph=retain`: the probes switch a retain by the name after the `=`.
"""

import argparse
import math
from collections.abc import Callable
from contextlib import suppress
from copy import deepcopy

import torch
import torch.nn as nn

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},  # the HVP line's `retain_graph=i < self.n_samples - 1` is False in each of its runs (one sample)
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
        self._scaler.scale(loss).backward(create_graph=create_graph)
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


class Adahessian(torch.optim.Optimizer):
    """
    Implements the AdaHessian algorithm from "ADAHESSIAN: An Adaptive Second OrderOptimizer for Machine Learning"
    """

    def __init__(self, params, lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 hessian_power=1.0, update_each=1, n_samples=1, avg_conv_kernel=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= hessian_power <= 1.0:
            raise ValueError(f"Invalid Hessian power value: {hessian_power}")

        self.n_samples = n_samples
        self.update_each = update_each
        self.avg_conv_kernel = avg_conv_kernel

        # use a separate generator that deterministically generates the same `z`s across all GPUs in case of distributed training
        self.seed = 2147483647
        self.generator = torch.Generator().manual_seed(self.seed)

        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, hessian_power=hessian_power)
        super(Adahessian, self).__init__(params, defaults)

        for p in self.get_params():
            p.hess = 0.0
            self.state[p]["hessian step"] = 0

    @property
    def is_second_order(self):
        return True

    def get_params(self):
        """
        Gets all parameters in all param_groups with gradients
        """

        return (p for group in self.param_groups for p in group['params'] if p.requires_grad)

    def zero_hessian(self):
        """
        Zeros out the accumalated hessian traces.
        """

        for p in self.get_params():
            if not isinstance(p.hess, float) and self.state[p]["hessian step"] % self.update_each == 0:
                p.hess.zero_()

    @torch.no_grad()
    def set_hessian(self):
        """
        Computes the Hutchinson approximation of the hessian trace and accumulates it for each trainable parameter.
        """

        params = []
        for p in filter(lambda p: p.grad is not None, self.get_params()):
            if self.state[p]["hessian step"] % self.update_each == 0:  # compute the trace only each `update_each` step
                params.append(p)
            self.state[p]["hessian step"] += 1

        if len(params) == 0:
            return

        if self.generator.device != params[0].device:  # hackish way of casting the generator to the right device
            self.generator = torch.Generator(params[0].device).manual_seed(self.seed)

        grads = [p.grad for p in params]

        for i in range(self.n_samples):
            # Rademacher distribution {-1.0, 1.0}
            zs = [torch.randint(0, 2, p.size(), generator=self.generator, device=p.device) * 2.0 - 1.0 for p in params]
            retain = i < self.n_samples - 1
            h_zs = torch.autograd.grad(grads, params, grad_outputs=zs, retain_graph=retain)  # @hvp
            for h_z, z, p in zip(h_zs, zs, params):
                p.hess += h_z * z / self.n_samples  # approximate the expected values of z*(H@z)

    @torch.no_grad()
    def step(self, closure=None):
        """
        Performs a single optimization step.
        Arguments:
            closure (callable, optional) -- a closure that reevaluates the model and returns the loss (default: None)
        """

        loss = None
        if closure is not None:
            loss = closure()

        self.zero_hessian()
        self.set_hessian()

        for group in self.param_groups:
            for p in group['params']:
                if p.grad is None or p.hess is None:
                    continue

                if self.avg_conv_kernel and p.dim() == 4:
                    p.hess = torch.abs(p.hess).mean(dim=[2, 3], keepdim=True).expand_as(p.hess).clone()

                # Perform correct stepweight decay as in AdamW
                p.mul_(1 - group['lr'] * group['weight_decay'])

                state = self.state[p]

                # State initialization
                if len(state) == 1:
                    state['step'] = 0
                    # Exponential moving average of gradient values
                    state['exp_avg'] = torch.zeros_like(p)
                    # Exponential moving average of Hessian diagonal square values
                    state['exp_hessian_diag_sq'] = torch.zeros_like(p)

                exp_avg, exp_hessian_diag_sq = state['exp_avg'], state['exp_hessian_diag_sq']
                beta1, beta2 = group['betas']
                state['step'] += 1

                # Decay the first and second moment running average coefficient
                exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                exp_hessian_diag_sq.mul_(beta2).addcmul_(p.hess, p.hess, value=1 - beta2)

                bias_correction1 = 1 - beta1 ** state['step']
                bias_correction2 = 1 - beta2 ** state['step']

                k = group['hessian_power']
                denom = (exp_hessian_diag_sq / bias_correction2).pow_(k / 2).add_(group['eps'])

                # make update
                step_size = group['lr'] / bias_correction1
                p.addcdiv_(exp_avg, denom, value=-step_size)

        return loss


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
                _loss.backward(create_graph=second_order)  # @backward
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
    args = argparse.Namespace(grad_accum_steps=2, clip_grad=None, clip_mode='norm', prefetcher=False,
                              distributed=False, model_ema_decay=0.9, lr=0.1, weight_decay=0.0, epochs=4)
    model = TinyNet()
    model_ema = ModelEmaV3(model, decay=args.model_ema_decay)
    optimizer = Adahessian(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    amp_autocast = suppress  # do nothing
    loss_scaler = None
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
