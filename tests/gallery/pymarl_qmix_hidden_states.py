"""pymarl's QMIX learner: agent GRU hidden states unrolled over an episode batch, the QMixer, a target mac and mixer.

Source: oxwhirl/pymarl, src/learners/q_learner.py (commit 023de7ed5bc2840257e9a0dac8d33e0f3919fd4a),
src/modules/mixers/qmix.py (same commit), src/controllers/basic_controller.py (commit
eaf6b063822e2bdf1992d72dc159a500f235dbc4), and src/modules/agents/rnn_agent.py (RNNAgent: fc1, GRUCell, fc2,
`init_hidden` as `self.fc1.weight.new(1, rnn_hidden_dim).zero_()`). As published: QLearner.__init__ (QMixer,
`target_mixer = copy.deepcopy(self.mixer)`, RMSprop over mac and mixer, `target_mac = copy.deepcopy(mac)`) and
QLearner.train (mask, `self.mac.init_hidden(batch.batch_size)`, the per-t `mac.forward`, gather, the target mac's
unroll OUTSIDE torch.no_grad(), avail-action masking, double-Q with `mac_out.clone().detach()`, the mixers,
`targets.detach()` in the TD error, the masked L2 loss, zero_grad/backward/clip_grad_norm_/step, `_update_targets`
every target_update_interval episodes, the `.item()` logging); BasicMAC.forward keeps the agent's hidden state on
`self.hidden_states`, so each train() leaves the mac (and the target mac) holding the last time step's graph until
the next train() calls init_hidden. Retyped at CPU size: 3 agents, 4 actions, obs 5, state 6, rnn_hidden_dim 8,
mixing_embed_dim 4, episodes of 4 steps, batch 2; the EpisodeBatch is a small stand-in with the same keys and
shapes (obs, state, actions, actions_onehot, avail_actions, reward, terminated, filled), sampled from 6 made-up
episodes (the SMAC environment and the episode runner are left out); the logger is a stub; target_update_interval
2 episodes; BasicMAC's action selector and its `pi_logits` branch (unused with QMIX's `agent_output_type` "q") are
left out; one `learner.train(episode_sample, t_env, episode)` of run.py is an iteration.
"""

import copy
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch as th
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import RMSprop

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [
        {"variable": "mac.hidden_states", "line": "@mac_hidden"},
        {"variable": "target_mac.hidden_states", "line": "@mac_hidden"},
    ],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- modules/agents/rnn_agent.py


class RNNAgent(nn.Module):
    def __init__(self, input_shape, args):
        super(RNNAgent, self).__init__()
        self.args = args

        self.fc1 = nn.Linear(input_shape, args.rnn_hidden_dim)
        self.rnn = nn.GRUCell(args.rnn_hidden_dim, args.rnn_hidden_dim)
        self.fc2 = nn.Linear(args.rnn_hidden_dim, args.n_actions)

    def init_hidden(self):
        # make hidden states on same device as model
        return self.fc1.weight.new(1, self.args.rnn_hidden_dim).zero_()

    def forward(self, inputs, hidden_state):
        x = F.relu(self.fc1(inputs))
        h_in = hidden_state.reshape(-1, self.args.rnn_hidden_dim)
        h = self.rnn(x, h_in)
        q = self.fc2(h)
        return q, h


# ---------------------------------------------------------------- controllers/basic_controller.py


class BasicMAC:
    def __init__(self, scheme, groups, args):
        self.n_agents = args.n_agents
        self.args = args
        input_shape = self._get_input_shape(scheme)
        self._build_agents(input_shape)
        self.agent_output_type = args.agent_output_type

        self.hidden_states = None

    def forward(self, ep_batch, t, test_mode=False):
        agent_inputs = self._build_inputs(ep_batch, t)
        avail_actions = ep_batch["avail_actions"][:, t]
        agent_outs, self.hidden_states = self.agent(agent_inputs, self.hidden_states)  # @mac_hidden

        return agent_outs.view(ep_batch.batch_size, self.n_agents, -1)

    def init_hidden(self, batch_size):
        self.hidden_states = self.agent.init_hidden().unsqueeze(0).expand(batch_size, self.n_agents, -1)  # bav

    def parameters(self):
        return self.agent.parameters()

    def load_state(self, other_mac):
        self.agent.load_state_dict(other_mac.agent.state_dict())

    def _build_agents(self, input_shape):
        self.agent = RNNAgent(input_shape, self.args)

    def _build_inputs(self, batch, t):
        bs = batch.batch_size
        inputs = []
        inputs.append(batch["obs"][:, t])  # b1av
        if self.args.obs_last_action:
            if t == 0:
                inputs.append(th.zeros_like(batch["actions_onehot"][:, t]))
            else:
                inputs.append(batch["actions_onehot"][:, t-1])
        if self.args.obs_agent_id:
            inputs.append(th.eye(self.n_agents, device=batch.device).unsqueeze(0).expand(bs, -1, -1))

        inputs = th.cat([x.reshape(bs*self.n_agents, -1) for x in inputs], dim=1)
        return inputs

    def _get_input_shape(self, scheme):
        input_shape = scheme["obs"]["vshape"]
        if self.args.obs_last_action:
            input_shape += scheme["actions_onehot"]["vshape"][0]
        if self.args.obs_agent_id:
            input_shape += self.n_agents

        return input_shape


