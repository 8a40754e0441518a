"""PPO: log-probs stored while acting with the old policy, then K epochs of updates over them.

Source: nikhilbarhate99/PPO-PyTorch, PPO.py (the Memory / ActorCritic / PPO version): policy_old.act()
appends `dist.log_prob(action)` (built with grad through policy_old) to memory.logprobs; PPO.update()
stacks them into `old_logprobs = torch.stack(memory.logprobs).to(device).detach()`, then for
K_epochs: evaluate, `ratios = torch.exp(logprobs - old_logprobs.detach())`, the clipped surrogate plus
0.5 * MSE minus 0.01 * entropy, optimizer.zero_grad(), `loss.mean().backward()`, optimizer.step(); then
policy_old.load_state_dict(policy.state_dict()) and memory.clear_memory(). Retyped at CPU size:
state_dim 4, action_dim 2, n_latent_var 8 (published 64), update_timestep 6 (published 2000),
K_epochs 4 and eps_clip 0.2 as published; a six-step stand-in environment replaces gym's LunarLander.
One iteration = the timesteps up to an update, then the update.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributions import Categorical

ITERATIONS = 2
device = torch.device("cpu")

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Memory:
    def __init__(self):
        self.actions = []
        self.states = []
        self.logprobs = []
        self.rewards = []

    def clear_memory(self):
        del self.actions[:]
        del self.states[:]
        del self.logprobs[:]
        del self.rewards[:]


class ActorCritic(nn.Module):
    def __init__(self, state_dim, action_dim, n_latent_var):
        super().__init__()
        self.affine = nn.Linear(state_dim, n_latent_var)
        self.action_layer = nn.Sequential(
            nn.Linear(state_dim, n_latent_var), nn.Tanh(),
            nn.Linear(n_latent_var, n_latent_var), nn.Tanh(),
            nn.Linear(n_latent_var, action_dim), nn.Softmax(dim=-1))
        self.value_layer = nn.Sequential(
            nn.Linear(state_dim, n_latent_var), nn.Tanh(),
            nn.Linear(n_latent_var, n_latent_var), nn.Tanh(),
            nn.Linear(n_latent_var, 1))

    def forward(self):
        raise NotImplementedError

    def act(self, state, memory):
        state = torch.from_numpy(state).float().to(device)
        action_probs = self.action_layer(state)
        dist = Categorical(action_probs)
        action = dist.sample()
        memory.states.append(state)
        memory.actions.append(action)
        memory.logprobs.append(dist.log_prob(action))  # @store_logprob
        return action.item()

    def evaluate(self, state, action):
        action_probs = self.action_layer(state)
        dist = Categorical(action_probs)
        action_logprobs = dist.log_prob(action)
        dist_entropy = dist.entropy()
        state_value = self.value_layer(state)
        return action_logprobs, torch.squeeze(state_value), dist_entropy


class PPO:
    def __init__(self, state_dim, action_dim, n_latent_var, lr, betas, gamma, K_epochs, eps_clip):
        self.lr = lr
        self.betas = betas
        self.gamma = gamma
        self.eps_clip = eps_clip
        self.K_epochs = K_epochs
        self.policy = ActorCritic(state_dim, action_dim, n_latent_var).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr, betas=betas)
        self.policy_old = ActorCritic(state_dim, action_dim, n_latent_var).to(device)
        self.MseLoss = nn.MSELoss()

    def update(self, memory):
        rewards = []
        discounted_reward = 0
        for reward in reversed(memory.rewards):
            discounted_reward = reward + (self.gamma * discounted_reward)
            rewards.insert(0, discounted_reward)
        rewards = torch.tensor(rewards).to(device)
        rewards = (rewards - rewards.mean()) / (rewards.std() + 1e-5)
        old_states = torch.stack(memory.states).to(device).detach()
        old_actions = torch.stack(memory.actions).to(device).detach()
        old_logprobs = torch.stack(memory.logprobs).to(device).detach()
        for _ in range(self.K_epochs):
            logprobs, state_values, dist_entropy = self.policy.evaluate(old_states, old_actions)
            ratios = torch.exp(logprobs - old_logprobs.detach())
            advantages = rewards - state_values.detach()
            surr1 = ratios * advantages
            surr2 = torch.clamp(ratios, 1 - self.eps_clip, 1 + self.eps_clip) * advantages
            loss = -torch.min(surr1, surr2) + 0.5 * self.MseLoss(state_values, rewards) - 0.01 * dist_entropy
            self.optimizer.zero_grad()
            loss.mean().backward()  # @epoch_backward
            self.optimizer.step()
        self.policy_old.load_state_dict(self.policy.state_dict())


class SixStepEnv:
    """Stands in for gym's LunarLander: numpy states, reward 1 for action 0, done after six steps."""

    def __init__(self, generator):
        self.generator = generator
        self.t = 0

    def reset(self):
        self.t = 0
        return torch.randn(4, generator=self.generator).numpy()

    def step(self, action):
        self.t += 1
        return torch.randn(4, generator=self.generator).numpy(), float(action == 0), self.t >= 6, {}


def build() -> dict:
    torch.manual_seed(0)
    env = SixStepEnv(torch.Generator().manual_seed(0))
    ppo = PPO(4, 2, 8, lr=0.002, betas=(0.9, 0.999), gamma=0.99, K_epochs=4, eps_clip=0.2)
    return {"env": env, "memory": Memory(), "ppo": ppo, "update_timestep": 6, "state": env.reset(),
            "running_reward": 0}


def collect_and_update(state: dict) -> None:
    env, memory, ppo = state["env"], state["memory"], state["ppo"]
    for timestep in range(1, state["update_timestep"] + 1):
        action = ppo.policy_old.act(state["state"], memory)
        state["state"], reward, done, _ = env.step(action)
        memory.rewards.append(reward)
        if timestep % state["update_timestep"] == 0:
            ppo.update(memory)
            memory.clear_memory()
        state["running_reward"] += reward
        if done:
            state["state"] = env.reset()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        collect_and_update(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: collect_and_update(state)


if __name__ == "__main__":
    run(build())
