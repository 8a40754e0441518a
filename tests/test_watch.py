"""backward_twice/watcher.py: ``with watch() as w:`` around a loop as the learner wrote it; ``w`` as text, HTML and
JSON; the diagnosis on the loop's own exception; and a watch that never breaks the loop it watches."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import inspect
import json
import sys
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_learner_scripts import QUEUED_TRAINING

from backward_twice.watcher import Watch, watch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(model: torch.nn.Module, passes: int, work_after_the_step: list[str]) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    torch.manual_seed(1)  # the same batches for the watched and the bare run
    for _ in range(passes):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        work_after_the_step.append("logged")
        optimizer.zero_grad()


def _two_passes_watched_and_bare(
    train: Callable[[torch.nn.Module, int, list], None],
) -> tuple[Watch, torch.nn.Module, list, list]:
    """``train`` under ``watch(iterations=2)`` on 100 passes, and bare on 2: the watch, the watched model, and what
    each logged (the two models' parameters are checked equal)."""
    watched, bare = _model(), _model()
    logged_watched: list = []
    logged_bare: list = []
    with watch(iterations=2) as w:
        train(watched, 100, logged_watched)
    train(bare, 2, logged_bare)
    assert all(torch.equal(a, b) for a, b in zip(watched.parameters(), bare.parameters()))
    return w, watched, logged_watched, logged_bare


def test_iterations_n_stops_at_the_top_of_pass_n_plus_1_with_the_state_of_n_bare_passes() -> None:
    w, watched, logged_watched, logged_bare = _two_passes_watched_and_bare(_train)
    assert logged_watched == logged_bare == ["logged", "logged"]  # the scheduler and the logging after step() ran
    assert all(p.grad is None or not p.grad.any() for p in watched.parameters())  # the pass's own zero_grad() ran
    assert w.verdicts.iterations_run == 2 and w.healthy
    text = str(w)
    assert text.startswith("backward-twice: healthy (2 iterations watched, then stopped as asked, 2 backward calls")
    assert "healthy" in w._repr_html_()
    assert w.verdicts.split.how.startswith("one per pass of your loop at test_watch.py:")


_CELL = """
import random, numpy, torch
from backward_twice.watcher import watch

def batches():  # reading an item draws from every random stream, as a Dataset's random crop does
    while True:
        random.random(), numpy.random.rand()
        yield torch.randn(3, 4)

torch.manual_seed(0), random.seed(0), numpy.random.seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{loop}
after = [torch.rand(1).item(), random.random(), numpy.random.rand()]
"""
_LOOPS = {
    "for": "for i, x in enumerate(batches()):\n    opt.zero_grad(); model(x).sum().backward(); opt.step()",
    "one line": "for i, x in enumerate(batches()): opt.zero_grad(); model(x).sum().backward(); opt.step()",
    "in a function": "def train():\n    for i, x in enumerate(batches()):\n"
    "        opt.zero_grad(); model(x).sum().backward(); opt.step()\n        if i == 1 and bare:\n            break\n"
    "train()",
}


@pytest.mark.parametrize("loop", _LOOPS)
def test_iterations_n_leave_the_loops_names_and_random_streams_as_n_passes_do(tmp_path, loop: str) -> None:
    """A notebook cell's loop stopped at the top of pass 3: its ``for`` had already taken pass 3's item, so ``i`` and
    ``x`` were pass 3's and the random streams had moved on by what reading it drew (``i`` was 2, and the next cell's
    ``torch.rand`` differed; a function's loop too). The truth: the same loop breaking at the end of pass 2."""
    namespaces = []
    watched_loop = "with watch(iterations=2) as w:\n" + textwrap.indent(_LOOPS[loop], "    ")
    bare_loop = _LOOPS[loop] if loop == "in a function" else _LOOPS["for"] + "\n    if i == 1:\n        break"
    for body in (watched_loop, bare_loop):
        cell = tmp_path / f"cell{len(namespaces)}.py"
        source = _CELL.format(loop=body)
        cell.write_text(source)
        namespace: dict = {"bare": body is bare_loop}
        exec(compile(source, str(cell), "exec"), namespace)
        namespaces.append(namespace)
    watched, bare = namespaces
    if loop != "in a function":  # a function's variables go with its frame
        assert watched["i"] == bare["i"] == 1 and torch.equal(watched["x"], bare["x"])
    assert watched["after"] == bare["after"]
    assert all(torch.equal(a, b) for a, b in zip(watched["model"].parameters(), bare["model"].parameters()))
    assert watched["w"].verdicts.iterations_run == 2 and watched["w"].healthy


@pytest.mark.parametrize("header", ["for x in it:", "for i, x in enumerate(it):", "for x, _ in zip(it, it2):"])
def test_iterations_n_leave_an_iterator_a_next_cell_reads_on_where_n_passes_leave_it(tmp_path, header: str) -> None:
    """``it = iter(batches)`` in one cell, ``watch(iterations=2)`` over ``for x in it`` in the next, then a cell that
    goes on with ``for x in it``: pass 3's header had taken batch 2 from ``it`` before the stop, so the next cell
    started at batch 3 and trained on one batch fewer. The truth: the same loop breaking at the end of pass 2."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(2, 3) for _ in range(6)]
    it, it2 = iter(batches), iter(range(6))
    cell = tmp_path / "cell.py"
    cell.write_text(
        f"with watch(iterations=2) as w:\n    {header}\n        opt.zero_grad(); model(x).sum().backward()\n"
    )
    namespace = {"watch": watch, "it": it, "it2": it2, "opt": opt, "model": model}
    exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    assert namespace["w"].verdicts.iterations_run == 2
    assert next(it) is batches[2]
    if "it2" in header:
        assert next(it2) == 2


def _one_line_loop(model: torch.nn.Module, passes: int, logged: list[int]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    data = [torch.randn(3, 4) for _ in range(passes)]
    for x in data: opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step(); logged.append(len(logged))  # noqa: E701, E702  # fmt: skip


def test_a_loop_on_one_line_is_the_iteration_and_stops_after_the_whole_of_pass_n() -> None:
    """The body of ``for x in data: ...; opt.step(); logged.append(...)`` sends no line event of its own: its passes
    are told from the instruction after the ``for`` takes an item, and the stop comes there, before pass 3 runs
    anything (the logging after the step of pass 2 ran)."""
    w, _, logged_watched, logged_bare = _two_passes_watched_and_bare(_one_line_loop)
    assert logged_watched == logged_bare == [0, 1]
    assert w.verdicts.iterations_run == 2 and w.healthy
    assert w.verdicts.split.how.startswith("one per pass of your loop at test_watch.py:")
    with watch() as w:
        _one_line_loop(_model(), 6, [])
    assert w.verdicts.iterations_run == 6 and w.verdicts.split.how.startswith("one per pass of your loop at")


def _while_loop_stepping_on_the_backwards_line(model: torch.nn.Module, passes: int, logged: list[int]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    n = 0
    while n < passes:
        opt.zero_grad()
        loss = model(torch.randn(3, 4)).pow(2).mean()
        loss.backward(); opt.step()  # noqa: E702  # the learner's own line, as written  # fmt: skip
        logged.append(n)
        n += 1


@pytest.mark.parametrize("iterations", [3, 4])
def test_a_step_on_the_backwards_own_line_is_in_the_same_pass_of_a_while_loop(iterations: int) -> None:
    """``loss.backward(); opt.step()`` on one line of a ``while`` loop: once the tracer no longer follows the passes,
    the step came at the same line as the backward and was taken for a new pass (6 passes were "10 iterations", and
    iterations=3 stopped after 2). The truth: 6 passes ran; the state after iterations=N is N bare passes'."""
    with watch() as w:
        _while_loop_stepping_on_the_backwards_line(_model(), 6, [])
    assert w.verdicts.iterations_run == 6 and w.healthy, str(w)
    watched, bare, logged = _model(), _model(), []
    with watch(iterations=iterations) as w:
        _while_loop_stepping_on_the_backwards_line(watched, 6, logged)
    _while_loop_stepping_on_the_backwards_line(bare, iterations, [])
    assert logged == list(range(iterations)) and w.verdicts.iterations_run == iterations
    assert all(torch.equal(a, b) for a, b in zip(watched.parameters(), bare.parameters()))


def test_a_bare_except_in_the_body_does_not_swallow_the_stop() -> None:
    model = _model()
    ran = 0
    with watch(iterations=2):
        for _ in range(10):
            try:  # noqa: SIM105  # the learner's own code, as written
                model(torch.randn(2, 4)).sum().backward()
            except:  # noqa: E722  # the learner's own bare except
                pass
            ran += 1
    assert ran == 2


def _trains_inside_a_try(model: torch.nn.Module, log: list[str]) -> None:
    try:
        for _ in range(10):
            model(torch.randn(2, 4)).sum().backward()
            log.append("pass")
    except:  # noqa: E722  # the learner's own bare except, around the whole loop
        log.append("swallowed")
    finally:
        log.append("finally")
    log.append("after the try")


def _swallows_it_without_a_call(model: torch.nn.Module, log: list[str]) -> None:
    failed = False
    try:
        for _ in range(10):
            model(torch.randn(2, 4)).sum().backward()
            log.append("pass")
    except BaseException:
        failed = True
    log.append(f"failed={failed}")


def _calls_the_loop_inside_a_try(model: torch.nn.Module, log: list[str]) -> None:
    try:
        _swallows_it_without_a_call(model, log)
    except (KeyboardInterrupt, BaseException) as error:
        log.append(type(error).__name__)
    log.append("after the try")


@pytest.mark.parametrize("loop", [_trains_inside_a_try, _swallows_it_without_a_call, _calls_the_loop_inside_a_try])
def test_an_except_that_catches_everything_around_the_loop_does_not_swallow_the_stop(loop: Any) -> None:
    """The truth: two bare passes print "pass" twice; the stop after them is no error of the loop's, so no handler of
    the learner's runs for it (a script's ``except:`` that logs "training failed" and saves), the ``finally:`` does,
    and nothing after the ``try`` (the stop ends the watched code there), twice over from the same state."""
    for _ in range(2):
        watched, bare, log = _model(), _model(), []
        torch.manual_seed(0)
        with watch(iterations=2) as w:
            loop(watched, log)
        expected = ["pass", "pass", "finally"] if loop is _trains_inside_a_try else ["pass", "pass"]
        assert log == expected and w.verdicts.iterations_run == 2 and w.healthy, (log, str(w))
        torch.manual_seed(0)
        for _ in range(2):
            bare(torch.randn(2, 4)).sum().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(watched.parameters(), bare.parameters()))
        assert sys.gettrace() is None and sys.getprofile() is None
        after = []
        try:  # the handlers after the watch are the learner's again
            raise KeyboardInterrupt
        except:  # noqa: E722
            after.append("caught")
        assert after == ["caught"]


