"""How the course and the tool show what they measure as text: byte counts and tables (charts are
:mod:`helpers.figures`', which needs matplotlib: the tool does not).

``format_bytes`` writes a byte count the way every notebook prints it. :class:`Table` shows rows as an
HTML table in Jupyter and as aligned text elsewhere (and in nbval's comparisons).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from backward_twice.common.units import format_bytes

__all__ = ["Table", "exact_bytes"]


def exact_bytes(n: int) -> str:
    """``665600`` -> ``'665,600 B (650.0 KiB)'``: the exact count a panel shows, with its rounded size."""
    return f"{n:,} B ({format_bytes(n)})" if n >= 1024 else f"{n:,} B"


class Table:
    """Rows of values shown as an HTML table in Jupyter and as aligned text elsewhere.

    Used by notebooks 02_multi_loss and 04_carried_state.
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
