"""The one place that runs into torch and into a learner's step: what every tool that watches or runs a learner's
code shares (:mod:`backward_twice.record.recorder`, :mod:`backward_twice.steps.harness` and through them
:func:`backward_twice.watcher.watch`, ``backward-twice watch``, :func:`backward_twice.steps.diagnose.diagnose`,
:func:`backward_twice.steps.audit.audit_retain_graph`, :func:`backward_twice.steps.carried.find_carried_graph`,
``%%diagnose`` and the lessons' checks).

* :func:`intercepting` is the only code that patches torch: autograd's engine entry (bound twice, in
  ``torch.autograd.graph`` and ``torch.autograd``: ``loss.backward()``, ``torch.autograd.backward`` and ``grad``
  all pass through it) and PyTorch's global optimizer step hooks;
* :func:`passed_optimizers_only` stops a run when an optimizer the caller did not pass calls ``step()``, before it
  changes weights or state that nothing could put back;
* :func:`learners_code` tells the learner's code from torch's, the helpers' and the libraries' (a file outside torch,
  the tool (and the course), the standard library and site-packages), :func:`learners_class` a class written in it
  (a callback of the learner's in a framework's trainer), :func:`learner_line` finds the learner's own line
  in a stack ("file:line: code", the first such frame; :meth:`LearnersCode.site` with its file and line, for the
  recorder's hooks), :func:`place` names a notebook cell's line as IPython's tracebacks do ("Cell In[5], line 3": a
  cell's file lies in a folder named after the kernel's process, so its path changes with every kernel),
  :func:`short` drops the folders, :func:`site_of` reads a line's file and number back (a cell's too),
  :func:`first_line` gives an error's first line, and :func:`without_tool_frames` its traceback without the tool's
  frames.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import re
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from backward_twice.record.step_input import known_names

__all__ = [
    "ENGINE_ENTRY",
    "TIMED_CELL",
    "LearnersCode",
    "first_line",
    "intercepting",
    "learner_line",
    "learner_line_at",
    "learners_class",
    "learners_code",
    "lend_timed_cell_source",
    "lines_of_file",
    "passed_optimizers_only",
    "place",
    "short",
    "site_of",
    "skip_folder",
    "skipped_dirs",
    "source_lines",
    "without_tool_frames",
]

TIMED_CELL = "<timed exec>"  # the file IPython's ``%%time`` compiles a cell's statements under


_TOOL = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # backward_twice/
_SITES_PER_CODE = 4096  # a code's sites kept by instruction: its events' lines, bounded
# what LearnersCode knows of one code: the code, whether it is the learner's, whether it is a compiler's, and the
# learner's (file, line) and "file:line: code" at each instruction an event was seen at
_Known = tuple[types.CodeType, bool, bool, dict[int, tuple[tuple[str, int], str]]]
_ALSO_SKIPPED: list[str] = []


def skip_folder(path: str) -> None:
    """Treat code under ``path`` as not the learner's, like the tool's own: a course or a framework built on the
    tool, whose own backward calls a watch must not take for the learner's lines."""
    if path not in _ALSO_SKIPPED:
        _ALSO_SKIPPED.append(path)
        skipped_dirs.cache_clear()


@functools.cache
def skipped_dirs() -> tuple[str, ...]:
    """The folders whose code is not the learner's (torch, the tool's package, the standard library,
    site-packages, and each folder given to :func:`skip_folder`), each a real path ending in a separator: the same
    until :func:`skip_folder` adds one, so read once."""
    paths = sysconfig.get_paths()
    dirs = {os.path.dirname(torch.__file__), _TOOL, *_ALSO_SKIPPED}
    dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


@functools.lru_cache(maxsize=4096)
def _learners_file(filename: str, skipped: tuple[str, ...]) -> bool:
    """Whether code of ``filename`` is the learner's: a real file or a notebook cell outside ``skipped``. One
    ``realpath`` per file for the whole process, not per watch: each watch meets the same files again."""
    real = not filename.startswith("<") or filename.startswith(("<ipython", TIMED_CELL))
    return real and not os.path.realpath(filename).startswith(skipped)


