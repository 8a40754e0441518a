"""Dark theme and accessibility of what the course renders, in the committed notebooks in JupyterLab.

Each committed notebook is opened once, as saved (trusted, so JupyterLab shows its SVG drawings and renders
the saved widget state; no cell runs), and both tests of that notebook use the page:

* ``test_axe_...``: axe-core (pinned in scripts/a11y/package-lock.json, installed into build/a11y-npm/ by
  ``make test``) runs on every widget panel, HTML output (tables, verdicts, reports) and expect_error box,
  each scrolled fully into view, in JupyterLab's light theme: no serious or critical violation. A panel's
  error box (the markup ``Panel._show_error`` writes) is put into a panel's status line and checked too.
  JupyterLab's own image outputs are not scanned: JupyterLab gives an output ``<img>`` no alt text and offers
  no way to set one (jupyter/enhancement-proposals#120); the dark-theme test checks those images.
* ``test_dark_theme_...``: JupyterLab switched to JupyterLab Dark. Every drawing (SVG) and chart (PNG) is
  screenshotted into ``test-artifacts/browser/dark-NN-cellK-*.png`` and must keep a light background (the
  luminance of its four corners) with dark ink on it (contrast at least 4.5:1); every widget panel, HTML
  output, expect_error box and the error box are screenshotted too, and axe's color-contrast rule must pass
  on them (and have checked some text).

The theme is switched back to light after the dark test (and its settings file removed when the module
ends), so the other browser tests, which share the JupyterLab server, see the default theme.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from labdriver import NOTEBOOKS, VIEWPORT, LabPage, LabServer, LearnerViewWarning, slug

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
AXE_DIR = ROOT / "build" / "a11y-npm" / "node_modules" / "axe-core"
AXE_LOCK = ROOT / "scripts" / "a11y" / "package-lock.json"
AXE_HINT = (
    "Run `make a11y-for-tests` (part of `make test`): it installs the axe-core version pinned in "
    "scripts/a11y/package-lock.json into build/a11y-npm/ with npm."
)
LIGHT, DARK = "JupyterLab Light", "JupyterLab Dark"
THEME_SETTINGS = Path("settings") / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
SERIOUS = ("serious", "critical")
# WCAG AA for normal text; also asked of the ink of a drawing or chart against its background.
MIN_CONTRAST = 4.5
LIGHT_BACKGROUND = 0.8  # relative luminance of a drawing's or chart's corners (white is 1.0)
PREFIX = "saved-"  # the copies this module opens, beside the server's copies of the notebooks

# JupyterLab first shows most cells as placeholders and renders them when idle: wait until every code cell
# is rendered with all its saved outputs.
ALL_RENDERED_JS = r"""(path) => window.__bt.panel(path).content.widgets.every((cell) => cell.model.type !== 'code'
    || (!(cell.isPlaceholder && cell.isPlaceholder())
        && cell.node.querySelectorAll('.jp-Cell-outputArea > .jp-OutputArea-child').length
           === cell.model.outputs.length))"""

# The course's outputs in the page, marked data-bt-target=N: widget panels, HTML outputs, expect_error boxes,
# drawings (SVG) and charts (PNG). Top-level outputs only (not those nested in Output widgets).
TARGETS_JS = r"""(path) => {
    const kinds = {'text/html': 'html', 'image/svg+xml': 'drawing', 'image/png': 'chart'};
    const found = [];
    window.__bt.panel(path).content.widgets.forEach((cell, index) => {
        cell.node.setAttribute('data-bt-cell', index);
        cell.node.querySelectorAll('.jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output')
            .forEach((output) => {
                const mime = output.getAttribute('data-mime-type') || '';
                let kind = kinds[mime] || null;
                // A widget's output node is a panel around the widget's root view (no MIME type on it).
                if (!mime && output.querySelector(':scope > .jupyter-widgets')) kind = 'panel';
                if (mime === 'application/vnd.jupyter.stdout'
                    && output.textContent.trimStart().startsWith('Raised, as expected')) kind = 'expected-error';
                if (!kind) return;
                output.setAttribute('data-bt-target', String(found.length));
                found.push({target: found.length, cell: index, kind});
            });
    });
    return found;
}"""

# axe-core on one element; the violations, and how many nodes each rule passed (to prove it checked something).
AXE_JS = r"""async ([selector, rules]) => {
    const options = rules ? {runOnly: {type: 'rule', values: rules}} : {};
    const result = await window.axe.run(document.querySelector(selector), options);
    const passed = {};
    result.passes.forEach((rule) => { passed[rule.id] = rule.nodes.length; });
    return {passed, violations: result.violations.map((rule) => ({
        id: rule.id, impact: rule.impact, help: rule.help, helpUrl: rule.helpUrl,
        nodes: rule.nodes.map((node) => ({target: node.target.join(' '), html: node.html.slice(0, 300),
                                          summary: node.failureSummary}))}))};
}"""

# The status line of the first panel that has one, for the error box.
STATUS_SELECTOR = ".jp-Cell-outputArea .widget-html[class*='-status'] > .widget-html-content"


# -- fixtures ------------------------------------------------------------------------------------
def _need(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and this test cannot run: {message}", pytrace=False)
    pytest.skip(message)


def _axe_problem() -> str | None:
    """Why axe-core cannot be used, or None."""
    package = AXE_DIR / "package.json"
    if not package.exists():
        return f"axe-core is not installed ({AXE_DIR.relative_to(ROOT)} is missing). {AXE_HINT}"
    pinned = json.loads(AXE_LOCK.read_text(encoding="utf-8"))["packages"]["node_modules/axe-core"]["version"]
    installed = json.loads(package.read_text(encoding="utf-8"))["version"]
    if installed != pinned:
        return f"build/a11y-npm has axe-core {installed}, but scripts/a11y/package-lock.json pins {pinned}. {AXE_HINT}"
    return None


@pytest.fixture(scope="module")
def axe_installed() -> None:
    """Both tests need axe-core: without it they skip before JupyterLab starts (and fail under CI=true)."""
    _need(_axe_problem() is None, _axe_problem() or "")


@pytest.fixture(scope="module")
def saved_copies(axe_installed: None, lab_server: LabServer) -> Iterator[dict[Path, Path]]:
    """The committed notebooks, copied beside the server's copies (which Run All tests change) and trusted,
    so that JupyterLab renders their SVG drawings and saved widgets (an untrusted notebook shows text)."""
    copies = {}
    for notebook in NOTEBOOKS:
        copies[notebook] = lab_server.root_dir / f"{PREFIX}{notebook.name}"
        shutil.copyfile(notebook, copies[notebook])
    subprocess.run(
        [sys.executable, "-m", "jupyter", "trust", *map(str, copies.values())],
        env=lab_server.environment(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    yield copies
    (lab_server.base / THEME_SETTINGS).unlink(missing_ok=True)  # the default theme for the tests after these


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda path: path.stem)
def saved_page(
    request: pytest.FixtureRequest,
    saved_copies: dict[Path, Path],
    browser_context: Any,
    lab_server: LabServer,
    artifacts: Path,
) -> Iterator[tuple[LabPage, list[dict]]]:
    """One notebook open as saved (no cell run), shared by its two tests; its course outputs marked."""
    page = browser_context.new_page()
    lab = LabPage(page, lab_server, artifacts)
    try:
        lab.open(saved_copies[request.param])
        page.wait_for_function(ALL_RENDERED_JS, arg=lab.path, timeout=60_000)
        yield lab, page.evaluate(TARGETS_JS, lab.path)
    finally:
        page.close()
        lab_server.shutdown_sessions()


@pytest.fixture
def lab(request: pytest.FixtureRequest, saved_page: tuple[LabPage, list[dict]], artifacts: Path) -> Iterator[LabPage]:
    lab_page = saved_page[0]
    lab_page.page.set_viewport_size(VIEWPORT)
    yield lab_page
    lab_page.page.set_viewport_size(VIEWPORT)
    if getattr(getattr(request.node, "bt_report_call", None), "failed", False):
        failures = artifacts / "failures"
        failures.mkdir(parents=True, exist_ok=True)
        lab_page.page.screenshot(path=str(failures / f"{slug(request.node.name)}.png"))


# -- helpers -----------------------------------------------------------------------------------
def set_theme(lab: LabPage, theme: str) -> None:
    lab.page.evaluate(
        "async (theme) => { await window.jupyterapp.commands.execute('apputils:change-theme', {theme}); }", theme
    )
    lab.page.wait_for_function(
        "([name, light]) => document.body.dataset.jpThemeName === name && document.body.dataset.jpThemeLight === light",
        arg=[theme, "false" if theme == DARK else "true"],
    )
    lab.page.wait_for_timeout(300)  # the theme's stylesheet applied and painted


# Whether the element lies wholly inside the notebook's visible scroll area.
IN_VIEW_JS = """(e) => { const r = e.getBoundingClientRect();
    const o = (e.closest('.jp-WindowedPanel-outer') || document.documentElement).getBoundingClientRect();
    return r.height > 0 && r.top >= o.top - 1 && r.bottom <= o.bottom + 1; }"""


def scroll_to(lab: LabPage, locator: Any) -> bool:
    """Scroll until the element stays in view. JupyterLab skips laying out cells off screen (content-visibility)
    and guesses their heights, so the first scroll can land short once the cells on the way are laid out."""
    for _attempt in range(6):
        locator.evaluate("(e) => e.scrollIntoView({block: 'nearest'})")
        lab.page.wait_for_timeout(120)  # the cells that came in are laid out and painted
        if locator.evaluate(IN_VIEW_JS):
            return True
    return False


@contextmanager
def shown(lab: LabPage, locator: Any) -> Iterator[None]:
    """The element scrolled wholly into view, the viewport made taller first if it needs (restored after):
    axe skips text it cannot see, and a screenshot would be cut off."""
    size = lab.page.viewport_size
    try:
        scroll_to(lab, locator)
        box = locator.bounding_box()
        need = int(box["height"]) + 250 if box else 0  # room for JupyterLab's bars around the notebook
        if size and need > size["height"]:
            lab.page.set_viewport_size({"width": size["width"], "height": min(need, 6000)})
        assert scroll_to(lab, locator), f"could not scroll the output into view: {box}"
        yield
    finally:
        if size:
            lab.page.set_viewport_size(size)


def ensure_axe(lab: LabPage) -> None:
    if not lab.page.evaluate("() => !!window.axe"):
        lab.page.add_script_tag(path=str(AXE_DIR / "axe.min.js"))
        # JupyterLab's <body> is 0 px tall with overflow hidden (its shell is positioned absolutely); axe takes
        # that as clipping every element and would check no text for contrast. Nothing painted changes.
        lab.page.add_style_tag(content="html, body { height: 100%; }")


def run_axe(lab: LabPage, target: int, rules: list[str] | None = None) -> dict:
    return lab.page.evaluate(AXE_JS, [f'[data-bt-target="{target}"]', rules])


def error_box_markup() -> str:
    """What a panel's status line shows after an error: the markup of helpers.panels.Panel._show_error."""
    from helpers.panels import Panel

    panel = Panel()
    panel.status = Panel._status_line("bt-status")
    panel._show_error(
        "RuntimeError: Trying to backward through the graph a second time (or directly access "
        "saved tensors after they have already been freed).",
        "the panel still works",
    )
    return panel.status.value


