"""Neural style transfer with LBFGS: the image optimised in place, every loss module backwarded with a retain.

Source: the PyTorch tutorial "Neural Transfer with PyTorch" by Alexis Jacq as published for PyTorch 0.3
(pytorch/tutorials advanced_source/neural_style_tutorial.py, as kept in apachecn/pytorch-doc-zh
docs/0.3/neural_style_tutorial.md): ContentLoss/StyleLoss modules whose own `backward(retain_graph=True)`
calls `self.loss.backward(retain_graph=retain_graph)`, get_style_model_and_losses, get_input_param_optimizer
(nn.Parameter(input_img.data), optim.LBFGS([input_param])) and run_style_transfer's closure. Retyped at
CPU size: a random five-conv network in VGG's layer order (ReLU(inplace=True), max pooling) instead of
pretrained VGG19, 3x16x16 images, one LBFGS step of 3 closure calls (max_iter=3; the tutorial keeps the
default 20). `.data[0]` reads are
written `.item()`; the published `while run[0] <= num_steps:` bounds the same loop by closure count.
"""

import copy
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 1

TRUTH = {
    "error": None,
    "retains": {
        "@content_backward": {"verdict": "can go", "runs": 3, "needed_runs": 0},
        "@style_backward": {"verdict": "needed", "runs": 15, "needed_runs": 15},
    },
    "carried": [],
    "notes": [],
    "modifies_in_place": ["input_param"],
}


class ContentLoss(nn.Module):
    def __init__(self, target: torch.Tensor, weight: float) -> None:
        super().__init__()
        self.target = target.detach() * weight
        self.weight = weight
        self.criterion = nn.MSELoss()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.loss = self.criterion(input * self.weight, self.target)
        self.output = input
        return self.output

    def backward(self, retain_graph=True):
        self.loss.backward(retain_graph=retain_graph)  # @content_backward
        return self.loss


class GramMatrix(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        a, b, c, d = input.size()
        features = input.view(a * b, c * d)
        G = torch.mm(features, features.t())
        return G.div(a * b * c * d)


class StyleLoss(nn.Module):
    def __init__(self, target: torch.Tensor, weight: float) -> None:
        super().__init__()
        self.target = target.detach() * weight
        self.weight = weight
        self.gram = GramMatrix()
        self.criterion = nn.MSELoss()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.output = input.clone()
        self.G = self.gram(input)
        self.G.mul_(self.weight)
        self.loss = self.criterion(self.G, self.target)
        return self.output

    def backward(self, retain_graph=True):
        self.loss.backward(retain_graph=retain_graph)  # @style_backward
        return self.loss


content_layers_default = ["conv_4"]
style_layers_default = ["conv_1", "conv_2", "conv_3", "conv_4", "conv_5"]


def get_style_model_and_losses(cnn, style_img, content_img, style_weight=1000, content_weight=1,
                               content_layers=content_layers_default, style_layers=style_layers_default):
    cnn = copy.deepcopy(cnn)
    content_losses = []
    style_losses = []
    model = nn.Sequential()
    gram = GramMatrix()

    i = 1
    for layer in list(cnn):
        if isinstance(layer, nn.Conv2d):
            name = "conv_" + str(i)
            model.add_module(name, layer)
            if name in content_layers:
                target = model(content_img).clone()
                content_loss = ContentLoss(target, content_weight)
                model.add_module("content_loss_" + str(i), content_loss)
                content_losses.append(content_loss)
            if name in style_layers:
                target_feature = model(style_img).clone()
                target_feature_gram = gram(target_feature)
                style_loss = StyleLoss(target_feature_gram, style_weight)
                model.add_module("style_loss_" + str(i), style_loss)
                style_losses.append(style_loss)
        if isinstance(layer, nn.ReLU):
            name = "relu_" + str(i)
            model.add_module(name, layer)
            i += 1
        if isinstance(layer, nn.MaxPool2d):
            name = "pool_" + str(i)
            model.add_module(name, layer)
    return model, style_losses, content_losses


def get_input_param_optimizer(input_img):
    input_param = nn.Parameter(input_img.data)
    optimizer = optim.LBFGS([input_param], max_iter=3)
    return input_param, optimizer


def build() -> dict:
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(inplace=True),
    )
    style_img = torch.rand(1, 3, 16, 16)
    content_img = torch.rand(1, 3, 16, 16)
    input_img = content_img.clone()
    model, style_losses, content_losses = get_style_model_and_losses(cnn, style_img, content_img)
    input_param, optimizer = get_input_param_optimizer(input_img)
    return {
        "model": model,
        "style_losses": style_losses,
        "content_losses": content_losses,
        "input_param": input_param,
        "optimizer": optimizer,
        "run": [0],
    }


def iteration(state: dict) -> None:
    model, optimizer, input_param = state["model"], state["optimizer"], state["input_param"]
    style_losses, content_losses, run = state["style_losses"], state["content_losses"], state["run"]

    def closure():
        input_param.data.clamp_(0, 1)
        optimizer.zero_grad()
        model(input_param)
        style_score = 0
        content_score = 0
        for sl in style_losses:
            style_score += sl.backward()
        for cl in content_losses:
            content_score += cl.backward()
        run[0] += 1
        if run[0] % 50 == 0:
            print("run {}:".format(run))
            print("Style Loss : {:4f} Content Loss: {:4f}".format(style_score.item(), content_score.item()))
        return style_score + content_score

    optimizer.step(closure)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)
    state["input_param"].data.clamp_(0, 1)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
