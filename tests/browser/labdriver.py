"""Driving JupyterLab in Chromium for the browser tests: the server, a notebook page, the .ipynb facts.

Imported by conftest.py (fixtures) and the test modules. The server runs from this Python environment
on a free loopback port, with its own temporary config, data, runtime, IPython, settings and workspace
folders, and serves a temporary copy of ``notebooks/`` (Run All never touches the committed notebooks).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = Path(os.environ.get("BT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "backward-twice-browser-tests"
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"
ERROR_TAG = "raises-exception"
GRAPH_CALLS = {"draw_graph", "make_dot"}
VIEWPORT = {"width": 1280, "height": 900}
INSTALL_HINT = (
    "The browser tests need Debian's Chromium at {path}. Install it with\n"
    "  sudo apt-get install -y chromium\n"
    "(`make test` does this itself when run as root), or skip these tests with -m 'not browser'."
)


class LearnerViewWarning(UserWarning):
    """Something a learner would find odd in the page, reported without failing the run."""


# What a learner would find odd after Run All: a matplotlib figure shown as its text repr (no image),
# and output wider than the notebook column (a graph or table cut off behind a horizontal scrollbar).
LEARNER_VIEW_JS = r"""(path) => {
    const found = [];
    window.__bt.panel(path).content.widgets.forEach((cell, index) => {
        const where = `cell ${index} [${cell.model.executionCount}]`;
        cell.node.querySelectorAll('.jp-OutputArea-output').forEach((output) => {
            const text = output.textContent.trim();
            if (/^<(matplotlib\.figure\.)?Figure size [\d.]+x[\d.]+ with \d+ Axes>$/.test(text)) {
                found.push(`${where}: a matplotlib figure shows as text (${text}), not as an image`);
            } else if (output.scrollWidth > output.clientWidth + 2) {
                found.push(`${where}: output is ${output.scrollWidth}px wide in a ${output.clientWidth}px column `
                           + '(cut off; the learner must scroll sideways)');
            }
        });
    });
    return found;
}"""


# What the panels show, read back as numbers.
SECOND_TIME = "backward through the graph a second time"


def byte_count(text: str) -> int:
    """A panel's byte figure as a number: '665,600 B (650.0 KiB)' -> 665600."""
    match = re.match(r"\s*([\d,]+) B\b", text)
    assert match, f"not a byte figure: {text!r}"
    return int(match.group(1).replace(",", ""))


# -- notebook files --------------------------------------------------------------------------
@dataclass
class NotebookFile:
    """What the tests need to know from an .ipynb file, read as JSON (cell indices count every cell)."""

    path: Path
    cells: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> NotebookFile:
        return cls(path, json.loads(path.read_text(encoding="utf-8"))["cells"])

    @property
    def name(self) -> str:
        return self.path.name

    def source(self, index: int) -> str:
        source = self.cells[index]["source"]
        return source if isinstance(source, str) else "".join(source)

    def tags(self, index: int) -> list[str]:
        return list(self.cells[index].get("metadata", {}).get("tags", []))

    def code_indices(self) -> list[int]:
        return [i for i, cell in enumerate(self.cells) if cell["cell_type"] == "code"]

    def graph_cells(self) -> list[int]:
        """Code cells that draw a graph and show it: they call draw_graph or make_dot and end in an
        expression (so the drawing is the cell's result), or their committed outputs hold an SVG."""
        found = []
        for index in self.code_indices():
            committed_svg = any(
                "image/svg+xml" in output.get("data", {}) for output in self.cells[index].get("outputs", [])
            )
            if committed_svg or self._shows_a_drawing(self.source(index)):
                found.append(index)
        return found

    @staticmethod
    def ends_in_expression(source: str) -> bool:
        """Whether the cell's last statement is an expression, so its value is displayed."""
        if source.rstrip().endswith(";"):
            return False
        try:
            tree = ast.parse(source)
        except SyntaxError:  # IPython magics: assume it shows something
            return True
        return bool(tree.body) and isinstance(tree.body[-1], ast.Expr)

    @classmethod
    def _shows_a_drawing(cls, source: str) -> bool:
        try:
            calls = {
                node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Call)
            }
        except SyntaxError:
            calls = set(re.findall(r"\b(draw_graph|make_dot)\(", source))
        return bool(calls & GRAPH_CALLS) and cls.ends_in_expression(source)

    def lab_cells(self) -> list[int]:
        """Code cells that build a BackwardLab panel and show it (their last statement is an expression)."""
        return [
            i
            for i in self.code_indices()
            if re.search(r"\bBackwardLab\(", self.source(i)) and self.ends_in_expression(self.source(i))
        ]


