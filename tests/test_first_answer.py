"""The first answer: the section right after the title of README.md and README.zh-CN.md, for a reader who
has the error on screen now, kept in step with the notebooks.

The section is a table, one row per shape of code: the error message (quoted in a code span; a row
without one continues the message above), the shape that raises it, the fix, and links to the notebook
sections that show both. The checks:

* it is the first thing after the title block (the title, the tagline, the language link) of both
  READMEs, and of the offline copy's index page and Chinese index, which render it from the READMEs;
* every message it quotes is raised by a committed output of a notebook the row links: an error output,
  or the "Raised, as expected" output of ``bt.expect_error``;
* every link lands on a notebook heading that exists (the anchors tests/test_zh_layer.py checks);
* every fix appears in the sections the row links (their markdown, code or outputs): each code span of
  the fix verbatim, or, for a fix in words only, its words;
* the Chinese table has the English one's rows: the same messages, links and code in the same order.
"""

from __future__ import annotations

import json
import re
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_zh_layer import CODE_SPAN, FENCE, LINK, heading_anchors, output_text

ROOT = Path(__file__).resolve().parent.parent
READMES = {"en": ROOT / "README.md", "zh": ROOT / "README.zh-CN.md"}
LANGUAGE_LINK = {"en": "README.zh-CN.md", "zh": "README.md"}
COLUMNS = 4  # message, shape, fix, read
RAISED = re.compile(r"Raised, as expected: [\w.]+\n((?:[ \t]+\S.*(?:\n|$))+)")


# -- reading the READMEs ----------------------------------------------------------------------------
def blank_code_blocks(text: str) -> str:
    return FENCE.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)


def title_block_and_section(text: str) -> tuple[str, str]:
    """What comes before the first ``##`` heading, and the first section (its heading up to the next)."""
    starts = [match.start() for match in re.finditer(r"^##\s", blank_code_blocks(text), re.MULTILINE)]
    assert starts, "the README has no ## section"
    end = starts[1] if len(starts) > 1 else len(text)
    return text[: starts[0]], text[starts[0] : end]


def code_spans(cell: str) -> list[str]:
    return [match.group(0).strip("`").strip() for match in CODE_SPAN.finditer(cell)]


def cells(line: str) -> list[str]:
    """A table row's cells; a '|' inside a code span is no separator."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    found, current, in_code = [], "", False
    for char in inner:
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            found.append(current.strip())
            current = ""
        else:
            current += char
    return [*found, current.strip()]


def rows(language: str) -> list[dict]:
    """The first answer's table: for each row its messages, shape, fix, links (notebook, anchor) and line."""
    text = READMES[language].read_text(encoding="utf-8")
    _, section = title_block_and_section(text)
    offset = text.index(section)
    table = [
        (text.count("\n", 0, offset + match.start()) + 1, match.group(0))
        for match in re.finditer(r"^\|.*\|[ \t]*$", section, re.MULTILINE)
    ]
    assert len(table) > 2, f"{READMES[language].name}: the first section has no table"
    found, messages = [], []
    for line_number, line in table[2:]:  # after the header and the separator
        row = cells(line)
        assert len(row) == COLUMNS, f"{READMES[language].name}, line {line_number}: {len(row)} cells, not {COLUMNS}"
        if row[0]:
            messages = code_spans(row[0])
        links = []
        for match in LINK.finditer(row[3]):
            target = match.group("target").strip("<>")
            path, _, anchor = target.partition("#")
            links.append((path, unquote(anchor)))
        found.append({"line": line_number, "messages": messages, "shape": row[1], "fix": row[2], "links": links})
    return found


def where(language: str, row: dict) -> str:
    return f"{READMES[language].name}, line {row['line']}"


# -- reading the notebooks --------------------------------------------------------------------------
def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@cache
def raised_messages(notebook: Path) -> str:
    """Every error message the notebook's committed outputs show raised, whitespace runs as one space."""
    messages = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                messages.append(output.get("evalue", ""))
            elif output.get("output_type") == "stream":
                messages += RAISED.findall("".join(output.get("text", "")))
    return "\n".join(normalized(message) for message in messages)


