"""InfoGAN: a generator step, a discriminator step, then the information loss through G and D's heads together.

Source: eriklindernoren/PyTorch-GAN, implementations/infogan/infogan.py (commit
b84458eea25e07146070b9faeacb577c2ecd9737): Generator (l1, conv_blocks with `nn.BatchNorm2d(128, 0.8)` as
published), Discriminator (discriminator_block, adv_layer, aux_layer with nn.Softmax(), latent_layer),
weights_init_normal, to_categorical, MSELoss as adversarial and continuous loss, CrossEntropyLoss, lambda_cat 1,
lambda_con 0.1, optimizer_G, optimizer_D and `optimizer_info = Adam(itertools.chain(generator.parameters(),
discriminator.parameters()))`; the training loop body as published: optimizer_G.zero_grad(), g_loss through
`discriminator(gen_imgs)`, backward, step; optimizer_D.zero_grad(), d_real_loss, d_fake_loss on
`gen_imgs.detach()`, backward, step; optimizer_info.zero_grad(), new z, labels and code, `gen_imgs =
generator(...)`, `_, pred_label, pred_code = discriminator(gen_imgs)`, info_loss backward, optimizer_info.step().
Retyped at CPU size: `Variable(...)` removed, `.cuda()` dropped, latent_dim 4 (published 62), n_classes 3
(published 10), img_size 16 (published 32), channels 1, the generator's 128 and 64 channels become 8 and 4, the
discriminator's 16, 32, 64, 128 become 4 each, batch_size 4 (published 64), MNIST replaced by made-up batches
of images in [-1, 1] and labels; one batch is an iteration; printing and sample_image left out.
"""

import itertools
from collections.abc import Callable
from types import SimpleNamespace

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

opt = SimpleNamespace(n_epochs=200, batch_size=4, lr=0.0002, b1=0.5, b2=0.999, latent_dim=4, code_dim=2,
                      n_classes=3, img_size=16, channels=1, sample_interval=400)

cuda = False

FloatTensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


