"""ESRGAN (BasicSR): the relativistic GAN, whose losses read the other network's outputs through `.detach()`.

Source: XPixelGroup/BasicSR, basicsr/models/esrgan_model.py (commit 91e0cae83962c0e8126f5b3979f63de7a96614ae),
ESRGANModel.optimize_parameters as published after pull request #278 ("Fixbug: inplace modification in BN
backward in ESRGAN distributed training", https://github.com/XPixelGroup/BasicSR/pull/278, for issue #277): net_d's
parameters switched to requires_grad=False, `self.output = self.net_g(self.lq)`, pixel + perceptual + relativistic
GAN loss for G with `real_d_pred = self.net_d(self.gt).detach()` and `fake_g_pred = self.net_d(self.output)`,
l_g_total.backward(), optimizer_g.step(); then net_d's requires_grad back on, the real half
(`fake_d_pred = self.net_d(self.output).detach()`, l_d_real.backward()) and the fake half
(`fake_d_pred = self.net_d(self.output.detach())` against `torch.mean(real_d_pred.detach())`, l_d_fake.backward())
as two backward calls, optimizer_d.step(); the losses kept in loss_dict and reduced to numbers (reduce_loss_dict's
`.mean().item()`). BasicSR's train.py calls feed_data then optimize_parameters(current_iter) from current_iter 1;
net_d_iters=1, net_d_init_iters=0 as in the ESRGAN options. Retyped at CPU size: RRDBNet becomes conv +
PixelShuffle (x2, 1 channel, 4x4 -> 8x8), VGGStyleDiscriminator128 two convs with BatchNorm and a linear head;
the perceptual loss's VGG19 is a frozen random conv stand-in (style weight 0: it returns None for style);
L1 pixel loss and the vanilla GANLoss (BCEWithLogitsLoss, loss_weight 0.005 on G) as configured; Adam(1e-4).
"""

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "model.output", "line": "@output"}],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_first = nn.Conv2d(1, 4, 3, 1, 1)
        self.upconv = nn.Conv2d(4, 4 * 4, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_last = nn.Conv2d(4, 1, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x):
        feat = self.lrelu(self.conv_first(x))
        feat = self.lrelu(self.pixel_shuffle(self.upconv(feat)))
        return self.conv_last(feat)


class VGGStyleDiscriminator(nn.Module):
    def __init__(self, num_in_ch=1, num_feat=4):
        super().__init__()
        self.conv0_0 = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1, bias=True)
        self.conv0_1 = nn.Conv2d(num_feat, num_feat, 4, 2, 1, bias=False)
        self.bn0_1 = nn.BatchNorm2d(num_feat, affine=True)
        self.linear1 = nn.Linear(num_feat * 4 * 4, 8)
        self.linear2 = nn.Linear(8, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x):
        feat = self.lrelu(self.conv0_0(x))
        feat = self.lrelu(self.bn0_1(self.conv0_1(feat)))
        feat = feat.view(feat.size(0), -1)
        feat = self.lrelu(self.linear1(feat))
        return self.linear2(feat)


class PerceptualLoss(nn.Module):
    """Stands in for BasicSR's PerceptualLoss (VGG19 conv5_4, L1): a frozen random conv; style weight 0."""

    def __init__(self, perceptual_weight=1.0):
        super().__init__()
        self.vgg = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        for param in self.vgg.parameters():
            param.requires_grad = False
        self.perceptual_weight = perceptual_weight
        self.criterion = nn.L1Loss()

    def forward(self, x, gt):
        x_features = self.vgg(x)
        gt_features = self.vgg(gt.detach())
        percep_loss = self.criterion(x_features, gt_features) * self.perceptual_weight
        return percep_loss, None


class GANLoss(nn.Module):
    def __init__(self, real_label_val=1.0, fake_label_val=0.0, loss_weight=0.005):
        super().__init__()
        self.loss_weight = loss_weight
        self.real_label_val = real_label_val
        self.fake_label_val = fake_label_val
        self.loss = nn.BCEWithLogitsLoss()

    def get_target_label(self, input, target_is_real):
        target_val = (self.real_label_val if target_is_real else self.fake_label_val)
        return input.new_ones(input.size()) * target_val

    def forward(self, input, target_is_real, is_disc=False):
        target_label = self.get_target_label(input, target_is_real)
        loss = self.loss(input, target_label)
        return loss if is_disc else loss * self.loss_weight


