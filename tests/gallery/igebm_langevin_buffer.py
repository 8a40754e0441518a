"""IGEBM (Du & Mordatch's implicit-generation EBM) in PyTorch: Langevin steps by backward() on the input, a replay buffer.

Source: rosinality/igebm-pytorch, train.py (commit 3c4f104af8781f232fd994759c60b7c19f13eba7) and model.py (commit
c9b5c8df946b9c762a4d6e356cf3d60ba17e1b61), a PyTorch port of openai/ebm_code_release. As published: the
hand-written SpectralNorm forward pre-hook (`weight_orig` a parameter; `weight` and `weight_u` buffers that every
forward overwrites with `weight / sigma`, a tensor with a graph, and the power-iterated `u`), `spectral_norm`,
ResBlock with class-conditional scale and shift from an Embedding, IGEBM; SampleBuffer (a list of detached
samples), `sample_buffer` (95% replayed), `requires_grad`, `clip_grad` (Adam's second moment bounds the gradient in
place), and train()'s loop body: `neg_img.requires_grad = True`, `requires_grad(parameters, False)`,
`model.eval()`, `sample_step` Langevin steps (`noise.normal_`, `neg_img.data.add_(noise.data)`,
`neg_out.sum().backward()`, the clamped gradient step on `neg_img.data`, `neg_img.grad.detach_()`,
`neg_img.grad.zero_()`), `neg_img = neg_img.detach()`, `requires_grad(parameters, True)`, `model.train()`,
`model.zero_grad()`, the contrastive loss with its `alpha` square penalty, `loss.backward()`, `clip_grad`,
`optimizer.step()`, `buffer.push`. As published `parameters = model.parameters()` is a generator that the Adam
constructor uses up, so `requires_grad(parameters, ...)` sets nothing and the Langevin backward calls also
accumulate into the weights' .grad, which `model.zero_grad()` then clears: kept.
Retyped at CPU size: conv1 3->8 and two ResBlocks (8->8 downsampling, 8->16; published six, 128 to 256 channels),
3x8x8 images (published 3x32x32), batch 4, 3 Langevin steps (published 60), made-up images and class ids in
place of CIFAR-10; `device='cuda'` defaults made 'cpu'; tqdm and the sample image saving left out.
"""

import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

SIZE = 8


class SpectralNorm:
    def __init__(self, name, bound=False):
        self.name = name
        self.bound = bound

    def compute_weight(self, module):
        weight = getattr(module, self.name + '_orig')
        u = getattr(module, self.name + '_u')
        size = weight.size()
        weight_mat = weight.contiguous().view(size[0], -1)

        with torch.no_grad():
            v = weight_mat.t() @ u
            v = v / v.norm()
            u = weight_mat @ v
            u = u / u.norm()

        sigma = u @ weight_mat @ v

        if self.bound:
            weight_sn = weight / (sigma + 1e-6) * torch.clamp(sigma, max=1)

        else:
            weight_sn = weight / sigma

        return weight_sn, u

    @staticmethod
    def apply(module, name, bound):
        fn = SpectralNorm(name, bound)

        weight = getattr(module, name)
        del module._parameters[name]
        module.register_parameter(name + '_orig', weight)
        input_size = weight.size(0)
        u = weight.new_empty(input_size).normal_()
        module.register_buffer(name, weight)
        module.register_buffer(name + '_u', u)

        module.register_forward_pre_hook(fn)

        return fn

    def __call__(self, module, input):
        weight_sn, u = self.compute_weight(module)
        setattr(module, self.name, weight_sn)  # @weight_sn
        setattr(module, self.name + '_u', u)


def spectral_norm(module, init=True, std=1, bound=False):
    if init:
        nn.init.normal_(module.weight, 0, std)

    if hasattr(module, 'bias') and module.bias is not None:
        module.bias.data.zero_()

    SpectralNorm.apply(module, 'weight', bound=bound)

    return module


class ResBlock(nn.Module):
    def __init__(self, in_channel, out_channel, n_class=None, downsample=False):
        super().__init__()

        self.conv1 = spectral_norm(
            nn.Conv2d(
                in_channel,
                out_channel,
                3,
                padding=1,
                bias=False if n_class is not None else True,
            )
        )

        self.conv2 = spectral_norm(
            nn.Conv2d(
                out_channel,
                out_channel,
                3,
                padding=1,
                bias=False if n_class is not None else True,
            ), std=1e-10, bound=True
        )

        self.class_embed = None

        if n_class is not None:
            class_embed = nn.Embedding(n_class, out_channel * 2 * 2)
            class_embed.weight.data[:, : out_channel * 2] = 1
            class_embed.weight.data[:, out_channel * 2 :] = 0

            self.class_embed = class_embed

        self.skip = None

        if in_channel != out_channel or downsample:
            self.skip = nn.Sequential(
                spectral_norm(nn.Conv2d(in_channel, out_channel, 1, bias=False))
            )

        self.downsample = downsample

    def forward(self, input, class_id=None):
        out = input

        out = self.conv1(out)

        if self.class_embed is not None:
            embed = self.class_embed(class_id).view(input.shape[0], -1, 1, 1)
            weight1, weight2, bias1, bias2 = embed.chunk(4, 1)
            out = weight1 * out + bias1

        out = F.leaky_relu(out, negative_slope=0.2)

        out = self.conv2(out)

        if self.class_embed is not None:
            out = weight2 * out + bias2

        if self.skip is not None:
            skip = self.skip(input)

        else:
            skip = input

        out = out + skip

        if self.downsample:
            out = F.avg_pool2d(out, 2)

        out = F.leaky_relu(out, negative_slope=0.2)

        return out


