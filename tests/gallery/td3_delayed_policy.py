"""TD3: twin critics, target smoothing under torch.no_grad() and an actor updated every policy_freq critic steps.

Source: sfujim/TD3, TD3.py (commit 6a9f76101058d674518018ffbb532f5a652c1d37) with utils.py's ReplayBuffer and
main.py's `policy.train(replay_buffer, args.batch_size)` once per time step after start_timesteps: Actor, Critic (Q1
and Q2 heads on `torch.cat([state, action], 1)`, `Q1()`), TD3 with `copy.deepcopy` targets and Adam 3e-4; train() as
published (`self.total_it += 1`, the clipped-noise target under torch.no_grad(), `critic_loss = F.mse_loss(current_Q1,
target_Q) + F.mse_loss(current_Q2, target_Q)`, critic zero_grad/backward/step, and every policy_freq (2) iterations
`actor_loss = -self.critic.Q1(state, self.actor(state)).mean()`, actor zero_grad/backward/step and the soft target
updates through `target_param.data.copy_`). Retyped at CPU size: hidden width 8 (published 256), batch_size 4
(published 256), `.to(device)` dropped, a replay buffer of 16 made-up transitions of a 3-dimensional state and a
2-dimensional action in [-1, 1] (no gym environment, no exploration steps); one train() call is an iteration.
"""

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class ReplayBuffer(object):
    def __init__(self, state_dim, action_dim, max_size=int(1e6)):
        self.max_size = max_size
        self.ptr = 0
        self.size = 0

        self.state = np.zeros((max_size, state_dim))
        self.action = np.zeros((max_size, action_dim))
        self.next_state = np.zeros((max_size, state_dim))
        self.reward = np.zeros((max_size, 1))
        self.not_done = np.zeros((max_size, 1))

    def add(self, state, action, next_state, reward, done):
        self.state[self.ptr] = state
        self.action[self.ptr] = action
        self.next_state[self.ptr] = next_state
        self.reward[self.ptr] = reward
        self.not_done[self.ptr] = 1.0 - done

        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample(self, batch_size):
        ind = np.random.randint(0, self.size, size=batch_size)

        return (
            torch.FloatTensor(self.state[ind]),
            torch.FloatTensor(self.action[ind]),
            torch.FloatTensor(self.next_state[ind]),
            torch.FloatTensor(self.reward[ind]),
            torch.FloatTensor(self.not_done[ind]),
        )


class Actor(nn.Module):
    def __init__(self, state_dim, action_dim, max_action):
        super(Actor, self).__init__()

        self.l1 = nn.Linear(state_dim, 8)
        self.l2 = nn.Linear(8, 8)
        self.l3 = nn.Linear(8, action_dim)

        self.max_action = max_action

    def forward(self, state):
        a = F.relu(self.l1(state))
        a = F.relu(self.l2(a))
        return self.max_action * torch.tanh(self.l3(a))


class Critic(nn.Module):
    def __init__(self, state_dim, action_dim):
        super(Critic, self).__init__()

        # Q1 architecture
        self.l1 = nn.Linear(state_dim + action_dim, 8)
        self.l2 = nn.Linear(8, 8)
        self.l3 = nn.Linear(8, 1)

        # Q2 architecture
        self.l4 = nn.Linear(state_dim + action_dim, 8)
        self.l5 = nn.Linear(8, 8)
        self.l6 = nn.Linear(8, 1)

    def forward(self, state, action):
        sa = torch.cat([state, action], 1)

        q1 = F.relu(self.l1(sa))
        q1 = F.relu(self.l2(q1))
        q1 = self.l3(q1)

        q2 = F.relu(self.l4(sa))
        q2 = F.relu(self.l5(q2))
        q2 = self.l6(q2)
        return q1, q2

    def Q1(self, state, action):
        sa = torch.cat([state, action], 1)

        q1 = F.relu(self.l1(sa))
        q1 = F.relu(self.l2(q1))
        q1 = self.l3(q1)
        return q1


class TD3(object):
    def __init__(
        self,
        state_dim,
        action_dim,
        max_action,
        discount=0.99,
        tau=0.005,
        policy_noise=0.2,
        noise_clip=0.5,
        policy_freq=2,
    ):

        self.actor = Actor(state_dim, action_dim, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-4)

        self.critic = Critic(state_dim, action_dim)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=3e-4)

        self.max_action = max_action
        self.discount = discount
        self.tau = tau
        self.policy_noise = policy_noise
        self.noise_clip = noise_clip
        self.policy_freq = policy_freq

        self.total_it = 0

    def train(self, replay_buffer, batch_size=256):
        self.total_it += 1

        # Sample replay buffer
        state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)

        with torch.no_grad():
            # Select action according to policy and add clipped noise
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)

            next_action = (self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)

            # Compute the target Q value
            target_Q1, target_Q2 = self.critic_target(next_state, next_action)
            target_Q = torch.min(target_Q1, target_Q2)
            target_Q = reward + not_done * self.discount * target_Q

        # Get current Q estimates
        current_Q1, current_Q2 = self.critic(state, action)

        # Compute critic loss
        critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)

        # Optimize the critic
        self.critic_optimizer.zero_grad()
        critic_loss.backward()  # @critic_backward
        self.critic_optimizer.step()

        # Delayed policy updates
        if self.total_it % self.policy_freq == 0:
            # Compute actor losse
            actor_loss = -self.critic.Q1(state, self.actor(state)).mean()

            # Optimize the actor
            self.actor_optimizer.zero_grad()
            actor_loss.backward()  # @actor_backward
            self.actor_optimizer.step()

            # Update the frozen target models
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)

            for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    state_dim, action_dim, max_action = 3, 2, 1.0
    policy = TD3(state_dim, action_dim, max_action)
    replay_buffer = ReplayBuffer(state_dim, action_dim, max_size=64)
    for _ in range(16):
        replay_buffer.add(
            np.random.randn(state_dim),
            np.random.uniform(-1, 1, action_dim),
            np.random.randn(state_dim),
            np.random.randn(),
            0.0,
        )
    return {"policy": policy, "replay_buffer": replay_buffer, "batch_size": 4}


def iteration(state: dict) -> None:
    state["policy"].train(state["replay_buffer"], state["batch_size"])


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for t in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
