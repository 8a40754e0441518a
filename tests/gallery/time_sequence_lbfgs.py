"""Two stacked LSTMCells learning sine waves with LBFGS: every step calls its closure many times, each a fresh graph.

Source: pytorch/examples, time_sequence_prediction/train.py (commit 04b1f3cec923d40972d998a7ed3c00c1b37e765e) and
generate_sine_wave.py: Sequence (lstm1 = LSTMCell(1, 51), lstm2 = LSTMCell(51, 51), linear, a `dummy_param` for
the device, the zero states made inside forward, `input.split(1, dim=1)`, the `future` loop fed with its own output),
`seq = Sequence().double()`, MSELoss, `optim.LBFGS(seq.parameters(), lr=0.8)`, and per step the closure
(zero_grad, `out = seq(input)`, loss, `loss.backward()`, return loss), `optimizer.step(closure)`, then the test
prediction under torch.no_grad(). Retyped at CPU size: hidden size 8 (published 51), 6 made-up sine waves of
length 12 (generate_sine_wave.py's recipe with T=20 and N=100, L=1000, here N=6, L=12, in place of traindata.pt),
future=4 (published 1000); the prints, matplotlib figures and argparse left out, the device is the CPU. One
iteration is one pass of `for i in range(opt.steps)`.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3
HIDDEN = 8

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Sequence(nn.Module):
    def __init__(self):
        super(Sequence, self).__init__()
        self.lstm1 = nn.LSTMCell(1, HIDDEN)
        self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = nn.Linear(HIDDEN, 1)
        self.dummy_param = nn.Parameter(torch.empty(0))

    def forward(self, input, future = 0):
        outputs = []
        device = self.dummy_param.device
        h_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        c_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        h_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        c_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):# if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def generate_sine_wave() -> np.ndarray:
    T = 20
    L = 12
    N = 6
    x = np.empty((N, L), 'int64')
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    return np.sin(x / 1.0 / T).astype('float64')


def build() -> dict:
    device = torch.device("cpu")
    # set random seed to 0
    np.random.seed(2)
    data = torch.from_numpy(generate_sine_wave()).to(device)
    np.random.seed(0)
    torch.manual_seed(0)
    input = data[3:, :-1]
    target = data[3:, 1:]
    test_input = data[:3, :-1]
    test_target = data[:3, 1:]
    # build the model
    seq = Sequence().to(device).double()
    criterion = nn.MSELoss().to(device)
    # use LBFGS as optimizer since we can load the whole data to train
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
    return {"seq": seq, "optimizer": optimizer, "criterion": criterion, "input": input, "target": target,
            "test_input": test_input, "test_target": test_target}


def iteration(state: dict) -> None:
    seq, optimizer, criterion = state["seq"], state["optimizer"], state["criterion"]
    input, target, test_input, test_target = state["input"], state["target"], state["test_input"], state["test_target"]

    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        loss.backward()  # @backward
        return loss
    optimizer.step(closure)
    # begin to predict, no need to track gradient here
    with torch.no_grad():
        future = 4
        pred = seq(test_input, future=future)
        loss = criterion(pred[:, :-future], test_target)
        y = pred.cpu().detach().numpy()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
