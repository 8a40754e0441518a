"""The offline copy (`make html`): a page per notebook, images inline, nothing fetched from another host.

The site is the one `make html` builds in ``site/``; when an input changed since (a notebook, a page, a
template), it is rebuilt first from the vendored widget renderer in ``build/site-npm/``. Without that
renderer (no npm) these tests skip, or fail under CI=true. The checks read the built HTML with Python's
own HTML parser, independently of the regular expressions the builder uses to police itself.
"""

from __future__ import annotations

import json
import posixpath
import re
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CDN_HOSTS = ("cdnjs.cloudflare.com", "cdn.jsdelivr.net", "unpkg.com", "requirejs.org", "mathjax", "googleapis.com")
# Elements that make the browser fetch on their own, and the attributes they fetch through.
FETCHING = {
    "script": ("src",),
    "link": ("href",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "image": ("href", "xlink:href"),
    "use": ("href", "xlink:href"),
}


class Page(HTMLParser):
    """What a page references: fetched URLs (tag, attribute, value), links, ids, images, style text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.fetched: list[tuple[str, str, str]] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.images: list[str] = []
        self.alts: list[str] = []
        self.styles: list[str] = []
        self._in_style = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.ids.add(values["id"])
        for attribute in FETCHING.get(tag, ()):
            if attribute in values:
                urls = (
                    [part.strip().split()[0] for part in values[attribute].split(",") if part.strip()]
                    if attribute == "srcset"
                    else [values[attribute]]
                )
                self.fetched += [(tag, attribute, url) for url in urls]
        if tag == "img":
            self.images.append(values.get("src", ""))
            self.alts.append(values.get("alt", ""))
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def pages(site: Path) -> dict[str, str]:
    return {
        path.relative_to(site).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(site.rglob("*.html"))
        if "_vendor" not in path.parts
    }


def remote(url: str) -> bool:
    return bool(re.match(r"(?i)\s*([a-z][a-z0-9+.-]*:)?//", url)) and not url.strip().lower().startswith("file:")


def committed(notebook: Path) -> dict:
    return json.loads(notebook.read_text(encoding="utf-8"))


def shown_images(nb: dict) -> int:
    """Image outputs as a page shows them: one per output (the richest of its image types)."""
    return sum(
        1
        for cell in nb["cells"]
        for output in cell.get("outputs", [])
        if any(mime in output.get("data", {}) for mime in IMAGE_MIMES) and WIDGET_VIEW not in output.get("data", {})
    )


# -- tests ----------------------------------------------------------------------------------------
def test_every_notebook_has_a_page_linked_from_the_index(site: Path) -> None:
    assert NOTEBOOKS, "no notebooks under notebooks/"
    index = Page((site / "index.html").read_text(encoding="utf-8"))
    missing = [nb.name for nb in NOTEBOOKS if not (site / f"{nb.stem}.html").exists()]
    assert not missing, f"site/ has no page for: {', '.join(missing)}"
    unlinked = [nb.name for nb in NOTEBOOKS if f"{nb.stem}.html" not in index.links]
    assert not unlinked, f"site/index.html does not link to the pages of: {', '.join(unlinked)}"


def test_no_page_fetches_anything_from_another_host(site: Path) -> None:
    problems = []
    for name, text in pages(site).items():
        page = Page(text)
        problems += [f"{name}: <{tag} {attribute}={url}>" for tag, attribute, url in page.fetched if remote(url)]
        for css in page.styles:
            css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
            found = re.findall(r"(?i)(?:url\(|@import)\s*['\"]?\s*(?:https?:)?//[^)'\";]+", css)
            problems += [f"{name}: CSS {url}" for url in found]
    assert not problems, "pages that would contact another host:\n" + "\n".join(problems)


def test_no_cdn_is_named_anywhere_in_the_pages(site: Path) -> None:
    # nbconvert's templates load require.js, MathJax, mermaid and the widget renderer from CDNs, also from
    # inside inline scripts (which the attribute check above cannot see).
    found = [f"{name}: {host}" for name, text in pages(site).items() for host in CDN_HOSTS if host in text.lower()]
    assert not found, "CDN references left in the offline copy:\n" + "\n".join(found)


def test_the_vendored_widget_renderer_is_copied_and_used(site: Path) -> None:
    for notebook in NOTEBOOKS:
        page = Page((site / f"{notebook.stem}.html").read_text(encoding="utf-8"))
        scripts = [url for tag, _, url in page.fetched if tag == "script"]
        if "widgets" in committed(notebook)["metadata"]:
            assert scripts == ["_vendor/html-manager/embed.js"], f"{notebook.stem}.html loads {scripts}"
        for url in scripts:
            assert (site / url).is_file(), f"{notebook.stem}.html loads {url}, which is not in site/"


def test_images_are_inline_and_every_image_output_is_there(site: Path) -> None:
    for notebook in NOTEBOOKS:
        page = Page((site / f"{notebook.stem}.html").read_text(encoding="utf-8"))
        not_inline = [src[:60] for src in page.images if not src.startswith("data:image/")]
        assert not not_inline, f"{notebook.stem}.html: images not inline (data: URLs): {not_inline}"
        expected = shown_images(committed(notebook))
        assert len(page.images) == expected, (
            f"{notebook.stem}.html shows {len(page.images)} images; {notebook.name} has {expected} image outputs"
        )


def test_every_image_says_in_words_what_it_shows(site: Path) -> None:
    # The course's charts and drawings save a description in their output metadata, and a picture from
    # another library has one in its cell's "alt" metadata (JupyterLab shows no alt text); the offline
    # copy writes it into alt, and its generic fallback never appears.
    for notebook in NOTEBOOKS:
        page = Page((site / f"{notebook.stem}.html").read_text(encoding="utf-8"))
        missing = [alt or "(no alt)" for alt in page.alts if not alt.strip() or "no description was saved" in alt]
        assert not missing, f"{notebook.stem}.html: images without a saved description: {missing}"


def test_every_widget_view_and_the_saved_state_are_in_the_page(site: Path) -> None:
    for notebook in NOTEBOOKS:
        nb = committed(notebook)
        text = (site / f"{notebook.stem}.html").read_text(encoding="utf-8")
        views = [
            output["data"][WIDGET_VIEW]["model_id"]
            for cell in nb["cells"]
            for output in cell.get("outputs", [])
            if WIDGET_VIEW in output.get("data", {})
        ]
        blocks = re.findall(rf'<script type="{re.escape(WIDGET_VIEW)}">\s*(.*?)\s*</script>', text, re.DOTALL)
        shown = [json.loads(block)["model_id"] for block in blocks]
        assert shown == views, f"{notebook.stem}.html: widget views differ"
        if views:
            state = re.search(rf'<script type="{re.escape(WIDGET_STATE)}">\s*(.*?)\s*</script>', text, re.DOTALL)
            assert state, f"{notebook.stem}.html has widget views but no saved widget state"
            models = json.loads(state.group(1))["state"]
            missing = [view for view in views if view not in models]
            assert not missing, f"{notebook.stem}.html: views without a saved model: {missing}"


def test_links_between_pages_land_on_a_page_and_a_heading_that_exist(site: Path) -> None:
    every = pages(site)
    ids = {name: Page(text).ids for name, text in every.items()}
    broken = []
    for name, text in every.items():
        for href in Page(text).links:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), parts.path)) if parts.path else name
            if not (site / target).exists():
                broken.append(f"{name}: {href} (no {target})")
            elif (
                parts.fragment
                and target in ids
                and parts.fragment not in ids[target]
                and unquote(parts.fragment) not in {unquote(i) for i in ids[target]}
            ):
                broken.append(f"{name}: {href} (no heading #{parts.fragment} in {target})")
    assert not broken, "broken links in the offline copy:\n" + "\n".join(broken)


def test_the_zip_holds_the_whole_site(site: Path, site_builder: ModuleType) -> None:
    files = {
        path.relative_to(site).as_posix()
        for path in site.rglob("*")
        if path.is_file() and path.name != site_builder.BUILD_INFO
    }
    with zipfile.ZipFile(site_builder.SITE_ZIP) as archive:
        names = {name.split("/", 1)[1] for name in archive.namelist()}
        assert all(name.startswith(site_builder.ZIP_FOLDER + "/") for name in archive.namelist())
    assert names == files


def test_a_second_build_rebuilds_nothing(site: Path, site_builder: ModuleType) -> None:
    assert site_builder.build() is False, "the site was rebuilt although no input changed"


def test_the_builders_own_guard_catches_requests_to_other_hosts(site_builder: ModuleType) -> None:
    # build_site.py refuses to write a page that would contact another host; make sure it would notice.
    for leak in [
        '<script src="https://cdn.jsdelivr.net/npm/x.js"></script>',
        "<link rel=stylesheet href='//fonts.example/x.css'>",
        '<img srcset="a.png 1x, https://example.com/b.png 2x">',
        "<style>body { background: url(http://x/y.png) }</style>",
        '<style>@import "https://example.com/x.css";</style>',
    ]:
        assert site_builder.offline_problems(leak), leak
    for fine in [
        '<script src="_vendor/html-manager/embed.js"></script>',
        '<img src="data:image/png;base64,AAAA">',
        '<a href="https://github.com/pytorch/pytorch/issues/37573">a link is not a request</a>',
        "<style>/* @import url('https://fonts.googleapis.com/css'); */</style>",
    ]:
        assert not site_builder.offline_problems(fine), fine
