"""expect_error: shows the expected error, and fails when it stops happening or changes."""

from __future__ import annotations

import pytest
import torch

from helpers.errors import ExpectedError, expect_error


def _backward_twice() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    loss.backward()


def test_expected_error_is_caught_recorded_and_printed(capsys):
    with expect_error(RuntimeError, match="backward through the graph a second time") as caught:
        _backward_twice()
    assert isinstance(caught, ExpectedError)
    assert caught.type_name == "RuntimeError"
    assert "retain_graph=True" in caught.message
    assert isinstance(caught.exception, RuntimeError)
    out = capsys.readouterr().out
    assert "RuntimeError" in out
    assert "backward through the graph a second time" in out.replace("\n  ", " ")


def test_subclass_of_the_expected_type_counts_and_show_false_prints_nothing(capsys):
    with expect_error(LookupError, show=False) as caught:
        {}["missing"]
    assert caught.type_name == "KeyError"
    assert capsys.readouterr().out == ""


def test_long_messages_are_wrapped(capsys):
    with expect_error(ValueError, width=30):
        raise ValueError("word " * 40)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 3
    assert all(len(line) <= 30 for line in lines[1:])


def test_no_error_is_an_assertion_error():
    with pytest.raises(AssertionError, match="ran without error"), expect_error(RuntimeError):
        pass


def test_error_of_another_type_is_reraised_with_a_note():
    with pytest.raises(KeyError) as info, expect_error(RuntimeError, match="second time"):
        raise KeyError("other")
    notes = getattr(info.value, "__notes__", [])
    assert any("expected RuntimeError" in note and "KeyError" in note for note in notes)


def test_message_that_does_not_match_is_reraised_with_a_note(capsys):
    with (
        pytest.raises(RuntimeError, match="something else") as info,
        expect_error(RuntimeError, match="backward through the graph"),
    ):
        raise RuntimeError("something else")
    notes = getattr(info.value, "__notes__", [])
    assert any("did not match" in note for note in notes)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("not_an_exception", [int, "RuntimeError", RuntimeError("x"), None])
def test_non_exception_class_is_a_type_error(not_an_exception):
    ran = []
    with pytest.raises(TypeError, match="exception class"), expect_error(not_an_exception):
        ran.append(True)
    assert not ran


def test_match_must_be_a_string():
    ran = []
    with pytest.raises(TypeError, match="regular expression"), expect_error(RuntimeError, match=42):
        ran.append(True)
    assert not ran


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Trying to backward through the graph a second time (or ...", "backward a second time"),
        (
            "one of the variables needed for gradient computation has been modified by an inplace operation",
            "in-place version error",
        ),
        ("element 0 of tensors does not require grad and does not have a grad_fn", "no graph"),
        (
            "This backward function was compiled with non-empty donated buffers which requires create_graph=False "
            "and retain_graph=False.",
            "donated buffers",
        ),
        ("Expected to mark a variable ready only once. This error is caused by ...", "DDP ready only once"),
        ("Your training graph has changed in this iteration, e.g., one parameter is used twice", "DDP ready only once"),
        ("Encountered gradient which is undefined, but still allreduced by DDP reducer.", "DDP ready only once"),
        ("CUDA out of memory", "other"),
    ],
)
def test_error_kind_names_the_errors_the_course_is_about(message, kind):
    from backward_twice.common.error_kinds import error_kind

    assert error_kind(message) == kind


def test_every_kind_has_a_fix_and_a_real_donated_buffer_error_is_named():
    """Each kind the course names has a fix in the verdicts, and torch.compile's real message (CPU, aot_eager:
    no C++ compiler) is the donated-buffers kind, so a change in torch's wording fails here."""
    import torch

    from backward_twice.common.error_kinds import ERROR_KINDS, error_kind
    from backward_twice.judge.verdicts import ERROR_FIXES

    assert {kind for kind, _ in ERROR_KINDS} | {"other"} == set(ERROR_FIXES)
    torch._dynamo.reset()
    compiled = torch.compile(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)), backend="aot_eager"
    )
    x = torch.randn(4, 8)
    compiled(x).sum().backward()
    with pytest.raises(RuntimeError) as caught:
        compiled(x).sum().backward(retain_graph=True)
    torch._dynamo.reset()
    assert error_kind(str(caught.value)) == "donated buffers"


def test_the_in_place_fix_never_advises_moving_the_step():
    """Notebook 03 measures the moved optimizer step as silently wrong: the fix says so instead of advising it."""
    from backward_twice.judge.verdicts import ERROR_FIXES

    fix = ERROR_FIXES["in-place version error"]
    assert "compute the forward again" in fix and "old weights" in fix


def test_both_wordings_of_the_version_check_are_the_in_place_kind():
    """PyTorch words its version check two ways; the second (a saved output of a multi-output view, here
    ``unbind``'s) has no "modified by an inplace operation". Both real messages are the in-place kind."""
    import torch

    from backward_twice.common.error_kinds import error_kind

    messages = []
    w = torch.randn(2, 3, requires_grad=True)
    y = w * 1  # a non-leaf, so it may be changed in place
    first, _second = y.unbind(0)
    loss = first.sin().sum()  # sin saves its input: the view
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError) as caught:
        loss.backward()
    messages.append(str(caught.value))
    h = torch.randn(3, requires_grad=True)
    z = h.exp()
    z.add_(1)
    with pytest.raises(RuntimeError) as caught:
        z.sum().backward()
    messages.append(str(caught.value))
    assert "modified by an inplace operation" not in messages[0] and "its base" in messages[0]
    assert [error_kind(m) for m in messages] == ["in-place version error", "in-place version error"]
