"""Hugging Face accelerate driving an anomaly-detection training loop whose model returns the Anomaly Transformer's
two minimax losses, backed one after the other: `accelerator.backward(loss1, retain_graph=True)`, then
`accelerator.backward(loss2)`, one optimizer step.

Source: a public anomaly-detection training script indexed by the library's code search (stored file id 63404543473;
its repository is not named by the index), function `train`: per batch `inputs = item['input']`, `targets =
item['target']`, `result = model(inputs, input_timestamp, targets, criterion)`, `loss = result[1]`, and for a tuple
loss ("Minimax strategy: loss가 tuple인 경우 (e.g., Anomaly Transformer)") `loss1, loss2 = loss`, `loss1 =
accelerator.gather(loss1).mean()`, `loss2 = accelerator.gather(loss2).mean()`, `accelerator.backward(loss1,
retain_graph=True)`, `accelerator.backward(loss2)`, then `optimizer.step()`, `optimizer.zero_grad()`. The
`retain_graph` argument of `accelerator.backward` is the one asked for in huggingface/accelerate issue #103 ("Accelerator
backward with retain graph", https://github.com/huggingface/accelerate/issues/103). The minimax losses are the Anomaly
Transformer's (thuml/Anomaly-Transformer, solver.py): `loss1 = rec_loss - k * series_loss` with the prior detached,
`loss2 = rec_loss + k * prior_loss` with the series detached. Retyped at CPU size: windows of 4 steps of 3 channels, a
one-layer attention of width 8 whose series association is the attention and whose prior is a learned-sigma Gaussian
kernel, k = 3, Adam (lr 1e-3), batches of 2 from a prepared DataLoader (its iterator made in build()), on CPU; the
timestamp, the wandb logging and the loss meters are left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed

FRAMEWORK = "transformers"
WAYS = ("watch", "command", "diagnose", "audit_retain_graph", "find_carried_graph")
ITERATIONS = 3
WIN, CHANNELS, WIDTH, K = 4, 3, 8, 3.0

TRUTH = {
    "error": None,
    "retains": {"@backward_loss1": {"verdict": "needed", "runs": 3, "needed_runs": 3}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def my_kl_loss(p, q):
    res = p * (torch.log(p + 0.0001) - torch.log(q + 0.0001))
    return torch.mean(torch.sum(res, dim=-1), dim=1)


class TinyAnomalyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(CHANNELS, WIDTH)
        self.query = nn.Linear(WIDTH, WIDTH)
        self.key = nn.Linear(WIDTH, WIDTH)
        self.sigma = nn.Linear(WIDTH, 1)
        self.out = nn.Linear(WIDTH, CHANNELS)
        distances = torch.arange(WIN).float()
        self.register_buffer("distances", (distances[:, None] - distances[None, :]).abs())

    def forward(self, inputs, targets, criterion):
        h = self.embed(inputs)
        scores = self.query(h) @ self.key(h).transpose(1, 2) / WIDTH**0.5
        series = torch.softmax(scores, dim=-1)
        sigma = torch.sigmoid(self.sigma(h)) * 2 + 0.5
        prior = torch.exp(-(self.distances**2) / (2 * sigma**2))
        prior = prior / prior.sum(dim=-1, keepdim=True)
        outputs = self.out(series @ h)
        rec_loss = criterion(outputs, targets)
        series_loss = torch.mean(my_kl_loss(series, prior.detach()) + my_kl_loss(prior.detach(), series))
        prior_loss = torch.mean(my_kl_loss(prior, series.detach()) + my_kl_loss(series.detach(), prior))
        loss1 = rec_loss - K * series_loss
        loss2 = rec_loss + K * prior_loss
        return outputs, (loss1, loss2)


def build() -> dict:
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    model = TinyAnomalyTransformer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    windows = torch.randn(2 * (ITERATIONS + 1), WIN, CHANNELS)
    dataset = [{"input": window, "target": window} for window in windows]
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=2)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    return {
        "accelerator": accelerator,
        "model": model,
        "optimizer": optimizer,
        "criterion": nn.MSELoss(),
        "batches": iter(train_loader),
    }


def iteration(state: dict) -> None:
    accelerator, model, optimizer = state["accelerator"], state["model"], state["optimizer"]
    item = next(state["batches"])
    inputs = item["input"]
    targets = item["target"]

    result = model(inputs, targets, state["criterion"])
    loss = result[1]

    # Minimax strategy: a tuple loss (e.g., Anomaly Transformer)
    if isinstance(loss, tuple):
        loss1, loss2 = loss
        loss1 = accelerator.gather(loss1).mean()
        loss2 = accelerator.gather(loss2).mean()

        accelerator.backward(loss1, retain_graph=True)  # @backward_loss1
        accelerator.backward(loss2)  # @backward_loss2
    else:
        loss = accelerator.gather(loss).mean()
        accelerator.backward(loss)

    # loss update
    optimizer.step()
    optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
