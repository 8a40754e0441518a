"""pytorch/examples' DCGAN: D's fake loss on `fake.detach()`, G's loss on the same `fake`, one forward of G.

Source: pytorch/examples, dcgan/main.py (commit 13caa078cd69d74ffb447a9eda09f0a81b809480). As published:
Generator (ConvTranspose2d nz->ngf*8->ngf*4->ngf*2->ngf->nc with BatchNorm2d and ReLU(True), Tanh) and
Discriminator (Conv2d with LeakyReLU(0.2, inplace=True) and BatchNorm2d, Sigmoid, `output.view(-1, 1).squeeze(1)`),
weights_init, BCELoss, Adam(lr, betas=(beta1, 0.999)) for both; per batch: netD.zero_grad(), `label = torch.full(...,
real_label)`, errD_real on the real batch and its backward, `noise = torch.randn(...)`, `fake = netG(noise)`,
`label.fill_(fake_label)`, `output = netD(fake.detach())`, errD_fake.backward(), `errD = errD_real + errD_fake`,
optimizerD.step(); then netG.zero_grad(), `label.fill_(real_label)`, `output = netD(fake)`, errG.backward(),
optimizerG.step(), the printed `.item()`s, and every 100 batches (`i % 100 == 0`) `fake = netG(fixed_noise)`
(built with its graph: no `torch.no_grad()` there) for `vutils.save_image(fake.detach(), ...)`. The loop runs at
script level, so `fake` outlives its batch: it is kept in the state the same way (the image saving is left out).
Retyped at CPU size: batchSize 4 (published 64), nz 8 (100), ngf = ndf = 4 (64), imageSize 64 as published, made-up
images in [-1, 1] for the dataset (the published `--dataset fake` is FakeData of the same shape), 3 batches.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3
BATCH_SIZE = 4
IMAGE_SIZE = 64
nz = 8
ngf = 4
ndf = 4
nc = 3
ngpu = 1
lr = 0.0002
beta1 = 0.5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "fake", "line": "@fake_fixed"}],
    "modifies_in_place": [],
}


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super(Generator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            # input is Z, going into a convolution
            nn.ConvTranspose2d(     nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            # state size. (ngf*8) x 4 x 4
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            # state size. (ngf*4) x 8 x 8
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # state size. (ngf*2) x 16 x 16
            nn.ConvTranspose2d(ngf * 2,     ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # state size. (ngf) x 32 x 32
            nn.ConvTranspose2d(    ngf,      nc, 4, 2, 1, bias=False),
            nn.Tanh()
            # state size. (nc) x 64 x 64
        )

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super(Discriminator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            # input is (nc) x 64 x 64
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf) x 32 x 32
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*2) x 16 x 16
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*4) x 8 x 8
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*8) x 4 x 4
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)

        return output.view(-1, 1).squeeze(1)


def build() -> dict:
    torch.manual_seed(0)
    device = torch.device("cpu")
    netG = Generator(ngpu).to(device)
    netG.apply(weights_init)
    netD = Discriminator(ngpu).to(device)
    netD.apply(weights_init)
    dataloader = [(torch.rand(BATCH_SIZE, nc, IMAGE_SIZE, IMAGE_SIZE) * 2 - 1, torch.zeros(BATCH_SIZE))
                  for _ in range(ITERATIONS)]
    fixed_noise = torch.randn(BATCH_SIZE, nz, 1, 1, device=device)
    return {
        "netG": netG,
        "netD": netD,
        "criterion": nn.BCELoss(),
        "fixed_noise": fixed_noise,
        "optimizerD": optim.Adam(netD.parameters(), lr=lr, betas=(beta1, 0.999)),
        "optimizerG": optim.Adam(netG.parameters(), lr=lr, betas=(beta1, 0.999)),
        "dataloader": dataloader,
        "i": 0,
        "fake": None,
    }


def iteration(state: dict) -> None:
    netG, netD, criterion = state["netG"], state["netD"], state["criterion"]
    optimizerD, optimizerG, fixed_noise = state["optimizerD"], state["optimizerG"], state["fixed_noise"]
    device = torch.device("cpu")
    real_label = 1
    fake_label = 0
    i = state["i"]
    data = state["dataloader"][i % len(state["dataloader"])]
    state["i"] += 1
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    # train with real
    netD.zero_grad()
    real_cpu = data[0].to(device)
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label,
                       dtype=real_cpu.dtype, device=device)

    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()  # @errd_real_backward
    D_x = output.mean().item()

    # train with fake
    noise = torch.randn(batch_size, nz, 1, 1, device=device)
    state["fake"] = netG(noise)  # @fake
    label.fill_(fake_label)
    output = netD(state["fake"].detach())  # @d_on_fake
    errD_fake = criterion(output, label)
    errD_fake.backward()  # @errd_fake_backward
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()

    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost
    output = netD(state["fake"])
    errG = criterion(output, label)
    errG.backward()  # @errg_backward
    D_G_z2 = output.mean().item()
    optimizerG.step()

    _ = (errD.item(), errG.item(), D_x, D_G_z1, D_G_z2)  # the published print
    if i % 100 == 0:
        state["fake"] = netG(fixed_noise)  # @fake_fixed


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
