"""Notebook 01's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive
part of it), every right answer accepted, and checking the same answer twice must give the same
verdict and text, leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import pytest
import torch

from check_catalogue import catalogue_tests
from helpers.lessons.graph_buffers import check_backward_three_times, check_predictions, check_training_loop

# -- exercise 1: predictions ---------------------------------------------------------------------

SOLUTION_PREDICTIONS = {
    "(x + w).sum()": True,
    "(x * w).sum()": False,
    "x.exp().sum()": False,
    "x.view(2, 3).sum()": True,
    "(x * 2).sum()": False,
    "x.mean()": True,
}
STARTING_PREDICTIONS = dict.fromkeys(SOLUTION_PREDICTIONS, ...)  # the exercise cell as given

# -- exercise 2: backward three times ------------------------------------------------------------

notebook_loss = torch.tensor([2.0], requires_grad=True).pow(2).sum()  # a global loss, as the notebook has


def three_as_given(loss):  # the exercise cell as given
    loss.backward()
    loss.backward()
    loss.backward()


def three_solution(loss):  # the notebook's solution
    loss.backward(retain_graph=True)
    loss.backward(retain_graph=True)
    loss.backward()


def three_in_a_loop(loss):
    for i in range(3):
        loss.backward(retain_graph=i < 2)


def three_autograd_backward(loss):
    torch.autograd.backward(loss, retain_graph=True)
    torch.autograd.backward(loss, retain_graph=True)
    torch.autograd.backward(loss)


def three_scaled_loss(loss):
    (3 * loss).backward()


def three_scaled_gradient(loss):
    loss.backward(gradient=torch.tensor(3.0))


def three_roots_at_once(loss):
    torch.autograd.backward([loss, loss, loss])


def three_retain_every_time(loss):
    for _ in range(3):
        loss.backward(retain_graph=True)


def three_retain_then_del(loss):
    for _ in range(3):
        loss.backward(retain_graph=True)
    del loss


def three_only_twice(loss):
    loss.backward(retain_graph=True)
    loss.backward()


def three_four_times(loss):
    for i in range(4):
        loss.backward(retain_graph=i < 3)


def three_retain_on_the_last_only(loss):
    loss.backward()
    loss.backward()
    loss.backward(retain_graph=True)


def three_data(loss):
    for i in range(3):
        loss.data.backward(retain_graph=i < 2)


def three_global_loss(loss):
    for i in range(3):
        notebook_loss.backward(retain_graph=True)


def three_type_error(loss):
    loss.backward(retain_graph=True, times=3)


def three_create_graph(loss):
    loss.backward(create_graph=True)
    loss.backward(create_graph=True)
    loss.backward()


def make_three_with_a_global_counter():
    """A counter kept at module level and never reset: right the first call only."""
    count = 0

    def backward_three_times(loss):
        nonlocal count
        while count < 3:
            count += 1
            loss.backward(retain_graph=count < 3)

    return backward_three_times


# -- exercise 3: a training loop ------------------------------------------------------------------


def loop(keep=lambda loss: loss.item(), retain=False, zero="before", optimizer=True, stash=None):
    """The exercise's loop with one thing changed: what it keeps, retain, where it zeroes, which SGD."""

    def train(model, batches):
        sgd = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
        history = []
        for batch in batches:
            if zero == "before":
                sgd.zero_grad() if sgd else model.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward(retain_graph=retain)
            if sgd:
                sgd.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
            if zero == "after":
                sgd.zero_grad()
            if stash is not None:
                stash.append(loss)
            history.append(keep(loss))
        return history

    return train


