"""diagnose puts back what the step changes through code it calls: the globals a helper function of the learner's
writes (``global seen; seen += 1``, a list it appends to), a class's attributes (``Trainer.calls += 1``), the
attributes of a configuration module of the learner's (``cfg.lr *= 0.5``), lists nested deeper than three levels;
an optimizer as the learner holds it (its ``param_groups`` the same dicts, no flag a scheduler reads left set); and
``%%diagnose`` leaves no name the cell bound that the notebook did not have.

The truth is what the learner's objects say before and after, read without the tool."""

from __future__ import annotations

import collections
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from backward_twice.steps.diagnose import diagnose
from backward_twice.watcher import watch

CONFIG = """
lr = 0.1
losses = []
schedule = {"warm": True}
"""

LEARNER = """
import torch
from torch import nn

import config_of_the_learner as cfg

torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
seen = 0
history = []
deep = [[[[[0]]]]]


class Trainer:
    calls = 0
    best = None


def log(loss):
    global seen
    seen += 1
    history.append(float(loss))
    Trainer.calls += 1
    Trainer.best = float(loss)
    cfg.lr = cfg.lr * 0.5
    cfg.losses.append(float(loss))
    cfg.schedule["warm"] = False
    deep[0][0][0][0][0] += 1
    count()


def count():
    global counted
    counted = globals().get("counted", 0) + 1


def step():
    optimizer.zero_grad()
    loss = model(torch.ones(2, 3)).pow(2).mean()
    loss.backward()
    optimizer.step()
    log(loss)
"""


