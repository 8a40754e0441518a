"""A library's import runs untraced while the line tracer is on.

Up to Python 3.11 a trace function set with ``sys.settrace`` is called at every Python call on its thread, even when
it returns None for the frame. A module's first import runs thousands of calls: under ``backward-twice watch`` a
script's own ``import torchvision`` at its top, or torch's first optimizer, which imports ``torch._dynamo`` (about
1.7 s of CPU bare), paid that call each time. :class:`LibraryImports` is a finder put first on ``sys.meta_path``
while a :class:`backward_twice.record.lines.LineTracer` is on: for a module the import system is about to load from
outside the learner's files, it pauses this thread's tracer while the module's code runs (and while the finders look for
it), then resumes it. The learner's own modules are imported traced, as before: a loop that runs at a module's top is
still seen.

It changes nothing the learner's code can observe once the module is loaded: the module's ``__loader__`` and
``__spec__.loader`` are the loader the next finder gave, put back before the module's code runs. A spec that
``importlib.util.find_spec`` asks for (not the import system loading a module) is left as the finders give it. Any
error inside it gives the import back to the import system unchanged. From Python 3.12, where pausing a trace
function re-instruments code (PEP 669), :meth:`backward_twice.record.lines.LineTracer.pause` declines and imports stay
traced.

Used by :mod:`backward_twice.record.lines`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from typing import Any

__all__ = ["LibraryImports"]

_IMPORT_SYSTEM = "_find_and_load_unlocked"  # importlib._bootstrap's function that loads a module not yet imported


class LibraryImports:
    """A meta path finder that finds nothing itself: for a module outside the learner's files (``is_learners_file``
    of its origin is False), about to be loaded by the import system, it wraps the spec's loader so that the
    module's code runs with ``pause()`` in force; ``resume(paused)`` follows. Put it first on ``sys.meta_path``
    with :meth:`install`, take it off with :meth:`uninstall`."""

    def __init__(
        self, is_learners_file: Callable[[str], bool], pause: Callable[[], bool], resume: Callable[[bool], None]
    ) -> None:
        self.is_learners_file, self.pause, self.resume = is_learners_file, pause, resume

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        try:
            if sys._getframe(2).f_code.co_name != _IMPORT_SYSTEM:  # importlib.util.find_spec, not a load
                return None
            paused = self.pause()
            try:
                spec = self._next_spec(fullname, path, target)
            finally:
                self.resume(paused)
            if spec is None or spec.origin is None or not hasattr(spec.loader, "exec_module"):
                return None
            if not spec.has_location or self.is_learners_file(spec.origin):
                return None
            spec.loader = _UntracedLoader(spec.loader, self)
            return spec
        except Exception:  # the import system asks the other finders, as without this one
            return None

    def _next_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, LibraryImports) or find is None:  # this one, or another tracer's
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                return spec
        return None


class _UntracedLoader(Loader):
    """The import system's handle on one module's loader, for the time of one load: it puts the real loader back on
    the module and its spec, then runs the module's code untraced."""

    def __init__(self, loader: Any, imports: LibraryImports) -> None:
        self.loader, self.imports = loader, imports

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        paused = self.imports.pause()
        try:
            self.loader.exec_module(module)
        finally:
            self.imports.resume(paused)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
