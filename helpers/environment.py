"""The setup line every notebook prints first: versions, device and whether graphs can be drawn.

Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state, 05_your_training_step and
06_real_stack.
"""

from __future__ import annotations

import platform
import random
import shutil
import subprocess

import torch

__all__ = ["describe_environment", "pick_device", "seed_everything"]


def pick_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu``. Used by :func:`describe_environment`."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int = 0) -> None:
    """Seed Python and torch (CPU and CUDA) so notebook outputs are the same on every run.

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state, 05_your_training_step and
    06_real_stack.
    """
    random.seed(seed)
    torch.manual_seed(seed)


def _dot_version() -> str:
    dot = shutil.which("dot")
    if dot is None:
        return "missing (graphs will show as text; see docs/setup.md to install Graphviz)"
    result = subprocess.run([dot, "-V"], capture_output=True, text=True, timeout=10)
    words = (result.stderr or result.stdout).split()
    return words[words.index("version") + 1] if "version" in words else "installed"


def describe_environment() -> str:
    """One line with Python, torch, device and Graphviz versions, printed by every notebook's setup cell.

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state, 05_your_training_step and
    06_real_stack.
    """
    device = pick_device()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (
        f"Python {platform.python_version()} | torch {torch.__version__} | "
        f"device: {device.type} ({where}) | Graphviz dot: {_dot_version()}"
    )
