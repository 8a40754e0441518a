"""NCF (guoyang9/NCF): NeuMF (GMF + MLP towers) on implicit feedback, negatives re-sampled each epoch.

Source: guoyang9/NCF, main.py (commit 0507d5bf7c1253826dfd0afc1f0aa95fac6b23cb): `model = model.NCF(user_num,
item_num, args.factor_num, args.num_layers, args.dropout, config.model, GMF_model, MLP_model)`, `loss_function =
nn.BCEWithLogitsLoss()`, Adam (config.model 'NeuMF-end'); per epoch `model.train()`,
`train_loader.dataset.ng_sample()`, and per batch `model.zero_grad()`, `prediction = model(user, item)`, `loss =
loss_function(prediction, label)`, `loss.backward()`, `optimizer.step()`, `count += 1`. model.py (commit
5d0ac1be8bd0b3dfca4db7352f8830a677db9782): NCF with embed_user_GMF/embed_item_GMF, embed_user_MLP/embed_item_MLP
(factor_num * 2 ** (num_layers - 1)), the MLP tower of Dropout/Linear/ReLU halving, predict_layer on the concat,
_init_weight_ (normal 0.01, xavier, kaiming). data_utils.py's NCFData (ng_sample draws num_ng items not in
train_mat per positive; labels 1 and 0). Retyped at CPU size: MovieLens becomes 6 users x 10 items with 12 made-up
positives (a dict for the scipy dok_matrix), factor_num 4, num_layers 2, num_ng 2, batch_size 8, dropout 0 and lr
0.001 as published; .cuda() removed; an iteration is one batch (a new epoch, with ng_sample, when the loader is
spent); evaluation, timing and saving are left out.
The training loop is retyped from main.py as stored; model.py and data_utils.py are written from the
published files' structure, not checked line by line against a commit.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data as data

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class NCF(nn.Module):
    def __init__(self, user_num, item_num, factor_num, num_layers, dropout, model, GMF_model=None, MLP_model=None):
        super(NCF, self).__init__()
        self.dropout = dropout
        self.model = model
        self.GMF_model = GMF_model
        self.MLP_model = MLP_model

        self.embed_user_GMF = nn.Embedding(user_num, factor_num)
        self.embed_item_GMF = nn.Embedding(item_num, factor_num)
        self.embed_user_MLP = nn.Embedding(user_num, factor_num * (2 ** (num_layers - 1)))
        self.embed_item_MLP = nn.Embedding(item_num, factor_num * (2 ** (num_layers - 1)))

        MLP_modules = []
        for i in range(num_layers):
            input_size = factor_num * (2 ** (num_layers - i))
            MLP_modules.append(nn.Dropout(p=self.dropout))
            MLP_modules.append(nn.Linear(input_size, input_size//2))
            MLP_modules.append(nn.ReLU())
        self.MLP_layers = nn.Sequential(*MLP_modules)

        if self.model in ['MLP', 'GMF']:
            predict_size = factor_num
        else:
            predict_size = factor_num * 2
        self.predict_layer = nn.Linear(predict_size, 1)

        self._init_weight_()

    def _init_weight_(self):
        if not self.model == 'NeuMF-pre':
            nn.init.normal_(self.embed_user_GMF.weight, std=0.01)
            nn.init.normal_(self.embed_user_MLP.weight, std=0.01)
            nn.init.normal_(self.embed_item_GMF.weight, std=0.01)
            nn.init.normal_(self.embed_item_MLP.weight, std=0.01)

            for m in self.MLP_layers:
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
            nn.init.kaiming_uniform_(self.predict_layer.weight, a=1, nonlinearity='sigmoid')

            for m in self.modules():
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.data.zero_()

    def forward(self, user, item):
        if not self.model == 'MLP':
            embed_user_GMF = self.embed_user_GMF(user)
            embed_item_GMF = self.embed_item_GMF(item)
            output_GMF = embed_user_GMF * embed_item_GMF
        if not self.model == 'GMF':
            embed_user_MLP = self.embed_user_MLP(user)
            embed_item_MLP = self.embed_item_MLP(item)
            interaction = torch.cat((embed_user_MLP, embed_item_MLP), -1)
            output_MLP = self.MLP_layers(interaction)

        if self.model == 'GMF':
            concat = output_GMF
        elif self.model == 'MLP':
            concat = output_MLP
        else:
            concat = torch.cat((output_GMF, output_MLP), -1)

        prediction = self.predict_layer(concat)
        return prediction.view(-1)


class NCFData(data.Dataset):
    def __init__(self, features, num_item, train_mat=None, num_ng=0, is_training=None):
        super(NCFData, self).__init__()
        self.features_ps = features
        self.num_item = num_item
        self.train_mat = train_mat
        self.num_ng = num_ng
        self.is_training = is_training
        self.labels = [0 for _ in range(len(features))]

    def ng_sample(self):
        assert self.is_training, 'no need to sampling when testing'

        self.features_ng = []
        for x in self.features_ps:
            u = x[0]
            for t in range(self.num_ng):
                j = np.random.randint(self.num_item)
                while (u, j) in self.train_mat:
                    j = np.random.randint(self.num_item)
                self.features_ng.append([u, j])

        labels_ps = [1 for _ in range(len(self.features_ps))]
        labels_ng = [0 for _ in range(len(self.features_ng))]

        self.features_fill = self.features_ps + self.features_ng
        self.labels_fill = labels_ps + labels_ng

    def __len__(self):
        return (self.num_ng + 1) * len(self.labels)

    def __getitem__(self, idx):
        features = self.features_fill if self.is_training else self.features_ps
        labels = self.labels_fill if self.is_training else self.labels

        user = features[idx][0]
        item = features[idx][1]
        label = labels[idx]
        return user, item, label


def load_all(user_num=6, item_num=10, n_positives=12):
    """Made-up stand-in for data_utils.load_all: positives as [user, item] pairs and a dict for the dok_matrix."""
    pairs = set()
    while len(pairs) < n_positives:
        pairs.add((int(np.random.randint(user_num)), int(np.random.randint(item_num))))
    train_data = [list(p) for p in sorted(pairs)]
    train_mat = {tuple(p): 1.0 for p in train_data}
    return train_data, user_num, item_num, train_mat


def build() -> dict:
    np.random.seed(0)
    torch.manual_seed(0)
    train_data, user_num, item_num, train_mat = load_all()
    train_dataset = NCFData(train_data, item_num, train_mat, 2, True)
    train_loader = data.DataLoader(train_dataset, batch_size=8, shuffle=True, num_workers=0)
    model = NCF(user_num, item_num, 4, 2, 0.0, 'NeuMF-end', None, None)
    loss_function = nn.BCEWithLogitsLoss()
    optimizer = optim.Adam(model.parameters(), lr=0.001)
    return {"model": model, "optimizer": optimizer, "loss_function": loss_function, "train_loader": train_loader,
            "batches": None, "count": 0}


def iteration(state: dict) -> None:
    model, optimizer, loss_function = state["model"], state["optimizer"], state["loss_function"]
    batch = next(state["batches"], None) if state["batches"] is not None else None
    if batch is None:  # a new epoch
        model.train()  # Enable dropout (if have).
        state["train_loader"].dataset.ng_sample()
        state["batches"] = iter(state["train_loader"])
        batch = next(state["batches"])
    user, item, label = batch
    label = label.float()

    model.zero_grad()
    prediction = model(user, item)
    loss = loss_function(prediction, label)
    loss.backward()  # @backward
    optimizer.step()
    state["count"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
