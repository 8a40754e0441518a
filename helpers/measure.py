"""How the course measures a training step: gradients against a reference, time, peak memory, and state.

One way to do each:

* :func:`gradients_of` snapshots a model's ``.grad``; :func:`compare_gradients` compares two snapshots
  and :func:`gradients_close` two tensors, both with one tolerance policy (:data:`RTOL`, :data:`ATOL`):
  two correct ways of computing a gradient may add the same terms in another order;
* :func:`time_round_robin` times several steps in alternating rounds, so a machine's slow drifts hit
  all of them alike, on one of PyTorch's threads (:func:`one_thread`);
* :func:`profiler_peak_bytes` takes the peak of all CPU memory a step allocates from torch.profiler;
* :class:`TrainingState` captures parameters, ``.grad``, optimizer state and the random streams (and, given
  the step, the tensors its closure and globals hold), and puts them back.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from backward_twice.record.step_input import name_bindings

__all__ = [
    "ATOL",
    "RTOL",
    "GradientComparison",
    "TrainingState",
    "compare_gradients",
    "gradients_close",
    "gradients_of",
    "one_thread",
    "profiler_peak_bytes",
    "time_round_robin",
]

RTOL, ATOL = 1e-4, 1e-6


def gradients_of(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Each named parameter's ``.grad``, detached and copied (None where it has none)."""
    return {name: None if p.grad is None else p.grad.detach().clone() for name, p in module.named_parameters()}


def gradients_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to float rounding, by the course's one tolerance policy."""
    return bool(torch.allclose(got, want, rtol=RTOL, atol=ATOL))


@dataclass(frozen=True)
class GradientComparison:
    """Two sets of named gradients compared: bit-equal, close (within :data:`RTOL`/:data:`ATOL`), the
    largest absolute difference, the relative error (norm of the difference over the reference's norm)
    and the names that have a reference gradient but none in the other set."""

    bit_equal: bool
    close: bool
    max_difference: float
    relative_error: float
    missing: tuple[str, ...]


def compare_gradients(
    got: Mapping[str, torch.Tensor | None], reference: Mapping[str, torch.Tensor | None]
) -> GradientComparison:
    """Compare ``got`` with ``reference``, name by name; a gradient that is None on one side only counts as
    zeros there and makes the sets neither bit-equal nor close."""
    if set(got) != set(reference):
        raise ValueError(f"Gradients name different parameters: {sorted(got)} vs {sorted(reference)}.")
    bit_equal, close, worst, squared_diff, squared_ref = True, True, 0.0, 0.0, 0.0
    missing = []
    for name, ref in reference.items():
        mine = got[name]
        if mine is None:
            if ref is None:
                continue
            missing.append(name)
            bit_equal = close = False
            mine = torch.zeros_like(ref)
        elif ref is None:
            bit_equal = close = False
            ref = torch.zeros_like(mine)
        difference = mine - ref
        worst = max(worst, float(difference.abs().max()) if difference.numel() else 0.0)
        squared_diff += float(difference.pow(2).sum())
        squared_ref += float(ref.pow(2).sum())
        if not torch.equal(mine, ref):
            bit_equal = False
            close = close and gradients_close(mine, ref)
    relative = math.sqrt(squared_diff) / math.sqrt(squared_ref) if squared_ref > 0 else math.sqrt(squared_diff)
    return GradientComparison(bit_equal, close, worst, relative, tuple(missing))


