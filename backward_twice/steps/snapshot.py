"""What a tool's runs of a learner's step may change, copied to the CPU before the first run and put back after.

:class:`CpuSnapshot` copies to the CPU (never on the model's device) the models' parameters, ``.grad`` and buffers,
the tensors kept as their attributes and the items of lists and dicts kept there (an attribute the runs add goes),
the optimizers' state (put back into the very objects the learner holds: ``optimizer.param_groups`` and its dicts,
``optimizer.state``, and its own attributes, such as the flag a scheduler reads), the random streams (numpy's, once
imported), and what the step reaches by name: its closure and globals, and those of the learner's functions it calls
(``global seen; seen += 1`` in a ``log()`` helper), the plain attributes of the learner's classes and modules it
names (``Trainer.calls += 1``, ``cfg.lr *= 0.5`` in a configuration module), and the tensors, lists, dicts, tuples
and objects in them, six levels deep (the leaves that require grad among them: a hand-written ``W``; the numpy
arrays, up to 16 MiB each: an index array the step shuffles in place). A leaf that requires grad the step reaches
some other way is copied the first time a backward walks to it (before it accumulates), and the optimizers'
parameters (an LBFGS image) are copied with them. An optimizer nobody passed (one the step builds every call, one
kept where no name reaches) is adopted at its first ``step()``, before it changes anything.
:meth:`CpuSnapshot.restore` puts everything back: the values, each tensor's attributes (``p.exp_avg`` a learner's
optimizer keeps on a parameter) and its version counter, so a graph built before the runs that saved a parameter
still walks as it would have without them. An iterator the step reads from (a DataLoader's, a generator) is
left where the runs leave it: its place lives beyond its attributes (worker processes, a frame), so putting those back
would break it; :meth:`CpuSnapshot.moved` says how far it moved.

Used by :mod:`backward_twice.steps.harness`.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import itertools
import operator
import random
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from backward_twice.record.learner import LearnersCode, learners_code, skipped_dirs
from backward_twice.record.objects import MODULE_OWN_ATTRIBUTES
from backward_twice.record.step_input import global_namespace, held_bindings, known_names

__all__ = ["CpuSnapshot", "cpu_copy"]

_DEPTH = 6  # how deep containers and objects are walked: a learner's nested lists of states
_FUNCTIONS = 64  # the learner's functions a step calls, followed at most
_ITEMS = 4096  # the items of one container walked: a dataset's list of samples is not copied whole
_ARRAY_BYTES = 1 << 24  # a numpy array larger than this (a dataset's) is not copied


def _an_array(value: Any) -> bool:
    """Whether ``value`` is a numpy array (numpy is not imported for it)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A plain copy of ``tensor`` on the CPU, without its graph: ``torch.Tensor``'s own methods, so a subclass's
    ``to`` (BigGAN's ``Distribution``, which reads attributes a copy lacks) runs none of the learner's code."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.to(torch.Tensor.detach(tensor), "cpu", copy=True)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return cpu_copy(value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


class _KeptOptimizer:
    """An optimizer's state dict on the CPU, and the objects the learner may hold of it (``param_groups`` and its
    dicts, ``state``) with its own attributes (``_opt_called``, which a scheduler reads): :meth:`restore` loads the
    state and puts it into those very objects."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._state_dict = _to_cpu(optimizer.state_dict())
        self._groups = optimizer.param_groups
        self._group_items = [(group, dict(group)) for group in optimizer.param_groups]
        self._state = optimizer.state
        self._attributes = {k: v for k, v in vars(optimizer).items() if k not in ("state", "param_groups")}

    def restore(self) -> None:
        optimizer = self.optimizer
        optimizer.load_state_dict(self._state_dict)  # copies the state back onto each parameter's device
        loaded = optimizer.state
        self._state.clear()
        self._state.update(loaded)
        for group, items in self._group_items:
            group.clear()
            group.update(items)
        self._groups[:] = [group for group, _ in self._group_items]
        now = vars(optimizer)
        for name in [k for k in now if k not in self._attributes and k not in ("state", "param_groups")]:
            del now[name]
        now.update(self._attributes)
        now["state"], now["param_groups"] = self._state, self._groups


@dataclass(frozen=True)
class _KeptTensor:
    """A tensor a step may change and what puts it back: its CPU copy, its ``.grad``'s (None: none), its version,
    its own attributes (an optimizer of the learner's may keep ``p.exp_avg`` on a parameter), and whether it was a
    leaf and required a gradient (an EMA updated outside ``torch.no_grad()`` gives a parameter a graph), and the
    ``.grad`` object itself, which gets its values back (a learner may hold it)."""

    tensor: torch.Tensor
    value: torch.Tensor
    grad: torch.Tensor | None
    version: int
    attributes: dict[str, Any]
    leaf: bool = True
    requires_grad: bool = False
    grad_object: torch.Tensor | None = None


class CpuSnapshot:
    """What a tool's runs of a step may change, copied to the CPU now; :meth:`restore` puts it back."""

    def __init__(
        self,
        step: Callable[[], Any],
        models: tuple[torch.nn.Module, ...],
        optimizers: tuple[torch.optim.Optimizer, ...],
        hooked: list[tuple[str, Any]] | None = None,
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
            if isinstance(value, (torch.Tensor, tuple))
            or not name.startswith("_")  # ``self.counter += 1`` too
            or (value is None and name not in MODULE_OWN_ATTRIBUTES)  # a cache a forward fills (``self._gram``)
        ]
        self._module_keys = [(module, set(vars(module))) for model in models for module in model.modules()]
        self._registered: list[tuple[dict[str, Any], dict[str, Any]]] = [  # a step may replace a registered
            (entries, dict(entries))  # parameter or buffer (VQ-VAE's EMA codebook)
            for model in models
            for module in model.modules()
            for entries in (module._parameters, module._buffers)
        ]
        self._optimizers = [_KeptOptimizer(o) for o in optimizers]
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
        self._bindings: list[tuple[Callable[[Any], None], Any]] = []
        self._containers: list[tuple[Any, Any]] = []
        self._objects: list[tuple[Any, dict[str, Any]]] = []
        self._iterators: list[tuple[str, Any, Any]] = []  # (its name, the iterator, where it was)
        self._streams: list[tuple[Callable[[Any], Any], Any]] = []  # (what puts a random stream back, its state)
        self._seen: set[int] = set()  # what was walked: an object graph may hold itself
        self._arrays: list[tuple[Any, Any]] = []  # (a numpy array, its values)
        self._owners: list[tuple[Any, dict[str, Any]]] = []  # a class or module of the learner's, its plain attributes
        self._namespaces: list[tuple[dict[str, Any], set[str]]] = []  # globals the runs may add a name to
        learners = self._learners = learners_code(skipped_dirs())
        functions = _learners_functions(step, learners)
        classes: list[type] = [type(model) for model in models]
        if inspect.ismethod(step):  # a trainer's ``train_step``: what its ``self`` holds (self.global_step += 1)
            classes.append(type(step.__self__))
        for function in functions:
            named, bindings = known_names(function), held_bindings(function)
            self._bindings += bindings
            namespace = global_namespace(function)
            if namespace is not None and all(namespace is not kept for kept, _ in self._namespaces):
                self._namespaces.append((namespace, set(namespace)))
            names = {id(value): name for name, value in reversed(list(named.items()))}
            for _, value in bindings:
                self._walk(value, 0, names.get(id(value), "an iterator"))
            for name, value in named.items():
                if isinstance(value, type):
                    classes.append(value)
                elif isinstance(value, types.ModuleType) and learners.file(getattr(value, "__file__", None) or "<>"):
                    self._plain_attributes(value, name)  # ``import config as cfg``: ``cfg.lr *= 0.5``
        if inspect.ismethod(step):
            self._walk(step.__self__, 0, "self")
        if isinstance(getattr(step, "__dict__", None), dict) and vars(step):  # ``step.calls += 1``
            self._objects.append((step, dict(vars(step))))
        for name, value in hooked or ():  # what the models' hooks write to (a list of activations)
            self._walk(value, 0, name)
        for cls in classes:
            if _learners_class(cls, learners):
                self._plain_attributes(cls, cls.__name__)  # ``Trainer.calls += 1``

    def _plain_attributes(self, owner: Any, name: str) -> None:
        """Keep the plain attributes of a class or module of the learner's (not its functions, classes, modules or
        descriptors), and walk what they hold."""
        if id(owner) in self._seen:
            return
        self._seen.add(id(owner))
        attributes = {k: v for k, v in vars(owner).items() if _plain(k, v)}
        self._owners.append((owner, attributes))
        for key, value in attributes.items():
            self._walk(value, 1, f"{name}.{key}")

    def adopt(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer nobody passed, about to step (one the step builds itself, or reaches some other way): its
        parameters and its state are copied now, before it changes them, and put back with the rest."""
        if all(kept.optimizer is not optimizer for kept in self._optimizers):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self.keep(p)
            self._optimizers.append(_KeptOptimizer(optimizer))

    def keep(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (its ``.grad``, its attributes and the tensors among them) to the CPU, once."""
        if id(tensor) not in self._tensors and not tensor.is_meta and tensor.layout == torch.strided:
            grad = tensor.grad if tensor.is_leaf else None
            attributes = dict(vars(tensor))
            self._tensors[id(tensor)] = _KeptTensor(
                tensor,
                cpu_copy(tensor),
                None if grad is None else cpu_copy(grad),
                tensor._version,
                attributes,
                tensor.is_leaf,
                tensor.requires_grad,
                grad,
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
        if depth >= _DEPTH or isinstance(value, (torch.nn.Module, torch.optim.Optimizer, type, types.ModuleType)):
            return
        if id(value) in self._seen:
            return
        self._seen.add(id(value))
        if isinstance(value, Iterator):
            self._iterators.append((name, value, _place(value)))
            return
        if _an_array(value):  # a numpy array the step may change in place (``rng.shuffle(self.uids)``)
            if value.flags.writeable and value.nbytes <= _ARRAY_BYTES:
                self._arrays.append((value, value.copy()))
            return
        stream = _stream(value)
        if stream is not None:  # a random stream of the learner's own: a torch.Generator, random.Random, numpy's
            self._streams.append((stream[1], stream[0]()))
            return
        if isinstance(value, dict):
            self._containers.append((value, _items(value)))
            named: Iterable[tuple[str, Any]] = [(f"{name}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, collections.deque)):
            self._containers.append((value, _items(value)))
            named = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, tuple):
            named = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif (
            hasattr(value, "__dict__")
            and not isinstance(value, (type, types.ModuleType))
            and (not callable(value) or _learners_class(type(value), self._learners))
        ):
            # an object's attributes, put back as they were: a distribution's lazily computed .probs is a graph
            # that the runs would otherwise leave behind; a callable object of the learner's is a trainer (its
            # ``__call__`` the step), not a function
            self._objects.append((value, dict(vars(value))))
            named = [(f"{name}.{k}", v) for k, v in vars(value).items()]
        else:
            return
        for item_name, item in itertools.islice(named, _ITEMS):
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
                if tensor._version != kept.version or not torch.equal(cpu_copy(tensor), kept.value):
                    tensor.copy_(kept.value)
                    _set_version(tensor, kept.version)
                if tensor.is_leaf and tensor.requires_grad != kept.requires_grad:  # ``p.requires_grad = False``
                    tensor.requires_grad_(kept.requires_grad)  # for D's parameters during G's step (StyleGAN2)
                if tensor.is_leaf and (tensor.requires_grad or grad is not None or tensor.grad is not None):
                    tensor.grad = None if grad is None else _grad_back(kept.grad_object, grad, tensor)
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
        for kept_optimizer in self._optimizers:
            kept_optimizer.restore()
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
        for array, values in self._arrays:
            array[...] = values
        for container, items in self._containers:
            _put_items(container, items)
        for owner, attributes in self._owners:
            now = vars(owner)  # a class's is read-only: set and deleted through the class
            for key in [k for k, v in now.items() if k not in attributes and _plain(k, v)]:
                delattr(owner, key)
            for key, value in attributes.items():
                if now.get(key, _MISSING) is not value:
                    setattr(owner, key, value)
        for namespace, keys in self._namespaces:  # a global the runs bound that was not there before goes
            for key in [k for k, v in namespace.items() if k not in keys and _plain(k, v)]:
                del namespace[key]
        for obj, attributes in self._objects:
            now = vars(obj)  # by identity: an attribute may hold a tensor or an array, whose == is elementwise
            if now.keys() != attributes.keys() or any(now[k] is not v for k, v in attributes.items()):
                now.clear()
                now.update(attributes)


_MISSING = object()


def _grad_back(original: torch.Tensor | None, values: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """The ``.grad`` to put back on ``tensor``: the object it had, holding its values again, where it can (a dense
    gradient of the same shape); a new one on the tensor's device otherwise."""
    if original is None or original.layout != torch.strided or original.shape != values.shape:
        return values.to(tensor.device)
    if tensor.grad is not original or not torch.equal(original.detach().cpu(), values):
        original.copy_(values)
    return original


def _plain(name: str, value: Any) -> bool:
    """Whether a class's or a module's attribute is data the runs may change (``calls = 0``, ``lr = 0.1``, a list):
    not a dunder, a function, a class, a module or a descriptor."""
    return (
        not name.startswith("__")
        and not callable(value)
        and not isinstance(value, types.ModuleType)
        and not hasattr(type(value), "__get__")
    )


def _learners_class(cls: type, learners: LearnersCode) -> bool:
    """Whether ``cls`` is the learner's: defined in a script or a notebook (``__main__``) or in a file of theirs."""
    if cls.__module__ == "__main__":
        return True
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return isinstance(filename, str) and learners.file(filename)


def _learners_functions(step: Callable[[], Any], learners: LearnersCode) -> list[Any]:
    """``step`` and the learner's functions it calls by name, and those they call (``log(loss)`` whose ``global seen``
    changes a counter), at most :data:`_FUNCTIONS` of them."""
    functions: list[Any] = [step]
    seen = {id(step)}
    index = 0
    while index < len(functions) and len(functions) < _FUNCTIONS:
        for value in known_names(functions[index]).values():
            if isinstance(value, types.FunctionType) and id(value) not in seen and learners(value.__code__):
                seen.add(id(value))
                functions.append(value)
        index += 1
    return functions[:_FUNCTIONS]


def _items(value: Any) -> Any:
    """A copy of a list's, a deque's (a memory bank's queue) or a dict's items; None for anything else."""
    if isinstance(value, (list, collections.deque)):
        return list(value)
    return dict(value) if isinstance(value, dict) else None


def _put_items(container: Any, items: Any) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(items)
    elif isinstance(container, collections.deque):  # its maxlen stays
        container.clear()
        container.extend(items)
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
