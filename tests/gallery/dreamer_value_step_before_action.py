"""Dreamer (cross32768's PyTorch port): the value model steps before the action loss, which runs through it, backprops.

Source: cross32768/Dreamer_PyTorch, train.py (commit 2d0e82517aa21bc9878e547478fc15f0a43920ed), model.py (commit
3a6800dcbc1ce4958615a0ceeb7b6525653d73a6) and utils.py (commit 0402b35c7324cb50dba1120fdd64d382042a6725), and its
issue #2 (https://github.com/cross32768/Dreamer_PyTorch/issues/2, "Bug happened during the update of action model":
"RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation:
[torch.FloatTensor [400, 1]], which is output 0 of AsStridedBackward0"; the reply moves `value_optimizer.step()`
after `action_loss.backward()`). As published: Encoder, RecurrentStateSpaceModel (prior / posterior, GRUCell),
ObservationModel, RewardModel, ValueModel, ActionModel; the update step of main(): the RSSM posterior rollout over
the chunk with the free-nats KL, the observation and reward losses, model_optimizer zero_grad/backward/clip/step,
the imagination rollout from the detached posterior states with `rssm.prior` and `action_model`, the imagined
rewards and values, `lambda_return`, `value_loss.backward(retain_graph=True)`, clip, `value_optimizer.step()`, then
`action_loss = -1 * (lambda_value_target.mean())`, backward, clip, step, and the `.item()` logging. Retyped at CPU
size: widths shrunk (Encoder channels 32/64/128/256 -> 2/4/4/8, so the embedding is 32 for 1024; ObservationModel's
1024 -> 32 and deconvolution channels 128/64/32 -> 8/4/4; hidden_dim 200/400 -> 16), the 64x64 images kept,
state_dim 4, rnn_hidden_dim 8, batch 2, chunk length 4, imagination horizon 3; the dm_control environment is
replaced by a replay buffer filled with 3 made-up episodes of 10 steps (random uint8 images, actions in [-1, 1],
random rewards); train.py imports `lambda_return`, which utils.py (at the commit above) names `lambda_target`:
its body is kept as published; the buffer's `np.bool` is `bool` (numpy 2); the SummaryWriter, printing and the
policy roll-out with `Agent` between episodes are left out. One pass of the `update_step` loop is an iteration.
"""

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.distributions import Normal
from torch.distributions.kl import kl_divergence
from torch.nn import functional as F
from torch.nn.functional import mse_loss
from torch.nn.utils import clip_grad_norm_
from torch.optim import Adam

ITERATIONS = 2
EMBED = 32

