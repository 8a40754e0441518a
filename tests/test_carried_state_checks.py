"""Notebook 04's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive part of
it), every right answer accepted, and checking the same answer twice gives the same verdict and text,
leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from check_catalogue import catalogue_tests, verdict
from helpers.lessons.carried_state import check_carried_names, check_precomputed_fix, check_truncated_bptt


def chunk_loss(model, h, inputs, targets):  # the notebook's own
    logits, h = model(inputs, h)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), h


# -- exercise 2: truncated BPTT ----------------------------------------------------------------------


def bptt(cut=lambda h: h.detach(), retain=False, zero="before backward", carry=True, cut_after=False):
    def train_truncated(model, optimizer, batches, h):
        start = h
        for inputs, targets in batches:
            if not cut_after:
                h = cut(h) if carry else torch.zeros_like(start)
            if zero == "before backward":
                optimizer.zero_grad()
            loss, h = chunk_loss(model, h, inputs, targets)
            loss.backward(retain_graph=retain)
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


# -- exercise 3: the tensor computed before the loop ---------------------------------------------------


def as_given(model, optimizer, inputs, labels, steps):  # the exercise cell
    features = model.encoder(inputs)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model.head(features), labels)
        loss.backward()
        optimizer.step()


def classifier(features_inside=True, detach=False, retain=False, whole_model=False):
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
            optimizer.step()
    return train_classifier


def classifier_under_no_grad(model, optimizer, inputs, labels, steps):
    with torch.no_grad():
        features = model.encoder(inputs)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model.head(features), labels).backward()
        optimizer.step()


WRONG = [
    pytest.param(check_truncated_bptt, bptt(cut=lambda h: h), "backward through the graph a second time",
                 id="ex2-no-detach"),
    pytest.param(check_truncated_bptt, bptt(cut=lambda h: h, retain=True), "modified by an inplace",
                 id="ex2-retain-instead-of-detach"),
    pytest.param(check_truncated_bptt, bptt(retain=True), "retain_graph=True keeps them", id="ex2-detach-and-retain"),
    pytest.param(check_truncated_bptt, bptt(zero="never"), "never zeroes .grad", id="ex2-no-zero-grad"),
    pytest.param(check_truncated_bptt, bptt(zero="after step"), "zeroes .grad only after its step",
                 id="ex2-zero-after-step"),
    pytest.param(check_truncated_bptt, bptt(carry=False), "starts each batch from h = zeros", id="ex2-h-from-zeros"),
    pytest.param(check_truncated_bptt, bptt_two_steps, "optimizer.step() ran 8 times", id="ex2-two-steps"),
    pytest.param(check_truncated_bptt, bptt_no_grad, "does not require grad", id="ex2-forward-under-no-grad"),
    pytest.param(check_precomputed_fix, as_given, "backward through the graph a second time", id="ex3-as-given"),
    pytest.param(check_precomputed_fix, classifier(features_inside=False, retain=True),
                 "through the features computed once", id="ex3-retain"),
    pytest.param(check_precomputed_fix, classifier(features_inside=False, detach=True), "model.encoder never trains",
                 id="ex3-detach-once"),
    pytest.param(check_precomputed_fix, classifier_under_no_grad, "model.encoder never trains",
                 id="ex3-no-grad-once"),
    pytest.param(check_precomputed_fix, classifier(retain=True), "retain_graph=True keeps them",
                 id="ex3-inside-but-retain"),
]

RIGHT = [
    pytest.param(check_truncated_bptt, bptt(), id="ex2-solution"),
    pytest.param(check_truncated_bptt, bptt_detach_in_the_call, id="ex2-detach-in-the-call"),
    pytest.param(check_truncated_bptt, bptt(cut_after=True), id="ex2-detach-after-step"),
    pytest.param(check_truncated_bptt, bptt(cut=lambda h: h.data), id="ex2-h-data"),
    pytest.param(check_truncated_bptt, bptt(cut=detach_in_place), id="ex2-detach-in-place"),
    pytest.param(check_precomputed_fix, classifier(), id="ex3-solution"),
    pytest.param(check_precomputed_fix, classifier(whole_model=True), id="ex3-whole-model"),
]

test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(WRONG, RIGHT)


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


@pytest.mark.parametrize(("answers", "expected"), [
    ({**RIGHT_NAMES, carries_state: "loss"}, "carries_state: not loss."),
    ({**RIGHT_NAMES, carries_nothing: "clean_h"}, "carries_nothing: nothing carries a graph"),
    ({**RIGHT_NAMES, carries_scale: None}, "carries_scale: something does carry a graph"),
    ({carries_state: 3}, "answer with a name as a string, or None"),
    ({"carries_state": "state"}, "The keys must be the snippet functions themselves"),
    ([("state", 1)], "Pass a dict"),
])
def test_wrong_names_are_rejected_for_their_true_reason(answers, expected) -> None:
    result = check_carried_names(answers)
    assert not result
    assert expected in repr(result), repr(result)


def test_the_names_check_gives_the_same_verdict_twice() -> None:
    assert repr(verdict(check_carried_names, {**RIGHT_NAMES, carries_scale: "linear"})).count("not linear") == 1