def time_round_robin(
    steps: Mapping[str, Callable[[], object]],
    rounds: int,
    before_each: Callable[[], object] | None = None,
    progress: bool = False,
    desc: str = "timing rounds",
) -> dict[str, list[float]]:
    """Seconds of each call of each step over ``rounds`` rounds; round ``i`` starts at the ``i``-th step,
    so no step always runs first. ``before_each`` (untimed) runs before every call."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    with one_thread():
        for index in tqdm(range(rounds), desc=desc, disable=not progress, leave=True):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                if before_each is not None:
                    before_each()
                start = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch's intra-op threads set to one meanwhile, then put back. A lesson's tensors are small: a second
    thread buys them little, and when another program holds the second core each parallel operation waits for the
    thread that core runs (02 with a busy loop on the other core: 65 s on its default threads, 12 to 17 s on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    # The profiler's C++ side prints start/stop lines with timestamps straight to file
    # descriptor 2, which Jupyter shows as output; silence it so notebook outputs stay stable.
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def profiler_peak_bytes(step: Callable[[], object]) -> int:
    """The highest net CPU memory allocated while ``step`` runs, from torch.profiler's events.

    Allocations and frees are summed in time order; the peak includes everything the step
    allocates (activations, gradients, temporaries), not only saved tensors.
    """
    from torch._C._autograd import DeviceType  # where it is defined: torch.autograd re-exports it untyped

    # torch.autograd.profiler's profile, not torch.profiler's: the latter's first start imports torch._inductor
    # (to read a CUDA-graphs setting), about 2 s of a lesson's run on a CPU; both give the same events.
    with _quiet_stderr(), torch.autograd.profiler.profile(use_cpu=True, profile_memory=True) as prof:
        step()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
    )
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


class TrainingState:
    """Models' parameters and ``.grad``, buffers (by value), the tensors kept as plain attributes of their modules
    (``self.memory = out``, as the very objects), optimizers' state (learning rates included) and the random
    streams (Python's, torch's CPU and CUDA generators), captured now; :meth:`restore` puts them back.

    Given ``step`` (a function), also the names it reaches (:func:`backward_twice.record.learner.name_bindings`: its
    closure's variables and the globals it reads, functions left out). :meth:`restore` binds a name to the very object
    it held (not a copy) when that object or the name's value now holds tensors (a tensor, or a list or tuple with one
    in it: a hidden state ``h`` the step rebinds, a total that starts as ``0.0`` and becomes a tensor), and gives a
    list back the items it had (in place, the same list) when they or its items now hold tensors (a list of
    outputs the step appends to). Other names (a counter, a function) are left alone."""

    def __init__(
        self,
        models: Iterable[torch.nn.Module] = (),
        optimizers: Iterable[torch.optim.Optimizer] = (),
        step: Callable[[], Any] | None = None,
    ) -> None:
        models = list(models)
        self._parameters = [
            (p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
            for model in models
            for p in model.parameters()
        ]
        self._buffers = [(b, b.detach().clone()) for model in models for b in model.buffers()]
        self._attributes = [
            (module, name, value)
            for model in models
            for module in model.modules()
            for name, value in vars(module).items()
            if isinstance(value, torch.Tensor)
        ]
        self._optimizers = [(optimizer, copy.deepcopy(optimizer.state_dict())) for optimizer in optimizers]
        self._python_random = random.getstate()
        self._torch_random = torch.get_rng_state()
        self._cuda_random = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self._bindings = [] if step is None else name_bindings(step)
        values = [binding.value for binding in self._bindings]
        lists = {id(v): v for v in values if isinstance(v, list)}
        self._lists = [(target, list(target)) for target in lists.values()]

    def restore(self) -> None:
        """Put every captured value back (the state can be restored again later)."""
        with torch.no_grad():
            for parameter, value, grad in self._parameters:
                parameter.copy_(value)
                parameter.grad = None if grad is None else grad.clone()
            for buffer, value in self._buffers:
                buffer.copy_(value)
        for module, name, value in self._attributes:
            vars(module)[name] = value
        for optimizer, state in self._optimizers:
            optimizer.load_state_dict(copy.deepcopy(state))
        random.setstate(self._python_random)
        torch.set_rng_state(self._torch_random)
        if self._cuda_random is not None:
            torch.cuda.set_rng_state_all(self._cuda_random)
        for binding in self._bindings:
            if _holds_tensors(binding.value) or _holds_tensors(binding.read()):
                binding.put(binding.value)
        for target, items in self._lists:
            if _holds_tensors(items) or _holds_tensors(target):
                target[:] = items


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value)
    )