def test_the_loops_own_error_goes_on_up_with_the_diagnosis_as_a_note_and_no_frame_of_the_tool() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hidden = torch.zeros(3, 1)
    with pytest.raises(RuntimeError, match="second time") as raised, watch() as w:
        for _ in range(3):
            hidden = model(torch.randn(3, 4)) + hidden
            optimizer.zero_grad()
            hidden.pow(2).mean().backward()
            optimizer.step()
    printed = "".join(traceback.format_exception(raised.value))
    assert "helpers/" not in printed  # the traceback is the one bare Python prints
    [note] = raised.value.__notes__
    assert note.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "`hidden` carries iteration 1's graph into iteration 2" in note and "add `hidden = hidden.detach()`" in note
    assert note.endswith("more: print(w.evidence())") and note in printed  # a script: no cells to show `w` in
    assert note.startswith(str(w).split("\nmore:")[0])  # the same items as w
    report = w.to_json()
    json.dumps(report)
    assert report["count"] == len(report["items"]) == 1 and report["items"][0]["kind"] == "carried"
    assert report["error"]["kind"] == "backward a second time" and report["error"]["iteration"] == 2
    assert [c["variable"] for c in report["carried"]] == ["hidden"]
    assert "<ol>" in w._repr_html_() and "hidden" in w._repr_html_() and "<details>" in w._repr_html_()


