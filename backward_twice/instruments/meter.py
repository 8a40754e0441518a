"""Count the tensors autograd saves for backward, and the bytes only the graph keeps alive.

How it counts. While forward runs inside ``with meter:``, saved-tensor hooks replace every tensor
autograd saves with a small box that holds a detached view of it; the box's ``__del__`` tells the
meter when autograd lets the tensor go (a plain backward, or the graph being dropped). Boxes are
grouped by storage, so a storage saved twice counts once, and running totals keep the counts and
bytes. A storage is *graph-only* when its only owners are the boxes' tensors and its Python
wrapper, read from torch's private storage use count.

Why the hooks cost the same however many graphs are alive. No hook scans all storages. A storage
found graph-only is marked *confirmed*: nothing but autograd can reach it, so it stays graph-only
until autograd itself unpacks or saves it again (the hooks see both and clear the mark; an
unpacked tensor is a new owner, so whoever keeps it is counted). Only the storages without the
mark (saved or unpacked since the last look, or still owned by something else: parameters,
inputs, your variables) are queried when a figure is needed. Pack, unpack and release do a fixed
amount of work, except the one release per burst that samples the peak (below): it queries the
unconfirmed storages, once each, and never the graph-only ones. Each storage is queried about once
per save or unpack, plus once per sample while something else owns it, so keeping hundreds of
retained graphs alive makes no hook slower.

The peak is exact without a look before every release: graph-only bytes rise only when something
other than autograd drops a storage (nobody is told), and fall only when the last box of a
graph-only storage goes. So the peak is reached just before such a release, or now. Releases come
in bursts (one backward call, one ``del``) during which no user code runs, and the meter looks
once, before the first falling release of each burst.

Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state, 05_your_training_step and
06_real_stack.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType

import torch

from backward_twice.common.units import format_bytes

__all__ = ["MeterReading", "SavedTensorMeter"]

# Private torch API: the number of owners of a storage. Guarded, because a torch release may
# rename it; without it the meter cannot tell graph-only storages apart and says so.
_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)

_TORCH_DIR = os.path.dirname(torch.__file__)


# Private torch API, guarded like the use count: which backward call is running (-1: none).
_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _statement_site() -> tuple[int, int] | None:
    """The statement of Python code that caused the current release (``del loss``, a variable
    reassigned), named by (frame id, instruction): it walks out of torch's frames to the statement
    that dropped the graph. Every release caused by one statement reports the same site.
    """
    frame: FrameType | None = sys._getframe(3)  # _statement_site <- _sample_peak <- _SavedBox.__del__ <- what freed it
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return None if frame is None else (id(frame), frame.f_lasti)


# Only one meter may install saved-tensor hooks at a time: a tensor saved while two meters are
# active would be counted by the inner one only, and the outer figures would silently be wrong.
_active_meter: SavedTensorMeter | None = None


class _StorageEntry:
    """One storage saved by the graph: its size, how many live boxes hold it, and whether it is
    known to be graph-only (``confirmed``; see the module docstring for why that mark stays true).
    """

    __slots__ = ("boxes", "confirmed", "key", "meter", "nbytes")

    def __init__(self, meter: SavedTensorMeter, key: int, nbytes: int) -> None:
        self.meter = meter
        self.key = key  # the address of the C++ storage
        self.nbytes = nbytes
        self.boxes = 1  # created for the box being packed
        self.confirmed = False


class _UncountedBox:
    """What autograd keeps in place of a saved tensor that has no strided storage to count (a sparse or nested
    tensor): its detached view and version, for the same in-place check, and no entry."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.version = tensor._version


