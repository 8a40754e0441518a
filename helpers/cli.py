"""``backward-twice watch [--iterations N] [--json PATH] SCRIPT [ARGS...]``: run an unmodified training script
under the recorder (:func:`helpers.watcher.watch`) and print the diagnosis when it ends, raises or reaches N
iterations.

The script runs as ``python SCRIPT ARGS...`` would run it: as ``__main__`` (:func:`runpy.run_path`), with
``sys.argv`` set and its folder first on ``sys.path``, so its own imports (a ``helpers.py`` of its own included)
resolve as they always do. The tools are imported under the name ``backward_twice``, which no project shadows.
``--json PATH`` writes the diagnosis (error kind, carried tensors, per-line verdicts) for other tools;
``--no-traceback`` leaves out the script's own traceback (the report names the error and its line). The exit
status is the script's (1 when it raised).

Used by notebook 05_your_training_step, and by learners on their own scripts (README, "Bring your own training
step"). In the notebook's kernel ``main([...])`` is the command.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from helpers.watcher import Watch, dump_json

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backward-twice", description="Backward Twice's tools from the shell.")
    commands = parser.add_subparsers(dest="command", required=True)
    watch = commands.add_parser(
        "watch", help="run a training script unmodified under the recorder and print what it found"
    )
    watch.add_argument(
        "--iterations", type=int, default=None, metavar="N", help="stop after N iterations (optimizer steps end them)"
    )
    watch.add_argument("--json", default=None, metavar="PATH", help="also write the diagnosis as JSON to PATH")
    watch.add_argument(
        "--no-traceback",
        action="store_true",
        help="leave out the script's own traceback when it raises (the report names the error)",
    )
    watch.add_argument("script", help="the training script, as you would pass it to python")
    watch.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    if options.iterations is not None and options.iterations < 1:
        print("backward-twice watch: --iterations must be 1 or more", file=sys.stderr)
        return 2
    script = os.path.abspath(options.script)
    if not os.path.isfile(script):
        print(f"backward-twice watch: no such script: {options.script}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *options.args]
    sys.path[0:1] = [os.path.dirname(script)]  # what `python SCRIPT` puts first, in place of this command's folder
    # Run from a kernel that imported the course's helpers, the script's own `import helpers` must still find its
    # own helpers.py: the course's modules step out of sys.modules while it runs (they hold each other already).
    ours = {name: module for name, module in sys.modules.items() if name == "helpers" or name.startswith("helpers.")}
    for name in ours:
        del sys.modules[name]
    watcher, status = Watch(options.iterations), 0
    try:
        with watcher:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException as error:
        if not options.no_traceback:
            _print_traceback(error)
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in [n for n in sys.modules if n == "helpers" or n.startswith("helpers.")]:
            del sys.modules[name]  # the script's own helpers, if it had one
        sys.modules.update(ours)
    print(watcher, flush=True)
    if options.json:
        dump_json(watcher.verdicts, options.json)
    return status


def _print_traceback(error: BaseException) -> None:
    """The script's traceback as ``python SCRIPT`` prints it: without this command's and runpy's frames."""
    ours = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(runpy.__file__))
    shown = traceback.TracebackException.from_exception(error)
    shown.stack = traceback.StackSummary.from_list(
        [
            frame
            for frame in shown.stack
            if not os.path.dirname(os.path.abspath(frame.filename)).startswith(ours)
            and not frame.filename.startswith("<frozen")
        ]
    )
    print("".join(shown.format()), end="", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
