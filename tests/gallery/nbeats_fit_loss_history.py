"""N-BEATS (philipperemy/n-beats, PyTorch): NBeatsNet.fit, a Keras-style loop that keeps a list of the batch losses.

Source: philipperemy/n-beats, nbeats_pytorch/model.py (commit 0e441805cd0f6c9776704022d3ac817cc9859584): NBeatsNet
(stacks of blocks kept in plain lists, their parameters gathered into `self.parameters = nn.ParameterList(...)`;
forward subtracts each block's backcast from the input and adds its forecast to `forecast = torch.zeros(...)`),
Block and GenericBlock (four ReLU Linear layers, theta_b/theta_f, backcast_fc/forecast_fc), compile('mae', 'adam')
(l1_loss, `optim.Adam(lr=1e-4, params=self.parameters())`), and fit(): per epoch the data split into batches, the
batch order shuffled with `random.shuffle`, `self.train()`, `train_loss = []`, per batch `self._opt.zero_grad()`,
`_, forecast = self(torch.tensor(batch_x, ...))`, `loss = self._loss(forecast, squeeze_last_dim(...))`,
`train_loss.append(loss.item())`, `loss.backward()`, `self._opt.step()`; at the epoch's end `train_loss =
np.mean(train_loss)` and, with validation_data, `self.eval()` and the test loss's `.item()` (no torch.no_grad()),
then a Keras-like print (left out). The model and the call are those of examples/simple_example.py (commit
50f19c3df0347cf5c01fc88511ca63084ba36fbc): two GENERIC_BLOCK stacks of 2 blocks sharing weights, thetas_dim
(4, 4), x uniform of shape (num_samples, time_steps, 1) and y its mean, the first tenth held out as validation
data. The iteration is one batch of fit()'s inner loop (the epoch's first batch also runs the epoch's start, its
last the epoch's end). Retyped at CPU size: num_samples 10 (published 50_000), time_steps 10 as published,
hidden_layer_units 8 (published 64), batch_size 4 (published 128); the `print`s of the constructor and of fit are
left out; random, numpy and torch are seeded.
"""

import random
from collections.abc import Callable
from time import time

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F
from torch.nn.functional import l1_loss, mse_loss

ITERATIONS = 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class NBeatsNet(nn.Module):
    SEASONALITY_BLOCK = 'seasonality'
    TREND_BLOCK = 'trend'
    GENERIC_BLOCK = 'generic'

    def __init__(self,
                 device=torch.device('cpu'),  # noqa: B008 (as published)
                 stack_types=(TREND_BLOCK, SEASONALITY_BLOCK),
                 nb_blocks_per_stack=3,
                 forecast_length=5,
                 backcast_length=10,
                 thetas_dim=(4, 8),
                 share_weights_in_stack=False,
                 hidden_layer_units=256,
                 nb_harmonics=None):
        super(NBeatsNet, self).__init__()
        self.forecast_length = forecast_length
        self.backcast_length = backcast_length
        self.hidden_layer_units = hidden_layer_units
        self.nb_blocks_per_stack = nb_blocks_per_stack
        self.share_weights_in_stack = share_weights_in_stack
        self.nb_harmonics = nb_harmonics
        self.stack_types = stack_types
        self.stacks = []
        self.thetas_dim = thetas_dim
        self.parameters = []
        self.device = device
        for stack_id in range(len(self.stack_types)):
            self.stacks.append(self.create_stack(stack_id))
        self.parameters = nn.ParameterList(self.parameters)
        self.to(self.device)
        self._loss = None
        self._opt = None

    def create_stack(self, stack_id):
        stack_type = self.stack_types[stack_id]
        blocks = []
        for block_id in range(self.nb_blocks_per_stack):
            block_init = NBeatsNet.select_block(stack_type)
            if self.share_weights_in_stack and block_id != 0:
                block = blocks[-1]  # pick up the last one when we share weights.
            else:
                block = block_init(self.hidden_layer_units, self.thetas_dim[stack_id],
                                   self.device, self.backcast_length, self.forecast_length, self.nb_harmonics)
                self.parameters.extend(block.parameters())
            blocks.append(block)
        return blocks

    @staticmethod
    def select_block(block_type):
        return GenericBlock

    def compile(self, loss: str, optimizer):
        if loss == 'mae':
            loss_ = l1_loss
        elif loss == 'mse':
            loss_ = mse_loss
        else:
            raise ValueError(f'Unknown loss name: {loss}.')
        # noinspection PyArgumentList
        if isinstance(optimizer, str):
            if optimizer == 'adam':
                opt_ = optim.Adam
            elif optimizer == 'sgd':
                opt_ = optim.SGD
            elif optimizer == 'rmsprop':
                opt_ = optim.RMSprop
            else:
                raise ValueError(f'Unknown opt name: {optimizer}.')
            opt_ = opt_(lr=1e-4, params=self.parameters())
        else:
            opt_ = optimizer
        self._opt = opt_
        self._loss = loss_

    def forward(self, backcast):
        backcast = squeeze_last_dim(backcast)
        forecast = torch.zeros(size=(backcast.size()[0], self.forecast_length,))  # maybe batch size here.
        for stack_id in range(len(self.stacks)):
            for block_id in range(len(self.stacks[stack_id])):
                b, f = self.stacks[stack_id][block_id](backcast)
                backcast = backcast.to(self.device) - b
                forecast = forecast.to(self.device) + f
        return backcast, forecast


