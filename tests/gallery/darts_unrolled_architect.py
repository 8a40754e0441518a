"""DARTS: the unrolled (second-order) architecture step, a virtual SGD step on a model clone and a finite-difference
Hessian-vector product, before the weights' own step.

Source: quark0/darts, cnn/architect.py (commit 8876e793763398e3ee62ac1823fa0a3c14e8c2c5, whose step returns the
arch grad norm) and cnn/train_search.py (commit 4bfe43246bf7f32ff7e84044d3d0435074087d06, the variant with a
search_queue and `arch_grad_norm = architect.step(...)`), with cnn/model_search.py and cnn/operations.py: Architect
as published (`_compute_unrolled_model` with `theta = _concat(self.model.parameters()).data`, the momentum buffers
in try/except, `dtheta = _concat(torch.autograd.grad(loss, self.model.parameters())).data + ...`;
`_backward_step_unrolled` with `grads = torch.autograd.grad(loss, model_unrolled.arch_parameters(),
retain_graph=True)` then `dtheta = torch.autograd.grad(loss, model_unrolled.parameters())`; `_hessian_vector_product`
moving the clone's parameters through `.data`; `_construct_model_from_theta` through state_dict/load_state_dict);
train() per batch: `architect.step(...)`, optimizer.zero_grad(), forward, backward, clip_grad_norm, step, the
meters; main()'s epoch loop (`scheduler.step()`, `lr = scheduler.get_lr()[0]`, train). Retyped at CPU size and for
torch 2: `Variable(...)` and `.cuda()` dropped (`v.grad = Variable(g.data)` becomes `v.grad = g.data`), the old
positional `sub(eta, x)`/`add_(R, v)`/`sub_(eta, x)` become `alpha=` keywords, `clip_grad_norm` becomes
`clip_grad_norm_`, `loss.data[0]` becomes `loss.item()`; the search network keeps model_search.py's shape (MixedOp,
Cell, Network with `alphas_normal`/`alphas_reduce` plain tensors requiring grad, `arch_parameters()`, `_loss`, `new`)
at init_channels 2 (published 16), layers 3 (8), steps 2 (4), multiplier 2 (4) and 4 primitives (published 8: none,
max_pool_3x3, skip_connect, sep_conv_3x3 kept); one made-up batch of 2 images 3x8x8 per queue (published CIFAR10 with
batch 64); genotype logging, infer() and utils.save are left out; one epoch is an iteration.
"""

import argparse
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {"@arch_grads": {"verdict": "needed", "runs": 2, "needed_runs": 2}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

# ---------------------------------------------------------------- operations.py (the primitives kept)

OPS = {
    "none": lambda C, stride, affine: Zero(stride),
    "max_pool_3x3": lambda C, stride, affine: nn.MaxPool2d(3, stride=stride, padding=1),
    "skip_connect": lambda C, stride, affine: Identity() if stride == 1 else FactorizedReduce(C, C, affine=affine),
    "sep_conv_3x3": lambda C, stride, affine: SepConv(C, C, 3, stride, 1, affine=affine),
}


class ReLUConvBN(nn.Module):
    def __init__(self, C_in, C_out, kernel_size, stride, padding, affine=True):
        super(ReLUConvBN, self).__init__()
        self.op = nn.Sequential(
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_out, kernel_size, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(C_out, affine=affine),
        )

    def forward(self, x):
        return self.op(x)


class SepConv(nn.Module):
    def __init__(self, C_in, C_out, kernel_size, stride, padding, affine=True):
        super(SepConv, self).__init__()
        self.op = nn.Sequential(
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_in, kernel_size=kernel_size, stride=stride, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_in, kernel_size=1, padding=0, bias=False),
            nn.BatchNorm2d(C_in, affine=affine),
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_in, kernel_size=kernel_size, stride=1, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_out, kernel_size=1, padding=0, bias=False),
            nn.BatchNorm2d(C_out, affine=affine),
        )

    def forward(self, x):
        return self.op(x)


class Identity(nn.Module):
    def __init__(self):
        super(Identity, self).__init__()

    def forward(self, x):
        return x


