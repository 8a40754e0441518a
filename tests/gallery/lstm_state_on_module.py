"""An LSTM classifier that keeps its hidden state on the module, set once in __init__ and never reset.

Source: pytorch/pytorch issue #2769 ("LSTM architecture has met a explosive growth in the training
process"): `self.hidden = self.init_hidden()` in __init__ and `lstm_out, self.hidden = self.lstm(x,
self.hidden)` in forward, a Linear on the last time step, log_softmax; the issue's train() loops over
batches with the usual criterion / zero_grad / backward / step (its text is cut after the Variable
wrapping in our copy, so the rest of the step is the standard one). Retyped at CPU size: input 3,
hidden 4, 2 classes, sequences of 5, batch 1 (init_hidden's shape), SGD; Variable wrappers dropped and
F.log_softmax given dim=1.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "model.hidden", "line": "@lstm_forward"}],
    "notes": [],
    "modifies_in_place": [],
}


class LSTM(nn.Module):
    def __init__(self, input_len=3, hidden_len=4, model_len=5, target_size=2, is_softmax=True):
        super().__init__()
        self.hidden_len = hidden_len
        self.is_softmax = is_softmax
        self.lstm = nn.LSTM(input_len, hidden_len, batch_first=True)
        self.target_size = target_size
        self.hidden2class = nn.Linear(hidden_len, target_size)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (torch.zeros(1, 1, self.hidden_len), torch.zeros(1, 1, self.hidden_len))

    def forward(self, x):
        lstm_out, self.hidden = self.lstm(x, self.hidden)  # @lstm_forward
        cls_scores = self.hidden2class(lstm_out[:, -1, :]).view(-1, self.target_size)
        if self.is_softmax:
            cls_scores = F.log_softmax(cls_scores, dim=1)
        return cls_scores


def build() -> dict:
    torch.manual_seed(0)
    model = LSTM()
    train_data = [(torch.randn(1, 5, 3), torch.tensor([k % 2])) for k in range(ITERATIONS + 2)]
    return {"model": model, "criterion": nn.NLLLoss(), "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "train_data": train_data, "i": 0}


def train_batch(state: dict) -> None:
    model, criterion, optimizer = state["model"], state["criterion"], state["optimizer"]
    input, target = state["train_data"][state["i"] % len(state["train_data"])]
    state["i"] += 1
    output = model(input)
    loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    state["model"].train()
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
