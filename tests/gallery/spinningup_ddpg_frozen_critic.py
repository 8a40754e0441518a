"""Spinning Up's DDPG in PyTorch: the critic update, then the actor update with the critic frozen (requires_grad=False).

Source: openai/spinningup, spinup/algos/pytorch/ddpg/ddpg.py and spinup/algos/pytorch/ddpg/core.py (commit
20921137141b154454c0a2698709d9f9a0302101). As published: core.mlp, MLPActor, MLPQFunction, MLPActorCritic (with
`act` under torch.no_grad()), the ReplayBuffer, `ac_targ = deepcopy(ac)` with its parameters frozen,
compute_loss_q (the Bellman backup under torch.no_grad()), compute_loss_pi, the two Adam optimizers, update()
(q zero_grad / loss / backward / step, freeze `ac.q`, pi zero_grad / loss / backward / step, unfreeze, the
`.item()` record, the polyak update in place under torch.no_grad()), get_action, and the main loop's body (random
actions until start_steps, then the policy's with Gaussian noise; env step; store; end-of-trajectory reset;
`update_every` updates every `update_every` steps from `update_after`). Retyped at CPU size: the gym environment
is replaced by a tiny random one written here (3-dimensional observations, 1-dimensional actions in [-1, 1],
episodes of 3 steps), hidden_sizes (8, 8) (published 256, 256), batch_size 4 (published 100), start_steps 1
(published 10000), update_after 0 (published 1000), update_every 2 (published 50); the logger, saving and
test_agent are left out; replay_size 1000 (published 1e6). One pass of the main loop (`for t in
range(total_steps)`) is an iteration.
"""

from collections.abc import Callable
from copy import deepcopy

import numpy as np
import torch
import torch.nn as nn
from torch.optim import Adam

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- core.py


def combined_shape(length, shape=None):
    if shape is None:
        return (length,)
    return (length, shape) if np.isscalar(shape) else (length, *shape)


def mlp(sizes, activation, output_activation=nn.Identity):
    layers = []
    for j in range(len(sizes)-1):
        act = activation if j < len(sizes)-2 else output_activation
        layers += [nn.Linear(sizes[j], sizes[j+1]), act()]
    return nn.Sequential(*layers)


class MLPActor(nn.Module):

    def __init__(self, obs_dim, act_dim, hidden_sizes, activation, act_limit):
        super().__init__()
        pi_sizes = [obs_dim] + list(hidden_sizes) + [act_dim]
        self.pi = mlp(pi_sizes, activation, nn.Tanh)
        self.act_limit = act_limit

    def forward(self, obs):
        # Return output from network scaled to action space limits.
        return self.act_limit * self.pi(obs)


class MLPQFunction(nn.Module):

    def __init__(self, obs_dim, act_dim, hidden_sizes, activation):
        super().__init__()
        self.q = mlp([obs_dim + act_dim] + list(hidden_sizes) + [1], activation)

    def forward(self, obs, act):
        q = self.q(torch.cat([obs, act], dim=-1))
        return torch.squeeze(q, -1)  # Critical to ensure q has right shape.


class MLPActorCritic(nn.Module):

    def __init__(self, observation_space, action_space, hidden_sizes=(256, 256),
                 activation=nn.ReLU):
        super().__init__()

        obs_dim = observation_space.shape[0]
        act_dim = action_space.shape[0]
        act_limit = action_space.high[0]

        # build policy and value functions
        self.pi = MLPActor(obs_dim, act_dim, hidden_sizes, activation, act_limit)
        self.q = MLPQFunction(obs_dim, act_dim, hidden_sizes, activation)

    def act(self, obs):
        with torch.no_grad():
            return self.pi(obs).numpy()


# ---------------------------------------------------------------- a tiny random environment (for gym)


class Box:
    def __init__(self, low, high, shape):
        self.low, self.high, self.shape = np.full(shape, low, np.float32), np.full(shape, high, np.float32), shape

    def sample(self):
        return np.random.uniform(self.low, self.high).astype(np.float32)


