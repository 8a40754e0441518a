"""FedProx as NIID-Bench trains it: each selected client's local update adds the proximal term against the global
model's own parameters, then FedAvg averages the clients' state dicts into the global model.

Source: Xtra-Computing/NIID-Bench, experiments.py (commit 90cc8de74736d647b835664c0b77ec5372b4ffd4):
`train_net_fedprox` (`global_weight_collector = list(global_net.to(device).parameters())` -- the global model's
parameters themselves, not copies -- then per batch optimizer.zero_grad(), `x.requires_grad = True`, the
cross-entropy, `fed_prox_reg += ((mu / 2) * torch.norm((param - global_weight_collector[param_index]))**2)` over
the client's parameters, `loss += fed_prox_reg`, backward, step, `epoch_loss_collector.append(loss.item())`), and
the `args.alg == 'fedprox'` branch of `__main__` (per communication round: shuffle the parties, select
`n_parties * sample`, load the global state dict into each selected client, `local_train_net_fedprox`, then
`global_para[key] = net_para[key] * fed_avg_freqs[idx]` / `+=` over the selected clients' state dicts and
`global_model.load_state_dict(global_para)`). Retyped at CPU size: NIID-Bench's FcNet-like MLP (16 -> 12 -> 10,
published per dataset), 3 parties of 8 made-up samples each, sample 2/3, one local epoch of two batches of 4, SGD
with momentum (args.rho 0.9, reg 1e-5, lr 0.01), mu 0.01; accuracy computation, loggers and dataloaders left out
(batches are fresh tensors, as a DataLoader's collate makes them). One iteration is one communication round.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3
N_PARTIES = 3
SAMPLE = 0.67
BATCH_SIZE = 4
EPOCHS = 1
LR = 0.01
RHO = 0.9
REG = 1e-5
MU = 0.01

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class FcNet(nn.Module):
    def __init__(self, input_dim=16, hidden_dims=(12,), output_dim=10):
        super().__init__()
        layers = []
        dims = [input_dim, *hidden_dims]
        for i in range(len(hidden_dims)):
            layers += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], output_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


def train_net_fedprox(net_id, net, global_net, train_dataloader, epochs, lr, args_optimizer, mu, device="cpu"):
    if args_optimizer == "sgd":
        optimizer = optim.SGD(filter(lambda p: p.requires_grad, net.parameters()), lr=lr, momentum=RHO,
                              weight_decay=REG)

    criterion = nn.CrossEntropyLoss().to(device)

    cnt = 0
    # mu = 0.001
    global_weight_collector = list(global_net.to(device).parameters())

    for epoch in range(epochs):
        epoch_loss_collector = []
        for batch_idx, (x, target) in enumerate(train_dataloader):
            x, target = x.to(device), target.to(device)

            optimizer.zero_grad()
            x.requires_grad = True
            target.requires_grad = False
            target = target.long()

            out = net(x)
            loss = criterion(out, target)

            #for fedprox
            fed_prox_reg = 0.0
            for param_index, param in enumerate(net.parameters()):
                fed_prox_reg += ((mu / 2) * torch.norm((param - global_weight_collector[param_index]))**2)
            loss += fed_prox_reg

            loss.backward()
            optimizer.step()

            cnt += 1
            epoch_loss_collector.append(loss.item())

        epoch_loss = sum(epoch_loss_collector) / len(epoch_loss_collector)
    return epoch_loss


def dataloader(xs, ys):
    """A DataLoader over one party's data without shuffling: each batch a freshly collated tensor."""
    return [(xs[i:i + BATCH_SIZE].clone(), ys[i:i + BATCH_SIZE].clone()) for i in range(0, len(xs), BATCH_SIZE)]


def build() -> dict:
    seed = 0
    np.random.seed(seed)
    torch.manual_seed(seed)
    nets = {net_id: FcNet() for net_id in range(N_PARTIES)}
    global_model = FcNet()
    global_para = global_model.state_dict()
    for net_id, net in nets.items():  # args.is_same_initial
        net.load_state_dict(global_para)
    xs = torch.randn(N_PARTIES, 8, 16)
    ys = torch.randint(0, 10, (N_PARTIES, 8))
    net_dataidx_map = {net_id: list(range(8)) for net_id in range(N_PARTIES)}
    return {"nets": nets, "global_model": global_model, "xs": xs, "ys": ys, "net_dataidx_map": net_dataidx_map,
            "round": 0}


def iteration(state: dict) -> None:
    nets, global_model, net_dataidx_map = state["nets"], state["global_model"], state["net_dataidx_map"]
    round = state["round"]

    arr = np.arange(N_PARTIES)
    np.random.shuffle(arr)
    selected = arr[:int(N_PARTIES * SAMPLE)]

    global_para = global_model.state_dict()
    if round == 0:
        for idx in selected:
            nets[idx].load_state_dict(global_para)
    else:
        for idx in selected:
            nets[idx].load_state_dict(global_para)

    # local_train_net_fedprox
    for net_id, net in nets.items():
        if net_id not in selected:
            continue
        train_dl_local = dataloader(state["xs"][net_id], state["ys"][net_id])
        train_net_fedprox(net_id, net, global_model, train_dl_local, EPOCHS, LR, "sgd", MU)
    global_model.to("cpu")

    # update global model
    total_data_points = sum([len(net_dataidx_map[r]) for r in selected])
    fed_avg_freqs = [len(net_dataidx_map[r]) / total_data_points for r in selected]

    for idx in range(len(selected)):
        net_para = nets[selected[idx]].cpu().state_dict()
        if idx == 0:
            for key in net_para:
                global_para[key] = net_para[key] * fed_avg_freqs[idx]
        else:
            for key in net_para:
                global_para[key] += net_para[key] * fed_avg_freqs[idx]
    global_model.load_state_dict(global_para)
    state["round"] = round + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for round in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
