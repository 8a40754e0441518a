"""``backward-twice watch [--iterations N] [--json PATH] [--verbose] SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``,
as ``python -m``): run an unmodified training script under the recorder (:func:`backward_twice.watcher.watch`)
and say what it found.

The script runs as ``python SCRIPT ARGS...`` would run it: as ``__main__`` (a fresh module with the globals python
gives a script, kept as ``__main__`` for its ``atexit`` functions and threads; a folder or a zip archive runs its
``__main__.py``),
with ``sys.argv`` set and its (real) folder first on ``sys.path``, so its own imports (a
``helpers.py`` of its own included) resolve as they always do: the tool is the package ``backward_twice``, and
nothing of it is named ``helpers``. It ends as Python would:

* the script ran to its end (its threads too: python waits for them), or to the top of pass N+1 of its loop
  (``--iterations N``): the diagnosis on the command's stdout (not a log file the script made its ``sys.stdout``),
  status 0; a child the script forked reports nothing of its own;
* it raised: its traceback on stderr as ``python`` prints it (no frame of this command's; through the script's own
  ``sys.excepthook`` if it set one), the diagnosis as the traceback's last lines (a note on the exception, or after
  the script's hook), status 1; ``--no-traceback`` prints the diagnosis alone;
* ``sys.exit(code)``, argparse's ``--help``: the diagnosis of what ran, then Python's status (0, the code, or 1 with
  the message on stderr); Ctrl-C: Python's ``KeyboardInterrupt`` traceback and status 130 from :func:`main`, and the
  command itself (:func:`run`) then dies of SIGINT as python does (a shell shows 130, and its loop stops there);
* a ``SyntaxError`` in the script: Python's message and status 1, before anything runs (the script is compiled once,
  for that check and for its run).

Bad input (no such script, ``--iterations 0``, a ``--json`` folder that does not exist or cannot be written) is
refused with one line on stderr and status 2, before the script runs (a folder or an archive without ``__main__.py``:
status 1, as python's). ``--json PATH`` (resolved against the folder the command was run from) writes the diagnosis
as JSON; ``--verbose`` adds the evidence.

Used by notebook 05_your_training_step, and by learners on their own scripts (README, "Bring your own training
step"). In the notebook's kernel ``main([...])`` is the command.
"""

from __future__ import annotations

import argparse
import atexit
import builtins
import contextlib
import functools
import importlib.machinery
import os
import runpy
import shlex
import signal
import sys
import threading
import traceback
import types
import zipfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from backward_twice.report.rendering import render_text
from backward_twice.report.terminal import LineEnd, say
from backward_twice.watcher import Watch, dump_json

# A script's file runs as python runs it: compiled once (for the syntax check and the run), in a fresh ``__main__``
# module with the globals python gives one (``__loader__``, ``__annotations__``, ``__package__`` None, ``sys.argv[0]``
# as typed). A folder's ``__main__`` is found by runpy's own steps on the folder put first on ``sys.path``: private to
# runpy, the same from 3.10 to 3.13; without them, run_path.
_RUN_CODE = getattr(runpy, "_run_code", None)
_MAIN_MODULE_DETAILS = getattr(runpy, "_get_main_module_details", None)

# ``__builtins__`` of python's ``__main__`` is the builtins module (``exec`` alone gives its dict, on which a script's
# ``__builtins__.profile = ...`` raises).
_MAIN_GLOBALS = {"__builtins__": builtins}

__all__ = ["main", "run"]


class _Interrupted(int):
    """Status 130 of a script Ctrl-C ended (not a ``sys.exit(130)``): :func:`run` ends the process by SIGINT."""


def run() -> None:
    """The ``backward-twice`` command: :func:`main`, ended as python ends: a script that Ctrl-C stopped ends this
    process by SIGINT, after the report and the script's ``atexit`` functions (its status to a shell is 130 either
    way; a shell's loop stops only then)."""
    status = main(own_process=True)
    if isinstance(status, _Interrupted) and os.name == "posix":
        atexit._run_exitfuncs()  # the script's, as python runs them before it dies of SIGINT (a checkpoint saved)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(status)


