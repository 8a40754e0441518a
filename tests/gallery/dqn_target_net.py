"""DQN with a replay memory and a target network whose next-state values are cut with .detach().

Source: pytorch/tutorials, intermediate_source/reinforcement_q_learning.py at commit
00acd8d218741d93c500119ed9e6e777b8d35b99 (the screen-difference version of
https://pytorch.org/tutorials/intermediate/reinforcement_q_learning.html): Transition and ReplayMemory (a deque,
random.sample), the convolutional DQN with BatchNorm, `policy_net`, `target_net` (load_state_dict of policy_net,
eval()), RMSprop, `memory = ReplayMemory(10000)` and `steps_done` at module level; select_action (epsilon-greedy with
random.random(), the greedy action under torch.no_grad()); optimize_model (returns while the memory holds fewer than
BATCH_SIZE transitions, `state_action_values = policy_net(state_batch).gather(1, action_batch)`,
`next_state_values[non_final_mask] = target_net(non_final_next_states).max(1)[0].detach()`, SmoothL1Loss,
zero_grad, backward, `param.grad.data.clamp_(-1, 1)`, step); the episode loop (screens, `state = current_screen -
last_screen`, push, optimize_model() every step, `target_net.load_state_dict(policy_net.state_dict())` every
TARGET_UPDATE episodes). Retyped at CPU size: gym's CartPole and get_screen()'s rendering replaced by a made-up
environment whose episodes last 4 steps and whose screens are random 3x32x48 images (published about 3x40x90),
BATCH_SIZE 4 (published 128), TARGET_UPDATE 2 (published 10) so the target network is reloaded within the run,
plot_durations and the final rendering left out; one episode is an iteration; the module-level objects are set by
build().
"""

import math
import random
from collections import deque, namedtuple
from collections.abc import Callable
from itertools import count

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

device = torch.device("cpu")

Transition = namedtuple('Transition',
                        ('state', 'action', 'next_state', 'reward'))


class ReplayMemory(object):

    def __init__(self, capacity):
        self.memory = deque([],maxlen=capacity)  # noqa: RUF037 (as published)

    def push(self, *args):
        """Save a transition"""
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class DQN(nn.Module):

    def __init__(self, h, w, outputs):
        super(DQN, self).__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=5, stride=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5, stride=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 32, kernel_size=5, stride=2)
        self.bn3 = nn.BatchNorm2d(32)

        # Number of Linear input connections depends on output of conv2d layers
        # and therefore the input image size, so compute it.
        def conv2d_size_out(size, kernel_size = 5, stride = 2):
            return (size - (kernel_size - 1) - 1) // stride  + 1
        convw = conv2d_size_out(conv2d_size_out(conv2d_size_out(w)))
        convh = conv2d_size_out(conv2d_size_out(conv2d_size_out(h)))
        linear_input_size = convw * convh * 32
        self.head = nn.Linear(linear_input_size, outputs)

    # Called with either one element to determine next action, or a batch
    # during optimization. Returns tensor([[left0exp,right0exp]...]).
    def forward(self, x):
        x = x.to(device)
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        return self.head(x.view(x.size(0), -1))


class FourStepScreens:
    """Stands in for gym's CartPole and get_screen(): random 3x32x48 screens, reward 1, done after 4 steps."""

    def __init__(self, generator):
        self.generator = generator
        self.t = 0

    def reset(self):
        self.t = 0

    def step(self, action):
        self.t += 1
        return None, 1.0, self.t >= 4, {}

    def screen(self):
        return torch.rand(1, 3, 32, 48, generator=self.generator)


BATCH_SIZE = 4
GAMMA = 0.999
EPS_START = 0.9
EPS_END = 0.05
EPS_DECAY = 200
TARGET_UPDATE = 2

env = None  # set by build(), with the networks, the optimizer and the memory, read as published
n_actions = 2
policy_net = None
target_net = None
optimizer = None
memory = None
steps_done = 0
episode_durations = []


def get_screen():
    return env.screen()