def test_exits_are_how_the_loop_ended_not_its_error() -> None:
    model = _model()
    for ending, stop in [(SystemExit, lambda: SystemExit(0)), (KeyboardInterrupt, lambda: KeyboardInterrupt())]:
        with pytest.raises(ending), watch() as w:
            for step in range(5):
                model(torch.randn(2, 4)).pow(2).mean().backward()
                if step == 1:
                    raise stop()
        assert w.verdicts.error is None and w.verdicts.calls == 2
        assert str(w).startswith("backward-twice: healthy (")
        assert ("SystemExit: 0" if ending is SystemExit else "KeyboardInterrupt") in str(w)


def test_nothing_ran_is_not_healthy() -> None:
    with watch() as w:
        for _ in range(3):
            torch.randn(2).sum()
    assert not w.healthy and str(w) == "backward-twice: no backward call seen (0 iterations watched): nothing to judge"


def test_an_error_before_any_backward_is_pythons_own() -> None:
    with pytest.raises(ZeroDivisionError) as raised, watch():
        1 / 0  # noqa: B018
    assert not getattr(raised.value, "__notes__", None)


def test_views_whose_base_changed_in_place_never_break_the_loop() -> None:
    """``for row in w`` makes unbind views; after a step changes ``w`` in place, reading their ``grad_fn`` raises.
    The loop never reads them again, so bare Python runs to the end: so must the watched loop."""

    def run(watched: bool) -> torch.Tensor:
        torch.manual_seed(0)
        weight = torch.randn(3, 4, requires_grad=True)
        rows = list(weight)  # noqa: F841  # views the loop keeps, as the learner's does
        optimizer = torch.optim.SGD([weight], lr=0.1)
        with watch() if watched else torch.enable_grad():
            for _ in range(3):
                optimizer.zero_grad()
                (weight @ torch.randn(4, 2)).pow(2).mean().backward()
                optimizer.step()
        return weight.detach().clone()

    assert torch.equal(run(watched=True), run(watched=False))


@pytest.mark.parametrize(
    "broken",
    [
        "held.names_holding_graphs",
        "recorder.stamp_walk",
        "recorder.graph_only_bytes",
        "learner.learner_line_at",
        "passes.enclosing",
        "lines.loops_of",
    ],
)
def test_an_error_of_the_tool_switches_it_off_and_the_loop_goes_on_as_bare_python(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise ValueError("a planted failure")

    def run(watched: bool) -> tuple[torch.Tensor, int]:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ran = 0
        with watch() if watched else torch.enable_grad() as w:
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(3, 4)).pow(2).mean().backward(retain_graph=True)
                optimizer.step()
                ran += 1
        if watched:
            assert "backward-twice stopped watching after" in str(w) and "a planted failure" in str(w), str(w)
        return next(model.parameters()).detach().clone(), ran

    bare = run(watched=False)
    module, name = broken.split(".")
    monkeypatch.setattr(importlib.import_module(f"backward_twice.record.{module}"), name, fail)
    watched = run(watched=True)
    assert watched[1] == bare[1] == 3 and torch.equal(watched[0], bare[0])


def test_a_hand_written_update_splits_by_its_loop_and_per_line_verdicts_come_out_as_json() -> None:
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
    assert "fix: remove retain_graph=True at line " in str(w)


def test_iterations_must_be_a_positive_whole_number() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="iterations must be a whole number"):
            watch(iterations=bad)


