"""EvolveGCN-O on a temporal graph: the GRU-evolved GCN weight kept on the module from one epoch into the next.

Source: benedekrozemberczki/pytorch_geometric_temporal, examples/recurrent/evolvegcno_example.py (commit
5f63c353fee31069623fd36b91c3cf5fd888f38a: RecurrentGCN = EvolveGCNO(node_features) + ReLU + Linear(node_features,
1); `for param in model.parameters(): param.retain_grad()`; Adam lr 0.01; per epoch `cost = 0`, over the
snapshots `y_hat = model(snapshot.x, snapshot.edge_index, snapshot.edge_attr)`, `cost = cost + torch.mean((y_hat -
snapshot.y)**2)`, then `cost = cost / (time+1)`, `cost.backward(retain_graph=True)`, `optimizer.step()`,
`optimizer.zero_grad()`), with torch_geometric_temporal/nn/recurrent/evolvegcno.py as changed by pull request #221
(issue #220, "the state of the weight is not maintained correctly"): `forward` keeps the evolved weight on the
module, `_, self.weight = self.recurrent_layer(self.initial_weight, self.initial_weight)` the first time and
`_, self.weight = self.recurrent_layer(self.weight, self.weight)` after, with GCNConv_Fixed_W (gcn_norm with self
loops, `x @ W`, sum of `edge_weight * x_j` over incoming edges). Users of that version report the error on
`loss.backward()` in issues #297 and #305 ("Runtime Error while executing loss.backward() for both the evolvegcnh &
evolvegcno examples"); pull request #284 ("fix weight in-place update") drops `self.weight` for an argument.
Retyped at CPU size without torch_geometric: the gcn_norm and the message passing written with `index_add_`
(the same sums), ChickenpoxDatasetLoader's 20 nodes and 4 lag features replaced by 6 nodes, 4 made-up features,
a made-up ring of 12 weighted edges and 3 snapshots per epoch; tqdm and the evaluation after training left out.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn import GRU

ITERATIONS = 3
NODES = 6
SNAPSHOTS = 3

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 2, "line": "@backward"},
    "retains": {"@backward": {"verdict": "goes with the carried fix", "runs": 1, "needed_runs": 1}},
    "carried": [{"variable": "recurrent.weight", "line": "@evolve"}],
    "notes": [],
    "modifies_in_place": [],
}


def gcn_norm(edge_index, edge_weight, num_nodes, improved=False, add_self_loops=True):
    fill_value = 2. if improved else 1.
    if edge_weight is None:
        edge_weight = torch.ones((edge_index.size(1), ))
    if add_self_loops:
        loops = torch.arange(num_nodes)
        edge_index = torch.cat([edge_index, torch.stack([loops, loops])], dim=1)
        edge_weight = torch.cat([edge_weight, torch.full((num_nodes, ), fill_value)])
    row, col = edge_index[0], edge_index[1]
    deg = torch.zeros(num_nodes).index_add_(0, col, edge_weight)
    deg_inv_sqrt = deg.pow_(-0.5)
    deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
    return edge_index, deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]


class GCNConv_Fixed_W(torch.nn.Module):
    def __init__(self, in_channels, out_channels, improved=False, cached=False, add_self_loops=True,
                 normalize=True):
        super(GCNConv_Fixed_W, self).__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.improved = improved
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize

    def forward(self, W, x, edge_index, edge_weight=None):
        if self.normalize:
            edge_index, edge_weight = gcn_norm(edge_index, edge_weight, x.size(0), self.improved,
                                               self.add_self_loops)
        x = torch.matmul(x, W)
        x_j = x[edge_index[0]]
        message = x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j
        return torch.zeros_like(x).index_add(0, edge_index[1], message)


def glorot(tensor):
    if tensor is not None:
        stdv = (6.0 / (tensor.size(-2) + tensor.size(-1))) ** 0.5
        tensor.data.uniform_(-stdv, stdv)


class EvolveGCNO(torch.nn.Module):
    def __init__(self, in_channels, improved=False, cached=False, normalize=True, add_self_loops=True):
        super(EvolveGCNO, self).__init__()
        self.in_channels = in_channels
        self.improved = improved
        self.cached = cached
        self.normalize = normalize
        self.add_self_loops = add_self_loops
        self.weight = None
        self.initial_weight = torch.nn.Parameter(torch.Tensor(1, in_channels, in_channels))
        self._create_layers()
        self.reset_parameters()

    def reset_parameters(self):
        glorot(self.initial_weight)

    def _create_layers(self):
        self.recurrent_layer = GRU(input_size=self.in_channels, hidden_size=self.in_channels, num_layers=1)
        for param in self.recurrent_layer.parameters():
            param.requires_grad = True
            param.retain_grad()
        self.conv_layer = GCNConv_Fixed_W(in_channels=self.in_channels, out_channels=self.in_channels,
                                          improved=self.improved, cached=self.cached,
                                          normalize=self.normalize, add_self_loops=self.add_self_loops)

    def forward(self, X, edge_index, edge_weight=None):
        if self.weight is None:
            _, self.weight = self.recurrent_layer(self.initial_weight, self.initial_weight)  # @initial
        else:
            _, self.weight = self.recurrent_layer(self.weight, self.weight)  # @evolve
        X = self.conv_layer(self.weight.squeeze(dim=0), X, edge_index, edge_weight)
        return X


class RecurrentGCN(torch.nn.Module):
    def __init__(self, node_features):
        super(RecurrentGCN, self).__init__()
        self.recurrent = EvolveGCNO(node_features)
        self.linear = torch.nn.Linear(node_features, 1)

    def forward(self, x, edge_index, edge_weight):
        h = self.recurrent(x, edge_index, edge_weight)
        h = F.relu(h)
        h = self.linear(h)
        return h


class Snapshot:
    def __init__(self, x, edge_index, edge_attr, y):
        self.x, self.edge_index, self.edge_attr, self.y = x, edge_index, edge_attr, y


def build() -> dict:
    torch.manual_seed(0)
    source = torch.arange(NODES)
    edge_index = torch.cat([torch.stack([source, (source + 1) % NODES]),
                            torch.stack([(source + 1) % NODES, source])], dim=1)
    train_dataset = [
        Snapshot(torch.randn(NODES, 4), edge_index, torch.rand(edge_index.size(1)), torch.randn(NODES, 1))
        for _ in range(SNAPSHOTS)
    ]
    model = RecurrentGCN(node_features=4)
    for param in model.parameters():
        param.retain_grad()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    # the evolving layer is named in the state too, as the published evaluation names it (model.recurrent)
    return {"model": model, "recurrent": model.recurrent, "optimizer": optimizer, "train_dataset": train_dataset}


def iteration(state: dict) -> None:
    model, optimizer, train_dataset = state["model"], state["optimizer"], state["train_dataset"]
    cost = 0
    for time, snapshot in enumerate(train_dataset):
        y_hat = model(snapshot.x, snapshot.edge_index, snapshot.edge_attr)
        cost = cost + torch.mean((y_hat-snapshot.y)**2)
    cost = cost / (time+1)
    cost.backward(retain_graph=True)  # @backward
    optimizer.step()
    optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
