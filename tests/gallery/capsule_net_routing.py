"""A capsule network with dynamic routing between capsules, trained on margin loss plus a small reconstruction loss
through torchnet's `Engine.train` closure.

Source: gram-ai/capsule-networks, capsule_network.py (commit 0aae01117626ea534c394ef2e1e2187874310ca3): `softmax`
over a dimension, `CapsuleLayer` (`route_logits` a Parameter, `route_weights`; `priors = x[None, :, :, None, :] @
self.route_weights[:, None, :, :, :]`, three routing iterations `probs = softmax(logits, dim=2)`, `outputs =
self.squash((probs * priors).sum(dim=2, keepdim=True))`, `logits = logits + delta_logits` but on the last;
primary capsules as a list of convolutions, squashed), `CapsuleNet.forward` (conv1 + ReLU, primary and digit
capsules, `classes = F.softmax(classes)`, the capsule of the label picked for the decoder), `CapsuleLoss` (margin
loss + 0.0005 * MSE reconstruction), `processor(sample)` (one-hot labels by `torch.eye(NUM_CLASSES).index_select`,
`classes, reconstructions = model(data, labels)`, `loss = capsule_loss(...)`), Adam; the loop is torchnet's
`Engine.train` (torchnet/engine/engine.py: per sample, `def closure(): loss, output = state['network'](state['sample'])
... loss.backward() ... return loss`, `state['optimizer'].zero_grad()`, `state['optimizer'].step(closure)`), retyped
inline. Retyped at CPU size: images 1x12x12 (published 28x28), conv1 1->16 kernel 5 (1->256 kernel 9), 8 primary
capsules of 4 channels kernel 3 stride 2 (32, kernel 9), so 4*3*3 = 36 route nodes (32*6*6), 4 classes of 8
dimensions (10 of 16), decoder 8->16->32->144 (16->512->1024->784), batches of 4 made-up images and labels;
`Variable` and `.cuda()` dropped, `index.data[0]` (a 0-dim tensor's `[0]`, which raises since PyTorch 0.4) read as
`index`, `size_average=True` as the default `reduction="mean"`, the reconstruction loss's `images` flattened to the
reconstructions' shape (PyTorch 0.3 compared them element by element; today the shapes do not broadcast), the implicit
`dim` of `F.softmax` written out (the dimension PyTorch picks for those 2-D inputs); the meters, Visdom loggers and the test pass left out.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 4
NUM_CLASSES = 4
NUM_ROUTING_ITERATIONS = 3
ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def softmax(input, dim=1):
    transposed_input = input.transpose(dim, len(input.size()) - 1)
    softmaxed_output = F.softmax(transposed_input.contiguous().view(-1, transposed_input.size(-1)), dim=-1)
    return softmaxed_output.view(*transposed_input.size()).transpose(dim, len(input.size()) - 1)


class CapsuleLayer(nn.Module):
    def __init__(
        self,
        num_capsules,
        num_route_nodes,
        in_channels,
        out_channels,
        kernel_size=None,
        stride=None,
        num_iterations=NUM_ROUTING_ITERATIONS,
    ):
        super(CapsuleLayer, self).__init__()

        self.num_route_nodes = num_route_nodes
        self.num_iterations = num_iterations

        self.num_capsules = num_capsules

        if num_route_nodes != -1:
            self.route_logits = nn.Parameter(torch.zeros(num_capsules, 1, num_route_nodes, 1, 1))
            self.route_weights = nn.Parameter(torch.randn(num_capsules, num_route_nodes, in_channels, out_channels))
        else:
            self.capsules = nn.ModuleList(
                [
                    nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride, padding=0)
                    for _ in range(num_capsules)
                ]
            )

    def squash(self, tensor, dim=-1):
        squared_norm = (tensor**2).sum(dim=dim, keepdim=True)
        scale = squared_norm / (1 + squared_norm)
        return scale * tensor / torch.sqrt(squared_norm)

    def forward(self, x):
        if self.num_route_nodes != -1:
            priors = x[None, :, :, None, :] @ self.route_weights[:, None, :, :, :]

            logits = self.route_logits
            for i in range(self.num_iterations):
                probs = softmax(logits, dim=2)
                outputs = self.squash((probs * priors).sum(dim=2, keepdim=True))

                if i != self.num_iterations - 1:
                    delta_logits = (priors * outputs).sum(dim=-1, keepdim=True)
                    logits = logits + delta_logits
        else:
            outputs = [capsule(x).view(x.size(0), -1, 1) for capsule in self.capsules]
            outputs = torch.cat(outputs, dim=-1)
            outputs = self.squash(outputs)

        return outputs


class CapsuleNet(nn.Module):
    def __init__(self):
        super(CapsuleNet, self).__init__()

        self.conv1 = nn.Conv2d(in_channels=1, out_channels=16, kernel_size=5, stride=1)
        self.primary_capsules = CapsuleLayer(
            num_capsules=8, num_route_nodes=-1, in_channels=16, out_channels=4, kernel_size=3, stride=2
        )
        self.digit_capsules = CapsuleLayer(
            num_capsules=NUM_CLASSES, num_route_nodes=4 * 3 * 3, in_channels=8, out_channels=8
        )

        self.decoder = nn.Sequential(
            nn.Linear(8, 16),
            nn.ReLU(inplace=True),
            nn.Linear(16, 32),
            nn.ReLU(inplace=True),
            nn.Linear(32, 144),
            nn.Sigmoid(),
        )

    def forward(self, x, y=None):
        x = F.relu(self.conv1(x), inplace=True)
        x = self.primary_capsules(x)
        x = self.digit_capsules(x).squeeze().transpose(0, 1)

        classes = (x**2).sum(dim=-1) ** 0.5
        classes = F.softmax(classes, dim=1)

        if y is None:
            # In all batches, get the most active capsule.
            _, max_length_indices = classes.max(dim=1)
        else:
            # If labels are provided, get the capsule which should have been activated.
            _, max_length_indices = y.max(dim=1)

        vectors = []
        for batch, index in enumerate(max_length_indices):
            vectors.append(x[batch, index, :])
        reconstructions = self.decoder(torch.stack(vectors, dim=0))

        return classes, reconstructions


class CapsuleLoss(nn.Module):
    def __init__(self):
        super(CapsuleLoss, self).__init__()
        self.reconstruction_loss = nn.MSELoss()

    def forward(self, images, labels, classes, reconstructions):
        left = torch.clamp(0.9 - classes, min=0) ** 2
        right = torch.clamp(classes - 0.1, min=0) ** 2

        margin_loss = labels * left + 0.5 * (1 - labels) * right
        margin_loss = margin_loss.sum(dim=1).mean()

        reconstruction_loss = self.reconstruction_loss(reconstructions, images.view(images.size(0), -1))
        return margin_loss + 0.0005 * reconstruction_loss


def build() -> dict:
    torch.manual_seed(0)
    model = CapsuleNet()
    optimizer = torch.optim.Adam(model.parameters())
    capsule_loss = CapsuleLoss()
    iterator = [
        (torch.randint(0, 256, (BATCH_SIZE, 12, 12), dtype=torch.uint8), torch.randint(0, NUM_CLASSES, (BATCH_SIZE,)))
        for _ in range(ITERATIONS)
    ]

    def processor(sample):
        data = sample[0].unsqueeze(1).float() / 255.0
        labels = torch.LongTensor(sample[1])

        labels = torch.eye(NUM_CLASSES).index_select(dim=0, index=labels)

        classes, reconstructions = model(data, labels)

        loss = capsule_loss(data, labels, classes, reconstructions)

        return loss, classes

    state = {"network": processor, "iterator": iterator, "optimizer": optimizer, "model": model, "t": 0}
    return state


def iteration(state: dict) -> None:
    """One sample of torchnet's Engine.train."""
    state["sample"] = state["iterator"][state["t"] % len(state["iterator"])]

    def closure():
        loss, output = state["network"](state["sample"])
        state["output"] = output
        state["loss"] = loss
        loss.backward()  # @backward
        state["output"] = None
        state["loss"] = None
        return loss

    state["optimizer"].zero_grad()
    state["optimizer"].step(closure)
    state["t"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for sample in state["iterator"][:iterations]:
        state["sample"] = sample

        def closure():
            loss, output = state["network"](state["sample"])
            state["output"] = output
            state["loss"] = loss
            loss.backward()
            state["output"] = None
            state["loss"] = None
            return loss

        state["optimizer"].zero_grad()
        state["optimizer"].step(closure)
        state["t"] += 1


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
