"""Notebook 01's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive
part of it), every right answer accepted, and checking the same answer twice must give the same
verdict and text, leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import collections
import types

import pytest
import torch
from check_catalogue import catalogue_tests, zeroed_wrong

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
REVERSED_PREDICTIONS = dict(reversed(list(SOLUTION_PREDICTIONS.items())))

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
    for _ in range(3):
        notebook_loss.backward(retain_graph=True)


def three_type_error(loss):
    loss.backward(retain_graph=True, times=3)


def three_create_graph(loss):
    loss.backward(create_graph=True)
    loss.backward(create_graph=True)
    loss.backward()


def three_from_float(loss):
    for _ in range(3):
        torch.tensor(float(loss), requires_grad=True).backward()  # a new leaf: no path back to the weight


def three_detached(loss):
    for _ in range(3):
        loss.detach().requires_grad_().backward()


def three_retain_on_the_first_only(loss):
    loss.backward(retain_graph=True)
    loss.backward()
    loss.backward()


def three_thirds(loss):
    for i in range(3):
        loss.backward(gradient=torch.tensor(1 / 3), retain_graph=i < 2)


def three_create_graph_on_the_last(loss):
    loss.backward(retain_graph=True)
    loss.backward(retain_graph=True)
    loss.backward(create_graph=True)


def three_through_clones(loss):
    for i in range(3):
        loss.clone().backward(retain_graph=i < 2)  # each pass goes on through loss's own graph


def three_ones_gradient(loss):
    for i in range(3):
        loss.backward(torch.ones_like(loss), retain_graph=i != 2)


def three_with_a_local_counter(loss):
    count = 0
    while count < 3:
        count += 1
        loss.backward(retain_graph=count < 3)


def three_plus_zero_data(loss):
    for i in range(3):
        (loss + 0 * loss.data).backward(retain_graph=i < 2)  # .data is a constant here: the gradient is loss's


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


def loop(keep=lambda loss: loss.item(), retain=False, zero="before", optimizer=True, stash=None, between=None):
    """The exercise's loop with one thing changed: what it keeps, retain, how and where it zeroes, which SGD, or
    ``between(optimizer, model)`` run between backward and step."""

    def train(model, batches):
        sgd = (optimizer if callable(optimizer) else torch.optim.SGD)(model.parameters(), lr=0.1) if optimizer else None
        history = []
        for batch in batches:
            if zero == "before":
                sgd.zero_grad() if sgd else model.zero_grad()
            elif zero == "to zeros":
                model.zero_grad(set_to_none=False)
            elif zero == "by hand":
                for p in model.parameters():
                    p.grad = None
            loss = model(batch).pow(2).mean()
            loss.backward(retain_graph=retain)
            if between is not None:
                between(sgd, model)
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


def loop_body(body):
    """A loop whose body, ``body(model, optimizer, batch) -> history item``, is written out in full."""

    def train(model, batches):
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        return [body(model, sgd, batch) for batch in batches]

    return train


def backward_of_a_float(model, sgd, batch):
    sgd.zero_grad()
    loss = model(batch).pow(2).mean()
    torch.tensor(float(loss), requires_grad=True).backward()  # a new leaf: nothing reaches the model
    sgd.step()
    return loss.item()


def records_after_the_step(model, sgd, batch):  # an extra forward: the loss after the update
    sgd.zero_grad()
    model(batch).pow(2).mean().backward()
    sgd.step()
    return model(batch).pow(2).mean().item()


def forward_twice(model, sgd, batch):  # an extra forward whose graph lives while the second is built
    sgd.zero_grad()
    first = model(batch).pow(2).mean()
    loss = model(batch).pow(2).mean()
    loss.backward()
    sgd.step()
    return first.item()


def detach_before_the_loss(model, sgd, batch):
    sgd.zero_grad()
    loss = model(batch).detach().pow(2).mean()
    loss.backward()
    sgd.step()
    return loss.item()


def two_steps(model, sgd, batch):
    sgd.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    sgd.step()
    sgd.step()
    return loss.item()


def retain_then_del(model, sgd, batch):
    sgd.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward(retain_graph=True)
    sgd.step()
    item = loss.item()
    del loss  # nothing references the retained graph any more: its buffers go now
    return item


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
    pytest.param(
        check_predictions,
        STARTING_PREDICTIONS,
        "Fill in True or False for: (x + w).sum(), (x * w).sum()",
        id="ex1-as-given",
    ),
    pytest.param(
        check_predictions,
        dict.fromkeys(SOLUTION_PREDICTIONS, True),
        "3 of 6 predictions are wrong: (x * w).sum(), x.exp().sum(), (x * 2).sum().",
        id="ex1-all-true",
    ),
    pytest.param(
        check_predictions,
        {**SOLUTION_PREDICTIONS, "(x * 2).sum()": True},
        "1 of 6 predictions are wrong: (x * 2).sum().",
        id="ex1-python-number-saves-nothing",
    ),
    pytest.param(
        check_predictions,
        {k: str(v) for k, v in SOLUTION_PREDICTIONS.items()},
        "Each prediction is True or False; (x + w).sum() has 'True' (and 5 more).",
        id="ex1-strings",
    ),
    pytest.param(
        check_predictions,
        {k: int(v) for k, v in SOLUTION_PREDICTIONS.items()},
        "Each prediction is True or False; (x + w).sum() has 1 (and 5 more).",
        id="ex1-ones-and-zeros",
    ),
    pytest.param(
        check_predictions,
        {**SOLUTION_PREDICTIONS, "x.exp().sum()": None},
        "Each prediction is True or False; x.exp().sum() has None.",
        id="ex1-none",
    ),
    pytest.param(
        check_predictions,
        dict.fromkeys(SOLUTION_PREDICTIONS, False),
        "3 of 6 predictions are wrong: (x + w).sum(), x.view(2, 3).sum(), x.mean().",
        id="ex1-all-false",
    ),
    pytest.param(
        check_predictions,
        {**SOLUTION_PREDICTIONS, "x.mean()": False},
        "1 of 6 predictions are wrong: x.mean().",
        id="ex1-mean-saves-its-input",
    ),
    pytest.param(
        check_predictions,
        {**SOLUTION_PREDICTIONS, "x.sin().sum()": True},
        "Unknown expression(s): x.sin().sum(); predict for exactly these: (x + w).sum()",
        id="ex1-extra-key",
    ),
    pytest.param(
        check_predictions,
        {**STARTING_PREDICTIONS, "x.mean ()": True},
        "Unknown expression(s): x.mean ()",
        id="ex1-misspelt-key",
    ),
    pytest.param(check_predictions, list(SOLUTION_PREDICTIONS.values()), "Give a dict", id="ex1-a-list"),
    # exercise 2
    pytest.param(
        check_backward_three_times,
        three_as_given,
        "Your function raised RuntimeError: Trying to backward through the graph a second time",
        id="ex2-as-given",
    ),
    pytest.param(
        check_backward_three_times,
        three_scaled_loss,
        "backpropagated through loss 1 time, not 3. One pass with a gradient scaled by 3",
        id="ex2-3-times-loss",
    ),
    pytest.param(
        check_backward_three_times,
        three_scaled_gradient,
        "backpropagated through loss 1 time, not 3. One pass with a gradient scaled by 3",
        id="ex2-gradient-3",
    ),
    pytest.param(
        check_backward_three_times,
        three_roots_at_once,
        "backpropagated through loss 1 time, not 3. One pass",
        id="ex2-three-roots-one-pass",
    ),
    pytest.param(
        check_backward_three_times,
        three_retain_every_time,
        "while loss is still referenced its graph holds 12 B of buffers",
        id="ex2-retain-every-time",
    ),
    pytest.param(
        check_backward_three_times,
        three_retain_then_del,
        "while loss is still referenced its graph holds 12 B of buffers",
        id="ex2-retain-then-del",
    ),
    pytest.param(
        check_backward_three_times, three_only_twice, "backpropagated through loss 2 times, not 3.", id="ex2-twice"
    ),
    pytest.param(
        check_backward_three_times, three_four_times, "backpropagated through loss 4 times, not 3.", id="ex2-four-times"
    ),
    pytest.param(
        check_backward_three_times,
        three_retain_on_the_last_only,
        "Your function raised RuntimeError: Trying to backward",
        id="ex2-retain-on-the-last",
    ),
    pytest.param(
        check_backward_three_times,
        three_data,
        "Your function raised RuntimeError: element 0 of tensors does not require grad",
        id="ex2-loss-data",
    ),
    pytest.param(
        check_backward_three_times,
        three_global_loss,
        "Your function did not backpropagate through the loss it was given.",
        id="ex2-global-loss",
    ),
    pytest.param(check_backward_three_times, three_type_error, "Your function raised TypeError: ", id="ex2-type-error"),
    # torch warns that backward(create_graph=True) ties each parameter to its gradient: the answer's flaw.
    pytest.param(
        check_backward_three_times,
        three_create_graph,
        "weight.grad carries a graph of its own",
        id="ex2-create-graph",
        marks=pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning"),
    ),
    pytest.param(
        check_backward_three_times,
        make_three_with_a_global_counter,
        "On a second call, with a fresh loss and .grad holding the first call's result, your function "
        "did not backpropagate through the loss it was given.",
        id="ex2-counter-never-reset",
    ),
    pytest.param(
        check_backward_three_times, "backward_three_times", "Pass your function itself", id="ex2-not-a-function"
    ),
    pytest.param(
        check_backward_three_times,
        three_from_float,
        "Your function did not backpropagate through the loss it was given.",
        id="ex2-float-loss",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(
        check_backward_three_times,
        three_detached,
        "Your function did not backpropagate through the loss it was given.",
        id="ex2-detach-requires-grad",
    ),
    pytest.param(
        check_backward_three_times,
        three_retain_on_the_first_only,
        "Your function raised RuntimeError: Trying to backward through the graph a second time",
        id="ex2-retain-on-the-first-only",
    ),
    pytest.param(
        check_backward_three_times,
        three_thirds,
        "weight.grad is 1.00x one backward's gradient; three backward passes add 3x.",
        id="ex2-thirds",
    ),
    pytest.param(
        check_backward_three_times,
        three_create_graph_on_the_last,
        "weight.grad carries a graph of its own",
        id="ex2-create-graph-on-the-last",
        marks=pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning"),
    ),
    # exercise 3
    pytest.param(
        check_training_loop,
        loop(keep=lambda loss: loss, retain=True),
        "The history holds tensors that carry a grad_fn: each one keeps its whole graph",
        id="ex3-as-given",
    ),
    pytest.param(
        check_training_loop,
        loop(retain=True),
        "During your loop, graphs held up to 4.1 KiB of buffers at once, 2.0x what one batch's graph holds",
        id="ex3-retain-and-item",
    ),
    pytest.param(
        check_training_loop,
        loop(keep=lambda loss: loss),
        "The history holds tensors that carry a grad_fn",
        id="ex3-tensors-without-retain",
    ),
    pytest.param(
        check_training_loop,
        loop(keep=lambda loss: loss.detach().requires_grad_()),
        "tensors that require grad: they carry no graph, but NumPy and plotting refuse them",
        id="ex3-detach-requires-grad",
    ),
    pytest.param(
        check_training_loop,
        loop(keep=lambda loss: loss.item),
        "Each history item should be one number, such as loss.item().",
        id="ex3-item-not-called",
    ),
    pytest.param(
        check_training_loop,
        loop(zero="never"),
        "history[2] is not the loss the given loop records at batch 2.",
        id="ex3-never-zeroes",
    ),
    pytest.param(
        check_training_loop,
        loop(zero="after"),
        "On a second call (the model already trained, .grad already filled), history[1] is not the loss the given loop "
        "records at batch 1.",
        id="ex3-zeroes-after-the-step",
    ),
    pytest.param(
        check_training_loop,
        loop(stash=[], retain=True),
        "After your loop returned, graphs still hold",
        id="ex3-retained-graphs-kept-elsewhere",
    ),
    pytest.param(check_training_loop, loop_generator, "yours returned a generator", id="ex3-generator"),
    pytest.param(check_training_loop, loop_returns_a_tuple, "yours returned a tuple", id="ex3-tuple"),
    pytest.param(
        check_training_loop,
        loop_without_retain_raises,
        "Your loop raised RuntimeError: Trying to backward",
        id="ex3-raises",
    ),
    pytest.param(
        check_training_loop,
        lambda model, batches: [0.0] * len(batches),
        "history[0] is not the loss the given loop records at batch 0.",
        id="ex3-made-up-numbers",
    ),
    pytest.param(
        check_training_loop,
        loop_body(records_after_the_step),
        "history[0] is not the loss the given loop records at batch 0.",
        id="ex3-extra-forward-after-the-step",
    ),
    pytest.param(
        check_training_loop,
        loop_body(backward_of_a_float),
        "history[1] is not the loss the given loop records at batch 1.",
        id="ex3-backward-of-a-float",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(
        check_training_loop,
        loop_body(forward_twice),
        "During your loop, graphs held up to 4.1 KiB of buffers at once, 2.0x what one batch's graph holds: "
        "buffers of an earlier graph were still alive while another was built.",
        id="ex3-forward-twice",
    ),
    pytest.param(
        check_training_loop,
        loop_body(detach_before_the_loss),
        "Your loop raised RuntimeError: element 0 of tensors does not require grad",
        id="ex3-detach-too-early",
    ),
    pytest.param(
        check_training_loop,
        loop_body(two_steps),
        "history[1] is not the loss the given loop records at batch 1.",
        id="ex3-second-step",
    ),
    # A step on .grad cleared after its backward (issue 26): named so before the history it changes.
    *zeroed_wrong(check_training_loop, lambda clear: loop(between=clear), "ex3"),
    pytest.param(
        check_training_loop,
        loop(optimizer=lambda params, lr: torch.optim.SGD(params, lr, momentum=0.9)),
        "history[2] is not the loss the given loop records at batch 2.",
        id="ex3-momentum",
    ),
]

RIGHT = [
    pytest.param(check_predictions, SOLUTION_PREDICTIONS, id="ex1-solution"),
    pytest.param(check_backward_three_times, three_solution, id="ex2-solution"),
    pytest.param(check_backward_three_times, three_in_a_loop, id="ex2-loop"),
    pytest.param(check_predictions, REVERSED_PREDICTIONS, id="ex1-other-order"),
    pytest.param(check_predictions, collections.OrderedDict(SOLUTION_PREDICTIONS), id="ex1-ordered-dict"),
    pytest.param(check_predictions, types.MappingProxyType(SOLUTION_PREDICTIONS), id="ex1-read-only-mapping"),
    pytest.param(check_backward_three_times, three_autograd_backward, id="ex2-autograd-backward"),
    pytest.param(check_backward_three_times, three_through_clones, id="ex2-through-clones"),
    pytest.param(check_backward_three_times, three_ones_gradient, id="ex2-ones-gradient"),
    pytest.param(check_backward_three_times, three_with_a_local_counter, id="ex2-local-counter"),
    pytest.param(check_backward_three_times, three_plus_zero_data, id="ex2-plus-zero-data"),
    pytest.param(check_training_loop, loop(), id="ex3-solution"),
    # float(loss) keeps a number, as .item() does; torch 2.13 also warns that loss requires grad.
    pytest.param(
        check_training_loop,
        loop(keep=float),
        id="ex3-float",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.detach()), id="ex3-detach"),
    pytest.param(check_training_loop, loop(optimizer=False), id="ex3-hand-written-sgd"),
    pytest.param(check_training_loop, loop_body(retain_then_del), id="ex3-retain-then-del"),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.data), id="ex3-data"),
    pytest.param(check_training_loop, loop(keep=lambda loss: float(loss.data)), id="ex3-float-of-data"),
    pytest.param(check_training_loop, loop(keep=lambda loss: loss.tolist()), id="ex3-tolist"),
    pytest.param(check_training_loop, loop(zero="by hand"), id="ex3-grad-none-by-hand"),
    pytest.param(check_training_loop, loop(zero="to zeros"), id="ex3-zero-grad-to-zeros"),
]


test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(WRONG, RIGHT)


def test_detached_history_is_accepted_with_a_note_on_floats() -> None:
    result = check_training_loop(loop(keep=lambda loss: loss.detach()))
    assert result and "Detached tensors carry no graph" in result.message
    assert "Detached" not in check_training_loop(loop()).message
