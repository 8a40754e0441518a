"""TRADES adversarial training: x_adv built by an inner loop of autograd.grad steps, detached, then one robust loss.

Source: yaodongyu/TRADES, trades.py (commit 9d308f1cd6079b2b437587dd779788030b193440): trades_loss with distance
'l_inf' as published (`criterion_kl = nn.KLDivLoss(size_average=False)`, model.eval(), `x_adv =
x_natural.detach() + 0.001 * torch.randn(x_natural.shape).detach()`, for each perturb step:
`x_adv.requires_grad_()`, loss_kl under torch.enable_grad(), `grad = torch.autograd.grad(loss_kl, [x_adv])[0]`,
`x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())`, the projection and clamp; model.train(),
optimizer.zero_grad(), loss_natural + beta * loss_robust returned), and train_trades_mnist.py (commit
d9fd5ee8ecaf56ec38d2413968ee83396adbaefe): main()'s SGD with momentum 0.9, adjust_learning_rate per epoch, and
train(): optimizer.zero_grad(), `loss = trades_loss(...)`, loss.backward(), optimizer.step(). Retyped at CPU size:
`.cuda()` and `Variable(..., requires_grad=False)` removed (x_adv has no graph there), SmallCNN becomes conv 1->4
stride 2, ReLU, Dropout(0.5), Linear(64, 10); batch size 4 (published 128), num_steps 3 (published 40), MNIST
replaced by a made-up loader of 2 batches of 1x8x8 images in [0, 1]; one epoch is an iteration; printing,
eval_train, eval_test and the checkpoints left out.
"""

from collections.abc import Callable
from types import SimpleNamespace

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

args = SimpleNamespace(batch_size=4, epochs=100, lr=0.01, momentum=0.9, epsilon=0.3, num_steps=3, step_size=0.01,
                       beta=1.0, seed=1, log_interval=100)
device = torch.device("cpu")


# ---------------------------------------------------------------- trades.py


def trades_loss(model,
                x_natural,
                y,
                optimizer,
                step_size=0.003,
                epsilon=0.031,
                perturb_steps=10,
                beta=1.0,
                distance='l_inf'):
    # define KL-loss
    criterion_kl = nn.KLDivLoss(size_average=False)
    model.eval()
    batch_size = len(x_natural)
    # generate adversarial example
    x_adv = x_natural.detach() + 0.001 * torch.randn(x_natural.shape).detach()
    if distance == 'l_inf':
        for _ in range(perturb_steps):
            x_adv.requires_grad_()
            with torch.enable_grad():
                loss_kl = criterion_kl(F.log_softmax(model(x_adv), dim=1),
                                       F.softmax(model(x_natural), dim=1))
            grad = torch.autograd.grad(loss_kl, [x_adv])[0]  # @inner_grad
            x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())
            x_adv = torch.min(torch.max(x_adv, x_natural - epsilon), x_natural + epsilon)
            x_adv = torch.clamp(x_adv, 0.0, 1.0)
    else:
        x_adv = torch.clamp(x_adv, 0.0, 1.0)
    model.train()

    x_adv = torch.clamp(x_adv, 0.0, 1.0)
    # zero gradient
    optimizer.zero_grad()
    # calculate robust loss
    logits = model(x_natural)
    loss_natural = F.cross_entropy(logits, y)
    loss_robust = (1.0 / batch_size) * criterion_kl(F.log_softmax(model(x_adv), dim=1),
                                                    F.softmax(model(x_natural), dim=1))
    loss = loss_natural + beta * loss_robust
    return loss


# ---------------------------------------------------------------- train_trades_mnist.py


class SmallCNN(nn.Module):
    """A CPU-size stand-in for models/small_cnn.py's SmallCNN (convolutions, ReLU, dropout, a linear head)."""

    def __init__(self):
        super(SmallCNN, self).__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = self.drop(x.view(x.size(0), -1))
        return self.fc(x)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)

        optimizer.zero_grad()

        # calculate robust loss
        loss = trades_loss(model=model,
                           x_natural=data,
                           y=target,
                           optimizer=optimizer,
                           step_size=args.step_size,
                           epsilon=args.epsilon,
                           perturb_steps=args.num_steps,
                           beta=args.beta)

        loss.backward()  # @backward
        optimizer.step()


def adjust_learning_rate(optimizer, epoch):
    """decrease the learning rate"""
    lr = args.lr
    if epoch >= 55:
        lr = args.lr * 0.1
    if epoch >= 75:
        lr = args.lr * 0.01
    if epoch >= 90:
        lr = args.lr * 0.001
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr


def build() -> dict:
    torch.manual_seed(args.seed)
    train_loader = [(torch.rand(args.batch_size, 1, 8, 8), torch.randint(0, 10, (args.batch_size,))) for _ in range(2)]
    # init model, Net() can be also used here for training
    model = SmallCNN().to(device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    return {"model": model, "optimizer": optimizer, "train_loader": train_loader, "epoch": 1}


def iteration(state: dict) -> None:
    # adjust learning rate for SGD
    adjust_learning_rate(state["optimizer"], state["epoch"])

    # adversarial training
    train(args, state["model"], device, state["train_loader"], state["optimizer"], state["epoch"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(1, iterations + 1):
        # adjust learning rate for SGD
        adjust_learning_rate(state["optimizer"], epoch)

        # adversarial training
        train(args, state["model"], device, state["train_loader"], state["optimizer"], epoch)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