def squeeze_last_dim(tensor):
    if len(tensor.shape) == 3 and tensor.shape[-1] == 1:  # (128, 10, 1) => (128, 10).
        return tensor[..., 0]
    return tensor


def linear_space(backcast_length, forecast_length):
    ls = np.arange(-backcast_length, forecast_length, 1) / forecast_length
    b_ls = ls[:backcast_length]
    f_ls = ls[backcast_length:]
    return b_ls, f_ls


class Block(nn.Module):

    def __init__(self, units, thetas_dim, device, backcast_length=10, forecast_length=5, share_thetas=False,
                 nb_harmonics=None):
        super(Block, self).__init__()
        self.units = units
        self.thetas_dim = thetas_dim
        self.backcast_length = backcast_length
        self.forecast_length = forecast_length
        self.share_thetas = share_thetas
        self.fc1 = nn.Linear(backcast_length, units)
        self.fc2 = nn.Linear(units, units)
        self.fc3 = nn.Linear(units, units)
        self.fc4 = nn.Linear(units, units)
        self.device = device
        self.backcast_linspace, self.forecast_linspace = linear_space(backcast_length, forecast_length)
        if share_thetas:
            self.theta_f_fc = self.theta_b_fc = nn.Linear(units, thetas_dim, bias=False)
        else:
            self.theta_b_fc = nn.Linear(units, thetas_dim, bias=False)
            self.theta_f_fc = nn.Linear(units, thetas_dim, bias=False)

    def forward(self, x):
        x = squeeze_last_dim(x)
        x = F.relu(self.fc1(x.to(self.device)))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        x = F.relu(self.fc4(x))
        return x


class GenericBlock(Block):

    def __init__(self, units, thetas_dim, device, backcast_length=10, forecast_length=5, nb_harmonics=None):
        super(GenericBlock, self).__init__(units, thetas_dim, device, backcast_length, forecast_length)

        self.backcast_fc = nn.Linear(thetas_dim, backcast_length)
        self.forecast_fc = nn.Linear(thetas_dim, forecast_length)

    def forward(self, x):
        # no constraint for generic arch.
        x = super(GenericBlock, self).forward(x)

        theta_b = self.theta_b_fc(x)
        theta_f = self.theta_f_fc(x)

        backcast = self.backcast_fc(theta_b)  # generic. 3.3.
        forecast = self.forecast_fc(theta_f)  # generic. 3.3.

        return backcast, forecast


