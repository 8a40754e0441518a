"""helpers.measure: one tolerance for gradients, one round-robin timer, the profiler's peak, state restore."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.measure import (
    ATOL,
    RTOL,
    TrainingState,
    compare_gradients,
    gradients_close,
    gradients_of,
    one_thread,
    profiler_peak_bytes,
    time_round_robin,
)


def test_gradients_of_copies_and_keeps_none() -> None:
    net = torch.nn.Linear(3, 2)
    net(torch.ones(4, 3)).sum().backward()
    net.bias.grad = None
    snapshot = gradients_of(net)
    assert snapshot["bias"] is None
    assert torch.equal(snapshot["weight"], net.weight.grad) and snapshot["weight"] is not net.weight.grad
    net.weight.grad.zero_()
    assert snapshot["weight"].abs().sum() > 0, "a snapshot does not follow later changes"


def test_one_tolerance_policy() -> None:
    x = torch.ones(5)
    assert gradients_close(x, x + RTOL / 2) and not gradients_close(x, x + 3 * RTOL)
    assert gradients_close(torch.zeros(2), torch.full((2,), ATOL / 2))


def test_compare_gradients_bit_equal_close_wrong_and_missing() -> None:
    ref = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
    same = compare_gradients({k: v.clone() for k, v in ref.items()}, ref)
    assert same.bit_equal and same.close and same.max_difference == 0 and same.relative_error == 0
    nudged = compare_gradients({"w": ref["w"] * (1 + 1e-6), "b": ref["b"]}, ref)
    assert not nudged.bit_equal and nudged.close
    wrong = compare_gradients({"w": 2 * ref["w"], "b": ref["b"]}, ref)
    assert not wrong.close and wrong.max_difference == pytest.approx(2.0)
    assert wrong.relative_error == pytest.approx((5**0.5) / (5.25**0.5))
    missing = compare_gradients({"w": ref["w"], "b": None}, ref)
    assert missing.missing == ("b",) and not missing.close and not missing.bit_equal
    both_none = compare_gradients({"w": None}, {"w": None})
    assert both_none.bit_equal and both_none.close
    with pytest.raises(ValueError, match="different parameters"):
        compare_gradients({"w": ref["w"]}, ref)


def test_round_robin_rotates_the_first_step_and_times_every_call() -> None:
    order: list[str] = []
    resets: list[int] = []
    times = time_round_robin(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b"), "c": lambda: order.append("c")},
        rounds=3,
        before_each=lambda: resets.append(1),
    )
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert len(resets) == 9 and all(len(t) == 3 and min(t) >= 0 for t in times.values())


def test_profiler_peak_counts_what_a_step_allocates() -> None:
    def allocate() -> None:
        kept = torch.empty(1024, 1024)  # 4 MiB at once
        del kept

    assert profiler_peak_bytes(allocate) >= 4 * 2**20
    assert profiler_peak_bytes(lambda: None) < 2**20


def test_training_state_restores_parameters_grads_optimizer_and_random_streams() -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(8, 3)).sum().backward()
    optimizer.step()
    weights, grads = net.weight.detach().clone(), net.weight.grad.clone()
    state = TrainingState([net], [optimizer])
    expected_draw, expected_python = torch.rand(3), random.random()
    state.restore()
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    net(torch.randn(8, 3)).pow(2).sum().backward()
    optimizer.step()
    net.bias.grad = None
    state.restore()
    assert torch.equal(net.weight, weights) and torch.equal(net.weight.grad, grads)
    assert net.bias.grad is not None
    assert optimizer.param_groups[0]["lr"] == 0.1 and optimizer.state[net.weight]["step"] == 1
    assert torch.equal(torch.rand(3), expected_draw) and random.random() == expected_python
    state.restore()  # a state can be put back more than once
    assert torch.equal(net.weight, weights)


OUTPUTS: list[torch.Tensor] = [torch.zeros(2)]
TOTAL = torch.zeros(())


def test_training_state_with_a_step_puts_back_a_closure_tensor_the_step_rebinds() -> None:
    cell = torch.nn.RNNCell(2, 3)
    h = torch.zeros(1, 3)
    calls = 0

    def step() -> None:
        nonlocal h, calls
        h = cell(torch.ones(1, 2), h)
        calls += 1

    h_before = h
    state = TrainingState([cell], step=step)
    step()
    step()
    assert h is not h_before and h.grad_fn is not None
    state.restore()
    assert h is h_before and h.grad_fn is None, "the same object, not a copy"
    assert calls == 2, "a name that holds no tensor is left alone"
    step()
    state.restore()  # a state can be put back more than once
    assert h is h_before


def test_training_state_with_a_step_restores_a_global_list_in_place_and_a_global_tensor() -> None:
    outputs, first, total = OUTPUTS, OUTPUTS[0], TOTAL

    def step() -> None:
        global TOTAL
        OUTPUTS.append(torch.ones(2))
        TOTAL = TOTAL + 1

    state = TrainingState(step=step)
    step()
    step()
    assert len(OUTPUTS) == 3 and TOTAL is not total
    state.restore()
    assert OUTPUTS is outputs and len(outputs) == 1 and outputs[0] is first
    assert TOTAL is total


def test_training_state_with_a_step_reads_globals_in_nested_code() -> None:
    total = TOTAL

    def step() -> None:
        def add() -> None:
            global TOTAL
            TOTAL = TOTAL + 1

        add()

    state = TrainingState(step=step)
    step()
    assert TOTAL is not total
    state.restore()
    assert TOTAL is total


def test_training_state_with_a_step_puts_back_a_tuple_of_tensors_in_a_closure() -> None:
    lstm = torch.nn.LSTMCell(2, 3)
    state_hc = (torch.zeros(1, 3), torch.zeros(1, 3))
    pairs = []

    def step() -> None:
        nonlocal state_hc
        state_hc = lstm(torch.ones(1, 2), state_hc)
        pairs.append(1)  # a list without a tensor: not the step's state

    before, (h, c) = state_hc, state_hc
    state = TrainingState([lstm], step=step)
    step()
    assert state_hc is not before
    state.restore()
    assert state_hc is before and state_hc[0] is h and state_hc[1] is c
    assert pairs == [1]


def test_training_state_without_a_step_leaves_names_alone() -> None:
    h = torch.zeros(1)

    def step() -> None:
        nonlocal h
        h = h + 1

    state = TrainingState()
    step()
    rebound = h
    state.restore()
    assert h is rebound
    TrainingState(step=len).restore()  # a builtin: no closure or globals to read


TOTAL_LOSS = 0.0
BANK: list = []


def test_training_state_puts_back_a_number_that_became_a_tensor_and_a_list_that_filled_with_tensors() -> None:
    global TOTAL_LOSS
    w = torch.ones(2, requires_grad=True)

    def step() -> None:
        global TOTAL_LOSS
        TOTAL_LOSS = TOTAL_LOSS + (w * 2).sum()
        BANK.append(w * 3)

    state = TrainingState(step=step)
    step()
    assert isinstance(TOTAL_LOSS, torch.Tensor) and len(BANK) == 1
    state.restore()
    assert TOTAL_LOSS == 0.0 and not isinstance(TOTAL_LOSS, torch.Tensor) and BANK == []


def test_training_state_puts_back_module_attributes_and_buffers() -> None:
    class Remembers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.memory = torch.nn.BatchNorm1d(3), torch.zeros(1, 3)

    model = Remembers()
    memory, running_mean = model.memory, model.norm.running_mean.clone()
    state = TrainingState([model])
    model.train()
    model.memory = model.norm(torch.randn(4, 3, requires_grad=True)).mean(0, keepdim=True)
    assert model.memory.grad_fn is not None and not torch.equal(model.norm.running_mean, running_mean)
    state.restore()
    assert model.memory is memory and torch.equal(model.norm.running_mean, running_mean)


def test_one_thread_runs_on_one_and_puts_the_threads_back_even_after_an_error() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError), one_thread():
            raise ValueError("the step failed")
        assert torch.get_num_threads() == 2
        seen = []
        time_round_robin({"a": lambda: seen.append(torch.get_num_threads())}, rounds=2)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
