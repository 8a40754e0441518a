"""Running a learner's step for a tool: as written, a few times, under the recorder, with everything put back.

:func:`run_step` is what :func:`backward_twice.steps.diagnose.diagnose`,
:func:`backward_twice.steps.audit.audit_retain_graph`,
:func:`backward_twice.steps.carried.find_carried_graph` and ``%%diagnose`` share (and the lessons' checks of a learner's
step):

* the input is checked (:func:`backward_twice.record.learner.check_step`,
  :func:`backward_twice.record.learner.as_items`), and the step's
  lines are named as the learner's (:func:`backward_twice.record.learner.learner_line`);
* the step runs as written, ``iterations`` times, under a :class:`backward_twice.record.recorder.Recorder` with
  ``keep_buffers=True``: no ``retain_graph`` is switched off or on as far as the step can tell (the recorder
  raises PyTorch's own error where the step as written would), and a graph built before the step keeps its
  buffers, so it is still usable afterwards. Each run is one iteration (``next_iteration()`` after it);
* before the first run, :class:`CpuSnapshot` copies to the CPU (never on the model's device) the models'
  parameters, ``.grad`` and buffers, the tensors kept as their attributes and the items of lists and dicts kept
  there (an attribute the runs add goes), the optimizers' state, the random streams (numpy's, once imported), and
  what the step's closure and globals hold (tensors, lists, dicts, tuples, and the leaves that require grad among
  them: a hand-written ``W``); a leaf that requires grad the step reaches some other way is
  copied the first time a backward walks to it (before it accumulates), and the optimizers' parameters (an
  LBFGS image) are copied with them. An optimizer nobody passed (one the step builds every call, one kept where
  no name reaches) is adopted at its first ``step()``, before it changes anything: its parameters and state are
  copied then. Afterwards everything is put back: the values, each tensor's attributes (``p.exp_avg`` a learner's
  optimizer keeps on a parameter) and its version counter, so a graph built before the runs that saved a parameter
  still walks as it would have without them. An iterator the step reads from (a DataLoader's, a generator) is left
  where the runs leave it: its place lives beyond its attributes (worker processes, a frame), so putting those back
  would break it; :attr:`StepRun.not_put_back` says how far it moved;
* the gradients each optimizer receives are kept (on the CPU) at its first ``step()``; without optimizers, the
  models' ``.grad`` after the first run.

Used by :mod:`backward_twice.steps.audit`, :mod:`backward_twice.steps.carried` and :mod:`backward_twice.steps.diagnose`.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import random
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from backward_twice.judge.verdicts import Verdicts, judge
from backward_twice.record.names import CodeSite
from backward_twice.record.recorder import Recorder
from backward_twice.record.step_input import as_items, check_step, held_bindings, known_names

__all__ = ["CpuSnapshot", "StepRun", "run_step"]


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _cpu(value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


@dataclass(frozen=True)
class _KeptTensor:
    """A tensor a step may change and what puts it back: its CPU copy, its ``.grad``'s (None: none), its version,
    its own attributes (an optimizer of the learner's may keep ``p.exp_avg`` on a parameter), and whether it was a
    leaf and required a gradient (an EMA updated outside ``torch.no_grad()`` gives a parameter a graph)."""

    tensor: torch.Tensor
    value: torch.Tensor
    grad: torch.Tensor | None
    version: int
    attributes: dict[str, Any]
    leaf: bool = True
    requires_grad: bool = False


class CpuSnapshot:
    """What a tool's runs of a step may change, copied to the CPU now; :meth:`restore` puts it back."""

    def __init__(
        self,
        step: Callable[[], Any],
        models: tuple[torch.nn.Module, ...],
        optimizers: tuple[torch.optim.Optimizer, ...],
    ) -> None:
        self._tensors: dict[int, _KeptTensor] = {}
        for model in models:
            for p in model.parameters():
                self.keep(p)
            for b in model.buffers():
                self.keep(b)
        self._attributes = [  # and the items of a list or dict kept there (REINFORCE's policy.saved_log_probs)
            (module, name, value, _items(value))
            for model in models
            for module in model.modules()
            for name, value in vars(module).items()
            if isinstance(value, (torch.Tensor, tuple)) or not name.startswith("_")  # ``self.counter += 1`` too
        ]
        self._module_keys = [(module, set(vars(module))) for model in models for module in model.modules()]
        self._registered: list[tuple[dict[str, Any], dict[str, Any]]] = [  # a step may replace a registered
            (entries, dict(entries))  # parameter or buffer (VQ-VAE's EMA codebook)
            for model in models
            for module in model.modules()
            for entries in (module._parameters, module._buffers)
        ]
        self._optimizers = [(o, _to_cpu(o.state_dict())) for o in optimizers]
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self.keep(p)
        numpy = sys.modules.get("numpy")  # its global stream too, when the learner's code has imported numpy
        self._random = (
            random.getstate(),
            torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            (numpy.random, numpy.random.get_state()) if numpy is not None else None,
        )
        self._bindings = held_bindings(step)
        self._containers: list[tuple[Any, Any]] = []
        self._objects: list[tuple[Any, dict[str, Any]]] = []
        self._iterators: list[tuple[str, Any, Any]] = []  # (its name, the iterator, where it was)
        self._streams: list[tuple[Callable[[Any], Any], Any]] = []  # (what puts a random stream back, its state)
        names = {id(value): name for name, value in reversed(list(known_names(step).items()))}
        for _, value in self._bindings:
            self._walk(value, 0, names.get(id(value), "an iterator"))
        if inspect.ismethod(step):  # a trainer's ``train_step``: what its ``self`` holds (self.global_step += 1)
            self._walk(step.__self__, 0, names.get(id(step.__self__), "self"))

    def adopt(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer nobody passed, about to step (one the step builds itself, or reaches some other way): its
        parameters and its state are copied now, before it changes them, and put back with the rest."""
        if all(kept is not optimizer for kept, _ in self._optimizers):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self.keep(p)
            self._optimizers.append((optimizer, _to_cpu(optimizer.state_dict())))

    def keep(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (its ``.grad``, its attributes and the tensors among them) to the CPU, once."""
        if id(tensor) not in self._tensors and not tensor.is_meta and tensor.layout == torch.strided:
            grad = tensor.grad if tensor.is_leaf else None
            attributes = dict(vars(tensor))
            self._tensors[id(tensor)] = _KeptTensor(
                tensor,
                _cpu(tensor),
                None if grad is None else _cpu(grad),
                tensor._version,
                attributes,
                tensor.is_leaf,
                tensor.requires_grad,
            )
            for value in attributes.values():
                if isinstance(value, torch.Tensor):
                    self.keep(value)

    def _walk(self, value: Any, depth: int, name: str) -> None:
        """Containers the step holds (their items put back) and the tensors in them (by value: a step may change
        a hand-written ``W`` or an input buffer in place, ``input_A.copy_(batch)``); ``name`` is how the step
        reaches ``value``. An iterator is left as the runs leave it: its place lives beyond its attributes (a
        DataLoader's workers, a generator's frame), and putting back its attributes alone breaks it."""
        if isinstance(value, torch.Tensor):
            self.keep(value)
            return
        if depth >= 3 or isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            return
        if isinstance(value, Iterator):
            self._iterators.append((name, value, _place(value)))
            return
        stream = _stream(value)
        if stream is not None:  # a random stream of the learner's own: a torch.Generator, random.Random, numpy's
            self._streams.append((stream[1], stream[0]()))
            return
        if isinstance(value, dict):
            self._containers.append((value, _items(value)))
            named: Iterable[tuple[str, Any]] = [(f"{name}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, list):
            self._containers.append((value, _items(value)))
            named = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, tuple):
            named = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)) and not callable(value):
            # an object's attributes, put back as they were: a distribution's lazily computed .probs is a graph
            # that the runs would otherwise leave behind
            self._objects.append((value, dict(vars(value))))
            named = [(f"{name}.{k}", v) for k, v in vars(value).items()]
        else:
            return
        for item_name, item in named:
            self._walk(item, depth + 1, item_name)

    def moved(self, runs: int) -> tuple[str, ...]:
        """A sentence for each iterator the step reads that ``runs`` runs moved on: nothing puts it back."""
        sentences = []
        for name, iterator, before in self._iterators:
            after = _place(iterator)
            if before is None or not _moved(before, after):
                continue
            batches = _yielded(after) - _yielded(before)
            where = f"is {batches} batch{'es' if batches != 1 else ''} further on" if batches > 0 else "moved on"
            sentences.append(
                f"`{name}` {where}: the {runs} run{'s' if runs != 1 else ''} read from it, and an iterator cannot"
                " be put back"
            )
        return tuple(sentences)

    def restore(self) -> None:
        with torch.no_grad():
            for kept in self._tensors.values():
                tensor, grad = kept.tensor, kept.grad
                if kept.leaf and not tensor.is_leaf and tensor._base is None:  # the runs gave it a graph: cut it
                    tensor.detach_()
                    tensor.requires_grad_(kept.requires_grad)
                # changed in place: an optimizer's step bumps the version; p.data.add_() and batch norm's running
                # statistics do not, so an unbumped tensor is compared
                if tensor._version != kept.version or not torch.equal(tensor.detach().cpu(), kept.value):
                    tensor.copy_(kept.value)
                    _set_version(tensor, kept.version)
                if tensor.is_leaf and tensor.requires_grad != kept.requires_grad:  # ``p.requires_grad = False``
                    tensor.requires_grad_(kept.requires_grad)  # for D's parameters during G's step (StyleGAN2)
                if tensor.is_leaf and (tensor.requires_grad or grad is not None or tensor.grad is not None):
                    tensor.grad = None if grad is None else grad.to(tensor.device)
                now = vars(tensor)
                if now.keys() != kept.attributes.keys() or any(now[k] is not v for k, v in kept.attributes.items()):
                    now.clear()
                    now.update(kept.attributes)
        for module, keys in self._module_keys:  # an attribute the runs added (self.cache = ...) goes
            for name in [name for name in vars(module) if name not in keys and not name.startswith("_")]:
                del vars(module)[name]
        for module, name, value, items in self._attributes:
            vars(module)[name] = value
            if items is not None:
                _put_items(value, items)
        for entries, registered in self._registered:
            if entries.keys() != registered.keys() or any(entries[k] is not v for k, v in registered.items()):
                entries.clear()
                entries.update(registered)
        for optimizer, state in self._optimizers:
            optimizer.load_state_dict(state)  # copies the state back onto each parameter's device
        python, cpu, cuda, numpy = self._random
        random.setstate(python)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if numpy is not None:
            numpy[0].set_state(numpy[1])
        for put, value in self._bindings:
            put(value)
        for put, state in self._streams:
            put(state)
        for container, items in self._containers:
            _put_items(container, items)
        for obj, attributes in self._objects:
            now = vars(obj)  # by identity: an attribute may hold a tensor or an array, whose == is elementwise
            if now.keys() != attributes.keys() or any(now[k] is not v for k, v in attributes.items()):
                now.clear()
                now.update(attributes)


def _items(value: Any) -> Any:
    """A copy of a list's or a dict's items; None for anything else."""
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else None


def _put_items(container: Any, items: Any) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(items)
    else:
        container[:] = items


def _stream(value: Any) -> tuple[Callable[[], Any], Callable[[Any], Any]] | None:
    """(what reads a random stream's state, what puts it back) for a stream the learner made (``torch.Generator()``,
    ``random.Random(3)``, ``numpy.random.default_rng()`` or a ``RandomState``); None for anything else."""
    if isinstance(value, torch.Generator):
        return value.get_state, value.set_state
    if isinstance(value, random.Random):
        return value.getstate, value.setstate
    bits = getattr(value, "bit_generator", None)  # numpy's Generator
    if type(value).__module__.startswith("numpy") and bits is not None:
        return (lambda: bits.state), (lambda state: setattr(bits, "state", state))
    if type(value).__module__.startswith("numpy") and hasattr(value, "get_state") and hasattr(value, "set_state"):
        return value.get_state, value.set_state
    return None


def _place(iterator: Any) -> Any:
    """Where an iterator is, as far as can be told without moving it: its attributes (a DataLoader's iterator counts
    what it yielded), a generator's place in its frame and the values its variables hold (a loop's item changes at
    each yield, where the place may not), how many items are left (``iter(batches)``: ``length_hint``); None when
    nothing tells."""
    if isinstance(iterator, types.GeneratorType):
        frame = iterator.gi_frame
        held = {} if frame is None else dict(frame.f_locals)  # read only: a copy of the suspended frame's names
        inner = iterator.gi_yieldfrom  # ``yield from data``: the place is the inner iterator's
        return ("generator", -1 if frame is None else frame.f_lasti, held, None if inner is None else _place(inner))
    if hasattr(iterator, "__dict__"):
        return dict(vars(iterator))
    left = operator.length_hint(iterator, -1)
    return ("left", left) if left >= 0 else None


def _moved(before: Any, after: Any) -> bool:
    if isinstance(before, dict):  # by identity: an attribute may hold a tensor, whose == is elementwise
        return before.keys() != after.keys() or any(after[k] is not v for k, v in before.items())
    if before[0] == "generator":
        inner = before[3] is not None and after[3] is not None and _moved(before[3], after[3])
        return before[1] != after[1] or _moved(before[2], after[2]) or inner
    return bool(before != after)


def _yielded(place: Any) -> int:
    """How many items the iterator at ``place`` has given so far, as far as it tells (0: it does not)."""
    count = place.get("_num_yielded") if isinstance(place, dict) else None
    if isinstance(place, tuple) and place[0] == "left":
        return -int(place[1])  # items left: one fewer for each given
    if isinstance(place, tuple) and place[0] == "generator" and place[3] is not None:
        return _yielded(place[3])
    return count if isinstance(count, int) else 0


def _set_version(tensor: torch.Tensor, version: int) -> None:
    """Put back the version a tensor had when it was copied, now that it holds that value again: a graph built
    before the runs that saved it (a parameter, a buffer) stays usable, as without the runs. Without PyTorch's
    private setter the version stays bumped, and such a graph raises the in-place error when walked."""
    setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
    if setter is not None:
        with contextlib.suppress(TypeError, RuntimeError):
            setter((tensor,), (version,))


@dataclass
class StepRun:
    """What :func:`run_step` saw: the recorder, the verdicts, how many runs started, the gradients kept, and what
    the runs changed that nothing can put back."""

    recorder: Recorder
    verdicts: Verdicts
    runs: int
    gradients: dict[str, torch.Tensor | None] = field(default_factory=dict)
    not_put_back: tuple[str, ...] = ()  # what the runs changed that nothing can put back (an iterator moved on)


def run_step(
    step: Callable[[], Any],
    models: Any = (),
    optimizers: Any = (),
    iterations: int = 3,
    who: str = "diagnose",
    gradients: bool = False,
) -> StepRun:
    """Run ``step`` as written ``iterations`` times under the recorder (see the module's docstring) and put back
    everything it changed; the step's own error ends the runs and goes in the verdicts. ``gradients``: also keep
    (on the CPU) the gradients each optimizer gets at its first ``step()`` (the models' after the first run when
    there is no optimizer), in ``StepRun.gradients``."""
    check_step(step, who)
    if isinstance(models, Mapping):  # {"D": netD, "G": netG}
        models = list(models.values())
    if isinstance(optimizers, Mapping):
        optimizers = list(optimizers.values())
    models = as_items(models, torch.nn.Module, "models", "torch.nn.Module", who)
    optimizers = as_items(optimizers, torch.optim.Optimizer, "optimizers", "torch.optim.Optimizer", who)
    names = known_names(step)
    found_models, found_optimizers = _reachable(names.values())  # a wrapper's self._optim, a PPO's policy
    models = tuple({id(m): m for m in (*models, *found_models)}.values())
    optimizers = tuple({id(o): o for o in (*optimizers, *found_optimizers)}.values())
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"{who}: iterations must be a whole number from 1 up, got {iterations!r}")
    snapshot = CpuSnapshot(step, models, optimizers)
    recorder = Recorder(keep_buffers=True, roots=lambda: list(known_names(step).items()), on_leaf=snapshot.keep)
    kept: dict[str, torch.Tensor | None] = {}
    labels = _parameter_labels(names, models, optimizers)
    stepped: set[int] = set()

    def capture(optimizer: torch.optim.Optimizer) -> None:
        snapshot.adopt(optimizer)  # before it changes anything
        if id(optimizer) in stepped or not gradients:
            return
        stepped.add(id(optimizer))
        for group in optimizer.param_groups:
            for p in group["params"]:
                kept.setdefault(labels.get(id(p), f"parameter {len(kept)}"), None if p.grad is None else _cpu(p.grad))

    recorder.before_step = capture
    recorder.by_runs = True
    recorder.outermost = sys._getframe()  # the step's names are inside it; the caller's, outside
    code = getattr(step, "__code__", None)
    if code is not None:
        recorder.roots_where = CodeSite(code.co_filename, code.co_firstlineno, code.co_name)
    runs = 0
    try:
        with recorder:
            for runs in range(1, iterations + 1):
                try:
                    step()
                except Exception as exc:  # the step's own error is what the tools report
                    if recorder.error is None:
                        recorder.record_error(exc)
                    break
                if gradients and runs == 1 and not optimizers:
                    for model in models:
                        for name, p in model.named_parameters():
                            kept[labels.get(id(p), name)] = None if p.grad is None else _cpu(p.grad)
                recorder.next_iteration(between_runs=True)
    finally:
        recorder.outermost = None  # a frame holds its variables: not kept past the run
        snapshot.restore()
    return StepRun(recorder, judge(recorder), runs, kept, snapshot.moved(runs))


