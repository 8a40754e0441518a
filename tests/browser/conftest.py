"""Real-browser fixtures: one JupyterLab server and one Chromium per session; each notebook run once.

Chromium is Debian's ``/usr/bin/chromium`` driven by Playwright. Everything started here is shut
down by finalizers, also when a test fails. ``notebook_page(path)`` gives the tests of a notebook one
shared page in which Run All ran once (the tests are ordered by notebook, the Run All test first).
Screenshots, the server log and the latency figures go
to ``test-artifacts/browser/`` (git-ignored). Without Chromium the tests skip (and fail under CI=true).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from labdriver import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    INIT_SCRIPT,
    INSTALL_HINT,
    NOTEBOOKS,
    VIEWPORT,
    LabPage,
    LabServer,
    NotebookPages,
    slug,
)

# Nothing here is a notebook for nbval to collect; the notebooks under test are copied to a temp dir.
collect_ignore_glob = ["*.ipynb"]


LATENCY_KEY = pytest.StashKey[list]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[LATENCY_KEY] = []


# -- test order: grouped by notebook, so each notebook runs once ----------------------------------
def _notebook_order(item: pytest.Item) -> tuple[int, int]:
    """(notebook number, 0 for its Run All test or 1 for a panel test); (-1, 0) for other tests.

    A Run All test is parametrized with ``notebook``; a panel test's module names it in ``NOTEBOOK``.
    """
    callspec = getattr(item, "callspec", None)
    notebook, kind = (callspec.params.get("notebook") if callspec else None), 0
    if notebook is None:
        notebook, kind = getattr(getattr(item, "module", None), "NOTEBOOK", None), 1
    if notebook is None:
        return (-1, 0)
    return (NOTEBOOKS.index(notebook) if notebook in NOTEBOOKS else len(NOTEBOOKS), kind)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    slots = [i for i, item in enumerate(items) if here in Path(item.path).resolve().parents]
    ordered = sorted((items[i] for i in slots), key=_notebook_order)  # stable: ties keep their order
    for slot, item in zip(slots, ordered):
        items[slot] = item


# -- failures and the summary ------------------------------------------------------------------
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    setattr(item, f"bt_report_{report.when}", report)
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in config.stash.get(LATENCY_KEY, []):
        terminalreporter.write_sep("-", "browser latency (benchmark, not an assertion)")
        terminalreporter.write_line(line)


@pytest.fixture
def report_in_summary(request: pytest.FixtureRequest) -> Any:
    """``report_in_summary(line)``: print the line in pytest's terminal summary (also without -s)."""
    return request.config.stash[LATENCY_KEY].append


# -- session fixtures --------------------------------------------------------------------------
def _need(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the browser tests cannot run: {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``test-artifacts/browser/``, emptied once per session."""
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def playwright_api() -> Iterator[Any]:
    _need(os.access(CHROMIUM, os.X_OK), INSTALL_HINT.format(path=CHROMIUM))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(
            False,
            "the playwright Python package is missing: run `make setup-test` (it installs requirements-test.txt).",
        )
    manager = sync_playwright().start()
    yield manager
    manager.stop()


@pytest.fixture(scope="session")
def expect(playwright_api: Any) -> Any:
    """Playwright's auto-waiting assertions (``expect(locator).to_have_text(...)``)."""
    from playwright.sync_api import expect as playwright_expect

    # A click's answer takes well under a second; the margin is for a loaded 2-core machine.
    playwright_expect.set_options(timeout=15_000)
    return playwright_expect


@pytest.fixture(scope="session")
def browser(playwright_api: Any) -> Iterator[Any]:
    chromium = playwright_api.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
    yield chromium
    chromium.close()


@pytest.fixture(scope="session")
def lab_server(
    request: pytest.FixtureRequest, artifacts: Path, tmp_path_factory: pytest.TempPathFactory, playwright_api: Any
) -> LabServer:
    # playwright_api first: without a browser there is no point starting JupyterLab.
    server = LabServer(tmp_path_factory.mktemp("jupyterlab"))
    request.addfinalizer(server.stop)  # registered before start, so a half-started server is stopped too
    server.start()
    return server


@pytest.fixture(scope="session")
def browser_context(browser: Any) -> Iterator[Any]:
    """One context for the session: pages share the HTTP cache, so JupyterLab loads faster after the
    first test. Each test still opens its own workspace (``/lab/workspaces/UNIQUE/...?reset``)."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    context.add_init_script(INIT_SCRIPT)
    context.set_default_timeout(30_000)
    yield context
    context.close()


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(getattr(request.node, f"bt_report_{when}", None), "failed", False) for when in ("setup", "call"))


@pytest.fixture(scope="session")
def notebook_pages(browser_context: Any, lab_server: LabServer, artifacts: Path) -> Iterator[NotebookPages]:
    pages = NotebookPages(browser_context, lab_server, artifacts)
    yield pages
    pages.close()


@pytest.fixture
def notebook_page(request: pytest.FixtureRequest, notebook_pages: NotebookPages) -> Iterator[Callable[[Path], LabPage]]:
    """``notebook_page(path)``: the notebook open in JupyterLab after Run All, run once per session and
    shared with the notebook's other tests (their clicks change its kernel's state); a screenshot and
    the console errors on failure."""
    yield notebook_pages.get
    if _failed(request):
        notebook_pages.save_failure(slug(request.node.name))
