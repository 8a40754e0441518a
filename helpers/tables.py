"""Small tables measured live: which operations save what, and whether a second backward works.

Used by notebook 01_graph_buffers (and, for its :class:`Table`, notebooks 02 and 03).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from helpers.graph import saved_tensors_of
from helpers.meter import format_bytes

__all__ = ["Table", "operation_table"]


class Table:
    """Rows of values shown as an HTML table in Jupyter and as aligned text elsewhere.

    Used by notebooks 01_graph_buffers and 02_multi_loss.
    """

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.columns = list(columns)
        self.rows = [list(row) for row in rows]
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"Table row {row!r} has {len(row)} cells; expected {len(self.columns)}.")

    def column(self, name: str) -> list[Any]:
        """The values of one column, by its header."""
        if name not in self.columns:
            raise KeyError(f"No column {name!r}; the columns are {self.columns}.")
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def __repr__(self) -> str:
        cells = [self.columns] + [[str(v) for v in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        # Inline padding: inside a widget (the panels' result tables) no notebook stylesheet applies.
        cell = "text-align:left;padding:2px 12px 2px 0;vertical-align:top"
        head = "".join(f"<th style='{cell}'>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td style='{cell}'>{html.escape(str(v))}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        return f"<table style='border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _second_backward_works(loss: torch.Tensor) -> str:
    try:
        loss.backward()
    except RuntimeError as exc:
        if "backward through the graph a second time" in str(exc):
            return "no: buffers freed"
        raise
    return "yes"


def operation_table(
    operations: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    size: int = 1000,
    seed: int = 0,
) -> Table:
    """Run each operation on fresh inputs and report what its node saved and if backward twice works.

    Each operation gets ``x`` (``size`` floats, requires grad) and ``w`` (same shape, requires
    grad; a square matrix for operations whose name contains ``matmul``), and its result is
    summed to a scalar loss. The saved tensors are read straight from the graph nodes, so a
    Python number kept as a 0-dim tensor shows too. Used by notebook 01_graph_buffers.
    """
    if not isinstance(operations, Mapping) or not operations:
        raise TypeError("operation_table() takes a non-empty dict of name -> function(x, w).")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"operation_table(size=...) is the number of floats in x and w: a whole number of at "
                         f"least 1, not {size!r}.")
    rows = []
    generator = torch.Generator().manual_seed(seed)
    for name, operation in operations.items():
        if not callable(operation):
            raise TypeError(f"operation_table(): {name!r} is not a function of (x, w).")
        side = int(size**0.5)
        shape: tuple[int, ...] = (side, side) if "matmul" in name else (size,)
        x = torch.randn(shape, generator=generator).requires_grad_()
        w = torch.randn(shape, generator=generator).requires_grad_()
        out = operation(x, w)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"operation_table(): {name!r} returned {type(out).__name__}, not a tensor.")
        loss = out.sum()
        op_node = out.grad_fn
        saved = saved_tensors_of(op_node) if op_node is not None and op_node is not loss.grad_fn else []
        saved += saved_tensors_of(loss.grad_fn)
        described = ", ".join(
            f"{info.name.removeprefix('_saved_')} {tuple(info.shape or ())}" for info in saved
        ) or "nothing"
        nbytes = sum(info.nbytes or 0 for info in saved)
        loss.backward()
        rows.append([name, type(op_node).__name__ if op_node else "-", described, format_bytes(nbytes),
                     _second_backward_works(loss)])
    return Table(["operation", "node", "saved for backward", "saved bytes", "second backward?"], rows)
