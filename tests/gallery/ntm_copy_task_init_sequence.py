"""pytorch-ntm's copy task: the NTM's memory, read weights and LSTM state reset by `net.init_sequence` per batch.

Source: loudinthecloud/pytorch-ntm, train.py `train_batch` (commit 3c64937cb075e737528ff7ecf02b2c1c6d8347a1),
tasks/copytask.py (same commit: dataloader, BCELoss, RMSprop(momentum=0.9, alpha=0.95)), ntm/aio.py and ntm/ntm.py
(same commit), ntm/memory.py (commit 3fce69bbab93bb02e669af22d2837c20e4562886), ntm/head.py and ntm/controller.py
(commit 2b83a99dd7403d00a73b40a85ab08c4d62685613). As published: EncapsulatedNTM (LSTMController with learned
initial h/c biases, one read and one write head with content+location addressing, circular shift, sharpening,
erase/add writes), train_batch: zero_grad, `net.init_sequence(batch_size)` (a fresh memory from `mem_bias`, fresh
read vectors and head weightings, LSTM state from its bias parameters: the state every sequence starts from), the
input sequence + delimiter fed step by step, the output read into `y_out` by indexed assignment, BCELoss, backward,
clip_grads (grad.data.clamp_), optimizer.step(), the binarised cost. Retyped at CPU size: controller 16 (published
100), memory 8 x 4 (published 128 x 20), sequence width 3 (published 8), lengths 1..3 (published 1..20), batch 2
(published 1), lr 1e-3 (published 1e-4); F.sigmoid written torch.sigmoid; logging, progress bar and checkpoints out.
"""

import random
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn import Parameter

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "net.previous_state", "line": "@ntm_forward"}],
    "modifies_in_place": [],
}


def _convolve(w, s):
    """Circular convolution implementation."""
    assert s.size(0) == 3
    t = torch.cat([w[-1:], w, w[:1]])
    c = F.conv1d(t.view(1, 1, -1), s.view(1, 1, -1)).view(-1)
    return c


class NTMMemory(nn.Module):
    """Memory bank for NTM."""
    def __init__(self, N, M):
        super(NTMMemory, self).__init__()
        self.N = N
        self.M = M
        self.register_buffer('mem_bias', torch.Tensor(N, M))
        stdev = 1 / (np.sqrt(N + M))
        nn.init.uniform_(self.mem_bias, -stdev, stdev)

    def reset(self, batch_size):
        """Initialize memory from bias, for start-of-sequence."""
        self.batch_size = batch_size
        self.memory = self.mem_bias.clone().repeat(batch_size, 1, 1)

    def size(self):
        return self.N, self.M

    def read(self, w):
        return torch.matmul(w.unsqueeze(1), self.memory).squeeze(1)

    def write(self, w, e, a):
        self.prev_mem = self.memory
        self.memory = torch.Tensor(self.batch_size, self.N, self.M)
        erase = torch.matmul(w.unsqueeze(-1), e.unsqueeze(1))
        add = torch.matmul(w.unsqueeze(-1), a.unsqueeze(1))
        self.memory = self.prev_mem * (1 - erase) + add  # @memory_write

    def address(self, k, β, g, s, γ, w_prev):
        wc = self._similarity(k, β)
        wg = self._interpolate(w_prev, wc, g)
        ŵ = self._shift(wg, s)
        w = self._sharpen(ŵ, γ)
        return w

    def _similarity(self, k, β):
        k = k.view(self.batch_size, 1, -1)
        w = F.softmax(β * F.cosine_similarity(self.memory + 1e-16, k + 1e-16, dim=-1), dim=1)
        return w

    def _interpolate(self, w_prev, wc, g):
        return g * wc + (1 - g) * w_prev

    def _shift(self, wg, s):
        result = torch.zeros(wg.size())
        for b in range(self.batch_size):
            result[b] = _convolve(wg[b], s[b])
        return result

    def _sharpen(self, ŵ, γ):
        w = ŵ ** γ
        w = torch.div(w, torch.sum(w, dim=1).view(-1, 1) + 1e-16)
        return w


def _split_cols(mat, lengths):
    assert mat.size()[1] == sum(lengths), "Lengths must be summed to num columns"
    l = np.cumsum([0] + lengths)
    results = []
    for s, e in zip(l[:-1], l[1:]):  # noqa: RUF007 (as published)
        results += [mat[:, s:e]]
    return results


class NTMHeadBase(nn.Module):
    def __init__(self, memory, controller_size):
        super(NTMHeadBase, self).__init__()
        self.memory = memory
        self.N, self.M = memory.size()
        self.controller_size = controller_size

    def _address_memory(self, k, β, g, s, γ, w_prev):
        k = k.clone()
        β = F.softplus(β)
        g = torch.sigmoid(g)
        s = F.softmax(s, dim=1)
        γ = 1 + F.softplus(γ)
        w = self.memory.address(k, β, g, s, γ, w_prev)
        return w


