"""The offline copy (`make html`) in Chromium, opened from file:// with the network cut off.

Every request that is not a file:// or data: URL is blocked (page.route) and recorded; each notebook's
page must then show all its images and render every widget panel from the saved widget state (the
panels' buttons present, by their labels), without a script error and without trying to reach another
host. The index and the Chinese pages must load without any request either. Without Chromium these
tests skip (fail under CI=true), as the other browser tests do; without the built site (no npm) too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labdriver import VIEWPORT, slug

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
LOCAL = ("file:", "data:", "blob:", "about:")

# Each <img> decoded, with its natural size (0 x 0: a broken image).
IMAGES_JS = """async () => Promise.all(Array.from(document.querySelectorAll('img')).map(async (img) => {
    try { await img.decode(); } catch (error) { return {src: img.src.slice(0, 40), width: 0, height: 0}; }
    return {src: img.src.slice(0, 40), width: img.naturalWidth, height: img.naturalHeight};
}))"""
BUTTONS_JS = """() => Array.from(document.querySelectorAll('.widget-subarea button'))
    .map((b) => b.textContent.trim())"""


class OfflinePage:
    """A page opened from file:// with every other request blocked; what it tried and what went wrong."""

    def __init__(self, context: Any) -> None:
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.page = context.new_page()
        self.page.on(
            "request", lambda request: None if request.url.startswith(LOCAL) else self.blocked.append(request.url)
        )
        self.page.on("websocket", lambda socket: self.blocked.append(socket.url))
        self.page.on(
            "console",
            lambda message: (
                self.errors.append(f"console {message.type}: {message.text}") if message.type == "error" else None
            ),
        )
        self.page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))

    def open(self, path: Path) -> Any:
        self.page.goto(path.as_uri(), wait_until="load")
        return self.page


@pytest.fixture(scope="module")
def offline_context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, service_workers="block")
    attempts: list[str] = []

    def route(route: Any) -> None:
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:  # the network is cut off: anything else is recorded and refused
            attempts.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", route)
    context.set_default_timeout(20_000)
    context.bt_attempts = attempts
    yield context
    context.close()


@pytest.fixture
def offline_page(request: pytest.FixtureRequest, offline_context: Any, artifacts: Path) -> Iterator[OfflinePage]:
    # `artifacts` first: it empties test-artifacts/browser/ once per session, so a failure saved here stays.
    page = OfflinePage(offline_context)
    offline_context.bt_attempts.clear()
    yield page
    failed = getattr(request.node, "bt_report_call", None)
    if failed is not None and failed.failed:
        failures = artifacts / "offline-site"
        failures.mkdir(parents=True, exist_ok=True)
        try:
            page.page.screenshot(path=str(failures / f"{slug(request.node.name)}.png"), full_page=False)
        finally:
            (failures / f"{slug(request.node.name)}.txt").write_text(
                "\n".join(page.errors + page.blocked) + "\n", encoding="utf-8"
            )
    page.page.close()


def expected_widgets(notebook: Path) -> tuple[int, Counter, list[str]]:
    """From the committed notebook: widget views displayed, the labels of the buttons they contain
    (walking each view's children in the saved state), and the CSS classes of the displayed panels."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    views = [
        output["data"][WIDGET_VIEW]["model_id"]
        for cell in nb["cells"]
        for output in cell.get("outputs", [])
        if WIDGET_VIEW in output.get("data", {})
    ]
    buttons: Counter = Counter()
    classes: list[str] = []

    def walk(model_id: str) -> None:
        model = state.get(model_id)
        if model is None:
            return
        if model["model_name"] == "ButtonModel":
            buttons[model["state"].get("description", "").strip()] += 1
        for child in model["state"].get("children", []):
            walk(child.removeprefix("IPY_MODEL_"))

    for view in views:
        walk(view)
        classes += state.get(view, {}).get("state", {}).get("_dom_classes", [])
    return len(views), buttons, classes


def image_outputs(notebook: Path) -> int:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return sum(
        1
        for cell in nb["cells"]
        for output in cell.get("outputs", [])
        if any(mime in output.get("data", {}) for mime in IMAGE_MIMES) and WIDGET_VIEW not in output.get("data", {})
    )


def test_every_notebook_is_found() -> None:
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("name", [path.stem for path in NOTEBOOKS])
def test_notebook_page_shows_images_and_panels_offline(
    site: Path, offline_page: OfflinePage, offline_context: Any, name: str
) -> None:
    notebook = ROOT / "notebooks" / f"{name}.ipynb"
    views, buttons, classes = expected_widgets(notebook)
    page = offline_page.open(site / f"{name}.html")

    # The embed bundle renders on the load event: each view becomes a .widget-subarea.
    if views:
        page.wait_for_function("(n) => document.querySelectorAll('.widget-subarea').length >= n", arg=views)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.widget-subarea')).every((area) => area.childElementCount > 0)"
        )
    assert page.locator(".widget-subarea").count() == views, f"{name}: not every widget view was rendered"
    for css in classes:
        panel = page.locator(f".widget-subarea .{css}").first
        box = panel.bounding_box() if panel.count() else None
        assert box and box["width"] > 0 and box["height"] > 0, (
            f"{name}: the panel .{css} is not rendered (or has no size)"
        )
    shown = Counter(page.evaluate(BUTTONS_JS))
    missing = buttons - shown
    assert not missing, f"{name}: panel buttons not rendered: {dict(missing)} (rendered: {dict(shown)})"

    images = page.evaluate(IMAGES_JS)
    assert len(images) == image_outputs(notebook), f"{name}: {len(images)} images on the page"
    broken = [image["src"] for image in images if image["width"] == 0 or image["height"] == 0]
    assert not broken, f"{name}: images that did not decode: {broken}"

    assert not offline_page.errors, f"{name}: errors in the page:\n" + "\n".join(offline_page.errors)
    attempted = offline_page.blocked + offline_context.bt_attempts
    assert not attempted, f"{name}: requests to other hosts: {attempted}"


def test_index_and_chinese_pages_load_without_any_request(
    site: Path, offline_page: OfflinePage, offline_context: Any
) -> None:
    others = [site / "index.html", *sorted((site / "zh").glob("*.html")), *sorted(site.glob("glossary.html"))]
    for path in others:
        page = offline_page.open(path)
        assert page.locator("h1").count() >= 1, f"{path.name}: no heading rendered"
    assert not offline_page.errors, "errors in the pages:\n" + "\n".join(offline_page.errors)
    attempted = offline_page.blocked + offline_context.bt_attempts
    assert not attempted, f"requests to other hosts: {attempted}"
