"""Two DistributedDataParallel ranks on this machine, started from a notebook cell and always cleaned up.

:func:`run_ddp` sends the source of the notebook's model class and step functions to two new Python
processes, which join one gloo process group on 127.0.0.1 at a free port and run every setting in turn
(each on a fresh copy of the model, seeded alike, rank ``r`` training on the ``r``-th half of the global
batch). Each rank writes what happened to a file in a temporary folder; the runner reads them back.

The ranks run in their own process groups under a time limit. Whatever ends the call (a result, an error,
the time limit, or the learner interrupting the cell), every rank still running is killed and reaped before
the call returns or raises, and the temporary folder is removed, so no process is left behind. A rank whose
parent is gone without cleaning up (a killed or restarted kernel) ends itself.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import linecache
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from helpers.display import Table

__all__ = ["DDPRun", "DDPRuns", "run_ddp"]

WORLD_SIZE = 2
# Started by path, not with -m: importing the helpers package would cost each rank a second.
WORKER = Path(__file__).with_name("ddp_worker.py")


@dataclass(frozen=True)
class DDPRun:
    """What one setting did on rank 0: the iteration that raised (None: it ran them all), the error's type
    and message, rank 0's gradients after the first iteration, and whether rank 1 held the same ones then."""

    setting: str
    iterations: int
    raised_at: int | None
    error_type: str
    message: str
    gradients: dict[str, torch.Tensor] = field(repr=False)
    ranks_agree: bool

    @property
    def outcome(self) -> str:
        if self.raised_at is None:
            return f"ran {self.iterations} iterations"
        first = self.message.split(". ", 1)[0].rstrip(".")
        return f"iteration {self.raised_at}: {self.error_type}: {first}."

    def raise_error(self) -> None:
        """Raise here the error rank 0 raised (RuntimeError with its message); nothing if the setting ran."""
        if self.raised_at is not None:
            raise RuntimeError(self.message)


