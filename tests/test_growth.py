"""growth_experiment: bytes with the meter, time without it; memory grows only when retained graphs stay
reachable, and time per iteration grows only when each backward walks earlier iterations' graphs."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from backward_twice.instruments.meter import SavedTensorMeter
from helpers.growth import GrowthResult, growth_experiment, reachable_nodes

WIDTH, BATCH = 32, 16
PER_GRAPH = BATCH * WIDTH * 4  # the tanh output; the input batch and the weights stay alive anyway


def make_bodies():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))
    x = torch.randn(BATCH, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(retain_graph: bool) -> torch.Tensor:
        optimizer.zero_grad()
        loss = net(x).pow(2).mean()
        loss.backward(retain_graph=retain_graph)
        optimizer.step()
        return loss

    def retain_sum(state) -> None:
        state.total += step(True)

    def free_sum(state) -> None:
        state.total += step(False)

    return {
        "retain, tensor": lambda state: state.history.append(step(True)),
        "retain, value": lambda state: state.history.append(step(True).item()),
        "free, tensor": lambda state: state.history.append(step(False)),
        "free, value": lambda state: state.history.append(step(False).item()),
        "retain, sum": retain_sum,
        "free, sum": free_sum,
    }


def test_only_retained_graphs_kept_reachable_grow_by_one_graph_per_iteration() -> None:
    bodies = make_bodies()
    result = growth_experiment(bodies, iterations=12, block=4, progress=False)
    assert result.names == list(bodies)
    growing = {name for name in bodies if result.grows(name)}
    assert growing == {"retain, tensor", "retain, sum"}
    for name in growing:
        steps = [b - a for a, b in zip(result.graph_only_bytes[name], result.graph_only_bytes[name][1:])]
        assert all(step >= PER_GRAPH for step in steps), steps
        assert len(set(steps)) == 1, f"{name} grows by the same amount every iteration: {steps}"
        assert result.growth_per_iteration(name) == steps[0]
    for name in bodies.keys() - growing:
        assert result.graph_only_bytes[name] == [0] * 12, name
        assert result.growth_per_iteration(name) == 0


def test_every_body_gets_a_fresh_state_in_each_run_and_nothing_survives() -> None:
    seen: list[int] = []

    def body(state) -> None:
        seen.append(len(state.history))
        state.history.append(torch.ones(1, requires_grad=True) * 2)

    growth_experiment({"only": body}, iterations=3, block=1, progress=False)
    # bytes run: 0, 1, 2; three warm-up calls on their own state: 0, 1, 2; time run: 0, 1, 2.
    assert seen == [0, 1, 2] * 3


def test_the_time_run_happens_without_a_meter() -> None:
    import backward_twice.instruments.meter as meter_module

    active_during_calls: list[bool] = []

    def body(state) -> None:
        active_during_calls.append(meter_module._active_meter is not None)

    growth_experiment({"only": body}, iterations=4, block=2, progress=False)
    assert active_during_calls[:4] == [True] * 4, "the bytes run records inside the meter"
    assert active_during_calls[4:] == [False] * (3 + 4), "warm-up and time run are never metered"


def test_block_figures_table_and_chart() -> None:
    result = GrowthResult(
        iterations=6,
        block=2,
        graph_only_bytes={"a": [0, 10, 20, 30, 40, 50]},
        seconds={"a": [0.004, 0.002, 0.003, 0.005, 0.009, 0.006]},
    )
    assert result.block_milliseconds("a") == pytest.approx([2.0, 3.0, 6.0])
    assert result.slowdown("a") == pytest.approx(3.0)
    assert result.growth_per_iteration("a") == 10
    with_time = result.table()
    assert with_time.column("last / first") == ["3.00"]
    without_time = result.table(timing=False)
    assert without_time.columns == ["loop body", "graph-only bytes at the end", "growth per iteration"]
    assert without_time.column("growth per iteration") == ["10 B"]
    assert len(result.chart().axes) == 2


@pytest.mark.parametrize(
    ("bodies", "kwargs", "error", "match"),
    [
        (None, {}, TypeError, "non-empty dict"),
        ({}, {}, TypeError, "non-empty dict"),
        ({"x": 3}, {}, TypeError, "not a function of one argument"),
        ({"x": lambda state: None}, {"iterations": 1}, ValueError, "at least 2"),
        ({"x": lambda state: None}, {"iterations": 10, "block": 0}, ValueError, "block must be"),
        ({"x": lambda state: None}, {"iterations": 10, "block": 11}, ValueError, "block must be"),
    ],
)
def test_bad_inputs_are_named(bodies, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        growth_experiment(bodies, progress=False, **kwargs)


def test_the_meter_is_free_again_after_a_body_raises() -> None:
    def broken(state) -> None:
        raise RuntimeError("a learner's bug")

    with pytest.raises(RuntimeError, match="a learner's bug"):
        growth_experiment({"broken": broken}, iterations=2, progress=False)
    with SavedTensorMeter():  # would raise if the experiment had left its meter active
        pass


def test_the_bytes_run_counts_the_nodes_each_backward_walks_and_only_a_chain_makes_it_grow() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 4)

    def keep_retained(state) -> None:
        loss = net(x).pow(2).mean()
        loss.backward(retain_graph=True)
        state.history.append(loss)

    def backward_the_total(state) -> None:
        state.total = state.total + net(x).pow(2).mean()
        state.total.backward(retain_graph=True)

    result = growth_experiment(
        {"kept": keep_retained, "chained": backward_the_total}, iterations=4, block=2, progress=False
    )
    # One graph: Pow, Mean, Addmm x2, Tanh, T x2 (weights transposed) and 4 AccumulateGrad leaves = 11 nodes.
    one_graph = result.backward_nodes["kept"][0]
    assert result.backward_nodes["kept"] == [one_graph] * 4
    # The chain adds one AddBackward per iteration and one graph's own nodes (the leaves are shared).
    chained = result.backward_nodes["chained"]
    steps = {b - a for a, b in pairwise(chained)}
    assert len(steps) == 1 and steps.pop() > 0 and chained[0] <= one_graph + 1
    import torch.autograd as autograd_module

    assert autograd_module.backward.__name__ == "backward", "the counting wrapper is gone afterwards"


def test_reachable_nodes_counts_each_node_once_from_one_root_or_several() -> None:

    w = torch.ones(3, requires_grad=True)
    y = (w * 2).sum()
    z = (w * 3).sum()
    assert reachable_nodes(y) == 3  # SumBackward0, MulBackward0, AccumulateGrad
    assert reachable_nodes([y, z]) == 5  # AccumulateGrad shared
    assert reachable_nodes(torch.ones(2)) == 0


def test_a_loop_state_of_ones_own_reaches_every_body() -> None:
    from types import SimpleNamespace

    w = torch.ones(4, requires_grad=True)

    def carry(state):
        state.h = w * state.h  # a chain: each backward walks every earlier iteration
        state.h.sum().backward(retain_graph=True)

    result = growth_experiment(
        {"carry": carry}, iterations=4, block=2, progress=False, new_state=lambda: SimpleNamespace(h=torch.ones(4))
    )
    nodes = result.backward_nodes["carry"]
    assert [b - a for a, b in pairwise(nodes)] == [1, 1, 1]
    assert result.grows("carry")


class _MadeAfresh:
    """An autograd node as torch 2.11 gives it: ``next_functions`` makes a new Python object at each read, and one
    dropped frees its id for the next (the walk counted 2 of a model's 12 nodes there)."""

    def __init__(self, below: int) -> None:
        self.below = below

    @property
    def next_functions(self) -> tuple[tuple[_MadeAfresh, int], ...]:
        return ((_MadeAfresh(self.below - 1), 0),) if self.below else ()


class _RootOfAfresh(torch.Tensor):
    @property
    def grad_fn(self) -> _MadeAfresh:  # type: ignore[override]
        return _MadeAfresh(99)


def test_reachable_nodes_counts_each_node_when_node_objects_are_made_afresh():
    assert reachable_nodes(torch.zeros(1).as_subclass(_RootOfAfresh)) == 100