class _SavedBox:
    """What autograd keeps in place of a saved tensor while a meter is active.

    It holds a *detached* view of the saved tensor: keeping the tensor handed to the pack hook
    (which still carries its ``grad_fn``) would form a reference cycle through C++ that
    ``gc.collect()`` cannot break, and the whole graph would outlive ``del loss``. Nothing else
    references that view: the unpack hook returns it, but autograd wraps what the hook returns in
    a new tensor, so every unpacked tensor is an owner of its own that the use count sees.

    The box (and through it the storage's entry) lives exactly as long as autograd keeps it; the
    meter itself holds no box and no tensor.
    """

    __slots__ = ("entry", "tensor", "version")

    def __init__(self, tensor: torch.Tensor, entry: _StorageEntry) -> None:
        self.tensor = tensor
        # A detached tensor shares the version counter of the tensor it came from.
        self.version = tensor._version
        self.entry = entry

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: it runs while this box's tensor is still alive,
        # so the meter sees the figures from just before the release, and it costs less.
        entry = self.entry
        meter = entry.meter
        meter._saved_tensors -= 1
        boxes = entry.boxes
        if boxes > 1:
            # Not the storage's last box: its tensor, one owner, goes with it, so whether the
            # storage is graph-only does not change.
            entry.boxes = boxes - 1
            return
        # The storage's last box is going: the storage leaves the meter. If it is graph-only (its
        # owners: this box's tensor and the wrapper), graph-only bytes fall now, so this may be
        # the peak: sample it, once per burst. A burst is one backward call (named by its id) or
        # one statement of Python code.
        task = _graph_task_id()
        if task != -1 and task == meter._burst_task and not meter._sample_next_release:
            pass  # this backward call's burst is sampled already: no need to ask who owns the storage
        elif entry.confirmed or _storage_use_count(entry.key) == 2:  # type: ignore[misc]  # checked in __init__
            meter._sample_peak(task)  # counts this storage: its box is still counted
        entry.boxes = 0
        key = entry.key
        del meter._entries[key]
        meter._saved_bytes -= entry.nbytes
        if entry.confirmed:
            meter._confirmed_bytes -= entry.nbytes
        else:
            del meter._unconfirmed[key]


@dataclass(frozen=True)
class MeterReading:
    """The meter's figures at one moment (bytes are distinct storages, never double counted).

    Returned by :meth:`SavedTensorMeter.reading`.
    """

    saved_tensors: int
    saved_bytes: int
    graph_only_bytes: int
    peak_graph_only_bytes: int
    cuda_allocated_bytes: int | None


