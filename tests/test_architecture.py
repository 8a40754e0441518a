"""The package's layout rules (CONTRIBUTING.md, "Where a helper goes"), kept by reading the code and the notebooks.

* The tool (``backward_twice/``) never imports the course (``helpers/``); the tool's layers import downward only
  (ways in and instruments > ``watcher`` and ``steps`` > ``report`` > ``judge`` > ``record`` > ``common``); no two
  modules or subpackages of one package import each other; the course's core (``helpers/*.py``) never imports a
  lesson, and a lesson (``helpers/lessons/NAME``) never imports another: import-linter's contracts in
  pyproject.toml say it (``make test`` runs ``lint-imports``); the test here makes sure each breaks when a copy of
  the packages breaks it.
* No code swaps ``sys.modules``, a subpackage's ``__init__`` is a docstring, and no module of the tool imports its
  own front door.
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
TOOL = ROOT / "backward_twice"
LESSONS = HELPERS / "lessons"


def package_files() -> list[Path]:
    """Every module of the tool and of the course."""
    return sorted([*TOOL.rglob("*.py"), *HELPERS.rglob("*.py")])


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
        [str(Path(sys.executable).parent / "lint-imports"), str(ROOT / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_import_contracts_catch_a_module_that_breaks_them(tmp_path: Path) -> None:
    """`make test` runs lint-imports on pyproject.toml's contracts; here each must break on a copy that breaks it."""
    for tree in (HELPERS, TOOL):
        shutil.copytree(tree, tmp_path / tree.name, ignore=shutil.ignore_patterns("__pycache__"))
    assert _lint_imports(tmp_path).returncode == 0, "the contracts fail on an unchanged copy"
    lessons = lesson_names()
    tool = tmp_path / "backward_twice"
    for path, line, contract in [
        (tmp_path / "helpers" / "display.py", f"import helpers.lessons.{lessons[0]}", "never imports a lesson"),
        (lesson_files_in(tmp_path, lessons[1])[0], f"import helpers.lessons.{lessons[0]}", "another lesson"),
        (tmp_path / "helpers" / "figures.py", "import helpers.lab", "The course's layers"),
        (tool / "common" / "units.py", "import helpers.display", "the tool never imports the course"),
        (tool / "record" / "saved.py", "import backward_twice.judge.verdicts", "The tool's layers"),
        (tool / "instruments" / "meter.py", "import backward_twice.instruments.graph", "never imports the drawing"),
        (tool / "record" / "saved.py", "import backward_twice.record.names", "import each other"),
    ]:
        original = path.read_text(encoding="utf-8")
        path.write_text(original + f"\n{line}\n", encoding="utf-8")
        result = _lint_imports(tmp_path)
        path.write_text(original, encoding="utf-8")
        broken = [row for row in result.stdout.splitlines() if "BROKEN" in row]
        assert result.returncode != 0, f"{line} in {path.name} went unnoticed"
        assert any(contract in row for row in broken) or contract in result.stdout.split("Broken contracts")[-1], (
            f"{line} in {path.name} did not break the contract saying {contract!r}: {broken}"
        )


def test_no_code_swaps_sys_modules() -> None:
    """One module, one name: nothing puts a module into ``sys.modules`` under another name or takes one out. The
    command's script is the one exception, as python makes it: ``sys.modules["__main__"]``."""
    swaps = re.compile(
        r"sys\.modules\[(?!\"__main__\"\])[^\]]+\]\s*=[^=]|sys\.modules\.(?:update|pop|setdefault)\(|del sys\.modules"
    )
    offenders = [str(p.relative_to(ROOT)) for p in package_files() if swaps.search(p.read_text(encoding="utf-8"))]
    assert not offenders, f"{offenders} change sys.modules"


def test_subpackages_of_the_tool_are_docstrings_and_its_modules_never_import_its_front_door() -> None:
    for init in sorted(TOOL.glob("*/__init__.py")):
        body = ast.parse(init.read_text(encoding="utf-8")).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{init.relative_to(ROOT)} does more than document"
    for path in sorted(TOOL.rglob("*.py")):
        if path == TOOL / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert "backward_twice" not in names, f"{path.relative_to(ROOT)} imports the front door, backward_twice"


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
    for path in package_files():
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
# step's closure and globals. backward_twice/record/learner.py is the one place that patches torch and
# backward_twice/record/step_input.py the one that reads a step; every tool and check goes through them
# (backward_twice/steps/harness.py runs a step on them, backward_twice/record/recorder.py watches through them).
_PATCHES_TORCH = re.compile(
    r"_engine_run_backward|register_optimizer_step_(?:pre|post)_hook|setattr\(torch\b"
    r"|torch\.autograd\.\w+\s*=[^=]|torch\.Tensor\.\w+\s*=[^=]|optimizer\.step\s*=[^=]"
)
_READS_A_STEP = re.compile(r"__closure__|__globals__")


def _modules_matching(pattern: re.Pattern[str]) -> set[str]:
    found = set()
    for path in package_files():
        code = "\n".join(
            line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
        )
        if pattern.search(code):
            found.add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize(
    ("pattern", "the_one_place", "use"),
    [
        (_PATCHES_TORCH, "backward_twice/record/learner.py", "backward_twice.record.learner.intercepting"),
        (_READS_A_STEP, "backward_twice/record/step_input.py", "backward_twice.record.step_input (known_names, ...)"),
    ],
    ids=["patches torch", "reads a step's closure and globals"],
)
def test_only_one_module_patches_torch_and_one_reads_a_steps_closure_and_globals(
    pattern: re.Pattern[str], the_one_place: str, use: str
) -> None:
    offenders = _modules_matching(pattern)
    assert the_one_place in offenders
    assert offenders == {the_one_place}, (
        f"{sorted(offenders - {the_one_place})} do what only {the_one_place} does: use {use} or "
        "backward_twice.steps.harness.run_step"
    )
