"""Notebook 04's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive part of
it), every right answer accepted, and checking the same answer twice gives the same verdict and text,
leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from check_catalogue import catalogue_tests, verdict, zeroed_wrong

from helpers.lessons.carried_state import check_carried_names, check_precomputed_fix, check_truncated_bptt


def chunk_loss(model, h, inputs, targets):  # the notebook's own
    logits, h = model(inputs, h)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), h


# -- exercise 2: truncated BPTT ----------------------------------------------------------------------


def bptt(cut=lambda h: h.detach(), retain=False, zero="before backward", carry=True, cut_after=False, between=None):
    """The solution's loop with one thing changed; ``between(optimizer, model)`` runs between backward and step."""

    def train_truncated(model, optimizer, batches, h):
        start = h
        for inputs, targets in batches:
            if not cut_after:
                h = cut(h) if carry else torch.zeros_like(start)
            if zero == "before backward":
                optimizer.zero_grad()
            loss, h = chunk_loss(model, h, inputs, targets)
            loss.backward(retain_graph=retain)
            if between is not None:
                between(optimizer, model)
            optimizer.step()
            if zero == "after step":
                optimizer.zero_grad()
            if cut_after:
                h = cut(h)

    return train_truncated


def detach_in_place(h):
    return h.detach_() if h.grad_fn is not None else h


def bptt_detach_in_the_call(model, optimizer, batches, h):
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss, h = chunk_loss(model, h.detach(), inputs, targets)
        loss.backward()
        optimizer.step()


def bptt_two_steps(model, optimizer, batches, h):
    for inputs, targets in batches:
        h = h.detach()
        optimizer.zero_grad()
        loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.step()


def bptt_no_grad(model, optimizer, batches, h):
    for inputs, targets in batches:
        optimizer.zero_grad()
        with torch.no_grad():
            loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        optimizer.step()


def bptt_shaped(
    before_backward=lambda loss: None,
    before_step=lambda model, loss, h: h,
    after_step=lambda loss: None,
    backward=lambda loss: loss.backward(),
    log_forward=None,
):
    """The solution's loop with something added at one of its places (each hook returns what it changes)."""

    def train_truncated(model, optimizer, batches, h):
        for inputs, targets in batches:
            h = h.detach()
            if log_forward is not None:
                log_forward(model, h, inputs, targets)
            optimizer.zero_grad()
            loss, h = chunk_loss(model, h, inputs, targets)
            before_backward(loss)
            backward(loss)
            h = before_step(model, loss, h)
            optimizer.step()
            after_step(loss)

    return train_truncated


def bptt_retain_then_del(model, optimizer, batches, h):  # retains, then drops every reference before the step
    for inputs, targets in batches:
        loss, h = chunk_loss(model, h, inputs, targets)
        optimizer.zero_grad()
        loss.backward(retain_graph=True)
        del loss
        h = h.detach()
        optimizer.step()


def bptt_logging(keep, retain=False):
    """The solution's loop, keeping ``keep(loss)`` in a list for a log."""

    def train_truncated(model, optimizer, batches, h):
        log = []
        for inputs, targets in batches:
            h = h.detach()
            optimizer.zero_grad()
            loss, h = chunk_loss(model, h, inputs, targets)
            loss.backward(retain_graph=retain)
            log.append(keep(loss))
            optimizer.step()

    return train_truncated


def bptt_running_total(model, optimizer, batches, h):
    total = 0.0
    for inputs, targets in batches:
        h = h.detach()
        optimizer.zero_grad()
        loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        total = total + loss  # a tensor, for a log
        optimizer.step()


def bptt_step_every_other_batch(model, optimizer, batches, h):
    optimizer.zero_grad()
    for index, (inputs, targets) in enumerate(batches):
        h = h.detach()
        loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        if index % 2:
            optimizer.step()
            optimizer.zero_grad()


def bptt_h_from_the_stepped_model(model, optimizer, batches, h):
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss, _ = chunk_loss(model, h, inputs, targets)
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # a second forward, with the new weights, for the next h
            _, h = chunk_loss(model, h, inputs, targets)


def bptt_requires_grad_off(model, optimizer, batches, h):
    for inputs, targets in batches:
        h.requires_grad_(False)
        optimizer.zero_grad()
        loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        optimizer.step()


