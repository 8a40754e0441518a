"""pix2pixHD: one forward returns G's and D's losses; G's feature matching reads D's real features `.detach()`ed.

Source: NVIDIA/pix2pixHD, models/pix2pixHD_model.py (commit 0034fd1bf7f31159474b039a862f557fcc803dd4):
Pix2PixHDModel.forward (fake_image = netG(input), pred_fake_pool = discriminate(input_label, fake_image,
use_pool=True) on `test_image.detach()`, pred_real = discriminate(input_label, real_image), pred_fake =
netD(torch.cat((input_label, fake_image), dim=1)) for G's GAN loss, the GAN feature-matching loss
`criterionFeat(pred_fake[i][j], pred_real[i][j].detach())` over num_D scales and their intermediate layers, the
VGG loss), and train.py (commit 04270df9bd9d6e85ca3fc28560798057fe85cc6b): losses = model(...), the per-device
torch.mean, loss_D = (D_fake + D_real) * 0.5, loss_G = G_GAN + G_GAN_Feat + G_VGG, then optimizer_G.zero_grad(),
loss_G.backward(), optimizer_G.step(), optimizer_D.zero_grad(), loss_D.backward(), optimizer_D.step(), one forward
for both. The detach in the feature-matching loss is asked about in https://github.com/NVIDIA/pix2pixHD/issues/237.
networks.py's GlobalGenerator, MultiscaleDiscriminator (getIntermFeat=True: each scale returns every layer's
output), NLayerDiscriminator, GANLoss (LSGAN, its cached target tensors) and ImagePool (pool_size 0: the query
returns its input) as published. Retyped at CPU size: label_nc=0 with 2 input channels, no instance map, no
features, 1 output channel, 8x8 images, batch 1; ngf=4, one downsampling, one ResnetBlock; ndf=4, n_layers_D=2,
num_D=2; VGGLoss's VGG19 is a frozen random two-slice conv stand-in; `Variable(...)` and `.cuda()` dropped.
"""

import functools
from collections.abc import Callable

import numpy as np
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


class ResnetBlock(nn.Module):
    def __init__(self, dim, padding_type, norm_layer, activation=nn.ReLU(True)):  # noqa: B008 (as published)
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, kernel_size=3, padding=0), norm_layer(dim), activation,
            nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, kernel_size=3, padding=0), norm_layer(dim))

    def forward(self, x):
        out = x + self.conv_block(x)
        return out


class GlobalGenerator(nn.Module):
    def __init__(self, input_nc, output_nc, ngf=4, n_downsampling=1, n_blocks=1, norm_layer=nn.BatchNorm2d,
                 padding_type='reflect'):
        super().__init__()
        activation = nn.ReLU(True)
        model = [nn.ReflectionPad2d(3), nn.Conv2d(input_nc, ngf, kernel_size=7, padding=0), norm_layer(ngf), activation]
        for i in range(n_downsampling):
            mult = 2**i
            model += [nn.Conv2d(ngf * mult, ngf * mult * 2, kernel_size=3, stride=2, padding=1),
                      norm_layer(ngf * mult * 2), activation]
        mult = 2**n_downsampling
        for i in range(n_blocks):
            model += [ResnetBlock(ngf * mult, padding_type=padding_type, activation=activation, norm_layer=norm_layer)]
        for i in range(n_downsampling):
            mult = 2**(n_downsampling - i)
            model += [nn.ConvTranspose2d(ngf * mult, int(ngf * mult / 2), kernel_size=3, stride=2, padding=1,
                                         output_padding=1),
                      norm_layer(int(ngf * mult / 2)), activation]
        model += [nn.ReflectionPad2d(3), nn.Conv2d(ngf, output_nc, kernel_size=7, padding=0), nn.Tanh()]
        self.model = nn.Sequential(*model)

    def forward(self, input):
        return self.model(input)


class NLayerDiscriminator(nn.Module):
    def __init__(self, input_nc, ndf=4, n_layers=2, norm_layer=nn.BatchNorm2d, use_sigmoid=False, getIntermFeat=True):
        super().__init__()
        self.getIntermFeat = getIntermFeat
        self.n_layers = n_layers
        kw = 4
        padw = int(np.ceil((kw - 1.0) / 2))
        sequence = [[nn.Conv2d(input_nc, ndf, kernel_size=kw, stride=2, padding=padw), nn.LeakyReLU(0.2, True)]]
        nf = ndf
        for n in range(1, n_layers):
            nf_prev = nf
            nf = min(nf * 2, 512)
            sequence += [[nn.Conv2d(nf_prev, nf, kernel_size=kw, stride=2, padding=padw), norm_layer(nf),
                          nn.LeakyReLU(0.2, True)]]
        nf_prev = nf
        nf = min(nf * 2, 512)
        sequence += [[nn.Conv2d(nf_prev, nf, kernel_size=kw, stride=1, padding=padw), norm_layer(nf),
                      nn.LeakyReLU(0.2, True)]]
        sequence += [[nn.Conv2d(nf, 1, kernel_size=kw, stride=1, padding=padw)]]
        if use_sigmoid:
            sequence += [[nn.Sigmoid()]]
        for n in range(len(sequence)):
            setattr(self, 'model' + str(n), nn.Sequential(*sequence[n]))

    def forward(self, input):
        res = [input]
        for n in range(self.n_layers + 2):
            model = getattr(self, 'model' + str(n))
            res.append(model(res[-1]))
        return res[1:]