@pytest.fixture
def learner(tmp_path: Path) -> Iterator[ModuleType]:
    (tmp_path / "config_of_the_learner.py").write_text(textwrap.dedent(CONFIG), encoding="utf-8")
    (tmp_path / "learner_with_helpers.py").write_text(textwrap.dedent(LEARNER), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("learner_with_helpers")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("learner_with_helpers", "config_of_the_learner"):
            sys.modules.pop(name, None)


def _state(module: ModuleType) -> tuple[object, ...]:
    cfg = module.cfg
    return (
        module.seen,
        list(module.history),
        module.Trainer.calls,
        module.Trainer.best,
        cfg.lr,
        list(cfg.losses),
        dict(cfg.schedule),
        module.deep[0][0][0][0][0],
        "counted" in vars(module),
    )


def test_what_a_helper_function_changes_through_globals_classes_and_a_config_module_is_put_back(
    learner: ModuleType,
) -> None:
    before = _state(learner)
    weight = learner.model.weight.detach().clone()
    assert diagnose(learner.step, models=learner.model, optimizers=learner.optimizer).healthy
    assert _state(learner) == before
    assert torch.equal(learner.model.weight, weight)
    learner.step()  # the learner's own first step, after the tool: as the first step without it
    assert (learner.seen, learner.Trainer.calls, learner.cfg.lr, learner.deep[0][0][0][0][0]) == (1, 1, 0.05, 1)


def test_the_optimizer_is_left_as_the_learner_holds_it(learner: ModuleType) -> None:
    """A learner's ``group = optimizer.param_groups[0]`` still sets the learning rate after diagnose, and a scheduler
    built after it still warns about a ``scheduler.step()`` before the first ``optimizer.step()``, as without it."""
    optimizer = learner.optimizer
    groups, group = optimizer.param_groups, optimizer.param_groups[0]
    flags = {k: v for k, v in vars(optimizer).items() if k not in ("state", "param_groups")}
    diagnose(learner.step, models=learner.model, optimizers=optimizer)
    assert optimizer.param_groups is groups and optimizer.param_groups[0] is group
    assert group["lr"] == 0.1
    assert {k: v for k, v in vars(optimizer).items() if k not in ("state", "param_groups")} == flags


def test_a_gradient_the_learner_holds_is_the_parameters_gradient_again_with_its_values(learner: ModuleType) -> None:
    """After the learner's own step ``g = model.weight.grad``; the runs zero and refill it (or replace it), and the
    tool gave the parameter a new tensor with the right values, so ``g`` no longer was the weight's gradient."""
    learner.step()
    weight = learner.model.weight
    held, values = weight.grad, weight.grad.clone()
    diagnose(learner.step, models=learner.model, optimizers=learner.optimizer)
    assert weight.grad is held and torch.equal(held, values)


class _KeyQueue(torch.nn.Module):
    """A MoCo re-implementation's queue of key batches as ``collections.deque(maxlen=...)``, enqueued with their
    graphs (no ``torch.no_grad()`` around the key encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(6, 4)
        self.queue: collections.deque[torch.Tensor] = collections.deque([torch.randn(4, 4)], maxlen=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.encoder(x)
        logits = q @ torch.cat(list(self.queue)).T.detach()
        self.queue.append(self.encoder(x + 0.1))
        return logits


def _queue_step(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """An SGD optimizer of ``model`` and a contrastive step on one batch: the logits over the queue's keys."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)

    def step() -> None:
        optimizer.zero_grad()
        model(x).logsumexp(1).mean().backward()
        optimizer.step()

    return optimizer, step


def test_a_deque_that_keeps_graphs_is_a_note_under_watch_and_diagnose_and_diagnose_puts_it_back() -> None:
    """It was "healthy" (a deque was no container the names walk read) and diagnose left the runs' keys in the
    queue. The truth: the deque holds one more batch of keys with its graph each pass."""
    torch.manual_seed(0)
    model = _KeyQueue()
    optimizer, step = _queue_step(model)

    before = list(model.queue)
    diagnosis = diagnose(step, models=[model], optimizers=[optimizer])
    assert list(model.queue) == before, "the runs' keys are left in the queue"
    with watch() as w:
        for _ in range(4):
            step()
    assert len(model.queue) == 5 and all(key.grad_fn is not None for key in list(model.queue)[1:])
    for report, held in ((str(diagnosis), " (3 so far)"), (str(w), "")):  # a maxlen of 8, not full: "up to 8", not
        assert f"`self.queue` keeps up to the last 8 iterations' graphs alive{held}\n" in report, report  # "them all"


class _LastKeys(torch.nn.Module):
    """The queue of MoCo re-implementations kept short: a ``collections.deque(maxlen=2)`` of key batches, full from
    the start, its keys enqueued with their graphs (``detached``: as ``keys.detach()``, the fix)."""

    def __init__(self, detached: bool = False) -> None:
        super().__init__()
        self.encoder, self.detached = torch.nn.Linear(6, 4), detached
        self.queue: collections.deque[torch.Tensor] = collections.deque([torch.randn(4, 4)] * 2, maxlen=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.encoder(x)
        logits = q @ torch.cat(list(self.queue)).T.detach()
        keys = self.encoder(x + 0.1)
        if self.detached:
            keys = keys.detach()
        self.queue.append(keys)
        return logits


@pytest.mark.parametrize("detached", [False, True])
def test_a_full_deque_of_graphs_keeps_its_last_iterations_graphs_the_same_under_watch_and_diagnose(
    detached: bool,
) -> None:
    """The watch said "healthy" (read at each pass's first event, the deque had already pushed its oldest graph
    out, so its count never grew) and diagnose said it "keeps one more iteration's graph alive every iteration"
    (it saw 1, then 2). The truth, read without the tool: after every pass from the second on the deque holds the
    keys of the last 2 passes with their graphs, no more, and no backward walks them (the negatives are
    detached); with ``keys.detach()`` it holds none."""
    torch.manual_seed(0)
    model = _LastKeys(detached)
    optimizer, step = _queue_step(model)

    diagnosis = diagnose(step, models=[model], optimizers=[optimizer])
    held = []
    with watch() as w:
        for _ in range(4):
            step()
            held.append(sum(key.grad_fn is not None for key in model.queue))
    assert held == ([0, 0, 0, 0] if detached else [1, 2, 2, 2])
    line = inspect.getsourcelines(_LastKeys.forward)[1] + 6
    for report in (str(diagnosis), str(w)):
        if detached:
            assert report.startswith("backward-twice: healthy"), report
            continue
        assert report.startswith("backward-twice: 1 note"), report
        assert "1. `self.queue` keeps the last 2 iterations' graphs alive" in report, report
        assert f":{line} | self.queue.append(keys)" in report, report
        assert "keep in mind: `self.queue.append(keys.detach())`" in report, report
        assert "every iteration" not in report and "holds them all" not in report, report


class _Features:
    """A forward hook's activation saver the step never names: ``register_forward_hook(self.hook_fn)``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.features: list[torch.Tensor] = []
        module.register_forward_hook(self.hook_fn)

    def hook_fn(self, module: object, inputs: object, output: torch.Tensor) -> None:
        self.features.append(output)


def test_what_a_models_hook_keeps_is_judged_and_put_back_though_the_step_never_names_it() -> None:
    """diagnose said "healthy" and left its runs' activations in the list (the step reads ``model`` only, and the
    list is reached through the hook); the watch names it. The truth: the list holds one more output, with its
    graph, per call of the step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    _hooked["saver"] = _Features(model[1])

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    diagnosis = diagnose(step, models=[model], optimizers=[optimizer])
    assert _hooked["saver"].features == [], "the runs' activations are left in the list"
    assert "`self.features` keeps one more iteration's graph alive every iteration" in str(diagnosis), str(diagnosis)
    step()
    assert len(_hooked["saver"].features) == 1 and _hooked["saver"].features[0].grad_fn is not None


_hooked: dict[str, _Features] = {}


class _Whitened(torch.nn.Module):
    """A weight's Gram matrix cached on the module at its first forward, with its graph (``self._gram``, None until
    then): from the second call on each loss walks the first call's graph."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4) * 0.3)
        self._gram: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gram is None:
            self._gram = self.w @ self.w.T + torch.eye(4)
        return x @ self._gram


@pytest.mark.parametrize("tool", ["diagnose", "find_carried_graph", "audit_retain_graph"])
def test_a_private_cache_a_forward_fills_is_put_back_to_none_by_the_step_tools(tool: str) -> None:
    """The step tools' runs filled ``net._gram`` (None before) with a graph of their own and left it there: the
    snapshot kept a module's private attributes only when they held a tensor or a tuple (h69c). The learner's next
    step then used the runs' cached graph, not the one its own first call builds."""
    import backward_twice as bt

    torch.manual_seed(0)
    net = _Whitened()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.randn(8, 4), torch.randn(8, 4)

    def step() -> None:
        optimizer.zero_grad()
        (net(x) - y).pow(2).mean().backward()
        optimizer.step()

    getattr(bt, tool)(step, models=[net], optimizers=[optimizer])
    assert net._gram is None