def bptt_logged_forward_kept(model, optimizer, batches, h):
    for inputs, targets in batches:
        h = h.detach()
        _logged, _ = chunk_loss(model, h, inputs, targets)  # for a log, with a graph, alive until the next batch
        optimizer.zero_grad()
        loss, h = chunk_loss(model, h, inputs, targets)
        loss.backward()
        optimizer.step()


def clip(max_norm):
    return lambda model, loss, h: (torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), h)[1]


def forward_for_a_log(under_no_grad):
    def log_forward(model, h, inputs, targets):
        with torch.no_grad() if under_no_grad else contextlib.nullcontext():
            chunk_loss(model, h, inputs, targets)

    return log_forward


# -- exercise 3: the tensor computed before the loop ---------------------------------------------------


def as_given(model, optimizer, inputs, labels, steps):  # the exercise cell
    features = model.encoder(inputs)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model.head(features), labels)
        loss.backward()
        optimizer.step()


def classifier(features_inside=True, detach=False, retain=False, whole_model=False, between=None):
    """The solution's loop with one thing changed; ``between(optimizer, model)`` runs between backward and step."""

    def train_classifier(model, optimizer, inputs, labels, steps):
        if not features_inside:
            features = model.encoder(inputs)
            if detach:
                features = features.detach()
        for _ in range(steps):
            optimizer.zero_grad()
            if whole_model:
                logits = model.head(model.encoder(inputs))
            else:
                if features_inside:
                    features = model.encoder(inputs)
                logits = model.head(features)
            loss = F.cross_entropy(logits, labels)
            loss.backward(retain_graph=retain)
            if between is not None:
                between(optimizer, model)
            optimizer.step()

    return train_classifier


def classifier_under_no_grad(model, optimizer, inputs, labels, steps):
    with torch.no_grad():
        features = model.encoder(inputs)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model.head(features), labels).backward()
        optimizer.step()


def classifier_no_zero_grad(model, optimizer, inputs, labels, steps):
    for _ in range(steps):
        F.cross_entropy(model.head(model.encoder(inputs)), labels).backward()
        optimizer.step()


def classifier_retain_then_del(model, optimizer, inputs, labels, steps):
    for _ in range(steps):
        features = model.encoder(inputs)
        optimizer.zero_grad()
        loss = F.cross_entropy(model.head(features), labels)
        loss.backward(retain_graph=True)
        del loss, features  # nothing holds the retained graph any more
        optimizer.step()


def classifier_logging(keep):
    """The solution's loop, keeping ``keep(loss)`` in a list for a log."""

    def train_classifier(model, optimizer, inputs, labels, steps):
        log = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = F.cross_entropy(model.head(model.encoder(inputs)), labels)
            loss.backward()
            log.append(keep(loss))
            optimizer.step()

    return train_classifier


def classifier_two_forwards(model, optimizer, inputs, labels, steps):
    for _ in range(steps):
        with torch.no_grad():
            accuracy = (model(inputs).argmax(1) == labels).float().mean()  # for a log  # noqa: F841
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()


def classifier_clipped(model, optimizer, inputs, labels, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model.head(model.encoder(inputs)), labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.38)
        optimizer.step()


def classifier_features_under_no_grad(model, optimizer, inputs, labels, steps):
    for _ in range(steps):
        with torch.no_grad():
            features = model.encoder(inputs)
        optimizer.zero_grad()
        F.cross_entropy(model.head(features), labels).backward()
        optimizer.step()


def classifier_features_made_a_leaf(model, optimizer, inputs, labels, steps):
    features = model.encoder(inputs).detach().requires_grad_()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model.head(features), labels).backward()
        optimizer.step()


