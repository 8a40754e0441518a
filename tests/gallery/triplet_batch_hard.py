"""An embedding trained with the batch-hard online triplet loss of online_triplet_loss: a healthy loop.

Source: NegatioN/OnlineMiningTripletLoss, online_triplet_loss/losses.py (commit
d9895637070eef3f8c9219d5483630b484ae7bee): `_pairwise_distances` (with its in-place `distances[distances < 0] = 0`),
`_get_anchor_positive_triplet_mask`, `_get_anchor_negative_triplet_mask` and `batch_hard_triplet_loss` (with its
in-place `tl[tl < 0] = 0`) as published; the README's usage (commit 05ebea176768747f27e53685ee2cf1d450195972):
`model = nn.Embedding(10, 10)`, `labels = torch.randint(high=10, size=(5,))`, `embeddings = model(labels)`,
`loss = batch_hard_triplet_loss(labels, embeddings, margin=100)`, `loss.backward()`. Changed: the README shows one
backward; here it is the body of a loop with an SGD optimizer (`zero_grad`, `step`) and fresh labels per pass
(batch 8, so labels repeat and there are positives), margin 100 as the README has it.
"""

from collections.abc import Callable

import torch
from torch import nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def _pairwise_distances(embeddings, squared=False):
    dot_product = torch.matmul(embeddings, embeddings.t())
    square_norm = torch.diag(dot_product)
    distances = square_norm.unsqueeze(0) - 2.0 * dot_product + square_norm.unsqueeze(1)
    distances[distances < 0] = 0
    if not squared:
        mask = distances.eq(0).float()
        distances = distances + mask * 1e-16
        distances = (1.0 -mask) * torch.sqrt(distances)
    return distances


def _get_anchor_positive_triplet_mask(labels, device):
    indices_equal = torch.eye(labels.size(0)).bool().to(device)
    indices_not_equal = ~indices_equal
    labels_equal = labels.unsqueeze(0) == labels.unsqueeze(1)
    return labels_equal & indices_not_equal


def _get_anchor_negative_triplet_mask(labels):
    return ~(labels.unsqueeze(0) == labels.unsqueeze(1))


def batch_hard_triplet_loss(labels, embeddings, margin, squared=False, device='cpu'):
    pairwise_dist = _pairwise_distances(embeddings, squared=squared)
    mask_anchor_positive = _get_anchor_positive_triplet_mask(labels, device).float()
    anchor_positive_dist = mask_anchor_positive * pairwise_dist
    hardest_positive_dist, _ = anchor_positive_dist.max(1, keepdim=True)
    mask_anchor_negative = _get_anchor_negative_triplet_mask(labels).float()
    max_anchor_negative_dist, _ = pairwise_dist.max(1, keepdim=True)
    anchor_negative_dist = pairwise_dist + max_anchor_negative_dist * (1.0 - mask_anchor_negative)
    hardest_negative_dist, _ = anchor_negative_dist.min(1, keepdim=True)
    tl = hardest_positive_dist - hardest_negative_dist + margin
    tl[tl < 0] = 0
    triplet_loss = tl.mean()
    return triplet_loss


def build() -> dict:
    torch.manual_seed(3)
    model = nn.Embedding(10, 10)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
            "labels": [torch.randint(high=10, size=(8,)) for _ in range(6)], "step": 0}


def iteration(state: dict) -> None:
    model, optimizer = state["model"], state["optimizer"]
    labels = state["labels"][state["step"] % len(state["labels"])]
    optimizer.zero_grad()
    embeddings = model(labels)
    loss = batch_hard_triplet_loss(labels, embeddings, margin=100)
    loss.backward()
    optimizer.step()
    state["step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
