"""MP-PDE solvers' pushforward trick: the rollout that makes the input runs under no_grad, the last step trains.

Source: brandstetter-johannes/MP-Neural-PDE-Solvers, experiments/train_helper.py `training_loop` (commit
0eb0beabebd11117689fde8456b8deaa116cba0a), the CNN branch (`f'{model}' != 'GNN'`), and experiments/train.py (same
commit: `unrolling = [r for r in range(args.unrolling + 1)]`, default unrolling 1; Adam; criterion
MSELoss(reduction="sum")); GraphCreator.create_data from common/utils.py (commit
85fe50fe40f55f16039a446f6bcc6bf424af8405: `data = u[step - tw:step]`, `labels = u[step:tw + step]` per trajectory,
stacked). As published: per batch zero_grad, a random number of unrollings, random start times, the
unrolled predictions under `torch.no_grad()` ("This is the pushforward trick!!!"), one trained step from the
pushed-forward input, `loss = torch.sqrt(loss)`, backward, `losses.append(loss.detach() / batch_size)`, step.
Retyped at CPU size: a two-layer Conv1d net (time window tw=5 channels in and out, 16 hidden, ELU) in place of
models_cnn.BaseCNN, made-up trajectories of t_res=25 steps on 16 points (no HDF5 file), batch 4, 3 batches;
`.to(device)` dropped; `torch.Tensor()` accumulators of create_data kept.
"""

import random
from collections.abc import Callable

import torch
from torch import nn, optim

ITERATIONS = 3
TW = 5
T_RES = 25
NX = 16

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class GraphCreator:
    def __init__(self, tw, t_res):
        self.tw = tw
        self.t_res = t_res

    def create_data(self, datapoints, steps):
        data = torch.Tensor()
        labels = torch.Tensor()
        for (dp, step) in zip(datapoints, steps):
            d = dp[step - self.tw:step]
            l = dp[step:self.tw + step]
            data = torch.cat((data, d[None, :]), 0)
            labels = torch.cat((labels, l[None, :]), 0)
        return data, labels


class CNN(nn.Module):
    def __init__(self, tw):
        super().__init__()
        self.conv1 = nn.Conv1d(tw, 16, 5, padding=2)
        self.conv2 = nn.Conv1d(16, tw, 5, padding=2)

    def __repr__(self):
        return 'BaseCNN'

    def forward(self, u):
        return u[:, -1:] + self.conv2(nn.functional.elu(self.conv1(u)))


def build() -> dict:
    random.seed(0)
    torch.manual_seed(42)
    model = CNN(TW)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    trajectories = torch.sin(torch.linspace(0, 6.28, NX)[None, None, :] * torch.rand(12, 1, 1) * 3
                             + torch.linspace(0, 3, T_RES)[None, :, None])
    loader = [(None, trajectories[i:i + 4], None, None) for i in range(0, 12, 4)]
    return {"model": model, "optimizer": optimizer, "loader": loader, "batch": 0,
            "graph_creator": GraphCreator(TW, T_RES), "criterion": torch.nn.MSELoss(reduction="sum"),
            "unrolling": [r for r in range(1 + 1)], "batch_size": 4, "losses": []}


def iteration(state: dict) -> None:
    model, optimizer, graph_creator, criterion, unrolling, batch_size, losses = (
        state["model"], state["optimizer"], state["graph_creator"], state["criterion"], state["unrolling"],
        state["batch_size"], state["losses"])
    (u_base, u_super, x, variables) = state["loader"][state["batch"] % len(state["loader"])]
    state["batch"] += 1
    optimizer.zero_grad()
    # Randomly choose number of unrollings
    unrolled_graphs = random.choice(unrolling)
    steps = [t for t in range(graph_creator.tw,
                              graph_creator.t_res - graph_creator.tw - (graph_creator.tw * unrolled_graphs) + 1)]
    # Randomly choose starting (time) point at the PDE solution manifold
    random_steps = random.choices(steps, k=batch_size)
    data, labels = graph_creator.create_data(u_super, random_steps)

    # Unrolling of the equation which serves as input at the current step
    # This is the pushforward trick!!!
    with torch.no_grad():  # @pushforward
        for _ in range(unrolled_graphs):
            random_steps = [rs + graph_creator.tw for rs in random_steps]
            _, labels = graph_creator.create_data(u_super, random_steps)
            data = model(data)

    pred = model(data)
    loss = criterion(pred, labels)

    loss = torch.sqrt(loss)
    loss.backward()  # @backward
    losses.append(loss.detach() / batch_size)  # @losses
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
