"""The exercise checks: right answers pass, specific wrong answers fail with the reason."""

from __future__ import annotations

import pytest
import torch

from helpers.checks import (
    SECOND_BACKWARD_QUESTIONS,
    check_backward_both,
    check_backward_three_times,
    check_predictions,
    check_training_loop,
    check_two_loss_loop,
)


def _verdict(result, capsys) -> tuple[bool, str]:
    """(passed, what the learner sees): the result's own text plus anything printed."""
    printed = capsys.readouterr().out
    shown = "" if isinstance(result, bool) else repr(result)
    return bool(result), printed + shown


# -- exercise 1: predictions -------------------------------------------------------------------

def _right_predictions() -> dict[str, bool]:
    """Evaluate each expression's own text here and try a second backward."""
    answers = {}
    for expression in SECOND_BACKWARD_QUESTIONS:
        x = torch.arange(1.0, 7.0, requires_grad=True)
        w = torch.full((6,), 0.5, requires_grad=True)
        loss = eval(expression, {"torch": torch}, {"x": x, "w": w})  # noqa: S307 - fixed question text
        loss.backward()
        try:
            loss.backward()
        except RuntimeError:
            answers[expression] = False
        else:
            answers[expression] = True
    return answers


def test_predictions_right(capsys):
    answers = _right_predictions()
    assert set(answers.values()) == {True, False}  # the exercise has both kinds
    passed, text = _verdict(check_predictions(answers), capsys)
    assert passed
    assert "Correct" in text


def test_predictions_one_wrong_names_it(capsys):
    answers = _right_predictions()
    flipped = next(iter(answers))
    answers[flipped] = not answers[flipped]
    passed, text = _verdict(check_predictions(answers), capsys)
    assert not passed
    assert "1 of" in text and flipped in text
    assert not any(e in text for e in answers if e != flipped)


def test_predictions_missing_or_ellipsis(capsys):
    answers = _right_predictions()
    left_out = "(x * 2).sum()"
    del answers[left_out]
    passed, text = _verdict(check_predictions(answers), capsys)
    assert not passed and "Fill in" in text and left_out in text

    with_ellipsis = {**_right_predictions(), "x.mean()": ...}
    passed, text = _verdict(check_predictions(with_ellipsis), capsys)
    assert not passed and "x.mean()" in text


def test_predictions_not_a_dict(capsys):
    passed, text = _verdict(check_predictions([True, False]), capsys)
    assert not passed and "dict" in text


# -- exercise 2: backward three times ------------------------------------------------------------

def test_three_times_right_answer(capsys):
    def answer(loss):
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        loss.backward()

    passed, text = _verdict(check_backward_three_times(answer), capsys)
    assert passed and "Correct" in text


def test_three_times_retain_on_every_call_leaves_buffers(capsys):
    def answer(loss):
        for _ in range(3):
            loss.backward(retain_graph=True)

    passed, text = _verdict(check_backward_three_times(answer), capsys)
    assert not passed
    assert "still holds" in text and "buffers" in text


def test_three_times_without_retain_raises(capsys):
    def answer(loss):
        loss.backward()
        loss.backward()
        loss.backward()

    passed, text = _verdict(check_backward_three_times(answer), capsys)
    assert not passed
    assert "raised" in text and "second time" in text


def test_three_times_only_two_calls(capsys):
    def answer(loss):
        loss.backward(retain_graph=True)
        loss.backward()

    passed, text = _verdict(check_backward_three_times(answer), capsys)
    assert not passed
    assert "2.00x" in text and "not 3x" in text


def test_three_times_no_backward_or_not_a_function(capsys):
    passed, text = _verdict(check_backward_three_times(lambda loss: None), capsys)
    assert not passed and "None" in text
    passed, text = _verdict(check_backward_three_times(None), capsys)
    assert not passed and "function" in text


# -- exercise 3: training loop ---------------------------------------------------------------

def _loop(keep, retain: bool):
    def train(model, batches):
        history = []
        for batch in batches:
            model.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward(retain_graph=retain)
            with torch.no_grad():  # plain SGD (torch.optim's first import costs seconds)
                for p in model.parameters():
                    p -= 0.1 * p.grad
            history.append(keep(loss))
        return history

    return train


def test_training_loop_leaky(capsys):
    passed, text = _verdict(check_training_loop(_loop(lambda loss: loss, retain=True)), capsys)
    assert not passed
    assert "tensors" in text and "item()" in text


def test_training_loop_item(capsys):
    passed, text = _verdict(check_training_loop(_loop(lambda loss: loss.item(), retain=False)), capsys)
    assert passed and "Correct" in text