@contextmanager
def error_box_in_a_panel(lab: LabPage) -> Iterator[int | None]:
    """The error box put into the first panel's status line (restored after); its target number, or None
    when the notebook has no panel with a status line."""
    target = lab.page.evaluate(
        """([selector, markup]) => {
        const status = document.querySelector(selector);
        if (!status) return null;
        status.setAttribute('data-bt-saved-html', status.innerHTML);
        status.innerHTML = markup;
        const output = status.closest('[data-bt-target]');
        return output ? Number(output.getAttribute('data-bt-target')) : null;
    }""",
        [STATUS_SELECTOR, error_box_markup()],
    )
    try:
        yield target
    finally:
        lab.page.evaluate(
            """(selector) => { const status = document.querySelector(selector);
            if (status && status.hasAttribute('data-bt-saved-html')) {
                status.innerHTML = status.getAttribute('data-bt-saved-html');
                status.removeAttribute('data-bt-saved-html'); } }""",
            STATUS_SELECTOR,
        )


def _channel(value: Any) -> Any:
    value = value / 255.0
    return ((value + 0.055) / 1.055) ** 2.4 * (value > 0.04045) + (value / 12.92) * (value <= 0.04045)


def luminance(png: bytes) -> Any:
    """WCAG relative luminance of every pixel of a PNG, as a 2-D array (0 black, 1 white)."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float)
    linear = _channel(rgb)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def luminance_of_rgb(rgb: list[float]) -> float:
    import numpy as np

    return float(_channel(np.asarray(rgb[:3], dtype=float)) @ np.array([0.2126, 0.7152, 0.0722]))


def contrast(a: float, b: float) -> float:
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def image_readability(png: bytes) -> tuple[list[float], float]:
    """The mean luminance of a 5x5 patch in each corner (2 px in), and the ink's contrast against them (the
    darkest 0.5 % of the pixels against the corners' median)."""
    import numpy as np

    lum = luminance(png)
    height, width = lum.shape
    corners = [float(lum[y : y + 5, x : x + 5].mean()) for y in (2, height - 7) for x in (2, width - 7)]
    ink = float(np.percentile(lum, 0.5))
    return corners, contrast(float(np.median(corners)), ink)


