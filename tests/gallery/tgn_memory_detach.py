"""PyG's temporal graph network example: the node memory updated with a graph each batch, detached after the step.

Source: pyg-team/pytorch_geometric, examples/tgn.py `train()` (commit 08ff4072c5c96777b3a09f011dfcd92bb856aa7c:
reset_state per epoch, per batch zero_grad, `z, last_update = memory(n_id)`, embedding, link predictor on positive
and negative destinations, BCEWithLogitsLoss, `memory.update_state(...)` before the backward, backward, step,
`memory.detach()`), and the memory module torch_geometric/nn/models/tgn.py (commit
00c50a2fbbebf9e763e88b780ad15e9df492dc4e: message stores, IdentityMessage, LastAggregator, a Linear time encoder
with `.cos()`, a GRUCell, `get_updated_memory`, `update_state` writing `self.memory[n_id] = memory` into the
buffer in training, and the detach as `self.memory.detach_()`). Re-implemented in plain torch: LastAggregator's
`scatter_max` as a loop over nodes; the GraphAttentionEmbedding (TransformerConv over a LastNeighborLoader's
neighbourhood) replaced by a Linear embedding of the memory and the time encoding of `last_update - t`, no
neighbour loader. The optimizer gets a list of the parameters (published a set: the same parameters, in a fixed order). Retyped at CPU size: 12 nodes (source 0..5, destination 6..11), 6-dim messages, memory/time/
embedding dim 8 (published 100), batches of 5 events of a made-up event stream (published JODIE wikipedia, 200).
"""

from collections.abc import Callable

import torch
from torch.nn import GRUCell, Linear

ITERATIONS = 3
NUM_NODES = 12
MSG_DIM = 6
DIM = 8

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class IdentityMessage(torch.nn.Module):
    def __init__(self, raw_msg_dim, memory_dim, time_dim):
        super(IdentityMessage, self).__init__()
        self.out_channels = raw_msg_dim + 2 * memory_dim + time_dim

    def forward(self, z_src, z_dst, raw_msg, t_enc):
        return torch.cat([z_src, z_dst, raw_msg, t_enc], dim=-1)


class LastAggregator(torch.nn.Module):
    def forward(self, msg, index, t, dim_size):
        out = msg.new_zeros((dim_size, msg.size(-1)))
        for node in range(dim_size):
            rows = (index == node).nonzero().view(-1)
            if rows.numel() > 0:
                out[node] = msg[rows[t[rows].argmax()]]
        return out


class TGNMemory(torch.nn.Module):
    def __init__(self, num_nodes, raw_msg_dim, memory_dim, time_dim, message_module, aggregator_module):
        super().__init__()
        self.num_nodes = num_nodes
        self.raw_msg_dim = raw_msg_dim
        self.memory_dim = memory_dim
        self.time_dim = time_dim
        self.msg_s_module = message_module
        self.msg_d_module = IdentityMessage(raw_msg_dim, memory_dim, time_dim)
        self.aggr_module = aggregator_module
        self.time_enc = Linear(1, time_dim)
        self.gru = GRUCell(message_module.out_channels, memory_dim)
        self.register_buffer('memory', torch.empty(num_nodes, memory_dim))
        self.register_buffer('last_update', torch.empty(self.num_nodes, dtype=torch.long))
        self.register_buffer('assoc', torch.empty(num_nodes, dtype=torch.long))
        self.reset_parameters()

    def reset_parameters(self):
        self.time_enc.reset_parameters()
        self.gru.reset_parameters()
        self.reset_state()

    def reset_state(self):
        with torch.no_grad():
            self.memory.zero_()
            self.last_update.zero_()
        i = self.memory.new_empty((0, ), dtype=torch.long)
        msg = self.memory.new_empty((0, self.raw_msg_dim))
        self.msg_s_store = {j: (i, i, i, msg) for j in range(self.num_nodes)}
        self.msg_d_store = {j: (i, i, i, msg) for j in range(self.num_nodes)}

    def forward(self, n_id):
        if self.training:
            memory, last_update = self.get_updated_memory(n_id)
        else:
            memory, last_update = self.memory[n_id], self.last_update[n_id]
        return memory, last_update

    def update_state(self, src, dst, t, raw_msg):
        n_id = torch.cat([src, dst]).unique()
        if self.training:
            memory, last_update = self.get_updated_memory(n_id)
            self.memory[n_id] = memory  # @memory_update
            self.last_update[n_id] = last_update
            self.update_message_store(src, dst, t, raw_msg, self.msg_s_store)
            self.update_message_store(dst, src, t, raw_msg, self.msg_d_store)

    def get_updated_memory(self, n_id):
        aggr, t, idx = self.get_aggregated_messages(n_id)
        memory = self.gru(aggr, self.memory[n_id])
        last_update = self.last_update.scatter(0, idx, t)[n_id]
        return memory, last_update

    def get_aggregated_messages(self, n_id):
        self.assoc[n_id] = torch.arange(n_id.size(0), device=n_id.device)
        msg_s, t_s, src_s, dst_s = self.compute_messages(n_id, self.msg_s_store, self.msg_s_module)
        msg_d, t_d, src_d, dst_d = self.compute_messages(n_id, self.msg_d_store, self.msg_d_module)
        idx = torch.cat([src_s, src_d], dim=0)
        msg = torch.cat([msg_s, msg_d], dim=0)
        t = torch.cat([t_s, t_d], dim=0)
        aggr = self.aggr_module(msg, self.assoc[idx], t, dim_size=n_id.size(0))
        return aggr, t, idx

    def update_message_store(self, src, dst, t, raw_msg, msg_store):
        n_id, perm = src.sort()
        n_id, count = n_id.unique_consecutive(return_counts=True)
        for i, idx in zip(n_id.tolist(), perm.split(count.tolist())):
            msg_store[i] = (src[idx], dst[idx], t[idx], raw_msg[idx])

    def compute_messages(self, n_id, msg_store, msg_module):
        data = [msg_store[i] for i in n_id.tolist()]
        src, dst, t, raw_msg = list(zip(*data))
        src = torch.cat(src, dim=0)
        dst = torch.cat(dst, dim=0)
        t = torch.cat(t, dim=0)
        raw_msg = torch.cat(raw_msg, dim=0)
        t_rel = t - self.last_update[src]
        t_enc = self.time_enc(t_rel.to(raw_msg.dtype).view(-1, 1)).cos()
        msg = msg_module(self.memory[src], self.memory[dst], raw_msg, t_enc)
        return msg, t, src, dst

    def detach(self):
        self.memory.detach_()


