"""Learning to learn by gradient descent by gradient descent: a learned optimizer unrolled over optimizee steps.

Source: ikostrikov/pytorch-meta-optimizer, main.py (commit 66d4801d50c044fcbb7dc1c11c330a94d8a2908f),
meta_optimizer.py (commit 0154d4d4fc856163885a62bac06174311aa58caf), model.py (commit
82169f2bb378a4cac7f61c124c9fc9deb5f4c50b) and utils.py (preprocess_gradients): main() as published, with the
FastMetaOptimizer it builds (`FastMetaOptimizer(MetaModel(meta_model), args.num_layers, args.hidden_size)`, Adam
lr 1e-3 over its parameters); each update samples a new Model, takes its initial loss, then for each of
`optimizer_steps // truncated_bptt_step` unrolls calls `reset_lstm(keep_states=k > 0, ...)` (MetaModel.reset and
copy_params_from; `self.f = Variable(self.f.data)`, `self.i = Variable(self.i.data)` between unrolls, zeros at the
first), and for each step of the unroll: the optimizee's loss, `model.zero_grad()`, `loss.backward()`,
`meta_model = meta_optimizer.meta_update(model, loss.data)` (the flat parameters `self.f * flat_params - self.i *
flat_grads` set into the meta model's `_parameters`, then copied into the optimizee), the meta model's loss added to
`loss_sum` less `prev_loss`; then `meta_optimizer.zero_grad()`, `loss_sum.backward()`, the gradients clamped to
[-1, 1] and `optimizer.step()`. Retyped at CPU size: `Variable(...)` removed (plain tensors), `.cuda()` and the
argparse parser dropped (a namespace of its defaults), Model 784 -> 32 -> 10 becomes 16 -> 8 -> 4 (log_softmax
with its implicit dim written as dim=1, F.sigmoid written torch.sigmoid), batch_size 4 (published 32),
optimizer_steps 4 and truncated_bptt_step 2 (published 100 and 20: two unrolls of two steps), MNIST replaced by
made-up batches of 16 features and 4 classes; one pass of `for i in range(args.updates_per_epoch)` is an
iteration; `loss.data[0]` (an error on a 0-dim tensor since torch 0.4) written `loss.item()`; the epoch's print
left out.
"""

import math
from collections.abc import Callable
from functools import reduce
from operator import mul
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [
        {"variable": "meta_optimizer.f", "line": "@f_i"},
        {"variable": "meta_optimizer.i", "line": "@f_i"},
    ],
    "modifies_in_place": [],
}

args = SimpleNamespace(batch_size=4, optimizer_steps=4, truncated_bptt_step=2, updates_per_epoch=10,
                       max_epoch=10000, hidden_size=10, num_layers=2, cuda=False)

assert args.optimizer_steps % args.truncated_bptt_step == 0


# ---------------------------------------------------------------- utils.py


def preprocess_gradients(x):
    p = 10
    eps = 1e-6
    indicator = (x.abs() > math.exp(-p)).float()
    x1 = (x.abs() + eps).log() / p * indicator - (1 - indicator)
    x2 = x.sign() * indicator + math.exp(p) * x * (1 - indicator)

    return torch.cat((x1, x2), 1)


# ---------------------------------------------------------------- model.py


class Model(nn.Module):

    def __init__(self):
        super(Model, self).__init__()
        self.linear1 = nn.Linear(16, 8)
        self.linear2 = nn.Linear(8, 4)

    def forward(self, inputs):
        x = inputs.view(-1, 16)
        x = F.relu(self.linear1(x))
        x = self.linear2(x)
        return F.log_softmax(x, dim=1)


# ---------------------------------------------------------------- meta_optimizer.py


class FastMetaOptimizer(nn.Module):

    def __init__(self, model, num_layers, hidden_size):
        super(FastMetaOptimizer, self).__init__()
        self.meta_model = model

        self.linear1 = nn.Linear(6, 2)
        self.linear1.bias.data[0] = 1

    def forward(self, x):
        # Gradients preprocessing
        x = torch.sigmoid(self.linear1(x))
        return x.split(1, 1)

    def reset_lstm(self, keep_states=False, model=None, use_cuda=False):
        self.meta_model.reset()
        self.meta_model.copy_params_from(model)

        if keep_states:
            self.f = self.f.data  # @keep_f
            self.i = self.i.data  # @keep_i
        else:
            self.f = torch.zeros(1, 1)
            self.i = torch.zeros(1, 1)

    def meta_update(self, model_with_grads, loss):
        # First we need to create a flat version of parameters and gradients
        grads = []

        for module in model_with_grads.children():
            grads.append(module._parameters['weight'].grad.data.view(-1).unsqueeze(-1))
            grads.append(module._parameters['bias'].grad.data.view(-1).unsqueeze(-1))

        flat_params = self.meta_model.get_flat_params().unsqueeze(-1)
        flat_grads = torch.cat(grads)

        self.i = self.i.expand(flat_params.size(0), 1)
        self.f = self.f.expand(flat_params.size(0), 1)

        loss = loss.expand_as(flat_grads)
        inputs = torch.cat((preprocess_gradients(flat_grads), flat_params.data, loss), 1)
        inputs = torch.cat((inputs, self.f, self.i), 1)
        self.f, self.i = self(inputs)  # @f_i

        # Meta update itself
        flat_params = self.f * flat_params - self.i * flat_grads  # @meta_step
        flat_params = flat_params.view(-1)

        self.meta_model.set_flat_params(flat_params)

        # Finally, copy values from the meta model to the normal one.
        self.meta_model.copy_params_to(model_with_grads)
        return self.meta_model.model

