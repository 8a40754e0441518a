"""DANN: one backward through a class head and a domain head behind a gradient reversal layer (a custom Function).

Source: fungtion/DANN, train/main.py (commit 55fecec97adcbaff15e3ed4bc33786cfdf4dae37) and models/model.py (commit
691672b90bf6071776b522bca2febba8b50edf90) with models/functions.py's ReverseLayerF (`forward(ctx, x, alpha)`:
`ctx.alpha = alpha`, `return x.view_as(x)`; `backward`: `grad_output.neg() * ctx.alpha`, None): CNNModel (feature,
class_classifier, domain_classifier, `ReverseLayerF.apply(feature, alpha)`), Adam lr 1e-3, NLLLoss for class and
domain; the epoch loop as published: `len_dataloader = min(...)`, iterators over both loaders, then while `i <
len_dataloader`: `p`, `alpha = 2. / (1. + np.exp(-10 * p)) - 1`, `my_net.zero_grad()`, the source batch copied
into `input_img` by `resize_as_(s_img).copy_(s_img)`, err_s_label and err_s_domain, the target batch likewise,
err_t_domain, `err = err_t_domain + err_s_domain + err_s_label`, `err.backward()`, `optimizer.step()`. Retyped at
CPU size (and for Python 3 and torch 2): `xrange` -> range, `iter.next()` -> next(iter), `Variable(...)` removed,
`.cuda()` dropped, the print statement, torch.save and test() left out; conv channels 64 and 50 become 4 and 5,
the heads' 100 units become 8; the heads' BatchNorm2d on flat (N, 100) features, which torch 2 refuses, becomes
BatchNorm1d; LogSoftmax's implicit dim written dim=1; batch_size 4 (published 128), MNIST and MNIST-M replaced by
two made-up loaders of 2 batches of 28x28 images (1 channel for the source, 3 for the target, labels 0..9); a
fixed seed in place of `random.randint(1, 10000)`; one epoch is an iteration.
"""

import random
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Function

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

cuda = False
lr = 1e-3
batch_size = 4
image_size = 28
n_epoch = 100


# ---------------------------------------------------------------- models/functions.py


class ReverseLayerF(Function):

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha

        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        output = grad_output.neg() * ctx.alpha

        return output, None


# ---------------------------------------------------------------- models/model.py


class CNNModel(nn.Module):

    def __init__(self):
        super(CNNModel, self).__init__()
        self.feature = nn.Sequential()
        self.feature.add_module('f_conv1', nn.Conv2d(3, 4, kernel_size=5))
        self.feature.add_module('f_bn1', nn.BatchNorm2d(4))
        self.feature.add_module('f_pool1', nn.MaxPool2d(2))
        self.feature.add_module('f_relu1', nn.ReLU(True))
        self.feature.add_module('f_conv2', nn.Conv2d(4, 5, kernel_size=5))
        self.feature.add_module('f_bn2', nn.BatchNorm2d(5))
        self.feature.add_module('f_drop1', nn.Dropout2d())
        self.feature.add_module('f_pool2', nn.MaxPool2d(2))
        self.feature.add_module('f_relu2', nn.ReLU(True))

        self.class_classifier = nn.Sequential()
        self.class_classifier.add_module('c_fc1', nn.Linear(5 * 4 * 4, 8))
        self.class_classifier.add_module('c_bn1', nn.BatchNorm1d(8))
        self.class_classifier.add_module('c_relu1', nn.ReLU(True))
        self.class_classifier.add_module('c_drop1', nn.Dropout2d())
        self.class_classifier.add_module('c_fc2', nn.Linear(8, 8))
        self.class_classifier.add_module('c_bn2', nn.BatchNorm1d(8))
        self.class_classifier.add_module('c_relu2', nn.ReLU(True))
        self.class_classifier.add_module('c_fc3', nn.Linear(8, 10))
        self.class_classifier.add_module('c_softmax', nn.LogSoftmax(dim=1))

        self.domain_classifier = nn.Sequential()
        self.domain_classifier.add_module('d_fc1', nn.Linear(5 * 4 * 4, 8))
        self.domain_classifier.add_module('d_bn1', nn.BatchNorm1d(8))
        self.domain_classifier.add_module('d_relu1', nn.ReLU(True))
        self.domain_classifier.add_module('d_fc2', nn.Linear(8, 2))
        self.domain_classifier.add_module('d_softmax', nn.LogSoftmax(dim=1))

    def forward(self, input_data, alpha):
        input_data = input_data.expand(input_data.data.shape[0], 3, 28, 28)
        feature = self.feature(input_data)
        feature = feature.view(-1, 5 * 4 * 4)
        reverse_feature = ReverseLayerF.apply(feature, alpha)
        class_output = self.class_classifier(feature)
        domain_output = self.domain_classifier(reverse_feature)

        return class_output, domain_output


