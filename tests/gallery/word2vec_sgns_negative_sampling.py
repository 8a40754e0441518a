"""word2vec skip-gram with negative sampling: sparse nn.Embedding tables trained by SparseAdam, optimizer per epoch.

Source: Andras7/word2vec-pytorch, word2vec/trainer.py (commit 815f7bbe7a49ba03035890d2c3f4379a8562a37b) and
word2vec/model.py (commit 36b93a503e8b3b5448abbc0e18f2a6bd3e017fc9). As published: SkipGramModel with
`u_embeddings` and `v_embeddings` as `nn.Embedding(emb_size, emb_dimension, sparse=True)`, u uniform in
+-1/emb_dimension, v zeros; forward gathers emb_u, emb_v, emb_neg_v, the clamped positive score through
-logsigmoid, the clamped bmm negative scores through -logsigmoid(-x) summed, and the mean. Word2VecTrainer.train():
`for iteration in range(self.iterations)`, a fresh `optim.SparseAdam(self.skip_gram_model.parameters(),
lr=self.initial_lr)` and `CosineAnnealingLR(optimizer, len(self.dataloader))` per epoch, then per batch (when
`len(sample_batched[0]) > 1`): scheduler.step(), optimizer.zero_grad(), loss = forward(pos_u, pos_v, neg_v),
loss.backward(), optimizer.step(), the running loss from loss.item(). Retyped at CPU size: a vocabulary of 12 words,
embedding 6 (published 100), batches of 8 pairs with 5 negatives each (the published getNegatives(w, 5)), made up
with numpy in place of DataReader/Word2vecDataset's collate (the same three LongTensors), 2 batches per epoch;
printing, tqdm and save_embedding left out. One gallery iteration is one batch; a new epoch builds a new optimizer
and scheduler, as published. One change the probes force: the published tables are `sparse=True` with SparseAdam,
and the probes' fingerprint compares every parameter's `.grad` with torch.equal, which sparse tensors do not support
(NotImplementedError 'aten::equal' ... 'SparseCPU'); here SPARSE = False and torch.optim.Adam (SparseAdam refuses
dense gradients) in its place. The published sparse version, unchanged, is probed outside the gallery.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn import init

ITERATIONS = 4
SPARSE = False  # published: True (see the docstring)

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class SkipGramModel(nn.Module):

    def __init__(self, emb_size, emb_dimension):
        super(SkipGramModel, self).__init__()
        self.emb_size = emb_size
        self.emb_dimension = emb_dimension
        self.u_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=SPARSE)
        self.v_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=SPARSE)

        initrange = 1.0 / self.emb_dimension
        init.uniform_(self.u_embeddings.weight.data, -initrange, initrange)
        init.constant_(self.v_embeddings.weight.data, 0)

    def forward(self, pos_u, pos_v, neg_v):
        emb_u = self.u_embeddings(pos_u)
        emb_v = self.v_embeddings(pos_v)
        emb_neg_v = self.v_embeddings(neg_v)

        score = torch.sum(torch.mul(emb_u, emb_v), dim=1)
        score = torch.clamp(score, max=10, min=-10)
        score = -F.logsigmoid(score)

        neg_score = torch.bmm(emb_neg_v, emb_u.unsqueeze(2)).squeeze()
        neg_score = torch.clamp(neg_score, max=10, min=-10)
        neg_score = -torch.sum(F.logsigmoid(-neg_score), dim=1)

        return torch.mean(score + neg_score)


def make_dataloader(rng, emb_size, n_batches=2, batch_size=8, n_neg=5):
    """Made-up stand-in for the DataLoader over Word2vecDataset: (pos_u, pos_v, neg_v) LongTensors per batch."""
    batches = []
    for _ in range(n_batches):
        pos_u = torch.LongTensor(rng.integers(0, emb_size, size=batch_size))
        pos_v = torch.LongTensor(rng.integers(0, emb_size, size=batch_size))
        neg_v = torch.LongTensor(rng.integers(0, emb_size, size=(batch_size, n_neg)))
        batches.append((pos_u, pos_v, neg_v))
    return batches


def build() -> dict:
    np.random.seed(7)
    torch.manual_seed(7)
    rng = np.random.default_rng(7)
    emb_size, emb_dimension = 12, 6
    state = {
        "skip_gram_model": SkipGramModel(emb_size, emb_dimension),
        "dataloader": make_dataloader(rng, emb_size),
        "initial_lr": 0.001,
        "device": torch.device("cpu"),
        "running_loss": 0.0,
        "epoch": 0,
    }
    start_epoch(state)
    return state


def start_epoch(state: dict) -> None:
    state["epoch"] += 1
    optimizer_class = optim.SparseAdam if SPARSE else optim.Adam
    state["optimizer"] = optimizer_class(state["skip_gram_model"].parameters(), lr=state["initial_lr"])
    state["scheduler"] = torch.optim.lr_scheduler.CosineAnnealingLR(state["optimizer"], len(state["dataloader"]))
    state["running_loss"] = 0.0
    state["batches"] = iter(enumerate(state["dataloader"]))


def train_batch(state: dict) -> None:
    try:
        i, sample_batched = next(state["batches"])
    except StopIteration:
        start_epoch(state)
        i, sample_batched = next(state["batches"])
    optimizer, scheduler = state["optimizer"], state["scheduler"]
    if len(sample_batched[0]) > 1:
        pos_u = sample_batched[0].to(state["device"])
        pos_v = sample_batched[1].to(state["device"])
        neg_v = sample_batched[2].to(state["device"])

        scheduler.step()
        optimizer.zero_grad()
        loss = state["skip_gram_model"].forward(pos_u, pos_v, neg_v)
        loss.backward()  # @backward
        optimizer.step()

        state["running_loss"] = state["running_loss"] * 0.9 + loss.item() * 0.1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
