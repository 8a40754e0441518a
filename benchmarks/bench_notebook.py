"""Each lesson notebook's run time in a fresh kernel, against the floor of a one-cell notebook that
imports torch (target: at most 3x the floor).

A run is timed from starting the kernel until it has shut down, on two clocks:

* wall: seconds on the clock;
* CPU: the user and system CPU seconds of the kernel process and what it ran (Graphviz's dot),
  read from the operating system when the kernel exits. It does not count time spent waiting for a
  core that other work holds, which on a shared 2-core machine moves the wall figure by tens of
  percent within a minute; but an operation that PyTorch runs on both cores counts twice, and the
  floor's idle moments (waiting for the kernel's messages) not at all, so it reads higher than the
  wall clock for a notebook that computes all the time.

Every notebook run is paired with a floor run just before it, so a drift in the machine's speed hits
both; each figure is the median over the rounds of the notebook's time divided by its own floor's.
The target is judged on the wall clock; the CPU figure shows how much of a miss is the machine.
Notebooks run from a temporary copy.

``--busy`` runs the same with a busy loop (``while True: pass``) in another process all the while, as on a
laptop doing something else or a shared CPU: the targets are the same (``make bench-busy``). The floor runs
under the same load.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 5
TARGET = 3.0
# 06 compiles with torch.compile and starts two DDP processes: its bound is 6x the floor.
TARGETS = {"06_real_stack.ipynb": 6.0}


def run_seconds(notebook: nbformat.NotebookNode, folder: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run, from starting the kernel until it has exited."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    wall = time.perf_counter() - start
    # The kernel is this process's child, and jupyter_client waits for it to exit, so its CPU time
    # (and that of the programs it ran and waited for) is in RUSAGE_CHILDREN from then on.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    arguments = sys.argv[1:]
    busy = "--busy" in arguments
    names = [a for a in arguments if a != "--busy"] or sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        measure(names, busy)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()


def measure(names: list[str], busy: bool) -> None:
    floor_nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    floors: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in names:
            shutil.copy(ROOT / "notebooks" / name, folder / name)
        for _ in range(ROUNDS):
            for name in names:
                floors[name].append(run_seconds(nbformat.from_dict(floor_nb), folder))
                runs[name].append(run_seconds(nbformat.read(folder / name, as_version=4), folder))
    all_floors = [pair for pairs in floors.values() for pair in pairs]
    print(
        f"floor (one cell: import torch), {len(all_floors)} runs: "
        f"wall {statistics.median(w for w, _ in all_floors):.2f} s "
        f"({min(w for w, _ in all_floors):.2f}-{max(w for w, _ in all_floors):.2f}), "
        f"CPU {statistics.median(c for _, c in all_floors):.2f} s "
        f"({min(c for _, c in all_floors):.2f}-{max(c for _, c in all_floors):.2f})"
    )
    load = ", a busy loop on another core all the while" if busy else ""
    print(f"each notebook over its own floor, median of {ROUNDS} pairs (range){load}:")
    for name in names:
        wall = [run[0] / floor[0] for run, floor in zip(runs[name], floors[name])]
        cpu = [run[1] / floor[1] for run, floor in zip(runs[name], floors[name])]
        target = TARGETS.get(name, TARGET)
        verdict = "met" if statistics.median(wall) <= target else "NOT MET"
        print(
            f"  {name}: {statistics.median(r[0] for r in runs[name]):.2f} s; wall {summary(wall)}, "
            f"CPU {summary(cpu)}; target <= {target:g}x: {verdict}"
        )


if __name__ == "__main__":
    main()