# ---------------------------------------------------------------- train/main.py


def build() -> dict:
    manual_seed = 0
    random.seed(manual_seed)
    torch.manual_seed(manual_seed)

    # made-up MNIST (1 channel, in [-1, 1]) and MNIST-M (3 channels) batches
    dataloader_source = [(torch.rand(batch_size, 1, image_size, image_size) * 2 - 1, torch.randint(0, 10, (batch_size,)))
                         for _ in range(2)]
    dataloader_target = [(torch.rand(batch_size, 3, image_size, image_size) * 2 - 1, torch.randint(0, 10, (batch_size,)))
                         for _ in range(2)]

    # load model

    my_net = CNNModel()

    # setup optimizer

    optimizer = optim.Adam(my_net.parameters(), lr=lr)

    loss_class = torch.nn.NLLLoss()
    loss_domain = torch.nn.NLLLoss()

    for p in my_net.parameters():
        p.requires_grad = True

    return {"my_net": my_net, "optimizer": optimizer, "loss_class": loss_class, "loss_domain": loss_domain,
            "dataloader_source": dataloader_source, "dataloader_target": dataloader_target, "epoch": 0}


def train_epoch(epoch, my_net, optimizer, loss_class, loss_domain, dataloader_source, dataloader_target):
    len_dataloader = min(len(dataloader_source), len(dataloader_target))
    data_source_iter = iter(dataloader_source)
    data_target_iter = iter(dataloader_target)

    i = 0
    while i < len_dataloader:

        p = float(i + epoch * len_dataloader) / n_epoch / len_dataloader
        alpha = 2. / (1. + np.exp(-10 * p)) - 1

        # training model using source data
        data_source = next(data_source_iter)
        s_img, s_label = data_source

        my_net.zero_grad()
        batch_size = len(s_label)

        input_img = torch.FloatTensor(batch_size, 3, image_size, image_size)
        class_label = torch.LongTensor(batch_size)
        domain_label = torch.zeros(batch_size)
        domain_label = domain_label.long()

        input_img.resize_as_(s_img).copy_(s_img)
        class_label.resize_as_(s_label).copy_(s_label)
        inputv_img = input_img
        classv_label = class_label
        domainv_label = domain_label

        class_output, domain_output = my_net(input_data=inputv_img, alpha=alpha)
        err_s_label = loss_class(class_output, classv_label)
        err_s_domain = loss_domain(domain_output, domainv_label)

        # training model using target data
        data_target = next(data_target_iter)
        t_img, _ = data_target

        batch_size = len(t_img)

        input_img = torch.FloatTensor(batch_size, 3, image_size, image_size)
        domain_label = torch.ones(batch_size)
        domain_label = domain_label.long()

        input_img.resize_as_(t_img).copy_(t_img)
        inputv_img = input_img
        domainv_label = domain_label

        _, domain_output = my_net(input_data=inputv_img, alpha=alpha)
        err_t_domain = loss_domain(domain_output, domainv_label)
        err = err_t_domain + err_s_domain + err_s_label
        err.backward()  # @backward
        optimizer.step()

        i += 1


def iteration(state: dict) -> None:
    train_epoch(state["epoch"], state["my_net"], state["optimizer"], state["loss_class"], state["loss_domain"],
                state["dataloader_source"], state["dataloader_target"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        train_epoch(epoch, state["my_net"], state["optimizer"], state["loss_class"], state["loss_domain"],
                    state["dataloader_source"], state["dataloader_target"])


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