def test_training_loop_graphs_kept_elsewhere(capsys):
    stash = []

    def keep(loss):
        stash.append(loss)  # a retained graph kept alive outside the history
        return loss.item()

    passed, text = _verdict(check_training_loop(_loop(keep, retain=True)), capsys)
    assert not passed and "still hold" in text


@pytest.mark.parametrize(
    ("train", "words"),
    [
        (lambda model, batches: [], "one loss per batch"),
        (lambda model, batches: [1] * len(batches), "float"),
        (None, "function"),
    ],
)
def test_training_loop_wrong_shapes(capsys, train, words):
    passed, text = _verdict(check_training_loop(train), capsys)
    assert not passed and words in text


def test_training_loop_that_raises(capsys):
    def train(model, batches):
        loss = model(batches[0]).pow(2).mean()
        loss.backward()
        loss.backward()
        return [loss.item()] * len(batches)

    passed, text = _verdict(check_training_loop(train), capsys)
    assert not passed and "raised" in text


# -- notebook 02, exercise 1: a two-loss loop ----------------------------------------------------

def _losses(net, x, labels, targets):
    logits, value = net(x)
    return torch.nn.functional.cross_entropy(logits, labels), torch.nn.functional.mse_loss(value, targets)


def test_two_loss_loop_as_given_fails_because_it_keeps_tensors(capsys) -> None:
    def train(net, batches):
        history = []
        for x, labels, targets in batches:
            l1, l2 = _losses(net, x, labels, targets)
            l1.backward(retain_graph=True)
            l2.backward(retain_graph=True)
            history.append(l1 + l2)
        return history

    passed, shown = _verdict(check_two_loss_loop(train), capsys)
    assert not passed and "holds tensors" in shown


def test_two_loss_loop_that_still_retains_on_the_last_backward_fails(capsys) -> None:
    def train(net, batches):
        history, kept = [], []
        for x, labels, targets in batches:
            l1, l2 = _losses(net, x, labels, targets)
            l1.backward(retain_graph=True)
            l2.backward(retain_graph=True)
            kept.append(l1)  # a graph that stays reachable after the loop returns
            history.append(l1.item() + l2.item())
        train.kept = kept
        return history

    passed, shown = _verdict(check_two_loss_loop(train), capsys)
    assert not passed and "still hold" in shown


def test_two_loss_loop_with_wrong_gradients_fails(capsys) -> None:
    def train(net, batches):
        history = []
        for x, labels, targets in batches:
            l1, _ = _losses(net, x, labels, targets)
            l1.backward()
            history.append(l1.item())
        return history

    passed, shown = _verdict(check_two_loss_loop(train), capsys)
    assert not passed and "differs from the gradient of l1 + l2" in shown


def test_two_loss_loop_fixed_passes(capsys) -> None:
    def train(net, batches):
        history = []
        for x, labels, targets in batches:
            l1, l2 = _losses(net, x, labels, targets)
            (l1 + l2).backward()
            history.append(l1.item() + l2.item())
        return history

    passed, shown = _verdict(check_two_loss_loop(train), capsys)
    assert passed, shown


def test_two_loss_loop_without_retain_raises_and_says_why(capsys) -> None:
    def train(net, batches):
        for x, labels, targets in batches:
            l1, l2 = _losses(net, x, labels, targets)
            l1.backward()
            l2.backward()
        return []

    passed, shown = _verdict(check_two_loss_loop(train), capsys)
    assert not passed and "raised" in shown


# -- notebook 02, exercise 2: least memory --------------------------------------------------------

def test_backward_both_retaining_passes_gradients_but_leaves_the_first_head_behind(capsys) -> None:
    def retain_then_backward(l1, l2):
        l1.backward(retain_graph=True)
        l2.backward()

    passed, shown = _verdict(check_backward_both(retain_then_backward), capsys)
    assert not passed and "holds" in shown and "its own path" not in shown


@pytest.mark.parametrize("answer", [
    lambda l1, l2: (l1 + l2).backward(),
    lambda l1, l2: torch.autograd.backward([l1, l2]),
], ids=["sum", "two roots"])
def test_backward_both_single_pass_answers_pass(answer, capsys) -> None:
    passed, shown = _verdict(check_backward_both(answer), capsys)
    assert passed, shown


def test_backward_both_wrong_or_leaky_answers_fail(capsys) -> None:
    passed, shown = _verdict(check_backward_both(lambda l1, l2: l1.backward()), capsys)
    assert not passed and "differs" in shown
    passed, shown = _verdict(check_backward_both(lambda l1, l2: (l1 + l2).backward(retain_graph=True)), capsys)
    assert not passed and "holds" in shown
    passed, shown = _verdict(check_backward_both("not a function"), capsys)
    assert not passed and "function itself" in shown


def test_checks_leave_the_global_random_stream_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_two_loss_loop(lambda net, batches: [])
    assert torch.equal(torch.rand(3), expected)
