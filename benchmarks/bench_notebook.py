"""Each lesson notebook's run time in a fresh kernel, against the floor of a one-cell notebook that
imports torch (target: at most 3x the floor).

A machine's speed drifts by tens of percent over a minute, so the floor is run again in every
round, just before the notebooks, and each notebook's figure is the median over the rounds of its
time divided by that round's floor. Notebooks run from a temporary copy, in the order given.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 5
TARGET = 3.0


def run_seconds(notebook: nbformat.NotebookNode, folder: Path) -> float:
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    return time.perf_counter() - start


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    floor_nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    floors: list[float] = []
    seconds: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in names:
            shutil.copy(ROOT / "notebooks" / name, folder / name)
        for _ in range(ROUNDS):
            floor = run_seconds(nbformat.from_dict(floor_nb), folder)
            floors.append(floor)
            for name in names:
                elapsed = run_seconds(nbformat.read(folder / name, as_version=4), folder)
                seconds[name].append(elapsed)
                ratios[name].append(elapsed / floor)
    print(f"floor (one cell: import torch): {statistics.median(floors):.2f} s "
          f"(median of {ROUNDS} rounds, {min(floors):.2f}-{max(floors):.2f})")
    for name in names:
        ratio = statistics.median(ratios[name])
        verdict = "met" if ratio <= TARGET else "NOT MET"
        print(f"{name}: {statistics.median(seconds[name]):.2f} s, {ratio:.2f}x the floor "
              f"(median of {ROUNDS} paired rounds, {min(ratios[name]):.2f}-{max(ratios[name]):.2f}; "
              f"target <= {TARGET:g}x: {verdict})")


if __name__ == "__main__":
    main()
