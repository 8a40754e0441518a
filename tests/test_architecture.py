"""The package's layout rules (CONTRIBUTING.md, "Where a helper goes"), kept by reading the code and the notebooks.

* The core (``helpers/*.py``) never imports a lesson, and a lesson (``helpers/lessons/NAME``) never imports
  another: import-linter's contracts in pyproject.toml say it (``make test`` runs ``lint-imports``); the test here
  makes sure they break when a copy of the package breaks them.
* Each lesson belongs to the notebook named after it (``gan_step`` -> ``03_gan_step.ipynb``), and its
  notebook calls every public name it exports.
* ``bt`` (``import helpers as bt``) exports exactly the names the notebooks call (tests/test_used_by.py checks
  that every "Used by" sentence in a docstring names exactly the users the notebooks and the code give it).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "helpers"
LESSONS = HELPERS / "lessons"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def notebook_calls() -> dict[str, set[str]]:
    """``bt.NAME`` -> the notebooks (stems) whose code cells use it."""
    calls: dict[str, set[str]] = {}
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for name in re.findall(r"\bbt\.([A-Za-z_]\w*)", code):
            calls.setdefault(name, set()).add(path.stem)
    return calls


def lesson_names() -> list[str]:
    return sorted(
        p.stem
        for p in LESSONS.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    )


def lesson_files_in(root: Path, lesson: str) -> list[Path]:
    package = root / "helpers" / "lessons" / lesson
    return sorted(package.glob("*.py")) if package.is_dir() else [package.with_suffix(".py")]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--config", str(ROOT / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_import_contracts_catch_a_core_module_or_a_lesson_that_breaks_them(tmp_path: Path) -> None:
    """`make test` runs lint-imports on pyproject.toml's contracts; here they must break on a copy that breaks them."""
    shutil.copytree(HELPERS, tmp_path / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    assert _lint_imports(tmp_path).returncode == 0, "the contracts fail on an unchanged copy"
    lessons = lesson_names()
    for path, line in [
        (tmp_path / "helpers" / "display.py", f"import helpers.lessons.{lessons[0]}"),
        (lesson_files_in(tmp_path, lessons[1])[0], f"import helpers.lessons.{lessons[0]}"),
    ]:
        original = path.read_text(encoding="utf-8")
        path.write_text(original + f"\n{line}\n", encoding="utf-8")
        result = _lint_imports(tmp_path)
        path.write_text(original, encoding="utf-8")
        assert result.returncode != 0 and "BROKEN" in result.stdout, f"{line} in {path.name} went unnoticed"


@pytest.mark.parametrize("lesson", lesson_names())
def test_each_lesson_belongs_to_one_notebook_that_calls_every_name_it_exports(lesson: str) -> None:
    notebooks = [p.stem for p in NOTEBOOKS if p.stem.split("_", 1)[1] == lesson]
    assert len(notebooks) == 1, f"lesson {lesson!r} matches no notebook (or several): {notebooks}"
    module = __import__(f"helpers.lessons.{lesson}", fromlist=["__all__"])
    calls = notebook_calls()
    unused = [name for name in module.__all__ if notebooks[0] not in calls.get(name, set())]
    assert not unused, f"{notebooks[0]} never calls {unused}, which lesson {lesson!r} exports"


def test_bt_exports_exactly_what_the_notebooks_call() -> None:
    calls = notebook_calls()
    assert sorted(helpers.__all__) == sorted(calls), (
        f"not called by any notebook: {sorted(set(helpers.__all__) - set(calls))}; "
        f"called but not exported: {sorted(set(calls) - set(helpers.__all__))}"
    )
    assert helpers.__all__ == sorted(helpers.__all__, key=lambda n: (n[0].islower(), n))


def test_no_module_is_too_long_to_read() -> None:
    # 500 lines as ruff format lays them out (it spreads a long call over one line per argument).
    for path in sorted(HELPERS.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines; split it by responsibility"


def _functions(source: str) -> dict[str, str]:
    """Top-level function name -> its AST without docstrings (comments and layout never count)."""
    functions = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            body = (
                node.body[1:]
                if (node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant))
                else node.body
            )
            functions[node.name] = ast.dump(ast.Module(body=body, type_ignores=[]))
    return functions


@pytest.mark.parametrize(
    "name",
    ["d_loss_fn", "g_loss_fn", "mlp", "make_gan", "srgan_step", "moved_step", "standard_step", "single_forward_step"],
)
def test_the_gan_tests_run_the_notebooks_own_code(name: str) -> None:
    """tests/gan_steps.py copies notebook 03's losses, networks and steps; a copy that drifts fails here."""
    cells = json.loads((ROOT / "notebooks" / "03_gan_step.ipynb").read_text(encoding="utf-8"))["cells"]
    notebook = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            notebook.update(_functions("".join(cell["source"])))
    copy = _functions((ROOT / "tests" / "gan_steps.py").read_text(encoding="utf-8"))
    assert name in notebook and name in copy
    assert copy[name] == notebook[name], f"tests/gan_steps.py's {name} differs from notebook 03's"


# What running a learner's step takes: patching torch (the engine's entry, optimizer step hooks) and reading a
# step's closure and globals. helpers/learner.py is the one place that does either; every tool and check goes
# through it (helpers/harness.py runs a step on it, helpers/recorder.py watches through it).
_PATCHES_OR_READS_A_STEP = re.compile(
    r"_engine_run_backward|register_optimizer_step_(?:pre|post)_hook|__closure__|__globals__|setattr\(torch\b"
    r"|torch\.autograd\.\w+\s*=[^=]|torch\.Tensor\.\w+\s*=[^=]|optimizer\.step\s*=[^=]"
)
_THE_ONE_PLACE = "helpers/learner.py"


def test_only_one_module_patches_torch_or_reads_a_steps_closure_and_globals() -> None:
    offenders = set()
    for path in sorted(HELPERS.rglob("*.py")):
        code = "\n".join(
            line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
        )
        if _PATCHES_OR_READS_A_STEP.search(code):
            offenders.add(str(path.relative_to(ROOT)))
    assert _THE_ONE_PLACE in offenders
    assert offenders == {_THE_ONE_PLACE}, (
        f"{sorted(offenders - {_THE_ONE_PLACE})} patch torch or read a step's closure/globals: "
        f"use helpers.learner (intercepting, known_names, held_bindings) or helpers.harness.run_step"
    )
