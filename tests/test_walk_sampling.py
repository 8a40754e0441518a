"""backward_twice/record/walks.py's WalkSampling, through the recorder: past the loop's first passes a plain line's
walks are read at its first 4 calls, then its 8th, 16th, ... (reading one costs as much as a third of a small model's
backward); a run with a retaining call, and a line that once reached back, are read at every call; and an error at a
call whose walk was not read keeps its evidence; every published loop of the gallery gets the same report with every
walk read. Each truth is the loop's own (it raises, or it does not) or the report with no walk left unread."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import pytest
import torch
from gallery import LOOPS
from test_recorder import rnn_steps

from backward_twice.judge.verdicts import judge
from backward_twice.record import walks
from backward_twice.record.recorder import Recorder
from backward_twice.watcher import watch


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The index of each call whose walk the recorder read, in order."""
    read: list[int] = []
    original = walks.read_walk

    def counted(outputs, look):  # type: ignore[no-untyped-def]
        read.append(len(read))
        return original(outputs, look)

    monkeypatch.setattr(walks, "read_walk", counted)
    return read


def _plain_loop(recorder: Recorder, passes: int, retain: bool = False) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with recorder:
        for _ in range(passes):
            optimizer.zero_grad()
            loss = model(torch.randn(5, 4)).pow(2).mean()
            loss.backward(retain_graph=retain)
            optimizer.step()


def test_a_plain_lines_walks_are_read_at_its_first_four_calls_then_at_powers_of_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = _reads(monkeypatch)
    recorder = Recorder()
    _plain_loop(recorder, 40)
    assert len(recorder.calls) == 40
    assert len(read) == 7  # calls 1-4, 8, 16, 32
    assert judge(recorder).iterations_run == 40  # every pass is still an iteration
    assert not judge(recorder).carried and judge(recorder).error is None


def test_a_run_with_a_retaining_call_is_read_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    read = _reads(monkeypatch)
    _plain_loop(Recorder(), 20, retain=True)
    assert len(read) == 20  # a later call may walk what one kept: that is when its retain was needed


def test_the_truth_of_the_late_carry_loop_is_an_error_at_the_pass_after_the_detaching_ones() -> None:
    rnn_steps(contextlib.nullcontext(), 10, detached=9)  # pass 10 is the first to carry its state on: it runs
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        rnn_steps(contextlib.nullcontext(), 11, detached=9)  # pass 11 walks pass 10's freed graph


def test_an_error_at_a_call_not_read_names_the_call_that_freed_its_buffers_and_the_carrier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = _reads(monkeypatch)
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="second time"):
        rnn_steps(recorder, 30, detached=9)
    assert len(recorder.calls) == 11 and len(read) == 5  # calls 1-4 and 8: not 10, which freed what 11 needs
    assert not recorder.calls[9].read and not recorder.calls[10].read
    verdicts = judge(recorder)
    error = verdicts.error
    assert (error.kind, error.iteration) == ("backward a second time", 11)
    assert "freed by the backward at" in error.evidence and "in iteration 10" in error.evidence
    assert error.evidence.endswith("through hidden")
    [carried] = verdicts.carried
    assert (carried.iteration, carried.reached_from) == (10, 11) and error.carried  # the carried fix is the error's
    # the names were not read at pass 11: the failing call's own read names the carrier
    assert carried.name == "hidden" and "hidden = cell(torch.randn(1, 4), hidden)" in carried.built_at
    assert "hidden = hidden.detach()" in carried.fix


def test_a_line_whose_read_walk_reached_back_is_read_at_every_call_after() -> None:
    """A carried graph with no saved tensor raises nothing: the 8th call's walk shows it, and every call after is
    read."""
    torch.manual_seed(0)
    weight = torch.randn(3, requires_grad=True)
    recorder = Recorder()
    total = torch.zeros(3)
    with recorder:
        for step in range(12):
            if step == 6:
                total = torch.zeros(3)  # from here the total is carried on (adds save no tensor: no error)
            total = total + weight if step >= 6 else weight * 1.0
            total.sum().backward()
    assert len(recorder.calls) == 12
    assert [c.read for c in recorder.calls] == [True] * 4 + [False] * 3 + [True] * 5
    assert recorder.calls[7].old  # the 8th call walked the 7th pass's graph
    assert judge(recorder).carried


