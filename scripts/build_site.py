"""Build the offline copy of the course: ``site/`` and ``site.zip`` (``make html``).

One HTML page per notebook, made by nbconvert from the committed, executed notebook (graphs, charts
and tables inline; the widget panels drawn from their saved widget state), an index page that opens
with README.md's first section (the answer for a reader with the error on screen), and the Chinese
layer (README.zh-CN.md, docs/zh/*.md, docs/glossary.md) and the guides (docs/setup*.md, docs/watch*.md) as HTML
pages. No page makes a request to
another host: nbconvert's CDN scripts (require.js, MathJax, mermaid, the widget renderer)
are replaced by the Jupyter widgets html-manager's standalone embed bundle, which ``make html`` installs
with npm into ``build/site-npm/`` (versions pinned in scripts/site/package-lock.json) and this script
copies into ``site/_vendor/``. Links between the course's files are rewritten to the pages built from
them; links to other files of the repository point at GitHub.

A second run with unchanged inputs rebuilds nothing: ``site/.build-info.json`` records a digest of
every input (``--force`` rebuilds anyway). The tests import ``ensure_site`` and ``offline_problems``.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import posixpath
import re
import shutil
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
TEMPLATES = ROOT / "scripts" / "site" / "templates"
PACKAGE_LOCK = ROOT / "scripts" / "site" / "package-lock.json"
NPM_DIR = ROOT / "build" / "site-npm"
HTML_MANAGER = NPM_DIR / "node_modules" / "@jupyter-widgets" / "html-manager"
SITE = ROOT / "site"
SITE_ZIP = ROOT / "site.zip"
BUILD_INFO = ".build-info.json"
VENDOR = "_vendor/html-manager"
ZIP_FOLDER = "backward-twice-site"
REPO_URL = "https://github.com/backward-twice/backward-twice/blob/main/"
# The embed bundle renders these modules' widgets itself; any other module would have to be fetched.
BUILTIN_WIDGET_MODULES = {"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"}
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What the pages are built from, besides the notebooks: source path -> page path, both relative.
MARKDOWN_PAGES = {
    "README.zh-CN.md": "zh/index.html",
    "docs/glossary.md": "glossary.html",
    "docs/setup.md": "setup.html",
    "docs/setup.zh-CN.md": "zh/setup.html",
    "docs/watch.md": "watch.html",
    "docs/watch.zh-CN.md": "zh/watch.html",
}
MAKE_HINT = "Run `make html` (it installs the pinned npm packages into build/site-npm/ first)."


class SiteBuildError(RuntimeError):
    """The site cannot be built as promised (a missing vendor bundle, a request to another host...)."""


# -- what is built from what ----------------------------------------------------------------------
def notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def zh_pages() -> list[Path]:
    return sorted((ROOT / "docs" / "zh").glob("*.md"))


def page_map() -> dict[str, str]:
    """Every source file that becomes a page (repository-relative, posix) -> its page path in the site."""
    pages = {"README.md": "index.html"}
    pages.update({f"notebooks/{path.name}": f"{path.stem}.html" for path in notebooks()})
    pages.update({f"docs/zh/{path.name}": f"zh/{path.stem}.html" for path in zh_pages()})
    pages.update({source: page for source, page in MARKDOWN_PAGES.items() if (ROOT / source).exists()})
    return pages


def pinned_html_manager_version() -> str:
    lock = json.loads(PACKAGE_LOCK.read_text(encoding="utf-8"))
    return lock["packages"]["node_modules/@jupyter-widgets/html-manager"]["version"]


def installed_html_manager_version() -> str | None:
    package = HTML_MANAGER / "package.json"
    if not package.exists():
        return None
    return json.loads(package.read_text(encoding="utf-8"))["version"]


def vendor_problem() -> str | None:
    """Why the vendored widget renderer cannot be used, or None."""
    pinned, installed = pinned_html_manager_version(), installed_html_manager_version()
    if installed is None:
        return f"the widget renderer is not installed ({HTML_MANAGER.relative_to(ROOT)} is missing). {MAKE_HINT}"
    if installed != pinned:
        return (
            f"build/site-npm has @jupyter-widgets/html-manager {installed}, but package-lock.json pins "
            f"{pinned}. {MAKE_HINT}"
        )
    if not (HTML_MANAGER / "dist" / "embed.js").exists():
        return f"{HTML_MANAGER.relative_to(ROOT)}/dist/embed.js is missing. {MAKE_HINT}"
    return None


def input_files() -> list[Path]:
    files = [
        *notebooks(),
        *zh_pages(),
        Path(__file__).resolve(),
        PACKAGE_LOCK,
        *sorted(path for path in TEMPLATES.rglob("*") if path.is_file()),
    ]
    files += [ROOT / source for source in ("README.md", *MARKDOWN_PAGES) if (ROOT / source).exists()]
    return files


def input_digest() -> str:
    from importlib.metadata import version

    digest = hashlib.sha256()
    tools = (
        f"nbconvert {version('nbconvert')}; mistune {version('mistune')}; "
        f"html-manager {installed_html_manager_version()}"
    )
    digest.update(tools.encode() + b"\n")
    for path in sorted(set(input_files())):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def is_up_to_date(out: Path = SITE) -> bool:
    info = out / BUILD_INFO
    if not info.exists():
        return False
    try:
        return json.loads(info.read_text(encoding="utf-8")).get("digest") == input_digest()
    except (OSError, ValueError):
        return False


# -- checks ---------------------------------------------------------------------------------------
# Attributes through which a page makes the browser fetch something by itself.
_FETCHING = re.compile(
    r"<(script|link|img|iframe|source|video|audio|embed|object|image|use)\b[^>]*?"
    r"\s(src|href|xlink:href|data|srcset|poster)"
    r"\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s>]+)",
    re.IGNORECASE | re.DOTALL,
)
_CSS_URL = re.compile(r"url\(\s*['\"]?\s*((?:https?:)?//[^)'\"]+)", re.IGNORECASE)
_CSS_IMPORT = re.compile(r"@import\s+['\"]((?:https?:)?//[^'\"]+)", re.IGNORECASE)
_STYLE = re.compile(r"<style\b[^>]*>(.*?)</style>", re.IGNORECASE | re.DOTALL)
_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)


def _is_remote(url: str) -> bool:
    url = html.unescape(url.strip().strip("\"'")).strip()
    return bool(re.match(r"(?i)(https?:|ftp:|wss?:)?//", url))


def offline_problems(page_html: str) -> list[str]:
    """Every reference in a page that would make the browser contact another host (empty: none)."""
    problems = []
    for tag, attribute, value in _FETCHING.findall(page_html):
        urls = (
            [part.strip().split()[0] for part in value.strip("\"'").split(",") if part.strip()]
            if attribute.lower() == "srcset"
            else [value]
        )
        problems += [f"<{tag} {attribute}={value[:120]}>" for url in urls if _is_remote(url)]
    for css in _STYLE.findall(page_html):
        css = _CSS_COMMENT.sub("", css)
        problems += [f"CSS url({url[:120]})" for url in _CSS_URL.findall(css)]
        problems += [f"CSS @import {url[:120]}" for url in _CSS_IMPORT.findall(css)]
    return problems


# -- link rewriting -------------------------------------------------------------------------------
_ANCHOR_HREF = re.compile(r"(<a\b[^>]*?\shref=)(\"[^\"]*\"|'[^']*')", re.IGNORECASE | re.DOTALL)


def rewrite_links(page_html: str, source: str, page: str, pages: dict[str, str]) -> str:
    """Point relative links of ``source`` (a repository path) at the pages built from their targets.

    A link to a course file that becomes a page goes to that page (fragment kept); a link to any other
    file of the repository goes to GitHub; a link to a missing file is an error.
    """

    def replace(match: re.Match) -> str:
        if "data-site-link" in match.group(1):  # the site's own navigation, already a page path
            return match.group(0)
        quote, value = match.group(2)[0], html.unescape(match.group(2)[1:-1])
        if not value or value.startswith(("#", "//")) or re.match(r"(?i)[a-z][a-z0-9+.-]*:", value):
            return match.group(0)
        path, hash_, fragment = value.partition("#")
        path = path.split("?", 1)[0]
        target = posixpath.normpath(posixpath.join(posixpath.dirname(source), path)) if path else source
        if target in pages:
            new = posixpath.relpath(pages[target], posixpath.dirname(page) or ".")
        elif (ROOT / target).exists() and not target.startswith(".."):
            new = REPO_URL + target
        else:
            raise SiteBuildError(f"{source}: the link {value!r} points at {target}, which does not exist")
        return f"{match.group(1)}{quote}{html.escape(new + hash_ + fragment, quote=True)}{quote}"

    return _ANCHOR_HREF.sub(replace, page_html)


# -- notebooks ------------------------------------------------------------------------------------
@dataclass
class NotebookPage:
    source: str  # notebooks/NAME.ipynb
    page: str  # NAME.html
    title: str
    question: str  # the notebook's "The question." paragraph, as HTML (may be empty)
    zh_page: str | None


_MATH = re.compile(r"(?<![\\$])\$[^$\s][^$]*\$|\$\$|\\\(|\\\[|\\begin\{")


def _markdown_sources(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "markdown"]


def check_notebook(nb, name: str) -> None:
    """Fail on what the offline page could only show by fetching code from another host."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    foreign = sorted({model["model_module"] for model in state.values()} - BUILTIN_WIDGET_MODULES)
    if foreign:
        raise SiteBuildError(
            f"{name}: widgets from {', '.join(foreign)} cannot be rendered offline by the "
            "html-manager's embed bundle; vendor their code or do not save their state"
        )
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "application/javascript" in output.get("data", {}):
                raise SiteBuildError(
                    f"{name}: an application/javascript output would need require.js, "
                    "which the offline copy does not ship"
                )
    for source in _markdown_sources(nb):
        if "```mermaid" in source:
            warnings.warn(
                f"{name}: a mermaid diagram shows as its source text in the offline copy (mermaid.js is not vendored)",
                stacklevel=2,
            )
        if _MATH.search(re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", source, flags=re.DOTALL))):
            warnings.warn(
                f"{name}: TeX math shows as its source text in the offline copy (MathJax is not vendored)", stacklevel=2
            )


def _markdown():
    import mistune

    return mistune.create_markdown(escape=False, plugins=["table", "strikethrough"])


def notebook_facts(path: Path, nb) -> NotebookPage:
    title, question = path.stem, ""
    for source in _markdown_sources(nb):
        heading = re.search(r"^#\s+(.+)$", source, re.MULTILINE)
        if heading and title == path.stem:
            title = heading.group(1).strip()
        paragraph = re.search(r"^\*\*The question\.\*\*(.+?)(?:\n\s*\n|\Z)", source, re.MULTILINE | re.DOTALL)
        if paragraph and not question:
            question = _markdown()(paragraph.group(1).strip()).strip()
    zh = ROOT / "docs" / "zh" / f"{path.stem}.md"
    return NotebookPage(
        f"notebooks/{path.name}", f"{path.stem}.html", title, question, f"zh/{path.stem}.html" if zh.exists() else None
    )


def convert_notebook(path: Path, facts: NotebookPage, pages: dict[str, str]) -> str:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    check_notebook(nb, path.name)
    nb.metadata["title"] = re.sub(r"`([^`]*)`", r"\1", facts.title)
    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATES)])
    resources = {"offline": {"vendor": VENDOR, "index": "index.html", "zh_page": facts.zh_page}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return rewrite_links(body, facts.source, facts.page, pages)


# -- markdown pages -------------------------------------------------------------------------------
MARKDOWN_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "PingFang SC", "Noto Sans CJK SC",
       "Microsoft YaHei", sans-serif; line-height: 1.7; margin: 0; color: #1f2328; }
main { max-width: 52em; margin: 0 auto; padding: 1em 1.5em 3em; }
nav { padding: 8px 16px; border-bottom: 1px solid #ddd; background: #f7f7f7; font-size: 14px; }
nav a { margin-right: 1.5em; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 90%; }
code { background: #f3f4f6; padding: 0.1em 0.3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: 0.8em 1em; overflow-x: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #d0d7de; padding: 4px 10px; text-align: left; vertical-align: top; }
blockquote { margin: 0; padding-left: 1em; border-left: 4px solid #d0d7de; color: #57606a; }
"""


def html_page(title: str, body: str, page: str, lang: str, nav: list[tuple[str, str]]) -> str:
    up = posixpath.relpath(".", posixpath.dirname(page) or ".")
    links = "".join(
        f'<a data-site-link href="{html.escape(target if up == "." else posixpath.join(up, target))}">'
        f"{html.escape(text)}</a>"
        for text, target in nav
    )
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8" />\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1.0">\n'
        f'<title>{html.escape(title)}</title>\n<style type="text/css">{MARKDOWN_CSS}</style>\n</head>\n'
        f'<body>\n<nav aria-label="course">{links}</nav>\n<main>\n{body}\n</main>\n</body>\n</html>\n'
    )


_IMG = re.compile(r"<img\b[^>]*>", re.IGNORECASE)


def drop_remote_images(page_html: str) -> str:
    """A picture from another host (a badge) becomes its alt text: the page must not fetch it."""

    def replace(match: re.Match) -> str:
        src = re.search(r"\ssrc=(\"[^\"]*\"|'[^']*')", match.group(0))
        if not src or not _is_remote(src.group(1)):
            return match.group(0)
        alt = re.search(r"\salt=(\"[^\"]*\"|'[^']*')", match.group(0))
        return alt.group(1)[1:-1] if alt else ""

    return _IMG.sub(replace, page_html)


_HEADING = re.compile(r"<h([1-6])>(.*?)</h\1>", re.DOTALL)


def add_heading_ids(page_html: str) -> str:
    """Give each heading the id GitHub gives it (lower case, punctuation dropped, spaces as '-', a repeat
    numbered), so a link to ``#section`` in the Markdown lands on the same heading in the page."""
    seen: dict[str, int] = {}

    def replace(match: re.Match) -> str:
        text = html.unescape(re.sub(r"<[^>]+>", "", match.group(2))).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchor = slug if count == 0 else f"{slug}-{count}"
        return f'<h{match.group(1)} id="{html.escape(anchor, quote=True)}">{match.group(2)}</h{match.group(1)}>'

    return _HEADING.sub(replace, page_html)


def convert_markdown(source: str, page: str, pages: dict[str, str]) -> str:
    text = (ROOT / source).read_text(encoding="utf-8")
    heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
    title = re.sub(r"`([^`]*)`", r"\1", heading.group(1).strip()) if heading else source
    lang = "zh-CN" if source.startswith("docs/zh/") or source.endswith(".zh-CN.md") else "en"
    nav = [
        ("Backward Twice: all notebooks", "index.html"),
        ("中文说明", "zh/index.html"),
        ("术语表 Glossary", "glossary.html"),
    ]
    body = rewrite_links(add_heading_ids(drop_remote_images(_markdown()(text))), source, page, pages)
    return html_page(title, body, page, lang, [item for item in nav if item[1] in pages.values()])


def first_section(markdown_text: str) -> str:
    """The README's first section: its first ``##`` heading and what follows, up to the next ``##`` heading.

    It is the answer for a reader who has the error on screen; the index page shows it from the README
    itself, so there is one copy to keep in step with the notebooks.
    """
    text = re.sub(
        r"^```.*?^```",
        lambda match: re.sub(r"[^\n]", " ", match.group(0)),
        markdown_text,
        flags=re.DOTALL | re.MULTILINE,
    )  # a '## ' inside a code block is no heading
    headings = [match.start() for match in re.finditer(r"^##\s", text, re.MULTILINE)]
    if not headings:
        raise SiteBuildError("README.md has no '## ' section for the index page's first answer")
    end = headings[1] if len(headings) > 1 else len(markdown_text)
    return markdown_text[headings[0] : end].strip()


def index_page(facts: list[NotebookPage], pages: dict[str, str]) -> str:
    first_answer = rewrite_links(
        _markdown()(first_section((ROOT / "README.md").read_text(encoding="utf-8"))), "README.md", "index.html", pages
    )
    rows = []
    for item in facts:
        zh = f'<a href="{item.zh_page}" lang="zh-CN">中文讲解</a>' if item.zh_page else ""
        title = re.sub(r"^<p>(.*)</p>$", r"\1", _markdown()(item.title).strip(), flags=re.DOTALL)
        rows.append(f'<tr><td><a href="{item.page}">{title}</a></td><td>{item.question}</td><td>{zh}</td></tr>')
    extra = []
    if "zh/index.html" in pages.values():
        extra.append('<a href="zh/index.html" lang="zh-CN">中文说明（README.zh-CN）</a>')
    if "glossary.html" in pages.values():
        extra.append('<a href="glossary.html">Glossary / 术语表</a>')
    if "watch.html" in pages.values():
        extra.append('<a href="watch.html">Bring your own training step</a>')
    if "setup.html" in pages.values():
        extra.append('<a href="setup.html">Set-up</a>')
    body = f"""<h1>Backward Twice: offline copy</h1>
{first_answer}
<h2>The course</h2>
<p>What PyTorch's <code>retain_graph</code> really does, shown live and measured. This copy shows every
notebook as it was executed and saved: graphs, charts, tables and the widget panels in their saved state.
Nothing here needs a network. To run the code and click the panels, open the notebooks in JupyterLab
(<code>make lab</code> in the repository).</p>
<table><thead><tr><th>notebook</th><th>the question</th><th lang="zh-CN">中文</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
<p>{" · ".join(extra)}</p>"""
    return html_page("Backward Twice: offline copy", body, "index.html", "en", [])


# -- the build ------------------------------------------------------------------------------------
def _write_zip(site: Path, zip_path: Path) -> None:
    tmp = zip_path.with_name(zip_path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(site.rglob("*")):
            if path.is_file() and path.name != BUILD_INFO:
                info = zipfile.ZipInfo(f"{ZIP_FOLDER}/{path.relative_to(site).as_posix()}", (2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, path.read_bytes())
    tmp.replace(zip_path)


def _copy_vendor(target: Path) -> None:
    dist = HTML_MANAGER / "dist"
    target.mkdir(parents=True)
    for path in sorted(dist.iterdir()):
        # embed.js and the fonts its CSS names (loaded relative to embed.js); not the AMD variant,
        # which exists to fetch third-party widget code from a CDN, nor the source maps.
        if path.is_file() and not path.name.endswith(".map") and "amd" not in path.name:
            shutil.copy2(path, target / path.name)
    shutil.copy2(HTML_MANAGER / "package.json", target / "package.json")
    (target / "README.txt").write_text(
        f"@jupyter-widgets/html-manager {installed_html_manager_version()} (BSD-3-Clause, Jupyter Project), "
        "dist/ as published on npm: embed.js renders saved widget state; the fonts are Font Awesome Free "
        "(embed.js.LICENSE.txt).\n",
        encoding="utf-8",
    )


def build(out: Path = SITE, zip_path: Path | None = SITE_ZIP, force: bool = False) -> bool:
    """Build the site into ``out`` (and the zip); return False when it was already up to date."""
    if not force and is_up_to_date(out) and (zip_path is None or zip_path.exists()):
        return False
    problem = vendor_problem()
    if problem:
        raise SiteBuildError(problem)
    digest = input_digest()
    pages = page_map()
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "zh").mkdir(parents=True)
    _copy_vendor(tmp / VENDOR)
    written: dict[str, str] = {}
    facts = []
    import nbformat

    for path in notebooks():
        item = notebook_facts(path, nbformat.read(path, as_version=4))
        facts.append(item)
        written[item.page] = convert_notebook(path, item, pages)
    written["index.html"] = index_page(facts, pages)
    for source, page in pages.items():
        if source.endswith(".md") and source != "README.md":
            written[page] = convert_markdown(source, page, pages)
    for page, text in written.items():
        problems = offline_problems(text)
        if problems:
            raise SiteBuildError(f"{page} would contact another host: " + "; ".join(problems[:5]))
        (tmp / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp / page).write_text(text, encoding="utf-8")
    (tmp / BUILD_INFO).write_text(
        json.dumps({"digest": digest, "pages": sorted(written)}, indent=1) + "\n", encoding="utf-8"
    )
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    if zip_path is not None:
        _write_zip(out, zip_path)
    return True


def ensure_site() -> Path:
    """The up-to-date site for the tests: ``site/`` as built, rebuilt first if an input changed.

    Raises SiteBuildError (with the command to run) when it is stale and the vendored renderer is missing.
    """
    build(SITE, SITE_ZIP)
    return SITE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if no input changed")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        built = build(force=args.force)
    except SiteBuildError as error:
        print(f"make html: {error}", file=sys.stderr)
        return 1
    where = f"{SITE.relative_to(ROOT)}/ and {SITE_ZIP.relative_to(ROOT)}"
    if built:
        count = len(json.loads((SITE / BUILD_INFO).read_text(encoding="utf-8"))["pages"])
        print(
            f"Built {where}: {count} pages in {time.monotonic() - start:.1f} s. "
            f"Open {SITE.relative_to(ROOT)}/index.html in a browser (no network needed)."
        )
    else:
        print(f"{where} are up to date (no input changed).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
