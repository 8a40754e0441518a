"""helpers/watcher.py: ``with watch() as w:`` around a loop as the learner wrote it; ``w`` as text, HTML and JSON."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.watcher import watch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def test_watch_stops_after_n_iterations_quietly_and_says_so() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ran = 0
    with watch(iterations=2) as w:
        for _ in range(100):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).pow(2).mean().backward()
            optimizer.step()
            ran += 1
    assert ran == 2  # the block ended at the top of the third pass: the second ran whole
    assert w.verdicts.iterations_run == 2 and w.healthy
    text = str(w)
    assert (
        text.startswith("Watched 2 iterations (one per pass of your loop at test_watch.py:")
        and "then stopped as asked" in text
    )
    assert "Healthy" in text and "Healthy" in w._repr_html_()


def test_the_loops_own_error_goes_on_up_and_w_names_it_with_the_fix() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hidden = torch.zeros(3, 1)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        for _ in range(3):
            hidden = model(torch.randn(3, 4)) + hidden
            optimizer.zero_grad()
            hidden.pow(2).mean().backward()
            optimizer.step()
    text = str(w)
    assert "Error (backward a second time) in iteration 2" in text
    assert "hidden = hidden.detach()" in text and "Graphs carried into a later iteration" in text
    report = w.to_json()
    json.dumps(report)
    assert report["error"]["kind"] == "backward a second time" and report["error"]["iteration"] == 2
    assert [c["variable"] for c in report["carried"]] == ["hidden"]
    assert "<ol>" in w._repr_html_() and "hidden" in w._repr_html_()


def test_a_hand_written_update_marks_its_iterations_and_per_line_verdicts_come_out_as_json() -> None:
    torch.manual_seed(0)
    weight = torch.randn(4, 1, requires_grad=True)
    with watch() as w:
        for _ in range(3):
            out = torch.randn(5, 4) @ weight
            out.pow(2).mean().backward(retain_graph=True)
            with torch.no_grad():
                weight -= 0.1 * weight.grad
                weight.grad = None
            w.next_iteration()
    report = w.to_json()
    assert report["iterations"] == 3 and report["split"].endswith("for _ in range(3):")  # the loop, not the marks
    [line] = report["lines"]
    assert (line["verdict"], line["runs"], line["needed_runs"]) == ("can go", 3, 0)
    assert "remove retain_graph=True" in str(w)


def test_iterations_must_be_a_positive_whole_number() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="iterations must be a whole number"):
            watch(iterations=bad)