def loop_generator(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in batches:
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        yield loss.item()


def loop_returns_a_tuple(model, batches):
    return tuple(loop()(model, batches))


def loop_without_retain_raises(model, batches):
    loss = model(batches[0]).pow(2).mean()
    loss.backward()
    loss.backward()
    return [loss.item()] * len(batches)


# -- the catalogue ---------------------------------------------------------------------------------

WRONG = [
    # exercise 1
    pytest.param(check_predictions, STARTING_PREDICTIONS, "Fill in True or False for: (x + w).sum(), (x * w).sum()",
                 id="ex1-as-given"),
    pytest.param(check_predictions, dict.fromkeys(SOLUTION_PREDICTIONS, True),
                 "3 of 6 predictions are wrong: (x * w).sum(), x.exp().sum(), (x * 2).sum().", id="ex1-all-true"),
    pytest.param(check_predictions, {**SOLUTION_PREDICTIONS, "(x * 2).sum()": True},
                 "1 of 6 predictions are wrong: (x * 2).sum().", id="ex1-python-number-saves-nothing"),
    pytest.param(check_predictions, {k: str(v) for k, v in SOLUTION_PREDICTIONS.items()},
                 "Fill in True or False for", id="ex1-strings"),
    pytest.param(check_predictions, list(SOLUTION_PREDICTIONS.values()), "Give a dict", id="ex1-a-list"),
    # exercise 2
    pytest.param(check_backward_three_times, three_as_given,
                 "Your function raised RuntimeError: Trying to backward through the graph a second time",
                 id="ex2-as-given"),
    pytest.param(check_backward_three_times, three_scaled_loss,
                 "backpropagated through loss 1 time, not 3. One pass with a gradient scaled by 3",
                 id="ex2-3-times-loss"),
    pytest.param(check_backward_three_times, three_scaled_gradient,
                 "backpropagated through loss 1 time, not 3. One pass with a gradient scaled by 3",
                 id="ex2-gradient-3"),
    pytest.param(check_backward_three_times, three_roots_at_once,
                 "backpropagated through loss 1 time, not 3. One pass", id="ex2-three-roots-one-pass"),
    pytest.param(check_backward_three_times, three_retain_every_time,
                 "while loss is still referenced its graph holds 12 B of buffers", id="ex2-retain-every-time"),
    pytest.param(check_backward_three_times, three_retain_then_del,
                 "while loss is still referenced its graph holds 12 B of buffers", id="ex2-retain-then-del"),
    pytest.param(check_backward_three_times, three_only_twice, "backpropagated through loss 2 times, not 3.",
                 id="ex2-twice"),
    pytest.param(check_backward_three_times, three_four_times, "backpropagated through loss 4 times, not 3.",
                 id="ex2-four-times"),
    pytest.param(check_backward_three_times, three_retain_on_the_last_only,
                 "Your function raised RuntimeError: Trying to backward", id="ex2-retain-on-the-last"),
    pytest.param(check_backward_three_times, three_data,
                 "Your function raised RuntimeError: element 0 of tensors does not require grad", id="ex2-loss-data"),
    pytest.param(check_backward_three_times, three_global_loss,
                 "Your function did not backpropagate through the loss it was given.", id="ex2-global-loss"),
    pytest.param(check_backward_three_times, three_type_error, "Your function raised TypeError: ",
                 id="ex2-type-error"),
    # torch warns that backward(create_graph=True) ties each parameter to its gradient: the answer's flaw.
    pytest.param(check_backward_three_times, three_create_graph, "weight.grad carries a graph of its own",
                 id="ex2-create-graph", marks=pytest.mark.filterwarnings(
                     "ignore:Using backward\\(\\) with create_graph=True:UserWarning")),
    pytest.param(check_backward_three_times, make_three_with_a_global_counter,
                 "On a second call, with a fresh loss and .grad holding the first call's result, your function "
                 "did not backpropagate through the loss it was given.", id="ex2-counter-never-reset"),
    pytest.param(check_backward_three_times, "backward_three_times", "Pass your function itself",
                 id="ex2-not-a-function"),
    # exercise 3
    pytest.param(check_training_loop, loop(keep=lambda loss: loss, retain=True),
                 "The history holds tensors that carry a grad_fn: each one keeps its whole graph", id="ex3-as-given"),
    pytest.param(check_training_loop, loop(retain=True),
                 "During your loop, graphs held up to 4.1 KiB of buffers at once, 2.0x what one batch's graph holds",
                 id="ex3-retain-and-item"),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss),
                 "The history holds tensors that carry a grad_fn", id="ex3-tensors-without-retain"),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.detach().requires_grad_()),
                 "tensors that require grad: they carry no graph, but NumPy and plotting refuse them",
                 id="ex3-detach-requires-grad"),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.item),
                 "Each history item should be one number, such as loss.item().", id="ex3-item-not-called"),
    pytest.param(check_training_loop, loop(zero="never"),
                 "history[2] is not the loss the given loop records at batch 2.", id="ex3-never-zeroes"),
    pytest.param(check_training_loop, loop(zero="after"),
                 "On a second call (the model already trained, .grad already filled), history[1] is not the loss the given loop "
                 "records at batch 1.", id="ex3-zeroes-after-the-step"),
    pytest.param(check_training_loop, loop(stash=[], retain=True),
                 "After your loop returned, graphs still hold", id="ex3-retained-graphs-kept-elsewhere"),
    pytest.param(check_training_loop, loop_generator, "yours returned a generator", id="ex3-generator"),
    pytest.param(check_training_loop, loop_returns_a_tuple, "yours returned a tuple", id="ex3-tuple"),
    pytest.param(check_training_loop, loop_without_retain_raises,
                 "Your loop raised RuntimeError: Trying to backward", id="ex3-raises"),
    pytest.param(check_training_loop, lambda model, batches: [0.0] * len(batches),
                 "history[0] is not the loss the given loop records at batch 0.", id="ex3-made-up-numbers"),
]

RIGHT = [
    pytest.param(check_predictions, SOLUTION_PREDICTIONS, id="ex1-solution"),
    pytest.param(check_backward_three_times, three_solution, id="ex2-solution"),
    pytest.param(check_backward_three_times, three_in_a_loop, id="ex2-loop"),
    pytest.param(check_backward_three_times, three_autograd_backward, id="ex2-autograd-backward"),
    pytest.param(check_training_loop, loop(), id="ex3-solution"),
    # float(loss) keeps a number, as .item() does; torch 2.13 also warns that loss requires grad.
    pytest.param(check_training_loop, loop(keep=float), id="ex3-float", marks=pytest.mark.filterwarnings(
        "ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning")),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.detach()), id="ex3-detach"),
    pytest.param(check_training_loop, loop(optimizer=False), id="ex3-hand-written-sgd"),
]


test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(WRONG, RIGHT)


def test_detached_history_is_accepted_with_a_note_on_floats() -> None:
    result = check_training_loop(loop(keep=lambda loss: loss.detach()))
    assert result and "Detached tensors carry no graph" in result.message
    assert "Detached" not in check_training_loop(loop()).message
