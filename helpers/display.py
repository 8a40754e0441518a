"""How the course shows what it measures: byte counts as text, tables, and charts as PNG images.

``format_bytes`` writes a byte count the way every notebook prints it. :class:`Table` shows rows as an
HTML table in Jupyter and as aligned text elsewhere (and in nbval's comparisons). :class:`PngFigure`
is a matplotlib figure that Jupyter shows as a PNG without pyplot, so charts render the same in a
fresh kernel, under nbconvert and on GitHub.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["PngFigure", "Table", "exact_bytes", "format_bytes", "style_count_axes"]


def format_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``; exact bytes below 1 KiB.

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state and 06_real_stack.
    """
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


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


class PngFigure(Figure):
    """A matplotlib Figure with its own Agg canvas that Jupyter shows as a PNG image.

    Its background is white unless ``facecolor`` says otherwise, whatever matplotlib style is in effect: the
    chart's black text and lines stay readable in JupyterLab's dark theme, where a transparent PNG would show
    them on a dark page. The PNG goes out with a text description (:meth:`alt_text`) in its output metadata,
    which the offline copy writes into the image's ``alt`` attribute for screen readers (JupyterLab's own
    image renderer reads no alt text).

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step and 04_carried_state.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("facecolor", "white")
        super().__init__(*args, **kwargs)
        FigureCanvasAgg(self)

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__, "Figure", 1)

    def to_png(self) -> bytes:
        """The figure as PNG bytes."""
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", facecolor=self.get_facecolor(), transparent=False)
        return buffer.getvalue()

    def alt_text(self) -> str:
        """What the chart shows, in words: each panel's title, what it plots against what, and its
        legend's entries, e.g. 'Chart. Losses: loss against training step (legend: "d_loss", "g_loss").'."""
        panels = []
        for axes in self.axes:
            text = axes.get_title() or "a panel"
            x, y = axes.get_xlabel(), axes.get_ylabel()
            if y:
                text += f": {y}" + (f" against {x}" if x else "")
            elif x:
                text += f": against {x}"
            legend = axes.get_legend()
            if legend is not None:
                text += " (legend: " + ", ".join(f'"{entry.get_text()}"' for entry in legend.get_texts()) + ")"
            panels.append(text)
        return "Chart. " + ("; ".join(panels) if panels else "empty") + "."

    def _repr_png_(self) -> tuple[bytes, dict[str, str]]:
        # IPython puts the dict in the output's metadata under "image/png".
        return self.to_png(), {"alt": self.alt_text()}


def style_count_axes(axes: Any, title: str, xlabel: str, title_size: float | None = None) -> None:
    """Dress one chart whose x axis counts things (actions, iterations): its title and x label, whole
    numbers on the x axis, the y axis from 0 (a count of bytes or nodes), a light grid.

    Used by notebooks 01_graph_buffers, 02_multi_loss and 04_carried_state, and by :class:`BackwardLab` and
    :class:`CarriedLab`.
    """
    axes.set_title(title, fontsize=title_size)
    axes.set_xlabel(xlabel)
    axes.set_ylim(bottom=0)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