WRONG = [
    pytest.param(
        check_truncated_bptt, bptt(cut=lambda h: h), "backward through the graph a second time", id="ex2-no-detach"
    ),
    pytest.param(
        check_truncated_bptt,
        bptt(cut=lambda h: h, retain=True),
        "modified by an inplace",
        id="ex2-retain-instead-of-detach",
    ),
    pytest.param(check_truncated_bptt, bptt(retain=True), "retain_graph=True keeps them", id="ex2-detach-and-retain"),
    pytest.param(check_truncated_bptt, bptt(zero="never"), "never zeroes .grad", id="ex2-no-zero-grad"),
    pytest.param(
        check_truncated_bptt, bptt(zero="after step"), "zeroes .grad only after its step", id="ex2-zero-after-step"
    ),
    pytest.param(check_truncated_bptt, bptt(carry=False), "starts each batch from h = zeros", id="ex2-h-from-zeros"),
    pytest.param(check_truncated_bptt, bptt_two_steps, "optimizer.step() ran 8 times", id="ex2-two-steps"),
    pytest.param(check_truncated_bptt, bptt_no_grad, "does not require grad", id="ex2-forward-under-no-grad"),
    pytest.param(check_precomputed_fix, as_given, "backward through the graph a second time", id="ex3-as-given"),
    pytest.param(
        check_precomputed_fix,
        classifier(features_inside=False, retain=True),
        "through the features computed once",
        id="ex3-retain",
    ),
    pytest.param(
        check_precomputed_fix,
        classifier(features_inside=False, detach=True),
        "model.encoder never trains",
        id="ex3-detach-once",
    ),
    pytest.param(check_precomputed_fix, classifier_under_no_grad, "model.encoder never trains", id="ex3-no-grad-once"),
    pytest.param(
        check_precomputed_fix, classifier(retain=True), "retain_graph=True keeps them", id="ex3-inside-but-retain"
    ),
    # A list of loss tensors keeps every graph's nodes, as notebook 02's check says of its history.
    pytest.param(
        check_truncated_bptt,
        bptt_logging(lambda loss: loss),
        "the graph of an earlier batch's loss was still alive",
        id="ex2-list-of-loss-tensors",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_running_total,
        "the graph of an earlier batch's loss was still alive",
        id="ex2-running-total-tensor",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_logging(lambda loss: loss, retain=True),
        "retain_graph=True keeps them",
        id="ex2-list-of-losses-retained",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_step_every_other_batch,
        "optimizer.step() ran 2 times",
        id="ex2-step-every-other-batch",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_h_from_the_stepped_model,
        "parameters differ from those of the right",
        id="ex2-h-recomputed-after-the-step",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_requires_grad_off,
        "raised RuntimeError: you can only change",
        id="ex2-requires-grad-off",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_shaped(backward=lambda loss: (loss * 0.5).backward()),
        "parameters differ from those of the right",
        id="ex2-half-the-loss-is-not-clipping",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_logged_forward_kept,
        "a graph no backward went through (a second forward",
        id="ex2-second-forward-kept-with-its-graph",
    ),
    pytest.param(
        check_precomputed_fix,
        classifier_logging(lambda loss: loss),
        "the graph of an earlier step's loss was still alive",
        id="ex3-list-of-loss-tensors",
    ),
    pytest.param(
        check_precomputed_fix,
        classifier_features_under_no_grad,
        "model.encoder never trains",
        id="ex3-features-under-no-grad",
    ),
    pytest.param(
        check_precomputed_fix,
        classifier_features_made_a_leaf,
        "model.encoder never trains",
        id="ex3-features-made-a-leaf",
    ),
    pytest.param(check_precomputed_fix, classifier_no_zero_grad, "never zeroes .grad", id="ex3-no-zero-grad"),
    # A step on gradients cleared after their backward: the weights never change (issue 26), not "you also clip".
    *zeroed_wrong(check_truncated_bptt, lambda clear: bptt(between=clear), "ex2"),
    *zeroed_wrong(check_precomputed_fix, lambda clear: classifier(between=clear), "ex3"),
]

