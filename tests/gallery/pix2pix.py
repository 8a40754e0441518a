"""pix2pix: a U-Net generator and a conditional PatchGAN discriminator, the discriminator's step first, then the
generator's GAN + L1 step, the model keeping its images and losses as attributes.

Source: junyanz/pytorch-CycleGAN-and-pix2pix, models/pix2pix_model.py (commit
032e88438b1b2690e538c2cf399ebceb76adbea9): `Pix2PixModel.set_input`, `forward` (`self.fake_B =
self.netG(self.real_A)`), `backward_D` (the fake pair `torch.cat((self.real_A, self.fake_B), 1)` through
`self.fake_AB_pool.query` and `self.netD(fake_AB.detach())`, the real pair, `self.loss_D = (self.loss_D_fake +
self.loss_D_real) * 0.5`, `self.loss_D.backward()`), `backward_G` (`self.loss_G_GAN + self.loss_G_L1`,
`lambda_L1` 100) and `optimize_parameters` (forward; `set_requires_grad(self.netD, True)`,
`optimizer_D.zero_grad()`, `backward_D()`, `optimizer_D.step()`; `set_requires_grad(self.netD, False)`,
`optimizer_G.zero_grad()`, `backward_G()`, `optimizer_G.step()`); `BaseModel.set_requires_grad`,
`networks.GANLoss` ("vanilla": BCEWithLogitsLoss against `real_label`/`fake_label` buffers expanded to the
prediction) and `util/image_pool.ImagePool` (pix2pix's `pool_size=0` returns the images) from the same
repository; train.py's `model.set_input(data)`, `model.optimize_parameters()` per batch. Retyped at CPU size: the
`unet_256` generator's eight `UnetSkipConnectionBlock`s become two, the
innermost and the outermost (ngf 4, images 8x8), with the middle blocks' dropout gone with them, the 70x70 `basic`
PatchGAN becomes conv 6->4 stride 2, LeakyReLU, conv 4->8 + BatchNorm + LeakyReLU, conv 8->1; images 3x8x8,
batches of 2, made-up aligned A/B pairs; `opt` is an argparse Namespace; Adam lr 2e-4, beta1 0.5 as published;
`.to(self.device)`, `image_paths`, the visualizer and the init functions are left out.
"""

import argparse
import random
from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [
        {"variable": "model.fake_B", "line": "@fake_B"},
        {"variable": "model.loss_D_fake", "line": "@loss_D_fake"},
        {"variable": "model.loss_D_real", "line": "@loss_D_real"},
        {"variable": "model.loss_D", "line": "@loss_D"},
        {"variable": "model.loss_G_GAN", "line": "@loss_G_GAN"},
        {"variable": "model.loss_G_L1", "line": "@loss_G_L1"},
        {"variable": "model.loss_G", "line": "@loss_G"},
    ],
    "modifies_in_place": [],
}


class GANLoss(nn.Module):
    def __init__(self, gan_mode, target_real_label=1.0, target_fake_label=0.0):
        super(GANLoss, self).__init__()
        self.register_buffer("real_label", torch.tensor(target_real_label))
        self.register_buffer("fake_label", torch.tensor(target_fake_label))
        self.gan_mode = gan_mode
        if gan_mode == "lsgan":
            self.loss = nn.MSELoss()
        elif gan_mode == "vanilla":
            self.loss = nn.BCEWithLogitsLoss()
        else:
            raise NotImplementedError("gan mode %s not implemented" % gan_mode)

    def get_target_tensor(self, prediction, target_is_real):
        if target_is_real:
            target_tensor = self.real_label
        else:
            target_tensor = self.fake_label
        return target_tensor.expand_as(prediction)

    def __call__(self, prediction, target_is_real):
        target_tensor = self.get_target_tensor(prediction, target_is_real)
        loss = self.loss(prediction, target_tensor)
        return loss


class ImagePool:
    def __init__(self, pool_size):
        self.pool_size = pool_size
        if self.pool_size > 0:
            self.num_imgs = 0
            self.images = []

    def query(self, images):
        if self.pool_size == 0:  # if the buffer size is 0, do nothing
            return images
        return_images = []
        for image in images:
            image = torch.unsqueeze(image.data, 0)
            if self.num_imgs < self.pool_size:
                self.num_imgs = self.num_imgs + 1
                self.images.append(image)
                return_images.append(image)
            else:
                p = random.uniform(0, 1)
                if p > 0.5:
                    random_id = random.randint(0, self.pool_size - 1)
                    tmp = self.images[random_id].clone()
                    self.images[random_id] = image
                    return_images.append(tmp)
                else:
                    return_images.append(image)
        return_images = torch.cat(return_images, 0)
        return return_images