def _kept_aside(recorder: Recorder, passes: int) -> None:
    """Pass 11 adds a side term to its loss and keeps it; pass 20 calls backward on the kept term again."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, side = torch.randn(5, 4), torch.randn(4, 4, requires_grad=True)
    saved = None
    with recorder:
        for step in range(passes):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            if step == 10:
                saved = (x @ side).tanh().sum()
                loss = loss + saved
            loss.backward()
            if step == 19 and saved is not None:
                saved.backward()
            optimizer.step()


def test_a_call_whose_iteration_built_a_graph_of_another_shape_is_read_and_names_what_freed_it_later() -> None:
    _kept_aside(Recorder(), 19)  # the truth: without pass 20's second backward, nothing raises
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="second time"):
        _kept_aside(recorder, 30)
    assert [recorder.calls[i].read for i in range(8, 13)] == [
        False,
        False,
        True,
        True,
        False,
    ]  # 11: another shape; 12: back
    error = judge(recorder).error
    assert error.iteration == 20 and "saved.backward()" in error.line
    assert "freed by the backward at" in error.evidence and "loss.backward() in iteration 11" in error.evidence


def _published(name: str) -> bool:
    return not hasattr(importlib.import_module(f"gallery.{name}"), "FRAMEWORK")


@pytest.mark.parametrize("name", [name for name in LOOPS if _published(name)])
def test_every_gallery_loop_is_judged_the_same_with_walks_read_at_some_calls(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same report, evidence included, as with every walk read, over 40 passes (12 at least for a loop that
    raises): the calls not read change no verdict."""
    module = importlib.import_module(f"gallery.{name}")
    iterations = 40 if module.TRUTH["error"] is None else max(module.ITERATIONS, 12)
    reports = []
    for sampled in (True, False):
        if not sampled:
            monkeypatch.setattr(walks.WalkSampling, "_due", lambda self, call, built: True)
        state = module.build()
        with contextlib.suppress(Exception), contextlib.redirect_stdout(None), watch() as w:
            module.run(state, iterations)
        reports.append((str(w), w.to_json()))
    assert reports[0] == reports[1]


def test_a_name_rebound_from_itself_is_told_from_one_each_pass_builds_afresh(tmp_path: Any) -> None:
    from backward_twice.judge.built import rebinds_from_itself
    from backward_twice.record.names import CodeSite, NamedGraph

    script = tmp_path / "train.py"
    script.write_text(
        "for x, y in data:\n"
        "    hidden = cell(x, hidden)\n"
        "    h, c = lstm(x, (h, c))\n"
        "    total += loss\n"
        "    loss = criterion(out, y)\n"
        "    out = model(x)\n"
        "    self.hidden = self.rnn(x, self.hidden)\n"
        "    state[0] = cell(x, state[0])\n"
        "    buffers['h'], *rest = step(buffers['h'])\n"
        "    self.memory = self.encoder(x)\n"
        "    state[1] = cell(x, state[0])\n"
    )
    site = CodeSite(str(script), 1, "<module>")

    def rebinds(name: str) -> bool:
        return rebinds_from_itself(NamedGraph(name, site, True, 0, 0))

    assert [rebinds(n) for n in ("hidden", "h", "c", "total")] == [True] * 4
    assert [rebinds(n) for n in ("self.hidden", "state[0]", "buffers['h']")] == [True] * 3
    assert [rebinds(n) for n in ("loss", "out", "model.hidden", "self.memory", "state[1]", "hidden.data")] == [
        False
    ] * 6


class _Trainer:
    """The late carry kept on an object: ``self.hidden``, detached in the first ``detached`` passes only."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.cell = torch.nn.RNNCell(4, 8)
        self.optimizer = torch.optim.SGD(self.cell.parameters(), lr=0.1)
        self.hidden = torch.zeros(1, 8)

    def train(self, watch: contextlib.AbstractContextManager[Any], iterations: int, detached: int) -> None:
        with watch:
            for step in range(iterations):
                self.hidden = self.cell(torch.randn(1, 4), self.hidden)
                loss = self.hidden.pow(2).sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                if step < detached:
                    self.hidden = self.hidden.detach()


def test_a_late_carry_kept_on_an_object_is_named_where_the_names_were_not_read() -> None:
    _Trainer().train(contextlib.nullcontext(), 10, detached=9)  # the truth: pass 10 runs, pass 11 raises
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _Trainer().train(contextlib.nullcontext(), 11, detached=9)
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="second time"):
        _Trainer().train(recorder, 30, detached=9)
    verdicts = judge(recorder)
    assert verdicts.error is not None and verdicts.error.evidence.endswith("through self.hidden")
    [carried] = verdicts.carried
    assert (carried.name, carried.iteration, carried.reached_from) == ("self.hidden", 10, 11)
    assert "self.hidden = self.cell(torch.randn(1, 4), self.hidden)" in carried.built_at
    assert "self.hidden = self.hidden.detach()" in carried.fix