def select_action(state):
    global steps_done
    sample = random.random()
    eps_threshold = EPS_END + (EPS_START - EPS_END) * \
        math.exp(-1. * steps_done / EPS_DECAY)
    steps_done += 1
    if sample > eps_threshold:
        with torch.no_grad():
            # t.max(1) will return largest column value of each row.
            # second column on max result is index of where max element was
            # found, so we pick action with the larger expected reward.
            return policy_net(state).max(1)[1].view(1, 1)
    else:
        return torch.tensor([[random.randrange(n_actions)]], device=device, dtype=torch.long)


def optimize_model():
    if len(memory) < BATCH_SIZE:
        return
    transitions = memory.sample(BATCH_SIZE)
    # Transpose the batch (see https://stackoverflow.com/a/19343/3343043 for
    # detailed explanation). This converts batch-array of Transitions
    # to Transition of batch-arrays.
    batch = Transition(*zip(*transitions))

    # Compute a mask of non-final states and concatenate the batch elements
    # (a final state would've been the one after which simulation ended)
    non_final_mask = torch.tensor(tuple(map(lambda s: s is not None,
                                          batch.next_state)), device=device, dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state
                                                if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)

    # Compute Q(s_t, a) - the model computes Q(s_t), then we select the
    # columns of actions taken. These are the actions which would've been taken
    # for each batch state according to policy_net
    state_action_values = policy_net(state_batch).gather(1, action_batch)

    # Compute V(s_{t+1}) for all next states.
    # Expected values of actions for non_final_next_states are computed based
    # on the "older" target_net; selecting their best reward with max(1)[0].
    # This is merged based on the mask, such that we'll have either the expected
    # state value or 0 in case the state was final.
    next_state_values = torch.zeros(BATCH_SIZE, device=device)
    next_state_values[non_final_mask] = target_net(non_final_next_states).max(1)[0].detach()
    # Compute the expected Q values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch

    # Compute Huber loss
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))

    # Optimize the model
    optimizer.zero_grad()
    loss.backward()  # @backward
    for param in policy_net.parameters():
        param.grad.data.clamp_(-1, 1)
    optimizer.step()


def build() -> dict:
    global env, policy_net, target_net, optimizer, memory, steps_done, episode_durations
    random.seed(0)
    torch.manual_seed(0)
    env = FourStepScreens(torch.Generator().manual_seed(0))
    init_screen = get_screen()
    _, _, screen_height, screen_width = init_screen.shape
    policy_net = DQN(screen_height, screen_width, n_actions).to(device)
    target_net = DQN(screen_height, screen_width, n_actions).to(device)
    target_net.load_state_dict(policy_net.state_dict())
    target_net.eval()
    optimizer = optim.RMSprop(policy_net.parameters())
    memory = ReplayMemory(10000)
    steps_done = 0
    episode_durations = []
    return {"policy_net": policy_net, "target_net": target_net, "optimizer": optimizer, "memory": memory,
            "i_episode": 0}


def episode(run_state: dict) -> None:
    i_episode = run_state["i_episode"]
    # Initialize the environment and state
    env.reset()
    last_screen = get_screen()
    current_screen = get_screen()
    state = current_screen - last_screen
    for t in count():
        # Select and perform an action
        action = select_action(state)
        _, reward, done, _ = env.step(action.item())
        reward = torch.tensor([reward], device=device)

        # Observe new state
        last_screen = current_screen
        current_screen = get_screen()
        if not done:
            next_state = current_screen - last_screen
        else:
            next_state = None

        # Store the transition in memory
        memory.push(state, action, next_state, reward)

        # Move to the next state
        state = next_state

        # Perform one step of the optimization (on the policy network)
        optimize_model()
        if done:
            episode_durations.append(t + 1)
            break
    # Update the target network, copying all weights and biases in DQN
    if i_episode % TARGET_UPDATE == 0:
        target_net.load_state_dict(policy_net.state_dict())
    run_state["i_episode"] += 1


def run(run_state: dict, iterations: int = ITERATIONS) -> None:
    for i_episode in range(iterations):
        episode(run_state)


def step_function(run_state: dict) -> Callable[[], None]:
    return lambda: episode(run_state)


if __name__ == "__main__":
    run(build())
