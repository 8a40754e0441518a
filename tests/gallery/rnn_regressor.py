"""An RNN regressor whose hidden state is carried across steps and cut with `h_state = h_state.data`.

Source: MorvanZhou/PyTorch-Tutorial, tutorial-contents/403_RNN_regressor.py (torch 0.4): nn.RNN with
batch_first, a Linear head per time step, Adam, `h_state = None` before the loop, then per step
`prediction, h_state = rnn(x, h_state)`, `h_state = h_state.data`, MSE, zero_grad, backward, step.
Retyped at CPU size: hidden size 8 (published 32), TIME_STEP 4 (published 10), 3 steps; plotting left out.
"""

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

ITERATIONS = 3
TIME_STEP = 4
INPUT_SIZE = 1
LR = 0.02

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class RNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(input_size=INPUT_SIZE, hidden_size=8, num_layers=1, batch_first=True)
        self.out = nn.Linear(8, 1)

    def forward(self, x, h_state):
        r_out, h_state = self.rnn(x, h_state)  # @rnn_forward
        outs = []
        for time_step in range(r_out.size(1)):
            outs.append(self.out(r_out[:, time_step, :]))
        return torch.stack(outs, dim=1), h_state


def build() -> dict:
    torch.manual_seed(0)
    rnn = RNN()
    return {
        "rnn": rnn,
        "optimizer": torch.optim.Adam(rnn.parameters(), lr=LR),
        "loss_func": nn.MSELoss(),
        "h_state": None,
        "step": 0,
    }


def iteration(state: dict) -> None:
    rnn, optimizer, loss_func, step = state["rnn"], state["optimizer"], state["loss_func"], state["step"]
    start, end = step * np.pi, (step + 1) * np.pi
    steps = np.linspace(start, end, TIME_STEP, dtype=np.float32)
    x_np = np.sin(steps)
    y_np = np.cos(steps)
    x = torch.from_numpy(x_np[np.newaxis, :, np.newaxis])
    y = torch.from_numpy(y_np[np.newaxis, :, np.newaxis])

    prediction, state["h_state"] = rnn(x, state["h_state"])
    state["h_state"] = state["h_state"].data  # @repack

    loss = loss_func(prediction, y)
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()
    state["step"] = step + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