class IGEBM(nn.Module):
    def __init__(self, n_class=None):
        super().__init__()

        self.conv1 = spectral_norm(nn.Conv2d(3, 8, 3, padding=1), std=1)

        self.blocks = nn.ModuleList(
            [
                ResBlock(8, 8, n_class, downsample=True),
                ResBlock(8, 16, n_class),
            ]
        )

        self.linear = nn.Linear(16, 1)

    def forward(self, input, class_id=None):
        out = self.conv1(input)

        out = F.leaky_relu(out, negative_slope=0.2)

        for block in self.blocks:
            out = block(out, class_id)

        out = F.relu(out)
        out = out.view(out.shape[0], out.shape[1], -1).sum(2)
        out = self.linear(out)

        return out


class SampleBuffer:
    def __init__(self, max_samples=10000):
        self.max_samples = max_samples
        self.buffer = []

    def __len__(self):
        return len(self.buffer)

    def push(self, samples, class_ids=None):
        samples = samples.detach().to('cpu')
        class_ids = class_ids.detach().to('cpu')

        for sample, class_id in zip(samples, class_ids):
            self.buffer.append((sample.detach(), class_id))

            if len(self.buffer) > self.max_samples:
                self.buffer.pop(0)

    def get(self, n_samples, device='cpu'):
        items = random.choices(self.buffer, k=n_samples)
        samples, class_ids = zip(*items)
        samples = torch.stack(samples, 0)
        class_ids = torch.tensor(class_ids)
        samples = samples.to(device)
        class_ids = class_ids.to(device)

        return samples, class_ids


def sample_buffer(buffer, batch_size=128, p=0.95, device='cpu'):
    if len(buffer) < 1:
        return (
            torch.rand(batch_size, 3, SIZE, SIZE, device=device),
            torch.randint(0, 10, (batch_size,), device=device),
        )

    n_replay = (np.random.rand(batch_size) < p).sum()

    replay_sample, replay_id = buffer.get(n_replay)
    random_sample = torch.rand(batch_size - n_replay, 3, SIZE, SIZE, device=device)
    random_id = torch.randint(0, 10, (batch_size - n_replay,), device=device)

    return (
        torch.cat([replay_sample, random_sample], 0),
        torch.cat([replay_id, random_id], 0),
    )


def requires_grad(parameters, flag=True):
    for p in parameters:
        p.requires_grad = flag


def clip_grad(parameters, optimizer):
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group['params']:
                state = optimizer.state[p]

                if 'step' not in state or state['step'] < 1:
                    continue

                step = state['step']
                exp_avg_sq = state['exp_avg_sq']
                _, beta2 = group['betas']

                bound = 3 * torch.sqrt(exp_avg_sq / (1 - beta2 ** step)) + 0.1
                p.grad.data.copy_(torch.max(torch.min(p.grad.data, bound), -bound))


def build() -> dict:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    device = 'cpu'
    model = IGEBM(10).to(device)
    batches = [(torch.rand(4, 3, SIZE, SIZE), torch.randint(0, 10, (4,))) for _ in range(6)]
    buffer = SampleBuffer()

    noise = torch.randn(4, 3, SIZE, SIZE, device=device)

    parameters = model.parameters()
    optimizer = optim.Adam(parameters, lr=1e-4, betas=(0.0, 0.999))
    return {"model": model, "batches": batches, "buffer": buffer, "noise": noise, "parameters": parameters,
            "optimizer": optimizer, "i": 0, "alpha": 1, "step_size": 10, "sample_step": 3, "device": device}


def iteration(state: dict) -> None:
    model, buffer, noise, parameters, optimizer = (
        state["model"], state["buffer"], state["noise"], state["parameters"], state["optimizer"])
    alpha, step_size, sample_step, device = state["alpha"], state["step_size"], state["sample_step"], state["device"]
    pos_img, pos_id = state["batches"][state["i"] % len(state["batches"])]
    pos_img, pos_id = pos_img.to(device), pos_id.to(device)

    neg_img, neg_id = sample_buffer(buffer, pos_img.shape[0])
    neg_img.requires_grad = True

    requires_grad(parameters, False)
    model.eval()

    for k in range(sample_step):
        if noise.shape[0] != neg_img.shape[0]:
            noise = torch.randn(neg_img.shape[0], 3, SIZE, SIZE, device=device)

        noise.normal_(0, 0.005)
        neg_img.data.add_(noise.data)

        neg_out = model(neg_img, neg_id)
        neg_out.sum().backward()  # @langevin_backward
        neg_img.grad.data.clamp_(-0.01, 0.01)

        neg_img.data.add_(-step_size, neg_img.grad.data)

        neg_img.grad.detach_()
        neg_img.grad.zero_()

        neg_img.data.clamp_(0, 1)

    neg_img = neg_img.detach()

    requires_grad(parameters, True)
    model.train()

    model.zero_grad()

    pos_out = model(pos_img, pos_id)
    neg_out = model(neg_img, neg_id)

    loss = alpha * (pos_out ** 2 + neg_out ** 2)
    loss = loss + (pos_out - neg_out)
    loss = loss.mean()
    loss.backward()  # @loss_backward

    clip_grad(parameters, optimizer)

    optimizer.step()

    buffer.push(neg_img, neg_id)
    state["noise"] = noise
    state["i"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