# ---------------------------------------------------------------- modules/mixers/qmix.py


class QMixer(nn.Module):
    def __init__(self, args):
        super(QMixer, self).__init__()

        self.args = args
        self.n_agents = args.n_agents
        self.state_dim = int(np.prod(args.state_shape))

        self.embed_dim = args.mixing_embed_dim

        self.hyper_w_1 = nn.Linear(self.state_dim, self.embed_dim * self.n_agents)
        self.hyper_w_final = nn.Linear(self.state_dim, self.embed_dim)

        # State dependent bias for hidden layer
        self.hyper_b_1 = nn.Linear(self.state_dim, self.embed_dim)

        # V(s) instead of a bias for the last layers
        self.V = nn.Sequential(nn.Linear(self.state_dim, self.embed_dim),
                               nn.ReLU(),
                               nn.Linear(self.embed_dim, 1))

    def forward(self, agent_qs, states):
        bs = agent_qs.size(0)
        states = states.reshape(-1, self.state_dim)
        agent_qs = agent_qs.view(-1, 1, self.n_agents)
        # First layer
        w1 = th.abs(self.hyper_w_1(states))
        b1 = self.hyper_b_1(states)
        w1 = w1.view(-1, self.n_agents, self.embed_dim)
        b1 = b1.view(-1, 1, self.embed_dim)
        hidden = F.elu(th.bmm(agent_qs, w1) + b1)
        # Second layer
        w_final = th.abs(self.hyper_w_final(states))
        w_final = w_final.view(-1, self.embed_dim, 1)
        # State-dependent bias
        v = self.V(states).view(-1, 1, 1)
        # Compute final output
        y = th.bmm(hidden, w_final) + v
        # Reshape and return
        q_tot = y.view(bs, -1, 1)
        return q_tot


# ---------------------------------------------------------------- learners/q_learner.py


class QLearner:
    def __init__(self, mac, scheme, logger, args):
        self.args = args
        self.mac = mac
        self.logger = logger

        self.params = list(mac.parameters())

        self.last_target_update_episode = 0

        self.mixer = None
        if args.mixer is not None:
            self.mixer = QMixer(args)
            self.params += list(self.mixer.parameters())
            self.target_mixer = copy.deepcopy(self.mixer)

        self.optimiser = RMSprop(params=self.params, lr=args.lr, alpha=args.optim_alpha, eps=args.optim_eps)

        # a little wasteful to deepcopy (e.g. duplicates action selector), but should work for any MAC
        self.target_mac = copy.deepcopy(mac)

        self.log_stats_t = -self.args.learner_log_interval - 1

    def train(self, batch, t_env: int, episode_num: int):
        # Get the relevant quantities
        rewards = batch["reward"][:, :-1]
        actions = batch["actions"][:, :-1]
        terminated = batch["terminated"][:, :-1].float()
        mask = batch["filled"][:, :-1].float()
        mask[:, 1:] = mask[:, 1:] * (1 - terminated[:, :-1])
        avail_actions = batch["avail_actions"]

        # Calculate estimated Q-Values
        mac_out = []
        self.mac.init_hidden(batch.batch_size)
        for t in range(batch.max_seq_length):
            agent_outs = self.mac.forward(batch, t=t)
            mac_out.append(agent_outs)
        mac_out = th.stack(mac_out, dim=1)  # Concat over time

        # Pick the Q-Values for the actions taken by each agent
        chosen_action_qvals = th.gather(mac_out[:, :-1], dim=3, index=actions).squeeze(3)  # Remove the last dim

        # Calculate the Q-Values necessary for the target
        target_mac_out = []
        self.target_mac.init_hidden(batch.batch_size)
        for t in range(batch.max_seq_length):
            target_agent_outs = self.target_mac.forward(batch, t=t)
            target_mac_out.append(target_agent_outs)

        # We don't need the first timesteps Q-Value estimate for calculating targets
        target_mac_out = th.stack(target_mac_out[1:], dim=1)  # Concat across time

        # Mask out unavailable actions
        target_mac_out[avail_actions[:, 1:] == 0] = -9999999

        # Max over target Q-Values
        if self.args.double_q:
            # Get actions that maximise live Q (for double q-learning)
            mac_out_detach = mac_out.clone().detach()
            mac_out_detach[avail_actions == 0] = -9999999
            cur_max_actions = mac_out_detach[:, 1:].max(dim=3, keepdim=True)[1]
            target_max_qvals = th.gather(target_mac_out, 3, cur_max_actions).squeeze(3)
        else:
            target_max_qvals = target_mac_out.max(dim=3)[0]

        # Mix
        if self.mixer is not None:
            chosen_action_qvals = self.mixer(chosen_action_qvals, batch["state"][:, :-1])
            target_max_qvals = self.target_mixer(target_max_qvals, batch["state"][:, 1:])

        # Calculate 1-step Q-Learning targets
        targets = rewards + self.args.gamma * (1 - terminated) * target_max_qvals

        # Td-error
        td_error = (chosen_action_qvals - targets.detach())

        mask = mask.expand_as(td_error)

        # 0-out the targets that came from padded data
        masked_td_error = td_error * mask

        # Normal L2 loss, take mean over actual data
        loss = (masked_td_error ** 2).sum() / mask.sum()

        # Optimise
        self.optimiser.zero_grad()
        loss.backward()  # @backward
        grad_norm = th.nn.utils.clip_grad_norm_(self.params, self.args.grad_norm_clip)
        self.optimiser.step()

        if (episode_num - self.last_target_update_episode) / self.args.target_update_interval >= 1.0:
            self._update_targets()
            self.last_target_update_episode = episode_num

        if t_env - self.log_stats_t >= self.args.learner_log_interval:
            self.logger.log_stat("loss", loss.item(), t_env)
            self.logger.log_stat("grad_norm", grad_norm, t_env)
            mask_elems = mask.sum().item()
            self.logger.log_stat("td_error_abs", (masked_td_error.abs().sum().item()/mask_elems), t_env)
            self.logger.log_stat("q_taken_mean", (chosen_action_qvals * mask).sum().item()/(mask_elems * self.args.n_agents), t_env)
            self.logger.log_stat("target_mean", (targets * mask).sum().item()/(mask_elems * self.args.n_agents), t_env)
            self.log_stats_t = t_env

    def _update_targets(self):
        self.target_mac.load_state(self.mac)
        if self.mixer is not None:
            self.target_mixer.load_state_dict(self.mixer.state_dict())


