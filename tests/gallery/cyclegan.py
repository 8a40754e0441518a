"""CycleGAN: two generators trained by one summed loss, then two discriminators on replayed fakes.

Source: aitorzip/PyTorch-CycleGAN, train (the training script) and utils.py's ReplayBuffer
(push_and_pop keeps `data.data`, so replayed fakes carry no graph): optimizer_G over both generators
(itertools.chain), identity + GAN + cycle losses summed into loss_G, loss_G.backward(),
optimizer_G.step(); then D_A and D_B each on `fake_A_buffer.push_and_pop(fake_A)` passed through
`.detach()`, each with its own zero_grad/backward/step. Inputs are copied into preallocated tensors
(`real_A = Variable(input_A.copy_(batch['A']))`) as published. Retyped at CPU size: 1-channel 4x4
images, one-conv residual generators and two-conv discriminators (models.py's are 9-block ResNets and
PatchGANs), batch 1 as published, 3 batches; LambdaLR schedulers and the logger left out.
"""

import itertools
import random
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.autograd import Variable

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Generator(nn.Module):
    def __init__(self, input_nc, output_nc):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(input_nc, 4, 3, padding=1), nn.InstanceNorm2d(4), nn.ReLU(inplace=True),
                                   nn.Conv2d(4, output_nc, 3, padding=1), nn.Tanh())

    def forward(self, x):
        return self.model(x)


class Discriminator(nn.Module):
    def __init__(self, input_nc):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(input_nc, 4, 3, stride=2, padding=1), nn.LeakyReLU(0.2, inplace=True),
                                   nn.Conv2d(4, 1, 3, padding=1))

    def forward(self, x):
        x = self.model(x)
        return nn.functional.avg_pool2d(x, x.size()[2:]).view(x.size()[0], -1)


class ReplayBuffer():
    def __init__(self, max_size=50):
        assert (max_size > 0), 'Empty buffer or trying to create a black hole. Be careful.'
        self.max_size = max_size
        self.data = []

    def push_and_pop(self, data):
        to_return = []
        for element in data.data:
            element = torch.unsqueeze(element, 0)
            if len(self.data) < self.max_size:
                self.data.append(element)
                to_return.append(element)
            else:
                if random.uniform(0, 1) > 0.5:
                    i = random.randint(0, self.max_size - 1)
                    to_return.append(self.data[i].clone())
                    self.data[i] = element
                else:
                    to_return.append(element)
        return Variable(torch.cat(to_return))


def build() -> dict:
    torch.manual_seed(0)
    random.seed(0)
    netG_A2B, netG_B2A = Generator(1, 1), Generator(1, 1)
    netD_A, netD_B = Discriminator(1), Discriminator(1)
    Tensor = torch.Tensor
    return {
        "netG_A2B": netG_A2B, "netG_B2A": netG_B2A, "netD_A": netD_A, "netD_B": netD_B,
        "criterion_GAN": torch.nn.MSELoss(), "criterion_cycle": torch.nn.L1Loss(), "criterion_identity": torch.nn.L1Loss(),
        "optimizer_G": torch.optim.Adam(itertools.chain(netG_A2B.parameters(), netG_B2A.parameters()), lr=0.0002, betas=(0.5, 0.999)),
        "optimizer_D_A": torch.optim.Adam(netD_A.parameters(), lr=0.0002, betas=(0.5, 0.999)),
        "optimizer_D_B": torch.optim.Adam(netD_B.parameters(), lr=0.0002, betas=(0.5, 0.999)),
        "input_A": Tensor(1, 1, 4, 4), "input_B": Tensor(1, 1, 4, 4),
        "target_real": Variable(Tensor(1).fill_(1.0), requires_grad=False),
        "target_fake": Variable(Tensor(1).fill_(0.0), requires_grad=False),
        "fake_A_buffer": ReplayBuffer(), "fake_B_buffer": ReplayBuffer(),
        "dataloader": [{"A": torch.rand(1, 1, 4, 4) * 2 - 1, "B": torch.rand(1, 1, 4, 4) * 2 - 1} for _ in range(ITERATIONS + 1)],
        "i": 0,
    }


def iteration(state: dict) -> None:
    netG_A2B, netG_B2A, netD_A, netD_B = state["netG_A2B"], state["netG_B2A"], state["netD_A"], state["netD_B"]
    criterion_GAN, criterion_cycle, criterion_identity = state["criterion_GAN"], state["criterion_cycle"], state["criterion_identity"]
    optimizer_G, optimizer_D_A, optimizer_D_B = state["optimizer_G"], state["optimizer_D_A"], state["optimizer_D_B"]
    target_real, target_fake = state["target_real"], state["target_fake"]
    batch = state["dataloader"][state["i"] % len(state["dataloader"])]
    state["i"] += 1

    real_A = Variable(state["input_A"].copy_(batch['A']))
    real_B = Variable(state["input_B"].copy_(batch['B']))

    optimizer_G.zero_grad()
    same_B = netG_A2B(real_B)
    loss_identity_B = criterion_identity(same_B, real_B) * 5.0
    same_A = netG_B2A(real_A)
    loss_identity_A = criterion_identity(same_A, real_A) * 5.0
    fake_B = netG_A2B(real_A)
    pred_fake = netD_B(fake_B)
    loss_GAN_A2B = criterion_GAN(pred_fake, target_real)
    fake_A = netG_B2A(real_B)
    pred_fake = netD_A(fake_A)
    loss_GAN_B2A = criterion_GAN(pred_fake, target_real)
    recovered_A = netG_B2A(fake_B)
    loss_cycle_ABA = criterion_cycle(recovered_A, real_A) * 10.0
    recovered_B = netG_A2B(fake_A)
    loss_cycle_BAB = criterion_cycle(recovered_B, real_B) * 10.0
    loss_G = loss_identity_A + loss_identity_B + loss_GAN_A2B + loss_GAN_B2A + loss_cycle_ABA + loss_cycle_BAB
    loss_G.backward()  # @g_backward
    optimizer_G.step()

    optimizer_D_A.zero_grad()
    pred_real = netD_A(real_A)
    loss_D_real = criterion_GAN(pred_real, target_real)
    fake_A = state["fake_A_buffer"].push_and_pop(fake_A)
    pred_fake = netD_A(fake_A.detach())
    loss_D_fake = criterion_GAN(pred_fake, target_fake)
    loss_D_A = (loss_D_real + loss_D_fake) * 0.5
    loss_D_A.backward()  # @d_a_backward
    optimizer_D_A.step()

    optimizer_D_B.zero_grad()
    pred_real = netD_B(real_B)
    loss_D_real = criterion_GAN(pred_real, target_real)
    fake_B = state["fake_B_buffer"].push_and_pop(fake_B)
    pred_fake = netD_B(fake_B.detach())
    loss_D_fake = criterion_GAN(pred_fake, target_fake)
    loss_D_B = (loss_D_real + loss_D_fake) * 0.5
    loss_D_B.backward()  # @d_b_backward
    optimizer_D_B.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
