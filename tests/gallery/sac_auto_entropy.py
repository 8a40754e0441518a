"""SAC with automatic entropy tuning: alpha becomes `self.log_alpha.exp()` after the first update, a tensor with a graph.

Source: pranz24/pytorch-soft-actor-critic, sac.py (commit 308b109023563601e1d253d7acd8bfa9e528c75e) with model.py
(commit d8ba7370e574340e9e0e9dd0276dbd2241ff3fd1), utils.py (soft_update, hard_update) and replay_memory.py:
SAC.__init__ (QNetwork critic and critic_target, hard_update, `self.target_entropy = -torch.prod(...).item()`,
`self.log_alpha = torch.zeros(1, requires_grad=True)`, alpha_optim = Adam([self.log_alpha]), GaussianPolicy, Adam
everywhere), update_parameters as published (the target under torch.no_grad() with `self.alpha *
next_state_log_pi`, `qf_loss = qf1_loss + qf2_loss`, critic zero_grad/backward/step, `policy_loss = ((self.alpha *
log_pi) - min_qf_pi).mean()`, policy zero_grad/backward/step, `alpha_loss = -(self.log_alpha * (log_pi +
self.target_entropy).detach()).mean()`, alpha zero_grad/backward/step, `self.alpha = self.log_alpha.exp()`,
`alpha_tlogs = self.alpha.clone()`, soft_update every target_update_interval, the `.item()` returns);
main.py's `agent.update_parameters(memory, args.batch_size, updates)` then `updates += 1`. Retyped at CPU size:
`.to(self.device)` dropped, hidden_size 8 (published 256), batch_size 4 (published 256), a made-up Box-like action
space of 2 dimensions in [-1, 1] and a replay memory filled with 16 made-up transitions of a 3-dimensional state (no
gym environment); one update_parameters call is an iteration (updates_per_step 1).
"""

import random
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Normal
from torch.optim import Adam

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    # the policy loss's backward walks the last update's `log_alpha.exp()`; the gradient it sends into log_alpha is
    # dropped by alpha_optim.zero_grad() before alpha_loss.backward(): detached, the run is the same
    "carried": [{"variable": "agent.alpha", "line": "@alpha", "gradient_used": False}],
    "notes": [],
    "modifies_in_place": [],
}

LOG_SIG_MAX = 2
LOG_SIG_MIN = -20
epsilon = 1e-6


# ---------------------------------------------------------------- utils.py


def soft_update(target, source, tau):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + param.data * tau)


def hard_update(target, source):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(param.data)


# ---------------------------------------------------------------- replay_memory.py


class ReplayMemory:
    def __init__(self, capacity, seed):
        random.seed(seed)
        self.capacity = capacity
        self.buffer = []
        self.position = 0

    def push(self, state, action, reward, next_state, done):
        if len(self.buffer) < self.capacity:
            self.buffer.append(None)
        self.buffer[self.position] = (state, action, reward, next_state, done)
        self.position = (self.position + 1) % self.capacity

    def sample(self, batch_size):
        batch = random.sample(self.buffer, batch_size)
        state, action, reward, next_state, done = map(np.stack, zip(*batch))
        return state, action, reward, next_state, done

    def __len__(self):
        return len(self.buffer)


# ---------------------------------------------------------------- model.py


# Initialize Policy weights
def weights_init_(m):
    if isinstance(m, nn.Linear):
        torch.nn.init.xavier_uniform_(m.weight, gain=1)
        torch.nn.init.constant_(m.bias, 0)


class QNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_dim):
        super(QNetwork, self).__init__()

        # Q1 architecture
        self.linear1 = nn.Linear(num_inputs + num_actions, hidden_dim)
        self.linear2 = nn.Linear(hidden_dim, hidden_dim)
        self.linear3 = nn.Linear(hidden_dim, 1)

        # Q2 architecture
        self.linear4 = nn.Linear(num_inputs + num_actions, hidden_dim)
        self.linear5 = nn.Linear(hidden_dim, hidden_dim)
        self.linear6 = nn.Linear(hidden_dim, 1)

        self.apply(weights_init_)

    def forward(self, state, action):
        xu = torch.cat([state, action], 1)

        x1 = F.relu(self.linear1(xu))
        x1 = F.relu(self.linear2(x1))
        x1 = self.linear3(x1)

        x2 = F.relu(self.linear4(xu))
        x2 = F.relu(self.linear5(x2))
        x2 = self.linear6(x2)

        return x1, x2


class GaussianPolicy(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_dim, action_space=None):
        super(GaussianPolicy, self).__init__()

        self.linear1 = nn.Linear(num_inputs, hidden_dim)
        self.linear2 = nn.Linear(hidden_dim, hidden_dim)

        self.mean_linear = nn.Linear(hidden_dim, num_actions)
        self.log_std_linear = nn.Linear(hidden_dim, num_actions)

        self.apply(weights_init_)

        # action rescaling
        if action_space is None:
            self.action_scale = torch.tensor(1.0)
            self.action_bias = torch.tensor(0.0)
        else:
            self.action_scale = torch.FloatTensor((action_space.high - action_space.low) / 2.0)
            self.action_bias = torch.FloatTensor((action_space.high + action_space.low) / 2.0)

    def forward(self, state):
        x = F.relu(self.linear1(state))
        x = F.relu(self.linear2(x))
        mean = self.mean_linear(x)
        log_std = self.log_std_linear(x)
        log_std = torch.clamp(log_std, min=LOG_SIG_MIN, max=LOG_SIG_MAX)
        return mean, log_std

    def sample(self, state):
        mean, log_std = self.forward(state)
        std = log_std.exp()
        normal = Normal(mean, std)
        x_t = normal.rsample()  # for reparameterization trick (mean + std * N(0,1))
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t)
        # Enforcing Action Bound
        log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + epsilon)
        log_prob = log_prob.sum(1, keepdim=True)
        mean = torch.tanh(mean) * self.action_scale + self.action_bias
        return action, log_prob, mean


