"""Jacobian regularisation (Hoffman, Roberts & Yaida 2019): a random projection of the input-output Jacobian from
`torch.autograd.grad(..., retain_graph=True, create_graph=True)`, added to the cross-entropy and backpropagated.

Source: facebookresearch/jacobian_regularizer, jacobian/jacobian.py (commit
45655cce621b58e51e4a5b2b2ca6200a59a52e4b): JacobianReg(n) whose forward(x, y) draws `num_proj` random unit
vectors (`_random_vector`, with `torch.addcdiv(arxilirary_zero, 1.0, v, vnorm)` as published: torch 2.13 still
takes that overload, with a deprecation warning) and sums `C*torch.norm(Jv)**2 / (num_proj*B)` over
`_jacobian_vector_product(y, x, v, create_graph=True)`, which calls `torch.autograd.grad(flat_y, x, flat_v,
retain_graph=True, create_graph=create_graph)`; the loop of examples/mnist.py (commit
c74d5b13e670f3ad1fd5a7cec225bca3853b3565): `data.requires_grad = True`, `optimizer.zero_grad()`, `output =
model(data)`, `loss_super = criterion(output, target)`, `loss_JR = reg(data, output)`, `loss = loss_super +
lambda_JR*loss_JR`, `loss.backward()`, `optimizer.step()`, the running statistics. Retyped at CPU size: the MLP on
1x4x4 made-up images (compression 16, published 784), hidden widths 12 (published 200), 10 classes, batches of 8
(64) from a list of 3 batches in place of MNIST's DataLoader, n_proj = 1 as published; the evaluation with
JacobianReg(n=-1) before and after training (outside the training loop) and the downloads left out. With
`create_graph=True` the keyword `retain_graph=True` is what autograd.grad does anyway: removing it changes nothing.
"""

from __future__ import division

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {"@jvp_retain": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class JacobianReg(nn.Module):
    '''
    Loss criterion that computes the trace of the square of the Jacobian.

    Arguments:
        n (int, optional): determines the number of random projections.
            If n=-1, then it is set to the dimension of the output
            space and projection is non-random and orthonormal, yielding
            the exact result.  For any reasonable batch size, the default
            (n=1) should be sufficient.
    '''
    def __init__(self, n=1):
        assert n == -1 or n > 0
        self.n = n
        super(JacobianReg, self).__init__()

    def forward(self, x, y):
        '''
        computes (1/2) tr |dy/dx|^2
        '''
        B, C = y.shape
        if self.n == -1:
            num_proj = C
        else:
            num_proj = self.n
        J2 = 0
        for ii in range(num_proj):
            if self.n == -1:
                # orthonormal vector, sequentially spanned
                v = torch.zeros(B, C)
                v[:, ii] = 1
            else:
                # random properly-normalized vector for each sample
                v = self._random_vector(C=C, B=B)
            if x.is_cuda:
                v = v.to(x.device)
            Jv = self._jacobian_vector_product(y, x, v, create_graph=True)
            J2 += C*torch.norm(Jv)**2 / (num_proj*B)
        R = (1/2)*J2
        return R

    def _random_vector(self, C, B):
        '''
        creates a random vector of dimension C with a norm of C^(1/2)
        (as needed for the projection formula to work)
        '''
        if C == 1:
            return torch.ones(B)
        v = torch.randn(B, C)
        arxilirary_zero = torch.zeros(B, C)
        vnorm = torch.norm(v, 2, 1, True)
        v = torch.addcdiv(arxilirary_zero, 1.0, v, vnorm)
        return v

    def _jacobian_vector_product(self, y, x, v, create_graph=False):
        '''
        Produce jacobian-vector product dy/dx dot v.

        Note that if you want to differentiate it,
        you need to make create_graph=True
        '''
        flat_y = y.reshape(-1)
        flat_v = v.reshape(-1)
        grad_x, = torch.autograd.grad(flat_y, x, flat_v,
                                      retain_graph=True,  # @jvp_retain
                                      create_graph=create_graph)
        return grad_x


class MLP(nn.Module):
    '''
    Simple MLP to demonstrate Jacobian regularization.
    '''
    def __init__(self, in_channel=1, im_size=4, num_classes=10,
                 fc_channel1=12, fc_channel2=12):
        super(MLP, self).__init__()

        # Parameter setup
        compression = in_channel*im_size*im_size
        self.compression = compression

        # Structure
        self.fc1 = nn.Linear(compression, fc_channel1)
        self.fc2 = nn.Linear(fc_channel1, fc_channel2)
        self.fc3 = nn.Linear(fc_channel2, num_classes)

        # Initialization protocol
        nn.init.xavier_uniform_(self.fc1.weight)
        nn.init.xavier_uniform_(self.fc2.weight)
        nn.init.xavier_uniform_(self.fc3.weight)

    def forward(self, x):
        x = x.view(-1, self.compression)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


def build() -> dict:
    seed = 1
    lambda_JR = .1
    n_proj = 1
    torch.manual_seed(seed)
    device = torch.device("cpu")
    batches = [(torch.randn(8, 1, 4, 4), torch.randint(0, 10, (8,))) for _ in range(3)]
    model = MLP()
    model.to(device)
    criterion = nn.CrossEntropyLoss()
    reg = JacobianReg(n=n_proj)  # if n_proj = 1, the argument is unnecessary
    optimizer = optim.SGD(model.parameters(),
                          lr=0.01, momentum=0.9, weight_decay=5e-4)
    return {"model": model, "criterion": criterion, "reg": reg, "optimizer": optimizer, "device": device,
            "lambda_JR": lambda_JR, "trainloader": iter(enumerate(batches)), "epoch": 0,
            "running_loss_super": 0.0, "running_loss_JR": 0.0}


def iteration(state: dict) -> None:
    model, criterion, reg, optimizer = state["model"], state["criterion"], state["reg"], state["optimizer"]
    device, lambda_JR, epoch = state["device"], state["lambda_JR"], state["epoch"]
    idx, (data, target) = next(state["trainloader"])

    data, target = data.to(device), target.to(device)
    data.requires_grad = True  # this is essential!

    optimizer.zero_grad()

    output = model(data)  # forward pass

    loss_super = criterion(output, target)  # supervised loss
    loss_JR = reg(data, output)   # Jacobian regularization
    loss = loss_super + lambda_JR*loss_JR  # full loss

    loss.backward()  # computes gradients

    optimizer.step()

    # print running statistics
    state["running_loss_super"] += loss_super.item()
    state["running_loss_JR"] += loss_JR.item()
    if idx % 100 == 99:    # print every 100 mini-batches
        print('[%d, %5d] supervised loss: %.3f, Jacobian loss: %.3f' %
              (epoch + 1, idx + 1, state["running_loss_super"] / 100, state["running_loss_JR"] / 100))
        state["running_loss_super"] = 0.0
        state["running_loss_JR"] = 0.0


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