def _where(notebook: str, item: dict) -> str:
    return f"{notebook} cell {item['cell']} ({item['kind']})"


def _describe(violations: list[dict]) -> str:
    lines = []
    for rule in violations:
        lines.append(f"{rule['impact']} {rule['id']}: {rule['help']} ({rule['helpUrl']})")
        lines += [
            f"      {node['target']}: {node['html'][:160]}\n        {node['summary']}".rstrip()
            for node in rule["nodes"][:3]
        ]
    return "\n    ".join(lines)


# -- the tests -----------------------------------------------------------------------------------
def test_axe_finds_no_serious_violations_in_the_course_outputs(
    lab: LabPage, saved_page: tuple[LabPage, list[dict]], artifacts: Path
) -> None:
    ensure_axe(lab)
    set_theme(lab, LIGHT)
    number = lab.path.removeprefix(PREFIX)[:2]
    checked = [item for item in saved_page[1] if item["kind"] in ("panel", "html", "expected-error")]
    report, problems = [], []

    def check(item: dict) -> None:
        with shown(lab, lab.page.locator(f'[data-bt-target="{item["target"]}"]')):
            result = run_axe(lab, item["target"])
        report.append({**item, **result})
        serious = [rule for rule in result["violations"] if rule["impact"] in SERIOUS]
        if serious:
            problems.append(f"{_where(lab.path, item)}:\n    {_describe(serious)}")
        others = [rule for rule in result["violations"] if rule["impact"] not in SERIOUS]
        if others:
            warnings.warn(LearnerViewWarning(f"axe, {_where(lab.path, item)}: {_describe(others)}"), stacklevel=1)

    for item in checked:
        check(item)
    with error_box_in_a_panel(lab) as target:
        if target is not None:
            check({"target": target, "cell": "of the first panel", "kind": "error box"})
    (artifacts / f"axe-{number}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    assert not problems, (
        f"axe-core found serious or critical violations in {lab.path} "
        f"(all findings: test-artifacts/browser/axe-{number}.json):\n  " + "\n  ".join(problems)
    )


