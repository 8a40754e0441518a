"""DeepFM whose L2 regulariser is computed once, in the model's __init__, and added to every step's loss.

Source: shenweichen/DeepCTR-Torch, deepctr_torch/models/basemodel.py at commit
caa12dd15144900ecfcb04908e9834669cb12304 (the line issue #69, "Why enable retain_graph in backward?", links to):
BaseModel.__init__ sets `self.reg_loss = torch.zeros((1,))` and calls `add_regularization_loss` (a sum of
`torch.norm(w, p=2)` times the weight decay, added in place: `self.reg_loss += reg_loss`) on the embeddings and
the linear part; DeepFM's __init__ (deepctr_torch/models/deepfm.py) adds the DNN's weights and
`self.add_regularization_loss(self.dnn_linear.weight, l2_reg_dnn)`, which iterates that weight row by row (the
stored commit 048e7adb338ac8c95cf6ceb335c793dc7e418f90 passes `self.dnn.weight`; the DNN's named weights through
`filter(lambda x: 'weight' in x[0] and 'bn' not in x[0], ...)`, the form the tuple branch of this
add_regularization_loss reads and later releases keep, are retyped here). fit() then runs, per batch, `y_pred =
model(x).squeeze()`, `optim.zero_grad()`, `loss = loss_func(y_pred, y.squeeze(), reduction='sum')`, `total_loss =
loss + self.reg_loss`, `.item()`s, `total_loss.backward(retain_graph=True)`, `optim.step()`. Issues #88, #90 and
#102 report what torch >= 1.5 makes of it: the optimizer's in-place step changes the weights the graph built in
__init__ saved, and iteration 2's backward stops. #102 names the row of dnn_linear.weight that torch.norm saved
("output 0 of SelectBackward ... is at version 2"); under torch >= 1.7 iterating a tensor is an unbind, and that
row now stops the backward with the multi-output view wording ("Output 0 of UnbindBackward is a view and its base
or another view of its base has been modified inplace", as issues #130 and #138 quote it for later releases;
"Output 0 of Unbind" in torch 2.13). v0.2.2 moved the regulariser into each step. Retyped at CPU size: three
sparse features (vocabularies 4, 5, 3) standing in for the Criteo columns, embedding size 4, dnn_hidden_units (8,
8) (published default (128, 128)), the published l2 defaults (1e-5, 1e-5, 0) and init_std, compile("adam",
"binary_crossentropy"), batches of 4 made up with torch.randint in a list standing in for the shuffled
DataLoader. Only what DeepFM uses of inputs.py and layers/ (SparseFeat, build_input_features, combined_dnn_input,
DNN, FM, PredictionLayer) is retyped, for sparse features only; tqdm, metrics and validation left out.
"""

from collections import OrderedDict, namedtuple
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 2, "line": "@backward"},
    "retains": {"@backward": {"verdict": "goes with the carried fix", "runs": 1, "needed_runs": 1}},
    "carried": [{"variable": "model.reg_loss", "line": "@reg_loss"}],
    "notes": [],
    "modifies_in_place": [],
}

SparseFeat = namedtuple('SparseFeat', ['name', 'dimension', 'embedding_name'])


def build_input_features(feature_columns):
    features = OrderedDict()
    start = 0
    for feat in feature_columns:
        if feat.name in features:
            continue
        features[feat.name] = (start, start + 1)
        start += 1
    return features


def combined_dnn_input(sparse_embedding_list, dense_value_list):
    return torch.flatten(torch.cat(sparse_embedding_list, dim=-1), start_dim=1)


class FM(nn.Module):
    def forward(self, inputs):
        fm_input = inputs
        square_of_sum = torch.pow(torch.sum(fm_input, dim=1, keepdim=True), 2)
        sum_of_square = torch.sum(fm_input * fm_input, dim=1, keepdim=True)
        cross_term = square_of_sum - sum_of_square
        cross_term = 0.5 * torch.sum(cross_term, dim=2, keepdim=False)
        return cross_term


class DNN(nn.Module):
    def __init__(self, inputs_dim, hidden_units, activation=F.relu, l2_reg=0, dropout_rate=0, use_bn=False,
                 init_std=0.0001, seed=1024):
        super(DNN, self).__init__()
        self.activation = activation
        self.dropout = nn.Dropout(dropout_rate)
        hidden_units = [inputs_dim] + list(hidden_units)
        self.linears = nn.ModuleList(
            [nn.Linear(hidden_units[i], hidden_units[i + 1]) for i in range(len(hidden_units) - 1)])
        for name, tensor in self.linears.named_parameters():
            if 'weight' in name:
                nn.init.normal_(tensor, mean=0, std=init_std)

    def forward(self, inputs):
        deep_input = inputs
        for i in range(len(self.linears)):
            fc = self.linears[i](deep_input)
            fc = self.activation(fc)
            fc = self.dropout(fc)
            deep_input = fc
        return deep_input


