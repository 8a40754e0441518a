"""SimCLR under autocast + GradScaler, retyped to the CPU, with steps the scaler skips at the start.

Source: sthalles/SimCLR at commit 727cbae1, simclr.py (class SimCLR: `self.optimizer`, info_nce_loss, and
train(): `scaler = GradScaler(enabled=self.args.fp16_precision)`, then per batch
`images = torch.cat(images, dim=0)`, `with autocast(enabled=...)`: features, logits/labels, CrossEntropyLoss;
`self.optimizer.zero_grad()`, `scaler.scale(loss).backward()`, `scaler.step(self.optimizer)`,
`scaler.update()`, and the logging branch every log_every_n_steps with utils.accuracy(topk=(1, 5))), with
run.py's Adam(lr=0.0003, weight_decay=1e-4) and CosineAnnealingLR, and models/resnet_simclr.py's projection
head (the backbone's fc replaced by Linear-ReLU-fc). Retyped to the CPU: `torch.cuda.amp.autocast` becomes
`torch.autocast("cpu", dtype=torch.bfloat16)` and `torch.cuda.amp.GradScaler` becomes
`torch.amp.GradScaler("cpu", ...)`. The published scaler starts at 2**16, which float16 gradients overflow
in the first steps; bfloat16 keeps float32's range, so here the scaler starts at float32's largest value
(init_scale is the one changed argument): the scaled loss overflows to inf at iteration 1, its gradients are
inf/NaN, `scaler.step` skips `optimizer.step()` there and `scaler.update()` halves the scale; iterations 2
and 3 step (checked by running it: the weights stay as they were after iteration 1 only). At CPU size:
a tiny conv backbone (conv 3->8, BatchNorm, ReLU, global average pool) instead of ResNet-18, out_dim 16
(published 128), batch_size 4 with n_views 2 of made-up 3x16x16 views, temperature 0.07, 3 batches of one
epoch, log_every_n_steps 2 (published 100); train()'s batch-loop body is the method train_step (the scaler and
n_iter it keeps across batches live in the state); TensorBoard's SummaryWriter is replaced by a list that keeps
`float(value)` as add_scalar does, and the logging module, save_config_file and the checkpoint are left out.
"""

from collections.abc import Callable
from types import SimpleNamespace

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


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))

        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


class ResNetSimCLR(nn.Module):
    def __init__(self, out_dim):
        super(ResNetSimCLR, self).__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, out_dim),
        )
        dim_mlp = self.backbone[-1].in_features

        # add mlp projection head
        self.backbone[-1] = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.backbone[-1])

    def forward(self, x):
        return self.backbone(x)


class ScalarLog:
    """Stands in for TensorBoard's SummaryWriter: add_scalar keeps the value as a float."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, global_step=None):
        self.scalars.append((tag, float(value), global_step))


class SimCLR(object):

    def __init__(self, *args, **kwargs):
        self.args = kwargs['args']
        self.model = kwargs['model'].to(self.args.device)
        self.optimizer = kwargs['optimizer']
        self.scheduler = kwargs['scheduler']
        self.writer = ScalarLog()
        self.criterion = torch.nn.CrossEntropyLoss().to(self.args.device)

    def info_nce_loss(self, features):

        labels = torch.cat([torch.arange(self.args.batch_size) for i in range(self.args.n_views)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
        labels = labels.to(self.args.device)

        features = F.normalize(features, dim=1)

        similarity_matrix = torch.matmul(features, features.T)

        # discard the main diagonal from both: labels and similarities matrix
        mask = torch.eye(labels.shape[0], dtype=torch.bool).to(self.args.device)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)

        # select and combine multiple positives
        positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)

        # select only the negatives the negatives
        negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)

        logits = torch.cat([positives, negatives], dim=1)
        labels = torch.zeros(logits.shape[0], dtype=torch.long).to(self.args.device)

        logits = logits / self.args.temperature
        return logits, labels

    def train_step(self, images, scaler, n_iter):
        """One pass of train()'s `for images, _ in tqdm(train_loader):` body, as published."""
        images = torch.cat(images, dim=0)

        images = images.to(self.args.device)

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.args.fp16_precision):
            features = self.model(images)
            logits, labels = self.info_nce_loss(features)
            loss = self.criterion(logits, labels)

        self.optimizer.zero_grad()

        scaler.scale(loss).backward()  # @backward

        scaler.step(self.optimizer)  # @scaler_step
        scaler.update()

        if n_iter % self.args.log_every_n_steps == 0:
            top1, top5 = accuracy(logits, labels, topk=(1, 5))
            self.writer.add_scalar('loss', loss, global_step=n_iter)
            self.writer.add_scalar('acc/top1', top1[0], global_step=n_iter)
            self.writer.add_scalar('acc/top5', top5[0], global_step=n_iter)
            self.writer.add_scalar('learning_rate', self.scheduler.get_lr()[0], global_step=n_iter)


def build() -> dict:
    torch.manual_seed(0)
    args = SimpleNamespace(device="cpu", batch_size=4, n_views=2, temperature=0.07, fp16_precision=True,
                           log_every_n_steps=2, lr=0.0003, weight_decay=1e-4, epochs=1)
    model = ResNetSimCLR(out_dim=16)
    train_loader = [([torch.randn(args.batch_size, 3, 16, 16) for _ in range(args.n_views)], None)
                    for _ in range(ITERATIONS)]
    optimizer = torch.optim.Adam(model.parameters(), args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader), eta_min=0,
                                                           last_epoch=-1)
    simclr = SimCLR(model=model, optimizer=optimizer, scheduler=scheduler, args=args)
    # train()'s lines before its loop
    scaler = torch.amp.GradScaler("cpu", init_scale=torch.finfo(torch.float32).max, enabled=args.fp16_precision)  # @scaler
    return {"simclr": simclr, "model": model, "optimizer": optimizer, "scaler": scaler,
            "train_loader": train_loader, "n_iter": 0}


def iteration(state: dict) -> None:
    images, _ = state["train_loader"][state["n_iter"] % len(state["train_loader"])]
    state["simclr"].train_step(images, state["scaler"], state["n_iter"])
    state["n_iter"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