def split(arr, size):
    arrays = []
    while len(arr) > size:
        slice_ = arr[:size]
        arrays.append(slice_)
        arr = arr[size:]
    arrays.append(arr)
    return arrays


def build() -> dict:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    num_samples, time_steps, input_dim, output_dim = 10, 10, 1, 1

    model_pytorch = NBeatsNet(backcast_length=time_steps, forecast_length=output_dim,
                              stack_types=(NBeatsNet.GENERIC_BLOCK, NBeatsNet.GENERIC_BLOCK),
                              nb_blocks_per_stack=2, thetas_dim=(4, 4), share_weights_in_stack=True,
                              hidden_layer_units=8)
    model_pytorch.compile(loss='mae', optimizer='adam')

    x = np.random.uniform(size=(num_samples, time_steps, input_dim))
    y = np.mean(x, axis=1, keepdims=True)

    c = num_samples // 10
    x_train, y_train, x_test, y_test = x[c:], y[c:], x[:c], y[:c]
    # model_pytorch.fit(x_train, y_train, validation_data=(x_test, y_test), epochs=20, batch_size=4)
    return {"model": model_pytorch, "optimizer": model_pytorch._opt, "x_train": x_train, "y_train": y_train,
            "validation_data": (x_test, y_test), "epochs": 20, "batch_size": 4, "epoch": 0, "position": 0,
            "shuffled_indices": [], "train_loss": [], "history": []}


def fit_batch(state: dict) -> None:
    """One pass of fit()'s `for batch_id in shuffled_indices:`, with the epoch's start and end around it."""
    self, x_train, y_train, batch_size = state["model"], state["x_train"], state["y_train"], state["batch_size"]
    validation_data, epochs, epoch = state["validation_data"], state["epochs"], state["epoch"]
    if state["position"] == 0:
        x_train_list = split(x_train, batch_size)
        y_train_list = split(y_train, batch_size)
        assert len(x_train_list) == len(y_train_list)
        shuffled_indices = list(range(len(x_train_list)))
        random.shuffle(shuffled_indices)
        self.train()
        state["train_loss"] = []
        state["timer"] = time()
        state["x_train_list"], state["y_train_list"], state["shuffled_indices"] = (
            x_train_list, y_train_list, shuffled_indices)
    x_train_list, y_train_list, shuffled_indices = (
        state["x_train_list"], state["y_train_list"], state["shuffled_indices"])
    batch_id = shuffled_indices[state["position"]]
    state["position"] += 1

    batch_x, batch_y = x_train_list[batch_id], y_train_list[batch_id]
    self._opt.zero_grad()
    _, forecast = self(torch.tensor(batch_x, dtype=torch.float).to(self.device))
    loss = self._loss(forecast, squeeze_last_dim(torch.tensor(batch_y, dtype=torch.float).to(self.device)))
    state["train_loss"].append(loss.item())  # @train_loss
    loss.backward()  # @backward
    self._opt.step()

    if state["position"] == len(shuffled_indices):
        elapsed_time = time() - state["timer"]
        train_loss = np.mean(state["train_loss"])  # @epoch_mean

        test_loss = '[undefined]'
        if validation_data is not None:
            x_test, y_test = validation_data
            self.eval()
            _, forecast = self(torch.tensor(x_test, dtype=torch.float).to(self.device))
            test_loss = self._loss(forecast, squeeze_last_dim(torch.tensor(y_test, dtype=torch.float))).item()

        num_samples = len(x_train_list)
        time_per_step = int(elapsed_time / num_samples * 1000)
        state["history"].append((epoch + 1, epochs, num_samples, time_per_step, train_loss, test_loss))
        state["epoch"] += 1
        state["position"] = 0


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        fit_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: fit_batch(state)


if __name__ == "__main__":
    run(build())
