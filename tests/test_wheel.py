"""The wheel a learner installs: ``backward_twice`` and the ``backward-twice`` command, nothing of the course.

The wheel is built from a copy of the tracked files (never in place: setuptools stages in ``build/lib``, and a stale
``build/lib/helpers/`` would ship whatever was left there), offline (``--no-build-isolation``, the course's pinned
setuptools). It is installed into a fresh venv that takes torch from the course's environment (a ``.pth`` naming a
folder of links to the course's site-packages, less the course's and the tool's own installs), and run there on a
project that has a ``helpers.py`` of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_TOP = ("notebooks/", "site/", "docs/", "test-artifacts/", "scripts/site/", "scripts/a11y/")
NOT_THE_COURSES = ("__editable__", "backward_twice", "helpers")  # what the fresh venv must not see of the course's

TRAIN = """
import torch

import helpers  # the project's own helpers.py, next to this script

assert helpers.NAME == "the project's own helpers", helpers
rnn = torch.nn.RNN(4, 8)
optimizer = torch.optim.SGD(rnn.parameters(), lr=0.01)
hidden = torch.zeros(1, 1, 8)
for inputs, targets in helpers.batches(5):
    optimizer.zero_grad()
    output, hidden = rnn(inputs, hidden)
    loss = (output - targets).pow(2).mean()
    loss.backward(retain_graph=True)
    optimizer.step()
"""
HELPERS = """
import torch

NAME = "the project's own helpers"


def batches(count):
    torch.manual_seed(0)
    return [(torch.randn(5, 1, 4), torch.randn(5, 1, 8)) for _ in range(count)]
"""


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tracked = _run("git", "ls-files", cwd=ROOT)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the wheel is built from the tracked files")
    source = tmp_path_factory.mktemp("source")
    for name in tracked.stdout.splitlines():
        if name.startswith(SKIPPED_TOP) or not (ROOT / name).is_file():
            continue
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, source)
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = sorted(out.glob("backward_twice-*.whl"))
    assert len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0]


def test_the_wheel_holds_the_tool_and_its_command_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} - {info} == {"backward_twice"}
    assert "backward_twice/py.typed" in names and "backward_twice/record/recorder.py" in names
    assert "backward-twice = backward_twice.cli:run" in entry_points
    requires = sorted(line for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    assert requires == [
        'Requires-Dist: graphviz>=0.21; extra == "draw"',
        'Requires-Dist: ipython>=8; extra == "notebook"',
        "Requires-Dist: torch>=2.13",
    ]


def _fresh_venv(where: Path) -> Path:
    """A venv without pip (this environment's pip installs into it) whose site-packages sees the course's, less the
    course's and the tool's own installs."""
    made = _run(sys.executable, "-m", "venv", "--without-pip", where / "venv")
    assert made.returncode == 0, made.stderr
    python = where / "venv" / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    links = where / "course-site-packages"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(NOT_THE_COURSES) and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (site / "course-site-packages.pth").write_text(f"{links}\n")
    return python


def test_the_installed_wheel_watches_a_project_with_its_own_helpers_py(wheel: Path, tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path)
    installed = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "helpers.py").write_text(HELPERS)
    (project / "train.py").write_text(TRAIN)

    command = python.parent / "backward-twice"
    done = _run(command, "watch", "--iterations", "3", "--json", "r.json", "train.py", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr  # the script's own status: it raised at iteration 2
    assert "backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)" in done.stderr
    assert "fix: add `hidden = hidden.detach()` before line 12, and remove retain_graph=True at line 14" in done.stderr
    report = json.loads((project / "r.json").read_text())
    assert "`hidden`" in json.dumps(report)

    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    installed_names = {p.name for p in site.iterdir()} - {"course-site-packages.pth", "_virtualenv.py", "__pycache__"}
    assert {n.split("-")[0] for n in installed_names} == {"backward_twice"}, sorted(installed_names)
    where = _run(python, "-c", "import backward_twice; print(backward_twice.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(tmp_path / "venv")), where.stdout + where.stderr
    course = _run(python, "-c", "import helpers", cwd=tmp_path)
    assert course.returncode == 1 and "No module named 'helpers'" in course.stderr
    light = textwrap.dedent("""
        import sys, backward_twice
        print(sorted(n for n in ('matplotlib', 'IPython', 'ipywidgets', 'graphviz') if n in sys.modules))
    """)
    assert _run(python, "-c", light, cwd=tmp_path).stdout == "[]\n"