_own_classes: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def learners_class(cls: type, skipped: tuple[str, ...]) -> bool:
    """Whether ``cls`` is written in the learner's code: the file of a function of its own body lies outside
    ``skipped`` (a class of a notebook cell has no module file to read); read once per class."""
    own = _own_classes.get(cls)
    if own is None:
        code = next((item.__code__ for item in vars(cls).values() if isinstance(item, types.FunctionType)), None)
        own = _own_classes[cls] = code is not None and _learners_file(code.co_filename, skipped)
    return own


class LearnersCode:
    """A test of whether code is the learner's (call it with a code object): its file lies outside ``skipped``
    (torch, the tool (and the course), the standard library, site-packages) and is a real file or a notebook cell, read
    once per code object. :meth:`site` finds the learner's line from a hook, in one walk."""

    def __init__(self, skipped: tuple[str, ...]) -> None:
        self.skipped = skipped
        # by id(code), the code kept beside: a code object hashes its whole bytecode at each lookup
        self._known: dict[int, _Known] = {}  # -> (code, the learner's, a compiler's, its sites by f_lasti)
        # by id(code) of the frame a walk started at: the codes it went through to the learner's, the learner's
        # instruction there, and what it found (a hook is called from the same path at each event of a loop)
        self._walks: dict[int, tuple[tuple[types.CodeType, ...], int, tuple[tuple[str, int], str, bool]]] = {}

    def _read(self, code: types.CodeType) -> _Known:
        compiler = any(part in code.co_filename for part in _COMPILERS)
        known = self._known[id(code)] = (code, _learners_file(code.co_filename, self.skipped), compiler, {})
        return known

    def file(self, filename: str) -> bool:
        """Whether code of ``filename`` is the learner's."""
        return _learners_file(filename, self.skipped)

    def __call__(self, code: types.CodeType) -> bool:
        known = self._known.get(id(code))
        if known is None or known[0] is not code:
            known = self._read(code)
        return known[1]

    def let_go(self, frame: types.FrameType | None) -> None:
        """Read ``f_locals`` of the learner's frames from ``frame`` out: up to Python 3.12 a read caches a frame's
        variables on it until the next read, so a read now lets go of what the loop deleted since, as bare Python
        would."""
        while frame is not None:
            if self(frame.f_code):
                frame.f_locals  # noqa: B018
            frame = frame.f_back

    def site(
        self, frame: types.FrameType | None, lines: dict[tuple[str, int], str]
    ) -> tuple[tuple[str, int], str, bool, types.FrameType | None]:
        """(file, line) and "file:line: code" of the first of the learner's frames from ``frame`` out, as
        :func:`learner_line` gives it (``lines`` the same cache), whether a frame of torch's compilers lies before it
        (aot_autograd tracing a compiled backward with ``autograd.grad``: a call that is not the loop's), and that
        frame. One walk; the line is read once per instruction of each code (on a module's frame a read of
        ``f_lineno`` scans its line table: a long script's loop would pay for its length at every event), and a walk
        through the same codes to the same instruction as the last from that start is only checked. Without a
        frame of the learner's: (("", 0), "(no source line outside torch)", ..., None)."""
        start = frame
        if frame is not None:
            last = self._walks.get(id(frame.f_code))
            if last is not None:
                walked: types.FrameType | None = frame
                learners = frame
                for code in last[0]:
                    if walked is None or walked.f_code is not code:
                        break
                    learners, walked = walked, walked.f_back
                else:
                    if learners.f_lasti == last[1]:
                        return (*last[2], learners)
        known_codes, compiled, codes = self._known, False, []
        while frame is not None:
            code = frame.f_code
            known = known_codes.get(id(code))
            if known is None or known[0] is not code:
                known = self._read(code)
            codes.append(code)
            if known[1]:
                sites, lasti = known[3], frame.f_lasti
                found = sites.get(lasti)
                if found is None:
                    site = (code.co_filename, frame.f_lineno)
                    line = lines.get(site)
                    if line is None:
                        line = lines[site] = learner_line_at(*site)
                    if len(sites) >= _SITES_PER_CODE:
                        return site, line, compiled, frame
                    sites[lasti] = found = (site, line)
                if start is not None and len(self._walks) < _SITES_PER_CODE:
                    self._walks[id(start.f_code)] = (tuple(codes), lasti, (found[0], found[1], compiled))
                return found[0], found[1], compiled, frame
            compiled = compiled or known[2]
            frame = frame.f_back
        return ("", 0), "(no source line outside torch)", compiled, None