@cache
def sections(notebook: Path) -> dict[str, str]:
    """Each heading's anchor -> the text of its section (markdown, code and outputs, up to the next heading
    of the same or a higher level), whitespace runs as one space."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    pieces: list[tuple[int, str | None, str]] = []  # (heading level or 0, anchor, text)
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            pieces.append((0, None, "\n".join([source, *map(output_text, cell.get("outputs", []))])))
            continue
        for line in source.splitlines():
            heading = re.match(r"^(#{1,6})\s+\S", line)
            anchor = re.search(r'<h[1-6] id="([^"]+)"', markdown2html_mistune(line)) if heading else None
            pieces.append(
                (len(heading.group(1)), unquote(anchor.group(1)), line) if heading and anchor else (0, None, line)
            )
    found = {}
    for index, (level, anchor, _) in enumerate(pieces):
        if anchor is None:
            continue
        end = next((later for later in range(index + 1, len(pieces)) if 0 < pieces[later][0] <= level), len(pieces))
        found[anchor] = normalized("\n".join(text for _, _, text in pieces[index:end]))
    return found


def notebook_of(path: str) -> Path:
    return (ROOT / path).resolve()


# -- the READMEs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("language", READMES)
def test_the_first_answer_comes_right_after_the_title(language: str) -> None:
    readme = READMES[language]
    title_block, section = title_block_and_section(readme.read_text(encoding="utf-8"))
    lines = [line.strip() for line in title_block.splitlines() if line.strip()]
    assert lines and lines[0].startswith("# "), f"{readme.name} does not start with its title"
    others = [
        line for line in lines[1:] if not re.fullmatch(r"\*\*[^*]+\*\*", line) and LANGUAGE_LINK[language] not in line
    ]
    assert not others, (
        f"{readme.name}: between the title and the first answer there is more than the tagline "
        f"and the language link: {others}"
    )
    assert re.search(r"^\|.*\|[ \t]*$", section, re.MULTILINE), (
        f"{readme.name}: the first section after the title, {section.splitlines()[0]!r}, is not the first answer "
        "(it has no table of error messages)"
    )


@pytest.mark.parametrize("language", READMES)
def test_every_row_quotes_a_message_links_a_section_and_gives_a_fix(language: str) -> None:
    problems = []
    for row in rows(language):
        if not row["messages"]:
            problems.append(f"{where(language, row)}: no error message quoted (in a code span) above this row")
        if not row["links"] or any(not path.endswith(".ipynb") or not anchor for path, anchor in row["links"]):
            problems.append(
                f"{where(language, row)}: every link must go to a section of a notebook "
                f"(notebooks/NN.ipynb#Anchor): {row['links']}"
            )
        if not row["shape"] or not row["fix"]:
            problems.append(f"{where(language, row)}: a row says the shape of the code and the fix")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("language", READMES)
def test_every_link_lands_on_a_notebook_heading(language: str) -> None:
    broken = []
    for row in rows(language):
        for path, anchor in row["links"]:
            notebook = notebook_of(path)
            if not notebook.exists():
                broken.append(f"{where(language, row)}: {path} does not exist")
            elif anchor not in heading_anchors(notebook):
                broken.append(f"{where(language, row)}: {notebook.name} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("language", READMES)
def test_every_message_is_raised_by_a_linked_notebook(language: str) -> None:
    problems = []
    for row in rows(language):
        notebooks = sorted({notebook_of(path) for path, _ in row["links"] if notebook_of(path).exists()})
        raised = "\n".join(raised_messages(notebook) for notebook in notebooks)
        for message in row["messages"]:
            quoted = normalized(message.removesuffix("...").removesuffix("…"))
            if quoted not in raised:
                problems.append(
                    f"{where(language, row)}: no committed output of {[nb.name for nb in notebooks]} "
                    f"raises {message!r} (quote the message as the notebook prints it)"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("language", ["en"])
def test_every_fix_is_in_the_sections_the_row_links(language: str) -> None:
    problems = []
    for row in rows(language):
        text = "\n".join(
            sections(notebook_of(path)).get(anchor, "") for path, anchor in row["links"] if notebook_of(path).exists()
        )
        spans = code_spans(row["fix"])
        words = normalized(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", row["fix"])).rstrip(".;")
        for fix in spans or [words]:
            if normalized(fix).lower() not in text.lower():
                problems.append(
                    f"{where(language, row)}: the fix {fix!r} is not in the sections it links "
                    f"{[anchor for _, anchor in row['links']]}"
                )
    assert not problems, "the first answer gives fixes its sections do not show:\n" + "\n".join(problems)


def test_the_chinese_table_has_the_english_rows() -> None:
    english, chinese = rows("en"), rows("zh")
    assert len(chinese) == len(english), (
        f"README.zh-CN.md's first answer has {len(chinese)} rows, README.md's {len(english)}"
    )
    problems = []
    for en, zh in zip(english, chinese):
        for key in ("messages", "links"):
            if en[key] != zh[key]:
                problems.append(f"{where('zh', zh)}: {key} {zh[key]} differ from {where('en', en)}: {en[key]}")
        if code_spans(en["fix"]) != code_spans(zh["fix"]):
            problems.append(
                f"{where('zh', zh)}: the fix's code {code_spans(zh['fix'])} differs from "
                f"{where('en', en)}: {code_spans(en['fix'])}"
            )
    assert not problems, "\n".join(problems)


# -- the offline copy -------------------------------------------------------------------------------
class Outline(HTMLParser):
    """The top-level elements of a page's <main> (tag and text), and the rows of each table (cell texts)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[list[str]] = []
        self.tables: list[list[list[str]]] = []
        self._depth, self._in_main = 0, False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "main":
            self._in_main, self._depth = True, 0
            return
        if not self._in_main or tag in ("br", "img", "hr", "meta", "input"):
            return
        if self._depth == 0:
            self.elements.append([tag, ""])
            if tag == "table":
                self.tables.append([])
        if tag == "tr" and self.elements[-1][0] == "table":
            self.tables[-1].append([])
        if tag in ("td", "th") and self.elements[-1][0] == "table":
            self.tables[-1][-1].append("")
        self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "main":
            self._in_main = False
        elif self._in_main and tag not in ("br", "img", "hr", "meta", "input"):
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._in_main and self._depth > 0:
            self.elements[-1][1] += data
            if self.elements[-1][0] == "table" and self.tables[-1] and self.tables[-1][-1]:
                self.tables[-1][-1][-1] += data


