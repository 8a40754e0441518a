"""Dark Experience Replay (DER): a reservoir buffer of past inputs and the logits the network gave them, replayed
with an MSE on the logits alongside the current batch's cross-entropy.

Source: aimagelab/mammoth, models/der.py (commit 16cebdb649660488c2d5becb9a000d620e5d0bb4): `Der.observe`
(opt.zero_grad(), `outputs = self.net(inputs)`, the loss, and when the buffer is not empty
`buf_inputs, buf_logits = self.buffer.get_data(minibatch_size, transform=self.transform, device=self.device)`,
`loss += alpha * F.mse_loss(self.net(buf_inputs), buf_logits)`, backward, step, then
`self.buffer.add_data(examples=not_aug_inputs, logits=outputs.data)`, `return loss.item()`), with mammoth's
utils/buffer.py retyped: `reservoir(num_seen_examples, buffer_size)`, `Buffer.init_tensors` (zero tensors of the
buffer's size, made on the first add), `add_data` (per example, `self.examples[index] = examples[i]`,
`self.logits[index] = logits[i]`), `get_data` (np.random.choice without replacement over the filled part, then
indexing), `is_empty`; and the training loop of utils/training.py reduced to its core (per batch,
`loss = model.meta_observe(inputs, labels, not_aug_inputs)`; meta_observe calls observe). Retyped at CPU size:
mammoth's MNISTMLP backbone shrunk to 16 -> 12 -> 12 -> 10, a buffer of 6, batch 4, minibatch_size 4, alpha 0.3,
SGD lr 0.03, made-up data with no augmentation (inputs == not_aug_inputs, transform None).
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

ITERATIONS = 4
BUFFER_SIZE = 6
BATCH = 4
MINIBATCH_SIZE = 4
ALPHA = 0.3
LR = 0.03

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def reservoir(num_seen_examples: int, buffer_size: int) -> int:
    if num_seen_examples < buffer_size:
        return num_seen_examples

    rand = np.random.randint(0, num_seen_examples + 1)
    if rand < buffer_size:
        return rand
    else:
        return -1


class Buffer:
    def __init__(self, buffer_size, device="cpu"):
        self.buffer_size = buffer_size
        self.device = device
        self.num_seen_examples = 0
        self.attributes = ['examples', 'labels', 'logits', 'task_labels']

    def init_tensors(self, examples, labels, logits, task_labels) -> None:
        for attr_str in self.attributes:
            attr = eval(attr_str)
            if attr is not None and not hasattr(self, attr_str):
                typ = torch.int64 if attr_str.endswith('els') else torch.float32
                setattr(self, attr_str, torch.zeros((self.buffer_size,
                        *attr.shape[1:]), dtype=typ, device=self.device))

    def add_data(self, examples, labels=None, logits=None, task_labels=None):
        if not hasattr(self, 'examples'):
            self.init_tensors(examples, labels, logits, task_labels)

        for i in range(examples.shape[0]):
            index = reservoir(self.num_seen_examples, self.buffer_size)
            self.num_seen_examples += 1
            if index >= 0:
                self.examples[index] = examples[i].to(self.device)
                if labels is not None:
                    self.labels[index] = labels[i].to(self.device)
                if logits is not None:
                    self.logits[index] = logits[i].to(self.device)
                if task_labels is not None:
                    self.task_labels[index] = task_labels[i].to(self.device)

    def get_data(self, size, transform=None, device=None):
        target_device = self.device if device is None else device
        if size > min(self.num_seen_examples, self.examples.shape[0]):
            size = min(self.num_seen_examples, self.examples.shape[0])

        choice = np.random.choice(min(self.num_seen_examples, self.examples.shape[0]),
                                  size=size, replace=False)
        if transform is None:
            def transform(x): return x
        ret_tuple = (torch.stack([transform(ee.cpu()) for ee in self.examples[choice]]).to(target_device),)
        for attr_str in self.attributes[1:]:
            if hasattr(self, attr_str):
                attr = getattr(self, attr_str)
                ret_tuple += (attr[choice].to(target_device),)
        return ret_tuple

    def is_empty(self) -> bool:
        return self.num_seen_examples == 0


class MNISTMLP(nn.Module):
    def __init__(self, input_size=16, output_size=10, hidden=12):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self._features = nn.Sequential(self.fc1, nn.ReLU(), self.fc2, nn.ReLU())
        self.classifier = nn.Linear(hidden, output_size)

    def forward(self, x):
        x = x.view(-1, 16)
        return self.classifier(self._features(x))


class Der:
    """Continual learning via Dark Experience Replay (ContinualModel reduced to what observe uses)."""

    def __init__(self, backbone, loss, transform=None, device="cpu"):
        self.net = backbone
        self.loss = loss
        self.transform = transform
        self.device = device
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR)
        self.buffer = Buffer(BUFFER_SIZE)

    def meta_observe(self, *args, **kwargs):
        return self.observe(*args, **kwargs)

    def observe(self, inputs, labels, not_aug_inputs, epoch=None):

        self.opt.zero_grad()
        tot_loss = 0

        outputs = self.net(inputs)
        loss = self.loss(outputs, labels)

        if not self.buffer.is_empty():
            buf_inputs, buf_logits = self.buffer.get_data(
                MINIBATCH_SIZE, transform=self.transform, device=self.device)
            buf_outputs = self.net(buf_inputs)
            loss_mse = ALPHA * F.mse_loss(buf_outputs, buf_logits)
            loss += loss_mse

        loss.backward()
        self.opt.step()
        self.buffer.add_data(examples=not_aug_inputs, logits=outputs.data)

        return loss.item()


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    model = Der(MNISTMLP(), nn.CrossEntropyLoss())
    xs = torch.rand(ITERATIONS, BATCH, 1, 4, 4)
    ys = torch.randint(0, 10, (ITERATIONS, BATCH))
    return {"model": model, "train_loader": list(zip(xs, ys)), "i": 0, "losses": []}


def iteration(state: dict) -> None:
    model = state["model"]
    inputs, labels = state["train_loader"][state["i"] % len(state["train_loader"])]
    not_aug_inputs = inputs
    loss = model.meta_observe(inputs, labels, not_aug_inputs)
    state["losses"].append(loss)
    state["i"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