class PredictionLayer(nn.Module):
    def __init__(self, task='binary', use_bias=True):
        super(PredictionLayer, self).__init__()
        self.use_bias = use_bias
        self.task = task
        if self.use_bias:
            self.bias = nn.Parameter(torch.zeros((1,)))

    def forward(self, X):
        output = X
        if self.use_bias:
            output += self.bias
        if self.task == "binary":
            output = torch.sigmoid(output)
        return output


class Linear(nn.Module):
    def __init__(self, feature_columns, feature_index, init_std=0.0001, device='cpu'):
        super(Linear, self).__init__()
        self.feature_index = feature_index
        self.sparse_feature_columns = list(
            filter(lambda x: isinstance(x, SparseFeat), feature_columns)) if len(feature_columns) else []
        self.embedding_dict = self.create_embedding_matrix(self.sparse_feature_columns, 1, init_std, sparse=False).to(
            device)
        for tensor in self.embedding_dict.values():
            nn.init.normal_(tensor.weight, mean=0, std=init_std)

    def forward(self, X):
        sparse_embedding_list = [self.embedding_dict[feat.embedding_name](
            X[:, self.feature_index[feat.name][0]:self.feature_index[feat.name][1]].long()) for
            feat in self.sparse_feature_columns]
        linear_logit = torch.sum(
            torch.cat(sparse_embedding_list, dim=-1), dim=-1, keepdim=False)
        return linear_logit

    def create_embedding_matrix(self, feature_columns, embedding_size, init_std=0.0001, sparse=False):
        embedding_dict = nn.ModuleDict(
            {feat.embedding_name: nn.Embedding(feat.dimension, embedding_size, sparse=sparse) for feat in
             feature_columns}
        )
        for tensor in embedding_dict.values():
            nn.init.normal_(tensor.weight, mean=0, std=init_std)
        return embedding_dict


class BaseModel(nn.Module):

    def __init__(self,
                 linear_feature_columns, dnn_feature_columns, embedding_size=8, dnn_hidden_units=(128, 128),
                 l2_reg_linear=1e-5,
                 l2_reg_embedding=1e-5, l2_reg_dnn=0, init_std=0.0001, seed=1024, dnn_dropout=0, dnn_activation='relu',
                 task='binary', device='cpu'):

        super(BaseModel, self).__init__()

        self.reg_loss = torch.zeros((1,), device=device)
        self.device = device  # device

        self.feature_index = build_input_features(
            linear_feature_columns + dnn_feature_columns)
        self.dnn_feature_columns = dnn_feature_columns

        self.embedding_dict = self.create_embedding_matrix(dnn_feature_columns, embedding_size, init_std,
                                                           sparse=False).to(device)

        self.linear_model = Linear(
            linear_feature_columns, self.feature_index, device=device)

        self.add_regularization_loss(
            self.embedding_dict.parameters(), l2_reg_embedding)
        self.add_regularization_loss(
            self.linear_model.parameters(), l2_reg_linear)

        self.out = PredictionLayer(task, )
        self.to(device)

    def input_from_feature_columns(self, X, feature_columns, embedding_dict, support_dense=True):
        sparse_feature_columns = list(
            filter(lambda x: isinstance(x, SparseFeat), feature_columns)) if len(feature_columns) else []
        sparse_embedding_list = [embedding_dict[feat.embedding_name](
            X[:, self.feature_index[feat.name][0]:self.feature_index[feat.name][1]].long()) for
            feat in sparse_feature_columns]
        return sparse_embedding_list, []

    def create_embedding_matrix(self, feature_columns, embedding_size, init_std=0.0001, sparse=False):
        embedding_dict = nn.ModuleDict(
            {feat.embedding_name: nn.Embedding(feat.dimension, embedding_size, sparse=sparse) for feat in
             feature_columns}
        )
        for tensor in embedding_dict.values():
            nn.init.normal_(tensor.weight, mean=0, std=init_std)
        return embedding_dict

    def compute_input_dim(self, feature_columns, embedding_size=1, include_sparse=True, include_dense=True,
                          feature_group=False):
        return len(feature_columns) * embedding_size

    def add_regularization_loss(self, weight_list, weight_decay, p=2):
        reg_loss = torch.zeros((1,), device=self.device)
        for w in weight_list:
            if isinstance(w, tuple):
                l2_reg = torch.norm(w[1], p=p, )
            else:
                l2_reg = torch.norm(w, p=p, )
            reg_loss = reg_loss + l2_reg
        reg_loss = weight_decay * reg_loss
        self.reg_loss += reg_loss  # @reg_loss