# -- the JupyterLab server ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """``jupyter lab`` from this environment, isolated in ``base`` (a temp dir)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root_dir = base / "notebooks"
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log_path = ARTIFACTS / "jupyterlab.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for name, sub in [
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("IPYTHONDIR", "ipython"),
            ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ]:
            (self.base / sub).mkdir(parents=True, exist_ok=True)
            env[name] = str(self.base / sub)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("JUPYTER_PATH", None)
        return env

    def write_settings(self) -> None:
        # Silence the "check for updates / fetch news" toast that would cover the notebook.
        folder = self.base / "settings" / "@jupyterlab" / "apputils-extension"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notification.jupyterlab-settings").write_text(
            json.dumps({"checkForUpdates": False, "fetchNews": "false"}), encoding="utf-8"
        )

    def start(self) -> None:
        shutil.copytree(NOTEBOOK_DIR, self.root_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        self.write_settings()
        env = self.environment()
        # as `make lab` does: the committed notebooks trusted, so their saved widget panels draw before a cell runs
        notebooks = sorted(str(path) for path in self.root_dir.glob("*.ipynb"))
        subprocess.run([sys.executable, "-m", "jupyter", "trust", *notebooks], env=env, check=True, capture_output=True)
        errors = []
        for _attempt in range(3):  # the free port can be taken between choosing and binding it
            self.port = _free_port()
            command = [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={TOKEN}",
                f"--ServerApp.root_dir={self.root_dir}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ]
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    command,
                    cwd=self.base,
                    env=env,
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready(timeout=120):
                return
            errors.append(f"port {self.port}: exit code {self.process.poll()}")
            self.stop()
        raise RuntimeError(f"JupyterLab did not start ({'; '.join(errors)}); see {self.log_path}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                with self.api("GET", "/api/status", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.3)
        return False

    def api(self, method: str, path: str, timeout: float = 10) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {TOKEN}"},
            data=b"" if method in ("POST", "PUT", "PATCH") else None,
        )
        return urllib.request.urlopen(request, timeout=timeout)

    def shutdown_sessions(self) -> None:
        """Shut down every kernel session, so the next test's notebook starts a fresh kernel."""
        try:
            with self.api("GET", "/api/sessions") as response:
                sessions = json.load(response)
            for session in sessions:
                with self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30):
                    pass
        except (OSError, urllib.error.URLError, ValueError):
            pass

    def _own_kernel_pids(self) -> list[int]:
        """Kernels started by this server: their command line names a connection file in our runtime dir."""
        runtime = str(self.base / "runtime")
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "ipykernel" in cmdline and runtime in cmdline:
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(OSError, urllib.error.URLError), self.api("POST", "/api/shutdown", timeout=10):
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                process.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        for pid in self._own_kernel_pids():  # kernels run in sessions of their own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# -- a notebook in the page ---------------------------------------------------------------------
def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


# Small in-page helpers; everything the tests read comes from the DOM or JupyterLab's own models.
INIT_SCRIPT = r"""
window.__bt = {
  panel(path) {
    const app = window.jupyterapp;
    if (!app) return null;
    for (const w of app.shell.widgets('main')) {
      if (w && w.context && w.context.path === path && w.content && w.content.widgets) return w;
    }
    return null;
  },
  statusText() {
    const bar = document.querySelector('#jp-main-statusbar');
    return bar ? bar.textContent.replace(/\s+/g, ' ') : '';
  },
};
"""


class LabPage:
    """One notebook open in JupyterLab in its own workspace."""

    def __init__(self, page: Any, server: LabServer, artifacts: Path) -> None:
        self.page = page
        self.server = server
        self.artifacts = artifacts
        self.path = ""
        self.notebook: NotebookFile | None = None

    # navigation and kernel state
    def open(self, notebook: Path) -> NotebookFile:
        self.notebook = NotebookFile.read(notebook)
        self.path = notebook.name
        workspace = f"bt-{uuid.uuid4().hex[:12]}"
        self.page.goto(
            f"{self.server.url}/lab/workspaces/{workspace}/tree/{self.path}?reset&token={TOKEN}",
            wait_until="domcontentloaded",
        )
        self.page.wait_for_function(
            "(path) => !!(window.__bt && window.__bt.panel(path))", arg=self.path, timeout=120_000
        )
        self.page.wait_for_function(
            "(path) => { const w = window.__bt.panel(path); return w.context.isReady && w.sessionContext.isReady "
            "&& w.content.widgets.length > 0; }",
            arg=self.path,
            timeout=120_000,
        )
        # The toolbar's indicator says idle too early (a Run All sent then is lost); the status bar does not.
        self.wait_kernel_idle(timeout=120_000)
        return self.notebook

    def wait_kernel_idle(self, timeout: float = 60_000) -> None:
        self.page.wait_for_function(
            "(idle) => window.__bt.statusText().includes(idle)", arg=KERNEL_IDLE, timeout=timeout
        )

    def run_all(self, timeout: float = 300_000) -> None:
        """Clear every output (so each execution count proves a fresh run), Run All, wait for the kernel."""
        self.page.evaluate(
            "async (path) => { const w = window.__bt.panel(path); window.jupyterapp.shell.activateById(w.id);"
            " await window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs'); }",
            self.path,
        )
        started = time.monotonic()
        self.page.evaluate(
            "async (path) => { window.jupyterapp.shell.activateById(window.__bt.panel(path).id);"
            " return await window.jupyterapp.commands.execute('notebook:run-all-cells'); }",
            self.path,
        )
        remaining = max(10_000, timeout - (time.monotonic() - started) * 1000)
        # Done when the kernel is idle and every code cell has run (outputs were cleared, so a count
        # proves this run), or Run All stopped at an error in a cell not tagged raises-exception.
        self.page.wait_for_function(
            """([path, tag]) => {
                const w = window.__bt.panel(path);
                const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
                if (!kernel || kernel.status !== 'idle') return false;
                if (Array.from(w.node.querySelectorAll('.jp-InputPrompt')).some((p) => p.textContent.includes('*'))) {
                    return false;
                }
                const code = w.content.widgets.filter((c) => c.model.type === 'code');
                const ran = code.every((c) => c.model.executionCount !== null);
                const stopped = code.some((c) => {
                    const tags = c.model.getMetadata('tags') || [];
                    if (tags.includes(tag)) return false;
                    for (let k = 0; k < c.model.outputs.length; k++) {
                        if (c.model.outputs.get(k).type === 'error') return true;
                    }
                    return false;
                });
                return ran || stopped;
            }""",
            arg=[self.path, ERROR_TAG],
            timeout=remaining,
        )
        self.wait_kernel_idle()
        self.mark_cells()

    def mark_cells(self) -> None:
        """Give each cell's DOM node ``data-bt-cell=<index in the .ipynb>`` for stable locators."""
        self.page.evaluate(
            "(path) => window.__bt.panel(path).content.widgets"
            ".forEach((c, i) => c.node.setAttribute('data-bt-cell', i))",
            self.path,
        )

    def cell_states(self) -> list[dict]:
        """Per cell (in notebook order): type, execution count, output types and error names, from the model."""
        return self.page.evaluate(
            """(path) => window.__bt.panel(path).content.widgets.map((c, i) => {
                const outputs = [];
                if (c.model.type === 'code') {
                    for (let k = 0; k < c.model.outputs.length; k++) {
                        const o = c.model.outputs.get(k).toJSON();
                        outputs.push({type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
                                      mimes: Object.keys(o.data || {}), name: o.name || null});
                    }
                }
                return {index: i, type: c.model.type, count: c.model.type === 'code' ? c.model.executionCount : null,
                        outputs, source: c.model.sharedModel.getSource()};
            })""",
            self.path,
        )

    def learner_view_problems(self) -> list[str]:
        """Soft findings about the page after Run All (see LEARNER_VIEW_JS)."""
        return self.page.evaluate(LEARNER_VIEW_JS, self.path)

    def cell(self, index: int) -> Any:
        return self.page.locator(f'.jp-Notebook .jp-Cell[data-bt-cell="{index}"]')

    def live_panel(self, cell_pattern: str, css: str) -> tuple[Any, int]:
        """The live widget panel (element with class ``css``) that the one code cell whose source
        matches the regex ``cell_pattern`` shows after Run All, scrolled into view, and that cell's index."""
        assert self.notebook is not None, "open a notebook first"
        pattern = re.compile(cell_pattern, re.MULTILINE)
        cells = [i for i in self.notebook.code_indices() if pattern.search(self.notebook.source(i))]
        assert len(cells) == 1, (
            f"{self.notebook.name}: expected one cell matching {cell_pattern!r}, found cells {cells}"
        )
        # Run All replaced the cell's outputs, so its output holds only the live view; .last guards
        # against a view of the saved widget state rendered next to it.
        panel = self.outputs(cells[0]).locator(f".{css}").last
        panel.scroll_into_view_if_needed()
        return panel, cells[0]

    def output_children(self, index: int) -> Any:
        """One element per output of the cell, in the model's order (not those nested in Output widgets)."""
        return self.cell(index).locator(".jp-Cell-outputArea > .jp-OutputArea-child")

    def outputs(self, index: int) -> Any:
        return self.output_children(index).locator("> .jp-OutputArea-output")

    def kernel_execute(self, code: str) -> str:
        """Run ``code`` in the notebook's kernel through the page (not added to the notebook); return its stdout."""
        result = self.page.evaluate(
            """async ([path, code]) => {
                const kernel = window.__bt.panel(path).sessionContext.session.kernel;
                const future = kernel.requestExecute({code, silent: false, store_history: false});
                let out = '', error = null;
                future.onIOPub = (msg) => {
                    if (msg.header.msg_type === 'stream') out += msg.content.text;
                    if (msg.header.msg_type === 'error') error = msg.content.ename + ': ' + msg.content.evalue;
                };
                await future.done;
                return {out, error};
            }""",
            [self.path, code],
        )
        if result["error"]:
            raise AssertionError(f"kernel code failed: {result['error']}\n{code}")
        return result["out"]

    # screenshots
    def screenshot(self, name: str) -> Path:
        path = self.artifacts / f"{slug(name)}.png"
        self.page.screenshot(path=str(path))
        return path

    def screenshot_element(self, locator: Any, name: str) -> Path:
        """A screenshot of one element, whole. An element taller than the notebook's scroll area would be
        cut off (and JupyterLab's status bar drawn over it), so the viewport is first made tall enough,
        then restored."""
        path = self.artifacts / f"{slug(name)}.png"
        size = self.page.viewport_size
        locator.scroll_into_view_if_needed()
        box = locator.bounding_box()
        need = int(box["height"]) + 250 if box else 0  # room for JupyterLab's bars around the notebook
        try:
            if size and need > size["height"]:
                self.page.set_viewport_size({"width": size["width"], "height": min(need, 6000)})
                self.page.wait_for_timeout(300)  # relayout, and content-visibility renders what came in
                locator.scroll_into_view_if_needed()
            locator.screenshot(path=str(path))
        finally:
            if size:
                self.page.set_viewport_size(size)
        return path

    def screenshot_notebook(self, name: str, max_shots: int = 60) -> list[Path]:
        """Scroll the notebook from top to bottom, one viewport at a time, a screenshot each."""
        folder = self.artifacts / slug(name)
        folder.mkdir(parents=True, exist_ok=True)
        shots = []
        # The content ends at the last cell's bottom (JupyterLab adds empty room to scroll past the end).
        scroll_js = """([path, top]) => { const nb = window.__bt.panel(path).content;
                        const n = nb.outerNode || nb.node.querySelector('.jp-WindowedPanel-outer') || nb.node;
                        n.scrollTop = top;
                        const last = nb.widgets[nb.widgets.length - 1].node.getBoundingClientRect();
                        const end = last.bottom - n.getBoundingClientRect().top + n.scrollTop;
                        return {top: n.scrollTop, end: Math.min(end, n.scrollHeight), view: n.clientHeight}; }"""
        position = self.page.evaluate(scroll_js, [self.path, 0])
        for number in range(1, max_shots + 1):
            self.page.wait_for_timeout(250)  # let content-visibility render what scrolled in
            path = folder / f"{number:02d}.png"
            self.page.screenshot(path=str(path))
            shots.append(path)
            if position["top"] + position["view"] >= position["end"] - 2:
                break
            previous = position["top"]
            position = self.page.evaluate(scroll_js, [self.path, previous + int(position["view"] * 0.9)])
            if position["top"] <= previous:  # cannot scroll further
                break
        return shots


# -- one Run All per notebook per session ---------------------------------------------------------
class NotebookPages:
    """Each notebook opened and run with Run All once per session, then shared by all its tests.

    The Run All test checks the page first; the panel tests then click in the same live page (and its
    kernel), so no notebook runs twice. Only one notebook is open at a time: asking for another one
    closes the page and shuts down the kernel of the previous one (conftest orders the tests by
    notebook, Run All test first). A Run All that failed is not retried: later tests of that notebook
    fail at once with its error.
    """

    def __init__(self, context: Any, server: LabServer, artifacts: Path) -> None:
        self.context = context
        self.server = server
        self.artifacts = artifacts
        self.notebook: Path | None = None
        self.lab: LabPage | None = None
        self.console: list[str] = []
        self.failed: dict[Path, str] = {}

    def get(self, notebook: Path) -> LabPage:
        if self.lab is not None and self.notebook == notebook:
            self.lab.mark_cells()
            return self.lab
        self.close()
        if notebook in self.failed:
            raise RuntimeError(f"Run All of {notebook.name} failed earlier in this session: {self.failed[notebook]}")
        page = self.context.new_page()
        self.console = []
        page.on(
            "console",
            lambda message: self.console.append(f"{message.type}: {message.text}") if message.type == "error" else None,
        )
        page.on("pageerror", lambda error: self.console.append(f"pageerror: {error}"))
        self.notebook, self.lab = notebook, LabPage(page, self.server, self.artifacts)
        try:
            self.lab.open(notebook)
            self.lab.run_all()
        except Exception as exc:
            self.failed[notebook] = f"{type(exc).__name__}: {str(exc)[:500]}"
            raise  # the page stays open until the next get() or close(), for the failure screenshot
        return self.lab

    def save_failure(self, name: str) -> None:
        """The open page's screenshot and console errors, under ``failures/``."""
        if self.lab is None:
            return
        failures = self.artifacts / "failures"
        failures.mkdir(parents=True, exist_ok=True)
        lines = list(self.console)
        try:
            self.lab.page.screenshot(path=str(failures / f"{name}.png"))
        except Exception as exc:
            lines.append(f"(failure screenshot failed: {exc})")
        (failures / f"{name}.console.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def close(self) -> None:
        lab, self.lab, self.notebook = self.lab, None, None
        if lab is None:
            return
        try:
            lab.page.close()
        finally:
            self.server.shutdown_sessions()