TRUTH = {
    "error": {"kind": "in-place version error", "iteration": 1, "line": "@action_backward"},
    "retains": {"@value_backward": {"verdict": "needed", "runs": 1, "needed_runs": 1}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- model.py


class Encoder(nn.Module):
    """
    Encoder to embed image observation (3, 64, 64) to vector (1024,)
    """
    def __init__(self):
        super(Encoder, self).__init__()
        self.cv1 = nn.Conv2d(3, 2, kernel_size=4, stride=2)
        self.cv2 = nn.Conv2d(2, 4, kernel_size=4, stride=2)
        self.cv3 = nn.Conv2d(4, 4, kernel_size=4, stride=2)
        self.cv4 = nn.Conv2d(4, 8, kernel_size=4, stride=2)

    def forward(self, obs):
        hidden = F.relu(self.cv1(obs))
        hidden = F.relu(self.cv2(hidden))
        hidden = F.relu(self.cv3(hidden))
        embedded_obs = F.relu(self.cv4(hidden)).reshape(hidden.size(0), -1)
        return embedded_obs


class RecurrentStateSpaceModel(nn.Module):
    def __init__(self, state_dim, action_dim, rnn_hidden_dim,
                 hidden_dim=16, min_stddev=0.1, act=F.elu):
        super(RecurrentStateSpaceModel, self).__init__()
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.rnn_hidden_dim = rnn_hidden_dim
        self.fc_state_action = nn.Linear(state_dim + action_dim, hidden_dim)
        self.fc_rnn_hidden = nn.Linear(rnn_hidden_dim, hidden_dim)
        self.fc_state_mean_prior = nn.Linear(hidden_dim, state_dim)
        self.fc_state_stddev_prior = nn.Linear(hidden_dim, state_dim)
        self.fc_rnn_hidden_embedded_obs = nn.Linear(rnn_hidden_dim + EMBED, hidden_dim)
        self.fc_state_mean_posterior = nn.Linear(hidden_dim, state_dim)
        self.fc_state_stddev_posterior = nn.Linear(hidden_dim, state_dim)
        self.rnn = nn.GRUCell(hidden_dim, rnn_hidden_dim)
        self._min_stddev = min_stddev
        self.act = act

    def forward(self, state, action, rnn_hidden, embedded_next_obs):
        next_state_prior, rnn_hidden = self.prior(state, action, rnn_hidden)
        next_state_posterior = self.posterior(rnn_hidden, embedded_next_obs)
        return next_state_prior, next_state_posterior, rnn_hidden

    def prior(self, state, action, rnn_hidden):
        hidden = self.act(self.fc_state_action(torch.cat([state, action], dim=1)))
        rnn_hidden = self.rnn(hidden, rnn_hidden)
        hidden = self.act(self.fc_rnn_hidden(rnn_hidden))

        mean = self.fc_state_mean_prior(hidden)
        stddev = F.softplus(self.fc_state_stddev_prior(hidden)) + self._min_stddev
        return Normal(mean, stddev), rnn_hidden

    def posterior(self, rnn_hidden, embedded_obs):
        hidden = self.act(self.fc_rnn_hidden_embedded_obs(
            torch.cat([rnn_hidden, embedded_obs], dim=1)))
        mean = self.fc_state_mean_posterior(hidden)
        stddev = F.softplus(self.fc_state_stddev_posterior(hidden)) + self._min_stddev
        return Normal(mean, stddev)


class ObservationModel(nn.Module):
    def __init__(self, state_dim, rnn_hidden_dim):
        super(ObservationModel, self).__init__()
        self.fc = nn.Linear(state_dim + rnn_hidden_dim, EMBED)
        self.dc1 = nn.ConvTranspose2d(EMBED, 8, kernel_size=5, stride=2)
        self.dc2 = nn.ConvTranspose2d(8, 4, kernel_size=5, stride=2)
        self.dc3 = nn.ConvTranspose2d(4, 4, kernel_size=6, stride=2)
        self.dc4 = nn.ConvTranspose2d(4, 3, kernel_size=6, stride=2)

    def forward(self, state, rnn_hidden):
        hidden = self.fc(torch.cat([state, rnn_hidden], dim=1))
        hidden = hidden.view(hidden.size(0), EMBED, 1, 1)
        hidden = F.relu(self.dc1(hidden))
        hidden = F.relu(self.dc2(hidden))
        hidden = F.relu(self.dc3(hidden))
        obs = self.dc4(hidden)
        return obs


class RewardModel(nn.Module):
    def __init__(self, state_dim, rnn_hidden_dim, hidden_dim=16, act=F.elu):
        super(RewardModel, self).__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, hidden_dim)
        self.fc4 = nn.Linear(hidden_dim, 1)
        self.act = act

    def forward(self, state, rnn_hidden):
        hidden = self.act(self.fc1(torch.cat([state, rnn_hidden], dim=1)))
        hidden = self.act(self.fc2(hidden))
        hidden = self.act(self.fc3(hidden))
        reward = self.fc4(hidden)
        return reward


class ValueModel(nn.Module):
    def __init__(self, state_dim, rnn_hidden_dim, hidden_dim=16, act=F.elu):
        super(ValueModel, self).__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, hidden_dim)
        self.fc4 = nn.Linear(hidden_dim, 1)
        self.act = act

    def forward(self, state, rnn_hidden):
        hidden = self.act(self.fc1(torch.cat([state, rnn_hidden], dim=1)))
        hidden = self.act(self.fc2(hidden))
        hidden = self.act(self.fc3(hidden))
        state_value = self.fc4(hidden)
        return state_value


