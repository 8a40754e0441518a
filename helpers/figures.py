"""Charts that show as PNG images in Jupyter, and stay in the saved notebook, without pyplot.

A plain ``matplotlib.figure.Figure`` returned from a cell shows only as ``<Figure size ...>``
unless pyplot's inline backend has been started. Every chart the helpers make is a
:class:`PngFigure`, so it renders the same in a fresh kernel, under nbconvert and on GitHub.

Used by notebooks 01_graph_buffers, 02_multi_loss and 03_gan_step (through the helpers' charts).
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["PngFigure"]


class PngFigure(Figure):
    """A matplotlib Figure with its own Agg canvas that Jupyter shows as a PNG image.

    Used by the charts of notebooks 01_graph_buffers, 02_multi_loss and 03_gan_step.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        FigureCanvasAgg(self)

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__, "Figure", 1)

    def to_png(self) -> bytes:
        """The figure as PNG bytes."""
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.to_png()