class Zero(nn.Module):
    def __init__(self, stride):
        super(Zero, self).__init__()
        self.stride = stride

    def forward(self, x):
        if self.stride == 1:
            return x.mul(0.0)
        return x[:, :, :: self.stride, :: self.stride].mul(0.0)


class FactorizedReduce(nn.Module):
    def __init__(self, C_in, C_out, affine=True):
        super(FactorizedReduce, self).__init__()
        assert C_out % 2 == 0
        self.relu = nn.ReLU(inplace=False)
        self.conv_1 = nn.Conv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.conv_2 = nn.Conv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.bn = nn.BatchNorm2d(C_out, affine=affine)

    def forward(self, x):
        x = self.relu(x)
        out = torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], dim=1)
        out = self.bn(out)
        return out


PRIMITIVES = ["none", "max_pool_3x3", "skip_connect", "sep_conv_3x3"]

# ---------------------------------------------------------------- model_search.py


class MixedOp(nn.Module):
    def __init__(self, C, stride):
        super(MixedOp, self).__init__()
        self._ops = nn.ModuleList()
        for primitive in PRIMITIVES:
            op = OPS[primitive](C, stride, False)
            if "pool" in primitive:
                op = nn.Sequential(op, nn.BatchNorm2d(C, affine=False))
            self._ops.append(op)

    def forward(self, x, weights):
        return sum(w * op(x) for w, op in zip(weights, self._ops))


class Cell(nn.Module):
    def __init__(self, steps, multiplier, C_prev_prev, C_prev, C, reduction, reduction_prev):
        super(Cell, self).__init__()
        self.reduction = reduction

        if reduction_prev:
            self.preprocess0 = FactorizedReduce(C_prev_prev, C, affine=False)
        else:
            self.preprocess0 = ReLUConvBN(C_prev_prev, C, 1, 1, 0, affine=False)
        self.preprocess1 = ReLUConvBN(C_prev, C, 1, 1, 0, affine=False)
        self._steps = steps
        self._multiplier = multiplier

        self._ops = nn.ModuleList()
        self._bns = nn.ModuleList()
        for i in range(self._steps):
            for j in range(2 + i):
                stride = 2 if reduction and j < 2 else 1
                op = MixedOp(C, stride)
                self._ops.append(op)

    def forward(self, s0, s1, weights):
        s0 = self.preprocess0(s0)
        s1 = self.preprocess1(s1)

        states = [s0, s1]
        offset = 0
        for i in range(self._steps):
            s = sum(self._ops[offset + j](h, weights[offset + j]) for j, h in enumerate(states))
            offset += len(states)
            states.append(s)

        return torch.cat(states[-self._multiplier :], dim=1)