# ---------------------------------------------------------------- sac.py


class SAC(object):
    def __init__(self, num_inputs, action_space, args):

        self.gamma = args.gamma
        self.tau = args.tau
        self.alpha = args.alpha

        self.policy_type = args.policy
        self.target_update_interval = args.target_update_interval
        self.automatic_entropy_tuning = args.automatic_entropy_tuning

        self.critic = QNetwork(num_inputs, action_space.shape[0], args.hidden_size)
        self.critic_optim = Adam(self.critic.parameters(), lr=args.lr)

        self.critic_target = QNetwork(num_inputs, action_space.shape[0], args.hidden_size)
        hard_update(self.critic_target, self.critic)

        if self.policy_type == "Gaussian":
            # Target Entropy = −dim(A) (e.g. , -6 for HalfCheetah-v2) as given in the paper
            if self.automatic_entropy_tuning is True:
                self.target_entropy = -torch.prod(torch.Tensor(action_space.shape)).item()
                self.log_alpha = torch.zeros(1, requires_grad=True)
                self.alpha_optim = Adam([self.log_alpha], lr=args.lr)

            self.policy = GaussianPolicy(num_inputs, action_space.shape[0], args.hidden_size, action_space)
            self.policy_optim = Adam(self.policy.parameters(), lr=args.lr)

    def update_parameters(self, memory, batch_size, updates):
        # Sample a batch from memory
        state_batch, action_batch, reward_batch, next_state_batch, mask_batch = memory.sample(batch_size=batch_size)

        state_batch = torch.FloatTensor(state_batch)
        next_state_batch = torch.FloatTensor(next_state_batch)
        action_batch = torch.FloatTensor(action_batch)
        reward_batch = torch.FloatTensor(reward_batch).unsqueeze(1)
        mask_batch = torch.FloatTensor(mask_batch).unsqueeze(1)

        with torch.no_grad():
            next_state_action, next_state_log_pi, _ = self.policy.sample(next_state_batch)
            qf1_next_target, qf2_next_target = self.critic_target(next_state_batch, next_state_action)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - self.alpha * next_state_log_pi
            next_q_value = reward_batch + mask_batch * self.gamma * (min_qf_next_target)
        qf1, qf2 = self.critic(state_batch, action_batch)  # Two Q-functions to mitigate positive bias
        qf1_loss = F.mse_loss(qf1, next_q_value)
        qf2_loss = F.mse_loss(qf2, next_q_value)
        qf_loss = qf1_loss + qf2_loss

        self.critic_optim.zero_grad()
        qf_loss.backward()  # @critic_backward
        self.critic_optim.step()

        pi, log_pi, _ = self.policy.sample(state_batch)

        qf1_pi, qf2_pi = self.critic(state_batch, pi)
        min_qf_pi = torch.min(qf1_pi, qf2_pi)

        policy_loss = ((self.alpha * log_pi) - min_qf_pi).mean()  # @policy_loss

        self.policy_optim.zero_grad()
        policy_loss.backward()  # @policy_backward
        self.policy_optim.step()

        if self.automatic_entropy_tuning:
            alpha_loss = -(self.log_alpha * (log_pi + self.target_entropy).detach()).mean()

            self.alpha_optim.zero_grad()
            alpha_loss.backward()  # @alpha_backward
            self.alpha_optim.step()

            self.alpha = self.log_alpha.exp()  # @alpha
            alpha_tlogs = self.alpha.clone()  # For TensorboardX logs
        else:
            alpha_loss = torch.tensor(0.0)
            alpha_tlogs = torch.tensor(self.alpha)  # For TensorboardX logs

        if updates % self.target_update_interval == 0:
            soft_update(self.critic_target, self.critic, self.tau)

        return qf1_loss.item(), qf2_loss.item(), policy_loss.item(), alpha_loss.item(), alpha_tlogs.item()


# ---------------------------------------------------------------- main.py


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    args = SimpleNamespace(
        policy="Gaussian",
        gamma=0.99,
        tau=0.005,
        lr=0.0003,
        alpha=0.2,
        automatic_entropy_tuning=True,
        seed=0,
        batch_size=4,
        hidden_size=8,
        updates_per_step=1,
        target_update_interval=1,
        replay_size=1000000,
    )
    action_space = SimpleNamespace(shape=(2,), high=np.ones(2, dtype=np.float32), low=-np.ones(2, dtype=np.float32))
    agent = SAC(3, action_space, args)
    memory = ReplayMemory(args.replay_size, args.seed)
    for _ in range(16):
        memory.push(
            np.random.randn(3).astype(np.float32),
            np.random.uniform(-1, 1, 2).astype(np.float32),
            float(np.random.randn()),
            np.random.randn(3).astype(np.float32),
            1.0,
        )
    return {"agent": agent, "memory": memory, "args": args, "updates": 0}


def iteration(state: dict) -> None:
    agent, memory, args = state["agent"], state["memory"], state["args"]
    for i in range(args.updates_per_step):
        # Update parameters of all the networks
        critic_1_loss, critic_2_loss, policy_loss, ent_loss, alpha = agent.update_parameters(
            memory, args.batch_size, state["updates"]
        )
        state["updates"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
