"""The two packages as a whole: the tool (``backward_twice``) and the course (``helpers``): explicit public names,
documented, no side effects on import, and a light import of the tool."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import backward_twice
import helpers

HELPERS = Path(helpers.__file__).resolve().parent
TOOL = Path(backward_twice.__file__).resolve().parent


def test_every_public_name_exists_and_says_which_notebook_uses_it() -> None:
    assert helpers.__all__ == sorted(helpers.__all__, key=lambda n: (n[0].islower(), n))
    for name in helpers.__all__:
        obj = getattr(helpers, name)
        doc = inspect.getdoc(obj) or ""
        assert re.search(r"notebook", doc, re.IGNORECASE), f"{name}'s docstring does not name a notebook"


def test_the_tools_public_names_exist_and_are_documented() -> None:
    assert backward_twice.__all__ == sorted(backward_twice.__all__, key=lambda n: (n[0].islower(), n))
    for name in backward_twice.__all__:
        assert inspect.getdoc(getattr(backward_twice, name)), f"backward_twice.{name} has no docstring"
    assert set(backward_twice.__all__) <= set(dir(backward_twice))


def test_no_star_imports_and_every_module_documented() -> None:
    for path in [*TOOL.rglob("*.py"), *HELPERS.rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "import *" not in text, path.name
        assert text.lstrip().startswith('"""'), f"{path.name} has no module docstring"


def test_importing_has_no_side_effects() -> None:
    code = (
        "import io, sys, contextlib\n"
        "buffer = io.StringIO()\n"
        "with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):\n"
        "    import helpers\n"
        "import torch\n"
        "assert buffer.getvalue() == '', buffer.getvalue()\n"
        "import backward_twice.instruments.meter\n"
        "assert backward_twice.instruments.meter._active_meter is None, 'a meter was entered on import'\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'importing helpers must not start pyplot'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_importing_the_tool_loads_neither_the_course_nor_a_drawing_display_or_widget_library() -> None:
    """``import backward_twice``: torch and the tool. graphviz comes with the first ``draw_graph``, IPython with
    ``%load_ext backward_twice``; matplotlib and ipywidgets are the course's."""
    code = (
        "import sys, backward_twice as bt\n"
        "heavy = ('matplotlib', 'IPython', 'ipywidgets', 'graphviz', 'helpers')\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in heavy))\n"
        "bt.draw_graph\n"
        "print(sorted(n for n in ('graphviz', 'matplotlib', 'IPython', 'helpers') if n in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TOOL.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "['graphviz']"]
