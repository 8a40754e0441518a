"""EdgeConnect's edge model: a trainer class whose `backward` steps the discriminator, then backwards the generator.

Source: knazeri/edge-connect, src/models.py (BaseModel, EdgeModel: `self.gen_optimizer` and `self.dis_optimizer`
as attributes, `process()` computing the discriminator loss on `outputs.detach()` and the generator's
adversarial + feature-matching loss through a third discriminator call, and
`backward(gen_loss, dis_loss)`: dis_loss.backward(), self.dis_optimizer.step(), gen_loss.backward(),
self.gen_optimizer.step()), src/networks.py (EdgeGenerator, Discriminator, ResnetBlock, spectral_norm,
BaseNetwork.init_weights), src/loss.py (AdversarialLoss, 'nsgan'), src/metrics.py (EdgeAccuracy) and the
`model == 1` branch of EdgeConnect.train in src/edge_connect.py. Since PyTorch 1.5 the generator's backward
meets discriminator weights that dis_optimizer.step() has just changed in place (the repository's issue #188
reports the error). Retyped at CPU size: 1-channel 32x32 made-up grayscale images, edge maps and masks, batch
2; the generator keeps its layer order with widths 4/8/16 (published 64/128/256) and 1 residual block
(published 8); the discriminator widths 4/8/16/16 (published 64/128/256/512); the config's defaults
(LR 0.0001, D2G_LR 0.1, BETA1 0.0, BETA2 0.9, GAN_LOSS nsgan, FM_LOSS_WEIGHT 10, EDGE_THRESHOLD 0.5) are kept;
the DataLoader, the inpainting model (not used when MODEL is 1), the progress bar, logging, sampling and
checkpoints are left out.
"""

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 2

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@gen_backward"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- src/networks.py

def output_align(input, output):
    """
    author: @youyuge34 (https://github.com/youyuge34)
    In testing, sometimes output is several pixels less than irregular-size input,
    here is to fill them
    """
    if output.size()[-2:] != input.size()[-2:]:
        diff_width = input.size(-1) - output.size(-1)
        diff_height = input.size(-2) - output.size(-2)
        m = nn.ReplicationPad2d((0, diff_width, 0, diff_height))
        output = m(output)

    return output


class BaseNetwork(nn.Module):
    def __init__(self):
        super(BaseNetwork, self).__init__()

    def init_weights(self, init_type='normal', gain=0.02):
        def init_func(m):
            classname = m.__class__.__name__
            if hasattr(m, 'weight') and (classname.find('Conv') != -1 or classname.find('Linear') != -1):
                if init_type == 'normal':
                    nn.init.normal_(m.weight.data, 0.0, gain)
                elif init_type == 'xavier':
                    nn.init.xavier_normal_(m.weight.data, gain=gain)
                elif init_type == 'kaiming':
                    nn.init.kaiming_normal_(m.weight.data, a=0, mode='fan_in')
                elif init_type == 'orthogonal':
                    nn.init.orthogonal_(m.weight.data, gain=gain)

                if hasattr(m, 'bias') and m.bias is not None:
                    nn.init.constant_(m.bias.data, 0.0)

            elif classname.find('BatchNorm2d') != -1:
                nn.init.normal_(m.weight.data, 1.0, gain)
                nn.init.constant_(m.bias.data, 0.0)

        self.apply(init_func)


class EdgeGenerator(BaseNetwork):
    def __init__(self, residual_blocks=1, use_spectral_norm=True, init_weights=True):
        super(EdgeGenerator, self).__init__()

        self.encoder = nn.Sequential(
            nn.ReflectionPad2d(3),
            spectral_norm(nn.Conv2d(in_channels=3, out_channels=4, kernel_size=7, padding=0), use_spectral_norm),
            nn.InstanceNorm2d(4, track_running_stats=False),
            nn.ReLU(True),

            spectral_norm(nn.Conv2d(in_channels=4, out_channels=8, kernel_size=4, stride=2, padding=1), use_spectral_norm),
            nn.InstanceNorm2d(8, track_running_stats=False),
            nn.ReLU(True),

            spectral_norm(nn.Conv2d(in_channels=8, out_channels=16, kernel_size=4, stride=2, padding=1), use_spectral_norm),
            nn.InstanceNorm2d(16, track_running_stats=False),
            nn.ReLU(True)
        )

        blocks = []
        for _ in range(residual_blocks):
            block = ResnetBlock(16, 2, use_spectral_norm=use_spectral_norm)
            blocks.append(block)

        self.middle = nn.Sequential(*blocks)

        self.decoder = nn.Sequential(
            spectral_norm(nn.ConvTranspose2d(in_channels=16, out_channels=8, kernel_size=4, stride=2, padding=1), use_spectral_norm),
            nn.InstanceNorm2d(8, track_running_stats=False),
            nn.ReLU(True),

            spectral_norm(nn.ConvTranspose2d(in_channels=8, out_channels=4, kernel_size=4, stride=2, padding=1), use_spectral_norm),
            nn.InstanceNorm2d(4, track_running_stats=False),
            nn.ReLU(True),

            nn.ReflectionPad2d(3),
            nn.Conv2d(in_channels=4, out_channels=1, kernel_size=7, padding=0),
        )

        if init_weights:
            self.init_weights()

    def forward(self, x):
        inpt = x
        x = self.encoder(x)
        x = self.middle(x)
        x = self.decoder(x)
        x = torch.sigmoid(x)
        x = output_align(inpt, x)
        return x


