"""Prototypical networks on Omniglot-shaped episodes: a healthy loop, one backward per episode.

Source: orobix/Prototypical-Networks-for-Few-shot-Learning-PyTorch, src/train.py (commit
5e18a5e5b369903092f683d434efb12c7c40a83c) `train`: per batch `optim.zero_grad()`, `model_output = model(x)`,
`loss, acc = loss_fn(model_output, target=y, n_support=opt.num_support_tr)`, `loss.backward()`, `optim.step()`,
the `.item()` logging, `lr_scheduler.step()` per epoch; src/prototypical_loss.py (commit
8ed0c9a2de5a5281313927bd9db6ea592a23ec41) `euclidean_dist` and `prototypical_loss` as published; src/protonet.py
`ProtoNet` (four conv-bn-relu-pool blocks; the Omniglot sizes x_dim=1). Changed: hid_dim=z_dim=8 (published 64),
made-up 28x28 "characters" of 10 classes, 8 of each, in place of Omniglot; the PrototypicalBatchSampler retyped as a
seeded choice of 3 classes per episode (published 60) and 2 support + 2 query samples per class (published 5 + 5),
grouped class by class as its batches are; one epoch of ITERATIONS episodes; no validation, no checkpoints.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.nn import functional as F

ITERATIONS = 3
CLASSES_PER_IT = 3
NUM_SUPPORT = 2
NUM_QUERY = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def conv_block(in_channels, out_channels):
    '''
    returns a block conv-bn-relu-pool
    '''
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
        nn.MaxPool2d(2)
    )


class ProtoNet(nn.Module):
    def __init__(self, x_dim=1, hid_dim=8, z_dim=8):
        super(ProtoNet, self).__init__()
        self.encoder = nn.Sequential(
            conv_block(x_dim, hid_dim),
            conv_block(hid_dim, hid_dim),
            conv_block(hid_dim, hid_dim),
            conv_block(hid_dim, z_dim),
        )

    def forward(self, x):
        x = self.encoder(x)
        return x.view(x.size(0), -1)


def euclidean_dist(x, y):
    n = x.size(0)
    m = y.size(0)
    d = x.size(1)
    if d != y.size(1):
        raise Exception
    x = x.unsqueeze(1).expand(n, m, d)
    y = y.unsqueeze(0).expand(n, m, d)
    return torch.pow(x - y, 2).sum(2)


def prototypical_loss(input, target, n_support):
    target_cpu = target.to('cpu')
    input_cpu = input.to('cpu')

    def supp_idxs(c):
        return target_cpu.eq(c).nonzero()[:n_support].squeeze(1)

    classes = torch.unique(target_cpu)
    n_classes = len(classes)
    n_query = target_cpu.eq(classes[0].item()).sum().item() - n_support
    support_idxs = list(map(supp_idxs, classes))
    prototypes = torch.stack([input_cpu[idx_list].mean(0) for idx_list in support_idxs])
    query_idxs = torch.stack(list(map(lambda c: target_cpu.eq(c).nonzero()[n_support:], classes))).view(-1)
    query_samples = input.to('cpu')[query_idxs]
    dists = euclidean_dist(query_samples, prototypes)
    log_p_y = F.log_softmax(-dists, dim=1).view(n_classes, n_query, -1)
    target_inds = torch.arange(0, n_classes)
    target_inds = target_inds.view(n_classes, 1, 1)
    target_inds = target_inds.expand(n_classes, n_query, 1).long()
    loss_val = -log_p_y.gather(2, target_inds).squeeze().view(-1).mean()
    _, y_hat = log_p_y.max(2)
    acc_val = y_hat.eq(target_inds.squeeze()).float().mean()
    return loss_val, acc_val


def build() -> dict:
    torch.manual_seed(7)
    images = torch.randn(10, 8, 1, 28, 28) + torch.randn(10, 1, 1, 28, 28)
    episodes = []
    for _ in range(ITERATIONS):
        classes = torch.randperm(10)[:CLASSES_PER_IT]
        xs, ys = [], []
        for c in classes:
            picks = torch.randperm(8)[:NUM_SUPPORT + NUM_QUERY]
            xs.append(images[c, picks])
            ys.append(torch.full((NUM_SUPPORT + NUM_QUERY,), int(c)))
        episodes.append((torch.cat(xs), torch.cat(ys)))
    model = ProtoNet()
    model.train()
    optim = torch.optim.Adam(params=model.parameters(), lr=0.001)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer=optim, gamma=0.5, step_size=20)
    return {"model": model, "optim": optim, "lr_scheduler": lr_scheduler, "episodes": episodes, "step": 0,
            "train_loss": [], "train_acc": []}


def iteration(state: dict) -> None:
    model, optim = state["model"], state["optim"]
    batch = state["episodes"][state["step"] % len(state["episodes"])]
    optim.zero_grad()
    x, y = batch
    model_output = model(x)
    loss, acc = prototypical_loss(model_output, target=y, n_support=NUM_SUPPORT)
    loss.backward()
    optim.step()
    state["train_loss"].append(loss.item())
    state["train_acc"].append(acc.item())
    state["step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)
    state["lr_scheduler"].step()


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
