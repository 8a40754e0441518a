"""The Chinese layer (README.zh-CN.md, docs/zh/, docs/glossary.md, the guides docs/setup.zh-CN.md and
docs/watch.zh-CN.md) stays in step with the notebooks and the English guides.

Every notebook has its page ``docs/zh/NAME.md`` and every page its notebook. A page cites a figure from its
notebook's committed outputs by wrapping it in a marker, which GitHub and the offline copy do not show:

* ``<!--fig-->258.8 KiB<!--/fig-->``: a figure an output prints that nbval compares (a cell without the
  ``nbval-ignore-output`` tag), so it is the same on every machine. The text between the markers must occur
  verbatim in those outputs (runs of spaces may differ), not as part of a longer number or word.
* ``<!--fig:varies-->1.38x<!--/fig-->``: a machine-dependent figure (a time, a profiler peak, a training
  result) from an ``nbval-ignore-output`` cell. Its value changes whenever the notebook is re-executed, so
  only its form is checked: the text with every run of digits taken as any number must occur in those
  outputs. The page must say it is this run's figure.
* ``<!--fig:varies@03_gan_step-->0.89x<!--/fig-->`` (or ``<!--fig@NAME-->``): the same, from another
  notebook's outputs, for a page that compares its lesson with a later one.

Every page also shows its notebook's key experiment as one or more ``python`` code blocks (5 to 15 lines,
``import torch`` first, nothing from the notebook's namespace), each followed, after at most one line of
prose, by a ``text`` block with what it prints. The test runs each block in a fresh interpreter (this
one's Python, so the course's environment) and compares what it prints, line for line, with the page: a
page that states a verdict shows the output that gives it.

A number with a unit (B, KiB, MiB, GiB, ms, s, %, x, 倍) outside code and outside a marker fails, so no
measured figure goes unchecked. Links from these files to notebooks must land on a heading that exists
(the anchor nbconvert and JupyterLab give it), and every other relative link on a file that exists.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ZH = ROOT / "docs" / "zh"
PAGES = sorted(ZH.glob("*.md"))
SETUP, SETUP_ZH = ROOT / "docs" / "setup.md", ROOT / "docs" / "setup.zh-CN.md"
LAYER = [ROOT / "README.zh-CN.md", SETUP_ZH, ROOT / "docs" / "watch.zh-CN.md", ROOT / "docs" / "glossary.md", *PAGES]
# The H2 headings of every page, in this order.
PARTS = ["问题", "你会看到什么", "流行说法与实测", "规则"]
IGNORED = "nbval-ignore-output"
KINDS = {None: "compared", "varies": "varies"}

MARKER = re.compile(
    r"<!--\s*fig(?::(?P<kind>[\w-]+))?(?:@(?P<notebook>[\w-]+))?\s*-->(?P<text>.*?)"
    r"<!--\s*/fig\s*-->",
    re.DOTALL,
)
ANY_MARKER = re.compile(r"<!--\s*/?\s*fig\b[^>]*-->")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
# A measured figure: a number and a unit (Latin units end at a word boundary; 倍 may run into the next word).
PYTHON_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE
)
# What follows a python block: blank lines, at most one line of prose, then the text block it prints.
PRINTED_BLOCK = re.compile(
    r"\n(?:[ \t]*\n)*(?:(?![ \t]*```)[^\n]*\S[^\n]*\n(?:[ \t]*\n)*)?"
    r"(?P<indent>[ \t]*)```text[ \t]*\n(?P<printed>.*?)^(?P=indent)```[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
CODE_LINES = range(5, 16)
UNIT_FIGURE = re.compile(
    r"(?<![A-Za-z0-9_.,])\d[\d,]*(?:\.\d+)?\s*"
    r"(?:(?:B|KiB|MiB|GiB|ms|µs|s|%|x|×)(?![A-Za-z0-9_])|倍)"
)


# -- reading the notebooks --------------------------------------------------------------------------
def output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    parts = ["".join(data.get("text/plain", ""))]
    if "text/html" in data:
        parts.append(html.unescape(re.sub(r"<[^>]+>", " ", "".join(data["text/html"]))))
    return "\n".join(parts)


def outputs(notebook: Path) -> dict[str, str]:
    """The committed outputs' text: 'compared' (cells nbval compares) and 'varies' (nbval-ignore-output).

    Error outputs (tracebacks) are never compared by nbval, so they count in neither.
    """
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = {"compared": [], "varies": []}
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "nbval-skip" in tags:
            continue
        texts = [output_text(output) for output in cell.get("outputs", []) if output.get("output_type") != "error"]
        found["varies" if IGNORED in tags else "compared"] += texts
    return {kind: "\n".join(texts) for kind, texts in found.items()}


def heading_anchors(notebook: Path) -> set[str]:
    """The ids nbconvert (and so nbviewer and the offline copy) gives the notebook's headings; JupyterLab
    makes the same ones from the heading text."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    anchors = set()
    for cell in cells:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            anchors |= set(re.findall(r'<h[1-6] id="([^"]+)"', markdown2html_mistune(source)))
    return {unquote(anchor) for anchor in anchors}


