"""LightGCN with the BPR loss: the propagated embeddings recomputed by every batch's loss, as the PyTorch port does.

Source: gusye1234/LightGCN-PyTorch, code/Procedure.py (commit 9d15bdafaff3d34f53769c445cb7283281ba642f,
BPR_train_original), code/model.py (commit b96246e937983232133d3c7c853c31cb423e2fb5, LightGCN: computer(),
getEmbedding(), bpr_loss()) and code/utils.py (BPRLoss.stageOne, UniformSample_original's Python fallback, shuffle,
minibatch). Which of the two shapes: here `bpr_loss` calls `getEmbedding`, which calls `self.computer()` each batch,
so the layer propagation over the sparse normalised graph is rebuilt for every batch's backward (nothing is computed
once per epoch). As published: embedding_user / embedding_item with xavier_uniform_ (pretrain 0), computer()
stacks the layer outputs of `torch.sparse.mm(g_droped, all_emb)` and takes their mean (dropout off, A_split False:
the defaults); bpr_loss = mean softplus(neg - pos) with reg_loss = 1/2 (||u0||^2 + ||p0||^2 + ||n0||^2)/len(users) on
the ego embeddings; stageOne: `loss = loss + reg_loss*weight_decay`, opt.zero_grad(), loss.backward(), opt.step(),
loss.item(); BPR_train_original: Recmodel.train(), sample one (user, pos, neg) triple per training interaction,
shuffle, minibatches. Retyped at CPU size: 6 users, 8 items, made-up interactions (published Gowalla), latent 4
(published 64), 3 layers, bpr_batch_size 6 (published 2048), Adam lr 0.001 and decay 1e-4 as published; the graph is
built with numpy in place of scipy.sparse (the same D^-1/2 A D^-1/2 of [[0, R], [R^T, 0]], then a coalesced sparse
COO tensor); timers, tensorboard and Test left out. One gallery iteration is one stageOne (one batch); when an
epoch's batches run out, the next epoch samples again.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.optim as optim
from torch import nn

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

config = {"latent_dim_rec": 4, "lightGCN_n_layers": 3, "keep_prob": 0.6, "A_split": False, "pretrain": 0,
          "dropout": 0, "bpr_batch_size": 6, "decay": 1e-4, "lr": 0.001}


class BasicDataset(object):
    """What the Loader keeps: n_users, m_items, trainDataSize, allPos, and getSparseGraph()."""

    def __init__(self, rng, n_users=6, m_items=8):
        self.n_users, self.m_items = n_users, m_items
        R = (rng.random((n_users, m_items)) < 0.35).astype(np.float32)
        R[np.arange(n_users), rng.integers(0, m_items, size=n_users)] = 1.0  # every user has a positive
        self.UserItemNet = R
        self.trainDataSize = int(R.sum())
        self.allPos = [np.nonzero(R[u])[0] for u in range(n_users)]

    def getSparseGraph(self):
        n = self.n_users + self.m_items
        adj_mat = np.zeros((n, n), dtype=np.float32)
        R = self.UserItemNet
        adj_mat[:self.n_users, self.n_users:] = R
        adj_mat[self.n_users:, :self.n_users] = R.T
        rowsum = np.array(adj_mat.sum(axis=1))
        d_inv = np.power(rowsum, -0.5).flatten()
        d_inv[np.isinf(d_inv)] = 0.
        d_mat = np.diag(d_inv)
        norm_adj = d_mat.dot(adj_mat).dot(d_mat)
        row, col = np.nonzero(norm_adj)
        index = torch.stack([torch.LongTensor(row), torch.LongTensor(col)])
        data = torch.FloatTensor(norm_adj[row, col])
        Graph = torch.sparse_coo_tensor(index, data, torch.Size((n, n)))
        return Graph.coalesce()


class LightGCN(nn.Module):
    def __init__(self, config: dict, dataset: BasicDataset):
        super(LightGCN, self).__init__()
        self.config = config
        self.dataset: BasicDataset = dataset
        self.__init_weight()

    def __init_weight(self):
        self.num_users = self.dataset.n_users
        self.num_items = self.dataset.m_items
        self.latent_dim = self.config['latent_dim_rec']
        self.n_layers = self.config['lightGCN_n_layers']
        self.keep_prob = self.config['keep_prob']
        self.A_split = self.config['A_split']
        self.embedding_user = torch.nn.Embedding(
            num_embeddings=self.num_users, embedding_dim=self.latent_dim)
        self.embedding_item = torch.nn.Embedding(
            num_embeddings=self.num_items, embedding_dim=self.latent_dim)
        if self.config['pretrain'] == 0:
            nn.init.xavier_uniform_(self.embedding_user.weight, gain=1)
            nn.init.xavier_uniform_(self.embedding_item.weight, gain=1)
        self.f = nn.Sigmoid()
        self.Graph = self.dataset.getSparseGraph()

    def computer(self):
        """
        propagate methods for lightGCN
        """
        users_emb = self.embedding_user.weight
        items_emb = self.embedding_item.weight
        all_emb = torch.cat([users_emb, items_emb])
        embs = [all_emb]
        g_droped = self.Graph

        for layer in range(self.n_layers):
            all_emb = torch.sparse.mm(g_droped, all_emb)
            embs.append(all_emb)
        embs = torch.stack(embs, dim=1)
        light_out = torch.mean(embs, dim=1)
        users, items = torch.split(light_out, [self.num_users, self.num_items])
        return users, items

    def getEmbedding(self, users, pos_items, neg_items):
        all_users, all_items = self.computer()  # @computer
        users_emb = all_users[users]
        pos_emb = all_items[pos_items]
        neg_emb = all_items[neg_items]
        users_emb_ego = self.embedding_user(users)
        pos_emb_ego = self.embedding_item(pos_items)
        neg_emb_ego = self.embedding_item(neg_items)
        return users_emb, pos_emb, neg_emb, users_emb_ego, pos_emb_ego, neg_emb_ego

    def bpr_loss(self, users, pos, neg):
        (users_emb, pos_emb, neg_emb,
         userEmb0, posEmb0, negEmb0) = self.getEmbedding(users.long(), pos.long(), neg.long())
        reg_loss = (1/2)*(userEmb0.norm(2).pow(2) +
                          posEmb0.norm(2).pow(2) +
                          negEmb0.norm(2).pow(2))/float(len(users))
        pos_scores = torch.mul(users_emb, pos_emb)
        pos_scores = torch.sum(pos_scores, dim=1)
        neg_scores = torch.mul(users_emb, neg_emb)
        neg_scores = torch.sum(neg_scores, dim=1)

        loss = torch.mean(torch.nn.functional.softplus(neg_scores - pos_scores))

        return loss, reg_loss


class BPRLoss:
    def __init__(self, recmodel, config: dict):
        self.model = recmodel
        self.weight_decay = config['decay']
        self.lr = config['lr']
        self.opt = optim.Adam(recmodel.parameters(), lr=self.lr)

    def stageOne(self, users, pos, neg):
        loss, reg_loss = self.model.bpr_loss(users, pos, neg)
        reg_loss = reg_loss*self.weight_decay
        loss = loss + reg_loss

        self.opt.zero_grad()
        loss.backward()  # @backward
        self.opt.step()

        return loss.cpu().item()


def UniformSample_original_python(dataset):
    user_num = dataset.trainDataSize
    users = np.random.randint(0, dataset.n_users, user_num)
    allPos = dataset.allPos
    S = []
    for i, user in enumerate(users):
        posForUser = allPos[user]
        if len(posForUser) == 0:
            continue
        posindex = np.random.randint(0, len(posForUser))
        positem = posForUser[posindex]
        while True:
            negitem = np.random.randint(0, dataset.m_items)
            if negitem in posForUser:
                continue
            else:
                break
        S.append([user, positem, negitem])
    return np.array(S)


def shuffle(*arrays):
    shuffle_indices = np.arange(len(arrays[0]))
    np.random.shuffle(shuffle_indices)
    return tuple(x[shuffle_indices] for x in arrays)


def minibatch(*tensors, batch_size):
    for i in range(0, len(tensors[0]), batch_size):
        yield tuple(x[i:i + batch_size] for x in tensors)


def build() -> dict:
    np.random.seed(2020)
    torch.manual_seed(2020)
    dataset = BasicDataset(np.random.default_rng(2020))
    Recmodel = LightGCN(config, dataset)
    bpr = BPRLoss(Recmodel, config)
    state = {"dataset": dataset, "Recmodel": Recmodel, "bpr": bpr, "aver_loss": 0.0, "epoch": -1}
    start_epoch(state)
    return state


def start_epoch(state: dict) -> None:
    """BPR_train_original up to its batch loop."""
    state["epoch"] += 1
    Recmodel = state["Recmodel"]
    Recmodel.train()
    S = UniformSample_original_python(state["dataset"])
    users = torch.Tensor(S[:, 0]).long()
    posItems = torch.Tensor(S[:, 1]).long()
    negItems = torch.Tensor(S[:, 2]).long()
    users, posItems, negItems = shuffle(users, posItems, negItems)
    state["aver_loss"] = 0.
    state["batches"] = enumerate(minibatch(users, posItems, negItems, batch_size=config['bpr_batch_size']))


def train_batch(state: dict) -> None:
    """One pass of BPR_train_original's batch loop."""
    try:
        batch_i, (batch_users, batch_pos, batch_neg) = next(state["batches"])
    except StopIteration:
        start_epoch(state)
        batch_i, (batch_users, batch_pos, batch_neg) = next(state["batches"])
    cri = state["bpr"].stageOne(batch_users, batch_pos, batch_neg)
    state["aver_loss"] += cri


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
