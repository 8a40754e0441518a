"""DINO's train_one_epoch: a student trained against an EMA teacher through DINOLoss's centred, sharpened targets.

Source: facebookresearch/dino, main_dino.py (commit cc72fe982d650ff28e974d0f5a7c974fecb56209): train_one_epoch
as published (per iteration `it = len(data_loader) * epoch + it`, lr and weight decay from their cosine schedules,
the first param group's weight decay only, `teacher_output = teacher(images[:2])`, `student_output =
student(images)`, `loss = dino_loss(student_output, teacher_output, epoch)`, the `math.isfinite(loss.item())` check,
`optimizer.zero_grad()`, `loss.backward()`, `utils.clip_gradients(student, args.clip_grad)`,
`utils.cancel_gradients_last_layer(epoch, student, args.freeze_last_layer)`, `optimizer.step()`, then the teacher's
EMA under `torch.no_grad()`: `param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)`, and the meter updates
from `loss.item()`); DINOLoss as published (the `center` buffer, the teacher temperature warm-up schedule,
`teacher_out.detach().chunk(2)`, `total_loss += loss.mean()` from `total_loss = 0`, `total_loss /= n_loss_terms`,
and `update_center` under `@torch.no_grad()` rebinding `self.center`); utils.py (same commit) as published:
MultiCropWrapper (`torch.unique_consecutive` of the crops' widths, one backbone pass per resolution, the outputs
concatenated, one head pass), clip_gradients, cancel_gradients_last_layer (`p.grad = None` for the `last_layer`
parameters while `epoch < freeze_last_layer`), cosine_scheduler, get_params_groups; DINOHead from
vision_transformer.py (same commit) as published (a 3-layer MLP, L2 normalisation, the `weight_norm`ed
`last_layer` with `weight_g` filled with 1 and frozen by `norm_last_layer=True`). main_dino.py's set-up as
published: the teacher loaded from the student's state_dict, its parameters `requires_grad = False`, AdamW on the
two param groups, the three schedules. Retyped at CPU size: the ViT becomes a conv-GELU-pool backbone whose `fc`
MultiCropWrapper replaces by Identity (embed_dim 8), out_dim 16, hidden_dim 16, bottleneck_dim 8; 2 global crops
of 3x12x12 and 2 local crops of 3x6x6 (published 224 and 96, made up here: no DataAugmentationDINO, no
torchvision), batches of 2, 2 batches per epoch; no DDP (one process: `student.module` is the student,
`dist.all_reduce` and the world size of 1 left out, no SyncBatchNorm), no fp16 scaler (`use_fp16` False, the
published CPU path), `torch.cuda.synchronize()` and `.cuda()` left out; trunc_normal_ from torch.nn.init; lr 0.64 (5e-3 after
the linear scaling rule for batches of 2; published 5e-4), freeze_last_layer 1, warmup_teacher_temp_epochs 1, epochs 4. One epoch per
iteration.
"""

import argparse
import math
import sys
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- utils.py


class MetricLogger:
    def __init__(self, delimiter="\t"):
        self.meters = {}
        self.delimiter = delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            assert isinstance(v, (float, int))
            self.meters.setdefault(k, []).append(v)


def clip_gradients(model, clip):
    norms = []
    for name, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)

    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))

    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def get_params_groups(model):
    regularized = []
    not_regularized = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # we do not regularize biases nor Norm parameters
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{'params': regularized}, {'params': not_regularized, 'weight_decay': 0.}]


class MultiCropWrapper(nn.Module):
    """
    Perform forward pass separately on each resolution input.
    The inputs corresponding to a single resolution are clubbed and single
    forward is run on the same resolution inputs. Hence we do several
    forward passes = number of different resolutions used. We then
    concatenate all the output features and run the head forward on these
    concatenated features.
    """
    def __init__(self, backbone, head):
        super(MultiCropWrapper, self).__init__()
        # disable layers dedicated to ImageNet labels classification
        backbone.fc, backbone.head = nn.Identity(), nn.Identity()
        self.backbone = backbone
        self.head = head

    def forward(self, x):
        # convert to list
        if not isinstance(x, list):
            x = [x]
        idx_crops = torch.cumsum(torch.unique_consecutive(
            torch.tensor([inp.shape[-1] for inp in x]),
            return_counts=True,
        )[1], 0)
        start_idx, output = 0, torch.empty(0).to(x[0].device)
        for end_idx in idx_crops:
            _out = self.backbone(torch.cat(x[start_idx: end_idx]))
            # The output is a tuple with XCiT model. See:
            # https://github.com/facebookresearch/xcit/blob/master/xcit.py#L404-L405
            if isinstance(_out, tuple):
                _out = _out[0]
            # accumulate outputs
            output = torch.cat((output, _out))
            start_idx = end_idx
        # Run the head forward on the concatenated features.
        return self.head(output)