RIGHT = [
    pytest.param(check_truncated_bptt, bptt(), id="ex2-solution"),
    pytest.param(check_truncated_bptt, bptt_detach_in_the_call, id="ex2-detach-in-the-call"),
    pytest.param(check_truncated_bptt, bptt(cut_after=True), id="ex2-detach-after-step"),
    pytest.param(check_truncated_bptt, bptt(cut=lambda h: h.data), id="ex2-h-data"),
    pytest.param(check_truncated_bptt, bptt(cut=detach_in_place), id="ex2-detach-in-place"),
    pytest.param(check_precomputed_fix, classifier(), id="ex3-solution"),
    pytest.param(check_precomputed_fix, classifier(whole_model=True), id="ex3-whole-model"),
    pytest.param(check_truncated_bptt, bptt_retain_then_del, id="ex2-retain-then-del-before-the-step"),
    pytest.param(
        check_truncated_bptt,
        bptt_shaped(log_forward=forward_for_a_log(under_no_grad=True)),
        id="ex2-second-forward-for-a-log",
    ),
    pytest.param(
        check_truncated_bptt,
        bptt_shaped(log_forward=forward_for_a_log(under_no_grad=False)),
        id="ex2-second-forward-with-a-graph",
    ),
    pytest.param(check_truncated_bptt, bptt_shaped(before_step=clip(0.45)), id="ex2-clip-grad-norm"),
    pytest.param(check_truncated_bptt, bptt_shaped(before_step=clip(0.25)), id="ex2-clip-grad-norm-every-step"),
    pytest.param(check_truncated_bptt, bptt_shaped(before_step=clip(5.0)), id="ex2-clip-that-never-acts"),
    pytest.param(check_truncated_bptt, bptt_logging(lambda loss: loss.item()), id="ex2-losses-as-numbers"),
    pytest.param(
        check_truncated_bptt,
        bptt_shaped(before_step=lambda model, loss, h: h.detach()),
        id="ex2-detach-between-backward-and-step",
    ),
    pytest.param(check_precomputed_fix, classifier_retain_then_del, id="ex3-retain-then-del"),
    pytest.param(check_precomputed_fix, classifier_two_forwards, id="ex3-second-forward-for-a-log"),
    pytest.param(check_precomputed_fix, classifier_clipped, id="ex3-clip-grad-norm"),
    pytest.param(check_precomputed_fix, classifier_logging(lambda loss: loss.item()), id="ex3-losses-as-numbers"),
]

test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(WRONG, RIGHT)

NOTES = {
    "retained": "retain_graph=True was not needed",
    "runs": "gives the same parameters, so the others only add their cost",
    "clipped": "You also clip the gradient's norm",
    "data": "prefer .detach(): a tensor taken with .data has a version counter of its own",
}


@pytest.mark.parametrize(
    ("check", "answer", "notes"),
    [
        pytest.param(check_truncated_bptt, bptt(), set(), id="ex2-solution"),
        pytest.param(check_truncated_bptt, bptt_retain_then_del, {"retained"}, id="ex2-retain-then-del"),
        pytest.param(check_truncated_bptt, bptt(cut=lambda h: h.data), {"data"}, id="ex2-h-data"),
        pytest.param(
            check_truncated_bptt,
            bptt_shaped(log_forward=forward_for_a_log(under_no_grad=True)),
            {"runs"},
            id="ex2-second-forward",
        ),
        pytest.param(check_truncated_bptt, bptt_shaped(before_step=clip(0.45)), {"clipped"}, id="ex2-clipped"),
        pytest.param(check_truncated_bptt, bptt_shaped(before_step=clip(5.0)), set(), id="ex2-clip-that-never-acts"),
        pytest.param(check_precomputed_fix, classifier(), set(), id="ex3-solution"),
        pytest.param(check_precomputed_fix, classifier_retain_then_del, {"retained"}, id="ex3-retain-then-del"),
        pytest.param(check_precomputed_fix, classifier_two_forwards, {"runs"}, id="ex3-second-forward"),
        pytest.param(check_precomputed_fix, classifier_clipped, {"clipped"}, id="ex3-clipped"),
    ],
)
def test_an_accepted_loop_is_told_what_it_does_beyond_the_solution(check, answer, notes) -> None:
    """Each note an accepted loop gets is about what that loop did, and the solution gets none."""
    text = repr(verdict(check, answer))
    assert text.startswith("✓ Correct."), text
    assert {key for key, phrase in NOTES.items() if phrase in text} == notes, text


# -- exercise 1: name the carried tensor -------------------------------------------------------------

lstm, lstm_head = torch.nn.LSTMCell(4, 6), torch.nn.Linear(6, 1)
lstm_optimizer = torch.optim.SGD([*lstm.parameters(), *lstm_head.parameters()], lr=0.1)
state = (torch.zeros(2, 6), torch.zeros(2, 6))


def carries_state():
    global state
    lstm_optimizer.zero_grad()
    state = lstm(torch.randn(2, 4), state)
    lstm_head(state[0]).pow(2).mean().backward()
    lstm_optimizer.step()


class Remembers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.memory = torch.nn.Linear(4, 4), torch.zeros(1, 4)

    def forward(self, x):
        self.memory = torch.tanh(self.layer(x) + self.memory)
        return self.memory


