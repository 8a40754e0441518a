"""DeepAR (zhykoties/TimeSeries): an LSTM forecaster trained on Gaussian likelihood, the loss summed over the window.

Source: zhykoties/TimeSeries, train.py (commit 81a755b68051977b240d309fb3964207b1a3f781), train(): per batch
`optimizer.zero_grad()`, permute the batch to [train_window, batch, 1+cov_dim], `loss = torch.zeros(1)`,
`hidden = model.init_hidden(batch_size)`, `cell = model.init_cell(batch_size)`, then over t: a missing z_t
(`train_batch[t, :, 0] == 0`, t > 0) is filled in place with the previous step's `mu`, `mu, sigma, hidden, cell =
model(train_batch[t].unsqueeze_(0).clone(), idx, hidden, cell)`, `loss += loss_fn(mu, sigma, labels_batch[t])`;
then `loss.backward()`, `optimizer.step()`, `loss = loss.item() / params.train_window`. model/net.py (commit
0a2d4a6cf6689e4ad10fe58441df77078529b768): Net (embedding of the series id, LSTM with the forget-gate bias set to
1, mu and softplus sigma heads on the hidden state of every layer), loss_fn (Normal log-likelihood where the label
is not 0). Retyped at CPU size: the electricity windows become a made-up dataset of 12 windows (train_window 5,
cov_dim 2, 3 series; some z entries 0 so the fill-in runs), batch 4 from a torch DataLoader (shuffle off, the
published WeightedSampler left out), lstm_hidden_dim 4, lstm_layers 2, embedding_dim 2, lstm_dropout 0.1, lr
1e-3; params is a SimpleNamespace; tqdm, evaluate and logging are left out.
"""

import types
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Net(nn.Module):
    def __init__(self, params):
        super(Net, self).__init__()
        self.params = params
        self.embedding = nn.Embedding(params.num_class, params.embedding_dim)

        self.lstm = nn.LSTM(input_size=1+params.cov_dim+params.embedding_dim,
                            hidden_size=params.lstm_hidden_dim,
                            num_layers=params.lstm_layers,
                            bias=True,
                            batch_first=False,
                            dropout=params.lstm_dropout)
        for names in self.lstm._all_weights:
            for name in filter(lambda n: "bias" in n, names):
                bias = getattr(self.lstm, name)
                n = bias.size(0)
                start, end = n // 4, n // 2
                bias.data[start:end].fill_(1.)

        self.relu = nn.ReLU()
        self.distribution_mu = nn.Linear(params.lstm_hidden_dim * params.lstm_layers, 1)
        self.distribution_presigma = nn.Linear(params.lstm_hidden_dim * params.lstm_layers, 1)
        self.distribution_sigma = nn.Softplus()

    def forward(self, x, idx, hidden, cell):
        onehot_embed = self.embedding(idx)
        lstm_input = torch.cat((x, onehot_embed), dim=2)
        output, (hidden, cell) = self.lstm(lstm_input, (hidden, cell))
        hidden_permute = hidden.permute(1, 2, 0).contiguous().view(hidden.shape[1], -1)
        pre_sigma = self.distribution_presigma(hidden_permute)
        mu = self.distribution_mu(hidden_permute)
        sigma = self.distribution_sigma(pre_sigma)
        return torch.squeeze(mu), torch.squeeze(sigma), hidden, cell

    def init_hidden(self, input_size):
        return torch.zeros(self.params.lstm_layers, input_size, self.params.lstm_hidden_dim, device=self.params.device)

    def init_cell(self, input_size):
        return torch.zeros(self.params.lstm_layers, input_size, self.params.lstm_hidden_dim, device=self.params.device)


def loss_fn(mu, sigma, labels):
    zero_index = (labels != 0)
    distribution = torch.distributions.normal.Normal(mu[zero_index], sigma[zero_index])
    likelihood = distribution.log_prob(labels[zero_index])
    return -torch.mean(likelihood)


class TrainDataset(Dataset):
    """Made-up stand-in for dataloader.TrainDataset: (window, series id, labels) with some z entries missing."""

    def __init__(self, params, n_windows=12):
        rng = np.random.RandomState(0)
        z = rng.rand(n_windows, params.train_window + 1).astype(np.float32) + 0.5
        z[rng.rand(*z.shape) < 0.2] = 0.0
        z[:, 0] = 0.0  # z_0 = 0
        cov = rng.randn(n_windows, params.train_window, params.cov_dim).astype(np.float32)
        self.data = np.concatenate([z[:, :-1, None], cov], axis=2)
        self.label = z[:, 1:]
        self.label[:, 0] = np.where(self.label[:, 0] == 0, 1.0, self.label[:, 0])
        self.v = rng.randint(0, params.num_class, size=n_windows)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return (self.data[index], int(self.v[index]), self.label[index])


def build() -> dict:
    torch.manual_seed(230)
    params = types.SimpleNamespace(num_class=3, embedding_dim=2, cov_dim=2, lstm_hidden_dim=4, lstm_layers=2,
                                   lstm_dropout=0.1, train_window=5, batch_size=4, learning_rate=1e-3,
                                   device=torch.device("cpu"))
    model = Net(params)
    train_loader = DataLoader(TrainDataset(params), batch_size=params.batch_size, shuffle=False, num_workers=0)
    optimizer = optim.Adam(model.parameters(), lr=params.learning_rate)
    return {"model": model, "optimizer": optimizer, "params": params, "train_loader": train_loader,
            "batches": iter(train_loader)}


def iteration(state: dict) -> None:
    model, optimizer, params = state["model"], state["optimizer"], state["params"]
    train_batch, idx, labels_batch = next(state["batches"])
    optimizer.zero_grad()
    batch_size = train_batch.shape[0]

    train_batch = train_batch.permute(1, 0, 2).to(torch.float32).to(params.device)  # not scaled
    labels_batch = labels_batch.permute(1, 0).to(torch.float32).to(params.device)  # not scaled
    idx = idx.unsqueeze(0).to(params.device)

    loss = torch.zeros(1, device=params.device)
    hidden = model.init_hidden(batch_size)
    cell = model.init_cell(batch_size)

    for t in range(params.train_window):
        # if z_t is missing, replace it by output mu from the last time step
        zero_index = (train_batch[t, :, 0] == 0)
        if t > 0 and torch.sum(zero_index) > 0:
            train_batch[t, zero_index, 0] = mu[zero_index]  # @fill  # noqa: F821 (mu of step t - 1, as published)
        mu, sigma, hidden, cell = model(train_batch[t].unsqueeze_(0).clone(), idx, hidden, cell)  # @forward
        loss += loss_fn(mu, sigma, labels_batch[t])  # @loss

    loss.backward()  # @backward
    optimizer.step()
    loss = loss.item() / params.train_window  # loss per timestep


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