# ---------------------------------------------------------------- vision_transformer.py


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, use_bn=False, norm_last_layer=True, nlayers=3, hidden_dim=2048,
                 bottleneck_dim=256):
        super().__init__()
        nlayers = max(nlayers, 1)
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers = [nn.Linear(in_dim, hidden_dim)]
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
            for _ in range(nlayers - 2):
                layers.append(nn.Linear(hidden_dim, hidden_dim))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.GELU())
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.apply(self._init_weights)
        self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.weight_g.data.fill_(1)
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad = False

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.mlp(x)
        x = nn.functional.normalize(x, dim=-1, p=2)
        x = self.last_layer(x)
        return x


class TinyBackbone(nn.Module):
    """Stands in for vit_small: any resolution in, embed_dim features out (through `fc`, replaced by Identity)."""

    def __init__(self, embed_dim=8):
        super().__init__()
        self.embed_dim = embed_dim
        self.conv = nn.Conv2d(3, embed_dim, 3, padding=1)
        self.act = nn.GELU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(embed_dim, 10)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))


# ---------------------------------------------------------------- main_dino.py


def train_one_epoch(student, teacher, teacher_without_ddp, dino_loss, data_loader,
                    optimizer, lr_schedule, wd_schedule, momentum_schedule, epoch,
                    fp16_scaler, args):
    metric_logger = MetricLogger(delimiter="  ")
    for it, (images, _) in enumerate(data_loader):
        # update weight decay and learning rate according to their schedule
        it = len(data_loader) * epoch + it  # global training iteration
        for i, param_group in enumerate(optimizer.param_groups):
            param_group["lr"] = lr_schedule[it]
            if i == 0:  # only the first group is regularized
                param_group["weight_decay"] = wd_schedule[it]

        # move images to gpu
        images = [im for im in images]
        # teacher and student forward passes + compute dino loss
        teacher_output = teacher(images[:2])  # only the 2 global views pass through the teacher
        student_output = student(images)
        loss = dino_loss(student_output, teacher_output, epoch)

        if not math.isfinite(loss.item()):
            print("Loss is {}, stopping training".format(loss.item()))
            sys.exit(1)

        # student update
        optimizer.zero_grad()
        param_norms = None
        if fp16_scaler is None:
            loss.backward()  # @backward
            if args.clip_grad:
                param_norms = clip_gradients(student, args.clip_grad)
            cancel_gradients_last_layer(epoch, student,
                                        args.freeze_last_layer)
            optimizer.step()
        else:
            fp16_scaler.scale(loss).backward()
            if args.clip_grad:
                fp16_scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
                param_norms = clip_gradients(student, args.clip_grad)
            cancel_gradients_last_layer(epoch, student,
                                        args.freeze_last_layer)
            fp16_scaler.step(optimizer)
            fp16_scaler.update()

        # EMA update for the teacher
        with torch.no_grad():
            m = momentum_schedule[it]  # momentum parameter
            for param_q, param_k in zip(student.parameters(), teacher_without_ddp.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)

        # logging
        metric_logger.update(loss=loss.item())
        metric_logger.update(lr=optimizer.param_groups[0]["lr"])
        metric_logger.update(wd=optimizer.param_groups[0]["weight_decay"])
    return {k: sum(v) / len(v) for k, v in metric_logger.meters.items()}


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp,
                 warmup_teacher_temp_epochs, nepochs, student_temp=0.1,
                 center_momentum=0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        # we apply a warm up for the teacher temperature because
        # a too high temperature makes the training instable at the beginning
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp,
                        teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp
        ))

    def forward(self, student_output, teacher_output, epoch):
        """
        Cross-entropy between softmax outputs of the teacher and student networks.
        """
        student_out = student_output / self.student_temp
        student_out = student_out.chunk(self.ncrops)

        # teacher centering and sharpening
        temp = self.teacher_temp_schedule[epoch]
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1)
        teacher_out = teacher_out.detach().chunk(2)

        total_loss = 0
        n_loss_terms = 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    # we skip cases where student and teacher operate on the same view
                    continue
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        """
        Update center used for teacher output.
        """
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        batch_center = batch_center / (len(teacher_output) * 1)

        # ema update
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def make_crops(batch_size):
    """Two global crops and two local crops of a batch, each a tensor (DataAugmentationDINO's list, collated)."""
    return [torch.randn(batch_size, 3, 12, 12) for _ in range(2)] + [torch.randn(batch_size, 3, 6, 6) for _ in range(2)]


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(out_dim=16, use_bn_in_head=False, norm_last_layer=True, local_crops_number=2,
                              warmup_teacher_temp=0.04, teacher_temp=0.04, warmup_teacher_temp_epochs=1,
                              epochs=4, lr=0.64, min_lr=1e-6, warmup_epochs=0, weight_decay=0.04,
                              weight_decay_end=0.4, momentum_teacher=0.996, clip_grad=3.0, freeze_last_layer=1,
                              batch_size_per_gpu=2)
    data_loader = [(make_crops(args.batch_size_per_gpu), None) for _ in range(2)]
    student = TinyBackbone()
    teacher = TinyBackbone()
    embed_dim = student.embed_dim
    # multi-crop wrapper handles forward with inputs of different resolutions
    student = MultiCropWrapper(student, DINOHead(
        embed_dim,
        args.out_dim,
        use_bn=args.use_bn_in_head,
        norm_last_layer=args.norm_last_layer,
        hidden_dim=16,
        bottleneck_dim=8,
    ))
    teacher = MultiCropWrapper(
        teacher,
        DINOHead(embed_dim, args.out_dim, args.use_bn_in_head, hidden_dim=16, bottleneck_dim=8),
    )
    # teacher_without_ddp and teacher are the same thing
    teacher_without_ddp = teacher
    # teacher and student start with the same weights
    teacher_without_ddp.load_state_dict(student.state_dict())
    # there is no backpropagation through the teacher, so no need for gradients
    for p in teacher.parameters():
        p.requires_grad = False
    dino_loss = DINOLoss(
        args.out_dim,
        args.local_crops_number + 2,  # total number of crops = 2 global crops + local_crops_number
        args.warmup_teacher_temp,
        args.teacher_temp,
        args.warmup_teacher_temp_epochs,
        args.epochs,
    )
    params_groups = get_params_groups(student)
    optimizer = torch.optim.AdamW(params_groups)  # to use with ViTs
    fp16_scaler = None
    lr_schedule = cosine_scheduler(
        args.lr * (args.batch_size_per_gpu * 1) / 256.,  # linear scaling rule
        args.min_lr,
        args.epochs, len(data_loader),
        warmup_epochs=args.warmup_epochs,
    )
    wd_schedule = cosine_scheduler(
        args.weight_decay,
        args.weight_decay_end,
        args.epochs, len(data_loader),
    )
    # momentum parameter is increased to 1. during training with a cosine schedule
    momentum_schedule = cosine_scheduler(args.momentum_teacher, 1,
                                         args.epochs, len(data_loader))
    return {"student": student, "teacher": teacher, "teacher_without_ddp": teacher_without_ddp,
            "dino_loss": dino_loss, "data_loader": data_loader, "optimizer": optimizer,
            "lr_schedule": lr_schedule, "wd_schedule": wd_schedule, "momentum_schedule": momentum_schedule,
            "fp16_scaler": fp16_scaler, "args": args, "epoch": 0}


def epoch_body(state: dict, epoch: int) -> None:
    train_one_epoch(state["student"], state["teacher"], state["teacher_without_ddp"], state["dino_loss"],
                    state["data_loader"], state["optimizer"], state["lr_schedule"], state["wd_schedule"],
                    state["momentum_schedule"], epoch, state["fp16_scaler"], state["args"])


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
