"""backward_twice/record/recorder.py and backward_twice/judge/verdicts.py: what the recorder sees while a loop runs as
written, and the verdicts judged from it (retains per line, carried graphs, notes, errors with their evidence)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

import pytest
import torch
from torch.autograd import grad as imported_grad

from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.judge.stored import as_the_line_names_it
from backward_twice.judge.verdicts import judge
from backward_twice.record import events
from backward_twice.record.events import OptimizerKeys
from backward_twice.record.recorder import SECOND_TIME, Recorder, StopRecording
from backward_twice.record.saved import graph_only_bytes, python_walk


def _mlp(width: int = 8) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def test_every_entry_point_is_seen_once_with_its_line_and_flags() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    with Recorder() as recorder:
        x.exp().sum().backward()
        torch.autograd.backward(x.sin().sum(), retain_graph=True)
        torch.autograd.grad(x.pow(3).sum(), x, create_graph=True)
        imported_grad(x.cos().sum(), [x])  # a name imported before the recorder started
        y = x.tanh().sum()
        y.backward(inputs=[x])
    calls = recorder.calls
    assert [c.function for c in calls] == ["backward", "backward", "grad", "grad", "backward"]
    assert [c.retain_graph for c in calls] == [False, True, True, False, False]  # create_graph implies it
    assert [c.create_graph for c in calls] == [False, False, True, False, False]
    assert calls[4].inputs == 1 and calls[0].inputs == 0
    assert "x.exp().sum().backward()" in calls[0].line and "test_recorder.py:" in calls[0].line
    assert "imported_grad(x.cos().sum(), [x])" in calls[3].line
    assert all(c.walked >= 1 for c in calls)
    # the torch functions are put back
    assert torch.autograd._engine_run_backward is torch.autograd.graph._engine_run_backward


def test_what_a_backward_walks_respects_inputs() -> None:
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    with Recorder() as recorder:
        torch.autograd.grad((a.exp() * b.sin()).sum(), [b])
    assert recorder.calls[0].walked == 3  # Sum, Mul, Sin: the engine's own list, not Exp's branch


def test_the_version_check_stays_on_and_the_step_that_broke_it_is_named() -> None:
    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), Recorder() as recorder:
        out = model(torch.randn(5, 4))
        first, second = out.pow(2).mean(), out.abs().mean()
        first.backward(retain_graph=True)
        optimizer.step()  # changes the weights the second backward's graph saved
        second.backward()
    verdicts = judge(recorder)
    assert verdicts.error.kind == "in-place version error"
    # no forward ran after the step: the second backward is the step's iteration's, as an iteration begins with its
    # forward (a framework's hook that backpropagates the step's outputs after the step)
    assert "optimizer.step()" in verdicts.error.evidence and verdicts.error.iteration == 1


def _build(net: torch.nn.Module) -> torch.Tensor:
    x = torch.randn(64, 50)
    return net(x).sigmoid().mean()


def test_held_bytes_match_the_saved_tensor_meter_and_leave_out_what_python_still_holds() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(50, 300), torch.nn.ReLU(), torch.nn.Linear(300, 1))
    with SavedTensorMeter() as meter:
        metered = _build(net)
        expected = meter.graph_only_bytes
    loss = _build(net)
    assert graph_only_bytes(python_walk([loss.grad_fn])) == expected > 0
    with Recorder() as recorder:
        loss.backward(retain_graph=True)
        keep = net[0](torch.randn(64, 50)).relu()  # a name holds the output relu saved: not the graph's alone
        keep.sum().backward(retain_graph=True)
    assert recorder.calls[0].held_after_bytes == expected
    assert recorder.calls[1].held_after_bytes == 64 * 50 * 4  # only the input, which nothing else holds
    del metered, keep


def test_the_recorder_keeps_no_graph_alive() -> None:
    model = _mlp()
    with Recorder() as recorder:
        for _ in range(3):
            hidden = model[1](model[0](torch.randn(5, 4)))
            alive = weakref.ref(hidden)
            hidden.pow(2).sum().backward(retain_graph=True)
            del hidden
    gc.collect()
    assert alive() is None and len(recorder.calls) == 3


def _gan(
    critic_iterations: int, iterations: int = 2, retain: bool = True, recorder: Recorder | None = None
) -> Recorder:
    torch.manual_seed(0)
    generator, critic = _mlp(), torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    generator_optimizer = torch.optim.Adam(generator.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
    recorder = recorder or Recorder()
    with recorder:
        for _ in range(iterations):
            for _ in range(critic_iterations):
                fake = generator(torch.randn(6, 4))
                critic_loss = critic(fake).mean() - critic(torch.randn(6, 1)).mean()
                critic_optimizer.zero_grad()
                critic_loss.backward(retain_graph=retain)
                critic_optimizer.step()
            generator_loss = -critic(fake).mean()
            generator_optimizer.zero_grad()
            generator_loss.backward()
            generator_optimizer.step()
    return recorder


def test_a_wgan_critic_retain_is_one_verdict_for_its_line_needed_once_per_generator_step() -> None:
    verdicts = judge(_gan(critic_iterations=5))
    # the iteration is the outer loop: the critic's inner loop holds its steps, not the generator's
    assert verdicts.split.how.startswith("one per pass of your loop at test_recorder.py:")
    assert verdicts.split.how.endswith("for _ in range(iterations):")
    assert verdicts.iterations_run == 2 and not verdicts.carried and verdicts.error is None
    [line] = verdicts.lines
    assert "critic_loss.backward(retain_graph=retain)" in line.line
    assert (line.verdict, line.runs, line.needed_runs) == ("needed", 10, 2)
    assert (
        line.why.startswith("needed in 2 of 10 runs")
        and line.fix.startswith("keep it: a later backward needs these buffers (test_recorder.py:")
        and "generator_loss.backward()" in line.fix
    )


def test_without_the_retain_the_generator_backward_raises_and_the_evidence_names_the_freeing_call() -> None:
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="second time"):
        _gan(critic_iterations=2, retain=False, recorder=recorder)
    error = judge(recorder).error
    assert (error.kind, error.iteration) == ("backward a second time", 1) and "generator_loss.backward()" in error.line
    assert "critic_loss.backward(retain_graph=retain) in iteration 1" in error.evidence
    assert judge(recorder).split.how.endswith("for _ in range(iterations):")  # not the critic's inner loop
    assert error.evidence.endswith("through fake")


def rnn_steps(watch: contextlib.AbstractContextManager[Any], iterations: int, detached: int) -> None:
    """An RNN cell's loop under ``watch`` (a Recorder, or nothing), detaching its hidden state in its first
    ``detached`` passes only; it raises as the loop does."""
    torch.manual_seed(0)
    cell = torch.nn.RNNCell(4, 8)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    hidden = torch.zeros(1, 8)
    with watch:
        for step in range(iterations):
            hidden = cell(torch.randn(1, 4), hidden)
            loss = hidden.pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step < detached:
                hidden = hidden.detach()


def _rnn_loop(detach: bool, iterations: int = 3) -> Recorder:
    recorder = Recorder()
    try:
        rnn_steps(recorder, iterations, iterations if detach else 0)
    except RuntimeError as error:
        assert SECOND_TIME.split(" (")[0] in str(error)
    return recorder


def test_a_carried_hidden_state_is_named_with_the_line_that_built_it_and_the_error_explained() -> None:
    verdicts = judge(_rnn_loop(detach=False))
    [carried] = verdicts.carried
    assert carried.name == "hidden" and carried.iteration == 1 and carried.reached_from == 2
    assert "hidden = cell(torch.randn(1, 4), hidden)" in carried.built_at
    assert "hidden = hidden.detach()" in carried.fix
    error = verdicts.error
    assert (error.kind, error.iteration) == ("backward a second time", 2) and "loss.backward()" in error.line
    assert "freed by the backward at" in error.evidence and "in iteration 1" in error.evidence
    assert error.evidence.endswith("through hidden")


def test_a_detached_hidden_state_is_healthy() -> None:
    verdicts = judge(_rnn_loop(detach=True))
    assert verdicts.iterations_run == 3 and not verdicts.carried and verdicts.error is None
    assert not verdicts.notes  # a function's own variables are rebound each iteration: nothing kept


def test_a_graph_built_before_the_loop_makes_its_retain_a_band_aid_across_iterations() -> None:
    torch.manual_seed(0)
    encoder, head = _mlp(), torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    features = encoder(torch.randn(5, 4)).tanh()  # before the loop, with a graph
    with Recorder() as recorder:
        for _ in range(3):
            loss = head(features).pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    verdicts = judge(recorder)
    [line] = verdicts.lines
    # needed as written (the last run: no later backward), but only by later iterations, through the carried graph
    assert (line.verdict, line.runs, line.needed_runs) == ("goes with the carried fix", 3, 2)
    assert "in iteration 2" in line.why
    [carried] = verdicts.carried
    assert carried.name == "features" and carried.iteration is None and carried.times == 2
    assert "features = encoder(torch.randn(5, 4)).tanh()" in carried.built_at
    assert carried.fix.startswith("compute `features` inside the loop")


def test_a_retain_no_later_backward_needs_can_go_and_a_tensor_kept_for_logging_is_a_note() -> None:
    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logged = {}
    with Recorder() as recorder:
        for _ in range(3):
            output = model(torch.randn(5, 4))
            loss = output.pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
            logged["last_output"] = model(torch.randn(5, 4))  # kept to log, never backwarded
            logged["loss"] = loss
    verdicts = judge(recorder)
    [line] = verdicts.lines
    assert (line.verdict, line.runs, line.needed_runs) == ("can go", 3, 0)
    assert line.fix == "remove retain_graph=True"
    assert not verdicts.carried and verdicts.error is None
    notes = {n.name: n for n in verdicts.notes}
    assert sorted(notes) == ["logged['last_output']", "logged['loss']"]
    note = notes["logged['last_output']"]
    assert note.held_bytes > 0 and 'logged["last_output"] = model(' in note.built_at
    assert notes["logged['loss']"].held_bytes > 0  # retained: its buffers stay while the dict holds it


def test_a_running_total_of_losses_is_carried_with_the_number_fix() -> None:
    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    total = 0
    with pytest.raises(RuntimeError, match="second time"), Recorder() as recorder:
        for _ in range(3):
            loss = model(torch.randn(5, 4)).pow(2).mean()
            total = total + loss
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
    [carried] = judge(recorder).carried
    assert carried.name == "total" and "total += loss.item()" in carried.fix


def test_the_loops_own_passes_are_the_iterations_and_without_a_loop_the_evidence_splits_them() -> None:
    """A loop of the learner's splits the run whatever marks and steps say; without one (the passes driven by
    ``map``, as a framework's loop would be), next_iteration() or the first backward line do."""
    torch.manual_seed(0)
    weight = torch.randn(4, 1, requires_grad=True)

    def one_pass(recorder: Recorder, mark: bool) -> None:
        loss = (torch.randn(5, 4) @ weight).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            weight.sub_(0.1 * weight.grad)
            weight.grad = None
        if mark:
            recorder.next_iteration()

    for mark in (True, False):
        with Recorder() as recorder:
            for _ in range(3):
                one_pass(recorder, mark)
        verdicts = judge(recorder)
        assert verdicts.iterations_run == 3 and not verdicts.carried
        assert verdicts.split.how.endswith("for _ in range(3):")
        with Recorder() as recorder:
            list(map(lambda _: one_pass(recorder, mark), range(3)))  # noqa: C417  # no statement loop: a framework's
        verdicts = judge(recorder)
        assert verdicts.iterations_run == 3 and not verdicts.carried
        assert verdicts.split.how == "by next_iteration()" if mark else "at each call of" in verdicts.split.how