class Discriminator(BaseNetwork):
    def __init__(self, in_channels, use_sigmoid=True, use_spectral_norm=True, init_weights=True):
        super(Discriminator, self).__init__()
        self.use_sigmoid = use_sigmoid

        self.conv1 = self.features = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=in_channels, out_channels=4, kernel_size=4, stride=2, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )

        self.conv2 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=4, out_channels=8, kernel_size=4, stride=2, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )

        self.conv3 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=8, out_channels=16, kernel_size=4, stride=2, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )

        self.conv4 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=16, out_channels=16, kernel_size=4, stride=1, padding=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.LeakyReLU(0.2, inplace=True),
        )

        self.conv5 = nn.Sequential(
            spectral_norm(nn.Conv2d(in_channels=16, out_channels=1, kernel_size=4, stride=1, padding=1, bias=not use_spectral_norm), use_spectral_norm),
        )

        if init_weights:
            self.init_weights()

    def forward(self, x):
        conv1 = self.conv1(x)
        conv2 = self.conv2(conv1)
        conv3 = self.conv3(conv2)
        conv4 = self.conv4(conv3)
        conv5 = self.conv5(conv4)

        outputs = conv5
        if self.use_sigmoid:
            outputs = torch.sigmoid(conv5)

        return outputs, [conv1, conv2, conv3, conv4, conv5]


class ResnetBlock(nn.Module):
    def __init__(self, dim, dilation=1, use_spectral_norm=False):
        super(ResnetBlock, self).__init__()
        self.conv_block = nn.Sequential(
            nn.ReflectionPad2d(dilation),
            spectral_norm(nn.Conv2d(in_channels=dim, out_channels=dim, kernel_size=3, padding=0, dilation=dilation, bias=not use_spectral_norm), use_spectral_norm),
            nn.InstanceNorm2d(dim, track_running_stats=False),
            nn.ReLU(True),

            nn.ReflectionPad2d(1),
            spectral_norm(nn.Conv2d(in_channels=dim, out_channels=dim, kernel_size=3, padding=0, dilation=1, bias=not use_spectral_norm), use_spectral_norm),
            nn.InstanceNorm2d(dim, track_running_stats=False),
        )

    def forward(self, x):
        out = x + self.conv_block(x)

        # Remove ReLU at the end of the residual block
        # http://torch.ch/blog/2016/02/04/resnets.html

        return out


def spectral_norm(module, mode=True):
    if mode:
        return nn.utils.spectral_norm(module)

    return module


# ---------------------------------------------------------------- src/loss.py, src/metrics.py

class AdversarialLoss(nn.Module):
    def __init__(self, type='nsgan', target_real_label=1.0, target_fake_label=0.0):
        super(AdversarialLoss, self).__init__()

        self.type = type
        self.register_buffer('real_label', torch.tensor(target_real_label))
        self.register_buffer('fake_label', torch.tensor(target_fake_label))

        if type == 'nsgan':
            self.criterion = nn.BCELoss()

        elif type == 'lsgan':
            self.criterion = nn.MSELoss()

        elif type == 'hinge':
            self.criterion = nn.ReLU()

    def __call__(self, outputs, is_real, is_disc=None):
        if self.type == 'hinge':
            if is_disc:
                if is_real:
                    outputs = -outputs
                return self.criterion(1 + outputs).mean()
            else:
                return (-outputs).mean()

        else:
            labels = (self.real_label if is_real else self.fake_label).expand_as(outputs)
            loss = self.criterion(outputs, labels)
            return loss


class EdgeAccuracy(nn.Module):
    def __init__(self, threshold=0.5):
        super(EdgeAccuracy, self).__init__()
        self.threshold = threshold

    def __call__(self, inputs, outputs):
        labels = (inputs > self.threshold)
        outputs = (outputs > self.threshold)

        relevant = torch.sum(labels.float())
        selected = torch.sum(outputs.float())

        if relevant == 0 and selected == 0:
            return torch.tensor(1), torch.tensor(1)

        true_positive = ((outputs == labels) * labels).float()
        recall = torch.sum(true_positive) / (relevant + 1e-8)
        precision = torch.sum(true_positive) / (selected + 1e-8)

        return precision, recall


# ---------------------------------------------------------------- src/models.py

class BaseModel(nn.Module):
    def __init__(self, name, config):
        super(BaseModel, self).__init__()

        self.name = name
        self.config = config
        self.iteration = 0


