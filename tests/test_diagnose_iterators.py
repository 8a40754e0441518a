"""backward_twice/steps/harness.py with an iterator the step reads its batch from (``x, y = next(it)``): the step
tools leave it where their runs leave it and say so, since nothing can put it back; putting back its attributes
alone broke a DataLoader with workers (its next ``next()`` raised ``KeyError``). The truth is the step run the same
number of times by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import backward_twice as bt


def _parts(workers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Iterator[Any]]:
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.zeros(20, 1))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, optimizer, iter(DataLoader(data, batch_size=2, num_workers=workers))


def _step_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, it: Iterator[Any]) -> Callable[[], None]:
    def step() -> None:
        x, y = next(it)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    return step


def _next_first_value(it: Iterator[Any]) -> float:
    return float(next(it)[0][0, 0])


@pytest.mark.parametrize("workers", [0, 2])
def test_the_iterator_is_left_where_the_runs_leave_it_and_still_works(workers: int) -> None:
    by_hand = _parts(workers)
    step = _step_of(*by_hand)
    for _ in range(3):
        step()
    truth = _next_first_value(by_hand[2])  # three batches of two rows of two values: row 6 holds 12.0
    assert truth == 12.0
    model, optimizer, it = _parts(workers)
    diagnosis = bt.diagnose(_step_of(model, optimizer, it), model, optimizer)
    assert _next_first_value(it) == truth  # no KeyError from a worker's batch its attributes no longer expect
    assert "note: `it` is 3 batches further on: the 3 runs read from it, and an iterator cannot be put back" in str(
        diagnosis
    )
    assert diagnosis.report.not_put_back and "batches further on" in diagnosis._repr_html_()


def test_audit_and_find_carried_graph_say_it_too() -> None:
    model, optimizer, it = _parts(0)
    audit = bt.audit_retain_graph(_step_of(model, optimizer, it), model, optimizer, iterations=2)
    assert "note: `it` is 2 batches further on: the 2 runs read from it" in repr(audit)
    model, optimizer, it = _parts(0)
    carried = bt.find_carried_graph(_step_of(model, optimizer, it), 4, model, optimizer)
    assert "note: `it` is 4 batches further on" in str(carried) and "note:" in carried._repr_html_()


def test_a_generator_the_step_reads_moved_on_and_an_iterator_it_does_not_read_is_not_named() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    batches = (torch.randn(3, 2) for _ in range(10))
    unread = iter(range(5))
    kept = {"unread": unread}

    def step() -> None:
        assert kept  # reaches the dict, and through it the iterator it never reads
        model(next(batches)).sum().backward()

    diagnosis = bt.diagnose(step, model)
    text = str(diagnosis)
    assert "note: `batches` moved on: the 3 runs read from it, and an iterator cannot be put back" in text
    assert "unread" not in text and next(unread) == 0
    assert sum(1 for _ in batches) == 7  # three of ten were read by the runs, as three calls by hand read them


def test_a_step_whose_batch_is_taken_outside_it_gets_no_note() -> None:
    model, optimizer, it = _parts(0)
    x, y = next(it)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    assert "note:" not in str(bt.diagnose(step, model, optimizer))
    assert _next_first_value(it) == 4.0  # the second batch: the runs read nothing from it


def _from_a_list(data: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    yield from data


def _item_by_item(data: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    for item in data:  # noqa: UP028  # the shape a learner writes, its item a variable of the frame
        yield item


@pytest.mark.parametrize("made", [iter, _from_a_list, _item_by_item], ids=["iter", "yield from", "for-yield"])
def test_an_iterator_over_a_list_or_a_started_generator_the_step_reads_is_said_to_have_moved(made: Any) -> None:
    """``iter(batches)`` and a generator already started (its place in its frame is the same yield at each item):
    no note said the runs had moved them. The truth: three calls by hand leave the next item three further on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    data = [torch.randn(3, 2) for _ in range(10)]
    it = made(data)
    assert next(it) is data[0]

    def step() -> None:
        model(next(it)).sum().backward()

    shown = str(bt.diagnose(step, model))
    told = "moved on" if made is _item_by_item else "is 3 batches further on"  # a frame's names do not count
    assert f"note: `it` {told}: the 3 runs read from it" in shown, shown
    assert next(it) is data[4]
