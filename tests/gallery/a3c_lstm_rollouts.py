"""A3C with an LSTM policy: the hidden state is carried from one rollout to the next, re-wrapped from its .data.

Source: ikostrikov/pytorch-a3c, train.py and model.py (commit 21bb228eeb87dab5b98607fb8f08f4514d067423):
train(rank, args, shared_model, optimizer=None) builds a local ActorCritic (four stride-2 convs with ELU, an
LSTMCell, critic and actor heads, weights_init and normalized_columns_initializer), `optimizer =
optim.Adam(shared_model.parameters(), lr=args.lr)` when none is given, and loops `while True`: episode_length +=
1, `model.load_state_dict(shared_model.state_dict())`, `cx = Variable(torch.zeros(1, 256))` after an episode
ended, otherwise `cx = Variable(cx.data)` (the carried hidden state, cut from its graph), a rollout of
args.num_steps steps (softmax, log_softmax, entropy, a sampled action, env.step, values, log_probs and rewards
kept), the bootstrap `value, _, _ = model((Variable(state.unsqueeze(0)), (hx, cx)))` when the episode goes on,
the GAE loop, optimizer.zero_grad(), `(policy_loss + 0.5 * value_loss).backward()`,
`torch.nn.utils.clip_grad_norm(model.parameters(), 40)`, ensure_shared_grads(model, shared_model) (`shared_param._grad
= param.grad` while the shared grad is None), optimizer.step(). Retyped at CPU size: one worker in one process
(rank 0, no torch.multiprocessing; shared_model is a second ActorCritic, as main.py builds it before the
workers), 4 conv channels (published 32) on 1x16x16 frames (published 1x42x42) so the convs end at 1x1, an
LSTMCell of 8 (published 256); a made-up environment in place of create_atari_env (numpy frames, rewards in
{-1, 0, 1}, episodes of 7 steps, 2 actions); num_steps 5 (published 20), so a rollout ends mid-episode and the
next one starts from the carried hx, cx; lr 0.0001, gamma 0.99, tau 1.00, seed 1 as in main.py's defaults;
`prob.multinomial()` needs `num_samples=1` on torch 2.13 (the only change to the loop's code); the implicit-dim
softmax and the deprecated clip_grad_norm are kept (they warn). One pass of the `while True` body per iteration;
the worker's locals that outlive a pass (the observation, done, hx, cx) live in the state, the observation
`state` as `env_state` (the state dict takes the name, as in actor_critic.py). Between rollouts hx and cx hold
the last step's graph until the next pass re-wraps their .data: held, never walked. On torch 2.x
optimizer.zero_grad() sets the shared grads to None, so ensure_shared_grads hands over the local .grad tensors
again each pass and the local grads, which nothing zeroes, keep accumulating across rollouts (in 2017 the
in-place zeroing of the shared grad zeroed the local one too).
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "hx", "line": "@lstm"}, {"variable": "cx", "line": "@lstm"}],
    "modifies_in_place": [],
}


def normalized_columns_initializer(weights, std=1.0):
    out = torch.randn(weights.size())
    out *= std / torch.sqrt(out.pow(2).sum(1, keepdim=True))
    return out


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        weight_shape = list(m.weight.data.size())
        fan_in = np.prod(weight_shape[1:4])
        fan_out = np.prod(weight_shape[2:4]) * weight_shape[0]
        w_bound = np.sqrt(6. / (fan_in + fan_out))
        m.weight.data.uniform_(-w_bound, w_bound)
        m.bias.data.fill_(0)
    elif classname.find('Linear') != -1:
        weight_shape = list(m.weight.data.size())
        fan_in = weight_shape[1]
        fan_out = weight_shape[0]
        w_bound = np.sqrt(6. / (fan_in + fan_out))
        m.weight.data.uniform_(-w_bound, w_bound)
        m.bias.data.fill_(0)


class ActorCritic(torch.nn.Module):
    def __init__(self, num_inputs, action_space):
        super(ActorCritic, self).__init__()
        self.conv1 = nn.Conv2d(num_inputs, 4, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(4, 4, 3, stride=2, padding=1)

        self.lstm = nn.LSTMCell(4 * 1 * 1, 8)

        num_outputs = action_space.n
        self.critic_linear = nn.Linear(8, 1)
        self.actor_linear = nn.Linear(8, num_outputs)

        self.apply(weights_init)
        self.actor_linear.weight.data = normalized_columns_initializer(
            self.actor_linear.weight.data, 0.01)
        self.actor_linear.bias.data.fill_(0)
        self.critic_linear.weight.data = normalized_columns_initializer(
            self.critic_linear.weight.data, 1.0)
        self.critic_linear.bias.data.fill_(0)

        self.lstm.bias_ih.data.fill_(0)
        self.lstm.bias_hh.data.fill_(0)

        self.train()

    def forward(self, inputs):
        inputs, (hx, cx) = inputs
        x = F.elu(self.conv1(inputs))
        x = F.elu(self.conv2(x))
        x = F.elu(self.conv3(x))
        x = F.elu(self.conv4(x))

        x = x.view(-1, 4 * 1 * 1)
        hx, cx = self.lstm(x, (hx, cx))  # @lstm
        x = hx

        return self.critic_linear(x), self.actor_linear(x), (hx, cx)


class Discrete:
    def __init__(self, n):
        self.n = n


class MadeUpAtariEnv:
    """Stands in for create_atari_env: 1x16x16 numpy frames, 2 actions, rewards in {-1, 0, 1}, 7-step episodes."""

    def __init__(self):
        self.observation_space_shape = (1, 16, 16)
        self.action_space = Discrete(2)
        self.rng = np.random.RandomState(0)
        self.t = 0

    def seed(self, seed):
        self.rng = np.random.RandomState(seed)

    def reset(self):
        self.t = 0
        return self.rng.rand(*self.observation_space_shape).astype(np.float32)

    def step(self, action):
        self.t += 1
        frame = self.rng.rand(*self.observation_space_shape).astype(np.float32)
        reward = float(self.rng.randint(-1, 2)) * (1 + int(action.reshape(-1)[0]))
        return frame, reward, self.t >= 7, {}


class Args:
    lr = 0.0001
    gamma = 0.99
    tau = 1.00
    seed = 1
    num_steps = 5
    max_episode_length = 10000


def ensure_shared_grads(model, shared_model):
    for param, shared_param in zip(model.parameters(),
                                   shared_model.parameters()):
        if shared_param.grad is not None:
            return
        shared_param._grad = param.grad


def build() -> dict:
    args, rank = Args(), 0
    torch.manual_seed(args.seed)
    env = MadeUpAtariEnv()
    shared_model = ActorCritic(env.observation_space_shape[0], env.action_space)

    torch.manual_seed(args.seed + rank)
    env.seed(args.seed + rank)
    model = ActorCritic(env.observation_space_shape[0], env.action_space)
    optimizer = optim.Adam(shared_model.parameters(), lr=args.lr)
    model.train()

    env_state = env.reset()
    env_state = torch.from_numpy(env_state)
    return {"args": args, "env": env, "shared_model": shared_model, "model": model, "optimizer": optimizer,
            "env_state": env_state, "done": True, "episode_length": 0, "hx": None, "cx": None}


def iteration(state: dict) -> None:
    args, env, shared_model, model, optimizer = state["args"], state["env"], state["shared_model"], state["model"], state["optimizer"]
    env_state, done, hx, cx = state["env_state"], state["done"], state["hx"], state["cx"]
    state["episode_length"] += 1
    # Sync with the shared model
    model.load_state_dict(shared_model.state_dict())
    if done:
        cx = Variable(torch.zeros(1, 8))
        hx = Variable(torch.zeros(1, 8))
    else:
        cx = Variable(cx.data)
        hx = Variable(hx.data)

    values = []
    log_probs = []
    rewards = []
    entropies = []

    for step in range(args.num_steps):
        value, logit, (hx, cx) = model((Variable(env_state.unsqueeze(0)),
                                        (hx, cx)))
        prob = F.softmax(logit)
        log_prob = F.log_softmax(logit)
        entropy = -(log_prob * prob).sum(1)
        entropies.append(entropy)

        action = prob.multinomial(num_samples=1).data
        log_prob = log_prob.gather(1, Variable(action))

        env_state, reward, done, _ = env.step(action.numpy())
        done = done or state["episode_length"] >= args.max_episode_length
        reward = max(min(reward, 1), -1)

        if done:
            state["episode_length"] = 0
            env_state = env.reset()

        env_state = torch.from_numpy(env_state)
        values.append(value)
        log_probs.append(log_prob)
        rewards.append(reward)

        if done:
            break

    R = torch.zeros(1, 1)
    if not done:
        value, _, _ = model((Variable(env_state.unsqueeze(0)), (hx, cx)))
        R = value.data

    values.append(Variable(R))
    policy_loss = 0
    value_loss = 0
    R = Variable(R)
    gae = torch.zeros(1, 1)
    for i in reversed(range(len(rewards))):
        R = args.gamma * R + rewards[i]
        advantage = R - values[i]
        value_loss = value_loss + 0.5 * advantage.pow(2)

        # Generalized Advantage Estimataion
        delta_t = rewards[i] + args.gamma * \
            values[i + 1].data - values[i].data
        gae = gae * args.gamma * args.tau + delta_t

        policy_loss = policy_loss - \
            log_probs[i] * Variable(gae) - 0.01 * entropies[i]

    optimizer.zero_grad()

    (policy_loss + 0.5 * value_loss).backward()  # @backward
    torch.nn.utils.clip_grad_norm(model.parameters(), 40)

    ensure_shared_grads(model, shared_model)
    optimizer.step()
    state["env_state"], state["done"], state["hx"], state["cx"] = env_state, done, hx, cx


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
