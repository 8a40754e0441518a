"""snnTorch tutorial 5: a fully-connected spiking network of two Leaky layers, trained through time on MNIST.

Source: jeshraghian/snntorch, docs/tutorials/tutorial_5.rst (commit 02fc50bc40b85a528b0fd84ddf2038687a050d75),
sections 6 ("Define the Network") and 7.5 ("Training Loop"): `Net` with fc1 -> Leaky -> fc2 -> Leaky, whose forward
calls `self.lif1.init_leaky()` / `self.lif2.init_leaky()` at t=0 of every batch and unrolls `num_steps` time
steps, recording the output layer's spikes and membrane; the loop builds `loss_val = torch.zeros((1))` and adds the
cross-entropy of the membrane at every step in place (`loss_val += loss(mem_rec[step], targets)`), then
zero_grad / backward / step, `loss_hist.append(loss_val.item())`, and a test-set forward under torch.no_grad() with
`net.eval()`. snntorch is not installed: the Leaky neuron is retyped in plain torch from
snntorch/_neurons/leaky.py (commit 26c5405aab5e9e0b03f26e2330fd87e718f292e3: `init_leaky` returns a lazily
shaped zero state, `mem_reset` = detached spike of `mem - threshold`, the subtract-reset state function
`beta.clamp(0, 1) * mem + input_ - reset * threshold`, `fire` through the surrogate) and the default surrogate
`ATan` (alpha=2, snntorch/surrogate.py: Heaviside forward, `alpha/2 / (1 + (pi/2*alpha*x)^2)` backward), beta and
threshold as buffers. Retyped at CPU size: 4x4 images (784 -> 16 inputs), 12 hidden, 10 outputs, 5 time steps
(published 25), batch 8 (published 128), made-up data in place of MNIST, one epoch of ITERATIONS minibatches,
printing left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

# Network Architecture
num_inputs = 4 * 4
num_hidden = 12
num_outputs = 10

# Temporal Dynamics
num_steps = 5
beta = 0.95
batch_size = 8
dtype = torch.float
device = torch.device("cpu")


class ATan(torch.autograd.Function):
    """snntorch.surrogate.ATan: a Heaviside forward, the arctangent's derivative backward."""

    @staticmethod
    def forward(ctx, input_, alpha=2.0):
        ctx.save_for_backward(input_)
        ctx.alpha = alpha
        out = (input_ > 0).float()
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (input_,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad = ctx.alpha / 2 / (1 + (torch.pi / 2 * ctx.alpha * input_).pow_(2)) * grad_input
        return grad, None


def atan(alpha=2.0):
    def inner(x):
        return ATan.apply(x, alpha)

    return inner


class Leaky(nn.Module):
    """snn.Leaky with init_hidden=False and reset_mechanism="subtract", retyped in plain torch."""

    def __init__(self, beta, threshold=1.0, spike_grad=None):
        super().__init__()
        self.register_buffer("beta", torch.as_tensor(beta))
        self.register_buffer("threshold", torch.as_tensor(threshold))
        self.spike_grad = atan() if spike_grad is None else spike_grad

    def init_leaky(self):
        # _SpikeTensor(init_flag=False): a placeholder given the input's shape on the first pass
        return torch.zeros(0)

    def fire(self, mem):
        mem_shift = mem - self.threshold
        spk = self.spike_grad(mem_shift)
        return spk

    def mem_reset(self, mem):
        mem_shift = mem - self.threshold
        reset = self.spike_grad(mem_shift).clone().detach()
        return reset

    def forward(self, input_, mem):
        if mem.numel() == 0:  # only triggered on first-pass (_SpikeTorchConv)
            mem = torch.zeros_like(input_)
        self.reset = self.mem_reset(mem)
        mem = self.beta.clamp(0, 1) * (mem - self.reset * self.threshold) + input_
        spk = self.fire(mem)
        return spk, mem


# Define Network
class Net(nn.Module):
    def __init__(self):
        super().__init__()

        # Initialize layers
        self.fc1 = nn.Linear(num_inputs, num_hidden)
        self.lif1 = Leaky(beta=beta)
        self.fc2 = nn.Linear(num_hidden, num_outputs)
        self.lif2 = Leaky(beta=beta)

    def forward(self, x):

        # Initialize hidden states at t=0
        mem1 = self.lif1.init_leaky()
        mem2 = self.lif2.init_leaky()

        # Record the final layer
        spk2_rec = []
        mem2_rec = []

        for step in range(num_steps):
            cur1 = self.fc1(x)
            spk1, mem1 = self.lif1(cur1, mem1)
            cur2 = self.fc2(spk1)
            spk2, mem2 = self.lif2(cur2, mem2)
            spk2_rec.append(spk2)
            mem2_rec.append(mem2)

        return torch.stack(spk2_rec, dim=0), torch.stack(mem2_rec, dim=0)


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    net = Net().to(device)
    data = torch.rand(ITERATIONS + 1, batch_size, 1, 4, 4)
    targets = torch.randint(0, num_outputs, (ITERATIONS + 1, batch_size))
    test_data = torch.rand(batch_size, 1, 4, 4)
    test_targets = torch.randint(0, num_outputs, (batch_size,))
    return {
        "net": net,
        "loss": nn.CrossEntropyLoss(),
        "optimizer": torch.optim.Adam(net.parameters(), lr=5e-4, betas=(0.9, 0.999)),
        "train_batches": list(zip(data, targets)),
        "test_batch": (test_data, test_targets),
        "loss_hist": [],
        "test_loss_hist": [],
        "counter": 0,
    }


def iteration(state: dict) -> None:
    net, loss, optimizer = state["net"], state["loss"], state["optimizer"]
    data, targets = state["train_batches"][state["counter"] % len(state["train_batches"])]
    data = data.to(device)
    targets = targets.to(device)

    # forward pass
    net.train()
    spk_rec, mem_rec = net(data.view(batch_size, -1))

    # initialize the loss & sum over time
    loss_val = torch.zeros((1), dtype=dtype, device=device)
    for step in range(num_steps):
        loss_val += loss(mem_rec[step], targets)

    # Gradient calculation + weight update
    optimizer.zero_grad()
    loss_val.backward()
    optimizer.step()

    # Store loss history for future plotting
    state["loss_hist"].append(loss_val.item())

    # Test set
    with torch.no_grad():
        net.eval()
        test_data, test_targets = state["test_batch"]
        test_data = test_data.to(device)
        test_targets = test_targets.to(device)

        # Test set forward pass
        test_spk, test_mem = net(test_data.view(batch_size, -1))

        # Test set loss
        test_loss = torch.zeros((1), dtype=dtype, device=device)
        for step in range(num_steps):
            test_loss += loss(test_mem[step], test_targets)
        state["test_loss_hist"].append(test_loss.item())
        state["counter"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    # Minibatch training loop
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