class MultiscaleDiscriminator(nn.Module):
    def __init__(self, input_nc, ndf=4, n_layers=2, norm_layer=nn.BatchNorm2d, use_sigmoid=False, num_D=2,
                 getIntermFeat=True):
        super().__init__()
        self.num_D = num_D
        self.n_layers = n_layers
        self.getIntermFeat = getIntermFeat
        for i in range(num_D):
            netD = NLayerDiscriminator(input_nc, ndf, n_layers, norm_layer, use_sigmoid, getIntermFeat)
            for j in range(n_layers + 2):
                setattr(self, 'scale' + str(i) + '_layer' + str(j), getattr(netD, 'model' + str(j)))
        self.downsample = nn.AvgPool2d(3, stride=2, padding=[1, 1], count_include_pad=False)

    def singleD_forward(self, model, input):
        result = [input]
        for i in range(len(model)):
            result.append(model[i](result[-1]))
        return result[1:]

    def forward(self, input):
        num_D = self.num_D
        result = []
        input_downsampled = input
        for i in range(num_D):
            model = [getattr(self, 'scale' + str(num_D - 1 - i) + '_layer' + str(j)) for j in range(self.n_layers + 2)]
            result.append(self.singleD_forward(model, input_downsampled))
            if i != (num_D - 1):
                input_downsampled = self.downsample(input_downsampled)
        return result


class GANLoss(nn.Module):
    def __init__(self, use_lsgan=True, target_real_label=1.0, target_fake_label=0.0, tensor=torch.FloatTensor):
        super().__init__()
        self.real_label = target_real_label
        self.fake_label = target_fake_label
        self.real_label_var = None
        self.fake_label_var = None
        self.Tensor = tensor
        self.loss = nn.MSELoss() if use_lsgan else nn.BCELoss()

    def get_target_tensor(self, input, target_is_real):
        if target_is_real:
            create_label = ((self.real_label_var is None) or (self.real_label_var.numel() != input.numel()))
            if create_label:
                real_tensor = self.Tensor(input.size()).fill_(self.real_label)
                self.real_label_var = real_tensor.requires_grad_(False)
            target_tensor = self.real_label_var
        else:
            create_label = ((self.fake_label_var is None) or (self.fake_label_var.numel() != input.numel()))
            if create_label:
                fake_tensor = self.Tensor(input.size()).fill_(self.fake_label)
                self.fake_label_var = fake_tensor.requires_grad_(False)
            target_tensor = self.fake_label_var
        return target_tensor

    def __call__(self, input, target_is_real):
        if isinstance(input[0], list):
            loss = 0
            for input_i in input:
                pred = input_i[-1]
                target_tensor = self.get_target_tensor(pred, target_is_real)
                loss += self.loss(pred, target_tensor)
            return loss
        else:
            target_tensor = self.get_target_tensor(input[-1], target_is_real)
            return self.loss(input[-1], target_tensor)


class VGGLoss(nn.Module):
    """Stands in for networks.VGGLoss (five VGG19 slices, weights 1/32 .. 1): two frozen random conv slices."""

    def __init__(self):
        super().__init__()
        self.slice1 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.slice2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        for param in self.parameters():
            param.requires_grad = False
        self.criterion = nn.L1Loss()
        self.weights = [1.0 / 16, 1.0]

    def vgg(self, x):
        h1 = self.slice1(x)
        return [h1, self.slice2(h1)]

    def forward(self, x, y):
        x_vgg, y_vgg = self.vgg(x), self.vgg(y)
        loss = 0
        for i in range(len(x_vgg)):
            loss += self.weights[i] * self.criterion(x_vgg[i], y_vgg[i].detach())
        return loss


class ImagePool():
    def __init__(self, pool_size):
        self.pool_size = pool_size
        if self.pool_size > 0:
            self.num_imgs = 0
            self.images = []

    def query(self, images):
        if self.pool_size == 0:
            return images


class Options:
    label_nc = 0
    input_nc = 2
    output_nc = 1
    ngf = 4
    ndf = 4
    n_layers_D = 2
    num_D = 2
    lambda_feat = 10.0
    no_ganFeat_loss = False
    no_vgg_loss = False
    no_lsgan = False
    pool_size = 0
    lr = 0.0002
    beta1 = 0.5