class EdgeModel(BaseModel):
    def __init__(self, config):
        super(EdgeModel, self).__init__('EdgeModel', config)

        # generator input: [grayscale(1) + edge(1) + mask(1)]
        # discriminator input: (grayscale(1) + edge(1))
        generator = EdgeGenerator(use_spectral_norm=True)
        discriminator = Discriminator(in_channels=2, use_sigmoid=config.GAN_LOSS != 'hinge')
        l1_loss = nn.L1Loss()
        adversarial_loss = AdversarialLoss(type=config.GAN_LOSS)

        self.add_module('generator', generator)
        self.add_module('discriminator', discriminator)

        self.add_module('l1_loss', l1_loss)
        self.add_module('adversarial_loss', adversarial_loss)

        self.gen_optimizer = optim.Adam(
            params=generator.parameters(),
            lr=float(config.LR),
            betas=(config.BETA1, config.BETA2)
        )

        self.dis_optimizer = optim.Adam(
            params=discriminator.parameters(),
            lr=float(config.LR) * float(config.D2G_LR),
            betas=(config.BETA1, config.BETA2)
        )

    def process(self, images, edges, masks):
        self.iteration += 1

        # zero optimizers
        self.gen_optimizer.zero_grad()
        self.dis_optimizer.zero_grad()

        # process outputs
        outputs = self(images, edges, masks)
        gen_loss = 0
        dis_loss = 0

        # discriminator loss
        dis_input_real = torch.cat((images, edges), dim=1)
        dis_input_fake = torch.cat((images, outputs.detach()), dim=1)
        dis_real, dis_real_feat = self.discriminator(dis_input_real)        # in: (grayscale(1) + edge(1))
        dis_fake, dis_fake_feat = self.discriminator(dis_input_fake)        # in: (grayscale(1) + edge(1))
        dis_real_loss = self.adversarial_loss(dis_real, True, True)
        dis_fake_loss = self.adversarial_loss(dis_fake, False, True)
        dis_loss += (dis_real_loss + dis_fake_loss) / 2

        # generator adversarial loss
        gen_input_fake = torch.cat((images, outputs), dim=1)
        gen_fake, gen_fake_feat = self.discriminator(gen_input_fake)        # in: (grayscale(1) + edge(1))
        gen_gan_loss = self.adversarial_loss(gen_fake, True, False)
        gen_loss += gen_gan_loss

        # generator feature matching loss
        gen_fm_loss = 0
        for i in range(len(dis_real_feat)):
            gen_fm_loss += self.l1_loss(gen_fake_feat[i], dis_real_feat[i].detach())
        gen_fm_loss = gen_fm_loss * self.config.FM_LOSS_WEIGHT
        gen_loss += gen_fm_loss

        # create logs
        logs = [
            ("l_d1", dis_loss.item()),
            ("l_g1", gen_gan_loss.item()),
            ("l_fm", gen_fm_loss.item()),
        ]

        return outputs, gen_loss, dis_loss, logs

    def forward(self, images, edges, masks):
        edges_masked = (edges * (1 - masks))
        images_masked = (images * (1 - masks)) + masks
        inputs = torch.cat((images_masked, edges_masked, masks), dim=1)
        outputs = self.generator(inputs)                                    # in: [grayscale(1) + edge(1) + mask(1)]
        return outputs

    def backward(self, gen_loss=None, dis_loss=None):
        if dis_loss is not None:
            dis_loss.backward()  # @dis_backward
        self.dis_optimizer.step()  # @dis_step

        if gen_loss is not None:
            gen_loss.backward()  # @gen_backward
        self.gen_optimizer.step()  # @gen_step


# ---------------------------------------------------------------- the loop (src/edge_connect.py, MODEL == 1)

def build() -> dict:
    torch.manual_seed(0)
    config = SimpleNamespace(LR=0.0001, D2G_LR=0.1, BETA1=0.0, BETA2=0.9, GAN_LOSS='nsgan', FM_LOSS_WEIGHT=10,
                             EDGE_THRESHOLD=0.5, MAX_ITERS=2e6)
    edge_model = EdgeModel(config)
    items = []
    for _ in range(ITERATIONS + 1):
        images_gray = torch.rand(2, 1, 32, 32)
        edges = (torch.rand(2, 1, 32, 32) > 0.8).float()
        masks = torch.zeros(2, 1, 32, 32)
        masks[:, :, 8:24, 8:24] = 1
        items.append((images_gray, edges, masks))
    return {
        "edge_model": edge_model,
        "edgeacc": EdgeAccuracy(config.EDGE_THRESHOLD),
        "config": config,
        "items": items,
        "batch": 0,
    }


def iteration(state: dict) -> None:
    edge_model, edgeacc = state["edge_model"], state["edgeacc"]
    max_iteration = int(float((state["config"].MAX_ITERS)))
    images_gray, edges, masks = state["items"][state["batch"]]
    state["batch"] += 1

    edge_model.train()

    # train
    outputs, gen_loss, dis_loss, logs = edge_model.process(images_gray, edges, masks)

    # metrics
    precision, recall = edgeacc(edges * masks, outputs * masks)
    logs.append(('precision', precision.item()))
    logs.append(('recall', recall.item()))

    # backward
    edge_model.backward(gen_loss, dis_loss)
    iteration = edge_model.iteration

    if iteration >= max_iteration:
        return


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
