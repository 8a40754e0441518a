"""StyleGAN2's lazy R1 and path-length regularisers, as published before the fix: the penalty's backward walks a
forward whose discriminator the step has already changed.

Source: rosinality/stylegan2-pytorch, train.py (commit 0832b16f19b3029c937972252633e9b717a59293): train() with
`d_loss.backward(retain_graph=d_regularize)`, `d_optim.step()`, then on regularising iterations
`r1_loss = d_r1_loss(real_pred, real_img)` (an `autograd.grad(..., create_graph=True)` through the same
`real_pred`), and the generator's `g_loss.backward(retain_graph=g_regularize)`, `g_optim.step()`, then
`g_path_regularize(fake_img, latents, mean_path_length)` on the same `fake_img`, `mean_path_length` carried from one
iteration to the next. Later commits compute `real_pred` and `fake_img` again for the penalties and drop the
retains. Retyped at CPU size: a tiny generator (a 2-layer style MLP, `n_latent` = 4 styles each scaling a linear
synthesis layer, `return_latents` and style mixing with `random.randint` as in model.py's Generator.forward) and a
tiny conv discriminator in place of model.py's; 8x8 one-channel images, batch 4, latent 8, made-up data from a
`sample_data` generator over a list of batches; `d_reg_every=2`, `g_reg_every=2` (published 16 and 4); single
process (`reduce_loss_dict`, `reduce_sum`, `get_world_size` as distributed.py's one-process branches; the
published `accumulate(g_ema, generator.module)` assumes DistributedDataParallel: `generator` here); tqdm, wandb,
sample images and checkpoints left out. On torch 2.13 iteration 1 stops inside d_r1_loss: Adam's step changed
the discriminator's weights that `real_pred`'s graph saved.
"""

import math
import random
from collections.abc import Callable

import torch
from torch import autograd, nn, optim
from torch.nn import functional as F