class TinyEnv:
    observation_space = Box(-np.inf, np.inf, (3,))
    action_space = Box(-1.0, 1.0, (1,))

    def reset(self):
        self.steps = 0
        self.o = np.random.randn(3).astype(np.float32)
        return self.o

    def step(self, a):
        self.steps += 1
        self.o = (0.9 * self.o + 0.1 * float(np.asarray(a).sum()) + 0.1 * np.random.randn(3)).astype(np.float32)
        return self.o, float(-np.square(self.o).sum()), self.steps >= 3, {}


# ---------------------------------------------------------------- ddpg.py


class ReplayBuffer:
    """
    A simple FIFO experience replay buffer for DDPG agents.
    """

    def __init__(self, obs_dim, act_dim, size):
        self.obs_buf = np.zeros(combined_shape(size, obs_dim), dtype=np.float32)
        self.obs2_buf = np.zeros(combined_shape(size, obs_dim), dtype=np.float32)
        self.act_buf = np.zeros(combined_shape(size, act_dim), dtype=np.float32)
        self.rew_buf = np.zeros(size, dtype=np.float32)
        self.done_buf = np.zeros(size, dtype=np.float32)
        self.ptr, self.size, self.max_size = 0, 0, size

    def store(self, obs, act, rew, next_obs, done):
        self.obs_buf[self.ptr] = obs
        self.obs2_buf[self.ptr] = next_obs
        self.act_buf[self.ptr] = act
        self.rew_buf[self.ptr] = rew
        self.done_buf[self.ptr] = done
        self.ptr = (self.ptr+1) % self.max_size
        self.size = min(self.size+1, self.max_size)

    def sample_batch(self, batch_size=32):
        idxs = np.random.randint(0, self.size, size=batch_size)
        batch = dict(obs=self.obs_buf[idxs],
                     obs2=self.obs2_buf[idxs],
                     act=self.act_buf[idxs],
                     rew=self.rew_buf[idxs],
                     done=self.done_buf[idxs])
        return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in batch.items()}


class Args:
    seed = 0
    replay_size = 1000
    gamma = 0.99
    polyak = 0.995
    pi_lr = 1e-3
    q_lr = 1e-3
    batch_size = 4
    start_steps = 1
    update_after = 0
    update_every = 2
    act_noise = 0.1
    max_ep_len = 1000


def build() -> dict:
    args = Args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    env = TinyEnv()
    obs_dim = env.observation_space.shape
    act_dim = env.action_space.shape[0]

    # Action limit for clamping: critically, assumes all dimensions share the same bound!
    act_limit = env.action_space.high[0]

    # Create actor-critic module and target networks
    ac = MLPActorCritic(env.observation_space, env.action_space, hidden_sizes=(8, 8))
    ac_targ = deepcopy(ac)

    # Freeze target networks with respect to optimizers (only update via polyak averaging)
    for p in ac_targ.parameters():
        p.requires_grad = False

    # Experience buffer
    replay_buffer = ReplayBuffer(obs_dim=obs_dim, act_dim=act_dim, size=args.replay_size)

    # Set up optimizers for policy and q-function
    pi_optimizer = Adam(ac.pi.parameters(), lr=args.pi_lr)
    q_optimizer = Adam(ac.q.parameters(), lr=args.q_lr)

    o, ep_ret, ep_len = env.reset(), 0, 0
    return {"args": args, "env": env, "act_dim": act_dim, "act_limit": act_limit, "ac": ac, "ac_targ": ac_targ,
            "replay_buffer": replay_buffer, "pi_optimizer": pi_optimizer, "q_optimizer": q_optimizer,
            "o": o, "ep_ret": ep_ret, "ep_len": ep_len, "t": 0}


