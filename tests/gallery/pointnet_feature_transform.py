"""PointNet classification with the feature transform and its orthogonality regulariser added to the loss.

Source: fxia22/pointnet.pytorch, utils/train_classification.py and pointnet/model.py (commit
f0c2430b0b1529e3f76fb5d6cd6ca14be763d975), run with `--feature_transform`; the regulariser is the one its issues
#5, #56 and #109 discuss (https://github.com/fxia22/pointnet.pytorch/issues/109). As published: STN3d and STNkd
(Conv1d 64/128/1024, BatchNorm, max-pool, fc 512/256, an identity added), PointNetfeat (the input transform, conv1,
the 64x64 feature transform, conv2, conv3, max-pool), PointNetCls (fc 512/256, dropout 0.3, log_softmax),
feature_transform_regularizer (`mean(norm(bmm(trans, trans^T) - I))`); the loop: `scheduler.step()` at the start
of the epoch (as published, before the optimizer's first step), then per batch `target = target[:, 0]`,
`points.transpose(2, 1)`, `optimizer.zero_grad()`, `classifier = classifier.train()`, `pred, trans, trans_feat =
classifier(points)`, `loss = F.nll_loss(pred, target)`, `loss += feature_transform_regularizer(trans_feat) *
0.001`, `loss.backward()`, `optimizer.step()`, the accuracy from `pred.data`. Adam(lr=0.001), StepLR(20, 0.5).
Retyped at CPU size: the published widths, 32 points per cloud (published 2500), batches of 4 (32) of made-up
clouds with 4 classes in place of ShapeNet; `.cuda()` dropped; the test batch every 10 batches, printing and
checkpoints left out. An iteration is one batch; `run` is one epoch.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3
NUM_POINTS, BATCH, NUM_CLASSES = 32, 4, 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class STN3d(nn.Module):
    def __init__(self):
        super(STN3d, self).__init__()
        self.conv1 = torch.nn.Conv1d(3, 64, 1)
        self.conv2 = torch.nn.Conv1d(64, 128, 1)
        self.conv3 = torch.nn.Conv1d(128, 1024, 1)
        self.fc1 = nn.Linear(1024, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 9)
        self.relu = nn.ReLU()

        self.bn1 = nn.BatchNorm1d(64)
        self.bn2 = nn.BatchNorm1d(128)
        self.bn3 = nn.BatchNorm1d(1024)
        self.bn4 = nn.BatchNorm1d(512)
        self.bn5 = nn.BatchNorm1d(256)

    def forward(self, x):
        batchsize = x.size()[0]
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, 1024)

        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x)

        iden = torch.from_numpy(np.array([1,0,0,0,1,0,0,0,1]).astype(np.float32)).view(1,9).repeat(batchsize,1)
        x = x + iden
        x = x.view(-1, 3, 3)
        return x


class STNkd(nn.Module):
    def __init__(self, k=64):
        super(STNkd, self).__init__()
        self.conv1 = torch.nn.Conv1d(k, 64, 1)
        self.conv2 = torch.nn.Conv1d(64, 128, 1)
        self.conv3 = torch.nn.Conv1d(128, 1024, 1)
        self.fc1 = nn.Linear(1024, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, k*k)
        self.relu = nn.ReLU()

        self.bn1 = nn.BatchNorm1d(64)
        self.bn2 = nn.BatchNorm1d(128)
        self.bn3 = nn.BatchNorm1d(1024)
        self.bn4 = nn.BatchNorm1d(512)
        self.bn5 = nn.BatchNorm1d(256)

        self.k = k

    def forward(self, x):
        batchsize = x.size()[0]
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, 1024)

        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x)

        iden = torch.from_numpy(np.eye(self.k).flatten().astype(np.float32)).view(1,self.k*self.k).repeat(batchsize,1)
        x = x + iden
        x = x.view(-1, self.k, self.k)
        return x


class PointNetfeat(nn.Module):
    def __init__(self, global_feat = True, feature_transform = False):
        super(PointNetfeat, self).__init__()
        self.stn = STN3d()
        self.conv1 = torch.nn.Conv1d(3, 64, 1)
        self.conv2 = torch.nn.Conv1d(64, 128, 1)
        self.conv3 = torch.nn.Conv1d(128, 1024, 1)
        self.bn1 = nn.BatchNorm1d(64)
        self.bn2 = nn.BatchNorm1d(128)
        self.bn3 = nn.BatchNorm1d(1024)
        self.global_feat = global_feat
        self.feature_transform = feature_transform
        if self.feature_transform:
            self.fstn = STNkd(k=64)

    def forward(self, x):
        n_pts = x.size()[2]
        trans = self.stn(x)
        x = x.transpose(2, 1)
        x = torch.bmm(x, trans)
        x = x.transpose(2, 1)
        x = F.relu(self.bn1(self.conv1(x)))

        if self.feature_transform:
            trans_feat = self.fstn(x)
            x = x.transpose(2,1)
            x = torch.bmm(x, trans_feat)
            x = x.transpose(2,1)
        else:
            trans_feat = None

        pointfeat = x
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        x = torch.max(x, 2, keepdim=True)[0]
        x = x.view(-1, 1024)
        if self.global_feat:
            return x, trans, trans_feat
        else:
            x = x.view(-1, 1024, 1).repeat(1, 1, n_pts)
            return torch.cat([x, pointfeat], 1), trans, trans_feat


class PointNetCls(nn.Module):
    def __init__(self, k=2, feature_transform=False):
        super(PointNetCls, self).__init__()
        self.feature_transform = feature_transform
        self.feat = PointNetfeat(global_feat=True, feature_transform=feature_transform)
        self.fc1 = nn.Linear(1024, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, k)
        self.dropout = nn.Dropout(p=0.3)
        self.bn1 = nn.BatchNorm1d(512)
        self.bn2 = nn.BatchNorm1d(256)
        self.relu = nn.ReLU()

    def forward(self, x):
        x, trans, trans_feat = self.feat(x)
        x = F.relu(self.bn1(self.fc1(x)))
        x = F.relu(self.bn2(self.dropout(self.fc2(x))))
        x = self.fc3(x)
        return F.log_softmax(x, dim=1), trans, trans_feat


def feature_transform_regularizer(trans):
    d = trans.size()[1]
    batchsize = trans.size()[0]
    I = torch.eye(d)[None, :, :]  # as published
    loss = torch.mean(torch.norm(torch.bmm(trans, trans.transpose(2,1)) - I, dim=(1,2)))
    return loss


def build() -> dict:
    torch.manual_seed(1234)
    classifier = PointNetCls(k=NUM_CLASSES, feature_transform=True)
    optimizer = optim.Adam(classifier.parameters(), lr=0.001, betas=(0.9, 0.999))
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    clouds = torch.rand(ITERATIONS * 2, BATCH, NUM_POINTS, 3) * 2 - 1
    labels = torch.randint(0, NUM_CLASSES, (ITERATIONS * 2, BATCH, 1))
    return {"classifier": classifier, "optimizer": optimizer, "scheduler": scheduler,
            "dataloader": list(zip(clouds, labels)), "i": 0}


def iteration(state: dict) -> None:
    optimizer = state["optimizer"]
    data = state["dataloader"][state["i"] % len(state["dataloader"])]
    state["i"] += 1
    points, target = data
    target = target[:, 0]
    points = points.transpose(2, 1)
    optimizer.zero_grad()
    classifier = state["classifier"].train()
    pred, trans, trans_feat = classifier(points)
    loss = F.nll_loss(pred, target)
    loss += feature_transform_regularizer(trans_feat) * 0.001
    loss.backward()
    optimizer.step()
    pred_choice = pred.data.max(1)[1]
    correct = pred_choice.eq(target.data).cpu().sum()
    state["accuracy"] = correct.item() / float(BATCH)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    state["scheduler"].step()
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
