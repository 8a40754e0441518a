"""Shared fixtures: an independent ground truth for saved-tensor bytes, small seeded models, and the
offline copy of the course (built once per session, for tests/test_site.py and the browser test)."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

# The GAN tests' fixtures (gan, checker, one_thread) live beside the GAN pieces they build on.
pytest_plugins = ["gan_steps"]


@dataclass
class SavedStorages:
    """Weak references to every distinct storage a graph saved, found by walking grad_fn.

    Only weak references are kept, so the graph alone decides when each storage dies.
    """

    refs: dict[tuple[str, int], tuple[StorageWeakRef, int]]
    saved_attributes: int  # tensor-valued _saved_* attributes (one storage may appear twice)

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.refs.values())

    def dead_bytes(self) -> int:
        gc.collect()
        return sum(nbytes for ref, nbytes in self.refs.values() if ref.expired())

    def alive_bytes(self) -> int:
        gc.collect()
        return sum(nbytes for ref, nbytes in self.refs.values() if not ref.expired())


def _walk_saved_storages(*roots: torch.Tensor) -> SavedStorages:
    refs: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}
    attributes = 0
    # The nodes are kept, not their ids: a node's Python object can die once read, and a new one take its id.
    seen: dict[int, object] = {}
    stack = [root.grad_fn for root in roots if root.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            value = getattr(fn, name)
            if isinstance(value, torch.Tensor):
                tensors = [value]
            elif isinstance(value, (list, tuple)):
                tensors = [item for item in value if isinstance(item, torch.Tensor)]
            else:
                tensors = []
            for tensor in tensors:
                attributes += 1
                storage = tensor.untyped_storage()
                assert storage.nbytes() > 0, "ground truth keys storages by data_ptr; avoid empty tensors"
                key = (str(tensor.device), storage.data_ptr())
                if key not in refs:
                    refs[key] = (StorageWeakRef(storage), storage.nbytes())
                del storage
            del value, tensors
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    gc.collect()
    return SavedStorages(refs, attributes)


@pytest.fixture(scope="session", autouse=True)
def _fast_gc():
    """Move what the imports made (torch, matplotlib, ipywidgets) out of the collector's sight.

    Every ``gc.collect()`` otherwise rescans that whole heap (about 0.2 s each); objects the tests
    make are still collected as usual.
    """
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def saved_storages() -> Callable[..., SavedStorages]:
    """``saved_storages(loss, ...)``: weak refs to the storages the graph behind the roots saved."""
    return _walk_saved_storages


@pytest.fixture
def make_mlp() -> Callable[..., torch.nn.Module]:
    """``make_mlp(seed=0, device='cpu')``: the same small Linear/ReLU/Tanh MLP for a given seed."""

    def make(seed: int = 0, device: str = "cpu") -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(
            torch.nn.Linear(8, 16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 16),
            torch.nn.Tanh(),
            torch.nn.Linear(16, 1),
        ).to(device)

    return make


# -- the offline copy ----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def site_builder() -> ModuleType:
    """scripts/build_site.py as a module (scripts/ is not a package)."""
    if "build_site" not in sys.modules:
        spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["build_site"] = module
        spec.loader.exec_module(module)
    return sys.modules["build_site"]


@pytest.fixture(scope="session")
def site(site_builder: ModuleType) -> Path:
    """The built offline copy (make html), built now if missing or out of date."""
    try:
        return site_builder.ensure_site()
    except site_builder.SiteBuildError as error:
        message = f"the offline copy cannot be built: {error}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
