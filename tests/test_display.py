"""helpers.display: byte counts as the notebooks print them, tables as text and HTML, charts as PNG."""

from __future__ import annotations

import pytest

from backward_twice.common.units import format_bytes
from helpers.display import Table
from helpers.figures import PngFigure


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (3 * 1024**2, "3.0 MiB"),
        (5 * 1024**3, "5.0 GiB"),
        (2048 * 1024**3, "2048.0 GiB"),
    ],
)
def test_format_bytes(n, expected):
    assert format_bytes(n) == expected


def test_table_text_and_html():
    t = Table(["name", "value"], [["a<b", 1], ["longer name", 22]])
    lines = repr(t).splitlines()
    assert lines[0].split() == ["name", "value"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert len(lines) == 4
    # columns are aligned: the second column starts at the same place on every row
    starts = {line.index(cell) for line, cell in zip([lines[0], lines[2], lines[3]], ["value", "1", "22"])}
    assert len(starts) == 1
    html = t._repr_html_()
    assert html.startswith("<table") and html.count("<tr>") == 3
    assert "a&lt;b" in html and "a<b" not in html
    assert t.column("value") == [1, 22]
    with pytest.raises(KeyError):
        t.column("missing")
    with pytest.raises(ValueError):
        Table(["one", "two"], [[1]])


def test_a_png_figure_shows_as_a_png_without_pyplot() -> None:
    figure = PngFigure(figsize=(2, 1), dpi=50)
    figure.add_subplot().plot([0, 1], [1, 0])
    png, metadata = figure._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == figure.to_png()
    assert repr(figure).startswith("<Figure size")
    assert metadata == {"alt": figure.alt_text()}


def test_a_png_figure_describes_itself_for_screen_readers() -> None:
    figure = PngFigure()
    assert figure.alt_text() == "Chart. empty."
    left, right = figure.subplots(1, 2)
    left.plot([0, 1], label="d_loss")
    left.plot([1, 0], label="g_loss")
    left.set(title="Losses", xlabel="training step", ylabel="loss")
    left.legend()
    right.set_xlabel("iteration")
    assert figure.alt_text() == (
        'Chart. Losses: loss against training step (legend: "d_loss", "g_loss"); a panel: against iteration.'
    )


def test_the_alt_text_reaches_the_output_metadata() -> None:
    from IPython.core.formatters import DisplayFormatter

    figure = PngFigure()
    figure.add_subplot().set_title("t")
    data, metadata = DisplayFormatter().format(figure)
    assert data["image/png"].startswith(b"\x89PNG") and metadata == {"image/png": {"alt": "Chart. t."}}
