"""operation_table and Table, checked against a second backward done here."""

from __future__ import annotations

import pytest
import torch

from backward_twice.common.units import format_bytes
from helpers.display import Table
from helpers.lessons.graph_buffers import operation_table

OPERATIONS = {
    "add": lambda x, w: x + w,
    "mul by tensor": lambda x, w: x * w,
    "mul by scalar": lambda x, w: x * 2,
    "relu": lambda x, w: torch.relu(x),
    "sin": lambda x, w: torch.sin(x),
    "exp": lambda x, w: torch.exp(x),
    "sigmoid": lambda x, w: torch.sigmoid(x),
    "matmul": lambda x, w: x @ w,
    "sum": lambda x, w: x.sum(),
    "mean": lambda x, w: x.mean(),
    "view": lambda x, w: x.view(4, 16),
}
SIZE = 64  # a square number, so matmul gets 8 x 8 matrices


def _second_backward_works(name: str) -> bool:
    shape = (8, 8) if name == "matmul" else (SIZE,)
    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape, requires_grad=True)
    loss = OPERATIONS[name](x, w).sum()
    loss.backward()
    try:
        loss.backward()
    except RuntimeError as exc:
        assert "backward through the graph a second time" in str(exc)
        return False
    return True


@pytest.fixture(scope="module")
def table() -> Table:
    return operation_table(OPERATIONS, size=SIZE)


def test_one_row_per_operation_in_order(table):
    assert table.columns == ["operation", "node", "saved for backward", "saved bytes", "second backward?"]
    assert table.column("operation") == list(OPERATIONS)


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_second_backward_column_agrees_with_a_real_second_backward(table, name):
    verdict = table.column("second backward?")[list(OPERATIONS).index(name)]
    works = _second_backward_works(name)
    assert verdict.startswith("yes") == works
    assert verdict.startswith("no") == (not works)


@pytest.mark.parametrize("name", ["add", "sum", "view"])
def test_operations_that_save_nothing_show_zero_bytes(table, name):
    row = table.rows[list(OPERATIONS).index(name)]
    assert row[3] == "0 B"
    assert row[2] == "nothing"  # only sizes are kept, and those are no tensors


def test_saving_operations_show_nonzero_bytes_and_the_node(table):
    rows = {row[0]: row for row in table.rows}
    for name in ("mul by tensor", "exp", "matmul", "mul by scalar"):
        assert rows[name][3] != "0 B", name
    float_bytes = torch.ones(()).element_size()
    assert rows["mul by tensor"][3] == format_bytes(2 * SIZE * float_bytes)  # x and w
    assert rows["matmul"][3] == format_bytes(2 * SIZE * float_bytes)
    assert rows["exp"][3] == format_bytes(SIZE * float_bytes)  # its result
    assert rows["exp"][1] == "ExpBackward0"
    assert rows["matmul"][1] == "MmBackward0"
    assert "result" in rows["exp"][2]
    # x * 2 keeps the Python number as a 0-dim tensor: the table must show it
    assert "other ()" in rows["mul by scalar"][2]


@pytest.mark.parametrize("bad", [{}, [("add", OPERATIONS["add"])], None, "add"])
def test_bad_operations_are_a_type_error(bad):
    with pytest.raises(TypeError):
        operation_table(bad)


def test_operation_that_is_not_a_function_or_returns_no_tensor():
    with pytest.raises(TypeError):
        operation_table({"add": 3})
    with pytest.raises(TypeError):
        operation_table({"number": lambda x, w: 1.0})


@pytest.mark.parametrize("size", [-1, 0, 2.5, "1024", True])
def test_a_size_that_is_not_a_positive_whole_number_is_named_in_the_error(size) -> None:
    with pytest.raises(ValueError, match=r"operation_table\(size=\.\.\.\) is the number of floats"):
        operation_table({"x + w": lambda x, w: x + w}, size=size)
