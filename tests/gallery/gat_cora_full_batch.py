"""pytorch/examples' Graph Attention Network on Cora: full-batch steps with masked losses, evaluated under no_grad.

Source: pytorch/examples, gat/main.py (commit 4440841a1012fe680f098a97aed3b02c85ed654e). As published:
GraphAttentionLayer (`h @ W`, dropout, heads split by view/permute, `_get_attention_scores` from the two halves of
`a`, LeakyReLU, `torch.where(adj_mat > 0, e, -9e16 * torch.ones_like(e))`, softmax, dropout on the attention,
`matmul(attention, h_transformed)`, heads averaged (concat=False)), GAT (two layers, ELU between, log_softmax),
Adam(lr=0.005, weight_decay=5e-4), NLLLoss, and train_iter: model.train(), optimizer.zero_grad(),
`output = model(*input)`, the loss on `output[mask_train]`, loss.backward(), optimizer.step(), then test() on the
train and validation masks (model.eval() and torch.no_grad()), the every-`print_every` print.
Retyped at CPU size: a made-up graph of 24 nodes (published Cora, 2708) with 16 binary features per node,
row-normalized as load_cora does (dense, not through a sparse diagonal), a random symmetric adjacency with self
loops, 3 classes, hidden 8 (published 64) and 2 heads (published 8), dropout 0.6 as published; the split
8 test / 8 validation / 8 train from `torch.randperm`; 3 epochs; the download and the final test left out.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam

ITERATIONS = 3
N_NODES = 24
N_FEATURES = 16
N_CLASSES = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class GraphAttentionLayer(nn.Module):
    def __init__(self, in_features: int, out_features: int, n_heads: int, concat: bool = False, dropout: float = 0.4, leaky_relu_slope: float = 0.2):
        super(GraphAttentionLayer, self).__init__()

        self.n_heads = n_heads # Number of attention heads
        self.concat = concat # wether to concatenate the final attention heads
        self.dropout = dropout # Dropout rate

        if concat: # concatenating the attention heads
            self.out_features = out_features # Number of output features per node
            assert out_features % n_heads == 0 # Ensure that out_features is a multiple of n_heads
            self.n_hidden = out_features // n_heads
        else: # averaging output over the attention heads (Used in the main paper)
            self.n_hidden = out_features

        self.W = nn.Parameter(torch.empty(size=(in_features, self.n_hidden * n_heads)))
        self.a = nn.Parameter(torch.empty(size=(n_heads, 2 * self.n_hidden, 1)))

        self.leakyrelu = nn.LeakyReLU(leaky_relu_slope) # LeakyReLU activation function
        self.softmax = nn.Softmax(dim=1) # softmax activation function to the attention coefficients

        self.reset_parameters() # Reset the parameters

    def reset_parameters(self):
        nn.init.xavier_normal_(self.W)
        nn.init.xavier_normal_(self.a)

    def _get_attention_scores(self, h_transformed: torch.Tensor):
        source_scores = torch.matmul(h_transformed, self.a[:, :self.n_hidden, :])
        target_scores = torch.matmul(h_transformed, self.a[:, self.n_hidden:, :])

        # broadcast add
        # (n_heads, n_nodes, 1) + (n_heads, 1, n_nodes) = (n_heads, n_nodes, n_nodes)
        e = source_scores + target_scores.mT
        return self.leakyrelu(e)

    def forward(self,  h: torch.Tensor, adj_mat: torch.Tensor):
        n_nodes = h.shape[0]

        h_transformed = torch.mm(h, self.W)
        h_transformed = F.dropout(h_transformed, self.dropout, training=self.training)

        h_transformed = h_transformed.view(n_nodes, self.n_heads, self.n_hidden).permute(1, 0, 2)

        e = self._get_attention_scores(h_transformed)

        # Set the attention score for non-existent edges to -9e15 (MASKING NON-EXISTENT EDGES)
        connectivity_mask = -9e16 * torch.ones_like(e)
        e = torch.where(adj_mat > 0, e, connectivity_mask) # masked attention scores

        attention = F.softmax(e, dim=-1)
        attention = F.dropout(attention, self.dropout, training=self.training)

        h_prime = torch.matmul(attention, h_transformed)

        if self.concat:
            h_prime = h_prime.permute(1, 0, 2).contiguous().view(n_nodes, self.out_features)
        else:
            h_prime = h_prime.mean(dim=0)

        return h_prime


class GAT(nn.Module):
    def __init__(self,
        in_features,
        n_hidden,
        n_heads,
        num_classes,
        concat=False,
        dropout=0.4,
        leaky_relu_slope=0.2):
        super(GAT, self).__init__()

        self.gat1 = GraphAttentionLayer(
            in_features=in_features, out_features=n_hidden, n_heads=n_heads,
            concat=concat, dropout=dropout, leaky_relu_slope=leaky_relu_slope
            )

        self.gat2 = GraphAttentionLayer(
            in_features=n_hidden, out_features=num_classes, n_heads=1,
            concat=False, dropout=dropout, leaky_relu_slope=leaky_relu_slope
            )

    def forward(self, input_tensor: torch.Tensor , adj_mat: torch.Tensor):
        x = self.gat1(input_tensor, adj_mat)
        x = F.elu(x) # Apply ELU activation function to the output of the first layer
        x = self.gat2(x, adj_mat)
        return F.log_softmax(x, dim=1) # Apply log softmax activation function


def made_up_cora():
    """Row-normalized binary features, labels and a symmetric adjacency with self loops, as load_cora returns."""
    features = (torch.rand(N_NODES, N_FEATURES) < 0.3).float()
    features[:, 0] = 1.0
    features = features / features.sum(dim=1, keepdim=True)
    labels = torch.randint(0, N_CLASSES, (N_NODES,))
    upper = (torch.rand(N_NODES, N_NODES) < 0.15).float().triu(1)
    adj_mat = torch.eye(N_NODES) + upper + upper.T
    return features, labels, adj_mat


def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val, print_every=10):
    model.train()
    optimizer.zero_grad()

    # Forward pass
    output = model(*input)
    loss = criterion(output[mask_train], target[mask_train]) # Compute the loss using the training mask

    loss.backward()  # @backward
    optimizer.step()

    # Evaluate the model performance on training and validation sets
    loss_train, acc_train = test(model, criterion, input, target, mask_train)
    loss_val, acc_val = test(model, criterion, input, target, mask_val)

    if epoch % print_every == 0:
        _ = (loss_train, acc_train, loss_val, acc_val)  # the published print


def test(model, criterion, input, target, mask):
    model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]

        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()


def build() -> dict:
    torch.manual_seed(13)
    features, labels, adj_mat = made_up_cora()
    idx = torch.randperm(len(labels))
    idx_test, idx_val, idx_train = idx[:8], idx[8:16], idx[16:]
    gat_net = GAT(
        in_features=features.shape[1],
        n_hidden=8,
        n_heads=2,
        num_classes=labels.max().item() + 1,
        concat=False,
        dropout=0.6,
        leaky_relu_slope=0.2
    )
    optimizer = Adam(gat_net.parameters(), lr=0.005, weight_decay=5e-4)
    criterion = nn.NLLLoss()
    return {"gat_net": gat_net, "optimizer": optimizer, "criterion": criterion, "features": features,
            "labels": labels, "adj_mat": adj_mat, "idx_train": idx_train, "idx_val": idx_val, "epoch": 0}


def iteration(state: dict) -> None:
    epoch = state["epoch"]
    state["epoch"] += 1
    train_iter(epoch + 1, state["gat_net"], state["optimizer"], state["criterion"],
               (state["features"], state["adj_mat"]), state["labels"], state["idx_train"], state["idx_val"], 20)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