class Pix2PixHDModel(nn.Module):
    def __init__(self, opt):
        super().__init__()
        self.opt = opt
        norm_layer = functools.partial(nn.InstanceNorm2d, affine=False)
        self.netG = GlobalGenerator(opt.input_nc, opt.output_nc, opt.ngf, norm_layer=norm_layer)
        netD_input_nc = opt.input_nc + opt.output_nc
        self.netD = MultiscaleDiscriminator(netD_input_nc, opt.ndf, opt.n_layers_D, norm_layer, opt.no_lsgan,
                                            opt.num_D, not opt.no_ganFeat_loss)
        self.fake_pool = ImagePool(opt.pool_size)
        self.loss_filter = self.init_loss_filter(not opt.no_ganFeat_loss, not opt.no_vgg_loss)
        self.criterionGAN = GANLoss(use_lsgan=not opt.no_lsgan)
        self.criterionFeat = torch.nn.L1Loss()
        self.criterionVGG = VGGLoss()
        self.loss_names = self.loss_filter('G_GAN', 'G_GAN_Feat', 'G_VGG', 'D_real', 'D_fake')
        params = list(self.netG.parameters())
        self.optimizer_G = torch.optim.Adam(params, lr=opt.lr, betas=(opt.beta1, 0.999))
        params = list(self.netD.parameters())
        self.optimizer_D = torch.optim.Adam(params, lr=opt.lr, betas=(opt.beta1, 0.999))

    def init_loss_filter(self, use_gan_feat_loss, use_vgg_loss):
        flags = (True, use_gan_feat_loss, use_vgg_loss, True, True)

        def loss_filter(g_gan, g_gan_feat, g_vgg, d_real, d_fake):
            return [l for (l, f) in zip((g_gan, g_gan_feat, g_vgg, d_real, d_fake), flags) if f]
        return loss_filter

    def encode_input(self, label_map, real_image=None):
        input_label = label_map.data
        return input_label, real_image

    def discriminate(self, input_label, test_image, use_pool=False):
        input_concat = torch.cat((input_label, test_image.detach()), dim=1)
        if use_pool:
            fake_query = self.fake_pool.query(input_concat)
            return self.netD.forward(fake_query)
        else:
            return self.netD.forward(input_concat)

    def forward(self, label, image, infer=False):
        input_label, real_image = self.encode_input(label, image)
        input_concat = input_label
        fake_image = self.netG.forward(input_concat)

        # Fake Detection and Loss
        pred_fake_pool = self.discriminate(input_label, fake_image, use_pool=True)
        loss_D_fake = self.criterionGAN(pred_fake_pool, False)

        # Real Detection and Loss
        pred_real = self.discriminate(input_label, real_image)
        loss_D_real = self.criterionGAN(pred_real, True)

        # GAN loss (Fake Passability Loss)
        pred_fake = self.netD.forward(torch.cat((input_label, fake_image), dim=1))
        loss_G_GAN = self.criterionGAN(pred_fake, True)

        # GAN feature matching loss
        loss_G_GAN_Feat = 0
        if not self.opt.no_ganFeat_loss:
            feat_weights = 4.0 / (self.opt.n_layers_D + 1)
            D_weights = 1.0 / self.opt.num_D
            for i in range(self.opt.num_D):
                for j in range(len(pred_fake[i]) - 1):
                    loss_G_GAN_Feat += D_weights * feat_weights * \
                        self.criterionFeat(pred_fake[i][j], pred_real[i][j].detach()) * self.opt.lambda_feat

        # VGG feature matching loss
        loss_G_VGG = 0
        if not self.opt.no_vgg_loss:
            loss_G_VGG = self.criterionVGG(fake_image, real_image) * self.opt.lambda_feat

        return [self.loss_filter(loss_G_GAN, loss_G_GAN_Feat, loss_G_VGG, loss_D_real, loss_D_fake),
                None if not infer else fake_image]


def build() -> dict:
    torch.manual_seed(0)
    model = Pix2PixHDModel(Options())
    return {
        "model": model,
        "optimizer_G": model.optimizer_G,
        "optimizer_D": model.optimizer_D,
        "dataset": [{"label": torch.rand(1, 2, 8, 8), "image": torch.rand(1, 1, 8, 8) * 2 - 1}
                    for _ in range(ITERATIONS + 1)],
        "i": 0,
    }


def iteration(state: dict) -> None:
    model, optimizer_G, optimizer_D = state["model"], state["optimizer_G"], state["optimizer_D"]
    data = state["dataset"][state["i"] % len(state["dataset"])]
    state["i"] += 1
    save_fake = False

    ############## Forward Pass ######################
    losses, generated = model(data['label'], data['image'], infer=save_fake)

    # sum per device losses
    losses = [torch.mean(x) if not isinstance(x, int) else x for x in losses]
    loss_dict = dict(zip(model.loss_names, losses))

    # calculate final loss scalar
    loss_D = (loss_dict['D_fake'] + loss_dict['D_real']) * 0.5
    loss_G = loss_dict['G_GAN'] + loss_dict.get('G_GAN_Feat', 0) + loss_dict.get('G_VGG', 0)

    ############### Backward Pass ####################
    # update generator weights
    optimizer_G.zero_grad()
    loss_G.backward()  # @g_backward
    optimizer_G.step()

    # update discriminator weights
    optimizer_D.zero_grad()
    loss_D.backward()  # @d_backward
    optimizer_D.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