def to_categorical(y, num_columns):
    """Returns one-hot encoded Variable"""
    y_cat = np.zeros((y.shape[0], num_columns))
    y_cat[range(y.shape[0]), y] = 1.0

    return FloatTensor(y_cat)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        input_dim = opt.latent_dim + opt.n_classes + opt.code_dim

        self.init_size = opt.img_size // 4  # Initial size before upsampling
        self.l1 = nn.Sequential(nn.Linear(input_dim, 8 * self.init_size ** 2))

        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(8),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(8, 8, 3, stride=1, padding=1),
            nn.BatchNorm2d(8, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(8, 4, 3, stride=1, padding=1),
            nn.BatchNorm2d(4, 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(4, opt.channels, 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, noise, labels, code):
        gen_input = torch.cat((noise, labels, code), -1)
        out = self.l1(gen_input)
        out = out.view(out.shape[0], 8, self.init_size, self.init_size)
        img = self.conv_blocks(out)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()

        def discriminator_block(in_filters, out_filters, bn=True):
            """Returns layers of each discriminator block"""
            block = [nn.Conv2d(in_filters, out_filters, 3, 2, 1), nn.LeakyReLU(0.2, inplace=True), nn.Dropout2d(0.25)]
            if bn:
                block.append(nn.BatchNorm2d(out_filters, 0.8))
            return block

        self.conv_blocks = nn.Sequential(
            *discriminator_block(opt.channels, 4, bn=False),
            *discriminator_block(4, 4),
            *discriminator_block(4, 4),
            *discriminator_block(4, 4),
        )

        # The height and width of downsampled image
        ds_size = opt.img_size // 2 ** 4

        # Output layers
        self.adv_layer = nn.Sequential(nn.Linear(4 * ds_size ** 2, 1))
        self.aux_layer = nn.Sequential(nn.Linear(4 * ds_size ** 2, opt.n_classes), nn.Softmax())
        self.latent_layer = nn.Sequential(nn.Linear(4 * ds_size ** 2, opt.code_dim))

    def forward(self, img):
        out = self.conv_blocks(img)
        out = out.view(out.shape[0], -1)
        validity = self.adv_layer(out)
        label = self.aux_layer(out)
        latent_code = self.latent_layer(out)

        return validity, label, latent_code


# Loss functions
adversarial_loss = torch.nn.MSELoss()
categorical_loss = torch.nn.CrossEntropyLoss()
continuous_loss = torch.nn.MSELoss()

# Loss weights
lambda_cat = 1
lambda_con = 0.1


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    # Initialize generator and discriminator
    generator = Generator()
    discriminator = Discriminator()

    # Initialize weights
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    # made-up MNIST batches: images in [-1, 1] (Normalize([0.5], [0.5])) and labels
    dataloader = [
        (torch.rand(opt.batch_size, opt.channels, opt.img_size, opt.img_size) * 2 - 1,
         torch.randint(0, opt.n_classes, (opt.batch_size,)))
        for _ in range(ITERATIONS)
    ]

    # Optimizers
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_info = torch.optim.Adam(
        itertools.chain(generator.parameters(), discriminator.parameters()), lr=opt.lr, betas=(opt.b1, opt.b2)
    )
    return {"generator": generator, "discriminator": discriminator, "dataloader": dataloader,
            "optimizer_G": optimizer_G, "optimizer_D": optimizer_D, "optimizer_info": optimizer_info, "i": 0}


def iteration(state: dict) -> None:
    generator, discriminator = state["generator"], state["discriminator"]
    optimizer_G, optimizer_D, optimizer_info = state["optimizer_G"], state["optimizer_D"], state["optimizer_info"]
    imgs, labels = state["dataloader"][state["i"] % len(state["dataloader"])]

    batch_size = imgs.shape[0]

    # Adversarial ground truths
    valid = FloatTensor(batch_size, 1).fill_(1.0)
    fake = FloatTensor(batch_size, 1).fill_(0.0)

    # Configure input
    real_imgs = imgs.type(FloatTensor)
    labels = to_categorical(labels.numpy(), num_columns=opt.n_classes)

    # -----------------
    #  Train Generator
    # -----------------

    optimizer_G.zero_grad()

    # Sample noise and labels as generator input
    z = FloatTensor(np.random.normal(0, 1, (batch_size, opt.latent_dim)))
    label_input = to_categorical(np.random.randint(0, opt.n_classes, batch_size), num_columns=opt.n_classes)
    code_input = FloatTensor(np.random.uniform(-1, 1, (batch_size, opt.code_dim)))

    # Generate a batch of images
    gen_imgs = generator(z, label_input, code_input)

    # Loss measures generator's ability to fool the discriminator
    validity, _, _ = discriminator(gen_imgs)
    g_loss = adversarial_loss(validity, valid)

    g_loss.backward()  # @g_backward
    optimizer_G.step()

    # ---------------------
    #  Train Discriminator
    # ---------------------

    optimizer_D.zero_grad()

    # Loss for real images
    real_pred, _, _ = discriminator(real_imgs)
    d_real_loss = adversarial_loss(real_pred, valid)

    # Loss for fake images
    fake_pred, _, _ = discriminator(gen_imgs.detach())
    d_fake_loss = adversarial_loss(fake_pred, fake)

    # Total discriminator loss
    d_loss = (d_real_loss + d_fake_loss) / 2

    d_loss.backward()  # @d_backward
    optimizer_D.step()

    # ------------------
    # Information Loss
    # ------------------

    optimizer_info.zero_grad()

    # Sample labels
    sampled_labels = np.random.randint(0, opt.n_classes, batch_size)

    # Ground truth labels
    gt_labels = LongTensor(sampled_labels)

    # Sample noise, labels and code as generator input
    z = FloatTensor(np.random.normal(0, 1, (batch_size, opt.latent_dim)))
    label_input = to_categorical(sampled_labels, num_columns=opt.n_classes)
    code_input = FloatTensor(np.random.uniform(-1, 1, (batch_size, opt.code_dim)))

    gen_imgs = generator(z, label_input, code_input)
    _, pred_label, pred_code = discriminator(gen_imgs)

    info_loss = lambda_cat * categorical_loss(pred_label, gt_labels) + lambda_con * continuous_loss(
        pred_code, code_input
    )

    info_loss.backward()  # @info_backward
    optimizer_info.step()
    state["i"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