class Network(nn.Module):
    def __init__(self, C, num_classes, layers, criterion, steps=2, multiplier=2, stem_multiplier=3):
        super(Network, self).__init__()
        self._C = C
        self._num_classes = num_classes
        self._layers = layers
        self._criterion = criterion
        self._steps = steps
        self._multiplier = multiplier

        C_curr = stem_multiplier * C
        self.stem = nn.Sequential(nn.Conv2d(3, C_curr, 3, padding=1, bias=False), nn.BatchNorm2d(C_curr))

        C_prev_prev, C_prev, C_curr = C_curr, C_curr, C
        self.cells = nn.ModuleList()
        reduction_prev = False
        for i in range(layers):
            if i in [layers // 3, 2 * layers // 3]:
                C_curr *= 2
                reduction = True
            else:
                reduction = False
            cell = Cell(steps, multiplier, C_prev_prev, C_prev, C_curr, reduction, reduction_prev)
            reduction_prev = reduction
            self.cells += [cell]
            C_prev_prev, C_prev = C_prev, multiplier * C_curr

        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(C_prev, num_classes)

        self._initialize_alphas()

    def new(self):
        model_new = Network(self._C, self._num_classes, self._layers, self._criterion)
        for x, y in zip(model_new.arch_parameters(), self.arch_parameters()):
            x.data.copy_(y.data)
        return model_new

    def forward(self, input):
        s0 = s1 = self.stem(input)
        for i, cell in enumerate(self.cells):
            if cell.reduction:
                weights = F.softmax(self.alphas_reduce, dim=-1)
            else:
                weights = F.softmax(self.alphas_normal, dim=-1)
            s0, s1 = s1, cell(s0, s1, weights)
        out = self.global_pooling(s1)
        logits = self.classifier(out.view(out.size(0), -1))
        return logits

    def _loss(self, input, target):
        logits = self(input)
        return self._criterion(logits, target)

    def _initialize_alphas(self):
        k = sum(1 for i in range(self._steps) for n in range(2 + i))
        num_ops = len(PRIMITIVES)

        self.alphas_normal = (1e-3 * torch.randn(k, num_ops)).requires_grad_(True)
        self.alphas_reduce = (1e-3 * torch.randn(k, num_ops)).requires_grad_(True)
        self._arch_parameters = [
            self.alphas_normal,
            self.alphas_reduce,
        ]

    def arch_parameters(self):
        return self._arch_parameters


# ---------------------------------------------------------------- architect.py


def _concat(xs):
    return torch.cat([x.view(-1) for x in xs])


class Architect(object):
    def __init__(self, model, args):
        self.network_momentum = args.momentum
        self.network_weight_decay = args.weight_decay
        self.model = model
        self.optimizer = torch.optim.Adam(
            self.model.arch_parameters(),
            lr=args.arch_learning_rate,
            betas=(0.5, 0.999),
            weight_decay=args.arch_weight_decay,
        )

    def _compute_unrolled_model(self, input, target, eta, network_optimizer):
        loss = self.model._loss(input, target)
        theta = _concat(self.model.parameters()).data
        try:
            moment = _concat(network_optimizer.state[v]["momentum_buffer"] for v in self.model.parameters()).mul_(
                self.network_momentum
            )
        except:  # noqa: E722 (as published)
            moment = torch.zeros_like(theta)
        dtheta = _concat(torch.autograd.grad(loss, self.model.parameters())).data + self.network_weight_decay * theta
        model_unrolled = self._construct_model_from_theta(theta.sub(moment + dtheta, alpha=eta))
        return model_unrolled

    def step(self, input_train, target_train, input_valid, target_valid, eta, network_optimizer, unrolled):
        self.optimizer.zero_grad()
        if unrolled:
            self._backward_step_unrolled(input_train, target_train, input_valid, target_valid, eta, network_optimizer)
        else:
            self._backward_step(input_valid, target_valid)

        grad_norm = nn.utils.clip_grad_norm_(self.model.arch_parameters(), 10.0)
        self.optimizer.step()
        return grad_norm

    def _backward_step(self, input_valid, target_valid):
        loss = self.model._loss(input_valid, target_valid)
        for v in self.model.arch_parameters():
            if v.grad is not None:
                v.grad.data.zero_()
        loss.backward()

    def _backward_step_unrolled(self, input_train, target_train, input_valid, target_valid, eta, network_optimizer):
        model_unrolled = self._compute_unrolled_model(input_train, target_train, eta, network_optimizer)
        loss = model_unrolled._loss(input_valid, target_valid)
        grads = torch.autograd.grad(loss, model_unrolled.arch_parameters(), retain_graph=True)  # @arch_grads

        theta = model_unrolled.parameters()
        dtheta = torch.autograd.grad(loss, model_unrolled.parameters())  # @dtheta
        vector = [dt.add(t, alpha=self.network_weight_decay).data for dt, t in zip(dtheta, theta)]
        implicit_grads = self._hessian_vector_product(model_unrolled, vector, input_train, target_train)

        for g, ig in zip(grads, implicit_grads):
            g.data.sub_(ig.data, alpha=eta)

        for v, g in zip(self.model.arch_parameters(), grads):
            if v.grad is None:
                v.grad = g.data
            else:
                v.grad.data.copy_(g.data)

    def _construct_model_from_theta(self, theta):
        model_clone = Network(self.model._C, self.model._num_classes, self.model._layers, self.model._criterion)

        for x, y in zip(model_clone.arch_parameters(), self.model.arch_parameters()):
            x.data.copy_(y.data)
        model_dict = self.model.state_dict()

        params, offset = {}, 0
        for k, v in self.model.named_parameters():
            v_length = np.prod(v.size())
            params[k] = theta[offset : offset + v_length].view(v.size())
            offset += v_length

        assert offset == len(theta)
        model_dict.update(params)
        model_clone.load_state_dict(model_dict)
        return model_clone

    def _hessian_vector_product(self, model, vector, input, target, r=1e-2):
        R = r / _concat(vector).norm()
        for p, v in zip(model.parameters(), vector):
            p.data.add_(v, alpha=R)
        loss = model._loss(input, target)
        grads_p = torch.autograd.grad(loss, model.arch_parameters())

        for p, v in zip(model.parameters(), vector):
            p.data.sub_(v, alpha=2 * R)
        loss = model._loss(input, target)
        grads_n = torch.autograd.grad(loss, model.arch_parameters())

        for p, v in zip(model.parameters(), vector):
            p.data.add_(v, alpha=R)

        return [(x - y).div_(2 * R) for x, y in zip(grads_p, grads_n)]


# ---------------------------------------------------------------- utils.py and train_search.py


class AvgrageMeter(object):
    def __init__(self):
        self.reset()

    def reset(self):
        self.avg = 0
        self.sum = 0
        self.cnt = 0

    def update(self, val, n=1):
        self.sum += val * n
        self.cnt += n
        self.avg = self.sum / self.cnt


def accuracy(output, target, topk=(1,)):
    maxk = max(topk)
    batch_size = target.size(0)

    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))

    res = []
    for k in topk:
        correct_k = correct[:k].reshape(-1).float().sum(0)
        res.append(correct_k.mul_(100.0 / batch_size))
    return res