class UnetSkipConnectionBlock(nn.Module):
    def __init__(
        self,
        outer_nc,
        inner_nc,
        input_nc=None,
        submodule=None,
        outermost=False,
        innermost=False,
        norm_layer=nn.BatchNorm2d,
    ):
        super(UnetSkipConnectionBlock, self).__init__()
        self.outermost = outermost
        use_bias = False
        if input_nc is None:
            input_nc = outer_nc
        downconv = nn.Conv2d(input_nc, inner_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
        downrelu = nn.LeakyReLU(0.2, True)
        uprelu = nn.ReLU(True)
        upnorm = norm_layer(outer_nc)
        if outermost:
            upconv = nn.ConvTranspose2d(inner_nc * 2, outer_nc, kernel_size=4, stride=2, padding=1)
            down = [downconv]
            up = [uprelu, upconv, nn.Tanh()]
            model = down + [submodule] + up
        elif innermost:
            upconv = nn.ConvTranspose2d(inner_nc, outer_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
            down = [downrelu, downconv]
            up = [uprelu, upconv, upnorm]
            model = down + up
        self.model = nn.Sequential(*model)

    def forward(self, x):
        if self.outermost:
            return self.model(x)
        else:  # add skip connections
            return torch.cat([x, self.model(x)], 1)


class UnetGenerator(nn.Module):
    def __init__(self, input_nc, output_nc, ngf=4, norm_layer=nn.BatchNorm2d):
        super(UnetGenerator, self).__init__()
        unet_block = UnetSkipConnectionBlock(
            ngf, ngf * 2, input_nc=None, submodule=None, norm_layer=norm_layer, innermost=True
        )  # add the innermost layer
        self.model = UnetSkipConnectionBlock(
            output_nc, ngf, input_nc=input_nc, submodule=unet_block, outermost=True, norm_layer=norm_layer
        )  # add the outermost layer

    def forward(self, input):
        return self.model(input)


class NLayerDiscriminator(nn.Module):
    def __init__(self, input_nc, ndf=4):
        super(NLayerDiscriminator, self).__init__()
        sequence = [nn.Conv2d(input_nc, ndf, kernel_size=4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
        sequence += [
            nn.Conv2d(ndf, ndf * 2, kernel_size=3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, True),
        ]
        sequence += [nn.Conv2d(ndf * 2, 1, kernel_size=3, stride=1, padding=1)]  # output 1 channel prediction map
        self.model = nn.Sequential(*sequence)

    def forward(self, input):
        return self.model(input)


class Pix2PixModel:
    def __init__(self, opt):
        self.opt = opt
        self.isTrain = opt.isTrain
        self.loss_names = ["G_GAN", "G_L1", "D_real", "D_fake"]
        self.netG = UnetGenerator(opt.input_nc, opt.output_nc, opt.ngf)
        if self.isTrain:
            self.netD = NLayerDiscriminator(opt.input_nc + opt.output_nc, opt.ndf)
        if self.isTrain:
            self.fake_AB_pool = ImagePool(opt.pool_size)
            # define loss functions
            self.criterionGAN = GANLoss(opt.gan_mode)
            self.criterionL1 = torch.nn.L1Loss()
            # initialize optimizers
            self.optimizers = []
            self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
            self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
            self.optimizers.append(self.optimizer_G)
            self.optimizers.append(self.optimizer_D)

    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            if net is not None:
                for param in net.parameters():
                    param.requires_grad = requires_grad

    def set_input(self, input):
        AtoB = self.opt.direction == "AtoB"
        self.real_A = input["A" if AtoB else "B"]
        self.real_B = input["B" if AtoB else "A"]

    def forward(self):
        self.fake_B = self.netG(self.real_A)  # @fake_B

    def backward_D(self):
        # Fake; stop backprop to the generator by detaching fake_B
        fake_AB = self.fake_AB_pool.query(torch.cat((self.real_A, self.fake_B), 1))
        pred_fake = self.netD(fake_AB.detach())
        self.loss_D_fake = self.criterionGAN(pred_fake, False)  # @loss_D_fake
        # Real
        real_AB = torch.cat((self.real_A, self.real_B), 1)
        pred_real = self.netD(real_AB)
        self.loss_D_real = self.criterionGAN(pred_real, True)  # @loss_D_real
        # combine loss and calculate gradients
        self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5  # @loss_D
        self.loss_D.backward()  # @backward_D

    def backward_G(self):
        # First, G(A) should fake the discriminator
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        pred_fake = self.netD(fake_AB)
        self.loss_G_GAN = self.criterionGAN(pred_fake, True)  # @loss_G_GAN
        # Second, G(A) = B
        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_L1  # @loss_G_L1
        # combine loss and calculate gradients
        self.loss_G = self.loss_G_GAN + self.loss_G_L1  # @loss_G
        self.loss_G.backward()  # @backward_G

    def optimize_parameters(self):
        self.forward()  # compute fake images: G(A)
        # update D
        self.set_requires_grad(self.netD, True)  # enable backprop for D
        self.optimizer_D.zero_grad()  # set D's gradients to zero
        self.backward_D()  # calculate gradients for D
        self.optimizer_D.step()  # update D's weights
        # update G
        self.set_requires_grad(self.netD, False)  # D requires no gradients when optimizing G
        self.optimizer_G.zero_grad()  # set G's gradients to zero
        self.backward_G()  # calculate graidents for G
        self.optimizer_G.step()  # update G's weights


def build() -> dict:
    torch.manual_seed(0)
    random.seed(0)
    opt = argparse.Namespace(
        isTrain=True,
        input_nc=3,
        output_nc=3,
        ngf=4,
        ndf=4,
        pool_size=0,
        gan_mode="vanilla",
        lr=0.0002,
        beta1=0.5,
        lambda_L1=100.0,
        direction="AtoB",
    )
    model = Pix2PixModel(opt)
    dataset = [{"A": torch.rand(2, 3, 8, 8) * 2 - 1, "B": torch.rand(2, 3, 8, 8) * 2 - 1} for _ in range(ITERATIONS)]
    return {"model": model, "dataset": dataset, "i": 0}


def iteration(state: dict) -> None:
    data = state["dataset"][state["i"] % len(state["dataset"])]
    state["i"] += 1
    state["model"].set_input(data)  # unpack data from dataset and apply preprocessing
    state["model"].optimize_parameters()  # calculate loss functions, get gradients, update network weights


def run(state: dict, iterations: int = ITERATIONS) -> None:
    model = state["model"]
    for i, data in enumerate(state["dataset"][:iterations]):  # inner loop within one epoch
        model.set_input(data)
        model.optimize_parameters()


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
