"""Learning without Forgetting: the old network's logits, recorded before each new task, as soft targets.

Source: aimagelab/mammoth, models/lwf.py at commit 0d727a7235cf836698418ca33a973431d1d671f0 (the class Lwf, `smooth`,
`modified_kl_div`), with ContinualModel's `opt` (SGD over the backbone) and the shape of utils/training.py's `train`
(per task: `begin_task`, then each batch through `observe`, with the dataset's `logits` passed once it has them).
`begin_task` (from the second task on) warms up the classifier on frozen features (`torch.no_grad()`), then records
the network's logits on the task's data under `torch.no_grad()` and sets them on the dataset; `observe` adds
`alpha * modified_kl_div(smooth(soft(old_logits)), smooth(soft(outputs)))` to the masked cross-entropy. Retyped at CPU
size: features 8-6, 2 classes per task, 3 tasks (6 classes; one task per iteration), batch 4, 2 batches per task,
1 warm-up epoch, SGD lr 0.1, alpha 0.5; data made up; `get_dataset` replaced by the made-up tasks, and the
dataset's `logits` attribute kept on a small holder object.
"""

from collections.abc import Callable

import torch
from torch.optim import SGD

ITERATIONS = 3
INPUT, HIDDEN, CPT, BATCH, BATCHES = 8, 6, 2, 4, 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def smooth(logits, temp, dim):
    log = logits ** (1 / temp)
    return log / torch.sum(log, dim).unsqueeze(1)


def modified_kl_div(old, new):
    return -torch.mean(torch.sum(old * torch.log(new), 1))


class Backbone(torch.nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Linear(INPUT, HIDDEN), torch.nn.ReLU())
        self.classifier = torch.nn.Linear(HIDDEN, n_classes)

    def forward(self, x, returnt='out'):
        feats = self.features(x)
        if returnt == 'features':
            return feats
        return self.classifier(feats)


class Args:
    alpha = 0.5
    softmax_temp = 2
    lr = 0.1
    n_epochs = 1
    batch_size = BATCH


class TaskData:
    """A task's loader and its dataset (the part of mammoth's dataset objects the loop uses)."""

    def __init__(self, batches):
        self.train_loader = batches
        self.data = torch.cat([x for x, _ in batches])


class Lwf(torch.nn.Module):
    NAME = 'lwf'

    def __init__(self, backbone, loss, args, n_tasks):
        super(Lwf, self).__init__()
        self.net = backbone
        self.loss = loss
        self.args = args
        self.device = 'cpu'
        self.opt = SGD(self.net.parameters(), lr=self.args.lr)
        self.old_net = None
        self.soft = torch.nn.Softmax(dim=1)
        self.logsoft = torch.nn.LogSoftmax(dim=1)
        self.current_task = 0
        self.cpt = CPT
        nc = n_tasks * self.cpt
        self.eye = torch.tril(torch.ones((nc, nc))).bool().to(self.device)

    def begin_task(self, dataset):
        self.net.eval()
        if self.current_task > 0:
            # warm-up
            opt = SGD(self.net.classifier.parameters(), lr=self.args.lr)
            for epoch in range(self.args.n_epochs):
                for i, data in enumerate(dataset.train_loader):
                    inputs, labels = data
                    inputs, labels = inputs.to(self.device), labels.to(self.device)
                    opt.zero_grad()
                    with torch.no_grad():
                        feats = self.net(inputs, returnt='features')
                    mask = self.eye[(self.current_task + 1) * self.cpt - 1] ^ self.eye[self.current_task * self.cpt - 1]
                    outputs = self.net.classifier(feats)[:, mask]
                    loss = self.loss(outputs, labels - self.current_task * self.cpt)
                    loss.backward()
                    opt.step()

            logits = []
            with torch.no_grad():
                for i in range(0, dataset.data.shape[0], self.args.batch_size):
                    inputs = dataset.data[i:min(i + self.args.batch_size, dataset.data.shape[0])]
                    log = self.net(inputs.to(self.device)).cpu()
                    logits.append(log)
            dataset.logits = torch.cat(logits)
        self.net.train()

        self.current_task += 1

    def observe(self, inputs, labels, not_aug_inputs, logits=None):
        self.opt.zero_grad()
        outputs = self.net(inputs)

        mask = self.eye[self.current_task * self.cpt - 1]
        loss = self.loss(outputs[:, mask], labels)
        if logits is not None:
            mask = self.eye[(self.current_task - 1) * self.cpt - 1]
            loss += self.args.alpha * modified_kl_div(smooth(self.soft(logits[:, mask]).to(self.device), 2, 1),
                                                      smooth(self.soft(outputs[:, mask]), 2, 1))

        loss.backward()
        self.opt.step()

        return loss.item()


def build() -> dict:
    torch.manual_seed(0)
    model = Lwf(Backbone(ITERATIONS * CPT), torch.nn.CrossEntropyLoss(), Args(), ITERATIONS)
    tasks = []
    for t in range(ITERATIONS):
        batches = [(torch.randn(BATCH, INPUT) + t, torch.randint(t * CPT, (t + 1) * CPT, (BATCH,)))
                   for _ in range(BATCHES)]
        tasks.append(TaskData(batches))
    return {"model": model, "tasks": tasks, "t": 0}


def iteration(state: dict) -> None:
    model, t = state["model"], state["t"]
    dataset = state["tasks"][t]
    model.begin_task(dataset)
    for epoch in range(model.args.n_epochs):
        for i, data in enumerate(dataset.train_loader):
            if hasattr(dataset, 'logits'):
                inputs, labels = data
                logits = dataset.logits[i * BATCH:(i + 1) * BATCH]
                loss = model.observe(inputs, labels, inputs, logits)
            else:
                inputs, labels = data
                loss = model.observe(inputs, labels, inputs)
    state["t"] = t + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