def shown_text(markdown_cell: str) -> str:
    """A table cell as a browser shows it: code spans without backticks, links as their text."""
    text = re.sub(r"(?<!!)\[([^\]]*)\]\((?:<[^>]*>|[^)\s]+)\)", r"\1", markdown_cell)
    return normalized(text.replace("`", ""))


@pytest.mark.parametrize("language, page", [("en", "index.html"), ("zh", "zh/index.html")])
def test_the_site_index_opens_with_the_same_first_answer(site: Path, language: str, page: str) -> None:
    outline = Outline((site / page).read_text(encoding="utf-8"))
    tags = [tag for tag, _ in outline.elements]
    assert tags and tags[0] == "h1", f"site/{page} does not start with its title: {tags[:5]}"
    _, section = title_block_and_section(READMES[language].read_text(encoding="utf-8"))
    heading = shown_text(section.splitlines()[0].lstrip("#").strip())
    headings = [index for index, (tag, text) in enumerate(outline.elements) if tag == "h2"]
    assert headings and normalized(outline.elements[headings[0]][1]) == heading, (
        f"site/{page}: the first section is not the README's first answer ({heading!r})"
    )
    between = tags[1 : headings[0]]
    assert all(tag == "p" for tag in between) and len(between) <= 2, (
        f"site/{page}: between the title and the first answer there is more than the tagline and the "
        f"language link: {between}"
    )
    table = next(index for index in range(headings[0], len(tags)) if tags[index] == "table")
    assert not any(tag.startswith("h") and tag[1:].isdigit() for tag in tags[headings[0] + 1 : table]), (
        f"site/{page}: the first answer's table is not in its section"
    )
    shown = [[normalized(cell) for cell in row] for row in outline.tables[tags[:table].count("table")][1:]]
    readme_rows = [
        [shown_text(cell) for cell in cells(line)] for line in re.findall(r"^\|.*\|[ \t]*$", section, re.MULTILINE)[2:]
    ]
    assert shown == readme_rows, f"site/{page}: the first answer's table differs from {READMES[language].name}'s"
