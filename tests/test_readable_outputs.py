"""What keeps the course's drawings, charts and error boxes readable on any page colour (JupyterLab's dark
theme included), checked without a browser; tests/browser/test_dark_theme_and_axe.py checks them rendered."""

from __future__ import annotations

import io
import re
import shutil

import ipywidgets as widgets
import matplotlib
import pytest
import torch
from PIL import Image

from backward_twice.instruments.graph import SVG_BACKGROUND, draw_graph
from helpers.figures import PngFigure
from helpers.panels import Panel


def _relative_luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_relative_luminance(a), _relative_luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_a_drawing_shown_in_jupyter_has_a_white_background_under_everything():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    loss = torch.nn.functional.mse_loss(model(torch.randn(5, 3)), torch.randn(5, 1))
    graph = draw_graph(loss, params=dict(model.named_parameters()))
    bundle, _ = graph._repr_mimebundle_()
    svg = bundle["image/svg+xml"]
    assert svg.count(SVG_BACKGROUND) == 1
    # Painted first: right after the <svg> element opens, before the drawing's group.
    assert re.search(r"<svg\b[^>]*>\s*" + re.escape(SVG_BACKGROUND) + r'<g id="graph0"', svg)
    # Only what Jupyter shows changes; graphviz's own output (and .source) stays as it was.
    assert SVG_BACKGROUND not in graph.pipe(format="svg").decode() and "bgcolor" not in graph.source


def test_png_figures_are_opaque_white_even_when_matplotlib_is_set_to_transparent():
    with matplotlib.rc_context(
        {"savefig.transparent": True, "figure.facecolor": (0, 0, 0, 0), "savefig.facecolor": "none"}
    ):
        figure = PngFigure(figsize=(2, 1), dpi=50)
        figure.add_subplot().plot([0, 1], [1, 0])
        image = Image.open(io.BytesIO(figure.to_png())).convert("RGBA")
    assert image.getpixel((1, 1)) == (255, 255, 255, 255)
    assert PngFigure(facecolor="#eeeeee").get_facecolor()[:3] != (1.0, 1.0, 1.0)  # still the caller's to choose


def test_the_panels_error_box_brings_its_own_background_and_says_error_in_words():
    panel = Panel()
    panel.status = Panel._status_line("bt-status")
    panel._show_error("RuntimeError: <boom>", "the panel still works")
    markup = panel.status.value
    assert isinstance(panel.status, widgets.HTML)
    assert "<b>Error</b>" in markup and "&lt;boom&gt;" in markup and "role='alert'" in markup
    colour = re.search(r"(?<!-)color:(#[0-9a-f]{6})", markup).group(1)
    background = re.search(r"background:(#[0-9a-f]{6})", markup).group(1)
    assert _contrast(colour, background) >= 4.5  # WCAG AA, whatever the theme's page colour


def test_carets_under_a_line_with_wide_characters_stand_under_what_they_mark() -> None:
    """``隐藏 = model(x) + h``: the caret under ``h`` stood two columns to its left, and ``损失.backward()`` got 13
    carets for its 15 columns: each CJK character takes two columns of a terminal."""
    from backward_twice.report.items import CodeLine
    from backward_twice.report.rendering import _caret_lines

    code = "\u9690\u85cf = model(x) + h"
    _, carets = _caret_lines(CodeLine("train.py:9", code, (code.index("h"), len(code)), "here"), 10)
    assert carets.index("^") - carets.index("|") - 2 == 2 * 2 + len(" = model(x) + "), carets
    call = "\u635f\u5931.backward()"
    _, carets = _caret_lines(CodeLine("train.py:12", call, (0, len(call)), "raised"), 11)
    assert carets.count("^") == 2 * 2 + len(".backward()"), carets
