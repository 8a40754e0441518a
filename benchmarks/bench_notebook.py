"""Each lesson notebook's run time in a fresh kernel, against the floor of a one-cell notebook that
imports torch (target: at most 3x the floor). Notebooks run from a temporary copy."""

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
REPEATS = 3


def run_seconds(notebook: nbformat.NotebookNode, folder: Path) -> float:
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    return time.perf_counter() - start


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    floor_nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        floor = statistics.median(run_seconds(nbformat.from_dict(floor_nb), folder) for _ in range(REPEATS))
        print(f"floor (one cell: import torch): {floor:.2f} s (median of {REPEATS})")
        for name in names:
            shutil.copy(ROOT / "notebooks" / name, folder / name)
            seconds = statistics.median(
                run_seconds(nbformat.read(folder / name, as_version=4), folder) for _ in range(REPEATS))
            print(f"{name}: {seconds:.2f} s (median of {REPEATS}), {seconds / floor:.2f}x the floor (target <= 3x)")


if __name__ == "__main__":
    main()