def _reachable(values: Iterable[Any], depth: int = 0) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    """The modules and optimizers among ``values``, in their lists, tuples and dicts, and in the attributes of the
    objects they hold, two levels deep (``state["model"]``, ``ppo.policy``, ``pc_adam._optim``), and the optimizers
    a module keeps as an attribute (``self.meta_optim``)."""
    models: list[torch.nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    for value in values:
        if isinstance(value, torch.nn.Module):
            models.append(value)
            optimizers += [v for v in vars(value).values() if isinstance(v, torch.optim.Optimizer)]  # MAML's
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
        elif depth < 2 and isinstance(value, (list, tuple)):
            inner = _reachable(value[:64], depth + 1)
            models += inner[0]
            optimizers += inner[1]
        elif depth < 2 and isinstance(value, dict):
            inner = _reachable(list(value.values())[:64], depth + 1)
            models += inner[0]
            optimizers += inner[1]
        elif (
            depth < 2
            and hasattr(value, "__dict__")
            and not isinstance(value, (type, types.ModuleType))
            and not callable(value)
        ):
            inner = _reachable(list(vars(value).values())[:64], depth + 1)
            models += inner[0]
            optimizers += inner[1]
    return models, optimizers


def _parameter_labels(
    names: dict[str, Any], models: tuple[torch.nn.Module, ...], optimizers: tuple[torch.optim.Optimizer, ...]
) -> dict[int, str]:
    """Each parameter's label in a gradient snapshot: its model's name in the step and its own name."""
    by_id = {id(value): name for name, value in reversed(list(names.items()))}
    labels: dict[int, str] = {}
    for i, model in enumerate(models):
        prefix = by_id.get(id(model), f"models[{i}]" if len(models) > 1 else "model")
        for pname, p in model.named_parameters():
            labels.setdefault(id(p), f"{prefix}.{pname}")
    for i, optimizer in enumerate(optimizers):
        prefix = by_id.get(id(optimizer), f"optimizers[{i}]" if len(optimizers) > 1 else "optimizer")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for j, p in enumerate(params):
            labels.setdefault(id(p), f"{prefix}[{j}]")
    return labels