ITERATIONS = 2
LATENT = 8
N_LATENT = 4
SIZE = 8
BATCH = 4

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@r1_grad"},
    "retains": {"@d_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.style = nn.Sequential(nn.Linear(LATENT, LATENT), nn.LeakyReLU(0.2), nn.Linear(LATENT, LATENT))
        self.n_latent = N_LATENT
        self.input = nn.Parameter(torch.randn(1, SIZE * SIZE))
        self.convs = nn.ModuleList([nn.Linear(LATENT, SIZE * SIZE) for _ in range(N_LATENT)])

    def forward(self, styles, return_latents=False):
        styles = [self.style(s) for s in styles]
        if len(styles) < 2:
            inject_index = self.n_latent
            latent = styles[0].unsqueeze(1).repeat(1, inject_index, 1)
        else:
            inject_index = random.randint(1, self.n_latent - 1)
            latent = styles[0].unsqueeze(1).repeat(1, inject_index, 1)
            latent2 = styles[1].unsqueeze(1).repeat(1, self.n_latent - inject_index, 1)
            latent = torch.cat([latent, latent2], 1)
        out = self.input.repeat(latent.shape[0], 1)
        for i, conv in enumerate(self.convs):
            out = F.leaky_relu(out * (1 + conv(latent[:, i])), 0.2)
        image = torch.tanh(out).view(-1, 1, SIZE, SIZE)
        if return_latents:
            return image, latent
        return image, None


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.LeakyReLU(0.2),
                                   nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.LeakyReLU(0.2))
        self.final_linear = nn.Linear(8 * (SIZE // 2) ** 2, 1)

    def forward(self, input):
        out = self.convs(input)
        return self.final_linear(out.view(out.shape[0], -1))


class Args:
    iter = ITERATIONS
    batch = BATCH
    size = SIZE
    r1 = 10
    path_regularize = 2
    d_reg_every = 2
    g_reg_every = 2
    mixing = 0.9
    lr = 0.002
    latent = LATENT


def get_rank():
    return 0


def get_world_size():
    return 1


def reduce_sum(tensor):
    return tensor


def reduce_loss_dict(loss_dict):
    return loss_dict


def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag


def accumulate(model1, model2, decay=0.999):
    par1 = dict(model1.named_parameters())
    par2 = dict(model2.named_parameters())

    for k in par1.keys():
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def sample_data(loader):
    while True:
        for batch in loader:
            yield batch


def d_logistic_loss(real_pred, fake_pred):
    real_loss = F.softplus(-real_pred)
    fake_loss = F.softplus(fake_pred)

    return real_loss.mean() + fake_loss.mean()


def d_r1_loss(real_pred, real_img):
    grad_real, = autograd.grad(  # @r1_grad
        outputs=real_pred.sum(), inputs=real_img, create_graph=True
    )
    grad_penalty = (grad_real.view(grad_real.shape[0], -1).norm(2, dim=1) ** 2).mean()

    return grad_penalty


def g_nonsaturating_loss(fake_pred):
    loss = F.softplus(-fake_pred).mean()

    return loss


def g_path_regularize(fake_img, latents, mean_path_length, decay=0.01):
    noise = torch.randn_like(fake_img) / math.sqrt(
        fake_img.shape[2] * fake_img.shape[3]
    )
    grad, = autograd.grad(
        outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True
    )
    path_lengths = torch.sqrt(grad.pow(2).sum(2).mean(1))

    path_mean = mean_path_length + decay * (
        path_lengths.detach().mean() - mean_path_length
    )

    path_penalty = (path_lengths - path_mean).pow(2).mean()

    return path_penalty, path_mean


def make_noise(batch, latent_dim, n_noise, device):
    if n_noise == 1:
        return torch.randn(batch, latent_dim, device=device)

    noises = torch.randn(n_noise, batch, latent_dim, device=device).unbind(0)

    return noises


def build() -> dict:
    torch.manual_seed(0)
    random.seed(0)
    args = Args()
    device = "cpu"
    generator = Generator()
    discriminator = Discriminator()
    g_ema = Generator()
    g_ema.eval()
    accumulate(g_ema, generator, 0)
    g_reg_ratio = args.g_reg_every / (args.g_reg_every + 1)
    d_reg_ratio = args.d_reg_every / (args.d_reg_every + 1)
    g_optim = optim.Adam(generator.parameters(), lr=args.lr * g_reg_ratio, betas=(0 ** g_reg_ratio, 0.99 ** g_reg_ratio))
    d_optim = optim.Adam(discriminator.parameters(), lr=args.lr * d_reg_ratio,
                         betas=(0 ** d_reg_ratio, 0.99 ** d_reg_ratio))
    batches = [torch.rand(BATCH, 1, SIZE, SIZE) * 2 - 1 for _ in range(3)]
    return {
        "args": args, "generator": generator, "discriminator": discriminator, "g_ema": g_ema,
        "g_optim": g_optim, "d_optim": d_optim, "device": device,
        "loader": sample_data(batches),
        "mean_path_length": 0,
        "r1_loss": torch.tensor(0.0, device=device),
        "path_loss": torch.tensor(0.0, device=device),
        "mean_path_length_avg": 0,
        "loss_dict": {},
        "i": 0,
    }


def iteration(state: dict) -> None:
    args, generator, discriminator, g_ema = state["args"], state["generator"], state["discriminator"], state["g_ema"]
    g_optim, d_optim, device, loader, loss_dict = (
        state["g_optim"], state["d_optim"], state["device"], state["loader"], state["loss_dict"])
    i = state["i"]
    state["i"] = i + 1

    real_img = next(loader)
    real_img = real_img.to(device)

    requires_grad(generator, False)
    requires_grad(discriminator, True)

    if args.mixing > 0 and random.random() < args.mixing:
        noises = make_noise(args.batch, args.latent, 4, device)
        noise1 = noises[:2]
        noise2 = noises[2:]

    else:
        noise1, noise2 = make_noise(args.batch, args.latent, 2, device)
        noise1 = [noise1]
        noise2 = [noise2]

    fake_img, _ = generator(noise1)
    fake_pred = discriminator(fake_img)

    d_regularize = i % args.d_reg_every == 0

    if d_regularize:
        real_img.requires_grad = True

    real_pred = discriminator(real_img)
    d_loss = d_logistic_loss(real_pred, fake_pred)

    loss_dict['d'] = d_loss

    discriminator.zero_grad()
    d_loss.backward(retain_graph=d_regularize)  # @d_backward
    d_optim.step()

    if d_regularize:
        r1_loss = d_r1_loss(real_pred, real_img)
        state["r1_loss"] = r1_loss

        discriminator.zero_grad()
        (args.r1 / 2 * r1_loss * args.d_reg_every).backward()
        d_optim.step()

    loss_dict['r1'] = state["r1_loss"]

    requires_grad(generator, True)
    requires_grad(discriminator, False)

    fake_img, latents = generator(noise2, return_latents=True)
    fake_pred = discriminator(fake_img)
    g_loss = g_nonsaturating_loss(fake_pred)

    loss_dict['g'] = g_loss

    g_regularize = i % args.g_reg_every == 0

    generator.zero_grad()
    g_loss.backward(retain_graph=g_regularize)  # @g_backward
    g_optim.step()

    if g_regularize:
        state["path_loss"], state["mean_path_length"] = g_path_regularize(
            fake_img, latents, state["mean_path_length"]
        )

        generator.zero_grad()
        (args.path_regularize * state["path_loss"] * args.g_reg_every).backward()
        g_optim.step()

        state["mean_path_length_avg"] = reduce_sum(state["mean_path_length"]) / get_world_size()

    loss_dict['path'] = state["path_loss"]

    accumulate(g_ema, generator)

    loss_reduced = reduce_loss_dict(loss_dict)

    d_loss_val = loss_reduced['d'].mean().item()
    g_loss_val = loss_reduced['g'].mean().item()
    r1_val = loss_reduced['r1'].mean().item()
    path_loss_val = loss_reduced['path'].mean().item()

    if get_rank() == 0:
        description = (
            f'd: {d_loss_val:.4f}; g: {g_loss_val:.4f}; r1: {r1_val:.4f}; '
            f'path: {path_loss_val:.4f}; mean path: {state["mean_path_length_avg"]:.4f}'
        )
        state["description"] = description


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
