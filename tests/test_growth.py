"""growth_experiment: memory grows only when retained graphs stay reachable."""

from __future__ import annotations

import pytest
import torch

from helpers.growth import GrowthVariant, growth_experiment

VARIANTS = {
    "retain, tensor": GrowthVariant(True, "tensor"),
    "retain, value": GrowthVariant(True, "value"),
    "free, tensor": GrowthVariant(False, "tensor"),
    "free, value": GrowthVariant(False, "value"),
    "retain, sum": GrowthVariant(True, "sum"),
    "free, sum": GrowthVariant(False, "sum"),
}


def run(iterations: int = 12):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    x = torch.randn(16, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    return growth_experiment(lambda: net(x).pow(2).mean(), optimizer, VARIANTS, iterations=iterations,
                             progress=False)


def test_only_retained_graphs_kept_reachable_grow_by_one_graph_per_iteration() -> None:
    result = run()
    growing = {name for name in VARIANTS if result.grows(name)}
    assert growing == {"retain, tensor", "retain, sum"}
    per_graph = 16 * 32 * 4  # the tanh output; the input batch and weights stay alive anyway
    for name in growing:
        steps = [b - a for a, b in zip(result.graph_only_bytes[name], result.graph_only_bytes[name][1:])]
        assert all(step >= per_graph for step in steps), steps
        assert len(set(steps)) == 1, f"{name} grows by the same amount every iteration: {steps}"
    for name in VARIANTS.keys() - growing:
        assert result.graph_only_bytes[name] == [0] * 12, name
        assert result.growth_per_iteration(name) == 0


def test_times_table_and_chart() -> None:
    result = run(iterations=4)
    assert all(len(result.seconds[name]) == 4 and min(result.seconds[name]) > 0 for name in VARIANTS)
    assert all(len(result.page_faults[name]) == 4 and min(result.page_faults[name]) >= 0 for name in VARIANTS)
    for name in VARIANTS:
        times = result.seconds[name]
        assert result.slowdown(name) == pytest.approx(times[-1] / times[0])
        assert result.faults_per_iteration(name) == sum(result.page_faults[name]) / 4
    table = result.table()
    assert table.column("variant") == list(VARIANTS)
    assert "history.append(loss.item())" in table.column("loop body")[1]
    assert len(table.column("page faults per iteration")) == len(VARIANTS)
    assert len(result.chart().axes) == 2


def test_variant_code_and_bad_inputs() -> None:
    assert GrowthVariant(True, "sum").code == "loss.backward(retain_graph=True); total += loss"
    with pytest.raises(ValueError, match="keep must be one of"):
        GrowthVariant(True, "list")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="True or False"):
        GrowthVariant(1, "value")  # type: ignore[arg-type]
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="loss function"):
        growth_experiment(None, optimizer, VARIANTS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer"):
        growth_experiment(lambda: net(torch.ones(2)).sum(), net, VARIANTS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GrowthVariant"):
        growth_experiment(lambda: net(torch.ones(2)).sum(), optimizer, {"x": (True, "value")})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at least 2"):
        growth_experiment(lambda: net(torch.ones(2)).sum(), optimizer, VARIANTS, iterations=1)