# Set up function for computing DDPG Q-loss
def compute_loss_q(state, data):
    ac, ac_targ, gamma = state["ac"], state["ac_targ"], state["args"].gamma
    o, a, r, o2, d = data['obs'], data['act'], data['rew'], data['obs2'], data['done']

    q = ac.q(o, a)

    # Bellman backup for Q function
    with torch.no_grad():
        q_pi_targ = ac_targ.q(o2, ac_targ.pi(o2))
        backup = r + gamma * (1 - d) * q_pi_targ

    # MSE loss against Bellman backup
    loss_q = ((q - backup)**2).mean()

    # Useful info for logging
    loss_info = dict(QVals=q.detach().numpy())

    return loss_q, loss_info


# Set up function for computing DDPG pi loss
def compute_loss_pi(state, data):
    ac = state["ac"]
    o = data['obs']
    q_pi = ac.q(o, ac.pi(o))
    return -q_pi.mean()


def update(state, data):
    ac, ac_targ, polyak = state["ac"], state["ac_targ"], state["args"].polyak
    q_optimizer, pi_optimizer = state["q_optimizer"], state["pi_optimizer"]
    # First run one gradient descent step for Q.
    q_optimizer.zero_grad()
    loss_q, loss_info = compute_loss_q(state, data)
    loss_q.backward()  # @q_backward
    q_optimizer.step()

    # Freeze Q-network so you don't waste computational effort
    # computing gradients for it during the policy learning step.
    for p in ac.q.parameters():
        p.requires_grad = False

    # Next run one gradient descent step for pi.
    pi_optimizer.zero_grad()
    loss_pi = compute_loss_pi(state, data)
    loss_pi.backward()  # @pi_backward
    pi_optimizer.step()

    # Unfreeze Q-network so you can optimize it at next DDPG step.
    for p in ac.q.parameters():
        p.requires_grad = True

    # Record things
    _ = dict(LossQ=loss_q.item(), LossPi=loss_pi.item(), **loss_info)

    # Finally, update target networks by polyak averaging.
    with torch.no_grad():
        for p, p_targ in zip(ac.parameters(), ac_targ.parameters()):
            # NB: We use an in-place operations "mul_", "add_" to update target
            # params, as opposed to "mul" and "add", which would make new tensors.
            p_targ.data.mul_(polyak)
            p_targ.data.add_((1 - polyak) * p.data)


def get_action(state, o, noise_scale):
    ac, act_dim, act_limit = state["ac"], state["act_dim"], state["act_limit"]
    a = ac.act(torch.as_tensor(o, dtype=torch.float32))
    a += noise_scale * np.random.randn(act_dim)
    return np.clip(a, -act_limit, act_limit)


def iteration(state: dict) -> None:
    args, env, replay_buffer, t = state["args"], state["env"], state["replay_buffer"], state["t"]
    o = state["o"]

    # Until start_steps have elapsed, randomly sample actions
    # from a uniform distribution for better exploration. Afterwards,
    # use the learned policy (with some noise, via act_noise).
    if t > args.start_steps:
        a = get_action(state, o, args.act_noise)
    else:
        a = env.action_space.sample()

    # Step the env
    o2, r, d, _ = env.step(a)
    state["ep_ret"] += r
    state["ep_len"] += 1

    # Ignore the "done" signal if it comes from hitting the time
    # horizon (that is, when it's an artificial terminal signal
    # that isn't based on the agent's state)
    d = False if state["ep_len"] == args.max_ep_len else d

    # Store experience to replay buffer
    replay_buffer.store(o, a, r, o2, d)

    # Super critical, easy to overlook step: make sure to update
    # most recent observation!
    state["o"] = o2

    # End of trajectory handling
    if d or (state["ep_len"] == args.max_ep_len):
        state["o"], state["ep_ret"], state["ep_len"] = env.reset(), 0, 0

    # Update handling
    if t >= args.update_after and t % args.update_every == 0:
        for _ in range(args.update_every):
            batch = replay_buffer.sample_batch(args.batch_size)
            update(state, data=batch)
    state["t"] = t + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for t in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
