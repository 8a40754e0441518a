"""MoCo: a query encoder, a momentum key encoder and a queue of detached keys, InfoNCE over two augmented views.

Source: facebookresearch/moco, colab/moco_cifar10_demo.ipynb (commit f7364915bc4e9161427d7c6bb4f454fa0f171337),
the one-GPU demo: ModelMoCo (encoder_k a copy of encoder_q with requires_grad False, `register_buffer("queue",
torch.randn(dim, K))` normalised, queue_ptr), `_momentum_update_key_encoder` (`param_k.data = param_k.data *
self.m + param_q.data * (1. - self.m)`), `_dequeue_and_enqueue` (`self.queue[:, ptr:ptr + batch_size] =
keys.t()` under no_grad), `_batch_shuffle_single_gpu`, contrastive_loss (q normalised; k computed under
torch.no_grad() from the shuffled key view; `l_pos`, `l_neg` against `self.queue.clone().detach()`, `logits
/= self.T`, CrossEntropyLoss against zeros), forward (momentum update, the asymmetric loss as the demo's
`args.symmetric = False`, enqueue k); train(): adjust_learning_rate (cosine), `loss = net(im_1, im_2)`,
train_optimizer.zero_grad(), loss.backward(), train_optimizer.step(), the running total_loss as a float; SGD
lr 0.06, weight_decay 5e-4, momentum 0.9, moco_m 0.99, moco_t 0.1; the demo's SplitBatchNorm kept. Retyped at
CPU size: torchvision's resnet18 (ModelBase) becomes conv 3->8 + SplitBatchNorm + ReLU, conv 8->8 stride 2
+ SplitBatchNorm + ReLU, average pool, Flatten and Linear(8, dim), with `.cuda()` dropped; dim 8
(published 128), K 16 (published 4096), bn_splits 2 (published 8), a loader of 2 batches of 4 8x8 images:
two made-up "augmented views" (noise and a flip of the same random images) in place of CIFAR10Pair, so the
queue of 16 keys wraps in the second epoch; epochs 200 for the cosine schedule, one epoch per iteration; the
tqdm bar and the kNN monitor are left out.
"""

import argparse
import math
from collections.abc import Callable
from functools import partial

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


# SplitBatchNorm: simulate multi-gpu behavior of BatchNorm in one gpu by splitting alone the batch dimension
# implementation adapted from https://github.com/davidcpage/cifar10-fast/blob/master/torch_backend.py
class SplitBatchNorm(nn.BatchNorm2d):
    def __init__(self, num_features, num_splits, **kw):
        super().__init__(num_features, **kw)
        self.num_splits = num_splits

    def forward(self, input):
        N, C, H, W = input.shape
        if self.training or not self.track_running_stats:
            running_mean_split = self.running_mean.repeat(self.num_splits)
            running_var_split = self.running_var.repeat(self.num_splits)
            outcome = nn.functional.batch_norm(
                input.view(-1, C * self.num_splits, H, W), running_mean_split, running_var_split,
                self.weight.repeat(self.num_splits), self.bias.repeat(self.num_splits),
                True, self.momentum, self.eps).view(N, C, H, W)
            self.running_mean.data.copy_(running_mean_split.view(self.num_splits, C).mean(dim=0))
            self.running_var.data.copy_(running_var_split.view(self.num_splits, C).mean(dim=0))
            return outcome
        else:
            return nn.functional.batch_norm(
                input, self.running_mean, self.running_var,
                self.weight, self.bias, False, self.momentum, self.eps)


class ModelBase(nn.Module):
    """
    A CPU-size stand-in for the demo's CIFAR ResNet recipe (conv, norm, relu, pool, flatten, fc).
    """
    def __init__(self, feature_dim=128, arch=None, bn_splits=16):
        super(ModelBase, self).__init__()

        # use split batchnorm
        norm_layer = partial(SplitBatchNorm, num_splits=bn_splits) if bn_splits > 1 else nn.BatchNorm2d
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, stride=1, padding=1, bias=False), norm_layer(8), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, kernel_size=3, stride=2, padding=1, bias=False), norm_layer(8), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), nn.Linear(8, feature_dim),
        )

    def forward(self, x):
        x = self.net(x)
        # note: not normalized here
        return x


