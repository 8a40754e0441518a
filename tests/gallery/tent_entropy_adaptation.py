"""TENT: test-time adaptation of batch-norm affine parameters by entropy minimisation, on every forward.

Source: DequanWang/tent, tent.py (commit 7d236b42a3020f488a75d041f31a3f4ef4a521ea): Tent (steps, episodic),
softmax_entropy, forward_and_adapt under `@torch.enable_grad()` (forward, entropy, backward, step, zero_grad, return
the outputs), collect_params, copy_model_and_optimizer, configure_model (train mode, requires_grad_(False) except
the BatchNorm2d layers, batch statistics forced: `track_running_stats = False`, running stats None), and the driver
cifar10c.py (same commit: `tent_model.reset()` per corruption, then robustbench's `clean_accuracy`, which runs the
model on each batch under `torch.no_grad()` and counts correct predictions). The published model keeps its adapted
parameters from batch to batch (continual adaptation; the outputs each step returns still hold that step's graph,
freed by its backward). Retyped at CPU size: a 2-conv BatchNorm2d CNN on 3x8x8 images in place of a robustbench
WideResNet-28 (no download), 4 batches of 8 made-up images, Adam lr 1e-3 betas (0.9, 0.999) as cfgs; the
`torch.jit.script` decorator on softmax_entropy dropped (same function); `no_grad` entered per batch.
"""

from collections.abc import Callable
from copy import deepcopy

import torch
import torch.nn as nn

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Tent(nn.Module):
    """Tent adapts a model by entropy minimization during testing."""
    def __init__(self, model, optimizer, steps=1, episodic=False):
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.steps = steps
        assert steps > 0, "tent requires >= 1 step(s) to forward and update"
        self.episodic = episodic
        self.model_state, self.optimizer_state = \
            copy_model_and_optimizer(self.model, self.optimizer)

    def forward(self, x):
        if self.episodic:
            self.reset()

        for _ in range(self.steps):
            outputs = forward_and_adapt(x, self.model, self.optimizer)

        return outputs

    def reset(self):
        if self.model_state is None or self.optimizer_state is None:
            raise Exception("cannot reset without saved model/optimizer state")
        load_model_and_optimizer(self.model, self.optimizer,
                                 self.model_state, self.optimizer_state)


def softmax_entropy(x: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax distribution from logits."""
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


@torch.enable_grad()  # ensure grads in possible no grad context for testing
def forward_and_adapt(x, model, optimizer):
    # forward
    outputs = model(x)  # @outputs
    # adapt
    loss = softmax_entropy(outputs).mean(0)
    loss.backward()  # @backward
    optimizer.step()
    optimizer.zero_grad()
    return outputs


def collect_params(model):
    params = []
    names = []
    for nm, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            for np, p in m.named_parameters():
                if np in ['weight', 'bias']:  # weight is scale, bias is shift
                    params.append(p)
                    names.append(f"{nm}.{np}")
    return params, names


def copy_model_and_optimizer(model, optimizer):
    model_state = deepcopy(model.state_dict())
    optimizer_state = deepcopy(optimizer.state_dict())
    return model_state, optimizer_state


def load_model_and_optimizer(model, optimizer, model_state, optimizer_state):
    model.load_state_dict(model_state, strict=True)
    optimizer.load_state_dict(optimizer_state)


def configure_model(model):
    model.train()
    model.requires_grad_(False)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.requires_grad_(True)
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
    return model


def build() -> dict:
    torch.manual_seed(1)
    base_model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    base_model = configure_model(base_model)
    params, param_names = collect_params(base_model)
    optimizer = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    tent_model = Tent(base_model, optimizer, steps=1, episodic=False)
    x_test = torch.randn(32, 3, 8, 8)
    y_test = torch.randint(0, 10, (32,))
    tent_model.reset()
    return {"model": tent_model, "base_model": base_model, "optimizer": optimizer, "x_test": x_test,
            "y_test": y_test, "batch_size": 8, "counter": 0, "acc": 0.}


def iteration(state: dict) -> None:
    model, x, y, batch_size, counter = (
        state["model"], state["x_test"], state["y_test"], state["batch_size"], state["counter"])
    with torch.no_grad():
        x_curr = x[counter * batch_size:(counter + 1) * batch_size]
        y_curr = y[counter * batch_size:(counter + 1) * batch_size]
        output = model(x_curr)
        state["acc"] += (output.max(1)[1] == y_curr).float().sum()
    state["counter"] = (counter + 1) % (x.shape[0] // batch_size)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