def learners_code(skipped: tuple[str, ...]) -> LearnersCode:
    """A :class:`LearnersCode` for the folders in ``skipped``."""
    return LearnersCode(skipped)


Site = tuple[str, int]  # (file, line)
_COMPILERS = tuple(f"{os.sep}torch{os.sep}{part}{os.sep}" for part in ("_functorch", "_dynamo", "_inductor", "fx"))


def lend_timed_cell_source(frame: types.FrameType) -> Callable[[], None]:
    """Give ``linecache`` the source of the ``%%time`` cell ``frame`` runs (IPython keeps none for its code: the loop
    could not be read, nor stopped at its top) and return what takes it back, leaving linecache as it was (a later
    ``%%time`` cell, or its traceback, must not read this cell's lines); a no-op for any other frame."""
    try:
        timed = frame.f_code.co_filename == TIMED_CELL and frame.f_back is not None
        source = frame.f_back.f_locals.get("expr") if timed and frame.f_back else None  # as ``time`` compiled it
    except Exception:  # a shell of its own kind: its cell is read as without the tool
        source = None
    if not isinstance(source, str):
        return lambda: None
    before = linecache.cache.get(TIMED_CELL)
    linecache.cache[TIMED_CELL] = (len(source), None, source.splitlines(keepends=True), TIMED_CELL)

    def take_back() -> None:
        if before is None:
            linecache.cache.pop(TIMED_CELL, None)
        else:
            linecache.cache[TIMED_CELL] = before

    return take_back


def place(filename: str, lineno: int) -> str:
    """ "file:line", or for a notebook cell "Cell In[3], line 5" as IPython's tracebacks name it: a kernel's
    cell files are temporary names that change with every kernel."""
    ipython = sys.modules.get("IPython")  # never imported here: only a running shell has cells
    shell = ipython.get_ipython() if ipython is not None else None
    named = shell.compile.format_code_name(filename) if shell is not None else None
    return f"{named[0]} {named[1]}, line {lineno}" if named else f"{filename}:{lineno}"


def learner_line(
    frame: types.FrameType | None,
    lines: dict[tuple[str, int], str] | None = None,
    skipped: tuple[str, ...] | None = None,
) -> str:
    """The learner's line, "file:line: code" ("Cell In[3], line 5: code" in a notebook), of the first frame from
    ``frame`` outward that lies outside torch, the tool (and the course), the standard library and site-packages (code
    read with ``linecache``), or
    "(no source line outside torch)". ``lines`` caches each learner's (file, line)'s answer across calls;
    ``skipped`` is the folders to skip, computed when not given. The walk is :meth:`LearnersCode.site`'s."""
    tested = LearnersCode(skipped_dirs() if skipped is None else skipped)
    return tested.site(frame, {} if lines is None else lines)[1]


def learner_line_at(filename: str, lineno: int) -> str:
    """ "file:line: code" (a cell's "Cell In[3], line 5: code") of one line of the learner's code."""
    return f"{place(filename, lineno)}: {linecache.getline(filename, lineno).strip()}"


class _UnknownOptimizer(BaseException):  # not an Exception: a step's own ``except Exception`` must not catch it
    """An optimizer the caller did not pass called ``step()``: raised before it changes anything."""