class Embedding(torch.nn.Module):
    def __init__(self, in_channels, out_channels, time_enc):
        super().__init__()
        self.time_enc = time_enc
        self.lin = Linear(in_channels + time_enc.out_features, out_channels)

    def forward(self, x, last_update, t):
        rel_t_enc = self.time_enc((last_update - t).to(x.dtype).view(-1, 1))
        return self.lin(torch.cat([x, rel_t_enc], dim=-1))


class LinkPredictor(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.lin_src = Linear(in_channels, in_channels)
        self.lin_dst = Linear(in_channels, in_channels)
        self.lin_final = Linear(in_channels, 1)

    def forward(self, z_src, z_dst):
        h = self.lin_src(z_src) + self.lin_dst(z_dst)
        h = h.relu()
        return self.lin_final(h)


def build() -> dict:
    torch.manual_seed(12345)
    events = 5 * ITERATIONS
    src = torch.randint(0, 6, (events,))
    dst = torch.randint(6, NUM_NODES, (events,))
    t = torch.arange(events) * 3 + 1
    msg = torch.randn(events, MSG_DIM)
    memory = TGNMemory(NUM_NODES, MSG_DIM, DIM, DIM,
                       message_module=IdentityMessage(MSG_DIM, DIM, DIM), aggregator_module=LastAggregator())
    gnn = Embedding(DIM, DIM, memory.time_enc)
    link_pred = LinkPredictor(in_channels=DIM)
    optimizer = torch.optim.Adam(list(memory.parameters()) + list(gnn.lin.parameters())
                                 + list(link_pred.parameters()), lr=0.01)
    memory.train()
    gnn.train()
    link_pred.train()
    memory.reset_state()  # Start with a fresh memory.
    return {"memory": memory, "gnn": gnn, "link_pred": link_pred, "optimizer": optimizer,
            "criterion": torch.nn.BCEWithLogitsLoss(), "src": src, "dst": dst, "t": t, "msg": msg,
            "assoc": torch.empty(NUM_NODES, dtype=torch.long), "batch": 0, "total_loss": 0}


def iteration(state: dict) -> None:
    memory, gnn, link_pred, optimizer, criterion, assoc = (
        state["memory"], state["gnn"], state["link_pred"], state["optimizer"], state["criterion"], state["assoc"])
    b = state["batch"]
    state["batch"] = b + 1
    sl = slice(5 * b, 5 * b + 5)
    src, pos_dst, t, msg = state["src"][sl], state["dst"][sl], state["t"][sl], state["msg"][sl]
    optimizer.zero_grad()

    # Sample negative destination nodes.
    neg_dst = torch.randint(6, NUM_NODES, (src.size(0), ), dtype=torch.long)

    n_id = torch.cat([src, pos_dst, neg_dst]).unique()
    assoc[n_id] = torch.arange(n_id.size(0))

    # Get updated memory of all nodes involved in the computation.
    z, last_update = memory(n_id)
    z = gnn(z, last_update, t.max())

    pos_out = link_pred(z[assoc[src]], z[assoc[pos_dst]])
    neg_out = link_pred(z[assoc[src]], z[assoc[neg_dst]])

    loss = criterion(pos_out, torch.ones_like(pos_out))
    loss += criterion(neg_out, torch.zeros_like(neg_out))

    # Update memory and neighbor loader with ground-truth state.
    memory.update_state(src, pos_dst, t, msg)

    loss.backward()  # @backward
    optimizer.step()
    memory.detach()  # @detach
    state["total_loss"] += float(loss) * src.size(0)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
