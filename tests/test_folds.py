"""backward_twice/record/folds.py: a long run's older plain iterations are folded into counts, so a watch's memory stays
bounded, and the verdicts read from the counts are the verdicts read from every record.

Each loop below runs a few hundred iterations (folding starts past 128) with something happening in the middle: a
graph kept from iteration 201 and walked in iteration 451, a retain only iteration 451 needs. Its truth is
established by construction and by a bare run (remove the retain and run: it raises where the verdict says it is
needed); the watch must say the same with folding as with every record kept, and keep a bounded number of records.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable

import pytest
import torch

import backward_twice.record.folds
from backward_twice.record.folds import KEEP_FIRST, KEEP_LAST, CallLog, Folder
from backward_twice.record.passes import PassStart
from backward_twice.record.walks import CallRecord
from backward_twice.watcher import watch

Loop = Callable[[int], None]


def _parts() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(6, 4)


def _side() -> torch.Tensor:
    """A leaf no optimizer steps: a graph of it kept for 250 iterations is still valid to walk."""
    return torch.randn(4, requires_grad=True)


def steady(passes: int) -> None:
    model, optimizer, x = _parts()
    for _ in range(passes):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def two_losses(passes: int) -> None:
    model, optimizer, x = _parts()
    for _ in range(passes):
        optimizer.zero_grad()
        out = model(x)
        first, second = out.pow(2).mean(), out.abs().mean()
        first.backward(retain_graph=True)
        second.backward()
        optimizer.step()


def needless_retain(passes: int) -> None:
    model, optimizer, x = _parts()
    for _ in range(passes):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward(retain_graph=True)
        optimizer.step()


def kept_from_201(passes: int) -> None:
    model, optimizer, x = _parts()
    side = _side()
    anchor = None
    for i in range(passes):
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        if i == 200:
            anchor = (x @ side).tanh().sum()
        if i == 450 and anchor is not None:
            loss = loss + anchor
        loss.backward()
        optimizer.step()


def freed_in_201(passes: int) -> None:
    model, optimizer, x = _parts()
    side = _side()
    saved = None
    for i in range(passes):
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        if i == 200:
            saved = (x @ side).tanh().sum()
            loss = loss + saved
        loss.backward()
        if i == 450 and saved is not None:
            saved.backward()
        optimizer.step()


def retain_for_451(passes: int, retain: bool = True) -> None:
    model, optimizer, x = _parts()
    side = _side()
    kept = None
    for i in range(passes):
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        if i == 200:
            extra = (x @ side).tanh().sum()
            extra.backward(retain_graph=retain)
            kept = extra
        if i == 450 and kept is not None:
            kept.backward()
        optimizer.step()


def uneven(passes: int) -> None:
    model, optimizer, x = _parts()
    for i in range(passes):
        optimizer.zero_grad()
        out = model(x)
        for _ in range(i % 3):  # a different number of nodes in each iteration
            out = out.tanh()
        out.pow(2).mean().backward()
        optimizer.step()


def _framework(body: Callable[[int], None], passes: int) -> None:
    """Run ``body(i)`` for each iteration from a loop in no code of the learner's, as a framework's ``fit`` does: no
    loop of theirs encloses the backward calls, and the optimizer steps split the run."""
    collections.deque(map(body, range(passes)), maxlen=0)


def steady_by_steps(passes: int) -> None:
    model, optimizer, x = _parts()

    def step(i: int) -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    _framework(step, passes)


def critic_by_steps(passes: int) -> None:
    """Two critic steps, then the generator's: the generator's optimizer (whose first step came last) closes each
    iteration."""
    model, optimizer, x = _parts()
    critic = torch.nn.Linear(1, 1)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=0.01)

    def step(i: int) -> None:
        for _ in range(2):
            critic_optimizer.zero_grad()
            critic(model(x).detach()).mean().backward()
            critic_optimizer.step()
        optimizer.zero_grad()
        critic(model(x)).mean().backward()
        optimizer.step()

    _framework(step, passes)


def retain_for_451_by_steps(passes: int) -> None:
    model, optimizer, x = _parts()
    side = _side()
    kept: list[torch.Tensor] = []

    def step(i: int) -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        if i == 200:
            extra = (x @ side).tanh().sum()
            extra.backward(retain_graph=True)
            kept.append(extra)
        if i == 450:
            kept[0].backward()
        optimizer.step()

    _framework(step, passes)


def _watched(loop: Loop, passes: int, fold: bool, monkeypatch: pytest.MonkeyPatch, **options: int) -> watch:
    with monkeypatch.context() as patch:
        if not fold:
            patch.setattr(backward_twice.record.folds, "_BATCH", 10**9)
        with watch(**options) as w, contextlib.suppress(RuntimeError):  # the loop's own error: the verdict says it
            loop(passes)
        w.report  # noqa: B018  # judged here, with the patch still in place
    return w


BY_STEPS = [steady_by_steps, critic_by_steps, retain_for_451_by_steps]
LONG_LOOPS = [steady, two_losses, needless_retain, kept_from_201, freed_in_201, retain_for_451, uneven, *BY_STEPS]


@pytest.mark.parametrize("loop", LONG_LOOPS, ids=lambda f: f.__name__)
def test_a_long_run_is_judged_the_same_with_its_middle_folded(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    folded, whole = (_watched(loop, 600, fold, monkeypatch) for fold in (True, False))
    assert str(folded) == str(whole)
    assert folded.to_json() == whole.to_json()
    assert folded.recorder.calls.kept < whole.recorder.calls.kept  # something was folded


@pytest.mark.parametrize("loop", [steady, two_losses, uneven], ids=lambda f: f.__name__)
def test_the_records_a_steady_loop_keeps_do_not_grow_with_the_run(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    short, long = (_watched(loop, passes, True, monkeypatch) for passes in (400, 1600))
    per_iteration = 2 if loop is two_losses else 1
    budget = (KEEP_FIRST + KEEP_LAST + 64) * per_iteration + 20
    assert short.recorder.calls.kept <= budget and long.recorder.calls.kept <= budget
    assert len(long.recorder.calls) == 1600 * per_iteration  # every call is counted
    passes = long.recorder.loop.iteration_passes()
    if loop is not uneven:  # an iteration whose node count differs keeps its pass start: "built in iteration N"
        # stays exact (and the passes where the names were read: log2 of them)
        assert len(passes) <= KEEP_FIRST + KEEP_LAST + 64 + 16
    assert len(long.recorder.steps) <= budget
    assert str(long).startswith("backward-twice: ") and "1600 iterations watched" in str(long)


@pytest.mark.parametrize("loop", [steady_by_steps, critic_by_steps], ids=lambda f: f.__name__)
def test_a_run_the_steps_split_keeps_counts_not_records(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework's loop (no loop of the learner's encloses the backward): its older iterations are folded too,
    so the calls and steps kept do not grow with the run."""
    short, long = (_watched(loop, passes, True, monkeypatch) for passes in (400, 1600))
    per_iteration = 3 if loop is critic_by_steps else 1
    budget = (KEEP_FIRST + KEEP_LAST + 64) * per_iteration + 20
    for w in (short, long):
        assert w.recorder.loop.unusable is not None  # split by the steps, not by a loop
        assert w.recorder.calls.kept <= budget and len(w.recorder.steps) <= budget
        assert len(w.recorder.event_sightings) <= 2
    assert long.recorder.calls.kept <= short.recorder.calls.kept
    assert len(long.recorder.calls) == 1600 * per_iteration and long.recorder.iterations_done() == 1600
    assert "1600 iterations watched" in str(long)


