"""SASRec: a causal self-attention sequence recommender, BCE on each position's next item against a sampled negative.

Source: pmixer/SASRec.pytorch, main.py (commit 0535d12eb824d900ffd0953fed6513c85bd39eda): the model's parameters
xavier_normal_-initialised through `.data` (1-D ones skipped by the bare except), `model.train()`, BCEWithLogitsLoss,
Adam (betas 0.9, 0.98), and per step `u, seq, pos, neg = sampler.next_batch()`, `np.array` of each, `pos_logits,
neg_logits = model(u, seq, pos, neg)`, labels of ones and zeros, `adam_optimizer.zero_grad()`, `indices =
np.where(pos != 0)`, the two BCE terms, `for param in model.item_emb.parameters(): loss += args.l2_emb *
torch.norm(param)`, `loss.backward()`, `adam_optimizer.step()`, the printed `loss.item()`; model.py (commit
0f250b62e1de51b02608e709fcbec87f60958319): PointWiseFeedForward (`outputs += inputs`), SASRec.log2feats (the
embedding scaled in place, `seqs *= ~timeline_mask.unsqueeze(-1)` after dropout and after each block, causal
nn.MultiheadAttention) and forward. The sampler (utils.py's WarpSampler, three worker processes running
sample_function) is retyped in-process: the same sample(uid) with random_neq, users shuffled each pass, from a seeded
numpy RandomState. Retyped at CPU size: 12 made-up users over 20 items, sequences of 3 to 8 items, maxlen 6 (published
50 or 200), hidden_units 8 (50), 2 blocks, 1 head, dropout 0.2, batch size 4 (128), l2_emb 0.001 (published default
0.0, which multiplies the norm by zero); evaluation and checkpoints left out.
"""

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class PointWiseFeedForward(torch.nn.Module):
    def __init__(self, hidden_units, dropout_rate):

        super(PointWiseFeedForward, self).__init__()

        self.conv1 = torch.nn.Conv1d(hidden_units, hidden_units, kernel_size=1)
        self.dropout1 = torch.nn.Dropout(p=dropout_rate)
        self.conv2 = torch.nn.Conv1d(hidden_units, hidden_units, kernel_size=1)
        self.dropout2 = torch.nn.Dropout(p=dropout_rate)

    def forward(self, inputs):
        outputs = self.dropout2(self.conv2(self.dropout1(self.conv1(inputs.transpose(-1, -2)))))
        outputs = outputs.transpose(-1, -2) # as Conv1D requires (N, C, Length)
        outputs += inputs
        return outputs


class SASRec(torch.nn.Module):
    def __init__(self, user_num, item_num, args):
        super(SASRec, self).__init__()

        self.user_num = user_num
        self.item_num = item_num
        self.dev = args.device

        self.item_emb = torch.nn.Embedding(self.item_num+1, args.hidden_units, padding_idx=0)
        self.pos_emb = torch.nn.Embedding(args.maxlen, args.hidden_units) # TO IMPROVE
        self.emb_dropout = torch.nn.Dropout(p=args.dropout_rate)

        self.attention_layernorms = torch.nn.ModuleList() # to be Q for self-attention
        self.attention_layers = torch.nn.ModuleList()
        self.forward_layernorms = torch.nn.ModuleList()
        self.forward_layers = torch.nn.ModuleList()

        self.last_layernorm = torch.nn.LayerNorm(args.hidden_units, eps=1e-8)

        for _ in range(args.num_blocks):
            new_attn_layernorm = torch.nn.LayerNorm(args.hidden_units, eps=1e-8)
            self.attention_layernorms.append(new_attn_layernorm)

            new_attn_layer =  torch.nn.MultiheadAttention(args.hidden_units,
                                                            args.num_heads,
                                                            args.dropout_rate)
            self.attention_layers.append(new_attn_layer)

            new_fwd_layernorm = torch.nn.LayerNorm(args.hidden_units, eps=1e-8)
            self.forward_layernorms.append(new_fwd_layernorm)

            new_fwd_layer = PointWiseFeedForward(args.hidden_units, args.dropout_rate)
            self.forward_layers.append(new_fwd_layer)

    def log2feats(self, log_seqs):
        seqs = self.item_emb(torch.LongTensor(log_seqs).to(self.dev))
        seqs *= self.item_emb.embedding_dim ** 0.5
        positions = np.tile(np.array(range(log_seqs.shape[1])), [log_seqs.shape[0], 1])
        seqs += self.pos_emb(torch.LongTensor(positions).to(self.dev))
        seqs = self.emb_dropout(seqs)

        timeline_mask = torch.BoolTensor(log_seqs == 0).to(self.dev)
        seqs *= ~timeline_mask.unsqueeze(-1) # broadcast in last dim

        tl = seqs.shape[1] # time dim len for enforce causality
        attention_mask = ~torch.tril(torch.ones((tl, tl), dtype=torch.bool, device=self.dev))

        for i in range(len(self.attention_layers)):
            seqs = torch.transpose(seqs, 0, 1)
            Q = self.attention_layernorms[i](seqs)
            mha_outputs, _ = self.attention_layers[i](Q, seqs, seqs,
                                            attn_mask=attention_mask)
            seqs = Q + mha_outputs
            seqs = torch.transpose(seqs, 0, 1)

            seqs = self.forward_layernorms[i](seqs)
            seqs = self.forward_layers[i](seqs)
            seqs *=  ~timeline_mask.unsqueeze(-1)

        log_feats = self.last_layernorm(seqs) # (U, T, C) -> (U, -1, C)

        return log_feats

    def forward(self, user_ids, log_seqs, pos_seqs, neg_seqs): # for training
        log_feats = self.log2feats(log_seqs) # user_ids hasn't been used yet

        pos_embs = self.item_emb(torch.LongTensor(pos_seqs).to(self.dev))
        neg_embs = self.item_emb(torch.LongTensor(neg_seqs).to(self.dev))

        pos_logits = (log_feats * pos_embs).sum(dim=-1)
        neg_logits = (log_feats * neg_embs).sum(dim=-1)

        return pos_logits, neg_logits # pos_pred, neg_pred


