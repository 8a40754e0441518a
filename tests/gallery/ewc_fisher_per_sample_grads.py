"""Elastic Weight Consolidation, tasks in sequence: the Fisher diagonal from one autograd.grad per sample.

Source: kuc2477/pytorch-ewc, model.py and train.py at commit 151d75cdf98f85741c02204d0c8c540ee9578c8c.
`MLP.estimate_fisher` runs the model over a few batches, keeps each sample's log-likelihood (`torch.cat(...).unbind()`),
and asks `autograd.grad(l, self.parameters(), retain_graph=(i < len(loglikelihoods)))` for each: all samples share
the batches' graphs, so every call but the last keeps them. `consolidate` registers the parameters' `.data` and the
Fisher as buffers; `ewc_loss` adds `lamda/2 * sum(F * (p - mean)**2)` to each later task's loss (a zero tensor
before the first consolidation, from the AttributeError). `train` runs each task's epochs, then consolidates if
more tasks follow. Retyped at CPU size: input 8, hidden 6 (one hidden layer), 3 classes, batch 4, 2 batches per
task, one epoch per task, a Fisher sample size of 8 (8 grad calls), 3 tasks (one task per iteration); data made up
(a permuted-input task per iteration); `Variable` removed, visdom/tqdm logging and evaluation left out.
`retain_graph=(i < len(loglikelihoods))` is written `retain = i < len(loglikelihoods)` and `retain_graph=retain`:
the probes switch a retain by the name after the `=`.
"""

from collections.abc import Callable
from functools import reduce

import torch
from torch import autograd, nn, optim
from torch.nn import functional as F

ITERATIONS = 3
INPUT, HIDDEN, CLASSES, BATCH, BATCHES = 8, 6, 3, 4, 2
FISHER_SAMPLE_SIZE = 8

TRUTH = {
    "error": None,
    "retains": {"@fisher_grad": {"verdict": "needed", "runs": 14, "needed_runs": 14}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class MLP(nn.Module):
    def __init__(self, input_size, output_size, hidden_size=400, hidden_layer_num=2, hidden_dropout_prob=.5,
                 input_dropout_prob=.2, lamda=40):
        super().__init__()
        self.input_size = input_size
        self.input_dropout_prob = input_dropout_prob
        self.hidden_size = hidden_size
        self.hidden_layer_num = hidden_layer_num
        self.hidden_dropout_prob = hidden_dropout_prob
        self.output_size = output_size
        self.lamda = lamda

        self.layers = nn.ModuleList([
            # input
            nn.Linear(self.input_size, self.hidden_size), nn.ReLU(),
            nn.Dropout(self.input_dropout_prob),
            # hidden
            *((nn.Linear(self.hidden_size, self.hidden_size), nn.ReLU(),
               nn.Dropout(self.hidden_dropout_prob)) * self.hidden_layer_num),
            # output
            nn.Linear(self.hidden_size, self.output_size)
        ])

    def forward(self, x):
        return reduce(lambda x, l: l(x), self.layers, x)

    def estimate_fisher(self, dataset, sample_size, batch_size=32):
        # sample loglikelihoods from the dataset.
        data_loader = dataset
        loglikelihoods = []
        for x, y in data_loader:
            x = x.view(batch_size, -1)
            loglikelihoods.append(
                F.log_softmax(self(x), dim=1)[range(batch_size), y.data]
            )
            if len(loglikelihoods) >= sample_size // batch_size:
                break
        # estimate the fisher information of the parameters.
        loglikelihoods = torch.cat(loglikelihoods).unbind()
        grads = []
        for i, l in enumerate(loglikelihoods, 1):
            retain = i < len(loglikelihoods)
            grads.append(autograd.grad(l, self.parameters(), retain_graph=retain))  # @fisher_grad
        loglikelihood_grads = zip(*grads)
        loglikelihood_grads = [torch.stack(gs) for gs in loglikelihood_grads]
        fisher_diagonals = [(g ** 2).mean() for g in loglikelihood_grads]
        param_names = [
            n.replace('.', '__') for n, p in self.named_parameters()
        ]
        return {n: f.detach() for n, f in zip(param_names, fisher_diagonals)}

    def consolidate(self, fisher):
        for n, p in self.named_parameters():
            n = n.replace('.', '__')
            self.register_buffer('{}_mean'.format(n), p.data.clone())
            self.register_buffer('{}_fisher'
                                 .format(n), fisher[n].data.clone())

    def ewc_loss(self, cuda=False):
        try:
            losses = []
            for n, p in self.named_parameters():
                # retrieve the consolidated mean and fisher information.
                n = n.replace('.', '__')
                mean = getattr(self, '{}_mean'.format(n))
                fisher = getattr(self, '{}_fisher'.format(n))
                losses.append((fisher * (p-mean)**2).sum())
            return (self.lamda/2)*sum(losses)
        except AttributeError:
            # ewc loss is 0 if there's no consolidated parameters.
            return torch.zeros(1)


def build() -> dict:
    torch.manual_seed(0)
    model = MLP(INPUT, CLASSES, hidden_size=HIDDEN, hidden_layer_num=1)
    train_datasets = []
    for _ in range(ITERATIONS):
        permutation = torch.randperm(INPUT)
        batches = []
        for _ in range(BATCHES):
            x = torch.randn(BATCH, INPUT)[:, permutation]
            batches.append((x, torch.randint(0, CLASSES, (BATCH,))))
        train_datasets.append(batches)
    criteriton = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-5)
    model.train()
    return {"model": model, "optimizer": optimizer, "criteriton": criteriton, "train_datasets": train_datasets,
            "task": 1, "consolidate": True}


def iteration(state: dict) -> None:
    model, optimizer, criteriton = state["model"], state["optimizer"], state["criteriton"]
    train_datasets, task = state["train_datasets"], state["task"]
    train_dataset = train_datasets[task - 1]
    for epoch in range(1, 1 + 1):
        data_loader = train_dataset
        for batch_index, (x, y) in enumerate(data_loader, 1):
            data_size = len(x)
            x = x.view(data_size, -1)
            # run the model and backpropagate the errors.
            optimizer.zero_grad()
            scores = model(x)
            ce_loss = criteriton(scores, y)
            ewc_loss = model.ewc_loss()
            loss = ce_loss + ewc_loss
            loss.backward()
            optimizer.step()
            # calculate the training precision.
            _, predicted = scores.max(1)
            precision = (predicted == y).sum().float() / len(x)

    if state["consolidate"] and task < len(train_datasets):
        model.consolidate(model.estimate_fisher(
            train_dataset, FISHER_SAMPLE_SIZE, batch_size=BATCH
        ))
    state["task"] = task + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