class SavedTensorMeter:
    """A context manager that counts every tensor autograd saves while forward runs inside it.

    ``saved_bytes`` are the distinct storages held by live saved tensors. ``graph_only_bytes``
    are the part that nothing but autograd keeps alive: exactly what a plain ``backward()`` or
    dropping the graph (``del loss``) frees. Parameters and inputs are saved too, but they stay
    alive through the model and your variables, so they count in ``saved_bytes`` only.
    ``peak_graph_only_bytes`` is the highest ``graph_only_bytes`` since creation or
    :meth:`reset_peak`, exact to the byte, including the moment just before a backward freed it.

    The counters follow frees as they happen, after the ``with`` block too, for as long as the
    graphs built inside it live. In place of each saved tensor autograd keeps a small box holding
    a detached view of it, which autograd itself drops with the graph; the meter holds no box, no
    graph and no tensor (only sizes and counts per storage), so it never keeps anything alive.
    Saving, unpacking and freeing cost the same however many graphs are alive; reading a figure
    looks only at storages not yet known to be graph-only (see the module docstring). A meter can
    be entered again (the lab does, once per forward); meters cannot be nested.

    Not counted: a Python number in an expression (``x * 2``) is kept by the graph as a 0-dim
    tensor that never passes through saved-tensor hooks (it is a few bytes); a saved sparse or
    nested tensor, which has no strided storage to ask about, is kept and checked like the others
    but counted in no figure: where only the graph holds its values (a ``to_sparse()`` copy made in
    the forward), or a dense tensor the graph saved shares their storage, ``graph_only_bytes`` is
    short by those bytes.

    Saved-tensor hooks switch off autograd's check that a saved tensor was not modified in place;
    the meter repeats that check itself, so a step that raises "modified by an inplace
    operation" raises it inside the meter too.

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state and 06_real_stack.

    Example::

        meter = SavedTensorMeter()
        with meter:
            loss = model(x).pow(2).mean()
        meter.graph_only_bytes   # what backward() will free
        loss.backward()
        meter.graph_only_bytes   # 0
    """

    def __init__(self) -> None:
        # Every storage a live box holds, by the address of its C++ storage.
        self._entries: dict[int, _StorageEntry] = {}
        # The entries not confirmed graph-only: queried again when a figure is needed.
        self._unconfirmed: dict[int, _StorageEntry] = {}
        self._confirmed_bytes = 0
        self._saved_tensors = 0
        self._saved_bytes = 0
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._peak_graph_only = 0
        # The peak is sampled once per release burst (one backward call, one statement), before
        # its first release that lowers graph-only bytes; a pack or a read since the last sample
        # starts a new burst even at the same site (a loop repeats the same statement).
        self._burst_site: tuple[int, int] | None = None
        self._burst_task = -1
        self._sample_next_release = True
        if _storage_use_count is None:
            raise RuntimeError(
                "SavedTensorMeter needs torch._C._storage_Use_Count to tell which saved storages only "
                f"the graph keeps alive, and torch {torch.__version__} does not have it. The course is "
                "tested with torch==2.13.0 (see requirements.txt)."
            )

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> SavedTensorMeter:
        global _active_meter
        if _active_meter is not None:
            which = "this meter is" if _active_meter is self else "another SavedTensorMeter is"
            raise ValueError(
                f"Cannot enter a SavedTensorMeter: {which} already active. Meters cannot be "
                "nested, because a tensor saved inside both would be counted by the inner one "
                "only. Use one meter and read it as often as you like."
            )
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        _active_meter = self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _active_meter
        assert self._hooks is not None
        self._hooks.__exit__(exc_type, exc, tb)
        self._hooks = None
        _active_meter = None

    @property
    def active(self) -> bool:
        """True while forward code inside ``with meter:`` is being recorded."""
        return self._hooks is not None

    # -- hooks (each constant-time: no loop over entries) -------------------------------------
    def _pack(self, tensor: torch.Tensor) -> _SavedBox | _UncountedBox:
        if tensor.layout != torch.strided:
            # A sparse or nested tensor has no storage of its own to ask about (reading one raises): it is kept,
            # checked, and not counted (the class docstring says which figures that leaves short).
            return _UncountedBox(tensor.detach())
        storage = tensor.untyped_storage()
        # The key is the address of the C++ storage itself: unique among live storages on every
        # device, and valid for as long as a box holds the storage, which is as long as the entry
        # exists. It is also what the use-count query takes, so reading needs no new objects.
        key = storage._cdata
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._unconfirmed[key] = _StorageEntry(self, key, storage.nbytes())
            self._saved_bytes += entry.nbytes
        else:
            if entry.confirmed:
                self._unconfirm(entry)  # whoever handed autograd this tensor may still hold it
            entry.boxes += 1
        self._saved_tensors += 1
        self._sample_next_release = True
        return _SavedBox(tensor.detach(), entry)

    @staticmethod
    def _unpack(box: _SavedBox | _UncountedBox) -> torch.Tensor:
        tensor, version = box.tensor, box.version
        # With saved-tensor hooks installed, autograd no longer checks whether a saved tensor
        # was modified in place after it was saved; without this check a step that raises
        # "modified by an inplace operation" would run silently inside the meter.
        if tensor._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: [{tensor.type()} {list(tensor.shape)}] is at version {tensor._version}; "
                f"expected version {version} instead. (Checked by SavedTensorMeter: its saved-tensor "
                "hooks replace autograd's own check, which reports the same error without a meter.)"
            )
        if type(box) is _SavedBox and box.entry.confirmed:
            box.entry.meter._unconfirm(box.entry)  # the unpacked tensor is a new owner for as long as it lives
        return tensor

    def _unconfirm(self, entry: _StorageEntry) -> None:
        entry.confirmed = False
        self._confirmed_bytes -= entry.nbytes
        self._unconfirmed[entry.key] = entry

    def _sample_peak(self, task: int) -> None:
        """Sample the peak before a falling release, unless this burst has been sampled."""
        site = (-1, task) if task != -1 else _statement_site()
        if self._sample_next_release or site != self._burst_site:
            self._sample_next_release = False
            self._burst_site = site
            self._burst_task = task
            graph_only = self._graph_only_bytes()
            if graph_only > self._peak_graph_only:
                self._peak_graph_only = graph_only

    # -- figures ---------------------------------------------------------------------------
    def _graph_only_bytes(self) -> int:
        """Query the unconfirmed storages, confirm the graph-only ones, return the total."""
        use_count = _storage_use_count
        assert use_count is not None  # checked in __init__
        # A storage is graph-only when its owners are exactly the boxes' tensors plus its Python
        # wrapper, which _pack created and torch then keeps for the storage's lifetime (PyObject
        # preservation). Any other owner (a parameter, an input, a variable of yours, a tensor
        # unpacked from the graph) keeps the storage alive after backward. The tests check this
        # count to the byte on every graph.
        # A snapshot, and a live-box check before each query: a garbage collection during the
        # loop may release boxes, and a released storage's address must not be queried.
        unconfirmed = self._unconfirmed
        for key, entry in list(unconfirmed.items()):
            if entry.boxes and use_count(key) == entry.boxes + 1:
                del unconfirmed[key]
                entry.confirmed = True
                self._confirmed_bytes += entry.nbytes
        return self._confirmed_bytes

    @property
    def saved_tensors(self) -> int:
        """How many saved tensors are alive (one storage saved by two nodes counts twice)."""
        return self._saved_tensors

    @property
    def saved_bytes(self) -> int:
        """Bytes of the distinct storages held by live saved tensors."""
        return self._saved_bytes

    @property
    def graph_only_bytes(self) -> int:
        """Bytes of saved storages that nothing but autograd keeps alive right now."""
        value = self._graph_only_bytes()
        self._peak_graph_only = max(self._peak_graph_only, value)
        self._sample_next_release = True
        return value

    @property
    def peak_graph_only_bytes(self) -> int:
        """The highest ``graph_only_bytes`` since creation or :meth:`reset_peak`."""
        return max(self._peak_graph_only, self.graph_only_bytes)

    @property
    def cuda_allocated_bytes(self) -> int | None:
        """``torch.cuda.memory_allocated()`` for comparison on a GPU, ``None`` without CUDA."""
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.memory_allocated())

    def reset_peak(self) -> None:
        """Start the peak again from the current ``graph_only_bytes``."""
        self._peak_graph_only = 0
        self._peak_graph_only = self.graph_only_bytes

    def reading(self) -> MeterReading:
        """All figures at once, as a frozen record (handy for tables and tests)."""
        graph_only = self.graph_only_bytes
        return MeterReading(
            saved_tensors=self.saved_tensors,
            saved_bytes=self.saved_bytes,
            graph_only_bytes=graph_only,
            peak_graph_only_bytes=max(self._peak_graph_only, graph_only),
            cuda_allocated_bytes=self.cuda_allocated_bytes,
        )

    def __repr__(self) -> str:
        r = self.reading()
        text = (
            f"SavedTensorMeter(saved_tensors={r.saved_tensors}, saved_bytes={format_bytes(r.saved_bytes)}, "
            f"graph_only_bytes={format_bytes(r.graph_only_bytes)}, "
            f"peak_graph_only_bytes={format_bytes(r.peak_graph_only_bytes)}"
        )
        if r.cuda_allocated_bytes is not None:
            text += f", cuda_allocated_bytes={format_bytes(r.cuda_allocated_bytes)}"
        return text + ")"
