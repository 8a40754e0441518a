"""WGAN-GP: five critic iterations with a retaining backward, then the generator on the last `fake`.

Source: aladdinpersson/Machine-Learning-Collection, ML/Pytorch/GANs/4. WGAN-GP/train.py (training
loop) and its utils.gradient_penalty (the autograd.grad call with create_graph=True, retain_graph=True),
with model.py's DCGAN critic/generator replaced at CPU size by small fully connected nets on 1x4x4
"images" (critic: Linear-LeakyReLU-LayerNorm-Linear; generator: Linear-BatchNorm-ReLU-Linear-Tanh,
BatchNorm as in the DCGAN generator), batch of 4, random "real" batches instead of MNIST. Structure,
call order, zero_grad/step placement and flags as published (the autograd.grad call is joined on one
line so its flags sit on one marked line).
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 2
CRITIC_ITERATIONS = 5
LAMBDA_GP = 10
Z_DIM = 8
BATCH_SIZE = 4

TRUTH = {
    "error": None,
    "retains": {
        "@gp_grad": {"verdict": "can go", "runs": 10, "needed_runs": 0},
        "@critic_backward": {"verdict": "needed", "runs": 10, "needed_runs": 2},
    },
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Discriminator(nn.Module):
    def __init__(self, channels_img: int, features_d: int) -> None:
        super().__init__()
        self.disc = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels_img * 16, features_d),
            nn.LeakyReLU(0.2),
            nn.LayerNorm(features_d),
            nn.Linear(features_d, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.disc(x)


class Generator(nn.Module):
    def __init__(self, channels_noise: int, channels_img: int, features_g: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels_noise, features_g, bias=False),
            nn.BatchNorm1d(features_g),
            nn.ReLU(),
            nn.Linear(features_g, channels_img * 16),
            nn.Tanh(),
            nn.Unflatten(1, (channels_img, 4, 4)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    BATCH_SIZE, C, H, W = real.shape
    alpha = torch.rand((BATCH_SIZE, 1, 1, 1)).repeat(1, C, H, W).to(device)
    interpolated_images = real * alpha + fake * (1 - alpha)
    mixed_scores = critic(interpolated_images)
    gradient = torch.autograd.grad(inputs=interpolated_images, outputs=mixed_scores, grad_outputs=torch.ones_like(mixed_scores), create_graph=True, retain_graph=True)[0]  # @gp_grad
    gradient = gradient.view(gradient.shape[0], -1)
    gradient_norm = gradient.norm(2, dim=1)
    gradient_penalty = torch.mean((gradient_norm - 1) ** 2)
    return gradient_penalty


def build() -> dict:
    torch.manual_seed(0)
    gen = Generator(Z_DIM, 1, 8)
    critic = Discriminator(1, 8)
    for model in (gen, critic):
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.BatchNorm1d)):
                nn.init.normal_(m.weight.data, 0.0, 0.02)
    return {
        "gen": gen,
        "critic": critic,
        "opt_gen": optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9)),
        "opt_critic": optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9)),
        "batches": [torch.randn(BATCH_SIZE, 1, 4, 4).tanh() for _ in range(ITERATIONS + 4)],
        "batch_idx": 0,
    }


def iteration(state: dict) -> None:
    gen, critic = state["gen"], state["critic"]
    opt_gen, opt_critic = state["opt_gen"], state["opt_critic"]
    real = state["batches"][state["batch_idx"] % len(state["batches"])]
    state["batch_idx"] += 1
    cur_batch_size = real.shape[0]

    for _ in range(CRITIC_ITERATIONS):
        noise = torch.randn(cur_batch_size, Z_DIM, 1, 1)
        fake = gen(noise)
        critic_real = critic(real).reshape(-1)
        critic_fake = critic(fake).reshape(-1)
        gp = gradient_penalty(critic, real, fake)
        loss_critic = -(torch.mean(critic_real) - torch.mean(critic_fake)) + LAMBDA_GP * gp
        critic.zero_grad()
        loss_critic.backward(retain_graph=True)  # @critic_backward
        opt_critic.step()

    gen_fake = critic(fake).reshape(-1)
    loss_gen = -torch.mean(gen_fake)
    gen.zero_grad()
    loss_gen.backward()  # @gen_backward
    opt_gen.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    state["gen"].train()
    state["critic"].train()
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
