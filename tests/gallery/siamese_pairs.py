"""pytorch/examples' Siamese network: one feature extractor run on both images of a pair, BCE on their match.

Source: pytorch/examples, siamese_network/main.py (commit f62b4aec7bff832fc65b59aa62d60e94ddd6b39e). As published:
SiameseNetwork (a feature extractor whose children end at the average pool, `forward_once` run on input1 and on
input2 with the same weights, `torch.cat((output1, output2), 1)`, fc = Linear, ReLU(inplace=True), Linear, then a
sigmoid; xavier_uniform_ weights and 0.01 biases on the Linear layers), APP_MATCHER's pairs (an even index pairs two
different images of one class, target 1; an odd index pairs two classes, target 0; images `.clone().float()`, not
scaled), Adadelta(lr=1.0), StepLR(step_size=1, gamma=0.7) per epoch, and train()'s batch loop:
optimizer.zero_grad(), `outputs = model(images_1, images_2).squeeze()`, BCELoss, loss.backward(),
optimizer.step(), the log_interval print of loss.item(). Retyped at CPU size: the published extractor is
torchvision's resnet18 (conv1 replaced by a 1-channel 7x7 stride-2 conv, the fc removed); here the same opening
(1-channel 7x7 stride-2 conv1, BatchNorm2d, ReLU(inplace=True), MaxPool2d(3, 2, 1)), one 3x3 conv with BatchNorm2d
and ReLU for the residual stages, and AdaptiveAvgPool2d(1), 8 channels (published 512), torch only; the fc's 256
hidden -> 16; made-up 28x28 images in [0, 255] with 10 classes (20 per class) for MNIST; batch size 4
(published 64); 3 batches; test() left out.
"""

import random
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

ITERATIONS = 3
BATCH_SIZE = 4
CHANNELS = 8
LOG_INTERVAL = 10

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def tiny_resnet_trunk():
    """resnet18's children up to its average pool, at CPU size (see the docstring)."""
    return torch.nn.Sequential(
        nn.Conv2d(1, CHANNELS, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False),
        nn.BatchNorm2d(CHANNELS),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        nn.Conv2d(CHANNELS, CHANNELS, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(CHANNELS),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d((1, 1)),
    )


class SiameseNetwork(nn.Module):
    def __init__(self):
        super(SiameseNetwork, self).__init__()
        self.resnet = tiny_resnet_trunk()
        self.fc_in_features = CHANNELS

        # add linear layers to compare between the features of the two images
        self.fc = nn.Sequential(
            nn.Linear(self.fc_in_features * 2, 16),
            nn.ReLU(inplace=True),
            nn.Linear(16, 1),
        )

        self.sigmoid = nn.Sigmoid()

        # initialize the weights
        self.resnet.apply(self.init_weights)
        self.fc.apply(self.init_weights)

    def init_weights(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x):
        output = self.resnet(x)
        output = output.view(output.size()[0], -1)
        return output

    def forward(self, input1, input2):
        # get two images' features
        output1 = self.forward_once(input1)
        output2 = self.forward_once(input2)

        # concatenate both images' features
        output = torch.cat((output1, output2), 1)

        # pass the concatenation to the linear layers
        output = self.fc(output)

        # pass the out of the linear layers to sigmoid layer
        output = self.sigmoid(output)

        return output


class APP_MATCHER:
    """The published Dataset's pairing, over made-up images (torch.utils.data.Dataset left out)."""

    def __init__(self):
        self.data = (torch.rand(200, 28, 28) * 255).floor().unsqueeze(1).clone()
        self.targets = torch.arange(200) % 10
        self.group_examples()

    def group_examples(self):
        np_arr = np.array(self.targets.clone())
        self.grouped_examples = {}
        for i in range(0, 10):  # noqa: PIE808 (as published)
            self.grouped_examples[i] = np.where((np_arr == i))[0]

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, index):
        selected_class = random.randint(0, 9)
        random_index_1 = random.randint(0, self.grouped_examples[selected_class].shape[0]-1)
        index_1 = self.grouped_examples[selected_class][random_index_1]
        image_1 = self.data[index_1].clone().float()
        if index % 2 == 0:
            random_index_2 = random.randint(0, self.grouped_examples[selected_class].shape[0]-1)
            while random_index_2 == random_index_1:
                random_index_2 = random.randint(0, self.grouped_examples[selected_class].shape[0]-1)
            index_2 = self.grouped_examples[selected_class][random_index_2]
            image_2 = self.data[index_2].clone().float()
            target = torch.tensor(1, dtype=torch.float)
        else:
            other_selected_class = random.randint(0, 9)
            while other_selected_class == selected_class:
                other_selected_class = random.randint(0, 9)
            random_index_2 = random.randint(0, self.grouped_examples[other_selected_class].shape[0]-1)
            index_2 = self.grouped_examples[other_selected_class][random_index_2]
            image_2 = self.data[index_2].clone().float()
            target = torch.tensor(0, dtype=torch.float)
        return image_1, image_2, target


def build() -> dict:
    random.seed(1)
    torch.manual_seed(1)
    dataset = APP_MATCHER()
    train_loader = []
    for b in range(ITERATIONS):
        items = [dataset[b * BATCH_SIZE + k] for k in range(BATCH_SIZE)]
        train_loader.append(tuple(torch.stack(column) for column in zip(*items)))
    model = SiameseNetwork()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    model.train()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "train_loader": train_loader,
            "criterion": nn.BCELoss(), "batch_idx": 0}


def iteration(state: dict) -> None:
    model, optimizer, criterion = state["model"], state["optimizer"], state["criterion"]
    device = torch.device("cpu")
    batch_idx = state["batch_idx"]
    images_1, images_2, targets = state["train_loader"][batch_idx % len(state["train_loader"])]
    state["batch_idx"] += 1
    images_1, images_2, targets = images_1.to(device), images_2.to(device), targets.to(device)
    optimizer.zero_grad()
    outputs = model(images_1, images_2).squeeze()
    loss = criterion(outputs, targets)
    loss.backward()  # @backward
    optimizer.step()
    if batch_idx % LOG_INTERVAL == 0:
        _ = loss.item()  # the published print


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