def test_the_truths_of_the_middle_events_are_the_bare_runs() -> None:
    """What the loops do, without the tool: a retain only iteration 451 needs (without it, iteration 451 raises);
    a graph freed in iteration 201 raises when iteration 451 walks it; two losses need their retain."""
    retain_for_451(600)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        retain_for_451(600, retain=False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        freed_in_201(600)
    kept_from_201(600)  # the kept graph was never walked before: nothing raises


def test_the_middle_events_are_named_with_their_iterations(monkeypatch: pytest.MonkeyPatch) -> None:
    late = _watched(retain_for_451, 600, True, monkeypatch).verdicts
    [line] = late.lines
    assert line.verdict == "goes with the carried fix" and (line.runs, line.needed_runs) == (1, 1)
    assert "in iteration 451" in line.why and "kept.backward()" in line.why
    framework = _watched(retain_for_451_by_steps, 600, True, monkeypatch)  # the steps split it: folded all the same
    [line] = framework.verdicts.lines
    assert line.verdict == "goes with the carried fix" and (line.runs, line.needed_runs) == (1, 1)
    assert "in iteration 451" in line.why and framework.recorder.calls.kept < 200
    freed = _watched(freed_in_201, 600, True, monkeypatch).verdicts
    assert freed.error is not None and freed.error.iteration == 451
    assert "freed by the backward at " in freed.error.evidence and "in iteration 201" in freed.error.evidence
    carried = _watched(kept_from_201, 600, True, monkeypatch).verdicts
    [finding] = carried.carried
    assert finding.name == "anchor" and finding.iteration == 201 and finding.reached_from == 451
    needed = _watched(two_losses, 600, True, monkeypatch).verdicts
    assert [(v.verdict, v.runs, v.needed_runs) for v in needed.lines] == [("needed", 600, 600)]


def test_a_stop_after_n_iterations_counts_the_folded_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []

    def counted(passes: int) -> None:
        model, optimizer, x = _parts()
        for i in range(passes):
            ran.append(i)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()

    w = _watched(counted, 2000, True, monkeypatch, iterations=700)
    assert len(ran) == 700 and w.verdicts.iterations_run == 700 and w.verdicts.stopped_after == 700
    assert w.recorder.calls.kept < 300


def test_a_folded_call_still_reads_its_line_and_a_late_need_counts_with_its_line() -> None:
    log = CallLog()
    passes = []
    for iteration in range(1, 301):
        passes.append(PassStart(iteration * 10, len(log), number=iteration))
        for site in (("a.py", 1), ("a.py", 2)):
            call = CallRecord(len(log), site, f"a.py:{site[1]}: x", "backward", site[1] == 1, False, 0, 0)
            call.needed_by = [len(log) + 1] if site[1] == 1 else ()
            log.append(call)
    passes.append(PassStart(3010, len(log), number=301))
    folder = Folder()
    assert folder.due(passes)
    folder.fold(log, passes)
    assert log.kept < len(log) == 600
    assert [p.number for p in passes][: KEEP_FIRST + 1] == list(range(1, KEEP_FIRST + 2))
    folded = log.folds[0]
    assert folded.first == KEEP_FIRST + 1 and len(folded.pattern) == 2
    stand_in = log[folded.calls + 3]
    assert stand_in.line == "a.py:2: x" and stand_in.site == ("a.py", 2)
    tally = log.retains[("a.py", 1)]
    assert tally.runs == tally.needed == tally.needed_here == folded.iterations
    log.needed_later(folded.calls + 2, 599)
    log.needed_later(folded.calls + 2, 599)  # the same call once
    assert tally.needed == folded.iterations + 1 and tally.needer_later == 599
    with pytest.raises(IndexError):
        log[600]