def random_neq(l, r, s, rng):
    t = rng.randint(l, r)
    while t in s:
        t = rng.randint(l, r)
    return t


class WarpSampler:
    """utils.py's sample_function, run in this process instead of three workers."""

    def __init__(self, User, usernum, itemnum, batch_size=64, maxlen=10, SEED=2021):
        self.User, self.usernum, self.itemnum = User, usernum, itemnum
        self.batch_size, self.maxlen = batch_size, maxlen
        self.rng = np.random.RandomState(SEED)
        self.uids = np.arange(1, usernum + 1, dtype=np.int32)
        self.counter = 0

    def sample(self, uid):
        user_train, maxlen = self.User, self.maxlen
        while len(user_train[uid]) <= 1:
            uid = self.rng.randint(1, self.usernum + 1)
        seq = np.zeros([maxlen], dtype=np.int32)
        pos = np.zeros([maxlen], dtype=np.int32)
        neg = np.zeros([maxlen], dtype=np.int32)
        nxt = user_train[uid][-1]
        idx = maxlen - 1

        ts = set(user_train[uid])
        for i in reversed(user_train[uid][:-1]):
            seq[idx] = i
            pos[idx] = nxt
            if nxt != 0:
                neg[idx] = random_neq(1, self.itemnum + 1, ts, self.rng)
            nxt = i
            idx -= 1
            if idx == -1:
                break

        return (uid, seq, pos, neg)

    def next_batch(self):
        one_batch = []
        for i in range(self.batch_size):
            if self.counter % self.usernum == 0:
                self.rng.shuffle(self.uids)
            one_batch.append(self.sample(self.uids[self.counter % self.usernum]))
            self.counter += 1
        return zip(*one_batch)


def build() -> dict:
    torch.manual_seed(0)
    data_rng = np.random.RandomState(0)
    usernum, itemnum = 12, 20
    user_train = {u: list(data_rng.randint(1, itemnum + 1, size=data_rng.randint(3, 9))) for u in range(1, usernum + 1)}
    args = SimpleNamespace(batch_size=4, lr=0.001, maxlen=6, hidden_units=8, num_blocks=2, num_heads=1,
                           dropout_rate=0.2, l2_emb=0.001, device="cpu")
    sampler = WarpSampler(user_train, usernum, itemnum, batch_size=args.batch_size, maxlen=args.maxlen)
    model = SASRec(usernum, itemnum, args).to(args.device)

    for name, param in model.named_parameters():
        try:
            torch.nn.init.xavier_normal_(param.data)
        except:  # noqa: E722 (as published)
            pass # just ignore those failed init layers

    model.train() # enable model training
    bce_criterion = torch.nn.BCEWithLogitsLoss() # torch.nn.BCELoss()
    adam_optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    return {"model": model, "sampler": sampler, "args": args, "bce_criterion": bce_criterion,
            "adam_optimizer": adam_optimizer, "log": []}


def iteration(state: dict) -> None:
    model, sampler, args = state["model"], state["sampler"], state["args"]
    bce_criterion, adam_optimizer = state["bce_criterion"], state["adam_optimizer"]
    u, seq, pos, neg = sampler.next_batch() # tuples to ndarray
    u, seq, pos, neg = np.array(u), np.array(seq), np.array(pos), np.array(neg)
    pos_logits, neg_logits = model(u, seq, pos, neg)
    pos_labels, neg_labels = torch.ones(pos_logits.shape, device=args.device), torch.zeros(neg_logits.shape, device=args.device)
    adam_optimizer.zero_grad()
    indices = np.where(pos != 0)
    loss = bce_criterion(pos_logits[indices], pos_labels[indices])
    loss += bce_criterion(neg_logits[indices], neg_labels[indices])
    for param in model.item_emb.parameters(): loss += args.l2_emb * torch.norm(param)
    loss.backward()
    adam_optimizer.step()
    state["log"].append("loss in iteration {}: {}".format(len(state["log"]), loss.item()))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