class ActionModel(nn.Module):
    def __init__(self, state_dim, rnn_hidden_dim, action_dim,
                 hidden_dim=16, act=F.elu, min_stddev=1e-4, init_stddev=5.0):
        super(ActionModel, self).__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, hidden_dim)
        self.fc4 = nn.Linear(hidden_dim, hidden_dim)
        self.fc_mean = nn.Linear(hidden_dim, action_dim)
        self.fc_stddev = nn.Linear(hidden_dim, action_dim)
        self.act = act
        self.min_stddev = min_stddev
        self.init_stddev = np.log(np.exp(init_stddev) - 1)

    def forward(self, state, rnn_hidden, training=True):
        hidden = self.act(self.fc1(torch.cat([state, rnn_hidden], dim=1)))
        hidden = self.act(self.fc2(hidden))
        hidden = self.act(self.fc3(hidden))
        hidden = self.act(self.fc4(hidden))

        mean = self.fc_mean(hidden)
        mean = 5.0 * torch.tanh(mean / 5.0)
        stddev = self.fc_stddev(hidden)
        stddev = F.softplus(stddev + self.init_stddev) + self.min_stddev

        if training:
            action = torch.tanh(Normal(mean, stddev).rsample())
        else:
            action = torch.tanh(mean)
        return action


# ---------------------------------------------------------------- utils.py


class ReplayBuffer(object):
    def __init__(self, capacity, observation_shape, action_dim):
        self.capacity = capacity

        self.observations = np.zeros((capacity, *observation_shape), dtype=np.uint8)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros((capacity, 1), dtype=np.float32)
        self.done = np.zeros((capacity, 1), dtype=bool)

        self.index = 0
        self.is_filled = False

    def push(self, observation, action, reward, done):
        self.observations[self.index] = observation
        self.actions[self.index] = action
        self.rewards[self.index] = reward
        self.done[self.index] = done

        if self.index == self.capacity - 1:
            self.is_filled = True
        self.index = (self.index + 1) % self.capacity

    def sample(self, batch_size, chunk_length):
        episode_borders = np.where(self.done)[0]
        sampled_indexes = []
        for _ in range(batch_size):
            cross_border = True
            while cross_border:
                initial_index = np.random.randint(len(self) - chunk_length + 1)
                final_index = initial_index + chunk_length - 1
                cross_border = np.logical_and(initial_index <= episode_borders,
                                              episode_borders < final_index).any()
            sampled_indexes += list(range(initial_index, final_index + 1))

        sampled_observations = self.observations[sampled_indexes].reshape(
            batch_size, chunk_length, *self.observations.shape[1:])
        sampled_actions = self.actions[sampled_indexes].reshape(
            batch_size, chunk_length, self.actions.shape[1])
        sampled_rewards = self.rewards[sampled_indexes].reshape(
            batch_size, chunk_length, 1)
        sampled_done = self.done[sampled_indexes].reshape(
            batch_size, chunk_length, 1)
        return sampled_observations, sampled_actions, sampled_rewards, sampled_done

    def __len__(self):
        return self.capacity if self.is_filled else self.index


def preprocess_obs(obs):
    obs = obs.astype(np.float32)
    normalized_obs = obs / 255.0 - 0.5
    return normalized_obs


def lambda_return(rewards, values, gamma, lambda_):
    V_lambda = torch.zeros_like(rewards, device=rewards.device)

    H = rewards.shape[0] - 1
    V_n = torch.zeros_like(rewards, device=rewards.device)
    V_n[H] = values[H]
    for n in range(1, H+1):
        # compute n-step target
        V_n[:-n] = (gamma ** n) * values[n:]
        for k in range(1, n+1):
            if k == n:
                V_n[:-n] += (gamma ** (n-1)) * rewards[k:]
            else:
                V_n[:-n] += (gamma ** (k-1)) * rewards[k:-n+k]

        # add lambda_ weighted n-step target to compute lambda target
        if n == H:
            V_lambda += (lambda_ ** (H-1)) * V_n
        else:
            V_lambda += (1 - lambda_) * (lambda_ ** (n-1)) * V_n

    return V_lambda


