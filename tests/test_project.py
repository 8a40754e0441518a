"""The promises the README makes about setting up: two commands, pinned environments that agree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pins(path: Path) -> dict[str, str]:
    result = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        assert version, f"{path.name}: {line!r} is not pinned with =="
        result[name.strip().lower()] = version.strip()
    return result


def test_binder_pins_the_same_versions_as_the_course() -> None:
    course = pins(ROOT / "requirements.txt")
    binder = pins(ROOT / "binder" / "requirements.txt")
    assert course["torch"] == "2.13.0"
    assert binder.pop("torch") == course.pop("torch") + "+cpu"
    assert binder == course


def test_binder_uses_the_cpu_wheel_index_and_the_rest_of_repo2docker_files() -> None:
    text = (ROOT / "binder" / "requirements.txt").read_text(encoding="utf-8")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text
    assert "graphviz" in (ROOT / "binder" / "apt.txt").read_text(encoding="utf-8").split()
    assert (ROOT / "binder" / "runtime.txt").read_text(encoding="utf-8").strip() == "python-3.11"
    post_build = (ROOT / "binder" / "postBuild").read_text(encoding="utf-8")
    assert "set -e" in post_build and "pip install --no-deps -e ." in post_build


def test_what_make_test_installs_never_touches_the_cpu_index() -> None:
    for name in ("requirements.txt", "requirements-test.txt", "Makefile", "pyproject.toml"):
        assert "download.pytorch.org" not in (ROOT / name).read_text(encoding="utf-8"), name


def test_the_distribution_is_not_named_helpers() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    name = re.search(r'^name = "([^"]+)"', text, re.MULTILINE)
    assert name and name.group(1) != "helpers"


def test_ci_runs_make_test() -> None:
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == "make test"


def test_readme_shows_the_two_commands_first() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_code_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.DOTALL)
    assert first_code_block, "the README has no code block"
    assert "make lab" in first_code_block.group(1) and "make test" in first_code_block.group(1)
    for target in ("lab:", "test:"):
        assert re.search(rf"^{target}", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