class ModelMoCo(nn.Module):
    def __init__(self, dim=128, K=4096, m=0.99, T=0.1, arch='resnet18', bn_splits=8, symmetric=True):
        super(ModelMoCo, self).__init__()

        self.K = K
        self.m = m
        self.T = T
        self.symmetric = symmetric

        # create the encoders
        self.encoder_q = ModelBase(feature_dim=dim, arch=arch, bn_splits=bn_splits)
        self.encoder_k = ModelBase(feature_dim=dim, arch=arch, bn_splits=bn_splits)

        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)  # initialize
            param_k.requires_grad = False  # not update by gradient

        # create the queue
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)

        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        """
        Momentum update of the key encoder
        """
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1. - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]

        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0  # for simplicity

        # replace the keys at ptr (dequeue and enqueue)
        self.queue[:, ptr:ptr + batch_size] = keys.t()  # transpose
        ptr = (ptr + batch_size) % self.K  # move pointer

        self.queue_ptr[0] = ptr

    @torch.no_grad()
    def _batch_shuffle_single_gpu(self, x):
        """
        Batch shuffle, for making use of BatchNorm.
        """
        # random shuffle index
        idx_shuffle = torch.randperm(x.shape[0])

        # index for restoring
        idx_unshuffle = torch.argsort(idx_shuffle)

        return x[idx_shuffle], idx_unshuffle

    @torch.no_grad()
    def _batch_unshuffle_single_gpu(self, x, idx_unshuffle):
        """
        Undo batch shuffle.
        """
        return x[idx_unshuffle]

    def contrastive_loss(self, im_q, im_k):
        # compute query features
        q = self.encoder_q(im_q)  # queries: NxC
        q = nn.functional.normalize(q, dim=1)  # already normalized

        # compute key features
        with torch.no_grad():  # no gradient to keys
            # shuffle for making use of BN
            im_k_, idx_unshuffle = self._batch_shuffle_single_gpu(im_k)

            k = self.encoder_k(im_k_)  # keys: NxC
            k = nn.functional.normalize(k, dim=1)  # already normalized

            # undo shuffle
            k = self._batch_unshuffle_single_gpu(k, idx_unshuffle)

        # compute logits
        # Einstein sum is more intuitive
        # positive logits: Nx1
        l_pos = torch.einsum('nc,nc->n', [q, k]).unsqueeze(-1)
        # negative logits: NxK
        l_neg = torch.einsum('nc,ck->nk', [q, self.queue.clone().detach()])

        # logits: Nx(1+K)
        logits = torch.cat([l_pos, l_neg], dim=1)

        # apply temperature
        logits /= self.T

        # labels: positive key indicators
        labels = torch.zeros(logits.shape[0], dtype=torch.long)

        loss = nn.CrossEntropyLoss()(logits, labels)

        return loss, q, k

    def forward(self, im1, im2):
        """
        Input:
            im_q: a batch of query images
            im_k: a batch of key images
        Output:
            loss
        """

        # update the key encoder
        with torch.no_grad():  # no gradient to keys
            self._momentum_update_key_encoder()

        # compute loss
        if self.symmetric:  # asymmetric loss
            loss_12, q1, k2 = self.contrastive_loss(im1, im2)
            loss_21, q2, k1 = self.contrastive_loss(im2, im1)
            loss = loss_12 + loss_21
            k = torch.cat([k1, k2], dim=0)
        else:  # asymmetric loss
            loss, q, k = self.contrastive_loss(im1, im2)

        self._dequeue_and_enqueue(k)

        return loss


def parse_args():
    """The demo's argparse arguments as the notebook sets them (`args.cos = True`, `args.schedule = []`,
    `args.symmetric = False`), at CPU size."""
    return argparse.Namespace(arch='resnet18', lr=0.06, epochs=200, schedule=[], cos=True, batch_size=4, wd=5e-4,
                              moco_dim=8, moco_k=16, moco_m=0.99, moco_t=0.1, bn_splits=2, symmetric=False)


# lr scheduler for training
def adjust_learning_rate(optimizer, epoch, args):
    """Decay the learning rate based on schedule"""
    lr = args.lr
    if args.cos:  # cosine lr schedule
        lr *= 0.5 * (1. + math.cos(math.pi * epoch / args.epochs))
    else:  # stepwise lr schedule
        for milestone in args.schedule:
            lr *= 0.1 if epoch >= milestone else 1.
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr


def two_views(batch_size):
    """Stands in for CIFAR10Pair: two random 'augmentations' (noise, a flip) of the same images."""
    img = torch.rand(batch_size, 3, 8, 8)
    im_1 = img + 0.1 * torch.randn_like(img)
    im_2 = torch.flip(img, dims=[3]) + 0.1 * torch.randn_like(img)
    return im_1, im_2


# train for one epoch
def train(net, data_loader, train_optimizer, epoch, args):
    net.train()
    adjust_learning_rate(train_optimizer, epoch, args)

    total_loss, total_num = 0.0, 0
    for im_1, im_2 in data_loader:
        loss = net(im_1, im_2)

        train_optimizer.zero_grad()
        loss.backward()  # @backward
        train_optimizer.step()

        total_num += args.batch_size
        total_loss += loss.item() * args.batch_size

    return total_loss / total_num


def build() -> dict:
    torch.manual_seed(0)
    args = parse_args()
    model = ModelMoCo(
        dim=args.moco_dim,
        K=args.moco_k,
        m=args.moco_m,
        T=args.moco_t,
        arch=args.arch,
        bn_splits=args.bn_splits,
        symmetric=args.symmetric,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, weight_decay=args.wd, momentum=0.9)
    train_loader = [two_views(args.batch_size) for _ in range(2)]
    return {"model": model, "optimizer": optimizer, "train_loader": train_loader, "args": args, "epoch": 1}


def iteration(state: dict) -> None:
    train_loss = train(state["model"], state["train_loader"], state["optimizer"], state["epoch"], state["args"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(1, iterations + 1):
        train_loss = train(state["model"], state["train_loader"], state["optimizer"], epoch, state["args"])


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