def test_dark_theme_keeps_drawings_charts_and_panels_readable(
    lab: LabPage, saved_page: tuple[LabPage, list[dict]], artifacts: Path
) -> None:
    ensure_axe(lab)
    number = lab.path.removeprefix(PREFIX)[:2]
    problems = []
    set_theme(lab, DARK)
    try:
        # The check means something only if the page around the outputs is dark.
        background = lab.page.evaluate("""() => {
            const [r, g, b] = getComputedStyle(document.querySelector('.jp-Notebook')).backgroundColor
                .match(/[\\d.]+/g).map(Number);
            return [r, g, b]; }""")
        page_luminance = float(luminance_of_rgb(background))
        assert page_luminance < 0.1, (
            f"the dark theme did not apply: the notebook's background is rgb{tuple(background)}"
        )

        for item in saved_page[1]:
            locator = lab.page.locator(f'[data-bt-target="{item["target"]}"]')
            name = f"dark-{number}-cell{item['cell']:02d}-{item['target']:02d}-{item['kind']}"
            if item["kind"] in ("drawing", "chart"):
                image = locator.locator("img").first
                with shown(lab, image):
                    png = image.screenshot(path=str(artifacts / f"{name}.png"))
                corners, ink = image_readability(png)
                if min(corners) < LIGHT_BACKGROUND:
                    problems.append(
                        f"{_where(lab.path, item)}: a corner is dark in the dark theme (luminance "
                        f"{', '.join(f'{c:.2f}' for c in corners)}; want >= {LIGHT_BACKGROUND}): the "
                        "page shows through the picture there (no light background of its own up to "
                        "its edges)"
                    )
                if ink < MIN_CONTRAST:
                    problems.append(
                        f"{_where(lab.path, item)}: ink contrast {ink:.1f}:1 against its background "
                        f"(want >= {MIN_CONTRAST})"
                    )
                continue
            with shown(lab, locator):
                locator.screenshot(path=str(artifacts / f"{name}.png"))
                result = run_axe(lab, item["target"], ["color-contrast"])
            if result["violations"]:
                problems.append(f"{_where(lab.path, item)}, dark theme:\n    {_describe(result['violations'])}")
            elif item["kind"] != "html" and not result["passed"].get("color-contrast"):
                problems.append(f"{_where(lab.path, item)}: axe checked no text for contrast (not visible?)")

        with error_box_in_a_panel(lab) as target:
            if target is not None:
                locator = lab.page.locator(f'[data-bt-target="{target}"]')
                with shown(lab, locator):
                    locator.screenshot(path=str(artifacts / f"dark-{number}-error-box.png"))
                    result = run_axe(lab, target, ["color-contrast"])
                if result["violations"]:
                    problems.append(
                        f"{lab.path} a panel's error box, dark theme:\n    {_describe(result['violations'])}"
                    )
    finally:
        set_theme(lab, LIGHT)
    assert not problems, (
        f"{lab.path} in JupyterLab's dark theme (screenshots: test-artifacts/browser/"
        f"dark-{number}-*.png):\n  " + "\n  ".join(problems)
    )