@functools.cache  # made once: argparse looks up its messages' translations on disk, a millisecond per parser
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backward-twice", description="Backward Twice's tools from the shell.")
    commands = parser.add_subparsers(dest="command", required=True)
    watch = commands.add_parser(
        "watch",
        help="run a training script unmodified under the recorder and print what it found",
        usage=(
            "backward-twice watch [-h] [--iterations N] [--json PATH] [--verbose] [--no-traceback] script [args ...]\n"
            "       backward-twice watch [options] -m module [args ...]   (as python -m)"
        ),
    )
    watch.add_argument(
        "--iterations", type=int, default=None, metavar="N", help="stop at the top of pass N+1 of the script's loop"
    )
    watch.add_argument("--json", default=None, metavar="PATH", help="also write the diagnosis as JSON to PATH")
    watch.add_argument("--verbose", action="store_true", help="show the evidence under the diagnosis")
    watch.add_argument(
        "--no-traceback",
        action="store_true",
        help="leave out the script's own traceback when it raises (the diagnosis names the error)",
    )
    watch.add_argument(
        "script", help="the training script (or a folder with __main__.py), as you would pass it to python"
    )
    watch.add_argument(
        "args", nargs="*", default=[], help="the script's own arguments, as given (a leading -- included)"
    )
    return parser


_TAKES_A_VALUE = frozenset({"--iterations", "--json"})


def _parsed(argv: Sequence[str]) -> argparse.Namespace:
    """The command's options, and the script's arguments exactly as given: everything after the script is the
    script's (``train.py -- --lr 1`` gives it ``['--', '--lr', '1']``, as python does; argparse would drop the
    ``--``)."""
    arguments = list(argv)
    at = 1 if arguments[:1] == ["watch"] else len(arguments)
    while at < len(arguments):
        given = arguments[at]
        if given == "-m":  # ``-m pkg.train ARGS``, as ``python -m``: the module, then its arguments
            options = _parser().parse_args([*arguments[:at], "<module>"])
            options.module, options.args = (arguments[at + 1 :] or [""])[0], arguments[at + 2 :]
            return options
        if given in _TAKES_A_VALUE:
            at += 2
        elif given.startswith("-") and given != "-":
            at += 1
        else:
            break
    options = _parser().parse_args(arguments[: at + 1])
    if getattr(options, "command", None) == "watch":
        options.args, options.module = arguments[at + 1 :], None
    return options


def _refuse(message: str, status: int = 2) -> int:
    print(f"backward-twice watch: {message}", file=sys.stderr)
    return status


def _script_file(given: str) -> str | None:
    """The file ``python given`` runs: the script itself, a folder's ``__main__.py``, or a zip archive (a zipapp,
    whose ``__main__.py`` runs as a folder's does); None if there is none."""
    path = os.path.abspath(given)
    if os.path.isdir(path):
        path = os.path.join(path, "__main__.py")
    return path if os.path.isfile(path) else None


def _archive(path: str) -> bool:
    """Whether ``path`` is a zip archive, which python runs as it runs a folder (``python app.pyz``)."""
    return os.path.isfile(path) and zipfile.is_zipfile(path)


def _archive_has_main(path: str) -> bool:
    with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(path) as archive:
        return "__main__.py" in archive.namelist() or "__main__.pyc" in archive.namelist()
    return False


def _json_problem(path: str) -> str | None:
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return f"--json {path}: is a folder; give a file name"
    if not os.path.isdir(folder):
        return f"--json {path}: no such folder: {folder}"
    if not os.access(folder, os.W_OK):
        return f"--json {path}: cannot write in {folder}"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"--json {path}: cannot write this file"
    try:  # what os.access cannot tell: a folder no file can be made in (/proc, even as root), a full disk
        with open(path, "x"):
            pass
        os.remove(path)
    except OSError as error:
        return f"--json {path}: cannot write it: {error.strerror or error}"
    return None


