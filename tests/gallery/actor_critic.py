"""pytorch/examples' actor-critic: log-probs and values saved on the model over an episode, one backward at its end.

Source: pytorch/examples, reinforcement_learning/actor_critic.py: `model = Policy()` and `optimizer`
at module level, select_action(state) appends SavedAction(m.log_prob(action), state_value) to
model.saved_actions, finish_episode() builds policy and value losses from them, optimizer.zero_grad(),
`loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()`, loss.backward(),
optimizer.step(), `del model.rewards[:]`, `del model.saved_actions[:]`. Retyped at CPU size: 16 hidden
units (published 128), a four-step stand-in for CartPole (gym is not a dependency) returning numpy
states, gamma 0.99, one episode per iteration; the module-level model and optimizer are set by build().
"""

from collections import namedtuple
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

ITERATIONS = 3
gamma = 0.99
eps = np.finfo(np.float32).eps.item()
SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])
model = None  # set by build(), read by select_action and finish_episode as published
optimizer = None

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 16)
        self.action_head = nn.Linear(16, 2)
        self.value_head = nn.Linear(16, 1)
        self.saved_actions = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.affine1(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


class FourStepEnv:
    """Stands in for gym's CartPole: numpy states, reward 1 per step, done after four steps."""

    def __init__(self, generator):
        self.generator = generator
        self.t = 0

    def reset(self):
        self.t = 0
        return torch.randn(4, generator=self.generator).numpy()

    def step(self, action):
        self.t += 1
        state = torch.randn(4, generator=self.generator).numpy() + 0.1 * action
        return state, 1.0, self.t >= 4, {}


def select_action(state):
    state = torch.from_numpy(state).float()
    probs, state_value = model(state)
    m = Categorical(probs)
    action = m.sample()
    model.saved_actions.append(SavedAction(m.log_prob(action), state_value))  # @save_action
    return action.item()


def finish_episode():
    R = 0
    saved_actions = model.saved_actions
    policy_losses = []
    value_losses = []
    returns = []
    for r in model.rewards[::-1]:
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for (log_prob, value), R in zip(saved_actions, returns):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
    optimizer.zero_grad()
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    loss.backward()  # @backward
    optimizer.step()
    del model.rewards[:]
    del model.saved_actions[:]


def build() -> dict:
    global model, optimizer
    torch.manual_seed(543)
    model = Policy()
    optimizer = optim.Adam(model.parameters(), lr=3e-2)
    return {"model": model, "optimizer": optimizer, "env": FourStepEnv(torch.Generator().manual_seed(543)),
            "running_reward": 10}


def episode(state: dict) -> None:
    env = state["env"]
    env_state = env.reset()
    ep_reward = 0
    for t in range(1, 10000):
        action = select_action(env_state)
        env_state, reward, done, _ = env.step(action)
        model.rewards.append(reward)
        ep_reward += reward
        if done:
            break
    state["running_reward"] = 0.05 * ep_reward + (1 - 0.05) * state["running_reward"]
    finish_episode()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i_episode in range(1, iterations + 1):
        episode(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: episode(state)


if __name__ == "__main__":
    run(build())
