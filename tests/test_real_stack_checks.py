"""Notebook 06's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive part of
it), every right answer accepted, and checking the same answer twice gives the same verdict and text,
leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import torch
from check_catalogue import catalogue_tests, zeroed_wrong

from helpers.lessons.real_stack import check_ppo_update, check_sam_step

# -- the notebook's own helpers -----------------------------------------------------------------------


def ppo_loss(new_log_probs, old_log_probs, advantages, clip=0.2):
    ratio = torch.exp(new_log_probs - old_log_probs)
    return -torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()


def climb(model, rho=0.05):
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    shifts = [rho * p.grad / norm for p in model.parameters()]
    with torch.no_grad():
        for p, e in zip(model.parameters(), shifts):
            p.add_(e)
    return shifts


def new_log_probs_of(policy, observations, actions):
    return torch.distributions.Categorical(logits=policy(observations)).log_prob(actions)


# -- exercise 1: PPO ------------------------------------------------------------------------------------


def ppo(detach=True, recompute=True, retain=False, zero=True, steps_less=0, old_from_current=False, between=None):
    """The solution with one thing changed; ``between(optimizer, policy)`` runs between backward and step."""

    def ppo_update(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
        old = rollout_log_probs.detach() if detach else rollout_log_probs
        new = new_log_probs_of(policy, observations, actions)
        for _ in range(epochs - steps_less):
            if recompute:
                new = new_log_probs_of(policy, observations, actions)
            if old_from_current:
                old = new.detach()
            if zero:
                optimizer.zero_grad()
            ppo_loss(new, old, advantages).backward(retain_graph=retain)
            if between is not None:
                between(optimizer, policy)
            optimizer.step()

    return ppo_update


def ppo_as_given(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
    new_log_probs = new_log_probs_of(policy, observations, actions)
    for _ in range(epochs):
        optimizer.zero_grad()
        ppo_loss(new_log_probs, rollout_log_probs, advantages).backward(retain_graph=True)
        optimizer.step()


def ppo_everything_detached(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
    for _ in range(epochs):
        optimizer.zero_grad()
        new = new_log_probs_of(policy, observations, actions).detach()
        ppo_loss(new, rollout_log_probs.detach(), advantages).backward()
        optimizer.step()


def ppo_zero_after_step(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
    old = rollout_log_probs.detach()
    for _ in range(epochs):
        ppo_loss(new_log_probs_of(policy, observations, actions), old, advantages).backward()
        optimizer.step()
        optimizer.zero_grad()


def ppo_solution(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
    old_log_probs = rollout_log_probs.detach()
    for _ in range(epochs):
        new_log_probs = torch.distributions.Categorical(logits=policy(observations)).log_prob(actions)
        optimizer.zero_grad()
        ppo_loss(new_log_probs, old_log_probs, advantages).backward()
        optimizer.step()


def ppo_log_softmax(policy, optimizer, observations, actions, rollout_log_probs, advantages, epochs):
    old = rollout_log_probs.detach().clone()
    for _ in range(epochs):
        new = policy(observations).log_softmax(-1).gather(1, actions[:, None]).squeeze(1)
        optimizer.zero_grad(set_to_none=False)
        ppo_loss(new, old, advantages).backward()
        optimizer.step()


NOT_MOVED = "left the policy's parameters exactly where they started"
PPO_WRONG = [
    (check_ppo_update, ppo_as_given, NOT_MOVED),
    (
        check_ppo_update,
        ppo(detach=False),
        "Your update raised RuntimeError: Trying to backward through the graph a second",
    ),
    (check_ppo_update, ppo(detach=False, retain=True), NOT_MOVED),
    (
        check_ppo_update,
        ppo(zero=False),
        "At optimizer step 1, .grad holds the right gradient plus the one left in .grad",
    ),
    (check_ppo_update, ppo_zero_after_step, "At optimizer step 1, .grad holds the right gradient plus the one left"),
    (check_ppo_update, ppo(recompute=False, retain=True), "At optimizer step 2, .grad differs from the right update's"),
    (check_ppo_update, ppo(steps_less=1), "Your update made 3 optimizer step(s); the right one makes 4"),
    (
        check_ppo_update,
        ppo_everything_detached,
        "Your update raised RuntimeError: element 0 of tensors does not require",
    ),
    (check_ppo_update, ppo(old_from_current=True), "At optimizer step 2, .grad differs from the right update's"),
    (check_ppo_update, 42, "Pass your function itself"),
    # A step on .grad cleared after its backward (issue 26): named so, not only "left where they started".
    *zeroed_wrong(check_ppo_update, lambda clear: ppo(between=clear), "ex1"),
]
PPO_RIGHT = [(check_ppo_update, ppo_solution), (check_ppo_update, ppo()), (check_ppo_update, ppo_log_softmax)]


# -- exercise 2: SAM ------------------------------------------------------------------------------------


def sam(
    first_zero=True,
    second_zero=True,
    second_forward=True,
    retain=False,
    restore=True,
    restore_after=False,
    perturb=True,
    steps=1,
    between=None,
):
    """The solution with one thing changed; ``between(optimizer, model)`` runs between the weights put back and
    the step."""

    def sam_step(model, optimizer, loss_fn, rho):
        if first_zero:
            optimizer.zero_grad()
        loss = loss_fn()
        loss.backward(retain_graph=retain)
        shifts = climb(model, rho) if perturb else []
        if second_zero:
            optimizer.zero_grad()
        (loss_fn() if second_forward else loss).backward()
        if restore and not restore_after:
            with torch.no_grad():
                for p, e in zip(model.parameters(), shifts):
                    p.sub_(e)
        if between is not None:
            between(optimizer, model)
        for _ in range(steps):
            optimizer.step()
        if restore_after:
            with torch.no_grad():
                for p, e in zip(model.parameters(), shifts):
                    p.sub_(e)

    return sam_step


def sam_as_given(model, optimizer, loss_fn, rho):
    loss = loss_fn()
    loss.backward(retain_graph=True)
    shifts = climb(model, rho)  # noqa: F841 - the page's starting code leaves the weights at w + e
    loss.backward()
    optimizer.step()


def sam_plain_step(model, optimizer, loss_fn, rho):
    optimizer.zero_grad()
    loss_fn().backward()
    optimizer.step()


def sam_solution(model, optimizer, loss_fn, rho):
    optimizer.zero_grad()
    loss_fn().backward()
    shifts = climb(model, rho)
    optimizer.zero_grad()
    loss_fn().backward()
    with torch.no_grad():
        for p, e in zip(model.parameters(), shifts):
            p.sub_(e)
    optimizer.step()


def sam_saved_weights(model, optimizer, loss_fn, rho):
    model.zero_grad(set_to_none=False)
    loss_fn().backward()
    saved = [p.detach().clone() for p in model.parameters()]
    climb(model, rho)
    model.zero_grad()
    loss_fn().backward()
    with torch.no_grad():
        for p, w in zip(model.parameters(), saved):
            p.copy_(w)
    optimizer.step()


SAM_WRONG = [
    (
        check_sam_step,
        sam_as_given,
        "Your step raised RuntimeError: one of the variables needed for gradient computation",
    ),
    (check_sam_step, sam(second_forward=False), "Your step raised RuntimeError: Trying to backward through the graph"),
    (check_sam_step, sam(second_forward=False, retain=True), "Your step raised RuntimeError: one of the variables"),
    (check_sam_step, sam_plain_step, ".grad at optimizer.step() holds the gradient at w (a plain step, not SAM's)"),
    (check_sam_step, sam(second_zero=False), "holds the sum of the gradients at w and at w + e"),
    (check_sam_step, sam(first_zero=False), ".grad at optimizer.step() differs from the gradient at w + e"),
    (check_sam_step, sam(restore=False), "optimizer.step() ran while the weights were still perturbed"),
    (check_sam_step, sam(restore_after=True), "optimizer.step() ran while the weights were still perturbed"),
    (check_sam_step, sam(steps=2), "Your step made 2 optimizer step(s); a SAM step makes one"),
    (check_sam_step, sam(steps=0), "Your step made 0 optimizer step(s)"),
    *zeroed_wrong(check_sam_step, lambda clear: sam(between=clear), "ex2"),
]
SAM_RIGHT = [(check_sam_step, sam_solution), (check_sam_step, sam()), (check_sam_step, sam_saved_weights)]

test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(
    PPO_WRONG + SAM_WRONG, PPO_RIGHT + SAM_RIGHT
)
