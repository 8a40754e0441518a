"""What notebook 04's loop checks read while a loop runs: norm clipping told from other shrinking, graphs of
earlier losses found alive, retaining backward calls and module runs counted, and ``.data`` found in code."""

from __future__ import annotations

import torch

from backward_twice.instruments.meter import SavedTensorMeter
from helpers.lessons.carried_state.loop_watch import LoopWatch, is_norm_clipping, reads_data


def test_norm_clipping_is_some_steps_scaled_down_to_one_threshold_and_none_above_it() -> None:
    assert is_norm_clipping([0.4, 0.3, 0.4], [0.9, 0.3, 0.7])
    assert is_norm_clipping([0.4, 0.4], [0.9, 0.5])
    assert not is_norm_clipping([0.3, 0.2], [0.3, 0.2]), "nothing scaled is the plain loop, not clipping"
    assert not is_norm_clipping([0.45, 0.15], [0.9, 0.3]), "every step halved is a scaled loss"
    assert not is_norm_clipping([0.4, 0.6], [0.9, 0.6]), "a step above the threshold would have been clipped"
    assert not is_norm_clipping([0.5, 0.4], [0.4, 0.9]), "a gradient scaled up is not clipping"
    assert not is_norm_clipping([0.0, 0.0, 0.0], [0.9, 0.3, 0.7]), "every gradient cleared is not clipping at 0"
    assert not is_norm_clipping([0.0, 0.3], [0.9, 0.3]), "a gradient cleared is not clipped"


def make_watched():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = SavedTensorMeter()
    return model, optimizer, meter, LoopWatch(model, optimizer, meter, model)


def test_the_watch_sees_kept_losses_retains_and_runs_then_lets_go() -> None:
    model, optimizer, meter, watch = make_watched()
    kept = []
    with meter, watch.watching():
        for index in range(3):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward(retain_graph=index == 0)
            if index < 2:
                kept.append(loss)
            optimizer.step()
    assert watch.earlier_alive == [False, True, True]
    assert len(watch.retained_bytes) == 1 and watch.runs == 3 and len(watch.norms) == 3
    assert torch.autograd.backward.__module__ == "torch.autograd", "watching() must put torch's backward back"
    assert not model._forward_pre_hooks


def test_a_loop_that_keeps_only_numbers_keeps_no_earlier_graph() -> None:
    model, optimizer, meter, watch = make_watched()
    with meter, watch.watching():
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            optimizer.step()
    assert watch.earlier_alive == [False, False, False] and watch.retained_bytes == [] and watch.held == [0, 0, 0]


def test_data_is_found_in_the_answer_its_nested_code_and_the_functions_it_closes_over() -> None:
    def detach_with_data(h):
        return h.data

    def loop(h):
        return detach_with_data(h)

    def wrapper(h):
        return loop(h)

    assert reads_data(lambda h: h.data) and reads_data(wrapper)
    assert not reads_data(lambda h: h.detach())
