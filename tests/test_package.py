"""The helpers package as a whole: explicit public names, documented, no side effects on import."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import helpers

HELPERS = Path(helpers.__file__).resolve().parent


def test_every_public_name_exists_and_says_which_notebook_uses_it() -> None:
    assert helpers.__all__ == sorted(helpers.__all__, key=lambda n: (n[0].islower(), n))
    for name in helpers.__all__:
        obj = getattr(helpers, name)
        doc = inspect.getdoc(obj) or ""
        assert re.search(r"notebook", doc, re.IGNORECASE), f"{name}'s docstring does not name a notebook"


def test_no_star_imports_and_every_module_documented() -> None:
    for path in HELPERS.rglob("*.py"):
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
        "import helpers.meter\n"
        "assert helpers.meter._active_meter is None, 'a meter was entered on import'\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'importing helpers must not start pyplot'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
