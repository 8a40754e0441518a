"""AdaHessian: an Optimizer subclass whose `step()` runs a Hessian-vector product through `torch.autograd.grad`.

Source: amirgholami/adahessian at commit 935a0476, image_classification/optim_adahessian.py (Adahessian,
get_trace: Hutchinson's estimate of the Hessian diagonal by `torch.autograd.grad(grads, params, grad_outputs=v,
only_inputs=True, retain_graph=True)` on the gradients that `loss.backward(create_graph=True)` left in
`p.grad`; step: `grad.detach_()`, Adam-like moments, `p.data = p.data - ...`), image_classification/main.py
(the epoch's `scheduler.step()` and `model.train()`, then per batch: forward, CrossEntropyLoss,
`loss.backward(create_graph=True)`, `optimizer.step()`, `optimizer.zero_grad()`; AdaHessian's decoupled
weight decay `args.weight_decay / args.lr`) and models/resnet.py (the CIFAR ResNet with BasicBlock).
Retyped at CPU size: ResNet depth 8 with base_channel 4 (published depth 20, 16 channels), a batch of 8 made-up
3x32x32 images with random labels per step, 3 steps of one epoch; the DataLoader, tqdm, `.cuda()`,
DataParallel, cudnn.benchmark, the test pass and the checkpoint are left out, and the distributed branches of
get_trace (never taken with single_gpu=True) are kept as published. The autograd.grad call is joined on one
line so its keywords sit on one marked line.
"""

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim.lr_scheduler as lr_scheduler
from torch.optim.optimizer import Optimizer

ITERATIONS = 3
BATCH_SIZE = 8

TRUTH = {
    "error": None,
    "retains": {"@hvp": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Adahessian(Optimizer):
    """Implements Adahessian algorithm.
    It has been proposed in `ADAHESSIAN: An Adaptive Second Order Optimizer for Machine Learning`.
    """

    def __init__(self, params, lr=0.15, betas=(0.9, 0.999), eps=1e-4,
                 weight_decay=0, hessian_power=1, single_gpu=True):
        if not 0.0 <= lr:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if not 0.0 <= eps:
            raise ValueError("Invalid epsilon value: {}".format(eps))
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(
                "Invalid beta parameter at index 0: {}".format(
                    betas[0]))
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(
                "Invalid beta parameter at index 1: {}".format(
                    betas[1]))
        if not 0.0 <= hessian_power <= 1.0:
            raise ValueError("Invalid Hessian power value: {}".format(hessian_power))
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay, hessian_power=hessian_power)
        self.single_gpu = single_gpu
        super(Adahessian, self).__init__(params, defaults)

    def get_trace(self, params, grads):
        """
        compute the Hessian vector product with a random vector v, at the current gradient point,
        i.e., compute the gradient of <gradsH,v>.
        :param gradsH: a list of torch variables
        :return: a list of torch tensors
        """

        # Check backward was called with create_graph set to True
        for i, grad in enumerate(grads):
            if grad.grad_fn is None:
                raise RuntimeError('Gradient tensor {:} does not have grad_fn. When calling\n'.format(i) +
                           '\t\t\t  loss.backward(), make sure the option create_graph is\n' +
                           '\t\t\t  set to True.')

        v = [2 * torch.randint_like(p, high=2) - 1 for p in params]

        # this is for distributed setting with single node and multi-gpus,
        # for multi nodes setting, we have not support it yet.
        if not self.single_gpu:
            for v1 in v:
                dist.all_reduce(v1)  # noqa: F821  (never reached with single_gpu=True, as published)
        if not self.single_gpu:
            for v_i in v:
                v_i[v_i < 0.] = -1.
                v_i[v_i >= 0.] = 1.

        hvs = torch.autograd.grad(grads, params, grad_outputs=v, only_inputs=True, retain_graph=True)  # @hvp

        hutchinson_trace = []
        for hv in hvs:
            param_size = hv.size()
            if len(param_size) <= 2:  # for 0/1/2D tensor
                # Hessian diagonal block size is 1 here.
                # We use that torch.abs(hv * vi) = hv.abs()
                tmp_output = hv.abs()

            elif len(param_size) == 4:  # Conv kernel
                # Hessian diagonal block size is 9 here: torch.sum() reduces the dim 2/3.
                # We use that torch.abs(hv * vi) = hv.abs()
                tmp_output = torch.mean(hv.abs(), dim=[2, 3], keepdim=True)
            hutchinson_trace.append(tmp_output)

        # this is for distributed setting with single node and multi-gpus,
        # for multi nodes setting, we have not support it yet.
        if not self.single_gpu:
            for output1 in hutchinson_trace:
                dist.all_reduce(output1 / torch.cuda.device_count())  # noqa: F821

        return hutchinson_trace

    def step(self, closure=None):
        """Performs a single optimization step.
        Arguments:
            gradsH: The gradient used to compute Hessian vector product.
            closure (callable, optional): A closure that reevaluates the model
                and returns the loss.
        """
        loss = None
        if closure is not None:
            loss = closure()

        params = []
        groups = []
        grads = []

        # Flatten groups into lists, so that
        #  hut_traces can be called with lists of parameters
        #  and grads
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is not None:
                    params.append(p)
                    groups.append(group)
                    grads.append(p.grad)

        # get the Hessian diagonal

        hut_traces = self.get_trace(params, grads)

        for (p, group, grad, hut_trace) in zip(params, groups, grads, hut_traces):

            state = self.state[p]

            # State initialization
            if len(state) == 0:
                state['step'] = 0
                # Exponential moving average of gradient values
                state['exp_avg'] = torch.zeros_like(p.data)
                # Exponential moving average of Hessian diagonal square values
                state['exp_hessian_diag_sq'] = torch.zeros_like(p.data)

            exp_avg, exp_hessian_diag_sq = state['exp_avg'], state['exp_hessian_diag_sq']

            beta1, beta2 = group['betas']

            state['step'] += 1

            # Decay the first and second moment running average coefficient
            exp_avg.mul_(beta1).add_(grad.detach_(), alpha=1 - beta1)
            exp_hessian_diag_sq.mul_(beta2).addcmul_(hut_trace, hut_trace, value=1 - beta2)

            bias_correction1 = 1 - beta1 ** state['step']
            bias_correction2 = 1 - beta2 ** state['step']

            # make the square root, and the Hessian power
            k = group['hessian_power']
            denom = (
                (exp_hessian_diag_sq.sqrt() ** k) /
                math.sqrt(bias_correction2) ** k).add_(
                group['eps'])

            # make update
            p.data = p.data - \
                group['lr'] * (exp_avg / bias_correction1 / denom + group['weight_decay'] * p.data)

        return loss


# ---------------------------------------------------------------- models/resnet.py

def conv3x3(in_planes, out_planes, stride=1):
    "3x3 convolution with padding"
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride,
                     padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, residual_not, batch_norm_not, stride=1, downsample=None):
        super(BasicBlock, self).__init__()
        self.residual_not = residual_not
        self.batch_norm_not = batch_norm_not
        self.conv1 = conv3x3(inplanes, planes, stride)
        if self.batch_norm_not:
            self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        if self.batch_norm_not:
            self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        if self.batch_norm_not:
            out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        if self.batch_norm_not:
            out = self.bn2(out)

        if self.downsample is not None:
            residual = self.downsample(x)
        if self.residual_not:
            out += residual
        out = self.relu(out)

        return out


