"""VAE-GAN: three losses on one forward pass, each backwarded into its own optimizer in turn.

Source: lucabergamini/VAEGAN-PYTORCH, main.py ("THIS IS THE MOST IMPORTANT PART OF THE CODE"): one
`net(data_in)` forward, loss_encoder = kl + mse, loss_decoder = 1e-06 * mse - (bce_dis_original +
bce_dis_sampled), loss_discriminator = bce_dis_original + bce_dis_sampled, the train_dis / train_dec
switches on the discriminator's BCE against 0.33, then net.zero_grad(),
loss_encoder.backward(retain_graph=True), optimizer_encoder.step(), net.zero_grad(), `if train_dec:`
loss_decoder.backward(retain_graph=True), optimizer_decoder.step(), net.discriminator.zero_grad(),
`if train_dis:` loss_discriminator.backward(), optimizer_discriminator.step(). Retyped at CPU size:
network.py's conv encoder/decoder/discriminator become small MLPs on 8-pixel inputs with a 2-d latent,
keeping VaeGan's forward outputs (reconstruction, labels for original/predicted/sampled, the
discriminator's intermediate layer for original/predicted, mus, log-variances) and the loss terms of
VaeGan.loss; RMSprop(lr=0.0001) per sub-network as published, batch 4; `.data[0]` reads are `.item()`. At this size
the discriminator's BCE values stay above 0.33, so train_dec is False and the decoder branch never runs;
the discriminator's backward still walks the encoder (through torch.cat((ten, ten_dec, ten_sampled)))
and meets the weights optimizer_encoder.step() has just changed.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.optim import RMSprop

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@discriminator_backward"},
    "retains": {
        "@encoder_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1},
        "@decoder_backward": {"verdict": "can go", "runs": 0, "needed_runs": 0},
    },
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class VaeGan(nn.Module):
    def __init__(self, z_size=2):
        super().__init__()
        self.z_size = z_size
        self.encoder = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(True), nn.Linear(6, 2 * z_size))
        self.decoder = nn.Sequential(nn.Linear(z_size, 6), nn.BatchNorm1d(6), nn.ReLU(True), nn.Linear(6, 8), nn.Tanh())
        self.discriminator = nn.ModuleDict({
            "features": nn.Sequential(nn.Linear(8, 6), nn.ReLU(True)),
            "head": nn.Sequential(nn.Linear(6, 1), nn.Sigmoid()),
        })

    def forward(self, ten):
        encoded = self.encoder(ten)
        mus, log_variances = encoded[:, :self.z_size], encoded[:, self.z_size:]
        variances = torch.exp(log_variances * 0.5)
        ten_from_normal = Variable(torch.randn(len(ten), self.z_size), requires_grad=True)
        ten_enc = ten_from_normal * variances + mus
        ten_dec = self.decoder(ten_enc)
        ten_from_normal = Variable(torch.randn(len(ten), self.z_size), requires_grad=True)
        ten_sampled = self.decoder(ten_from_normal)
        layer = self.discriminator["features"](torch.cat((ten, ten_dec), 0))
        ten_class = self.discriminator["head"](self.discriminator["features"](torch.cat((ten, ten_dec, ten_sampled), 0)))
        return ten_dec, ten_class, layer, mus, log_variances

    @staticmethod
    def loss(ten_original, ten_predict, layer_original, layer_predicted, labels_original,
             labels_predicted, labels_sampled, mus, variances):
        nle = 0.5 * (ten_original.view(len(ten_original), -1) - ten_predict.view(len(ten_predict), -1)) ** 2
        kl = -0.5 * torch.sum(-variances.exp() - torch.pow(mus, 2) + variances + 1, 1)
        mse = torch.sum(0.5 * (layer_original - layer_predicted) ** 2, 1)
        bce_dis_original = -torch.log(labels_original + 1e-3)
        bce_dis_predicted = -torch.log(1 - labels_predicted + 1e-3)
        bce_dis_sampled = -torch.log(1 - labels_sampled + 1e-3)
        bce_gen_original = -torch.log(1 - labels_original + 1e-3)
        bce_gen_predicted = -torch.log(labels_predicted + 1e-3)
        bce_gen_sampled = -torch.log(labels_sampled + 1e-3)
        return (torch.mean(nle), torch.mean(kl), torch.mean(mse), torch.mean(bce_gen_predicted),
                torch.mean(bce_gen_sampled), torch.mean(bce_dis_original), torch.mean(bce_dis_predicted),
                torch.mean(bce_dis_sampled))


def build() -> dict:
    torch.manual_seed(2)
    net = VaeGan()
    return {
        "net": net,
        "optimizer_encoder": RMSprop(params=net.encoder.parameters(), lr=0.0001),
        "optimizer_decoder": RMSprop(params=net.decoder.parameters(), lr=0.0001),
        "optimizer_discriminator": RMSprop(params=net.discriminator.parameters(), lr=0.0001),
        "dataloader": [torch.rand(4, 8) * 2 - 1 for _ in range(ITERATIONS + 1)],
        "j": 0,
    }


def iteration(state: dict) -> None:
    net = state["net"]
    optimizer_encoder, optimizer_decoder = state["optimizer_encoder"], state["optimizer_decoder"]
    optimizer_discriminator = state["optimizer_discriminator"]
    data_batch = state["dataloader"][state["j"] % len(state["dataloader"])]
    state["j"] += 1
    net.train()
    data_target = Variable(data_batch, requires_grad=False).float()
    data_in = Variable(data_batch, requires_grad=True).float()
    out, out_labels, out_layer, mus, variances = net(data_in)
    out_layer_original = out_layer[:len(out_layer) // 2]
    out_layer_predicted = out_layer[len(out_layer) // 2:]
    out_labels_original = out_labels[:len(out_labels) // 3]
    out_labels_predicted = out_labels[len(out_labels) // 3:(len(out_labels) // 3) * 2]
    out_labels_sampled = out_labels[-len(out_labels) // 3:]
    nle_value, kl_value, mse_value, bce_gen_predicted_value, bce_gen_sampled_value, bce_dis_original_value, \
        bce_dis_predicted_value, bce_dis_sampled_value = VaeGan.loss(data_target, out, out_layer_original,
                                                                     out_layer_predicted, out_labels_original,
                                                                     out_labels_predicted, out_labels_sampled, mus,
                                                                     variances)
    loss_encoder = (kl_value + mse_value)
    loss_decoder = (1e-06 * mse_value - (bce_dis_original_value + bce_dis_sampled_value))
    loss_discriminator = (bce_dis_original_value + bce_dis_sampled_value)
    train_dis = True
    train_dec = True
    if bce_dis_original_value.item() < 0.33 or bce_dis_sampled_value.item() < 0.33:
        train_dis = False
    if bce_dis_original_value.item() > 0.33 or bce_dis_sampled_value.item() > 0.33:
        train_dec = False
    if train_dec is False and train_dis is False:
        train_dis = True
        train_dec = True

    net.zero_grad()
    loss_encoder.backward(retain_graph=True)  # @encoder_backward
    optimizer_encoder.step()
    net.zero_grad()
    if train_dec:
        loss_decoder.backward(retain_graph=True)  # @decoder_backward
        optimizer_decoder.step()
        net.discriminator.zero_grad()
    if train_dis:
        loss_discriminator.backward()  # @discriminator_backward
        optimizer_discriminator.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for j in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