@pytest.mark.parametrize("batches", [[0.5], [0.5, 0.5], [1.0, 2.0, 3.0]])
def test_an_epoch_function_called_again_begins_a_new_pass_even_with_the_same_batches(batches: list[float]) -> None:
    """``train_epoch()`` called once per epoch: CPython may give each call's frame the same address, and a loop over
    ``[batch]`` binds the very same object in every epoch; each epoch's passes are still new passes. The truth is the
    loop's own count of its passes."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.full((3, 4), value) for value in batches]
    ran = []

    def train_epoch() -> None:
        for x in data:
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
            ran.append(1)

    with watch() as w:
        for _epoch in range(6):
            train_epoch()
    assert w.verdicts.iterations_run == len(ran) == 6 * len(batches), str(w)
    assert str(w).startswith(f"backward-twice: healthy ({len(ran)} iterations watched"), str(w)


def _gan(detach: bool) -> None:
    """A GAN step whose D loss reads `fake` (detached or not), then G's loss on a fresh D(fake)."""
    torch.manual_seed(0)
    G, D = torch.nn.Linear(4, 2), torch.nn.Linear(2, 1)
    opt_G, opt_D = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
    for _ in range(2):
        fake = G(torch.randn(8, 4))
        opt_D.zero_grad()
        d_loss = D(torch.randn(8, 2)).mean() - D(fake.detach() if detach else fake).tanh().mean()
        d_loss.backward()
        opt_D.step()
        opt_G.zero_grad()
        (-D(fake).tanh().mean()).backward()
        opt_G.step()


def _critic_steps(detach: bool) -> None:
    """A WGAN's critic steps, all on one `fake` made before them (detached or not), then the generator's step: the
    loop around both backward lines is the outer one, so the critic's second pass is in the same iteration."""
    torch.manual_seed(0)
    G, D = torch.nn.Linear(4, 2), torch.nn.Linear(2, 1)
    opt_G, opt_D = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
    for _ in range(2):
        z = torch.randn(8, 4)
        fake = G(z).tanh()
        for _ in range(3):
            opt_D.zero_grad()
            (D(fake.detach() if detach else fake).mean() - D(torch.randn(8, 2)).mean()).backward()
            opt_D.step()
        opt_G.zero_grad()
        (-D(G(z).tanh()).mean()).backward()
        opt_G.step()


@pytest.mark.parametrize(
    ("loop", "fix"),
    [
        (_gan, "use `fake.detach()` at line "),  # where D's loss reads it
        (_critic_steps, "build `fake` inside the loop that runs line "),
    ],
)
def test_a_second_backward_through_a_named_tensor_gets_its_detach_not_the_retain_band_aid(loop, fix: str) -> None:
    """The freed graph is reached through `fake`: the fix detaches it where the earlier loss reads it (a GAN's D loss),
    and offers retain only for a loss that must train what `fake` comes from. Truth without the tool: the loop raises
    as written and runs with `fake.detach()` there."""
    with pytest.raises(RuntimeError, match="second time"):
        loop(detach=False)
    loop(detach=True)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        loop(detach=False)
    item = w.report.items[0]
    assert item.fix.startswith(fix) and "`fake.detach()`" in item.fix, item.fix
    assert "retain_graph=True" not in item.fix or "if it must" in item.fix


