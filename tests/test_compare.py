"""compare_patterns: gradients against a reference, time ratios, meter and profiler memory."""

from __future__ import annotations

import re

import pytest
import torch

from helpers.compare import compare_patterns


def make_net() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    return net, torch.randn(32, 8)


def test_equal_patterns_are_bit_equal_and_a_wrong_one_is_flagged() -> None:
    net, x = make_net()

    def summed() -> None:
        out = net(x)
        (out[:, 0].mean() + out[:, 1].mean()).backward()

    def two_roots() -> None:
        out = net(x)
        torch.autograd.backward([out[:, 0].mean(), out[:, 1].mean()])

    def only_first() -> None:
        net(x)[:, 0].mean().backward()

    comparison = compare_patterns(
        {"sum": summed, "roots": two_roots, "first": only_first}, net, reference="sum", rounds=3, progress=False
    )
    assert comparison["sum"].bit_equal and comparison["sum"].time_ratio == 1.0
    assert comparison["roots"].close
    assert not comparison["first"].close and comparison["first"].gradients.startswith("DIFFERENT")
    assert comparison["first"].max_difference > 0
    table = comparison.table()
    assert table.column("pattern") == ["sum", "roots", "first"]
    portable = comparison.table(timing=False)
    assert portable.columns == ["pattern", "gradients vs sum", "peak graph-only (meter)"]
    assert portable.column("gradients vs sum")[0] == "bit-equal"
    assert portable.column("gradients vs sum")[2] == "DIFFERENT", "no machine-dependent difference size"
    assert comparison.chart().axes, "the chart has axes"
    with pytest.raises(KeyError, match="No pattern"):
        comparison["missing"]


def test_meter_peak_is_the_same_for_every_pattern_that_frees_the_same_graph() -> None:
    net, x = make_net()

    def retain_then_backward() -> None:
        out = net(x)
        out[:, 0].mean().backward(retain_graph=True)
        out[:, 1].mean().backward()

    def summed() -> None:
        out = net(x)
        (out[:, 0].mean() + out[:, 1].mean()).backward()

    comparison = compare_patterns(
        {"a": retain_then_backward, "b": summed}, net, reference="b", rounds=2, progress=False
    )
    hidden_activation_bytes = 32 * 64 * 4  # the ReLU output: the only buffer nothing else keeps
    assert comparison["b"].peak_graph_only_bytes >= hidden_activation_bytes
    assert comparison["a"].peak_graph_only_bytes == comparison["b"].peak_graph_only_bytes
    # Two backward passes with the buffers retained allocate more in total than one.
    assert comparison["a"].profiler_peak_bytes > comparison["b"].profiler_peak_bytes


def test_bad_inputs_get_clear_errors() -> None:
    net, _ = make_net()
    with pytest.raises(TypeError, match="non-empty dict"):
        compare_patterns({}, net, reference="a")
    with pytest.raises(ValueError, match="not one of the patterns"):
        compare_patterns({"a": lambda: None}, net, reference="b")
    with pytest.raises(TypeError, match=re.escape("torch.nn.Module")):
        compare_patterns({"a": lambda: None}, "net", reference="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a function"):
        compare_patterns({"a": 3}, net, reference="a")  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="rounds"):
        compare_patterns({"a": lambda: None}, net, reference="a", rounds=0)
