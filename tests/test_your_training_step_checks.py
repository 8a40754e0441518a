"""Notebook 05's exercise check (predict the audit's verdicts) against a catalogue of answers a learner might give.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive part of it),
every right answer accepted; checking the same answer twice gives the same verdict and text and leaves the random
stream alone (tests/check_catalogue.py runs them). The check measures its answers with the audit on every call:
nothing here tells it the solution.
"""

from __future__ import annotations

from collections import OrderedDict, UserDict
from types import MappingProxyType

import pytest
import torch
from check_catalogue import catalogue_tests

from backward_twice.steps.audit import audit_retain_graph
from helpers.lessons.your_training_step import _exercise_steps, check_audit_predictions

SOLUTION = {"adversarial_step": "needed", "head_grad_step": "can go", "regularised_step": ("needed", "can go")}
AS_GIVEN = {"adversarial_step": ..., "head_grad_step": ..., "regularised_step": (..., ...)}


class AlwaysEqual(str):
    """A string that claims to equal everything: the check must compare texts, not trust ``==``."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class Fickle(UserDict):
    """A mapping that answers differently each time a key is read."""

    def __init__(self) -> None:
        super().__init__(SOLUTION)
        self.reads = 0

    def __getitem__(self, key):
        self.reads += 1
        return SOLUTION[key] if self.reads % 2 else "can go"


def solution_audit():
    model, opt, steps = _exercise_steps()
    return audit_retain_graph(steps["head_grad_step"], models=model, optimizers=opt)


WRONG = [
    pytest.param(
        AS_GIVEN, "Fill in 'needed' or 'can go' for: adversarial_step, head_grad_step, regularised_step.", id="as-given"
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": ...}, "Fill in 'needed' or 'can go' for: head_grad_step.", id="one-left"
    ),
    pytest.param(
        {"adversarial_step": "needed"},
        "Fill in 'needed' or 'can go' for: head_grad_step, regularised_step.",
        id="keys-missing",
    ),
    pytest.param(
        dict.fromkeys(SOLUTION, "needed") | {"regularised_step": ("needed", "needed")},
        "2 of 4 verdicts differ from the audit's: head_grad_step, regularised_step (retain 2 of 2).",
        id="all-needed",
    ),
    pytest.param(
        dict.fromkeys(SOLUTION, "can go") | {"regularised_step": ("can go", "can go")},
        "2 of 4 verdicts differ from the audit's: adversarial_step, regularised_step (retain 1 of 2).",
        id="all-can-go",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": "needed"},
        "1 of 4 verdicts differ from the audit's: head_grad_step.",
        id="head-grad-walks-the-trunk",
    ),
    pytest.param(
        {**SOLUTION, "regularised_step": ("can go", "can go")},
        "1 of 4 verdicts differ from the audit's: regularised_step (retain 1 of 2).",
        id="penalty-after-backward-is-a-new-graph",
    ),
    pytest.param(
        {**SOLUTION, "regularised_step": ("can go", "needed")},
        "2 of 4 verdicts differ from the audit's: regularised_step (retain 1 of 2), regularised_step (retain 2 of 2).",
        id="regularised-swapped",
    ),
    pytest.param(
        {**SOLUTION, "regularised_step": "needed"},
        "Regularised_step has 2 retain_graph=True: give 2 verdicts, in order, as a tuple, not 1.",
        id="one-verdict-for-two-retains",
    ),
    pytest.param(
        {**SOLUTION, "adversarial_step": ("needed", "can go")},
        "Adversarial_step has 1 retain_graph=True: give 1 verdict, not 2.",
        id="two-verdicts-for-one",
    ),
    pytest.param(
        {**SOLUTION, "adversarial_step": True},
        "Each verdict is the text 'needed' or 'can go'; adversarial_step has True.",
        id="a-bool",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": "not needed"},
        "Each verdict is the text 'needed' or 'can go'; head_grad_step has 'not needed'.",
        id="other-words",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": AlwaysEqual("anything")},
        "Each verdict is the text 'needed' or 'can go'; head_grad_step has 'anything'.",
        id="a-string-equal-to-everything",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": solution_audit()},
        "Each verdict is the text 'needed' or 'can go'; head_grad_step has a RetainAudit.",
        id="the-audit-itself",
    ),
    pytest.param(
        {**SOLUTION, "adversarial step": "needed"},
        "Unknown step name(s): adversarial step; the steps are adversarial_step, head_grad_step, regularised_step.",
        id="a-misspelt-name",
    ),
    pytest.param(list(SOLUTION.values()), "Give a dict of step name -> verdict, not list.", id="a-list"),
    pytest.param(solution_audit(), "Give a dict of step name -> verdict, not RetainAudit.", id="an-audit"),
    pytest.param(
        {**SOLUTION, "adversarial_step": "can go"},
        "1 of 4 verdicts differ from the audit's: adversarial_step.",
        id="adversarial-total-is-a-new-graph",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": "not a retain"},
        "Each verdict is the text 'needed' or 'can go'; head_grad_step has 'not a retain'.",
        id="the-audits-other-word",
    ),
    pytest.param(
        {**SOLUTION, "regularised_step": ("needed", None)},
        "Each verdict is the text 'needed' or 'can go'; regularised_step has None.",
        id="a-none",
    ),
    pytest.param(
        {**SOLUTION, "head_grad_step": "can_go"},
        "Each verdict is the text 'needed' or 'can go'; head_grad_step has 'can_go'.",
        id="an-underscore",
    ),
    pytest.param(
        {**SOLUTION, "regularised_step": {"needed", "can go"}},
        "Regularised_step has 2 retain_graph=True: give 2 verdicts, in order, as a tuple, not 1.",
        id="a-set-has-no-order",
    ),
    pytest.param(
        {**SOLUTION, "lm_step": "can go"},
        "Unknown step name(s): lm_step; the steps are adversarial_step, head_grad_step, regularised_step.",
        id="a-step-of-the-gallery",
    ),
]

RIGHT = [
    pytest.param(SOLUTION, id="solution"),
    pytest.param(
        {"adversarial_step": " Needed", "head_grad_step": "CAN GO", "regularised_step": ["needed", "can go"]},
        id="case-space-and-a-list",
    ),
    pytest.param(
        {"adversarial_step": ("needed",), "head_grad_step": ["can go"], "regularised_step": ("needed", "can go")},
        id="one-verdict-in-a-tuple",
    ),
    pytest.param(dict(reversed(list(SOLUTION.items()))), id="keys-in-another-order"),
    pytest.param(OrderedDict(SOLUTION), id="an-ordered-dict"),
    pytest.param(MappingProxyType(SOLUTION), id="a-read-only-mapping"),
    pytest.param({**SOLUTION, "adversarial_step": "needed\n", "head_grad_step": "\tcan go"}, id="tabs-and-newlines"),
]

test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(
    [pytest.param(check_audit_predictions, *p.values, id=p.id) for p in WRONG],
    [pytest.param(check_audit_predictions, *p.values, id=p.id) for p in RIGHT],
)


def test_a_mapping_is_read_once_per_step() -> None:
    answer = Fickle()
    result = check_audit_predictions(answer)
    assert result, repr(result)
    assert answer.reads == 3


def test_the_answers_are_measured_each_time(monkeypatch) -> None:
    """The check's truth is the audit's verdict now: change what the audit says, and the verdict follows."""
    import helpers.lessons.your_training_step as lesson

    def flipped(step, models=(), optimizers=()):
        audit = audit_retain_graph(step, models, optimizers)
        calls = [c.__class__(**{**vars(c), "needed": not c.needed}) if c.needed is not None else c for c in audit.calls]
        return audit.__class__(audit.error, calls, audit.error_line)

    monkeypatch.setattr(lesson, "audit_retain_graph", flipped)
    assert not check_audit_predictions(SOLUTION)
    assert check_audit_predictions(
        {"adversarial_step": "can go", "head_grad_step": "needed", "regularised_step": ("can go", "needed")}
    )


def test_the_check_leaves_the_callers_random_stream_alone() -> None:
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    check_audit_predictions(SOLUTION)
    assert torch.equal(torch.rand(2), expected)
