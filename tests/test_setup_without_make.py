"""The set-up without `make` (docs/setup.md: the Linux block under `<!-- setup:linux -->`), run as a reader runs it.

The block runs in bash in a fresh temporary folder, creating a fresh `.venv` there; then the first section
of notebook 01 runs in that venv's own kernel and must print what the committed notebook prints. Lines
that cannot run here as written are replaced (the clone in script_for, the others in REPLACED):

* `git clone https://github.com/...` becomes a copy of this working tree (the files git tracks or would
  track), so the test checks these sources, not the ones on GitHub.
* The CPU torch line loses its `--extra-index-url https://download.pytorch.org/whl/cpu`, which this
  machine cannot reach. `torch==2.13.0+cpu` stays: PyPI accepts no local version such as `+cpu`, so pip
  can find it only in a local source of this machine's pip configuration (a find-links folder), never the
  CUDA build. Without such a wheel the test skips (fails under CI=true): it never downloads torch.
* `sudo apt-get install -y graphviz` is left out: the test installs no system package, and notebook 01's
  first section draws nothing.
* `jupyter lab notebooks/` becomes `jupyter lab --version` (`tests/test_make_lab.py` serves the lab).

Every other line runs as written, with this machine's pip configuration and cache. pip runs without
writing .pyc files (PIP_COMPILE=0, as `--no-compile`; Python compiles on import instead): the same files
for about a third less CPU time (torch alone: 12 s instead of 40 s). The whole test takes about a
minute of CPU time, most of it pip unpacking torch and JupyterLab's dependencies.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "docs" / "setup.md"
SETUP_ZH = ROOT / "docs" / "setup.zh-CN.md"
NOTEBOOK = ROOT / "notebooks" / "01_graph_buffers.ipynb"
MARKER = "<!-- setup:linux -->"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
TORCH_PIN = "torch==2.13.0+cpu"
CLONE = re.compile(r"^git clone (?P<url>\S+)$")

# Each line of the block that cannot run here as written, and what runs instead (None: nothing).
REPLACED: dict[str, str | None] = {
    f"pip install {TORCH_PIN} {CPU_INDEX}": f"pip install {TORCH_PIN}",
    "sudo apt-get install -y graphviz": None,
    "jupyter lab notebooks/": "jupyter lab --version",
}


def linux_block() -> list[str]:
    text = SETUP.read_text(encoding="utf-8")
    assert MARKER in text, f"docs/setup.md has no {MARKER} line above the Linux set-up block"
    block = re.match(r"\s*```bash\n(.*?)^```", text.split(MARKER, 1)[1], re.DOTALL | re.MULTILINE)
    assert block, f"docs/setup.md: no ```bash block right after {MARKER}"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def first_section(notebook: Path) -> nbformat.NotebookNode:
    """The notebook's cells before its second `## ` heading: the setup cell and section 1."""
    nb = nbformat.read(notebook, as_version=4)
    headings = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.MULTILINE):
            headings += 1
            if headings == 2:
                nb.cells = nb.cells[:index]
                return nb
    raise AssertionError(f"{notebook.name} has fewer than two `## ` sections")


def sanitize(text: str) -> str:
    """nbval's sanitizers from tests/nbval_sanitize.cfg (memory addresses, node ids, cell numbers)."""
    lines = (ROOT / "tests" / "nbval_sanitize.cfg").read_text(encoding="utf-8").splitlines()
    for regex, replace in pairwise(lines):
        if regex.startswith("regex: ") and replace.startswith("replace: "):
            text = re.sub(regex[len("regex: ") :], replace[len("replace: ") :], text)
    return text