class DDPRuns(dict):
    """The settings :func:`run_ddp` ran, by label (a dict of :class:`DDPRun`), shown as a table of outcomes."""

    def table(self) -> Table:
        return Table(
            ["setting", "outcome on rank 0", "gradients after iteration 0 equal on both ranks"],
            [[run.setting, run.outcome, run.ranks_agree if run.gradients else "-"] for run in self.values()],
        )

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def _source(obj: Any) -> str:
    """The source of a function or class, also one defined in a notebook cell (IPython keeps cells in
    linecache; ``inspect.getsource`` cannot find a class there before Python 3.13)."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        pass
    for filename in _files_that_may_define(obj):
        text = "".join(linecache.getlines(filename))
        if f"class {obj.__name__}" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == obj.__name__:
                return ast.get_source_segment(text, node) or ""
    raise ValueError(
        f"run_ddp() cannot find the source of {getattr(obj, '__name__', obj)!r}: define it in a "
        "notebook cell or a file with `class`/`def`."
    )


def _files_that_may_define(obj: Any) -> list[str]:
    """Where a class's source may be: the files of its own methods, then of its bases' (a subclass that only
    sets attributes has none), then every cell IPython has kept, the latest first."""
    if not inspect.isclass(obj):
        return []
    files = [
        method.__code__.co_filename
        for each in obj.__mro__
        for method in vars(each).values()
        if inspect.isfunction(method)
    ]
    return list(dict.fromkeys([*files, *reversed(list(linecache.cache))]))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Kill the rank and everything it started (its own process group), then reap it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it has already gone
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _start_rank(command: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    with open(log, "wb") as stream:
        return subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)


def run_ddp(
    model: type[torch.nn.Module],
    batch: torch.Tensor,
    settings: Sequence[
        tuple[str, Callable[..., Any], Mapping[str, Any]]
        | tuple[str, Callable[..., Any], Mapping[str, Any], type[torch.nn.Module]]
    ],
    iterations: int = 3,
    lr: float = 0.1,
    seed: int = 0,
    timeout: float = 90.0,
) -> DDPRuns:
    """Run each ``(label, step, ddp_options)`` on two DDP ranks over gloo on 127.0.0.1, in two new processes.

    ``model`` is a module class (built with no arguments after ``torch.manual_seed(seed)`` on each rank); a
    setting may name another as a fourth item, ``(label, step, ddp_options, model)``: one call, one start of the
    two processes, for every model compared;
    ``step(model, optimizer, batch)`` is one training iteration, given the DDP-wrapped model, an SGD
    optimizer (``lr``) and this rank's half of ``batch`` (split along its first dimension).
    ``ddp_options`` go to ``DistributedDataParallel``. Each setting runs ``iterations`` times or until it
    raises. Their source is sent to the ranks, which see ``torch`` and ``F`` (``torch.nn.functional``).

    The call takes a few seconds (two Python processes import torch). It raises ``TimeoutError`` after
    ``timeout`` seconds; whatever ends it, no rank is left running.

    Used by notebook 06_real_stack.
    """
    models = [model, *(setting[3] for setting in settings if len(setting) > 3)]
    for each in models:
        if not (inspect.isclass(each) and issubclass(each, torch.nn.Module)):
            raise TypeError(f"run_ddp() needs the model's class (a torch.nn.Module subclass), not {each!r}.")
    if not isinstance(batch, torch.Tensor) or batch.shape[0] % WORLD_SIZE:
        raise ValueError(
            f"run_ddp() needs the global batch as one tensor whose first dimension splits into "
            f"{WORLD_SIZE} equal halves."
        )
    labels = [setting[0] for setting in settings]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run_ddp() needs a different label for every setting: {labels}")
    steps = {setting[1].__name__: setting[1] for setting in settings}
    classes = {each.__name__: each for each in models}
    if len(classes) != len(set(models)):
        raise ValueError(f"run_ddp() needs a different name for every model class: {[m.__name__ for m in models]}")
    with tempfile.TemporaryDirectory(prefix="bt-ddp-") as folder:
        work = Path(folder)
        torch.save(batch.detach().clone(), work / "batch.pt")
        spec = {
            "sources": [_source(each) for each in classes.values()] + [_source(step) for step in steps.values()],
            "model": model.__name__,
            "seed": seed,
            "lr": lr,
            "iterations": iterations,
            "timeout": timeout,
            "world_size": WORLD_SIZE,
            "port": _free_port(),
            "settings": [
                {
                    "label": setting[0],
                    "step": setting[1].__name__,
                    "options": dict(setting[2]),
                    "model": (setting[3] if len(setting) > 3 else model).__name__,
                }
                for setting in settings
            ],
        }
        (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        processes: list[subprocess.Popen] = []
        try:
            for rank in range(WORLD_SIZE):
                command = [sys.executable, str(WORKER), str(work), str(rank), str(os.getpid())]
                processes.append(_start_rank(command, work / f"rank{rank}.log", env))
            deadline = time.monotonic() + timeout
            for process in processes:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise TimeoutError(
                        f"The two DDP ranks did not finish within {timeout:g} s; both were stopped."
                    ) from None
        finally:
            for process in processes:
                _stop(process)
        return _read_results(work, iterations)


def _read_results(work: Path, iterations: int) -> DDPRuns:
    results = []
    for rank in range(WORLD_SIZE):
        path = work / f"rank{rank}.pt"
        if not path.exists():
            log = (work / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
            raise RuntimeError(f"DDP rank {rank} stopped without a result. Its last lines:\n" + "\n".join(log[-8:]))
        results.append(torch.load(path, weights_only=True))
    runs = DDPRuns()
    for mine, theirs in zip(results[0], results[1]):
        gradients, other = mine["gradients"], theirs["gradients"]
        agree = (
            bool(gradients)
            and gradients.keys() == other.keys()
            and all(torch.equal(gradients[name], other[name]) for name in gradients)
        )
        runs[mine["label"]] = DDPRun(
            mine["label"], iterations, mine["raised_at"], mine["error_type"], mine["message"], gradients, agree
        )
    return runs
