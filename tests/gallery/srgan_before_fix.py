"""SRGAN before its fix: the generator's loss reuses `fake_out` from before the discriminator's step.

Source: leftthomas/SRGAN, train.py before the two lines marked "The two lines below are added to
prevent runetime error!" (see srgan.py for the file after them): `fake_img = netG(z)`, netD.zero_grad(),
`d_loss = 1 - real_out + fake_out`, `d_loss.backward(retain_graph=True)`, optimizerD.step(), then
netG.zero_grad(), `g_loss = generator_criterion(fake_out, fake_img, real_img)` on the same fake_out,
g_loss.backward(), the re-run of netG/netD for the logged scores, optimizerG.step(). Retyped at the
same CPU size as srgan.py.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 2

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@g_backward"},
    "retains": {"@d_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self, scale_factor=2):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(1, 4, kernel_size=3, padding=1), nn.PReLU())
        self.upsample = nn.Sequential(nn.Conv2d(4, 4 * scale_factor ** 2, 3, padding=1), nn.PixelShuffle(scale_factor), nn.PReLU())
        self.block_out = nn.Conv2d(4, 1, kernel_size=3, padding=1)

    def forward(self, x):
        return (torch.tanh(self.block_out(self.upsample(self.block1(x)))) + 1) / 2


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, kernel_size=3, padding=1), nn.LeakyReLU(0.2),
            nn.Conv2d(4, 4, kernel_size=3, stride=2, padding=1), nn.BatchNorm2d(4), nn.LeakyReLU(0.2),
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(4, 1, kernel_size=1),
        )

    def forward(self, x):
        batch_size = x.size(0)
        return torch.sigmoid(self.net(x).view(batch_size))


class TVLoss(nn.Module):
    def __init__(self, tv_loss_weight=1):
        super().__init__()
        self.tv_loss_weight = tv_loss_weight

    def forward(self, x):
        batch_size = x.size()[0]
        h_x, w_x = x.size()[2], x.size()[3]
        count_h = x[:, :, 1:, :].numel() // batch_size
        count_w = x[:, :, :, 1:].numel() // batch_size
        h_tv = torch.pow((x[:, :, 1:, :] - x[:, :, :h_x - 1, :]), 2).sum()
        w_tv = torch.pow((x[:, :, :, 1:] - x[:, :, :, :w_x - 1]), 2).sum()
        return self.tv_loss_weight * 2 * (h_tv / count_h + w_tv / count_w) / batch_size


class GeneratorLoss(nn.Module):
    def __init__(self):
        super().__init__()
        loss_network = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())  # stands in for vgg.features[:31]
        for param in loss_network.parameters():
            param.requires_grad = False
        self.loss_network = loss_network
        self.mse_loss = nn.MSELoss()
        self.tv_loss = TVLoss()

    def forward(self, out_labels, out_images, target_images):
        adversarial_loss = torch.mean(1 - out_labels)
        perception_loss = self.mse_loss(self.loss_network(out_images), self.loss_network(target_images))
        image_loss = self.mse_loss(out_images, target_images)
        tv_loss = self.tv_loss(out_images)
        return image_loss + 0.001 * adversarial_loss + 0.006 * perception_loss + 2e-8 * tv_loss


def build() -> dict:
    torch.manual_seed(0)
    netG = Generator(2)
    netD = Discriminator()
    batches = [(torch.rand(2, 1, 4, 4), torch.rand(2, 1, 8, 8)) for _ in range(ITERATIONS + 1)]
    return {"netG": netG, "netD": netD, "generator_criterion": GeneratorLoss(),
            "optimizerG": optim.Adam(netG.parameters()), "optimizerD": optim.Adam(netD.parameters()),
            "batches": batches, "i": 0,
            "running_results": {"batch_sizes": 0, "d_loss": 0, "g_loss": 0, "d_score": 0, "g_score": 0}}


def iteration(state: dict) -> None:
    netG, netD, generator_criterion = state["netG"], state["netD"], state["generator_criterion"]
    optimizerG, optimizerD, running_results = state["optimizerG"], state["optimizerD"], state["running_results"]
    data, target = state["batches"][state["i"] % len(state["batches"])]
    state["i"] += 1
    batch_size = data.size(0)
    running_results["batch_sizes"] += batch_size

    real_img = target
    z = data
    fake_img = netG(z)

    netD.zero_grad()
    real_out = netD(real_img).mean()
    fake_out = netD(fake_img).mean()
    d_loss = 1 - real_out + fake_out
    d_loss.backward(retain_graph=True)  # @d_backward
    optimizerD.step()

    netG.zero_grad()
    g_loss = generator_criterion(fake_out, fake_img, real_img)
    g_loss.backward()  # @g_backward

    fake_img = netG(z)
    fake_out = netD(fake_img).mean()

    optimizerG.step()

    running_results["g_loss"] += g_loss.item() * batch_size
    running_results["d_loss"] += d_loss.item() * batch_size
    running_results["d_score"] += real_out.item() * batch_size
    running_results["g_score"] += fake_out.item() * batch_size


def run(state: dict, iterations: int = ITERATIONS) -> None:
    state["netG"].train()
    state["netD"].train()
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