def test_keep_buffers_raises_where_the_code_as_written_does_and_leaves_an_earlier_graph_usable() -> None:
    torch.manual_seed(0)
    model = _mlp()
    features = model(torch.randn(5, 4)).tanh()
    recorder = Recorder(keep_buffers=True)
    with pytest.raises(RuntimeError) as raised, recorder:
        for _ in range(2):
            features.pow(2).sum().backward()
            recorder.next_iteration()
    assert str(raised.value) == SECOND_TIME
    assert judge(recorder).error.iteration == 2
    features.pow(2).sum().backward()  # as written, the learner's own first backward still works


def test_iterations_stop_the_loop_at_the_top_of_the_next_pass_where_no_except_catches_it() -> None:

    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ran = 0
    with pytest.raises(StopRecording), Recorder(iterations=2) as recorder:
        for _ in range(10):
            try:
                model(torch.randn(2, 4)).sum().backward()
                optimizer.step()
            except Exception:
                pass
            ran += 1
    assert ran == 2 and recorder.iterations_done() == 2  # both passes ran whole, the third never started


@pytest.mark.parametrize(
    ("found", "built_at", "shown"),
    [
        ("trainer._accelerator_connector.strategy._model.h", "m.py:15: self.h = self.rnn(x, self.h)", "self.h"),
        ("trainer._loop.model.hidden[0]", "m.py:9: self.hidden = (h, c)", "self.hidden[0]"),
        ("trainer._loop.model.c", "m.py:9: self.h, self.c = self.lstm(x, (self.h, self.c))", "self.c"),
        ("trainer._loop.model.reg", "m.py:9: self.reg += w.norm()", "self.reg"),
        # the line does not assign that attribute on self: the name stays as found
        ("trainer._loop.model.h", "m.py:9: out, h = self.lstm(x, self.h)", "trainer._loop.model.h"),
        ("trainer._loop.model.h", "m.py:9: if self.h is None:", "trainer._loop.model.h"),
        ("trainer._loop.model.h", "m.py:9: self.g = self.h * 2", "trainer._loop.model.h"),
        # a name with no private part is the learner's own already
        ("model.h", "m.py:9: self.h = self.rnn(x, self.h)", "model.h"),
        (None, "m.py:9: self.h = self.rnn(x, self.h)", None),
    ],
)
def test_a_name_found_through_a_frameworks_private_attributes_is_the_one_its_line_assigns(found, built_at, shown):
    assert as_the_line_names_it(found, built_at) == shown


def test_an_optimizer_at_a_gone_optimizers_address_is_an_optimizer_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pretraining function's SGD, gone once it returns, then a fine-tuning function's Adam at the same address: the
    records keyed optimizers by ``id()``, so the two were one optimizer in some runs (the split read 5 steps of
    "SGD.step()" and lumped both loops) and two in others, as the allocator placed them. Here both stand at one
    address by a stand-in for ``id``, as the allocator placed them in those runs."""
    monkeypatch.setattr(events, "id", lambda _: 4096, raising=False)
    keys = OptimizerKeys()
    parameter = torch.nn.Parameter(torch.zeros(1))
    first = torch.optim.SGD([parameter], lr=0.1)
    first_key = keys(first)
    assert keys(first) == first_key == 4096  # a live optimizer keeps its key; an address seen first is its key
    del first
    gc.collect()
    second = torch.optim.Adam([parameter], lr=0.1)
    assert keys(second) != first_key and keys(second) == keys(second)
    assert keys.live_ids() == {4096}
