"""`make lab` starts JupyterLab on the notebooks, also without Graphviz, and a second run reinstalls nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbformat.sign import NotebookNotary

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_setup_is_up_to_date_so_a_second_run_installs_nothing() -> None:
    # `make test` already ran the set-up; make -q exits 0 only when no recipe would run.
    result = subprocess.run(["make", "-q", "setup", "setup-test"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, "make would reinstall: " + result.stdout + result.stderr


def path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH with every program of this one except the hidden ones (links in one folder)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = folder / entry.name
            if entry.name not in hidden and not target.exists() and entry.is_file() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    assert not any(shutil.which(name, path=str(folder)) for name in hidden)
    return str(folder)


@pytest.mark.parametrize("flag, code", [("--warn-only", 0), (None, 1)], ids=["make-lab", "make-test"])
def test_missing_dot_warns_for_the_lab_and_stops_the_rest(tmp_path: Path, flag: str | None, code: int) -> None:
    # Without apt-get on PATH the script cannot install Graphviz, so it must say what to run.
    command = ["bash", str(ROOT / "scripts" / "ensure-dot.sh"), *([flag] if flag else [])]
    result = subprocess.run(
        command, env={"PATH": path_without(tmp_path, "dot", "apt-get")}, capture_output=True, text=True
    )
    assert result.returncode == code, result.stderr
    for install in ("apt-get install -y graphviz", "brew install graphviz", "winget install"):
        assert install in result.stderr
    assert ("Going on without it" in result.stderr) == bool(flag), result.stderr
    assert ("run make again" in result.stderr) == (not flag), result.stderr


@pytest.mark.parametrize("dot", [True, False], ids=["with-dot", "without-dot"])
def test_make_lab_serves_the_notebooks(tmp_path: Path, dot: bool) -> None:
    port, token = free_port(), "backward-twice-test"
    env = dict(os.environ)
    if not dot:  # nor apt-get, which would install it
        env["PATH"] = path_without(tmp_path, "dot", "apt-get")
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    ]:
        env[name] = str(tmp_path / sub)
    lab_args = (
        f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 "
        f"--IdentityProvider.token={token}"
    )
    process = subprocess.Popen(
        ["make", "lab", f"LAB_ARGS={lab_args}"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        listing = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents?token={token}"
                with urllib.request.urlopen(url, timeout=2) as response:
                    listing = json.load(response)
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not answer: " + (
            process.stdout.read() if process.poll() is not None else "still starting"
        )
        names = {item["name"] for item in listing["content"]}
        assert "01_graph_buffers.ipynb" in names, names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as response:
            assert response.status == 200
        # no news or update toast over the notebook a learner opens first
        settings = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification?token={token}"
        with urllib.request.urlopen(settings, timeout=10) as response:
            defaults = {k: v["default"] for k, v in json.load(response)["schema"]["properties"].items()}
        assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, (
            defaults
        )  # JupyterLab's: "none", true
        # the committed notebooks are trusted, so JupyterLab draws their saved widget panels before a cell runs
        notary = NotebookNotary(data_dir=str(tmp_path / "data"))
        for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
            assert notary.check_signature(nbformat.read(notebook, as_version=4)), f"{notebook.name} is not trusted"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = process.stdout.read()
    assert ("Going on without it" in output) == (not dot), output[-2000:]