def main(argv: Sequence[str] | None = None, own_process: bool = False) -> int:
    """The command with ``argv`` (``sys.argv[1:]`` when None); its status. ``own_process``: the process ends with it
    (:func:`run`), so the script stays ``__main__`` to the end, for its ``atexit`` functions and its threads (a
    ``torch.save`` of a class the script defines); otherwise the caller's ``__main__`` is put back."""
    options = _parsed(sys.argv[1:] if argv is None else argv)
    if options.iterations is not None and options.iterations < 1:
        return _refuse("--iterations must be 1 or more")
    if options.module is not None:
        return _main_of_a_module(options, own_process)
    script = _script_file(options.script)
    if script is None and os.path.isdir(options.script):  # python: "can't find '__main__' module", status 1
        return _refuse(f"no __main__.py in folder: {options.script}", 1)
    if script is None:
        return _refuse(f"no such script: {options.script}")
    if _archive(script) and not _archive_has_main(script):
        return _refuse(f"no __main__.py in archive: {options.script}", 1)
    report_path = os.path.abspath(options.json) if options.json else None  # before the script can chdir
    problem = _json_problem(report_path) if report_path else None
    if problem:
        return _refuse(problem)
    target = os.path.abspath(options.script)
    if _archive(script):  # its __main__ found on sys.path[0], as a folder's
        return _run(options, target, report_path, None, own_process)
    try:
        with open(script, "rb") as file:
            code = compile(file.read(), script, "exec")
    except SyntaxError as error:  # as python reports it, before anything runs
        print("".join(traceback.format_exception_only(type(error), error)), end="", file=sys.stderr)
        return 1
    return _run(options, target, report_path, code if script == target else None, own_process)


def _main_of_a_module(options: argparse.Namespace, own_process: bool) -> int:
    """``-m MODULE``: the module found as ``python -m`` finds it (the current folder first on ``sys.path``), checked
    before it runs: a name that finds nothing, or a module that does not compile, gets Python's message and status."""
    report_path = os.path.abspath(options.json) if options.json else None
    problem = _json_problem(report_path) if report_path else None
    if problem:
        return _refuse(problem)
    if not options.module:
        return _refuse("-m needs a module name: -m MODULE [ARGS...]")
    get_details = getattr(runpy, "_get_module_details", None)
    saved_path = list(sys.path)
    sys.path[0:1] = [os.getcwd()]
    try:
        details = get_details(options.module) if get_details is not None and _RUN_CODE is not None else None
    except SyntaxError as error:
        print("".join(traceback.format_exception_only(type(error), error)), end="", file=sys.stderr)
        return 1
    except ImportError as error:  # ``python -m`` says "No module named ..." (runpy's own error type), status 1
        print(f"backward-twice watch: {error}", file=sys.stderr)
        return 1
    finally:
        sys.path[:] = saved_path
    if details is None:
        return _refuse("-m needs runpy's module lookup, which this Python lacks")
    options.script = details[1].origin or options.module
    return _run(options, os.getcwd(), report_path, None, own_process, details)


