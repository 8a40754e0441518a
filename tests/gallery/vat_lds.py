"""Virtual adversarial training: a backward inside the loss, for the adversarial direction, before the step's own.

Source: lyakaap/VAT-pytorch, vat.py (commit b232ddcd6621c144f7c92d6e70233b1faa0930a6): VATLoss(xi, eps, ip) whose
forward(model, x) takes the prediction under no_grad, a random unit `d`, then `ip` times `d.requires_grad_()`,
`adv_distance.backward()`, `d = _l2_normalize(d.grad)`, `model.zero_grad()`, and returns the LDS at `x + d * eps`;
the loop of train_MNIST.py and the README (commit 215acee3614992ee1c46f788105b8e0b6e309838): `optimizer.zero_grad()`,
`lds = vat_loss(...)` ("LDS should be calculated before the forward for cross entropy"), `output = model(data)`,
`loss = cross_entropy(output, target) + args.alpha * lds`, `loss.backward()`, `optimizer.step()`. That
train_MNIST.py calls an older VATLoss (`VATLoss(model, xi=0.1, ...)`, `vat_loss(data)`); here the vat.py of the
commit above is called as its signature asks: `VATLoss(xi=0.1, eps=1.0, ip=1)`, `vat_loss(model, data)`. Retyped at
CPU size: train_MNIST's Net (conv, Dropout2d, dropout) on 1x16x16 made-up images (fc1 takes 20 features, published
320 from 28x28), batches of 4, SGD(lr=0.01, momentum=0.5); MNIST and the logging left out.
"""

import contextlib
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


@contextlib.contextmanager
def _disable_tracking_bn_stats(model):

    def switch_attr(m):
        if hasattr(m, 'track_running_stats'):
            m.track_running_stats ^= True

    model.apply(switch_attr)
    yield
    model.apply(switch_attr)


def _l2_normalize(d):
    d_reshaped = d.view(d.shape[0], -1, *(1 for _ in range(d.dim() - 2)))
    d /= torch.norm(d_reshaped, dim=1, keepdim=True) + 1e-8
    return d


class VATLoss(nn.Module):

    def __init__(self, xi=10.0, eps=1.0, ip=1):
        """VAT loss
        :param xi: hyperparameter of VAT (default: 10.0)
        :param eps: hyperparameter of VAT (default: 1.0)
        :param ip: iteration times of computing adv noise (default: 1)
        """
        super(VATLoss, self).__init__()
        self.xi = xi
        self.eps = eps
        self.ip = ip

    def forward(self, model, x):
        with torch.no_grad():
            pred = F.softmax(model(x), dim=1)

        # prepare random unit tensor
        d = torch.rand(x.shape).sub(0.5).to(x.device)
        d = _l2_normalize(d)

        with _disable_tracking_bn_stats(model):
            # calc adversarial direction
            for _ in range(self.ip):
                d.requires_grad_()
                pred_hat = model(x + self.xi * d)
                logp_hat = F.log_softmax(pred_hat, dim=1)
                adv_distance = F.kl_div(logp_hat, pred, reduction='batchmean')
                adv_distance.backward()  # @adv_backward
                d = _l2_normalize(d.grad)
                model.zero_grad()

            # calc LDS
            r_adv = d * self.eps
            pred_hat = model(x + r_adv)
            logp_hat = F.log_softmax(pred_hat, dim=1)
            lds = F.kl_div(logp_hat, pred, reduction='batchmean')

        return lds


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(20, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 20)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return x


class Args:
    alpha = 1.0
    log_interval = 10


def build() -> dict:
    torch.manual_seed(1)
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    batches = [(torch.randn(4, 1, 16, 16), torch.randint(0, 10, (4,))) for _ in range(3)]
    model.train()
    return {"model": model, "optimizer": optimizer, "train_loader": iter(enumerate(batches)), "args": Args(),
            "log": []}


def iteration(state: dict) -> None:
    model, optimizer, args = state["model"], state["optimizer"], state["args"]
    batch_idx, (data, target) = next(state["train_loader"])
    data, target = data.to("cpu"), target.to("cpu")
    optimizer.zero_grad()

    vat_loss = VATLoss(xi=0.1, eps=1.0, ip=1)
    cross_entropy = nn.CrossEntropyLoss()

    # LDS should be calculated before the forward for cross entropy
    lds = vat_loss(model, data)
    output = model(data)
    classification_loss = cross_entropy(output, target)
    loss = classification_loss + args.alpha * lds
    loss.backward()
    optimizer.step()

    if batch_idx % args.log_interval == 0:
        state["log"].append((classification_loss.item(), lds.item()))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
