"""Charts as PNG images: :class:`PngFigure` is a matplotlib figure that Jupyter shows as a PNG without pyplot, so
charts render the same in a fresh kernel, under nbconvert and on GitHub; :func:`style_count_axes` dresses a chart
that counts. Kept apart from :mod:`helpers.display`, so that the tool, which draws no chart, never loads matplotlib.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["PngFigure", "style_count_axes"]


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
