"""The tests every exercise-check catalogue (tests/test_graph_buffers_checks.py and test_multi_loss_checks.py) runs.

A wrong answer is rejected with a message holding the expected text, a right one accepted; checking
an answer twice gives the same verdict and text, and checking leaves the caller's random stream where
it was. Answers that keep state between calls come as a factory named ``make_...``, so that every
check gets a fresh one.
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
