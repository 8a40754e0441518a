"""MAML: inner steps with torch.autograd.grad on fast weights, one meta backward over the query loss.

Source: dragen1860/MAML-Pytorch, meta.py (Meta.forward): per task, `grad = torch.autograd.grad(loss,
self.net.parameters())`, `fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], ...))`,
query losses under torch.no_grad() for the before/after accuracy, further inner steps on fast_weights,
`losses_q.append(loss_q)`, then `loss_q = losses_q[-1] / task_num`, meta_optim.zero_grad(),
loss_q.backward(), meta_optim.step(). (No create_graph: the published inner grads are first order.)
Retyped at CPU size: learner.py's functional net becomes two functional Linear layers over a
ParameterList (its bn_training argument kept and unused), 2 tasks, 3-way, 2 support and 2 query
samples per class on 5 features, update_step 2, Adam as published, 2 meta-batches.
"""

from collections.abc import Callable

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Learner(nn.Module):
    def __init__(self, n_in=5, n_hidden=6, n_way=3):
        super().__init__()
        self.vars = nn.ParameterList([
            nn.Parameter(torch.randn(n_hidden, n_in) * 0.5), nn.Parameter(torch.zeros(n_hidden)),
            nn.Parameter(torch.randn(n_way, n_hidden) * 0.5), nn.Parameter(torch.zeros(n_way)),
        ])

    def forward(self, x, vars=None, bn_training=True):
        if vars is None:
            vars = self.vars
        w, b, w2, b2 = vars
        x = F.relu(F.linear(x, w, b))
        return F.linear(x, w2, b2)

    def parameters(self, recurse=True):
        return self.vars


class Meta(nn.Module):
    def __init__(self):
        super().__init__()
        self.update_lr = 0.4
        self.meta_lr = 1e-3
        self.n_way = 3
        self.update_step = 2
        self.net = Learner()
        self.meta_optim = optim.Adam(self.net.parameters(), lr=self.meta_lr)

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        task_num, setsz, features = x_spt.size()
        querysz = x_qry.size(1)
        losses_q = [0 for _ in range(self.update_step + 1)]
        corrects = [0 for _ in range(self.update_step + 1)]

        for i in range(task_num):
            logits = self.net(x_spt[i], vars=None, bn_training=True)
            loss = F.cross_entropy(logits, y_spt[i])
            grad = torch.autograd.grad(loss, self.net.parameters())  # @inner_grad
            fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, self.net.parameters())))

            with torch.no_grad():
                logits_q = self.net(x_qry[i], self.net.parameters(), bn_training=True)
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[0] += loss_q
                pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                correct = torch.eq(pred_q, y_qry[i]).sum().item()
                corrects[0] = corrects[0] + correct

            with torch.no_grad():
                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[1] += loss_q
                pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                correct = torch.eq(pred_q, y_qry[i]).sum().item()
                corrects[1] = corrects[1] + correct

            for k in range(1, self.update_step):
                logits = self.net(x_spt[i], fast_weights, bn_training=True)
                loss = F.cross_entropy(logits, y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights)  # @inner_grad_k
                fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, fast_weights)))
                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[k + 1] += loss_q
                with torch.no_grad():
                    pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                    correct = torch.eq(pred_q, y_qry[i]).sum().item()
                    corrects[k + 1] = corrects[k + 1] + correct

            losses_q.append(loss_q)

        loss_q = losses_q[-1] / task_num
        self.meta_optim.zero_grad()
        loss_q.backward()  # @meta_backward
        self.meta_optim.step()
        accs = np.array(corrects) / (querysz * task_num)
        return accs


def build() -> dict:
    torch.manual_seed(0)
    maml = Meta()
    def task_batch():
        labels = torch.arange(3).repeat_interleave(2).expand(2, 6)
        return torch.randn(2, 6, 5), labels.clone(), torch.randn(2, 6, 5), labels.clone()
    return {"maml": maml, "batches": [task_batch() for _ in range(ITERATIONS + 1)], "step": 0}


def meta_step(state: dict) -> None:
    x_spt, y_spt, x_qry, y_qry = state["batches"][state["step"] % len(state["batches"])]
    state["step"] += 1
    accs = state["maml"](x_spt, y_spt, x_qry, y_qry)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for step in range(iterations):
        meta_step(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: meta_step(state)


if __name__ == "__main__":
    run(build())