def printed(cell: nbformat.NotebookNode) -> str:
    return sanitize("".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream"))


def errors(cell: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(output.ename, sanitize(output.evalue)) for output in cell.outputs if output.output_type == "error"]


def local_cpu_torch_is_available() -> bool:
    """Whether pip, as configured here, finds torch 2.13.0+cpu without any index (so in a local folder)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            TORCH_PIN,
        ],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0


def copy_working_tree(target: Path) -> None:
    if not (ROOT / ".git").exists():  # a source archive: everything but what the set-up builds
        shutil.copytree(
            ROOT,
            target,
            ignore=shutil.ignore_patterns(
                ".venv", "build", "site", "site.zip", "__pycache__", "*.egg-info", ".pytest_cache", "test-artifacts"
            ),
        )
        return
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def script_for(block: list[str], workdir: Path) -> list[str]:
    """The block's lines, as bash will run them in workdir, with the replacements of REPLACED."""
    lines, clones = [], 0
    for line in block:
        clone = CLONE.match(line)
        if clone:
            clones += 1
            folder = clone.group("url").rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
            assert f"cd {folder}" in block, f"docs/setup.md: `{line}` makes {folder}/, but no `cd {folder}` follows"
            copy_working_tree(workdir / folder)
            continue
        if line in REPLACED:
            if REPLACED[line] is not None:
                lines.append(REPLACED[line])
            continue
        assert "download.pytorch.org" not in line, f"docs/setup.md: `{line}` needs an index this test cannot reach"
        assert not (line.startswith("pip install") and re.search(r"\btorch\b", line)) or "torch==2.13.0" in line, (
            f"docs/setup.md: `{line}` would install an unpinned torch"
        )
        lines.append(line)
    assert clones == 1, "docs/setup.md: the Linux block should start with one `git clone` of the course"
    missing = [line for line in REPLACED if line not in block]
    assert not missing, f"docs/setup.md's Linux block no longer has {missing}: update REPLACED in this test"
    return lines


def test_the_linux_block_has_every_step() -> None:
    block = linux_block()
    steps = {
        "a venv": "python3 -m venv .venv",
        "its activation": "source .venv/bin/activate",
        "the CPU torch": f"pip install {TORCH_PIN} {CPU_INDEX}",
        "the pinned requirements": "pip install -r requirements.txt",
        "the tool and the course's helpers, without dependencies": "pip install --no-deps -e . -e course/",
        "Graphviz": "sudo apt-get install -y graphviz",
        "JupyterLab on the notebooks": "jupyter lab notebooks/",
    }
    missing = [name for name, line in steps.items() if line not in block]
    assert not missing, f"docs/setup.md's Linux set-up lacks {missing}"
    order = [block.index(line) for line in steps.values()]
    assert order == sorted(order), "docs/setup.md's Linux set-up runs its steps out of order: " + str(block)


@pytest.mark.timeout(1500)
def test_the_linux_setup_runs_notebook_01s_first_section(tmp_path: Path) -> None:
    if platform.system() != "Linux":
        pytest.skip("the tested set-up block is the Linux one")
    if not local_cpu_torch_is_available():
        message = (
            f"pip finds no local {TORCH_PIN} wheel (a find-links folder in pip's configuration), and this "
            "test never downloads torch"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)

    lines = script_for(linux_block(), tmp_path)
    course = tmp_path / "backward-twice"
    section = first_section(NOTEBOOK)
    probe = (
        "import sys, torch, helpers, backward_twice\n"
        "print(sys.prefix)\nprint(helpers.__file__)\nprint(backward_twice.__file__)\nprint(torch.__version__)"
    )
    section.cells.append(nbformat.v4.new_code_cell(probe))
    nbformat.write(section, course / "notebooks" / "first_section.ipynb")
    lines.append("jupyter execute --output=first_section_run.ipynb notebooks/first_section.ipynb")
    script = tmp_path / "setup.sh"
    script.write_text("set -euo pipefail\nset -x\n" + "\n".join(lines) + "\n", encoding="utf-8")

    # python3 is the interpreter this test runs on (its base, outside any venv), so the venv gets the
    # Python the local torch wheel was built for; nothing of this environment leaks into the new one.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "JUPYTER_PATH"}
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PIP_COMPILE"] = "0"  # pip install --no-compile (PIP_NO_COMPILE=1 would mean the opposite)
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ]:
        env[name] = str(tmp_path / "jupyter" / sub)
    start, cpu_before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1400)
    seconds = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    log = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"docs/setup.md's Linux set-up failed after {seconds:.0f} s:\n{log}"

    assert re.search(r"^4\.6\.6$", result.stdout, re.MULTILINE), f"jupyter lab --version is not 4.6.6:\n{log}"
    ran = nbformat.read(course / "notebooks" / "first_section_run.ipynb", as_version=4)
    *cells, probe_cell = [cell for cell in ran.cells if cell.cell_type == "code"]
    prefix, helpers_file, tool_file, torch_version = printed(probe_cell).split()
    assert Path(prefix) == course / ".venv", f"the kernel ran in {prefix}, not the set-up's .venv"
    assert Path(helpers_file).is_relative_to(course / "helpers"), f"helpers came from {helpers_file}"
    assert Path(tool_file).is_relative_to(course / "backward_twice"), f"backward_twice came from {tool_file}"
    assert torch_version == "2.13.0+cpu", f"pip replaced the CPU build: torch {torch_version}"

    committed = [cell for cell in section.cells[:-1] if cell.cell_type == "code"]
    assert len(committed) == len(cells) >= 3
    compared = 0
    for number, (want, got) in enumerate(zip(committed, cells), 1):
        tags = want.metadata.get("tags", [])
        where = f"code cell {number} of {NOTEBOOK.name}'s first section ({want.source.splitlines()[0]!r})"
        assert errors(got) == errors(want), f"{where}: errors {errors(got)}, committed {errors(want)}"
        if "raises-exception" in tags:
            assert errors(got), f"{where} is tagged raises-exception but raised nothing"
        if "nbval-ignore-output" in tags:
            continue
        assert printed(got) == printed(want), f"{where} printed\n{printed(got)}\ncommitted:\n{printed(want)}"
        compared += 1
    assert compared >= 2, "the first section has too few compared outputs to show the set-up works"
    assert "torch 2.13.0+cpu" in printed(cells[0]), f"the setup cell printed {printed(cells[0])!r}"
    print(f"docs/setup.md's set-up and notebook 01's first section: {seconds:.0f} s wall, {cpu:.0f} s CPU")


def test_the_chinese_setup_page_gives_the_same_commands() -> None:
    # A reader of docs/setup.zh-CN.md runs the same set-up; only the tested copy in docs/setup.md is executed.
    english = SETUP.read_text(encoding="utf-8")
    chinese = SETUP_ZH.read_text(encoding="utf-8")
    blocks = [
        block
        for block in re.findall(r"^```(?:bash|powershell)\n.*?^```", english, re.DOTALL | re.MULTILINE)
        if re.search(r"^(python3|py) -m venv|pip config --site", block, re.MULTILINE)
    ]
    assert len(blocks) >= 4, "docs/setup.md should give the Linux, macOS, Windows and mainland China set-ups"
    missing = [block.splitlines()[1:4] for block in blocks if block not in chinese]
    assert not missing, f"docs/setup.zh-CN.md lacks the set-up blocks that begin {missing}"