class ESRGANModel:
    """BasicSR's SRGANModel/ESRGANModel, reduced to what optimize_parameters reads."""

    def __init__(self, net_g, net_d):
        self.net_g = net_g
        self.net_d = net_d
        self.cri_pix = nn.L1Loss()
        self.cri_perceptual = PerceptualLoss()
        self.cri_gan = GANLoss()
        self.net_d_iters = 1
        self.net_d_init_iters = 0
        self.optimizer_g = torch.optim.Adam(self.net_g.parameters(), lr=1e-4, betas=(0.9, 0.99))
        self.optimizer_d = torch.optim.Adam(self.net_d.parameters(), lr=1e-4, betas=(0.9, 0.99))

    def feed_data(self, data):
        self.lq = data['lq']
        self.gt = data['gt']

    def reduce_loss_dict(self, loss_dict):
        log_dict = OrderedDict()
        for name, value in loss_dict.items():
            log_dict[name] = value.mean().item()
        return log_dict

    def optimize_parameters(self, current_iter):
        # optimize net_g
        for p in self.net_d.parameters():
            p.requires_grad = False

        self.optimizer_g.zero_grad()
        self.output = self.net_g(self.lq)  # @output

        l_g_total = 0
        loss_dict = OrderedDict()
        if (current_iter % self.net_d_iters == 0 and current_iter > self.net_d_init_iters):
            # pixel loss
            if self.cri_pix:
                l_g_pix = self.cri_pix(self.output, self.gt)
                l_g_total += l_g_pix
                loss_dict['l_g_pix'] = l_g_pix
            # perceptual loss
            if self.cri_perceptual:
                l_g_percep, l_g_style = self.cri_perceptual(self.output, self.gt)
                if l_g_percep is not None:
                    l_g_total += l_g_percep
                    loss_dict['l_g_percep'] = l_g_percep
                if l_g_style is not None:
                    l_g_total += l_g_style
                    loss_dict['l_g_style'] = l_g_style
            # gan loss (relativistic gan)
            real_d_pred = self.net_d(self.gt).detach()
            fake_g_pred = self.net_d(self.output)
            l_g_real = self.cri_gan(real_d_pred - torch.mean(fake_g_pred), False, is_disc=False)
            l_g_fake = self.cri_gan(fake_g_pred - torch.mean(real_d_pred), True, is_disc=False)
            l_g_gan = (l_g_real + l_g_fake) / 2

            l_g_total += l_g_gan
            loss_dict['l_g_gan'] = l_g_gan

            l_g_total.backward()  # @g_backward
            self.optimizer_g.step()

        # optimize net_d
        for p in self.net_d.parameters():
            p.requires_grad = True

        self.optimizer_d.zero_grad()
        # gan loss (relativistic gan)

        # real
        fake_d_pred = self.net_d(self.output).detach()
        real_d_pred = self.net_d(self.gt)
        l_d_real = self.cri_gan(real_d_pred - torch.mean(fake_d_pred), True, is_disc=True) * 0.5
        l_d_real.backward()  # @d_real_backward
        # fake
        fake_d_pred = self.net_d(self.output.detach())
        l_d_fake = self.cri_gan(fake_d_pred - torch.mean(real_d_pred.detach()), False, is_disc=True) * 0.5
        l_d_fake.backward()  # @d_fake_backward
        self.optimizer_d.step()

        loss_dict['l_d_real'] = l_d_real
        loss_dict['l_d_fake'] = l_d_fake
        loss_dict['out_d_real'] = torch.mean(real_d_pred.detach())
        loss_dict['out_d_fake'] = torch.mean(fake_d_pred.detach())

        self.log_dict = self.reduce_loss_dict(loss_dict)


def build() -> dict:
    torch.manual_seed(0)
    net_g, net_d = Generator(), VGGStyleDiscriminator()
    model = ESRGANModel(net_g, net_d)
    net_g.train()
    net_d.train()
    return {
        "model": model,
        "net_g": net_g,
        "net_d": net_d,
        "optimizer_g": model.optimizer_g,
        "optimizer_d": model.optimizer_d,
        "train_loader": [{"lq": torch.rand(2, 1, 4, 4), "gt": torch.rand(2, 1, 8, 8)} for _ in range(ITERATIONS + 1)],
        "current_iter": 0,
    }


def iteration(state: dict) -> None:
    model = state["model"]
    train_data = state["train_loader"][state["current_iter"] % len(state["train_loader"])]
    state["current_iter"] += 1
    current_iter = state["current_iter"]
    model.feed_data(train_data)
    model.optimize_parameters(current_iter)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