def _run(
    options: argparse.Namespace,
    target: str,
    report_path: str | None,
    compiled: types.CodeType | None,
    own_process: bool = False,
    module: tuple[str, Any, types.CodeType] | None = None,
) -> int:
    saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules.get("__main__")
    sys.argv = [options.script, *options.args]  # as given, as python gives it (-m: the module's file)
    # what `python SCRIPT` puts first: a symlinked script's real folder, whose files it imports (-m: the folder)
    sys.path[0:1] = [target if os.path.isdir(target) or _archive(target) else os.path.dirname(os.path.realpath(target))]
    watcher, status, raised = Watch(options.iterations, "" if options.verbose else _again_verbose(options)), 0, False
    watcher.recorder.outermost = sys._getframe()  # the script's names are inside; a kernel's, outside
    stdout, pid = sys.stdout, os.getpid()  # the report's: not a log file the script made its stdout
    before = set(threading.enumerate())  # a kernel's or a test runner's threads are not the script's to wait for
    line = LineEnd(stdout, sys.stderr)
    try:
        with watcher, line, _forward_stacks_as_python():
            try:
                _run_script(target, compiled, module)
            except SystemExit:
                _join_threads(before)
                raise
            _join_threads(before)
    except SystemExit as exit_:
        code = exit_.code
        if code is not None and not isinstance(code, int):
            try:
                message = str(code)
            except Exception:  # python prints an empty line when the object's str() raises
                message = ""
            print(message, file=sys.stderr)  # sys.exit("message"): python prints it and exits 1
        status = code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt as interrupt:
        _print_traceback(interrupt)  # as python prints it; the diagnosis of what ran follows
        status = _Interrupted(130)
    except BaseException as error:
        raised, status = True, 1
        if not options.no_traceback:
            _print_traceback(error)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if not own_process and saved_main is not None:
            sys.modules["__main__"] = saved_main
    if os.getpid() != pid:  # a child the script forked, ending: the parent reports the run
        return status
    if own_process and watcher.recorder.stopped:
        _cancel_timers()
    # When it raised, the traceback ends with the diagnosis (a note): printed again only without the traceback. An
    # error before any backward call (a missing import) is Python's alone.
    if not raised or (options.no_traceback and watcher.verdicts.calls):
        say(stdout, line.opening + render_text(watcher.report, verbose=options.verbose, more=watcher.more))
    elif options.verbose and watcher.verdicts.calls:
        say(stdout, line.opening + "\n".join(["evidence:", *(f"  {kept}" for kept in watcher.report.evidence)]))
    if report_path:
        try:
            dump_json(watcher, report_path)
        except OSError as error:
            print(f"backward-twice watch: could not write --json {report_path}: {error}", file=sys.stderr)
    return status


def _cancel_timers() -> None:
    """The script stopped at ``--iterations N``: a timer it set for a later pass (``signal.setitimer``,
    ``signal.alarm``) would fire while the process ends, once Python has put back the signals' default actions, and
    kill it with its signal (status 142 for SIGALRM) after a run that ended as asked."""
    if hasattr(signal, "setitimer"):
        for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            with contextlib.suppress(OSError):
                signal.setitimer(which, 0)


def _join_threads(before: set[threading.Thread]) -> None:
    """Wait for the threads the script started and left running (not those of ``before``), as python does before
    it exits: their backward calls are the run's too (a loop in a thread the script does not join)."""
    while True:
        running = [
            thread
            for thread in threading.enumerate()
            if thread not in before
            and thread is not threading.current_thread()
            and not thread.daemon
            and thread.is_alive()
        ]
        if not running:
            return
        for thread in running:
            thread.join()


@contextlib.contextmanager
def _forward_stacks_as_python() -> Iterator[None]:
    """While the script runs, the stack anomaly mode keeps for each forward op (``torch.fx.traceback.format_stack``,
    which torch calls for it; shown as "Traceback of forward call that caused the error") starts at the script's
    frame, as under python: without the command's own frames above it."""
    owner: Any = sys.modules.get("torch.fx.traceback")
    original: Callable[[], list[str]] | None = getattr(owner, "format_stack", None)
    if owner is None or original is None:
        yield
        return
    ours = f'File "{__file__}", line'

    def format_stack() -> list[str]:
        entries = original()[:-1] if original is not None else []  # this function's own frame is the last
        return entries[max((i for i, entry in enumerate(entries) if ours in entry), default=-1) + 1 :]

    owner.format_stack = format_stack
    try:
        yield
    finally:
        if getattr(owner, "format_stack", None) is format_stack:
            owner.format_stack = original


