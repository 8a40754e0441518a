"""REINFORCE whose policy keeps its saved log-probabilities across updates: the second update walks the first's graph.

Source: pytorch/examples reinforcement_learning/reinforce.py (Policy with `saved_log_probs` and `rewards` lists,
select_action appending `m.log_prob(action)`, finish_episode computing the discounted, normalised returns and
`policy_loss = torch.cat(policy_loss).sum()`), with the experience kept across updates as in pytorch/examples
issue #151 ("to store experience of policy gradient, i will call finish_episode() more than once"): the published
finish_episode ends with `del policy.rewards[:]` and `del policy.saved_log_probs[:]`; here the second is left out.
Retyped at CPU size: CartPole replaced by made-up 4-float states and a reward of the action taken, episodes of 6
steps, hidden layer of 16, dropout kept.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "policy.saved_log_probs", "line": "@log_prob"}],
    "notes": [],
    "modifies_in_place": [],
}


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 16)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(16, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


def select_action(policy, state):
    state = state.unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))  # @log_prob
    return action.item()


def finish_episode(policy, optimizer, gamma=0.99, eps=1e-6):
    R = 0
    policy_loss = []
    returns = []
    for r in policy.rewards[::-1]:
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for log_prob, R in zip(policy.saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()  # @backward
    optimizer.step()
    del policy.rewards[:]


def build() -> dict:
    torch.manual_seed(543)
    policy = Policy()
    return {"policy": policy, "optimizer": torch.optim.Adam(policy.parameters(), lr=1e-2),
            "states": torch.Generator().manual_seed(0)}


def iteration(state: dict) -> None:
    policy, optimizer = state["policy"], state["optimizer"]
    observation = torch.randn(4, generator=state["states"])
    for t in range(6):
        action = select_action(policy, observation)
        observation = torch.randn(4, generator=state["states"])
        policy.rewards.append(float(action))
    finish_episode(policy, optimizer)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i_episode in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