class NTMReadHead(NTMHeadBase):
    def __init__(self, memory, controller_size):
        super(NTMReadHead, self).__init__(memory, controller_size)
        self.read_lengths = [self.M, 1, 1, 3, 1]
        self.fc_read = nn.Linear(controller_size, sum(self.read_lengths))
        self.reset_parameters()

    def create_new_state(self, batch_size):
        return torch.zeros(batch_size, self.N)

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.fc_read.weight, gain=1.4)
        nn.init.normal_(self.fc_read.bias, std=0.01)

    def is_read_head(self):
        return True

    def forward(self, embeddings, w_prev):
        o = self.fc_read(embeddings)
        k, β, g, s, γ = _split_cols(o, self.read_lengths)
        w = self._address_memory(k, β, g, s, γ, w_prev)
        r = self.memory.read(w)
        return r, w


class NTMWriteHead(NTMHeadBase):
    def __init__(self, memory, controller_size):
        super(NTMWriteHead, self).__init__(memory, controller_size)
        self.write_lengths = [self.M, 1, 1, 3, 1, self.M, self.M]
        self.fc_write = nn.Linear(controller_size, sum(self.write_lengths))
        self.reset_parameters()

    def create_new_state(self, batch_size):
        return torch.zeros(batch_size, self.N)

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.fc_write.weight, gain=1.4)
        nn.init.normal_(self.fc_write.bias, std=0.01)

    def is_read_head(self):
        return False

    def forward(self, embeddings, w_prev):
        o = self.fc_write(embeddings)
        k, β, g, s, γ, e, a = _split_cols(o, self.write_lengths)
        e = torch.sigmoid(e)
        w = self._address_memory(k, β, g, s, γ, w_prev)
        self.memory.write(w, e, a)
        return w


class LSTMController(nn.Module):
    def __init__(self, num_inputs, num_outputs, num_layers):
        super(LSTMController, self).__init__()
        self.num_inputs = num_inputs
        self.num_outputs = num_outputs
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size=num_inputs, hidden_size=num_outputs, num_layers=num_layers)
        self.lstm_h_bias = Parameter(torch.randn(self.num_layers, 1, self.num_outputs) * 0.05)
        self.lstm_c_bias = Parameter(torch.randn(self.num_layers, 1, self.num_outputs) * 0.05)
        self.reset_parameters()

    def create_new_state(self, batch_size):
        lstm_h = self.lstm_h_bias.clone().repeat(1, batch_size, 1)
        lstm_c = self.lstm_c_bias.clone().repeat(1, batch_size, 1)
        return lstm_h, lstm_c

    def reset_parameters(self):
        for p in self.lstm.parameters():
            if p.dim() == 1:
                nn.init.constant_(p, 0)
            else:
                stdev = 5 / (np.sqrt(self.num_inputs + self.num_outputs))
                nn.init.uniform_(p, -stdev, stdev)

    def size(self):
        return self.num_inputs, self.num_outputs

    def forward(self, x, prev_state):
        x = x.unsqueeze(0)
        outp, state = self.lstm(x, prev_state)
        return outp.squeeze(0), state


class NTM(nn.Module):
    def __init__(self, num_inputs, num_outputs, controller, memory, heads):
        super(NTM, self).__init__()
        self.num_inputs = num_inputs
        self.num_outputs = num_outputs
        self.controller = controller
        self.memory = memory
        self.heads = heads
        self.N, self.M = memory.size()
        _, self.controller_size = controller.size()
        self.num_read_heads = 0
        self.init_r = []
        for head in heads:
            if head.is_read_head():
                init_r_bias = torch.randn(1, self.M) * 0.01
                self.register_buffer("read{}_bias".format(self.num_read_heads), init_r_bias.data)
                self.init_r += [init_r_bias]
                self.num_read_heads += 1
        self.fc = nn.Linear(self.controller_size + self.num_read_heads * self.M, num_outputs)
        self.reset_parameters()

    def create_new_state(self, batch_size):
        init_r = [r.clone().repeat(batch_size, 1) for r in self.init_r]
        controller_state = self.controller.create_new_state(batch_size)
        heads_state = [head.create_new_state(batch_size) for head in self.heads]
        return init_r, controller_state, heads_state

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.fc.weight, gain=1)
        nn.init.normal_(self.fc.bias, std=0.01)

    def forward(self, x, prev_state):
        prev_reads, prev_controller_state, prev_heads_states = prev_state
        inp = torch.cat([x] + prev_reads, dim=1)
        controller_outp, controller_state = self.controller(inp, prev_controller_state)  # @controller
        reads = []
        heads_states = []
        for head, prev_head_state in zip(self.heads, prev_heads_states):
            if head.is_read_head():
                r, head_state = head(controller_outp, prev_head_state)
                reads += [r]
            else:
                head_state = head(controller_outp, prev_head_state)
            heads_states += [head_state]
        inp2 = torch.cat([controller_outp] + reads, dim=1)
        o = torch.sigmoid(self.fc(inp2))
        state = (reads, controller_state, heads_states)
        return o, state