# ---------------------------------------------------------------- a stand-in EpisodeBatch, a logger stub, run.py


class EpisodeBatch:
    def __init__(self, data, batch_size, max_seq_length):
        self.data = data
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.device = "cpu"

    def __getitem__(self, key):
        return self.data[key]


class Logger:
    def log_stat(self, key, value, t):
        pass


def make_episodes(args, count):
    episodes = []
    for _ in range(count):
        T = args.episode_limit + 1
        actions = th.randint(0, args.n_actions, (T, args.n_agents, 1))
        episodes.append({
            "obs": th.randn(T, args.n_agents, args.obs_shape),
            "state": th.randn(T, args.state_shape),
            "actions": actions,
            "actions_onehot": F.one_hot(actions.squeeze(-1), args.n_actions).float(),
            "avail_actions": th.ones(T, args.n_agents, args.n_actions, dtype=th.int64),
            "reward": th.randn(T, 1),
            "terminated": th.tensor([[0]] * (T - 2) + [[1], [0]], dtype=th.uint8),
            "filled": th.tensor([[1]] * (T - 1) + [[0]], dtype=th.int64),
        })
    return episodes


def sample(buffer, batch_size):
    ep_ids = np.random.choice(len(buffer), batch_size, replace=False)
    data = {key: th.stack([buffer[i][key] for i in ep_ids]) for key in buffer[0]}
    return EpisodeBatch(data, batch_size, data["obs"].shape[1])


def build() -> dict:
    np.random.seed(0)
    th.manual_seed(0)
    args = SimpleNamespace(
        n_agents=3, n_actions=4, obs_shape=5, state_shape=6, episode_limit=4, rnn_hidden_dim=8,
        mixing_embed_dim=4, mixer="qmix", lr=0.0005, optim_alpha=0.99, optim_eps=0.00001, gamma=0.99,
        double_q=True, grad_norm_clip=10, target_update_interval=2, learner_log_interval=0,
        agent_output_type="q", obs_last_action=True, obs_agent_id=True, batch_size=2,
    )
    scheme = {"obs": {"vshape": args.obs_shape}, "actions_onehot": {"vshape": (args.n_actions,)}}
    mac = BasicMAC(scheme, None, args)
    learner = QLearner(mac, scheme, Logger(), args)
    buffer = make_episodes(args, 6)
    # the models and the optimiser named too, for the step tools' models=/optimizers= (the learner holds them)
    return {"args": args, "mac": mac, "learner": learner, "target_mac": learner.target_mac, "buffer": buffer,
            "episode": 0, "t_env": 0, "agent": mac.agent, "mixer": learner.mixer,
            "target_agent": learner.target_mac.agent, "target_mixer": learner.target_mixer,
            "optimiser": learner.optimiser}


def iteration(state: dict) -> None:
    args, learner, buffer = state["args"], state["learner"], state["buffer"]
    state["episode"] += args.batch_size
    state["t_env"] += args.episode_limit * args.batch_size
    episode_sample = sample(buffer, args.batch_size)
    learner.train(episode_sample, state["t_env"], state["episode"])


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