def markdown_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (lower case, punctuation dropped, spaces as '-')."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6}\s+(.+)$", text, re.MULTILINE)
    }


# -- reading the pages ------------------------------------------------------------------------------
def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def prose(text: str) -> str:
    """The text a reader sees as prose: code blocks, code spans, markers with their figures, link targets
    and other comments blanked out (same length, so line numbers still hold)."""
    blank = lambda match: re.sub(r"[^\n]", " ", match.group(0))  # noqa: E731
    for pattern in (FENCE, CODE_SPAN, MARKER, re.compile(r"<!--.*?-->", re.DOTALL), re.compile(r"\]\([^)]*\)")):
        text = pattern.sub(blank, text)
    return text


def figure_pattern(figure: str, kind: str) -> re.Pattern:
    """The figure as it must occur in the outputs: verbatim ('compared') or with any digits ('varies')."""
    pieces = re.split(r"(\d+|\s+)", figure.strip())
    parts = []
    for piece in pieces:
        if not piece:
            continue
        if piece.isspace():
            parts.append(r"\s+")
        elif piece.isdigit() and kind == "varies":
            parts.append(r"\d+")
        else:
            parts.append(re.escape(piece))
    return re.compile(r"(?<![A-Za-z0-9_.,])" + "".join(parts) + r"(?![A-Za-z0-9_]|[.,]\d)")


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# -- tests --------------------------------------------------------------------------------------------
def test_every_notebook_has_a_chinese_page() -> None:
    assert NOTEBOOKS, "no notebooks under notebooks/"
    missing = [notebook.name for notebook in NOTEBOOKS if not (ZH / f"{notebook.stem}.md").exists()]
    assert not missing, (
        f"notebooks without a Chinese page in docs/zh/: {', '.join(missing)}. Write docs/zh/NAME.md from the "
        "notebook's committed outputs, in the form of docs/zh/01_graph_buffers.md (see this file's docstring "
        "for citing figures), and add it to README.zh-CN.md's course map."
    )


