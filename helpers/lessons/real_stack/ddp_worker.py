"""One rank of :func:`helpers.lessons.real_stack.ddp.run_ddp`: ``python ddp_worker.py FOLDER RANK PARENT_PID``.

It reads ``FOLDER/spec.json`` (the sources of the model classes and the steps, the settings, the port) and
``FOLDER/batch.pt``, joins the gloo process group on 127.0.0.1, runs every setting on a fresh DDP-wrapped
copy of its model, and writes ``FOLDER/rankRANK.pt``: per setting, the iteration that raised (or None), the
error, and the gradients after the first iteration that completed. A rank whose parent process dies ends
itself, and removes the folder the parent's clean-up would have.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def run_setting(
    namespace: dict[str, Any], spec: dict[str, Any], setting: dict[str, Any], local_batch: torch.Tensor
) -> dict[str, Any]:
    torch.manual_seed(spec["seed"])
    model = namespace[setting.get("model", spec["model"])]()
    wrapped = DistributedDataParallel(model, **setting["options"])
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    step = namespace[setting["step"]]
    result: dict[str, Any] = {
        "label": setting["label"],
        "raised_at": None,
        "error_type": "",
        "message": "",
        "gradients": {},
    }
    for iteration in range(spec["iterations"]):
        try:
            step(wrapped, optimizer, local_batch)
        except Exception as exc:
            result.update(raised_at=iteration, error_type=type(exc).__name__, message=str(exc))
            break
        if iteration == 0:
            result["gradients"] = {
                name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None
            }
    dist.barrier()  # both ranks finish a setting before the next one builds its model
    return result


def exit_with_parent(parent: int, folder: str) -> None:
    """End this rank when ``parent``, the process that started it, is gone (a kernel restarted or killed, not
    interrupted): the runner's clean-up did not run then, so the rank removes the runner's temporary ``folder`` too
    (the other rank may have removed it first)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def main(folder: str, rank: int, parent: int) -> None:
    exit_with_parent(parent, folder)
    work = Path(folder)
    spec = json.loads((work / "spec.json").read_text(encoding="utf-8"))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world_size"],
        timeout=datetime.timedelta(seconds=spec["timeout"]),
    )
    namespace: dict[str, Any] = {"torch": torch, "F": F, "__name__": "ddp_step"}
    for source in spec["sources"]:
        exec(compile(source, f"<notebook: {source.splitlines()[0][:40]}>", "exec"), namespace)
    batch = torch.load(work / "batch.pt", weights_only=True)
    local_batch = batch.chunk(spec["world_size"])[rank]
    results = [run_setting(namespace, spec, setting, local_batch) for setting in spec["settings"]]
    dist.destroy_process_group()
    torch.save(results, work / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