remembers = Remembers()
remembers_optimizer = torch.optim.SGD(remembers.parameters(), lr=0.1)


def carries_memory():
    remembers_optimizer.zero_grad()
    remembers(torch.randn(1, 4)).pow(2).mean().backward()
    remembers_optimizer.step()


linear = torch.nn.Linear(4, 1)
scale = linear.weight.norm()
linear_optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)


def carries_scale():
    linear_optimizer.zero_grad()
    (linear(torch.randn(3, 4)) / scale).pow(2).mean().backward()
    linear_optimizer.step()


clean_h = torch.zeros(2, 6)
cell = torch.nn.RNNCell(4, 6)
cell_optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)


def carries_nothing():
    global clean_h
    cell_optimizer.zero_grad()
    clean_h = cell(torch.randn(2, 4), clean_h.detach())
    clean_h.pow(2).mean().backward()
    cell_optimizer.step()


RIGHT_NAMES = {carries_state: "state", carries_memory: "memory", carries_scale: "scale", carries_nothing: None}


def test_the_right_names_are_accepted_and_the_models_put_back() -> None:
    before = [p.detach().clone() for p in lstm.parameters()]
    result = check_carried_names(RIGHT_NAMES)
    assert result, repr(result)
    assert all(torch.equal(a, b) for a, b in zip(before, lstm.parameters()))
    assert state[0].grad_fn is None, "the check left the snippet's state carrying a graph"
    for other in ({**RIGHT_NAMES, carries_memory: "self.memory"}, {**RIGHT_NAMES, carries_memory: "remembers.memory"}):
        assert check_carried_names(other), other


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({**RIGHT_NAMES, carries_state: "loss"}, "carries_state: not loss."),
        ({**RIGHT_NAMES, carries_nothing: "clean_h"}, "carries_nothing: nothing carries a graph"),
        ({**RIGHT_NAMES, carries_scale: None}, "carries_scale: something does carry a graph"),
        ({carries_state: 3}, "answer with a name as a string, or None"),
        ({"carries_state": "state"}, "The keys must be the snippet functions themselves"),
        ([("state", 1)], "Pass a dict"),
    ],
)
def test_wrong_names_are_rejected_for_their_true_reason(answers, expected) -> None:
    result = check_carried_names(answers)
    assert not result
    assert expected in repr(result), repr(result)


# The finder spells an item of a tuple state(0); Python spells it state[0]: both name the carrier.
NAMES_RIGHT = [
    pytest.param(check_carried_names, {**RIGHT_NAMES, carries_state: "state[0]"}, id="ex1-state[0]"),
    pytest.param(check_carried_names, {**RIGHT_NAMES, carries_state: "state[1]"}, id="ex1-state[1]"),
    pytest.param(check_carried_names, {**RIGHT_NAMES, carries_state: "state(1)"}, id="ex1-the-finder's-spelling"),
    pytest.param(check_carried_names, {**RIGHT_NAMES, carries_state: " state[0] "}, id="ex1-spaces"),
    pytest.param(check_carried_names, {**RIGHT_NAMES, carries_memory: "remembers.memory"}, id="ex1-module-attribute"),
]
NAMES_WRONG = [
    pytest.param(
        check_carried_names,
        {**RIGHT_NAMES, carries_state: "state[2]"},
        "carries_state: not state[2].",
        id="ex1-no-such-item",
    ),
    pytest.param(
        check_carried_names, {**RIGHT_NAMES, carries_state: "h"}, "carries_state: not h.", id="ex1-h-for-an-lstm"
    ),
    pytest.param(
        check_carried_names, {**RIGHT_NAMES, carries_state: "lstm"}, "carries_state: not lstm.", id="ex1-the-module"
    ),
    pytest.param(
        check_carried_names,
        {**RIGHT_NAMES, carries_scale: "linear.weight"},
        "carries_scale: not linear.weight.",
        id="ex1-the-parameter-it-came-from",
    ),
]

test_wrong_name_is_rejected_for_its_true_reason, test_right_name_is_accepted = catalogue_tests(NAMES_WRONG, NAMES_RIGHT)


def test_the_names_check_gives_the_same_verdict_twice() -> None:
    assert repr(verdict(check_carried_names, {**RIGHT_NAMES, carries_scale: "linear"})).count("not linear") == 1