def test_every_chinese_page_belongs_to_a_notebook() -> None:
    orphans = [page.name for page in PAGES if not (ROOT / "notebooks" / f"{page.stem}.ipynb").exists()]
    assert not orphans, f"docs/zh/ pages without a notebook of the same name: {', '.join(orphans)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_page_has_the_four_parts_and_links_its_notebook(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    headings = re.findall(r"^##\s+(.+?)\s*$", FENCE.sub("", text), re.MULTILINE)
    present = [part for part in PARTS if part in headings]
    assert present == PARTS and [h for h in headings if h in PARTS] == PARTS, (
        f"{page_id(page)}: expected the sections {' / '.join('## ' + p for p in PARTS)} in this order; found {headings}"
    )
    targets = [match.group("target").strip("<>") for match in LINK.finditer(text)]
    own = f"../../notebooks/{page.stem}.ipynb"
    assert own in [target.split("#")[0] for target in targets], f"{page_id(page)} never links to {own}"
    assert any(target.startswith(own + "#") for target in targets), f"{page_id(page)} links to no section of {own}"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_cited_figures_are_in_the_notebooks_committed_outputs(page: Path) -> None:
    own = ROOT / "notebooks" / f"{page.stem}.ipynb"
    if not own.exists():
        pytest.skip(f"no notebook {own.name} (reported by test_every_chinese_page_belongs_to_a_notebook)")
    text = page.read_text(encoding="utf-8")
    markers = list(MARKER.finditer(text))
    assert any(not match.group("notebook") for match in markers), (
        f"{page_id(page)} cites no figure from {own.name} (wrap each in <!--fig-->...<!--/fig-->)"
    )
    printed_by: dict[Path, dict[str, str]] = {}
    problems = []
    for match in markers:
        kind, figure = KINDS.get(match.group("kind")), match.group("text").strip()
        notebook = ROOT / "notebooks" / f"{match.group('notebook') or page.stem}.ipynb"
        where = f"{page_id(page)}, line {line_of(text, match.start())}: {figure!r}"
        if not figure or kind is None or ANY_MARKER.search(figure) or not notebook.exists():
            continue  # reported by test_markers_are_well_formed
        printed = printed_by.setdefault(notebook, outputs(notebook))
        if figure_pattern(figure, kind).search(printed[kind]):
            continue
        if kind == "compared" and figure_pattern(figure, "compared").search(printed["varies"]):
            problems.append(
                f"{where} is printed only by an {IGNORED} cell of {notebook.name}, whose value "
                "changes from machine to machine: cite it as <!--fig:varies-->...<!--/fig--> "
                "(and say it is this run's figure), or cite a compared output"
            )
        elif kind == "compared":
            problems.append(
                f"{where} is not in the compared outputs of {notebook.name} (the figure changed, or "
                "the notebook no longer prints it): update the page from the committed outputs"
            )
        elif figure_pattern(figure, "compared").search(printed["compared"]):
            problems.append(
                f"{where} is marked fig:varies, but {notebook.name} prints it in an output that nbval "
                "compares, the same on every machine: cite it as <!--fig-->...<!--/fig-->"
            )
        else:
            problems.append(f"{where}: no figure of this form in the {IGNORED} outputs of {notebook.name}")
    assert not problems, "figures the Chinese page cites that its notebook does not print:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_varying_figures_are_the_committed_runs(page: Path) -> None:
    """A fig:varies figure changes from machine to machine, but the page says "this run's": it must be the value the
    committed notebook prints, so that re-executing a notebook without updating its page fails here."""
    text = page.read_text(encoding="utf-8")
    printed_by: dict[Path, dict[str, str]] = {}
    stale = []
    for match in MARKER.finditer(text):
        figure = match.group("text").strip()
        notebook = ROOT / "notebooks" / f"{match.group('notebook') or page.stem}.ipynb"
        if KINDS.get(match.group("kind")) != "varies" or not figure or not notebook.exists():
            continue
        printed = printed_by.setdefault(notebook, outputs(notebook))
        if not figure_pattern(figure, "compared").search(printed["varies"]):
            stale.append(f"line {line_of(text, match.start())}: {figure!r}")
    assert not stale, f"{page_id(page)} cites figures its notebook's committed run does not print: {stale}"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_measured_figures_are_all_marked(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    seen = prose(text)
    unmarked = [f"line {line_of(seen, m.start())}: {m.group(0)!r}" for m in UNIT_FIGURE.finditer(seen)]
    assert not unmarked, (
        f"{page_id(page)}: measured figures outside <!--fig-->...<!--/fig--> markers, which "
        "no test checks against the notebook:\n" + "\n".join(unmarked)
    )


@pytest.mark.parametrize("path", LAYER, ids=lambda path: page_id(path))
def test_markers_are_well_formed(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{page_id(path)} does not exist")
    text = path.read_text(encoding="utf-8")
    problems = []
    in_code = [
        m.group(0)[:60]
        for pattern in (FENCE, CODE_SPAN)
        for m in pattern.finditer(text)
        if ANY_MARKER.search(m.group(0))
    ]
    if in_code and path.parent == ZH:
        problems.append(f"markers inside code, where they show as text and cite nothing: {in_code}")
    for pattern in (FENCE, CODE_SPAN):  # code may show the convention (README.zh-CN.md does)
        text = pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)
    for match in MARKER.finditer(text):
        where = f"line {line_of(text, match.start())}"
        if match.group("kind") not in KINDS:
            problems.append(f"{where}: unknown kind fig:{match.group('kind')} (use <!--fig--> or <!--fig:varies-->)")
        if not match.group("text").strip() or "\n\n" in match.group("text") or ANY_MARKER.search(match.group("text")):
            problems.append(f"{where}: a marker must wrap one figure: {match.group(0)[:80]!r}")
        cited = match.group("notebook")
        if cited and not (ROOT / "notebooks" / f"{cited}.ipynb").exists():
            problems.append(f"{where}: fig@{cited} names no notebook under notebooks/")
    starts = [line_of(text, m.start()) for m in re.finditer(r"^[ \t]*(?:>[ \t]*)?<!--\s*/?\s*fig", text, re.MULTILINE)]
    if starts:
        problems.append(
            f"lines {starts} start with a marker, which Markdown reads as the start of an HTML block "
            "(it splits the paragraph): put text before it on the same line"
        )
    leftovers = ANY_MARKER.findall(MARKER.sub("", text))
    if leftovers:
        problems.append(f"unpaired markers: {leftovers}")
    if path.parent != ZH and MARKER.search(text):
        problems.append("figures are cited only in docs/zh/ pages, each of which belongs to one notebook")
    assert not problems, f"{page_id(path)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", LAYER, ids=lambda path: page_id(path))
