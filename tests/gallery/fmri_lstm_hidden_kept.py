"""An fMRI LSTM classifier whose forward keeps the LSTM's final state on the module, never fed back in.

Source: sgadgil6/cnslab_fmri issue #4 (https://github.com/sgadgil6/cnslab_fmri/issues/4, "Trying to backward through
the graph a second time ... In this run_training_lstm.py, when running to loss.backward(), break; if I use
retain_graph=True, then buff will OOM"): the model as the reporter posted it back (`self.hidden = self.init_hidden()`
in `__init__`, `lstm_out, self.hidden = self.lstm(x)` in forward, "here, you don't need to pass hidden layer
state"), with the training loop of the repository's net/fmri_lstm.py (commit
e2b9691b1f685a66b05de632298869b72589d46c, its `train`: `model.train()`, a random choice of time steps,
`model.zero_grad()`, `model.hidden = model.init_hidden()`, `predicted_prob = model(x)`, BCELoss,
`epoch_loss += loss.item()`, `loss.backward()`, `optimizer.step()`, Adagrad(lr=0.1)). The posted forward is cut off
after `linear_output = self.linear(out)`; it ends here as the repository's forward does, through the posted
`self.activate` (a Sigmoid). Retyped at CPU size: hidden 8 (published 256), 22 regions as published, batches of
4 subjects (the posted `init_hidden` makes 64) with 6 of 10 time steps (25 of 100), made-up signals and labels in
place of the .npy/.pkl files; `.to(device)` dropped; the per-subject vote, CSV writer and prints left out (the
published `if predicted_prob > 0.5` needs a single subject). An iteration is one sample of the inner loop.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3
HIDDEN, REGIONS, BATCH, TIMESTEPS, NUM_TIMESTEPS = 8, 22, 4, 10, 6

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "model.hidden", "line": "@lstm"}],
    "modifies_in_place": [],
}


class fMRI_LSTM(nn.Module):
    def __init__(self, hidden_dim, input_dim):
        super(fMRI_LSTM, self).__init__()
        self.hidden_dim = hidden_dim
        self.lstm = nn.LSTM(input_dim, hidden_dim,num_layers=1, batch_first=True)
        self.linear = nn.Linear(hidden_dim,1)
        self.hidden= self.init_hidden()
        self.dropout = nn.Dropout(p=0.2)
        self.activate=nn.Sigmoid()

    def init_hidden(self, ):
        return (torch.randn(1, BATCH, self.hidden_dim), torch.randn(1,BATCH, self.hidden_dim))

    def forward(self, x):
        lstm_out, self.hidden = self.lstm(x)  # @lstm
        lstm_out = lstm_out.squeeze()[:, -1, :] # here ,you don't need to pass hidden layer state
        out = self.dropout(lstm_out)
        linear_output = self.linear(out)
        final_output = self.activate(linear_output)
        return final_output


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    model = fMRI_LSTM(HIDDEN, REGIONS)
    loss_function = nn.BCELoss()
    optimizer = optim.Adagrad(model.parameters(), lr=0.1)
    training_data = np.random.randn(ITERATIONS * 2, BATCH, TIMESTEPS, REGIONS).astype(np.float32)
    training_labels = np.random.randint(0, 2, (ITERATIONS * 2, BATCH, 1)).astype(np.float32)
    return {"model": model, "loss_function": loss_function, "optimizer": optimizer,
            "training_data": training_data, "training_labels": training_labels, "i": 0, "epoch_loss": 0.0}


def iteration(state: dict) -> None:
    model, loss_function, optimizer = state["model"], state["loss_function"], state["optimizer"]
    training_data, training_labels, i = state["training_data"], state["training_labels"], state["i"]
    state["i"] = i + 1
    model.train()
    training_sample = training_data[i][:, np.random.choice(training_data[i].shape[1], NUM_TIMESTEPS, replace=False)]
    x = torch.Tensor(training_sample)
    true_label = torch.FloatTensor(training_labels[i])
    model.zero_grad()
    model.hidden = model.init_hidden()
    predicted_prob = model(x)
    loss = loss_function(predicted_prob, true_label)
    state["epoch_loss"] += loss.item()
    loss.backward()
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