# ---------------------------------------------------------------- train.py


class Args:
    state_dim = 4
    rnn_hidden_dim = 8
    batch_size = 2
    chunk_length = 4
    imagination_horizon = 3
    gamma = 0.99
    lambda_ = 0.95
    model_lr = 6e-4
    value_lr = 8e-5
    action_lr = 8e-5
    eps = 1e-4
    clip_grad_norm = 100
    free_nats = 3
    action_dim = 2


def build() -> dict:
    args = Args()
    np.random.seed(0)
    torch.manual_seed(0)
    replay_buffer = ReplayBuffer(capacity=100, observation_shape=(64, 64, 3), action_dim=args.action_dim)
    for episode in range(3):
        for step in range(10):
            replay_buffer.push(np.random.randint(0, 256, (64, 64, 3), dtype=np.uint8),
                               np.random.uniform(-1, 1, args.action_dim).astype(np.float32),
                               float(np.random.randn()), step == 9)

    encoder = Encoder()
    rssm = RecurrentStateSpaceModel(args.state_dim, args.action_dim, args.rnn_hidden_dim)
    obs_model = ObservationModel(args.state_dim, args.rnn_hidden_dim)
    reward_model = RewardModel(args.state_dim, args.rnn_hidden_dim)
    model_params = (list(encoder.parameters()) +
                    list(rssm.parameters()) +
                    list(obs_model.parameters()) +
                    list(reward_model.parameters()))
    model_optimizer = Adam(model_params, lr=args.model_lr, eps=args.eps)

    value_model = ValueModel(args.state_dim, args.rnn_hidden_dim)
    action_model = ActionModel(args.state_dim, args.rnn_hidden_dim, args.action_dim)
    value_optimizer = Adam(value_model.parameters(), lr=args.value_lr, eps=args.eps)
    action_optimizer = Adam(action_model.parameters(), lr=args.action_lr, eps=args.eps)
    return {
        "args": args, "replay_buffer": replay_buffer, "encoder": encoder, "rssm": rssm, "obs_model": obs_model,
        "reward_model": reward_model, "model_params": model_params, "model_optimizer": model_optimizer,
        "value_model": value_model, "action_model": action_model, "value_optimizer": value_optimizer,
        "action_optimizer": action_optimizer,
    }


