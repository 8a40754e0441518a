"""GRU4Rec's session-parallel training: the GRU state is carried across batches and zeroed in place for ended sessions.

Source: hungpthanh/GRU4REC-pytorch, lib/trainer.py (commit a137051b678f927ba4030faf2dd51a45d502043d) with
lib/model.py, lib/lossfunction.py and lib/dataset.py: Trainer.train_epoch sets `hidden =
self.model.init_hidden()` and then, per session-parallel mini-batch, `self.optim.zero_grad()`, `hidden =
reset_hidden(hidden, mask).detach()` where reset_hidden does `hidden[:, mask, :] = 0` (in place, on the GRU's
output of the previous batch) for the sessions that just ended, `logit, hidden = self.model(input, hidden)`,
`logit_sampled = logit[:, target.view(-1)]`, the TOP1-max loss (main.py's default), `loss.backward()`,
`self.optim.step()`. The published code detaches after the in-place reset, every batch. Retyped at CPU size: 7
items, hidden size 5, 3 GRU layers with dropout 0.5 and tanh output as main.py's defaults, batch size 3,
Adagrad(lr=0.01) for lib.Optimizer's default Adagrad; the session data (read with pandas from the RecSys'15
files) is made up: 10 sessions of 2 to 4 clicks, kept as the numpy arrays the published Dataset derives (item
indices in session order, click_offsets, session_idx_arr); lib.DataLoader's generator is retyped over them. tqdm
and evaluation left out, and create_final_activation keeps only its tanh and relu branches; when the generator
runs out, the next train_epoch starts (init_hidden and a new DataLoader).
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "hidden", "line": "@gru_forward"}],
    "modifies_in_place": [],
}


class GRU4REC(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, num_layers=1, final_act='tanh',
                 dropout_hidden=.5, dropout_input=0, batch_size=50, embedding_dim=-1, use_cuda=False):
        super(GRU4REC, self).__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.num_layers = num_layers
        self.dropout_hidden = dropout_hidden
        self.dropout_input = dropout_input
        self.embedding_dim = embedding_dim
        self.batch_size = batch_size
        self.use_cuda = use_cuda
        self.device = torch.device('cuda' if use_cuda else 'cpu')
        self.onehot_buffer = self.init_emb()
        self.h2o = nn.Linear(hidden_size, output_size)
        self.create_final_activation(final_act)
        if self.embedding_dim != -1:
            self.look_up = nn.Embedding(input_size, self.embedding_dim)
            self.gru = nn.GRU(self.embedding_dim, self.hidden_size, self.num_layers, dropout=self.dropout_hidden)
        else:
            self.gru = nn.GRU(self.input_size, self.hidden_size, self.num_layers, dropout=self.dropout_hidden)
        self = self.to(self.device)

    def create_final_activation(self, final_act):
        if final_act == 'tanh':
            self.final_activation = nn.Tanh()
        elif final_act == 'relu':
            self.final_activation = nn.ReLU()

    def forward(self, input, hidden):
        if self.embedding_dim == -1:
            embedded = self.onehot_encode(input)
            if self.training and self.dropout_input > 0: embedded = self.embedding_dropout(embedded)
            embedded = embedded.unsqueeze(0)
        else:
            embedded = input.unsqueeze(0)
            embedded = self.look_up(embedded)

        output, hidden = self.gru(embedded, hidden)  # @gru_forward
        output = output.view(-1, output.size(-1))  #(B,H)
        logit = self.final_activation(self.h2o(output))

        return logit, hidden

    def init_emb(self):
        onehot_buffer = torch.FloatTensor(self.batch_size, self.output_size)
        onehot_buffer = onehot_buffer.to(self.device)
        return onehot_buffer

    def onehot_encode(self, input):
        self.onehot_buffer.zero_()
        index = input.view(-1, 1)
        one_hot = self.onehot_buffer.scatter_(1, index, 1)
        return one_hot

    def embedding_dropout(self, input):
        p_drop = torch.Tensor(input.size(0), 1).fill_(1 - self.dropout_input)
        mask = torch.bernoulli(p_drop).expand_as(input) / (1 - self.dropout_input)
        mask = mask.to(self.device)
        input = input * mask
        return input

    def init_hidden(self):
        try:
            h0 = torch.zeros(self.num_layers, self.batch_size, self.hidden_size).to(self.device)
        except:  # noqa: E722 (as published)
            self.device = 'cpu'
            h0 = torch.zeros(self.num_layers, self.batch_size, self.hidden_size).to(self.device)
        return h0


class TOP1_max(nn.Module):
    def __init__(self):
        super(TOP1_max, self).__init__()

    def forward(self, logit):
        logit_softmax = F.softmax(logit, dim=1)
        diff = -(logit.diag().view(-1, 1).expand_as(logit) - logit)
        loss = torch.mean(logit_softmax * (torch.sigmoid(diff) + torch.sigmoid(logit ** 2)))
        return loss


class Dataset(object):
    """What lib.Dataset keeps of its sorted DataFrame: item indices in session order and the offsets."""

    def __init__(self, session_lengths, n_items, rng):
        self.item_idx = rng.integers(0, n_items, size=int(np.sum(session_lengths)))
        self.click_offsets = np.zeros(len(session_lengths) + 1, dtype=np.int32)
        self.click_offsets[1:] = np.cumsum(session_lengths)
        self.session_idx_arr = np.arange(len(session_lengths))


class DataLoader():
    def __init__(self, dataset, batch_size=50):
        self.dataset = dataset
        self.batch_size = batch_size

    def __iter__(self):
        # initializations
        item_idx = self.dataset.item_idx
        click_offsets = self.dataset.click_offsets
        session_idx_arr = self.dataset.session_idx_arr

        iters = np.arange(self.batch_size)
        maxiter = iters.max()
        start = click_offsets[session_idx_arr[iters]]
        end = click_offsets[session_idx_arr[iters] + 1]
        mask = []  # indicator for the sessions to be terminated
        finished = False

        while not finished:
            minlen = (end - start).min()
            # Item indices(for embedding) for clicks where the first sessions start
            idx_target = item_idx[start]

            for i in range(minlen - 1):
                # Build inputs & targets
                idx_input = idx_target
                idx_target = item_idx[start + i + 1]
                input = torch.LongTensor(idx_input)
                target = torch.LongTensor(idx_target)
                yield input, target, mask

            # click indices where a particular session meets second-to-last element
            start = start + (minlen - 1)
            # see if how many sessions should terminate
            mask = np.arange(len(iters))[(end - start) <= 1]
            for idx in mask:
                maxiter += 1
                if maxiter >= len(click_offsets) - 1:
                    finished = True
                    break
                # update the next starting/ending point
                iters[idx] = maxiter
                start[idx] = click_offsets[session_idx_arr[maxiter]]
                end[idx] = click_offsets[session_idx_arr[maxiter] + 1]


def reset_hidden(hidden, mask):
    """Helper function that resets hidden state when some sessions terminate"""
    if len(mask) != 0:
        hidden[:, mask, :] = 0  # @reset_hidden
    return hidden


def build() -> dict:
    np.random.seed(22)
    torch.manual_seed(22)
    rng = np.random.default_rng(22)
    train_data = Dataset([2, 3, 2, 4, 3, 2, 3, 2, 4, 2], 7, rng)
    model = GRU4REC(7, 5, 7, final_act='tanh', num_layers=3, batch_size=3, dropout_input=0, dropout_hidden=0.5)
    optim = torch.optim.Adagrad(model.parameters(), lr=0.01)
    state = {"model": model, "optim": optim, "loss_func": TOP1_max(), "train_data": train_data, "losses": []}
    start_epoch(state)
    return state


def start_epoch(state: dict) -> None:
    state["model"].train()
    state["hidden"] = state["model"].init_hidden()
    state["dataloader"] = iter(DataLoader(state["train_data"], 3))


def train_batch(state: dict) -> None:
    model, optim, loss_func = state["model"], state["optim"], state["loss_func"]
    try:
        input, target, mask = next(state["dataloader"])
    except StopIteration:
        start_epoch(state)
        input, target, mask = next(state["dataloader"])
    optim.zero_grad()
    state["hidden"] = reset_hidden(state["hidden"], mask).detach()  # @detach
    logit, state["hidden"] = model(input, state["hidden"])
    # output sampling
    logit_sampled = logit[:, target.view(-1)]
    loss = loss_func(logit_sampled)
    state["losses"].append(loss.item())
    loss.backward()  # @backward
    optim.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
