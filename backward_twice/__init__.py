"""``import backward_twice as bt``: the course's helpers under a name that no project shadows.

A learner's own project often has a ``helpers.py``; run from its folder, ``import helpers`` returns theirs. This
package loads the course's ``helpers`` package (the folder next to this one) with ``sys.modules["helpers"]``
pointing at it only while it loads, so the helpers' own ``from helpers.x import ...`` lines find the course's
modules, then puts back whatever ``helpers`` was before (the learner's module, or nothing): their
``import helpers`` keeps returning theirs. The loaded modules are also registered as ``backward_twice.<name>``
(``backward_twice.cli`` is the console script ``backward-twice``; ``%load_ext backward_twice.magic`` works).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

_SUBMODULES = ("cli", "magic", "watcher")  # loaded here: nothing may import a helpers module later by name


def _is_helpers(name: str) -> bool:
    return name == "helpers" or name.startswith("helpers.")


def _load() -> ModuleType:
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
    current = sys.modules.get("helpers")
    if current is not None and os.path.dirname(os.path.abspath(getattr(current, "__file__", None) or "")) == folder:
        for name in _SUBMODULES:  # the course's own helpers are loaded already (a notebook): the same modules
            importlib.import_module(f"helpers.{name}")
        _register({name: module for name, module in sys.modules.items() if _is_helpers(name)})
        return current
    before = {name: module for name, module in sys.modules.items() if _is_helpers(name)}
    for name in before:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "helpers", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["helpers"] = package
    try:
        spec.loader.exec_module(package)
        for name in _SUBMODULES:
            importlib.import_module(f"helpers.{name}")
    finally:
        loaded = {name: module for name, module in sys.modules.items() if _is_helpers(name)}
        for name in loaded:
            del sys.modules[name]
        sys.modules.update(before)
    _register(loaded)
    return package


def _register(modules: dict[str, ModuleType]) -> None:
    for name, module in modules.items():
        if name != "helpers":
            sys.modules.setdefault("backward_twice" + name[len("helpers") :], module)


_helpers = _load()
watch = sys.modules["backward_twice.watcher"].watch  # for a learner's own loop, also before a notebook calls it
__all__ = sorted({*_helpers.__all__, "watch"})
globals().update({name: getattr(_helpers, name) for name in _helpers.__all__})
