"""`make lab` starts JupyterLab on the notebooks, and a second run reinstalls nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_setup_is_up_to_date_so_a_second_run_installs_nothing() -> None:
    # `make test` already ran the set-up; make -q exits 0 only when no recipe would run.
    result = subprocess.run(["make", "-q", "setup", "setup-test"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, "make would reinstall: " + result.stdout + result.stderr


def test_make_lab_serves_the_notebooks(tmp_path: Path) -> None:
    port, token = free_port(), "backward-twice-test"
    env = dict(os.environ)
    for name, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                      ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
        env[name] = str(tmp_path / sub)
    lab_args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 "
                f"--IdentityProvider.token={token}")
    process = subprocess.Popen(["make", "lab", f"LAB_ARGS={lab_args}"], cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        assert listing is not None, "JupyterLab did not answer: " + (process.stdout.read() if process.poll() is not None else "still starting")
        names = {item["name"] for item in listing["content"]}
        assert "01_graph_buffers.ipynb" in names, names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as response:
            assert response.status == 200
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
