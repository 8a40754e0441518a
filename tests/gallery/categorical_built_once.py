"""A distribution built once before the loop: `Categorical(logits=policy(observations))`, sampled each step.

Source: this course's notebook 04 (notebooks/04_carried_state.ipynb, the cell that builds
`actions = torch.distributions.Categorical(logits=policy(observations))   # built once` before
`step_policy`): a REINFORCE-style step (compare pytorch/examples reinforcement_learning/reinforce.py,
whose select_action builds its Categorical anew at every step). Retyped as in the notebook:
Linear(4, 3), SGD(lr=0.1), 16 observations; the step zero_grads, samples, backwards and steps.
"""

from collections.abc import Callable

import torch

ITERATIONS = 3

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "actions", "line": "@build_actions"}],
    "notes": [{"variable": "actions.probs", "line": "@sample"}],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 3)
    policy_optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    observations = torch.randn(16, 4)
    actions = torch.distributions.Categorical(logits=policy(observations))  # @build_actions
    return {"policy": policy, "policy_optimizer": policy_optimizer, "observations": observations, "actions": actions}


def step_policy(state: dict) -> None:
    actions, policy_optimizer = state["actions"], state["policy_optimizer"]
    policy_optimizer.zero_grad()
    chosen = actions.sample()  # @sample
    (-(actions.log_prob(chosen) * (chosen == 1).float()).mean()).backward()  # @backward
    policy_optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        step_policy(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: step_policy(state)


if __name__ == "__main__":
    run(build())
