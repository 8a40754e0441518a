"""GAIL's discriminator update: expert against policy state-action pairs, with a gradient penalty on their mix-up.

Source: ikostrikov/pytorch-a2c-ppo-acktr-gail, a2c_ppo_acktr/algo/gail.py (commit
0c17533cc4a66afc051b115f2fc37bce04aef773): Discriminator (trunk Linear-Tanh-Linear-Tanh-Linear, its own Adam),
compute_grad_pen as published (`autograd.grad(outputs=disc, inputs=mixup_data, grad_outputs=ones,
create_graph=True, retain_graph=True, only_inputs=True)`, `lambda_ * (grad.norm(2, dim=1) - 1).pow(2).mean()`),
and update(): per pair of an expert minibatch and a policy minibatch, `policy_d` and `expert_d` from the trunk,
the two BCE-with-logits losses, the penalty, `loss += (gail_loss + grad_pen).item()`, zero_grad,
`(gail_loss + grad_pen).backward()`, step. The `retain_graph=True` beside `create_graph=True` is what
autograd.grad does anyway (retain_graph defaults to create_graph). Retyped at CPU size: one pass of update's
`for expert_batch, policy_batch in zip(...)` is one iteration; the expert loader (ExpertDataset over a
torch.load'ed file) becomes made-up expert (state, action) batches and the rollout storage's
feed_forward_generator made-up policy minibatches in its tuple layout (obs, recurrent_hidden_states, actions, ...);
`obsfilt` (VecNormalize's `_obfilt` with `update=False`) a fixed normalisation of the same form; state 3
numbers, action 1, hidden_dim 16 (published 100), 4 pairs a minibatch; `.to(device)` on the CPU.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import autograd

ITERATIONS = 3
STATE, ACTION, BATCH = 3, 1, 4

TRUTH = {
    "error": None,
    "retains": {"@grad": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Discriminator(nn.Module):
    def __init__(self, input_dim, hidden_dim, device):
        super(Discriminator, self).__init__()

        self.device = device

        self.trunk = nn.Sequential(
            nn.Linear(input_dim, hidden_dim), nn.Tanh(),
            nn.Linear(hidden_dim, hidden_dim), nn.Tanh(),
            nn.Linear(hidden_dim, 1)).to(device)

        self.trunk.train()

        self.optimizer = torch.optim.Adam(self.trunk.parameters())

        self.returns = None

    def compute_grad_pen(self,
                         expert_state,
                         expert_action,
                         policy_state,
                         policy_action,
                         lambda_=10):
        alpha = torch.rand(expert_state.size(0), 1)
        expert_data = torch.cat([expert_state, expert_action], dim=1)
        policy_data = torch.cat([policy_state, policy_action], dim=1)

        alpha = alpha.expand_as(expert_data).to(expert_data.device)

        mixup_data = alpha * expert_data + (1 - alpha) * policy_data
        mixup_data.requires_grad = True

        disc = self.trunk(mixup_data)
        ones = torch.ones(disc.size()).to(disc.device)
        grad = autograd.grad(
            outputs=disc,
            inputs=mixup_data,
            grad_outputs=ones,
            create_graph=True,
            retain_graph=True,  # @grad
            only_inputs=True)[0]

        grad_pen = lambda_ * (grad.norm(2, dim=1) - 1).pow(2).mean()
        return grad_pen


def obsfilt(obs, update=False):
    # VecNormalize._obfilt with fixed running statistics
    return np.clip((obs - 0.1) / np.sqrt(0.5 + 1e-8), -10.0, 10.0)


def expert_batch_sample():
    return torch.randn(BATCH, STATE), torch.randn(BATCH, ACTION)


def policy_batch_sample():
    obs = torch.randn(BATCH, STATE)
    actions = torch.randn(BATCH, ACTION)
    return obs, torch.zeros(BATCH, 1), actions, None, None, None, None, None


def build() -> dict:
    torch.manual_seed(0)
    discr = Discriminator(STATE + ACTION, 16, torch.device("cpu"))
    discr.train()
    return {"discr": discr, "loss": 0, "n": 0}


def iteration(state: dict) -> None:
    self = state["discr"]
    expert_batch, policy_batch = expert_batch_sample(), policy_batch_sample()
    policy_state, policy_action = policy_batch[0], policy_batch[2]
    policy_d = self.trunk(
        torch.cat([policy_state, policy_action], dim=1))

    expert_state, expert_action = expert_batch
    expert_state = obsfilt(expert_state.numpy(), update=False)
    expert_state = torch.FloatTensor(expert_state).to(self.device)
    expert_action = expert_action.to(self.device)
    expert_d = self.trunk(
        torch.cat([expert_state, expert_action], dim=1))

    expert_loss = F.binary_cross_entropy_with_logits(
        expert_d,
        torch.ones(expert_d.size()).to(self.device))
    policy_loss = F.binary_cross_entropy_with_logits(
        policy_d,
        torch.zeros(policy_d.size()).to(self.device))

    gail_loss = expert_loss + policy_loss
    grad_pen = self.compute_grad_pen(expert_state, expert_action,
                                     policy_state, policy_action)

    state["loss"] += (gail_loss + grad_pen).item()
    state["n"] += 1

    self.optimizer.zero_grad()
    (gail_loss + grad_pen).backward()  # @backward
    self.optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