def iteration(s: dict) -> None:
    args, replay_buffer = s["args"], s["replay_buffer"]
    encoder, rssm, obs_model, reward_model = s["encoder"], s["rssm"], s["obs_model"], s["reward_model"]
    model_params, model_optimizer = s["model_params"], s["model_optimizer"]
    value_model, action_model = s["value_model"], s["action_model"]
    value_optimizer, action_optimizer = s["value_optimizer"], s["action_optimizer"]

    observations, actions, rewards, _ = \
        replay_buffer.sample(args.batch_size, args.chunk_length)

    # preprocess observations and transpose tensor for RNN training
    observations = preprocess_obs(observations)
    observations = torch.as_tensor(observations)
    observations = observations.transpose(3, 4).transpose(2, 3)
    observations = observations.transpose(0, 1)
    actions = torch.as_tensor(actions).transpose(0, 1)
    rewards = torch.as_tensor(rewards).transpose(0, 1)

    # embed observations with CNN
    embedded_observations = encoder(
        observations.reshape(-1, 3, 64, 64)).view(args.chunk_length, args.batch_size, -1)

    # prepare Tensor to maintain states sequence and rnn hidden states sequence
    states = torch.zeros(args.chunk_length, args.batch_size, args.state_dim)
    rnn_hiddens = torch.zeros(args.chunk_length, args.batch_size, args.rnn_hidden_dim)

    # initialize state and rnn hidden state with 0 vector
    state = torch.zeros(args.batch_size, args.state_dim)
    rnn_hidden = torch.zeros(args.batch_size, args.rnn_hidden_dim)

    # compute state and rnn hidden sequences and kl loss
    kl_loss = 0
    for l in range(args.chunk_length-1):
        next_state_prior, next_state_posterior, rnn_hidden = \
            rssm(state, actions[l], rnn_hidden, embedded_observations[l+1])
        state = next_state_posterior.rsample()
        states[l+1] = state
        rnn_hiddens[l+1] = rnn_hidden
        kl = kl_divergence(next_state_prior, next_state_posterior).sum(dim=1)
        kl_loss += kl.clamp(min=args.free_nats).mean()
    kl_loss /= (args.chunk_length - 1)

    # states[0] and rnn_hiddens[0] are always 0 and have no information
    states = states[1:]
    rnn_hiddens = rnn_hiddens[1:]

    # compute reconstructed observations and predicted rewards
    flatten_states = states.view(-1, args.state_dim)
    flatten_rnn_hiddens = rnn_hiddens.view(-1, args.rnn_hidden_dim)
    recon_observations = obs_model(flatten_states, flatten_rnn_hiddens).view(
        args.chunk_length-1, args.batch_size, 3, 64, 64)
    predicted_rewards = reward_model(flatten_states, flatten_rnn_hiddens).view(
        args.chunk_length-1, args.batch_size, 1)

    # compute loss for observation and reward
    obs_loss = 0.5 * mse_loss(
        recon_observations, observations[1:], reduction='none').mean([0, 1]).sum()
    reward_loss = 0.5 * mse_loss(predicted_rewards, rewards[:-1])

    # add all losses and update model parameters with gradient descent
    model_loss = kl_loss + obs_loss + reward_loss
    model_optimizer.zero_grad()
    model_loss.backward()  # @model_backward
    clip_grad_norm_(model_params, args.clip_grad_norm)
    model_optimizer.step()

    # compute target values
    flatten_states = flatten_states.detach()
    flatten_rnn_hiddens = flatten_rnn_hiddens.detach()
    imaginated_states = torch.zeros(args.imagination_horizon + 1,
                                    *flatten_states.shape,
                                    device=flatten_states.device)
    imaginated_rnn_hiddens = torch.zeros(args.imagination_horizon + 1,
                                         *flatten_rnn_hiddens.shape,
                                         device=flatten_rnn_hiddens.device)
    imaginated_states[0] = flatten_states
    imaginated_rnn_hiddens[0] = flatten_rnn_hiddens

    for h in range(1, args.imagination_horizon + 1):
        actions = action_model(flatten_states, flatten_rnn_hiddens)
        flatten_states_prior, flatten_rnn_hiddens = rssm.prior(flatten_states,
                                                               actions,
                                                               flatten_rnn_hiddens)
        flatten_states = flatten_states_prior.rsample()
        imaginated_states[h] = flatten_states
        imaginated_rnn_hiddens[h] = flatten_rnn_hiddens

    flatten_imaginated_states = imaginated_states.view(-1, args.state_dim)
    flatten_imaginated_rnn_hiddens = imaginated_rnn_hiddens.view(-1, args.rnn_hidden_dim)
    imaginated_rewards = \
        reward_model(flatten_imaginated_states,
                     flatten_imaginated_rnn_hiddens).view(args.imagination_horizon + 1, -1)
    imaginated_values = \
        value_model(flatten_imaginated_states,
                    flatten_imaginated_rnn_hiddens).view(args.imagination_horizon + 1, -1)
    lambda_value_target = lambda_return(imaginated_rewards, imaginated_values,
                                        args.gamma, args.lambda_)

    # update_value model
    value_loss = 0.5 * mse_loss(imaginated_values, lambda_value_target.detach())
    value_optimizer.zero_grad()
    value_loss.backward(retain_graph=True)  # @value_backward
    clip_grad_norm_(value_model.parameters(), args.clip_grad_norm)
    value_optimizer.step()

    # update value model and action model
    action_loss = -1 * (lambda_value_target.mean())
    action_optimizer.zero_grad()
    action_loss.backward()  # @action_backward
    clip_grad_norm_(action_model.parameters(), args.clip_grad_norm)
    action_optimizer.step()

    # print losses (as published, through .item())
    _ = (model_loss.item(), kl_loss.item(), obs_loss.item(), reward_loss.item(), action_loss.item(),
         value_loss.item())


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for update_step in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
