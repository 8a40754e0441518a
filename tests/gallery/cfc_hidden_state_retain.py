"""A closed-form continuous-time RNN (CfC, ncps) trained with its hidden state `hx` passed back in, and the retain.

Source: mlech26l/ncps issue #62 (https://github.com/mlech26l/ncps/issues/62, "Python gives an Runtime error when I
try to send hidden state (hx) to the CfC model"): passing the returned `hx` into the next call raised "Trying to
backward through the graph a second time"; with `loss.backward(retain_graph=True)` it raised instead "one of the
variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [17, 10]],
which is output 0 of AsStridedBackward0". The model is ncps's, retyped from ncps/torch/cfc_cell.py and
ncps/torch/cfc.py (commit 08dc3d16fd835b176c75afb0c418cac513e6f0d8): LeCun, CfCCell (default mode, no sparsity
mask) and CfC (batch_first, return_sequences, proj_size; the wired and mixed-memory branches left out). The issue's
data preparation is not published ("I did not add some datasets, preparations and variables"); here input size 7
and 10 units with backbone_layers=0 (so the cell's `ff1`/`ff2`/`time_a`/`time_b` are Linear(17, 10), the
[17, 10] of the message once transposed), made-up sequences of 5 steps, batch 4, Adam, MSE, the loop the issue
describes: `output, hx = model(x, hx)`, `loss.backward(retain_graph=True)`, `optimizer.step()`.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 2, "line": "@backward"},
    "retains": {"@backward": {"verdict": "goes with the carried fix", "runs": 1, "needed_runs": 1}},
    "carried": [{"variable": "hx", "line": "@cfc_forward"}],
    "notes": [],
    "modifies_in_place": [],
}


class LeCun(nn.Module):
    def __init__(self):
        super(LeCun, self).__init__()
        self.tanh = nn.Tanh()

    def forward(self, x):
        return 1.7159 * self.tanh(0.666 * x)


class CfCCell(nn.Module):
    def __init__(self, input_size, hidden_size, mode="default", backbone_activation="lecun_tanh",
                 backbone_units=128, backbone_layers=1, backbone_dropout=0.0):
        super(CfCCell, self).__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.mode = mode
        backbone_activation = LeCun
        layer_list = [
            nn.Linear(input_size + hidden_size, backbone_units),
            backbone_activation(),
        ]
        for i in range(1, backbone_layers):
            layer_list.append(nn.Linear(backbone_units, backbone_units))
            layer_list.append(backbone_activation())
            if backbone_dropout > 0.0:
                layer_list.append(torch.nn.Dropout(backbone_dropout))
        self.backbone = nn.Sequential(*layer_list)
        self.backbone_layers = backbone_layers
        self.tanh = nn.Tanh()
        self.sigmoid = nn.Sigmoid()
        cat_shape = int(self.hidden_size + input_size if backbone_layers == 0 else backbone_units)
        self.ff1 = nn.Linear(cat_shape, hidden_size)
        self.ff2 = nn.Linear(cat_shape, hidden_size)
        self.time_a = nn.Linear(cat_shape, hidden_size)
        self.time_b = nn.Linear(cat_shape, hidden_size)
        self.init_weights()

    def init_weights(self):
        for w in self.parameters():
            if w.dim() == 2 and w.requires_grad:
                torch.nn.init.xavier_uniform_(w)

    def forward(self, input, hx, ts):
        x = torch.cat([input, hx], 1)
        if self.backbone_layers > 0:
            x = self.backbone(x)
        ff1 = self.ff1(x)
        ff2 = self.ff2(x)
        ff1 = self.tanh(ff1)
        ff2 = self.tanh(ff2)
        t_a = self.time_a(x)
        t_b = self.time_b(x)
        t_interp = self.sigmoid(t_a * ts + t_b)
        new_hidden = ff1 * (1.0 - t_interp) + t_interp * ff2
        return new_hidden, new_hidden


class CfC(nn.Module):
    def __init__(self, input_size, units, proj_size=None, return_sequences=True, batch_first=True,
                 backbone_units=None, backbone_layers=None, backbone_dropout=None):
        super(CfC, self).__init__()
        self.input_size = input_size
        self.batch_first = batch_first
        self.return_sequences = return_sequences
        backbone_units = 128 if backbone_units is None else backbone_units
        backbone_layers = 1 if backbone_layers is None else backbone_layers
        backbone_dropout = 0.0 if backbone_dropout is None else backbone_dropout
        self.hidden_size = units
        self.output_size = self.hidden_size
        self.rnn_cell = CfCCell(input_size, units, "default", "lecun_tanh", backbone_units, backbone_layers,
                                backbone_dropout)
        if proj_size is None:
            self.fc = nn.Identity()
        else:
            self.fc = nn.Linear(self.output_size, proj_size)

    def forward(self, input, hx=None, timespans=None):
        device = input.device
        batch_dim = 0 if self.batch_first else 1
        seq_dim = 1 if self.batch_first else 0
        batch_size, seq_len = input.size(batch_dim), input.size(seq_dim)
        if hx is None:
            h_state = torch.zeros((batch_size, self.hidden_size), device=device)
        else:
            h_state = hx
        output_sequence = []
        for t in range(seq_len):
            if self.batch_first:
                inputs = input[:, t]
                ts = 1.0 if timespans is None else timespans[:, t].squeeze()
            else:
                inputs = input[t]
                ts = 1.0 if timespans is None else timespans[t].squeeze()
            h_out, h_state = self.rnn_cell.forward(inputs, h_state, ts)
            if self.return_sequences:
                output_sequence.append(self.fc(h_out))
        if self.return_sequences:
            stack_dim = 1 if self.batch_first else 0
            readout = torch.stack(output_sequence, dim=stack_dim)
        else:
            readout = self.fc(h_out)
        hx = h_state
        return readout, hx


def build() -> dict:
    torch.manual_seed(0)
    model = CfC(7, 10, proj_size=1, backbone_layers=0)
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "criterion": nn.MSELoss(),
        "xs": torch.randn(6, 4, 5, 7),
        "ys": torch.randn(6, 4, 5, 1),
        "hx": None,
        "step": 0,
    }


def iteration(state: dict) -> None:
    model, optimizer, criterion = state["model"], state["optimizer"], state["criterion"]
    x, y = state["xs"][state["step"] % 6], state["ys"][state["step"] % 6]
    output, state["hx"] = model(x, state["hx"])  # @cfc_forward
    loss = criterion(output, y)
    optimizer.zero_grad()
    loss.backward(retain_graph=True)  # @backward
    optimizer.step()
    state["step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