def train(train_queue, search_queue, model, architect, criterion, optimizer, lr):
    objs = AvgrageMeter()
    top1 = AvgrageMeter()
    top5 = AvgrageMeter()
    grad = AvgrageMeter()

    for step, (input, target) in enumerate(train_queue):
        model.train()
        n = input.size(0)

        # get a random minibatch from the search queue with replacement
        input_search, target_search = next(iter(search_queue))

        arch_grad_norm = architect.step(
            input, target, input_search, target_search, lr, optimizer, unrolled=args.unrolled
        )
        grad.update(arch_grad_norm)

        optimizer.zero_grad()
        logits = model(input)
        loss = criterion(logits, target)

        loss.backward()  # @backward
        nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()

        prec1, prec5 = accuracy(logits, target, topk=(1, 5))
        objs.update(loss.item(), n)
        top1.update(prec1.item(), n)
        top5.update(prec5.item(), n)

    return top1.avg, objs.avg, grad.avg


CIFAR_CLASSES = 10


def build() -> dict:
    global args
    args = argparse.Namespace(
        learning_rate=0.025,
        learning_rate_min=0.001,
        momentum=0.9,
        weight_decay=3e-4,
        init_channels=2,
        layers=3,
        grad_clip=5,
        seed=2,
        epochs=50,
        unrolled=True,
        arch_learning_rate=3e-4,
        arch_weight_decay=1e-3,
    )
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    criterion = nn.CrossEntropyLoss()
    model = Network(args.init_channels, CIFAR_CLASSES, args.layers, criterion)
    optimizer = torch.optim.SGD(
        model.parameters(), args.learning_rate, momentum=args.momentum, weight_decay=args.weight_decay
    )
    train_queue = [(torch.randn(2, 3, 8, 8), torch.randint(0, CIFAR_CLASSES, (2,)))]
    search_queue = [(torch.randn(2, 3, 8, 8), torch.randint(0, CIFAR_CLASSES, (2,)))]
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, float(args.epochs), eta_min=args.learning_rate_min
    )
    architect = Architect(model, args)
    return {
        "model": model,
        "architect": architect,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "criterion": criterion,
        "train_queue": train_queue,
        "search_queue": search_queue,
    }


def iteration(state: dict) -> None:
    scheduler, model = state["scheduler"], state["model"]
    scheduler.step()
    lr = scheduler.get_lr()[0]
    # training
    train_acc, train_obj, arch_grad_norm = train(
        state["train_queue"],
        state["search_queue"],
        model,
        state["architect"],
        state["criterion"],
        state["optimizer"],
        lr,
    )


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
