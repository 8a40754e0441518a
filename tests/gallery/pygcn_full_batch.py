"""pygcn: a two-layer GCN written by hand on a sparse normalised adjacency matrix, full-batch training.

Source: tkipf/pygcn, pygcn/train.py (commit 299b90de321a8747e96dbd9e1c44bc30f6788986): script-level
`adj, features, labels, idx_train, idx_val, idx_test = load_data()`, `model = GCN(nfeat=features.shape[1],
nhid=args.hidden, nclass=labels.max().item() + 1, dropout=args.dropout)`, `optimizer = optim.Adam(...,
lr=args.lr, weight_decay=args.weight_decay)`, and train(epoch): model.train(), optimizer.zero_grad(), `output =
model(features, adj)`, nll_loss on idx_train, accuracy, loss_train.backward(), optimizer.step(), then (not
fastmode) model.eval() and a second `output = model(features, adj)` for loss_val and acc_val; `for epoch in
range(args.epochs): train(epoch)`. pygcn/layers.py's GraphConvolution (commit bf1410eb: `support =
torch.mm(input, self.weight)`, `output = torch.spmm(adj, support)`, `+ self.bias`), pygcn/models.py's GCN (relu,
dropout, log_softmax), pygcn/utils.py's normalize, accuracy and sparse_mx_to_torch_sparse_tensor (its
`torch.sparse.FloatTensor(indices, values, shape)`, which torch 2.13 still takes, with a warning). Retyped at
CPU size: load_data's Cora becomes a made-up graph of 12 nodes (symmetrised random edges, 8 binary features, 3
classes), built with numpy in place of scipy.sparse (the same row normalisation of features and of adj + I);
idx_train/val/test 0-3/4-7/8-11 (published 140/300/1000 nodes); hidden 4 (published 16); seed 42, lr 0.01,
weight_decay 5e-4, dropout 0.5 as published; the prints and the timing are left out. The script's data,
model and optimizer are module globals set by build(), as train() reads them; the sparse adj stays out of the
state (the probes' fingerprint compares state tensors with torch.equal, which sparse tensors do not support).
"""

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

ITERATIONS = 3
fastmode = False
adj = features = labels = idx_train = idx_val = idx_test = None  # set by build(), read by train() as published
model = optimizer = None

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class GraphConvolution(Module):
    """
    Simple GCN layer, similar to https://arxiv.org/abs/1609.02907
    """

    def __init__(self, in_features, out_features, bias=True):
        super(GraphConvolution, self).__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.FloatTensor(in_features, out_features))
        if bias:
            self.bias = Parameter(torch.FloatTensor(out_features))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1. / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.mm(input, self.weight)
        output = torch.spmm(adj, support)
        if self.bias is not None:
            return output + self.bias
        else:
            return output


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super(GCN, self).__init__()

        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)


def normalize(mx):
    """Row-normalize matrix"""
    rowsum = np.array(mx.sum(1))
    r_inv = np.power(rowsum, -1).flatten()
    r_inv[np.isinf(r_inv)] = 0.
    r_mat_inv = np.diag(r_inv)
    mx = r_mat_inv.dot(mx)
    return mx


def accuracy(output, labels):
    preds = output.max(1)[1].type_as(labels)
    correct = preds.eq(labels).double()
    correct = correct.sum()
    return correct / len(labels)


def sparse_mx_to_torch_sparse_tensor(sparse_mx):
    """Convert a (dense numpy stand-in for a scipy) sparse matrix to a torch sparse tensor."""
    sparse_mx = sparse_mx.astype(np.float32)
    row, col = np.nonzero(sparse_mx)
    indices = torch.from_numpy(np.vstack((row, col))).long()
    values = torch.from_numpy(sparse_mx[row, col])
    shape = torch.Size(sparse_mx.shape)
    return torch.sparse.FloatTensor(indices, values, shape)


def load_data(n_nodes=12, n_features=8, n_classes=3):
    """Made-up stand-in for utils.load_data's Cora: the same normalisations on a small random graph."""
    features = (np.random.rand(n_nodes, n_features) < 0.4).astype(np.float32)
    labels = np.random.randint(0, n_classes, size=n_nodes)
    adj = (np.random.rand(n_nodes, n_nodes) < 0.25).astype(np.float32)
    np.fill_diagonal(adj, 0)

    # build symmetric adjacency matrix
    adj = np.maximum(adj, adj.T)

    features = normalize(features)
    adj = normalize(adj + np.eye(adj.shape[0]))

    idx_train = range(4)
    idx_val = range(4, 8)
    idx_test = range(8, 12)

    features = torch.FloatTensor(np.array(features))
    labels = torch.LongTensor(labels)
    adj = sparse_mx_to_torch_sparse_tensor(adj)

    idx_train = torch.LongTensor(idx_train)
    idx_val = torch.LongTensor(idx_val)
    idx_test = torch.LongTensor(idx_test)

    return adj, features, labels, idx_train, idx_val, idx_test


def build() -> dict:
    global adj, features, labels, idx_train, idx_val, idx_test, model, optimizer
    np.random.seed(42)
    torch.manual_seed(42)
    adj, features, labels, idx_train, idx_val, idx_test = load_data()
    model = GCN(nfeat=features.shape[1],
                nhid=4,
                nclass=labels.max().item() + 1,
                dropout=0.5)
    optimizer = optim.Adam(model.parameters(),
                           lr=0.01, weight_decay=5e-4)
    return {"model": model, "optimizer": optimizer, "epoch": 0}


def train(epoch):
    model.train()
    optimizer.zero_grad()
    output = model(features, adj)
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])
    acc_train = accuracy(output[idx_train], labels[idx_train])
    loss_train.backward()  # @backward
    optimizer.step()

    if not fastmode:
        # Evaluate validation set performance separately,
        # deactivates dropout during validation run.
        model.eval()
        output = model(features, adj)

    loss_val = F.nll_loss(output[idx_val], labels[idx_val])
    acc_val = accuracy(output[idx_val], labels[idx_val])


def iteration(state: dict) -> None:
    train(state["epoch"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        train(epoch)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