# A helper class that keeps track of meta updates
# It's done by replacing parameters with variables and applying updates to
# them.


class MetaModel:

    def __init__(self, model):
        self.model = model

    def reset(self):
        for module in self.model.children():
            module._parameters['weight'] = module._parameters['weight'].data
            module._parameters['bias'] = module._parameters['bias'].data

    def get_flat_params(self):
        params = []

        for module in self.model.children():
            params.append(module._parameters['weight'].view(-1))
            params.append(module._parameters['bias'].view(-1))

        return torch.cat(params)

    def set_flat_params(self, flat_params):
        # Restore original shapes
        offset = 0
        for i, module in enumerate(self.model.children()):
            weight_shape = module._parameters['weight'].size()
            bias_shape = module._parameters['bias'].size()

            weight_flat_size = reduce(mul, weight_shape, 1)
            bias_flat_size = reduce(mul, bias_shape, 1)

            module._parameters['weight'] = flat_params[
                offset:offset + weight_flat_size].view(*weight_shape)
            module._parameters['bias'] = flat_params[
                offset + weight_flat_size:offset + weight_flat_size + bias_flat_size].view(*bias_shape)

            offset += weight_flat_size + bias_flat_size

    def copy_params_from(self, model):
        for modelA, modelB in zip(self.model.parameters(), model.parameters()):
            modelA.data.copy_(modelB.data)

    def copy_params_to(self, model):
        for modelA, modelB in zip(self.model.parameters(), model.parameters()):
            modelB.data.copy_(modelA.data)


# ---------------------------------------------------------------- main.py


def made_up_batch():
    """Stands in for an MNIST batch: 4 images of 16 features, labels in 0..3."""
    return torch.randn(args.batch_size, 16), torch.randint(0, 4, (args.batch_size,))


def build() -> dict:
    torch.manual_seed(0)
    train_loader = [made_up_batch() for _ in range(ITERATIONS * (1 + args.optimizer_steps))]

    # Create a meta optimizer that wraps a model into a meta model
    # to keep track of the meta updates.
    meta_model = Model()

    meta_optimizer = FastMetaOptimizer(MetaModel(meta_model), args.num_layers, args.hidden_size)

    optimizer = optim.Adam(meta_optimizer.parameters(), lr=1e-3)

    # one epoch: its iterator over the batches, and its running totals
    return {"meta_optimizer": meta_optimizer, "optimizer": optimizer, "train_loader": train_loader,
            "train_iter": iter(train_loader), "decrease_in_loss": 0.0, "final_loss": 0.0}


def iteration(state: dict) -> None:
    meta_optimizer, optimizer, train_iter = state["meta_optimizer"], state["optimizer"], state["train_iter"]

    # Sample a new model
    model = Model()

    x, y = next(train_iter)

    # Compute initial loss of the model
    f_x = model(x)
    initial_loss = F.nll_loss(f_x, y)

    for k in range(args.optimizer_steps // args.truncated_bptt_step):
        # Keep states for truncated BPTT
        meta_optimizer.reset_lstm(
            keep_states=k > 0, model=model, use_cuda=args.cuda)

        loss_sum = 0
        prev_loss = torch.zeros(1)
        for j in range(args.truncated_bptt_step):
            x, y = next(train_iter)

            # First we need to compute the gradients of the model
            f_x = model(x)
            loss = F.nll_loss(f_x, y)
            model.zero_grad()
            loss.backward()  # @optimizee_backward

            # Perfom a meta update using gradients from model
            # and return the current meta model saved in the optimizer
            meta_model = meta_optimizer.meta_update(model, loss.data)

            # Compute a loss for a step the meta optimizer
            f_x = meta_model(x)
            loss = F.nll_loss(f_x, y)

            loss_sum += (loss - prev_loss)  # @loss_sum

            prev_loss = loss.data

        # Update the parameters of the meta optimizer
        meta_optimizer.zero_grad()
        loss_sum.backward()  # @meta_backward
        for param in meta_optimizer.parameters():
            param.grad.data.clamp_(-1, 1)
        optimizer.step()

    # Compute relative decrease in the loss function w.r.t initial
    # value
    state["decrease_in_loss"] += loss.item() / initial_loss.item()
    state["final_loss"] += loss.item()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
