"""Sharpness-aware minimisation: two forward-backward passes per batch, the weights moved in place in between.

Source: davda54/sam, example/train.py (commit 020e2ead7aed5e0313b9c344f20afec9b1ea5a92) and sam.py (commit
03c7768ab858df85f4caae97b23de52d74e99d20), example/utility/bypass_bn.py and example/model/smooth_cross_entropy.py:
per batch `enable_running_stats(model)`, `predictions = model(inputs)`, `loss = smooth_crossentropy(predictions,
targets)`, `loss.mean().backward()`, `optimizer.first_step(zero_grad=True)` (under no_grad: `p.add_(e_w)`, climb to
w + e(w)), `disable_running_stats(model)`, a second full forward and `.mean().backward()`,
`optimizer.second_step(zero_grad=True)` (`p.sub_(e_w)`, then the base SGD step), then the accuracy from the first
forward's `predictions.data` and `loss.cpu()` for the log. SAM, the bypass_bn helpers and smooth_crossentropy as
published. Retyped at CPU size: a small conv net with BatchNorm (conv 3->8, BatchNorm2d, ReLU, pooling, linear to 10)
in place of WideResNet-16-8, batches of 4 made-up 3x8x8 images, CIFAR, Log and the lr schedule's printout left out; train.py's
`adaptive=args.adaptive` left out, since the sam.py above (before ASAM) passes it on to SGD, which refuses it
(the published StepLR sets the learning rate by epoch; one epoch here, so the rate stays at 0.1).
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"

        defaults = dict(rho=rho, **kwargs)
        super(SAM, self).__init__(params, defaults)

        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)

            for p in group["params"]:
                if p.grad is None: continue
                e_w = p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"
                self.state[p]["e_w"] = e_w

        if zero_grad: self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None: continue
                p.sub_(self.state[p]["e_w"])  # get back to "w" from "w + e(w)"

        self.base_optimizer.step()  # do the actual "sharpness-aware" update

        if zero_grad: self.zero_grad()

    def step(self, closure=None):
        raise NotImplementedError("SAM doesn't work like the other optimizers, you should first call `first_step` and the `second_step`; see the documentation for more info.")

    def _grad_norm(self):
        shared_device = self.param_groups[0]["params"][0].device  # put everything on the same device, in case of model parallelism
        norm = torch.norm(
                    torch.stack([
                        p.grad.norm(p=2).to(shared_device)
                        for group in self.param_groups for p in group["params"]
                        if p.grad is not None
                    ]),
                    p=2
               )
        return norm


def disable_running_stats(model):
    def _disable(module):
        if isinstance(module, _BatchNorm):
            module.backup_momentum = module.momentum
            module.momentum = 0

    model.apply(_disable)


def enable_running_stats(model):
    def _enable(module):
        if isinstance(module, _BatchNorm) and hasattr(module, "backup_momentum"):
            module.momentum = module.backup_momentum

    model.apply(_enable)


def smooth_crossentropy(pred, gold, smoothing=0.1):
    n_class = pred.size(1)

    one_hot = torch.full_like(pred, fill_value=smoothing / (n_class - 1))
    one_hot.scatter_(dim=1, index=gold.unsqueeze(1), value=1.0 - smoothing)
    log_prob = F.log_softmax(pred, dim=1)

    return F.kl_div(input=log_prob, target=one_hot, reduction='none').sum(-1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def build() -> dict:
    torch.manual_seed(42)
    model = Net()
    base_optimizer = torch.optim.SGD
    optimizer = SAM(model.parameters(), base_optimizer, rho=2.0, lr=0.1, momentum=0.9,
                    weight_decay=0.0005)
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(3)]
    model.train()
    return {"model": model, "optimizer": optimizer, "train": iter(batches), "log": []}


def iteration(state: dict) -> None:
    model, optimizer = state["model"], state["optimizer"]
    batch = next(state["train"])
    inputs, targets = (b.to("cpu") for b in batch)

    # first forward-backward step
    enable_running_stats(model)
    predictions = model(inputs)
    loss = smooth_crossentropy(predictions, targets)
    loss.mean().backward()
    optimizer.first_step(zero_grad=True)

    # second forward-backward step
    disable_running_stats(model)
    smooth_crossentropy(model(inputs), targets).mean().backward()
    optimizer.second_step(zero_grad=True)

    with torch.no_grad():
        correct = torch.argmax(predictions.data, 1) == targets
        state["log"].append((loss.cpu().mean().item(), correct.cpu().float().mean().item()))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
