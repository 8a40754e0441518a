"""A library's first import runs untraced while the line tracer is on, and leaves the module as a bare import does.

Each test imports modules written into ``tmp_path``: ``lib_*`` stand for a library (outside the learner's files),
``mine_*`` for a module of the learner's. A module records ``sys.gettrace()`` as its code runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import sys

import pytest

from backward_twice.record.lines import LineTracer

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 imports stay traced (PEP 669)")

RECORDS_TRACE = "import sys\ntrace_at_import = sys.gettrace()\n"


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for name in ("lib_plain", "lib_pkg/__init__", "lib_pkg/inner", "mine_plain", "lib_asked"):
        path = tmp_path / f"{name}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(RECORDS_TRACE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("lib_plain", "lib_pkg", "lib_pkg.inner", "mine_plain", "lib_asked"):
        sys.modules.pop(name, None)


def _tracing(body):
    """Run ``body`` under a started tracer whose learner's files are this test's and every ``mine_*`` module."""
    counter = itertools.count()
    tracer = LineTracer(
        lambda: next(counter),
        lambda code: code.co_filename == __file__,
        is_learners_file=lambda filename: filename == __file__ or "mine_" in filename,
    )
    meta_path = list(sys.meta_path)
    assert tracer.start(sys._getframe())
    try:
        body()
    finally:
        tracer.stop()
    assert sys.meta_path == meta_path  # the finder went with the tracer
    return tracer


def test_a_library_module_runs_untraced_and_the_learners_own_module_traced(modules):
    def body():
        import lib_pkg.inner  # noqa: F401
        import lib_plain  # noqa: F401
        import mine_plain  # noqa: F401

    _tracing(body)
    assert sys.modules["lib_plain"].trace_at_import is None
    assert sys.modules["lib_pkg"].trace_at_import is None
    assert sys.modules["lib_pkg.inner"].trace_at_import is None
    assert sys.modules["mine_plain"].trace_at_import is not None  # a loop at a learner's module's top is seen


def test_the_module_keeps_the_loader_a_bare_import_gives(modules):
    _tracing(lambda: importlib.import_module("lib_plain"))
    module = sys.modules["lib_plain"]
    assert type(module.__loader__) is importlib.machinery.SourceFileLoader
    assert module.__spec__.loader is module.__loader__
    assert module.__file__ == str(modules / "lib_plain.py")


def test_find_spec_asked_by_the_learners_code_gets_the_finders_own_spec(modules):
    specs = []
    _tracing(lambda: specs.append(importlib.util.find_spec("lib_asked")))
    assert type(specs[0].loader) is importlib.machinery.SourceFileLoader
    assert "lib_asked" not in sys.modules


def test_an_import_that_fails_fails_as_without_the_tracer(modules):
    (modules / "lib_broken.py").write_text("raise ValueError('broken at import')\n")
    errors = []

    def body():
        for name in ("lib_broken", "lib_missing_anywhere"):
            try:
                importlib.import_module(name)
            except Exception as error:
                errors.append((type(error), str(error)))

    _tracing(body)
    assert errors == [(ValueError, "broken at import"), (ModuleNotFoundError, "No module named 'lib_missing_anywhere'")]
    assert sys.gettrace() is None
    sys.modules.pop("lib_broken", None)


def test_the_trace_is_back_after_a_library_import(modules):
    seen = []

    def body():
        import lib_plain  # noqa: F401

        seen.append(sys.gettrace())

    tracer = _tracing(body)
    assert seen == [tracer._trace]