class ResNet(nn.Module):

    def __init__(self, depth, residual_not=True, batch_norm_not=True, base_channel=16, num_classes=10):
        super(ResNet, self).__init__()
        # Model type specifies number of layers for CIFAR-10 model
        assert (depth - 2) % 6 == 0, 'depth should be 6n+2'
        n = (depth - 2) // 6

        block = BasicBlock

        self.base_channel = int(base_channel)
        self.residual_not = residual_not
        self.batch_norm_not = batch_norm_not
        self.inplanes = self.base_channel
        self.conv1 = nn.Conv2d(3, self.base_channel, kernel_size=3, padding=1, bias=False)
        if self.batch_norm_not:
            self.bn1 = nn.BatchNorm2d(self.base_channel)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, self.base_channel, n, self.residual_not, self.batch_norm_not)
        self.layer2 = self._make_layer(block, self.base_channel * 2, n, self.residual_not, self.batch_norm_not, stride=2)
        self.layer3 = self._make_layer(block, self.base_channel * 4, n, self.residual_not, self.batch_norm_not, stride=2)
        self.avgpool = nn.AvgPool2d(8)
        self.fc = nn.Linear(self.base_channel * 4 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2. / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()

    def _make_layer(self, block, planes, blocks, residual_not, batch_norm_not, stride=1):
        downsample = None
        if (stride != 1 or self.inplanes != planes * block.expansion) and (residual_not):
            if batch_norm_not:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * block.expansion),
                )
            else:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                )

        layers = nn.ModuleList()
        layers.append(block(self.inplanes, planes, residual_not, batch_norm_not, stride, downsample))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, residual_not, batch_norm_not))

        return layers

    def forward(self, x):
        output_list = []
        x = self.conv1(x)
        if self.batch_norm_not:
            x = self.bn1(x)
        x = self.relu(x)    # 32x32
        output_list.append(x.view(x.size(0), -1))

        for layer in self.layer1:
            x = layer(x)  # 32x32
            output_list.append(x.view(x.size(0), -1))
        for layer in self.layer2:
            x = layer(x)  # 16x16
            output_list.append(x.view(x.size(0), -1))
        for layer in self.layer3:
            x = layer(x)  # 8x8
            output_list.append(x.view(x.size(0), -1))

        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        output_list.append(x.view(x.size(0), -1))

        return x


def resnet(**kwargs):
    return ResNet(**kwargs)


# ---------------------------------------------------------------- image_classification/main.py

def build() -> dict:
    torch.manual_seed(1)
    model = resnet(num_classes=10, depth=8, base_channel=4)
    criterion = nn.CrossEntropyLoss()
    lr, weight_decay = 0.15, 5e-4
    # For AdaHessian, we use the decoupled weight decay as AdamW.
    weight_decay = weight_decay / lr
    optimizer = Adahessian(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = lr_scheduler.MultiStepLR(optimizer, [80, 120], gamma=0.1, last_epoch=-1)
    train_loader = [(torch.randn(BATCH_SIZE, 3, 32, 32), torch.randint(0, 10, (BATCH_SIZE,)))
                    for _ in range(ITERATIONS)]
    # the epoch's first lines
    scheduler.step()
    model.train()
    return {
        "model": model,
        "criterion": criterion,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "train_loader": train_loader,
        "batch_idx": 0,
        "train_loss": 0.,
        "total_num": 0,
        "correct": 0,
    }


def iteration(state: dict) -> None:
    model, criterion, optimizer = state["model"], state["criterion"], state["optimizer"]
    data, target = state["train_loader"][state["batch_idx"] % len(state["train_loader"])]
    state["batch_idx"] += 1

    output = model(data)
    loss = criterion(output, target)
    loss.backward(create_graph=True)  # @backward
    state["train_loss"] += loss.item() * target.size()[0]
    state["total_num"] += target.size()[0]
    _, predicted = output.max(1)
    state["correct"] += predicted.eq(target).sum().item()
    optimizer.step()  # @step
    optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
