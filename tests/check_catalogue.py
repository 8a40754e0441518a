"""The tests every exercise-check catalogue (tests/test_graph_buffers_checks.py and test_multi_loss_checks.py) runs.

A wrong answer is rejected with a message holding the expected text, a right one accepted; checking
an answer twice gives the same verdict and text, and checking leaves the caller's random stream where
it was. Answers that keep state between calls come as a factory named ``make_...``, so that every
check gets a fresh one.

:data:`ZEROED_WAYS` are four ways to clear ``.grad`` between a backward and the optimizer step that should
follow it, each a function of ``(optimizer, model)``: every catalogue of an exercise that checks a training
loop puts each one into its solution and expects :data:`ZEROED` (the step ran on zeroed gradients, so the
weights never changed, and where ``zero_grad()`` belongs).
"""

from __future__ import annotations

import pytest
import torch


def fresh(answer):
    return answer() if getattr(answer, "__name__", "").startswith("make_") else answer


def verdict(check, answer):
    """Check an answer twice: same verdict and text both times, and the random stream left alone."""
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    first = check(fresh(answer))
    assert torch.equal(torch.rand(3), expected_draw), "the check moved the caller's random stream"
    second = check(fresh(answer))
    assert (bool(second), repr(second)) == (bool(first), repr(first))
    return first


def catalogue_tests(wrong, right):
    """The two parametrized tests of a catalogue: bind them to test_* names in the catalogue module."""

    @pytest.mark.parametrize(("check", "answer", "expected"), wrong)
    def test_wrong_answer_is_rejected_for_its_true_reason(check, answer, expected) -> None:
        result = verdict(check, answer)
        assert not result
        assert expected in repr(result), repr(result)

    @pytest.mark.parametrize(("check", "answer"), right)
    def test_right_answer_is_accepted(check, answer) -> None:
        result = verdict(check, answer)
        assert result, repr(result)
        assert repr(result).startswith("✓ Correct.")

    return test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted


def zero_grad_between(optimizer, model):
    optimizer.zero_grad()


def grads_set_to_none(optimizer, model):
    for p in model.parameters():
        p.grad = None


def model_zero_grad(optimizer, model):
    model.zero_grad()


def clip_and_zero(optimizer, model):
    """A clipping helper that also zeroes .grad, to zeros, 'to be safe'."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.zero_grad(set_to_none=False)


ZEROED_WAYS = {
    "zero-grad-between-backward-and-step": zero_grad_between,
    "grads-set-to-none-before-the-step": grads_set_to_none,
    "model-zero-grad-between-backward-and-step": model_zero_grad,
    "clipping-helper-that-zeroes": clip_and_zero,
}
ZEROED = (
    "ran on zeroed gradients: .grad was cleared (a zero_grad(), or .grad = None) after the backward that filled it "
    "and before the step, so the weights never changed; call zero_grad() before the backward or after the step, "
    "never between them."
)


def zeroed_wrong(check, answer_clearing, prefix):
    """One wrong answer per way in :data:`ZEROED_WAYS`: ``answer_clearing(clear)`` is the exercise's solution that
    calls ``clear(optimizer, model)`` between its backward and its step."""
    return [
        pytest.param(check, answer_clearing(clear), ZEROED, id=f"{prefix}-{name}")
        for name, clear in ZEROED_WAYS.items()
    ]