def test_links_land_on_files_and_headings_that_exist(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{page_id(path)} does not exist")
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for match in LINK.finditer(text):
        target = match.group("target").strip("<>")
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
            continue
        file_part, _, fragment = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists():
            shown = destination.relative_to(ROOT) if ROOT in destination.parents else destination
            broken.append(f"[{match.group('text')}]({target}): {shown} does not exist")
            continue
        if not fragment:
            continue
        if destination.suffix == ".ipynb":
            anchors = heading_anchors(destination)
        elif destination.suffix == ".md":
            anchors = markdown_anchors(destination)
        else:
            continue
        if unquote(fragment) not in anchors:
            broken.append(f"[{match.group('text')}]({target}): {destination.name} has no heading #{fragment}")
    assert not broken, f"{page_id(path)}: broken links:\n" + "\n".join(broken)


def test_readme_links_to_the_chinese_readme_at_the_top() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = readme.split("```", 1)[0]
    assert "README.zh-CN.md" in top, "README.md must link to README.zh-CN.md before its first code block"


def test_chinese_readme_covers_what_the_brief_promises() -> None:
    zh = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", zh, re.DOTALL)
    assert first_block and "make lab" in first_block.group(1) and "make test" in first_block.group(1), (
        "README.zh-CN.md must show the two commands (make lab, make test) in its first code block"
    )
    links = {match.group("target").strip("<>") for match in LINK.finditer(zh)}
    for page in PAGES:
        assert f"docs/zh/{page.name}" in links, f"README.zh-CN.md does not link to docs/zh/{page.name}"
    assert "docs/glossary.md" in links, "README.zh-CN.md does not link to the glossary"
    for url in set(re.findall(r"https://mybinder\.org/v2/gh/[^\s)]+", readme)):
        assert url in zh, f"README.zh-CN.md lacks README.md's Binder link {url}"
    for guide in ("docs/setup.zh-CN.md", "docs/watch.zh-CN.md"):
        assert guide in links, f"README.zh-CN.md does not link to {guide}"
    assert "make html" in zh, "README.zh-CN.md does not mention make html (the offline copy)"
    setup, setup_zh = SETUP.read_text(encoding="utf-8"), SETUP_ZH.read_text(encoding="utf-8")
    hub = re.search(r"HUB/hub/user-redirect/git-pull\?[^\s`]+", setup)
    assert hub and hub.group(0) in setup_zh, "docs/setup.zh-CN.md lacks docs/setup.md's JupyterHub (nbgitpuller) link"
    for needed in ("--index-url", "download.pytorch.org/whl/cpu", "make html"):
        assert needed in setup_zh, f"docs/setup.zh-CN.md does not mention {needed}"


# -- the pages' code ----------------------------------------------------------------------------------
def code_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """Each python block of the page: its line, its code, and the text block that follows it (None if none)."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in PYTHON_BLOCK.finditer(text):
        after = PRINTED_BLOCK.match(text, match.end())
        printed = textwrap.dedent(after.group("printed")) if after else None
        blocks.append((line_of(text, match.start()), textwrap.dedent(match.group("code")), printed))
    return blocks


def run_code(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """The code as a reader runs it: saved to a file in an empty folder, run by a fresh interpreter of this
    environment (a file, not ``python -c``, so tracebacks and the course's tools can read its lines)."""
    script = cwd / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8", timeout=180
    )


BLOCKS = [(page, line, code, printed) for page in PAGES for line, code, printed in code_blocks(page)]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_page_shows_a_minimal_runnable_example(page: Path) -> None:
    blocks = code_blocks(page)
    assert blocks, (
        f"{page_id(page)} has no python code block: show the notebook's key experiment in 5 to "
        f"{CODE_LINES[-1]} lines of plain PyTorch, followed by a text block with what it prints"
    )
    problems = []
    for line, code, printed in blocks:
        lines = [row for row in code.splitlines() if row.strip()]
        if len(lines) not in CODE_LINES:
            problems.append(
                f"line {line}: {len(lines)} lines of code; a minimal example has {CODE_LINES[0]} to {CODE_LINES[-1]}"
            )
        if not re.search(r"^import torch\b", code, re.MULTILINE):
            problems.append(
                f"line {line}: the example does not start from `import torch`, so a reader cannot "
                "paste it into a fresh interpreter"
            )
        if printed is None:
            problems.append(f"line {line}: no ```text block after the code showing what it prints")
    assert not problems, f"{page_id(page)}:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "page, line, code, printed", BLOCKS, ids=[f"{page.stem}-line{line}" for page, line, _, _ in BLOCKS]
)
def test_page_code_runs_and_prints_what_the_page_shows(
    page: Path, line: int, code: str, printed: str | None, tmp_path: Path
) -> None:
    result = run_code(code, tmp_path)
    assert result.returncode == 0, f"{page_id(page)}, the code block at line {line} failed:\n{result.stderr[-3000:]}"
    if printed is None:
        return  # reported by test_page_shows_a_minimal_runnable_example
    got = [row.rstrip() for row in result.stdout.rstrip().splitlines()]
    shown = [row.rstrip() for row in printed.rstrip().splitlines()]
    assert got == shown, (
        f"{page_id(page)}, the code block at line {line} prints something other than the "
        "text block under it (update the page from the real output, or the code):\n"
        f"printed:\n" + "\n".join(got) + "\npage shows:\n" + "\n".join(shown)
    )
