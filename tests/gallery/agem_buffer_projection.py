"""A-GEM: the current batch's gradient, projected against a replay buffer's gradient when they disagree.

Source: aimagelab/mammoth, models/agem.py at commit 0d727a7235cf836698418ca33a973431d1d671f0 (the class AGem and
`project`), with `store_grad`/`overwrite_grad` from models/gem.py at the same commit and utils/buffer.py's reservoir
`Buffer` (`add_data`, `get_data` by `np.random.choice`, `is_empty`), and the shape of utils/training.py's `train`
(per task: each batch through `observe`, then `end_task`, which puts the first batch of the task's loader in the
buffer). `observe` backpropagates the batch's loss, stores the flat gradient in `grad_xy`, backpropagates the
buffer's loss, stores it in `grad_er`, and overwrites `.grad` with `project(grad_xy, grad_er)` when their dot product
is negative. Retyped at CPU size: an MLP 8-6-4, batch 4, 2 batches per task, buffer 8, minibatch 4, 3 tasks (one
task per iteration), SGD lr 0.1; data made up; no transform; `torch.Tensor(n)` (uninitialised) as published.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3
INPUT, HIDDEN, CLASSES, BATCH, BATCHES = 8, 6, 4, 4, 2
BUFFER_SIZE, MINIBATCH_SIZE = 8, 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def store_grad(params, grads, grad_dims):
    """
        This stores parameter gradients of past tasks.
    """
    # store the gradients
    grads.fill_(0.0)
    count = 0
    for param in params():
        if param.grad is not None:
            begin = 0 if count == 0 else sum(grad_dims[:count])
            end = np.sum(grad_dims[:count + 1])
            grads[begin: end].copy_(param.grad.data.view(-1))
        count += 1


def overwrite_grad(params, newgrad, grad_dims):
    """
        This is used to overwrite the gradients with a new gradient
        vector, whenever violations occur.
    """
    count = 0
    for param in params():
        if param.grad is not None:
            begin = 0 if count == 0 else sum(grad_dims[:count])
            end = sum(grad_dims[:count + 1])
            this_grad = newgrad[begin: end].contiguous().view(
                param.grad.data.size())
            param.grad.data.copy_(this_grad)
        count += 1


def reservoir(num_seen_examples: int, buffer_size: int) -> int:
    if num_seen_examples < buffer_size:
        return num_seen_examples
    rand = np.random.randint(0, num_seen_examples + 1)
    if rand < buffer_size:
        return rand
    else:
        return -1


class Buffer:
    def __init__(self, buffer_size, device):
        self.buffer_size = buffer_size
        self.device = device
        self.num_seen_examples = 0
        self.attributes = ['examples', 'labels']

    def init_tensors(self, examples, labels) -> None:
        for attr_str in self.attributes:
            attr = eval(attr_str)
            if attr is not None and not hasattr(self, attr_str):
                typ = torch.int64 if attr_str.endswith('els') else torch.float32
                setattr(self, attr_str, torch.zeros((self.buffer_size,
                        *attr.shape[1:]), dtype=typ, device=self.device))

    def add_data(self, examples, labels=None):
        if not hasattr(self, 'examples'):
            self.init_tensors(examples, labels)

        for i in range(examples.shape[0]):
            index = reservoir(self.num_seen_examples, self.buffer_size)
            self.num_seen_examples += 1
            if index >= 0:
                self.examples[index] = examples[i].to(self.device)
                if labels is not None:
                    self.labels[index] = labels[i].to(self.device)

    def get_data(self, size, transform=None):
        if size > min(self.num_seen_examples, self.examples.shape[0]):
            size = min(self.num_seen_examples, self.examples.shape[0])

        choice = np.random.choice(min(self.num_seen_examples, self.examples.shape[0]),
                                  size=size, replace=False)
        if transform is None:
            def transform(x): return x
        ret_tuple = (torch.stack([transform(ee.cpu())
                                  for ee in self.examples[choice]]).to(self.device),)
        for attr_str in self.attributes[1:]:
            if hasattr(self, attr_str):
                attr = getattr(self, attr_str)
                ret_tuple += (attr[choice],)
        return ret_tuple

    def is_empty(self) -> bool:
        if self.num_seen_examples == 0:
            return True
        else:
            return False


def project(gxy: torch.Tensor, ger: torch.Tensor) -> torch.Tensor:
    corr = torch.dot(gxy, ger) / torch.dot(ger, ger)
    return gxy - corr * ger


class Args:
    buffer_size = BUFFER_SIZE
    minibatch_size = MINIBATCH_SIZE
    lr = 0.1


class AGem(nn.Module):
    NAME = 'agem'

    def __init__(self, backbone, loss, args, transform):
        super(AGem, self).__init__()
        self.net = backbone
        self.loss = loss
        self.args = args
        self.transform = transform
        self.device = 'cpu'
        self.opt = torch.optim.SGD(self.net.parameters(), lr=self.args.lr)

        self.buffer = Buffer(self.args.buffer_size, self.device)
        self.grad_dims = []
        for param in self.parameters():
            self.grad_dims.append(param.data.numel())
        self.grad_xy = torch.Tensor(np.sum(self.grad_dims)).to(self.device)
        self.grad_er = torch.Tensor(np.sum(self.grad_dims)).to(self.device)

    def end_task(self, dataset):
        loader = dataset
        cur_x, cur_y = next(iter(loader))
        self.buffer.add_data(
            examples=cur_x.to(self.device),
            labels=cur_y.to(self.device)
        )

    def observe(self, inputs, labels, not_aug_inputs):

        self.zero_grad()
        p = self.net.forward(inputs)
        loss = self.loss(p, labels)
        loss.backward()

        if not self.buffer.is_empty():
            store_grad(self.parameters, self.grad_xy, self.grad_dims)

            buf_inputs, buf_labels = self.buffer.get_data(self.args.minibatch_size, transform=self.transform)
            self.net.zero_grad()
            buf_outputs = self.net.forward(buf_inputs)
            penalty = self.loss(buf_outputs, buf_labels)
            penalty.backward()
            store_grad(self.parameters, self.grad_er, self.grad_dims)

            dot_prod = torch.dot(self.grad_xy, self.grad_er)
            if dot_prod.item() < 0:
                g_tilde = project(gxy=self.grad_xy, ger=self.grad_er)
                overwrite_grad(self.parameters, g_tilde, self.grad_dims)
            else:
                overwrite_grad(self.parameters, self.grad_xy, self.grad_dims)

        self.opt.step()

        return loss.item()


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    backbone = nn.Sequential(nn.Linear(INPUT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    model = AGem(backbone, nn.CrossEntropyLoss(), Args(), None)
    tasks = []
    for t in range(ITERATIONS):
        batches = [(torch.randn(BATCH, INPUT) + t, torch.randint(0, CLASSES, (BATCH,))) for _ in range(BATCHES)]
        tasks.append(batches)
    return {"model": model, "tasks": tasks, "t": 0}


def iteration(state: dict) -> None:
    model, t = state["model"], state["t"]
    train_loader = state["tasks"][t]
    model.net.train()
    for epoch in range(1):
        for i, data in enumerate(train_loader):
            inputs, labels = data
            not_aug_inputs = inputs
            loss = model.observe(inputs, labels, not_aug_inputs)
    model.end_task(train_loader)
    state["t"] = t + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