class EncapsulatedNTM(nn.Module):
    def __init__(self, num_inputs, num_outputs, controller_size, controller_layers, num_heads, N, M):
        super(EncapsulatedNTM, self).__init__()
        self.num_inputs = num_inputs
        self.num_outputs = num_outputs
        self.controller_size = controller_size
        self.controller_layers = controller_layers
        self.num_heads = num_heads
        self.N = N
        self.M = M
        memory = NTMMemory(N, M)
        controller = LSTMController(num_inputs + M*num_heads, controller_size, controller_layers)
        heads = nn.ModuleList([])
        for i in range(num_heads):
            heads += [
                NTMReadHead(memory, controller_size),
                NTMWriteHead(memory, controller_size)
            ]
        self.ntm = NTM(num_inputs, num_outputs, controller, memory, heads)
        self.memory = memory

    def init_sequence(self, batch_size):
        """Initializing the state."""
        self.batch_size = batch_size
        self.memory.reset(batch_size)
        self.previous_state = self.ntm.create_new_state(batch_size)

    def forward(self, x=None):
        if x is None:
            x = torch.zeros(self.batch_size, self.num_inputs)
        o, self.previous_state = self.ntm(x, self.previous_state)  # @ntm_forward
        return o, self.previous_state


def dataloader(num_batches, batch_size, seq_width, min_len, max_len):
    for batch_num in range(num_batches):
        seq_len = random.randint(min_len, max_len)
        seq = np.random.binomial(1, 0.5, (seq_len, batch_size, seq_width))
        seq = torch.from_numpy(seq)
        inp = torch.zeros(seq_len + 1, batch_size, seq_width + 1)
        inp[:seq_len, :, :seq_width] = seq
        inp[seq_len, :, seq_width] = 1.0  # delimiter in our control channel
        outp = seq.clone()
        yield batch_num+1, inp.float(), outp.float()


def clip_grads(net):
    """Gradient clipping to the range [10, 10]."""
    parameters = list(filter(lambda p: p.grad is not None, net.parameters()))
    for p in parameters:
        p.grad.data.clamp_(-10, 10)


def train_batch(net, criterion, optimizer, X, Y):
    """Trains a single batch."""
    optimizer.zero_grad()
    inp_seq_len = X.size(0)
    outp_seq_len, batch_size, _ = Y.size()

    # New sequence
    net.init_sequence(batch_size)  # @init_sequence

    # Feed the sequence + delimiter
    for i in range(inp_seq_len):
        net(X[i])

    # Read the output (no input given)
    y_out = torch.zeros(Y.size())
    for i in range(outp_seq_len):
        y_out[i], _ = net()

    loss = criterion(y_out, Y)
    loss.backward()  # @backward
    clip_grads(net)
    optimizer.step()

    y_out_binarized = y_out.clone().data
    y_out_binarized.apply_(lambda x: 0 if x < 0.5 else 1)

    # The cost is the number of error bits per sequence
    cost = torch.sum(torch.abs(y_out_binarized - Y.data))

    return loss.item(), cost.item() / batch_size


def build() -> dict:
    np.random.seed(1000)
    torch.manual_seed(1000)
    random.seed(1000)
    sequence_width = 3
    net = EncapsulatedNTM(sequence_width + 1, sequence_width, 16, 1, 1, 8, 4)
    loader = list(dataloader(ITERATIONS, 2, sequence_width, 1, 3))
    optimizer = optim.RMSprop(net.parameters(), momentum=0.9, alpha=0.95, lr=1e-3)
    return {"net": net, "criterion": nn.BCELoss(), "optimizer": optimizer, "loader": loader, "batch": 0,
            "losses": [], "costs": [], "seq_lengths": []}


def iteration(state: dict) -> None:
    batch_num, x, y = state["loader"][state["batch"] % len(state["loader"])]
    state["batch"] += 1
    loss, cost = train_batch(state["net"], state["criterion"], state["optimizer"], x, y)
    state["losses"] += [loss]
    state["costs"] += [cost]
    state["seq_lengths"] += [y.size(0)]


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