@contextlib.contextmanager
def passed_optimizers_only(
    step: Callable[[], Any], optimizers: tuple[torch.optim.Optimizer, ...], who: str
) -> Iterator[None]:
    """While inside, an optimizer not in ``optimizers`` that calls ``step()`` stops the run before it changes its
    weights or its state (which nothing could put back), and leaves as a ValueError naming it."""
    known = {id(o) for o in optimizers}

    def guard(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(optimizer) not in known:
            raise _UnknownOptimizer(optimizer)

    handle = register_optimizer_step_pre_hook(guard)
    try:
        yield
    except _UnknownOptimizer as unknown:
        optimizer = unknown.args[0]
        name = next((n for n, v in known_names(step).items() if v is optimizer), None)
        what = f"{name} ({type(optimizer).__name__})" if name else f"a {type(optimizer).__name__}"
        raise ValueError(
            f"{who}: the step calls {what}.step(), an optimizer not in optimizers: pass every "
            f"optimizer the step uses, so that its state can be put back"
        ) from None
    finally:
        handle.remove()


# -- the one place that intercepts torch: backward calls at the engine's entry, optimizer steps ------------------

# ``torch/autograd/__init__.py`` imports the engine's entry by name, so both bindings are replaced: patching
# only ``torch.autograd.graph`` would see no call. ``loss.backward()``, ``torch.autograd.backward`` and
# ``torch.autograd.grad`` all pass through it.
_ENGINE_OWNERS = (torch.autograd.graph, torch.autograd)
ENGINE_ENTRY = "_engine_run_backward"

EngineHandler = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def without_tool_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the entries of the tool's own frames (the engine's wrapper, the recorder's hook, a watch's
    exit): an error then shows, wherever it is printed, the frames bare Python would show. Unchanged if all are."""
    kept, entry = [], tb
    while entry is not None:
        if not os.path.abspath(entry.tb_frame.f_code.co_filename).startswith(_TOOL):
            kept.append(entry)
        entry = entry.tb_next
    for current, following in zip(kept, [*kept[1:], None]):
        current.tb_next = following
    return kept[0] if kept else tb


@contextlib.contextmanager
def intercepting(
    on_backward: EngineHandler | None = None,
    on_step: Callable[[torch.optim.Optimizer], None] | None = None,
    before_step: Callable[[torch.optim.Optimizer], None] | None = None,
    entry: str = ENGINE_ENTRY,
) -> Iterator[None]:
    """While inside, every entry into autograd's engine calls ``on_backward(engine, outputs, args, kwargs)``
    (which calls ``engine(outputs, *args, **kwargs)`` itself: ``args`` are grad_tensors, keep_graph,
    create_graph, inputs, ...; ``kwargs`` holds ``accumulate_grad``, False for ``torch.autograd.grad``), and every
    optimizer's ``step()`` calls ``before_step(optimizer)`` and ``on_step(optimizer)`` after it (PyTorch's global
    step hooks: optimizers created inside count too). Everything is put back on the way out, even on error;
    nested uses stack. A torch without the engine entry ``entry``: ``torch.autograd.backward`` and ``.grad`` are
    wrapped instead (the handler's changes to the arguments are then not passed on)."""
    undo: list[Callable[[], None]] = []
    try:
        if on_backward is not None and callable(getattr(torch.autograd, entry, None)):
            engine = getattr(torch.autograd.graph, entry)
            current = [getattr(owner, entry) for owner in _ENGINE_OWNERS]

            def entered(outputs: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return on_backward(engine, outputs, args, kwargs)
                except BaseException as error:  # PyTorch's error, as bare Python's traceback shows it: a learner's
                    error.__traceback__ = without_tool_frames(error.__traceback__)  # print_exc(), a thread's
                    raise

            for owner, original in zip(_ENGINE_OWNERS, current):
                setattr(owner, entry, entered)
                undo.append(functools.partial(setattr, owner, entry, original))
        elif on_backward is not None:
            for name in ("backward", "grad"):
                original = getattr(torch.autograd, name)
                setattr(torch.autograd, name, _public_entry(name, original, on_backward))
                undo.append(functools.partial(setattr, torch.autograd, name, original))
        if before_step is not None:
            undo.append(register_optimizer_step_pre_hook(lambda o, args, kwargs: before_step(o)).remove)
        if on_step is not None:
            undo.append(register_optimizer_step_post_hook(lambda o, args, kwargs: on_step(o)).remove)
        yield
    finally:
        while undo:
            undo.pop()()


def _public_entry(name: str, original: Callable[..., Any], on_backward: EngineHandler) -> Callable[..., Any]:
    """``torch.autograd.backward`` or ``.grad`` calling ``on_backward`` with the engine's arguments."""
    signature = inspect.signature(original)

    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:  # let PyTorch itself say what is wrong with the call
            return original(*args, **kwargs)
        create = bool(bound.get("create_graph", False))
        retain = bound.get("retain_graph")
        inputs = bound.get("inputs")
        inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        engine_args = (None, create if retain is None else bool(retain), create, inputs)
        return on_backward(
            lambda *_, **__: original(*args, **kwargs),
            bound.get("tensors", bound.get("outputs")),
            engine_args,
            {"accumulate_grad": name == "backward"},
        )

    return watched


def first_line(exc: BaseException, width: int = 110) -> str:
    """``'NameError: name ...'``: the exception's type and the first line of its message (cut to ``width``),
    also for an exception whose ``str()`` itself fails."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    lines = text.split(" Hint:")[0].strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:width]}" if lines else type(exc).__name__


def site_of(line: str) -> tuple[str, int] | None:
    """ "/a/b/train.py:12: code" -> ("/a/b/train.py", 12), the code holding colons of its own or not
    (``{"losses": []}``); a cell's "Cell In[5], line 3: code" -> (the file IPython compiled that cell under, 3)
    (:func:`_cell_file`); None for a text that names no line, or a cell this kernel no longer has."""
    cell = re.match(r"(Cell [^,:]+), line (\d+)(?:: (.*)|$)", line)
    if cell is not None:
        filename = _cell_file(cell.group(1), int(cell.group(2)), cell.group(3))
        return (filename, int(cell.group(2))) if filename is not None else None
    match = re.match(r"(.*?):(\d+)(?:: |$)", line)
    if not match:
        return None
    return match.group(1), int(match.group(2))


def _cell_file(name: str, lineno: int, code: str | None) -> str | None:
    """The file of the cell :func:`place` names ``name`` ("Cell In[5]"), whose line ``lineno`` reads ``code`` when
    given: cells run without history all share one number (``run_cell(..., store_history=False)``), so the code tells
    them apart; among several that still fit, the latest. The judge reads cells' lines back through this (a fix
    built from a line's code, the line a list grows at) as it reads a script's."""
    named = [filename for filename in list(linecache.cache) if place(filename, lineno) == f"{name}, line {lineno}"]
    fits = [filename for filename in named if code is None or linecache.getline(filename, lineno).strip() == code]
    return (fits or named)[-1] if named else None


def lines_of_file(line: str) -> list[str]:
    """The lines of the file ``line`` ("file:line: code", a cell's "Cell In[5], line 3: code") names, each without
    its comment and outer spaces; none when :func:`site_of` finds no file."""
    site = site_of(line)
    return source_lines(site[0]) if site is not None else []


def source_lines(filename: str) -> list[str]:
    """The lines of ``filename`` (a cell's file too), each without its comment and outer spaces."""
    return [text.split("#", 1)[0].strip() for text in linecache.getlines(filename)]


def short(line: str) -> str:
    """ "/a/b/train.py:12: code" -> "train.py:12: code" (a cell's "Cell In[5], line 3: code" stays)."""
    match = re.match(r"(.*?):(\d+): (.*)$", line)
    if not match or match.group(1).startswith("Cell "):
        return line
    return f"{match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}: {match.group(3)}"
