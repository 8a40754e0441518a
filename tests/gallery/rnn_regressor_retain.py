"""The same RNN regressor as its issue tracker's variant: the repack line removed, the backward retaining.

Source: MorvanZhou/PyTorch-Tutorial issue #57 ("403: question about h_state = h_state.data"): with
`h_state = h_state.data` commented out the tutorial raised "Trying to backward through the graph a
second time", "and later I found the error can actually be solved by loss.backward(retain_graph=True)".
That variant of tutorial-contents/403_RNN_regressor.py, retyped at the same CPU size as rnn_regressor.py.
On torch 2.13 it stops at iteration 2 all the same, now on the version check: the retained graph of
iteration 1 saved the RNN weights that Adam's step has since changed in place.
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
    "error": {"kind": "in-place version error", "iteration": 2, "line": "@backward"},
    "retains": {"@backward": {"verdict": "goes with the carried fix", "runs": 1, "needed_runs": 1}},
    "carried": [{"variable": "h_state", "line": "@rnn_forward"}],
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
    # h_state = h_state.data        # repack the hidden state, break the connection from last iteration

    loss = loss_func(prediction, y)
    optimizer.zero_grad()
    loss.backward(retain_graph=True)  # @backward
    optimizer.step()
    state["step"] = step + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
