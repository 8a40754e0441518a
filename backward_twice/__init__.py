"""``import backward_twice as bt``: the course's helpers under a name that no project shadows.

A learner's own project often has a ``helpers.py``; run from its folder, ``import helpers`` returns theirs. This
package loads the course's ``helpers`` package (the folder next to this one) with ``sys.modules["helpers"]``
pointing at it only while it loads, so the helpers' own ``from helpers.x import ...`` lines find the course's
modules, then puts back whatever ``helpers`` was before (the learner's module, or nothing): their
``import helpers`` keeps returning theirs. The loaded modules are also registered as ``backward_twice.<name>``
(``backward_twice.cli`` is the console script ``backward-twice``; ``%load_ext backward_twice.magic`` works).

The import is light: the tool (``watch``, the command, ``%%diagnose``) and torch; every other name (``draw_graph``,
the lessons' panels) is loaded the same way when it is first asked for, with matplotlib, IPython, ipywidgets or
graphviz only then.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

_SUBMODULES = ("cli", "magic", "watcher")  # loaded here: nothing may import a helpers module later by name
_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
_T = TypeVar("_T")


def _is_helpers(name: str) -> bool:
    return name == "helpers" or name.startswith("helpers.")


def _ours(module: ModuleType | None) -> bool:
    return module is not None and os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or "")) == _FOLDER


def _with_course(package: ModuleType | None, load: Callable[[], _T]) -> _T:
    """``load()`` with the course's ``helpers`` (``package``, or a fresh one) in ``sys.modules`` meanwhile; what was
    there before is put back, and the course's modules loaded meanwhile are registered as ``backward_twice.<name>``."""
    current = sys.modules.get("helpers")
    if _ours(current):  # the course's own helpers are loaded already (a notebook): the same modules
        try:
            return load()
        finally:
            _register({name: module for name, module in sys.modules.items() if _is_helpers(name)})
    before = {name: module for name, module in sys.modules.items() if _is_helpers(name)}
    for name in before:
        del sys.modules[name]
    sys.modules.update(_course)
    if package is not None:
        sys.modules["helpers"] = package
    try:
        return load()
    finally:
        loaded = {name: module for name, module in sys.modules.items() if _is_helpers(name)}
        for name in loaded:
            del sys.modules[name]
        sys.modules.update(before)
        _course.update(loaded)
        _register(loaded)


def _load() -> ModuleType:
    current = sys.modules.get("helpers")

    def load_the_tool() -> None:
        for name in _SUBMODULES:
            importlib.import_module(f"helpers.{name}")

    if _ours(current):
        assert current is not None
        _with_course(current, load_the_tool)
        return current

    def load() -> ModuleType:
        spec = importlib.util.spec_from_file_location(
            "helpers", os.path.join(_FOLDER, "__init__.py"), submodule_search_locations=[_FOLDER]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["helpers"] = package
        spec.loader.exec_module(package)
        load_the_tool()
        return package

    return _with_course(None, load)


def _register(modules: dict[str, ModuleType]) -> None:
    for name, module in modules.items():
        if name != "helpers":
            sys.modules.setdefault("backward_twice" + name[len("helpers") :], module)


_course: dict[str, ModuleType] = {}  # the course's modules, by their names under helpers
_helpers = _load()
watch = sys.modules["backward_twice.watcher"].watch  # for a learner's own loop, also before a notebook calls it
__all__ = sorted({*_helpers.__all__, "watch"})


def __getattr__(name: str) -> Any:
    """Any other name of the course's, loaded when first asked for (with the course's ``helpers`` in place)."""
    if name not in __all__:
        raise AttributeError(f"module 'backward_twice' has no attribute {name!r}")
    value = _with_course(_helpers, lambda: getattr(_helpers, name))
    globals()[name] = value
    return value
