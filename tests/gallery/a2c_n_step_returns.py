"""A2C with n-step returns over vectorised environments: the bootstrap value's graph cut by `.detach()` on the returns.

Source: higgsfield/RL-Adventure-2, 1.actor-critic.ipynb (ActorCritic, compute_returns, the `while frame_idx <
max_frames` loop), in the retyping indexed as an A2C `main.py` (search index id 6296121057, whose repository the
index does not name: `train(cfg, envs)` with `n_steps=5`, `hidden_dim=256`, `optim.Adam(model.parameters())`,
`compute_returns(next_value, rewards, masks, gamma=0.99)`, `returns = torch.cat(returns).detach()`, the actor loss on
`advantage.detach()`, `loss = actor_loss + 0.5 * critic_loss - 0.001 * entropy`). As published: each update
rolls out n_steps in every environment, keeping log_probs, values, rewards, masks and a running `entropy` that
starts at 0 for each rollout, bootstraps from `model(next_state)`, and takes one backward. Retyped at CPU size: 4
environments (published 8 through SubprocVecEnv) of a made-up numpy CartPole stand-in (4-d observations, reward 1,
episodes ending at random, auto-reset as SubprocVecEnv does), hidden 16, 3 updates; the test_env evaluation every
100 steps never runs in 15 steps and is left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions import Categorical

ITERATIONS = 3
N_ENVS, N_STATES, N_ACTIONS, HIDDEN, N_STEPS = 4, 4, 2, 16, 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class ActorCritic(nn.Module):
    def __init__(self, num_inputs, num_outputs, hidden_size, std=0.0):
        super(ActorCritic, self).__init__()
        self.critic = nn.Sequential(
            nn.Linear(num_inputs, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, 1)
        )
        self.actor = nn.Sequential(
            nn.Linear(num_inputs, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, num_outputs),
            nn.Softmax(dim=1),
        )

    def forward(self, x):
        value = self.critic(x)
        probs = self.actor(x)
        dist = Categorical(probs)
        return dist, value


class ToyVecEnv:
    """A made-up stand-in for SubprocVecEnv over CartPole: numpy observations, reward 1, random episode ends."""

    def __init__(self, n_envs, seed):
        self.rng = np.random.RandomState(seed)
        self.n_envs = n_envs

    def reset(self):
        return self.rng.randn(self.n_envs, N_STATES).astype(np.float32)

    def step(self, actions):
        obs = self.rng.randn(self.n_envs, N_STATES).astype(np.float32) + actions[:, None]
        reward = np.ones(self.n_envs, dtype=np.float32)
        done = (self.rng.rand(self.n_envs) < 0.2).astype(np.float32)
        return obs, reward, done, [{} for _ in range(self.n_envs)]


def compute_returns(next_value, rewards, masks, gamma=0.99):
    R = next_value
    returns = []
    for step in reversed(range(len(rewards))):
        R = rewards[step] + gamma * R * masks[step]
        returns.insert(0, R)
    return returns


def build() -> dict:
    torch.manual_seed(0)
    envs = ToyVecEnv(N_ENVS, seed=0)
    model = ActorCritic(N_STATES, N_ACTIONS, HIDDEN)
    optimizer = optim.Adam(model.parameters())
    return {"envs": envs, "model": model, "optimizer": optimizer, "state": envs.reset(), "step_idx": 0}


def iteration(s: dict) -> None:
    envs, model, optimizer, device = s["envs"], s["model"], s["optimizer"], "cpu"
    state = s["state"]
    log_probs = []
    values    = []
    rewards   = []
    masks     = []
    entropy = 0
    # rollout trajectory
    for _ in range(N_STEPS):
        state = torch.FloatTensor(state).to(device)
        dist, value = model(state)
        action = dist.sample()
        next_state, reward, done, _ = envs.step(action.cpu().numpy())
        log_prob = dist.log_prob(action)
        entropy += dist.entropy().mean()
        log_probs.append(log_prob)
        values.append(value)
        rewards.append(torch.FloatTensor(reward).unsqueeze(1).to(device))
        masks.append(torch.FloatTensor(1 - done).unsqueeze(1).to(device))
        state = next_state
        s["step_idx"] += 1
    s["state"] = state
    next_state = torch.FloatTensor(next_state).to(device)
    _, next_value = model(next_state)
    returns = compute_returns(next_value, rewards, masks)
    log_probs = torch.cat(log_probs)
    returns   = torch.cat(returns).detach()
    values    = torch.cat(values)
    advantage = returns - values
    actor_loss  = -(log_probs * advantage.detach()).mean()
    critic_loss = advantage.pow(2).mean()
    loss = actor_loss + 0.5 * critic_loss - 0.001 * entropy
    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