def _ema_training(iterations: int, no_grad: bool) -> torch.nn.Module:
    """A mean-teacher loop: the student trains, the teacher follows it by an exponential moving average, updated in
    place (under torch.no_grad(), or, the bug, without it)."""
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    teacher = copy.deepcopy(student).requires_grad_(False)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(iterations):
        x = torch.randn(16, 4)
        loss = (student(x) - teacher(x).detach()).pow(2).mean() + student(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            for ema, p in zip(teacher.parameters(), student.parameters()):
                ema.mul_(0.99).add_(p, alpha=0.01)
    return teacher


def _chain(tensor: torch.Tensor) -> int:
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(child for child, _ in node.next_functions)
    return len(seen)


def test_an_ema_updated_outside_no_grad_is_a_parameter_graph_to_fix() -> None:
    """Truth without the tool: the teacher's weights get a graph that grows with every update (more nodes after 10
    iterations than after 5), and none under torch.no_grad(). The watch names the update's line and its fix."""
    assert _chain(_ema_training(10, no_grad=False)[0].weight) > _chain(_ema_training(5, no_grad=False)[0].weight) > 0
    assert _ema_training(5, no_grad=True)[0].weight.grad_fn is None
    with watch() as w:
        _ema_training(5, no_grad=False)
    assert not w.healthy
    (item,) = [item for item in w.report.items if "teacher" in item.label]
    assert item.label == "`teacher`'s parameters hold a graph that grows every iteration"
    assert item.lines[0].code == "ema.mul_(0.99).add_(p, alpha=0.01)"
    assert item.fix.startswith("run line ") and item.fix.endswith(" under `with torch.no_grad():`")
    with watch() as w:
        _ema_training(5, no_grad=True)
    assert w.healthy, str(w)


def test_diagnose_judges_the_ema_as_watch_does_and_leaves_its_weights_leaves() -> None:
    from backward_twice.steps.diagnose import diagnose

    torch.manual_seed(0)
    student = torch.nn.Linear(4, 2)
    teacher = copy.deepcopy(student).requires_grad_(False)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)

    def step() -> None:
        x = torch.randn(8, 4)
        loss = (student(x) - teacher(x)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for ema, p in zip(teacher.parameters(), student.parameters()):
            ema.mul_(0.99).add_(p, alpha=0.01)

    before = [p.detach().clone() for p in teacher.parameters()]
    diagnosis = diagnose(step, models=[student, teacher], optimizers=[optimizer])
    # teacher(x) is not detached here, so every backward also walks the teacher's graph: a carried graph, whose fix
    # is the same update under torch.no_grad() (assigning `teacher.weight = teacher.weight.detach()` would raise); the
    # update line gives both parameters a graph, and the item names both
    (item,) = diagnosis.report.items
    assert item.label == "`teacher.weight` and `teacher.bias` carry iteration 1's graph into iteration 2", item.label
    source, first = inspect.getsourcelines(step)
    update = first + next(i for i, text in enumerate(source) if "ema.mul_" in text)
    assert item.fix == f"run line {update} under `with torch.no_grad():`, so updating `teacher.weight` records no graph"
    for kept, p in zip(before, teacher.parameters()):
        assert p.is_leaf and p.grad_fn is None and not p.requires_grad and torch.equal(p, kept)


def _lbfgs_problem() -> tuple[torch.nn.Linear, torch.optim.LBFGS, Callable[[], torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    inputs, targets = torch.randn(16, 3), torch.randn(16, 1)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (model(inputs) - targets).pow(2).mean()
        loss.backward()
        return loss

    return model, optimizer, closure


def test_iterations_never_stop_an_optimizer_step_half_way() -> None:
    """LBFGS stepped by ``map`` (no loop of the learner's: no pass of it is seen), so every backward runs inside a
    step. The watch must not stop inside one (the step would be left half done, its state matching no number of bare
    passes): it stops at the start of the 4th step, before it runs, with the state of 3 bare ones. Written as a loop
    on one line, the passes are seen: it stops at the top of the 4th, with the same state."""
    states = []
    model, optimizer, closure = _lbfgs_problem()
    for _ in range(8):
        states.append([p.detach().clone() for p in model.parameters()])
        optimizer.step(closure)
    states.append([p.detach().clone() for p in model.parameters()])

    def matches(model: torch.nn.Module) -> list[int]:
        after = [p.detach() for p in model.parameters()]
        return [k for k, state in enumerate(states) if all(torch.equal(a, b) for a, b in zip(after, state))]

    model, optimizer, closure = _lbfgs_problem()
    with watch(iterations=3):
        list(map(lambda _: optimizer.step(closure), range(8)))  # noqa: C417  # a loop of no statement of theirs
    assert matches(model) == [3]
    model, optimizer, closure = _lbfgs_problem()
    with watch(iterations=3) as w:
        for _ in range(8): optimizer.step(closure)  # noqa: E701  # fmt: skip
    assert matches(model) == [3] and w.verdicts.iterations_run == 3


def test_iterations_n_stop_a_lightning_fit_whose_backward_runs_inside_the_step_after_n_steps() -> None:
    """Lightning's automatic optimization runs ``training_step`` and the backward inside the closure it hands to
    ``optimizer.step``: a stop at the backward would leave that step half done, so it comes at the start of step N+1.
    The truth: the weights equal a bare fit limited to 2 batches. Lightning ends its loop at the request, and the
    stop then comes where ``fit`` returns: the code after it did run (a test, a save), as after no loop that stopped."""
    pl = pytest.importorskip("pytorch_lightning")
    from torch.utils.data import DataLoader, TensorDataset

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(model: torch.nn.Module, batches: int | None = None) -> None:
        torch.manual_seed(1)
        data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
        options = {"limit_train_batches": batches} if batches else {}
        pl.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            **options,
        ).fit(model, data)

    torch.manual_seed(0)
    watched, bare, untouched = Model(), Model(), Model()
    bare.load_state_dict(watched.state_dict())
    untouched.load_state_dict(watched.state_dict())
    after: list[str] = []
    with watch(iterations=2) as w:
        fit(watched)
        after.append("the code after fit ran")
    fit(bare, 2)
    assert after == []
    assert all(torch.equal(a, b) for a, b in zip(watched.parameters(), bare.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(watched.parameters(), untouched.parameters()))
    assert w.verdicts.iterations_run == 2 and str(w).startswith("backward-twice: healthy (2 iterations watched, then")


def test_an_error_raised_inside_a_try_with_a_finally_is_shown_at_its_raise_not_at_the_finallys_last_line() -> None:
    """A NaN guard's ``raise ValueError`` in a loop inside ``try: ... finally: save()``: the error was shown at the
    ``finally:`` block's last line, where the frame stood once that block had run. Python's traceback gives the
    ``raise`` line."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    saved = []
    with pytest.raises(ValueError, match="loss is nan") as raised, watch() as w:
        try:
            for step in range(5):
                loss = model(torch.randn(4, 3)).pow(2).mean() * (float("nan") if step == 2 else 1.0)
                loss.backward()
                if not torch.isfinite(loss):
                    raise ValueError(f"loss is {loss.item()}")
        finally:
            saved.append(step)
    assert saved == [2]
    raise_line = next(line for _, line in traceback.walk_tb(raised.value.__traceback__))
    assert w.verdicts.error is not None, str(w)
    assert w.verdicts.error.line.split(": ", 1)[0].endswith(f"test_watch.py:{raise_line}"), w.verdicts.error.line
    assert "raise ValueError" in w.verdicts.error.line


def _every_third_pass(model: torch.nn.Module, passes: int, logged: list[int]) -> None:
    """Losses summed over three batches, one backward every third pass (a forum's accumulation; cleanrl's DQN trains
    every ``train_frequency`` steps the same way)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    total: torch.Tensor | int = 0
    for index, x in enumerate(torch.randn(30, 3, 4)):
        logged.append(index)
        total = total + model(x).pow(2).mean()
        if (index + 1) % 3 == 0:
            total.backward()
            optimizer.step()
            optimizer.zero_grad()
            total = 0
        if index + 1 == passes:
            break


@pytest.mark.parametrize("iterations", [4, 5, 7, 8])
def test_iterations_n_stop_a_loop_with_a_backward_every_third_pass_after_n_passes(iterations: int) -> None:
    """Passes with no backward between two with one: once the tracer stopped following the loop, the stop came at
    the next backward after pass N (``iterations=5`` ran pass 6 up to its backward: "healthy (5 iterations"), or
    where N fell on such a pass, one pass late ("8 iterations watched" for 7). The truth: the same loop breaking at
    the end of pass N."""
    watched, bare = _model(), _model()
    logged_watched: list[int] = []
    logged_bare: list[int] = []
    with watch(iterations=iterations) as w:
        _every_third_pass(watched, 100, logged_watched)
    _every_third_pass(bare, iterations, logged_bare)
    assert logged_watched == logged_bare == list(range(iterations))
    assert all(torch.equal(a, b) for a, b in zip(watched.parameters(), bare.parameters()))
    assert w.verdicts.iterations_run == iterations and w.verdicts.stopped_after == iterations, str(w)


def test_one_iteration_claims_no_graph_carried_it_cannot_see() -> None:
    """A hidden state carried into iteration 2 raises there; stopped after iteration 1, the watch said "healthy ...
    nothing carried". It can only say what one iteration shows."""
    cell = torch.nn.GRUCell(2, 3)
    h = torch.zeros(1, 3)
    with watch(iterations=1) as w:
        for _ in range(3):
            h = cell(torch.randn(1, 2), h)
            h.pow(2).mean().backward()
    headline = str(w).splitlines()[0]
    assert "nothing carried" not in headline and headline.endswith(
        "; a graph carried into the next iteration shows from 2 iterations on)"
    ), headline
    with pytest.raises(RuntimeError, match="second time"):  # the truth: the next iteration raises
        h = cell(torch.randn(1, 2), h)
        h.pow(2).mean().backward()


def test_an_error_the_loop_catches_and_prints_shows_no_frame_of_the_tool() -> None:
    """``traceback.print_exc()`` in the learner's own ``except`` (and a thread's traceback, a ``raise ... from``
    chain) showed two frames of the tool between torch's backward and the engine: the wrapper of the engine entry
    and the recorder's hook. The truth: bare Python's traceback of the same error has none."""
    cell = torch.nn.GRUCell(2, 3)

    def carried_loop() -> list[str]:
        printed, h = [], torch.zeros(1, 3)
        for _ in range(2):
            h = cell(torch.randn(1, 2), h)
            try:
                h.pow(2).mean().backward()
            except RuntimeError:
                printed.append(traceback.format_exc())
        return printed

    [bare] = carried_loop()
    with watch():
        [watched] = carried_loop()
    assert "backward_twice" not in watched, watched
    assert [line for line in watched.splitlines() if "File " in line][-3:] == [
        line for line in bare.splitlines() if "File " in line
    ][-3:]


@pytest.mark.parametrize("iterations", [2, 5])
def test_iterations_n_see_a_list_that_grows_in_every_pass_they_ran(iterations: int) -> None:
    """A list of predictions kept with their graphs: ``watch(iterations=2)`` said "healthy" where
    ``diagnose(step, iterations=2)`` flagged the list (the count of graphs it holds was read at pass starts 1 and 2
    only). The truth: after N passes it holds N graphs, one more each pass."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    preds: list[torch.Tensor] = []
    with watch(iterations=iterations) as w:
        for _ in range(8):
            out = model(torch.randn(8, 4))
            loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 2, (8,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            preds.append(out)
    assert len(preds) == iterations and len({p.grad_fn for p in preds}) == iterations
    assert str(w).startswith(f"backward-twice: 1 note ({iterations} iterations watched, then stopped as asked)"), str(w)
    assert "`preds` keeps one more iteration's graph alive every iteration" in str(w), str(w)


def _optimize_model(memory: list[torch.Tensor], layer: torch.nn.Linear, optimizer: torch.optim.Optimizer) -> None:
    """The DQN tutorial's ``optimize_model()``: it returns until the replay memory holds a batch."""
    if len(memory) < 4:
        return
    optimizer.zero_grad()
    layer(torch.cat(memory)).pow(2).mean().backward()
    optimizer.step()


def test_iterations_n_stop_a_loop_whose_backward_a_function_of_yours_runs_after_a_warm_up() -> None:
    """``for t in ...: memory.append(...); optimize_model()``: ``watch(iterations=2)`` ran 4 passes and a step (the
    loop was not known as the iteration's until its first backward). The truth: 2 bare passes, no step."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = [p.detach().clone() for p in layer.parameters()]
    memory: list[torch.Tensor] = []
    with watch(iterations=2) as w:
        for _ in range(6):
            memory.append(torch.randn(1, 2))
            _optimize_model(memory, layer, optimizer)
    assert len(memory) == 2 and all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    assert str(w).startswith("backward-twice: no backward call seen (2 iterations watched, then stopped as asked)")


def _replayed(retain: bool, iterations: int | None) -> str:
    """Six passes; pass 5 adds pass 1's kept output to its loss (a replay batch reaching an old graph)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    kept: list[torch.Tensor] = []
    with watch(iterations=iterations) as w:
        for i in range(6):
            out = layer(torch.randn(2, 3))
            kept.append(out)
            loss = out.pow(2).mean() + (kept[0].sum() * 0 if i == 4 else 0)
            optimizer.zero_grad()
            loss.backward(retain_graph=retain)
            optimizer.step()
    return str(w)


def test_a_retain_judged_over_the_first_n_iterations_says_a_later_one_may_need_it() -> None:
    """``watch(iterations=2)`` said of the retain "without it the loop runs the same", which the whole run
    contradicts: without it, pass 5 raises."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _replayed(retain=False, iterations=None)
    report = _replayed(retain=True, iterations=2)
    assert "the run stopped after 2 iterations, and a later one may (watch the whole run to be sure)" in report, report
    assert "without it the loop runs the same" not in report, report


def _run_coroutine(coroutine: Any) -> None:
    """Run ``coroutine`` to its end as an event loop would run one that only awaits ``asyncio.sleep(0)``: without
    one, so that a loop another test left running on this thread (a browser test's) cannot refuse it."""
    with contextlib.suppress(StopIteration):
        while True:
            coroutine.send(None)


async def _fetch(batch: torch.Tensor) -> torch.Tensor:
    await asyncio.sleep(0)
    return batch


async def _train_async(cell: torch.nn.GRUCell, batches: torch.Tensor, logged: list[int], detach: bool) -> None:
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    h = torch.zeros(1, 3)
    for index, batch in enumerate(batches):
        x = await _fetch(batch)
        if detach:
            h = h.detach()
        optimizer.zero_grad()
        h = cell(x, h)
        h.pow(2).mean().backward(retain_graph=not detach)
        optimizer.step()
        await asyncio.sleep(0)
        logged.append(index)


@pytest.mark.parametrize("detach", [True, False])
def test_iterations_n_stop_an_async_loop_after_the_whole_of_pass_n_and_its_passes_are_its_own(detach: bool) -> None:
    """A loop in an ``async def`` that awaits its batch and yields after its step: each ``await`` was taken for the
    function's return and its resumption for a new call, so the loop was no loop (counted by steps) and the stop
    armed for "the next call" went off at the ``await`` after pass N's step: pass N's logging never ran. The truth:
    two bare passes log 0 and 1 and leave these weights; the carried ``h`` is what the band-aid hides."""
    torch.manual_seed(0)
    batches = torch.randn(6, 1, 2)
    cells = [torch.nn.GRUCell(2, 3) for _ in range(2)]
    cells[1].load_state_dict(cells[0].state_dict())
    watched: list[int] = []
    with watch(iterations=2) as w:
        _run_coroutine(_train_async(cells[0], batches, watched, detach))
    bare: list[int] = []
    _run_coroutine(_train_async(cells[1], batches[:2], bare, detach))
    assert watched == bare == [0, 1]
    assert all(torch.equal(a, b) for a, b in zip(cells[0].parameters(), cells[1].parameters()))
    text = str(w)
    if detach:
        assert text.startswith("backward-twice: healthy (2 iterations watched, then stopped as asked"), text
    else:
        assert "`h` carries iteration 1's graph into iteration 2; retain_graph=True only hides it" in text, text
        assert "fix: add `h = h.detach()` before line" in text, text
    told = "iterations: one per pass of your loop at test_watch.py:"
    assert f"{told}{inspect.getsourcelines(_train_async)[1] + 3}: for index, batch in" in w.evidence(), w.evidence()


def test_iterations_n_in_a_thread_stop_the_block_waiting_for_its_losses_and_the_code_after_it_runs(
    tmp_path: Any,
) -> None:
    """``with bt.watch(iterations=1):`` around a worker thread that trains and a main thread that prints each
    pass's loss from a queue: the stop ended the worker alone and the block waited for ever. The truth: after pass
    1's loss, the block ends as it does for a loop of its own thread, and the code after it runs, the learner's
    handler of no signal changed."""
    script = tmp_path / "threaded.py"
    script.write_text(
        QUEUED_TRAINING
        + textwrap.dedent(
            """
            import signal
            import backward_twice as bt

            handlers = [signal.getsignal(s) for s in signal.valid_signals()]
            with bt.watch(iterations=1) as w:
                threading.Thread(target=train).start()
                while (message := losses.get()) is not None:
                    print(message, flush=True)
            print("after the block")
            print(w)
            print("handlers kept:", handlers == [signal.getsignal(s) for s in signal.valid_signals()])
            """
        )
    )
    import subprocess

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert lines[0] == "iteration 0 loss 0.3066" and lines[1] == "after the block", done.stdout
    assert "1 iteration watched, then stopped as asked" in lines[2] and lines[-1] == "handlers kept: True"


def test_a_tensor_subclass_sees_only_the_loops_own_calls_under_the_watch() -> None:
    """A ``torch.Tensor`` subclass that counts its ``__torch_function__`` calls (a logging or a units wrapper): under
    the watch it also counted three ``__get__`` calls, the tool's reads of ``.grad_fn`` and ``.shape`` on the loop's
    tensors. The truth: the counts of the loop run bare."""
    from collections import Counter
    from typing import ClassVar

    class Logged(torch.Tensor):
        calls: ClassVar[Counter] = Counter()

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            cls.calls[getattr(func, "__name__", str(func))] += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    def loop() -> Counter:
        Logged.calls = Counter()
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(8, 4).as_subclass(Logged)
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
        return Logged.calls

    bare = loop()
    with watch() as w:
        watched = loop()
    assert watched == bare and w.verdicts.calls == 3, (watched, bare)


@pytest.mark.parametrize("broken", ["backward_twice.judge.failsafe.judge", "backward_twice.watcher.build_report"])
def test_when_the_watch_cannot_judge_every_part_of_it_says_so_and_none_raises(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an error of its own judgment the watch's text said "could not judge this run", but ``w.healthy``,
    ``w.verdicts``, ``w.report`` and ``w.to_json()`` judged again and raised that error into the learner's code (the
    command reads ``w.verdicts`` too). The truth: the loop ran as bare Python runs it; each part says the tool failed
    and none claims health."""
    module, name = broken.rsplit(".", 1)

    def planted(*args: object, **kwargs: object) -> None:
        raise IndexError("a planted failure")

    monkeypatch.setattr(importlib.import_module(module), name, planted)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).pow(2).mean().backward()
            optimizer.step()
    said = "backward-twice could not judge this run (an error of its own: IndexError: a planted failure)"
    assert str(w) == said and w.evidence() == said and said in w._repr_html_()
    assert not w.healthy and w.report.headline == said and not w.report.items
    assert w.verdicts.calls == 3 and w.to_json()["headline"] == said and w.to_json()["stopped_watching"] == said


def test_an_iterator_the_loop_names_keeps_the_item_pass_n_plus_1_took_and_the_draws_it_made() -> None:
    """``watch(iterations=2)`` around ``for x in data:`` over a generator that draws each batch: the stop at the top
    of pass 3 left the generator one item on (nothing can take an item back) but put the random streams back to
    pass 2's end: a state no bare run leaves (a next cell's draws repeat what item 3 drew). The truth (no helpers):
    a loop that breaks at the top of pass 3 leaves the generator at item 4 and the streams past item 3's draw."""

    def batches() -> Any:
        while True:
            yield torch.randn(3, 4)

    def run(watched: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = batches()
        with watch(iterations=2) if watched else contextlib.nullcontext():
            for passes, x in enumerate(data):
                if not watched and passes == 2:
                    break
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
        return next(data), torch.rand(1), model.weight.detach().clone()

    watched, bare = run(watched=True), run(watched=False)
    assert all(torch.equal(a, b) for a, b in zip(watched, bare, strict=True)), (watched, bare)


def test_a_zip_of_a_generator_and_a_list_iterator_keeps_both_items_pass_n_plus_1_took() -> None:
    """``for x, t in zip(batches, targets)`` under ``watch(iterations=2)``: the generator kept the item pass 3 took,
    but the list iterator's place was put back, so the two went one item out of step for a next cell's ``zip``. The
    truth (no helpers): a loop that breaks at the top of pass 3 leaves both one item on, and the streams past item
    3's draw."""

    def batches() -> Any:
        while True:
            yield torch.randn(3, 4)

    def run(watched: bool) -> tuple[torch.Tensor, int, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data, targets = batches(), iter(list(range(100, 110)))
        with watch(iterations=2) if watched else contextlib.nullcontext():
            for passes, (x, t) in enumerate(zip(data, targets)):
                if not watched and passes == 2:
                    break
                opt.zero_grad()
                (model(x).pow(2).mean() * t).backward()
                opt.step()
        return next(data), next(targets), torch.rand(1)

    watched, bare = run(watched=True), run(watched=False)
    assert torch.equal(watched[0], bare[0]) and watched[1] == bare[1] == 103, (watched, bare)
    assert torch.equal(watched[2], bare[2])


def test_a_watch_around_a_watched_loop_that_raises_leaves_the_judging_to_the_inner_one() -> None:
    """Two watches nested (h72c): the inner one named the carried ``h``; the outer one, which saw no backward call of
    its own, judged the error it saw go by: "1 iteration watched ... add retain_graph=True to the earlier backward
    only", the forum's band-aid. The truth: pass 2 raises through ``h`` (detached, the loop runs)."""
    torch.manual_seed(0)
    cell, head = torch.nn.RNNCell(4, 8), torch.nn.Linear(8, 1)
    h = torch.zeros(3, 8)
    with (
        pytest.raises(RuntimeError, match="backward through the graph a second time"),
        watch() as outer,
        watch() as inner,
    ):
        for _ in range(3):
            h = cell(torch.randn(3, 4), h)
            head(h).pow(2).mean().backward()
    assert str(inner).startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iter")
    assert [c.name for c in inner.verdicts.carried] == ["h"], str(inner)
    assert str(outer).startswith("backward-twice: no backward call seen outside your code's own bt.watch"), str(outer)
    assert "retain_graph=True" not in str(outer), str(outer)
