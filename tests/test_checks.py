"""The exercise checks' mechanics: predictions against autograd, errors of any type, figures from shapes.

The catalogues of right and wrong answers per notebook are in test_graph_buffers_checks.py and
test_multi_loss_checks.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backward_twice.common.units import format_bytes
from helpers.lessons.graph_buffers import (
    SECOND_BACKWARD_QUESTIONS,
    check_backward_three_times,
    check_predictions,
    check_training_loop,
)
from helpers.lessons.multi_loss import check_backward_both, check_two_loss_loop


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
        loss = eval(expression, {"torch": torch}, {"x": x, "w": w})
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


# -- what every check of a learner's function shares ---------------------------------------------

FUNCTION_CHECKS = [check_backward_three_times, check_training_loop, check_two_loss_loop, check_backward_both]


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ZeroDivisionError("division by zero"), "raised ZeroDivisionError: division by zero"),
        (KeyError("lr"), "raised KeyError: 'lr'"),
        (ValueError(), "raised ValueError."),
        (RuntimeError("x" * 200), "raised RuntimeError: " + "x" * 90 + "..."),
    ],
    ids=["short", "key", "empty", "long"],
)
@pytest.mark.parametrize("check", FUNCTION_CHECKS)
def test_an_exception_of_any_type_is_the_verdict_with_its_own_first_line(check, error, shown) -> None:
    def answer(*args):
        raise error

    result = check(answer)
    assert not result
    assert result.message.endswith(shown)


@pytest.mark.parametrize("check", FUNCTION_CHECKS)
def test_a_result_instead_of_a_function_is_refused(check) -> None:
    result = check([0.5, 0.25])
    assert not result and "Pass your function itself" in result.message


# -- exercise 2: what counts as a backward pass ------------------------------------------------------


def test_three_passes_through_an_expression_of_loss_count_as_three() -> None:
    def answer(loss):
        for i in range(3):
            (loss * 1).backward(retain_graph=i < 2)

    assert check_backward_three_times(answer)


# -- exercise 3: figures against ground truth from shapes ------------------------------------------


def _train_retaining(model, batches):
    history = []
    for batch in batches:
        model.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        history.append(loss.item())
    return history


def test_training_loop_peak_is_two_graphs_counted_from_the_shapes() -> None:
    # One graph of the check's model (batch 16, hidden 32) keeps Tanh's output and the output that
    # pow saves; parameters and inputs stay alive anyway. Retaining keeps the previous graph alive
    # until `loss` is reassigned, which happens after the next forward has built its own.
    one_graph = 16 * 32 * 4 + 16 * 1 * 4
    result = check_training_loop(_train_retaining)
    assert not result
    expected = f"up to {format_bytes(2 * one_graph)} of buffers at once, 2.0x what one batch's graph holds"
    assert expected in result.message


@pytest.mark.parametrize(
    "keep",
    [lambda loss: np.float32(loss.item()), lambda loss: loss.detach().reshape(1)],
    ids=["numpy-float", "one-element-tensor"],
)
def test_training_loop_accepts_any_real_number_or_graphless_one_element_tensor(keep) -> None:
    def train(model, batches):
        return [keep(loss) for loss in _losses_of_fixed_loop(model, batches)]

    assert check_training_loop(train)


def _losses_of_fixed_loop(model, batches):
    for batch in batches:
        model.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        yield loss