class DeepFM(BaseModel):

    def __init__(self,
                 linear_feature_columns, dnn_feature_columns, embedding_size=8, use_fm=True,
                 dnn_hidden_units=(128, 128),
                 l2_reg_linear=0.00001, l2_reg_embedding=0.00001, l2_reg_dnn=0, init_std=0.0001, seed=1024,
                 dnn_dropout=0,
                 dnn_activation=F.relu, dnn_use_bn=False, task='binary', device='cpu'):

        super(DeepFM, self).__init__(linear_feature_columns, dnn_feature_columns, embedding_size=embedding_size,
                                     dnn_hidden_units=dnn_hidden_units,
                                     l2_reg_linear=l2_reg_linear,
                                     l2_reg_embedding=l2_reg_embedding, l2_reg_dnn=l2_reg_dnn, init_std=init_std,
                                     seed=seed,
                                     dnn_dropout=dnn_dropout, dnn_activation=dnn_activation,
                                     task=task, device=device)

        self.dnn = DNN(self.compute_input_dim(dnn_feature_columns, embedding_size, ), dnn_hidden_units,
                       activation=dnn_activation, l2_reg=l2_reg_dnn, dropout_rate=dnn_dropout, use_bn=dnn_use_bn,
                       init_std=init_std)
        self.dnn_linear = nn.Linear(dnn_hidden_units[-1], 1, bias=False)

        self.add_regularization_loss(
            filter(lambda x: 'weight' in x[0] and 'bn' not in x[0], self.dnn.named_parameters()), l2_reg_dnn)
        self.add_regularization_loss(self.dnn_linear.weight, l2_reg_dnn)

        if use_fm:
            self.fm = FM()
        self.use_fm = use_fm
        self.to(device)

    def forward(self, X):

        sparse_embedding_list, dense_value_list = self.input_from_feature_columns(X, self.dnn_feature_columns,
                                                                                  self.embedding_dict)
        linear_logit = self.linear_model(X)

        dnn_input = combined_dnn_input(sparse_embedding_list, dense_value_list)

        dnn_output = self.dnn(dnn_input)
        dnn_logit = self.dnn_linear(dnn_output)
        logit = linear_logit + dnn_logit

        if self.use_fm:
            fm_input = torch.cat(sparse_embedding_list, dim=1)
            logit += self.fm(fm_input)
        y_pred = self.out(logit)

        return y_pred


def build() -> dict:
    torch.manual_seed(1024)
    feature_columns = [SparseFeat('C1', 4, 'C1'), SparseFeat('C2', 5, 'C2'), SparseFeat('C3', 3, 'C3')]
    model = DeepFM(feature_columns, feature_columns, embedding_size=4, dnn_hidden_units=(8, 8), task='binary')  # @build_model
    # model.compile("adam", "binary_crossentropy")
    model.optim = torch.optim.Adam(model.parameters())
    model.loss_func = F.binary_cross_entropy
    train_loader = [(torch.stack([torch.randint(0, n, (4,)) for n in (4, 5, 3)], dim=1),
                     torch.randint(0, 2, (4, 1))) for _ in range(ITERATIONS + 2)]
    return {"model": model, "train_loader": train_loader, "index": 0, "loss_epoch": 0, "total_loss_epoch": 0}


def fit_batch(state: dict) -> None:
    self = state["model"]
    model = self.train()
    loss_func = self.loss_func
    optim = self.optim
    x_train, y_train = state["train_loader"][state["index"] % len(state["train_loader"])]
    state["index"] += 1
    x = x_train.to(self.device).float()
    y = y_train.to(self.device).float()

    y_pred = model(x).squeeze()

    optim.zero_grad()
    loss = loss_func(y_pred, y.squeeze(), reduction='sum')

    total_loss = loss + self.reg_loss

    state["loss_epoch"] += loss.item()
    state["total_loss_epoch"] += total_loss.item()
    total_loss.backward(retain_graph=True)  # @backward
    optim.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        fit_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: fit_batch(state)


if __name__ == "__main__":
    run(build())