def _run_script(
    target: str, compiled: types.CodeType | None, module: tuple[str, Any, types.CodeType] | None = None
) -> None:
    """Run the file (its code ``compiled``), the folder's ``__main__`` or the ``module`` (runpy's details of it) as
    ``__main__``, with ``sys.argv`` and ``sys.path`` as already set. The module stays ``sys.modules["__main__"]``
    when the run ends (:func:`_run` puts the caller's back, unless the process ends with the command)."""
    if module is not None and _RUN_CODE is not None:  # as ``python -m``: its spec, its package, a fresh __main__
        _, spec, code = module
        module_main = types.ModuleType("__main__")
        sys.modules["__main__"] = module_main
        _RUN_CODE(code, module_main.__dict__, _MAIN_GLOBALS, "__main__", spec)
        return
    if compiled is not None:  # the globals python gives a script's __main__ (__loader__, __annotations__ included)
        main = types.ModuleType("__main__")
        main.__dict__.update(
            __annotations__={},
            __builtins__=builtins,
            __file__=target,
            __cached__=None,
            __loader__=importlib.machinery.SourceFileLoader("__main__", target),
        )
        sys.modules["__main__"] = main
        exec(compiled, main.__dict__)
        return
    run_code, main_details = _RUN_CODE, _MAIN_MODULE_DETAILS
    if run_code is None or main_details is None:
        runpy.run_path(target, _MAIN_GLOBALS, run_name="__main__")
        return
    _, spec, code = main_details()  # the folder's __main__.py, found on sys.path[0] as python finds it
    folder_main = types.ModuleType("__main__")
    sys.modules["__main__"] = folder_main
    run_code(code, folder_main.__dict__, _MAIN_GLOBALS, "__main__", spec)


def _again_verbose(options: argparse.Namespace) -> str:
    """The command that runs the same script the same way, with the evidence shown: its own arguments kept, which
    may choose the very code path the diagnosis is about."""
    iterations = ["--iterations", str(options.iterations)] if options.iterations is not None else []
    what = ["-m", options.module] if options.module is not None else [options.script]
    return shlex.join(["backward-twice", "watch", "--verbose", *iterations, *what, *options.args])


def _print_traceback(error: BaseException) -> None:
    """The script's traceback as ``python SCRIPT`` prints it: without this command's and runpy's frames; through
    the ``sys.excepthook`` the script set, if it set one (rich's), with the diagnosis printed after it."""
    ours = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(runpy.__file__))
    if sys.excepthook is not sys.__excepthook__:
        _through_the_scripts_hook(error, ours)
        return
    shown = traceback.TracebackException.from_exception(error)
    frames = list(shown.stack)
    leading = next(
        (
            index
            for index, frame in enumerate(frames)
            if not os.path.dirname(os.path.abspath(frame.filename)).startswith(ours)
            and not frame.filename.startswith("<frozen")
        ),
        len(frames),
    )
    # the standard library's frames below the script's are python's to show (asyncio.run, contextlib); the tool's
    # own anywhere are not
    shown.stack = traceback.StackSummary.from_list(
        [frame for frame in frames[leading:] if not os.path.abspath(frame.filename).startswith(ours[0])]
    )
    print("".join(shown.format()), end="", file=sys.stderr)


def _through_the_scripts_hook(error: BaseException, ours: tuple[str, ...]) -> None:
    """``sys.excepthook(...)`` as python calls it for an uncaught error, from the script's first frame on; the
    diagnosis, a note on the error, is printed after it (a hook of the script's may not print notes)."""
    tb = error.__traceback__
    while tb is not None and (
        os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)).startswith(ours)
        or tb.tb_frame.f_code.co_filename.startswith("<frozen")
    ):
        tb = tb.tb_next
    notes = list(getattr(error, "__notes__", ()))
    ours_noted = [note for note in notes if note.startswith("backward-twice")]
    if ours_noted:
        error.__notes__ = [note for note in notes if note not in ours_noted]  # type: ignore[attr-defined]
    try:
        sys.excepthook(type(error), error, tb)
    except Exception:  # a hook that fails: python prints the error as it would have
        sys.__excepthook__(type(error), error, tb)
    finally:
        if ours_noted:
            error.__notes__ = notes  # type: ignore[attr-defined]
    for note in ours_noted:
        print(note, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
