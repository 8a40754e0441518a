"""Audit a training step's ``retain_graph=True``: which ones can go, which are needed, and what each keeps alive.

:func:`audit_retain_graph` takes one training iteration as the learner wrote it (a function of no arguments)
and answers, for every backward call in it, with a measured fact rather than a rule of thumb. How:

* the starting state (:class:`helpers.measure.TrainingState`: parameters, ``.grad``, optimizer state, random
  streams, the tensors the step's closure and globals hold, such as a hidden state it rebinds; and the models'
  buffers) is captured, and put back before every run and at the end;
* while the audit runs, ``torch.Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` are
  wrapped (so are the names the step imported from ``torch.autograd``, in its globals and closure), and put
  back afterwards, even when the step raises. Each call is recorded in order with the learner's line
  (:func:`helpers.learner.learner_line`), its ``retain_graph`` (which defaults to ``create_graph``) and
  ``create_graph``; a call made inside another (``loss.backward`` calls ``torch.autograd.backward``) counts once.
  An optimizer the caller did not pass that calls ``step()`` stops the audit with a ValueError
  (:func:`helpers.learner.passed_optimizers_only`): nothing could put its state back;
* the step runs once as written inside a :class:`helpers.meter.SavedTensorMeter`, read right after each call
  for the bytes only the graph still holds. The gradients each optimizer receives are read when its ``step()``
  is called (a step pre-hook, first call per optimizer); without optimizers, the models' ``.grad`` at the end;
* a control run, nothing changed, checks that the step gives the same result twice from the same state (a
  step that draws its batch from an iterator does not, and gets no verdict). Then, for each call that
  retains the graph (``create_graph=True`` builds a graph of the gradient: no retain to remove), the step
  runs again with only that call's ``retain_graph`` off (calls matched by their order). If the step then
  raises differently, or its gradients differ by :func:`helpers.measure.compare_gradients`, the retain is
  needed; otherwise it can go.

The report holds plain data only (strings, numbers): no tensor and no graph outlives the call. A line in a
notebook cell is named as IPython's tracebacks name it ("Cell In[5], line 3: code",
:func:`helpers.learner.learner_line`).

Used by notebook 05_your_training_step.
"""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers.display import format_bytes
from helpers.learner import as_items, check_step, known_names, learner_line, passed_optimizers_only
from helpers.measure import TrainingState, compare_gradients, gradients_of
from helpers.meter import SavedTensorMeter

__all__ = ["BackwardCall", "RetainAudit", "audit_retain_graph"]

CREATE_GRAPH_NOTE = "create_graph=True: builds a graph of the gradient; not a retain that can go"
_SECOND_TIME = "backward through the graph a second time"
_ENTRY_POINTS = (("loss.backward", torch.Tensor, "backward"),
                 ("torch.autograd.backward", torch.autograd, "backward"),
                 ("torch.autograd.grad", torch.autograd, "grad"))


@dataclass(frozen=True)
class BackwardCall:
    """One backward call of the step: its place in the run (0-based), the learner's line ("file:line: code"),
    which function it was, its effective ``retain_graph`` and ``create_graph``, the verdict (``needed``: True,
    False = can go, None = not a retain), the graph-only bytes still held right after it, why, and the fix."""

    index: int
    line: str
    function: str
    retain_graph: bool
    create_graph: bool
    needed: bool | None
    held_after_bytes: int
    why: str
    fix: str

    @property
    def verdict(self) -> str:
        if self.needed is not None:
            return "needed" if self.needed else "can go"
        if self.retain_graph and not self.create_graph:
            return "cannot tell"
        return "not a retain (create_graph)" if self.create_graph else "not a retain"


@dataclass(frozen=True)
class RetainAudit:
    """What :func:`audit_retain_graph` found: the step's error as written (its type and the message's first line;
    None if it ran), its backward calls in order, and the learner's line where the error was raised."""

    error: str | None
    calls: list[BackwardCall] = field(default_factory=list)
    error_line: str | None = None

    def summary(self) -> str:
        retains = [c for c in self.calls if c.needed is not None]
        needed = sum(1 for c in retains if c.needed)
        failed = "" if self.error is None else (
            f" As written the step raises {self.error.rstrip('.')} at {_short(self.error_line or '?')}")
        return (f"{len(self.calls)} backward call(s); {len(retains)} retain_graph=True judged: {needed} needed, "
                f"{len(retains) - needed} can go.{failed}")

    def __repr__(self) -> str:
        rows = [f"  {c.index + 1}. {_short(c.line)} | retain_graph={c.retain_graph} | {c.verdict} | "
                f"{format_bytes(c.held_after_bytes)} held after | {c.fix} ({c.why})" for c in self.calls]
        return "\n".join([f"retain_graph audit: {self.summary()}", *rows])

    def _repr_html_(self) -> str:
        # Left-aligned and wrapped, the why under the fix: the table fits a notebook's column.
        cell = "style='text-align:left;vertical-align:top;padding:2px 10px 2px 0'"
        head = "".join(f"<th {cell}>{h}</th>" for h in ("#", "line", "retain_graph", "verdict", "held after",
                                                        "fix (why)"))
        rows = "".join(
            f"<tr><td {cell}>{c.index + 1}</td><td {cell} title='{html.escape(c.line, quote=True)}'>"
            f"<code style='white-space:pre-wrap'>{html.escape(_short(c.line))}</code></td><td {cell}>"
            f"{c.retain_graph}</td><td {cell}><b>{c.verdict}</b></td><td {cell}>{format_bytes(c.held_after_bytes)}"
            f"</td><td {cell}>{html.escape(c.fix)}<br><small>{html.escape(c.why)}</small></td></tr>"
            for c in self.calls)
        return (f"<div><p><b>retain_graph audit:</b> {html.escape(self.summary())}</p>"
                f"<table style='border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>"
                f"</table></div>")


def _short(line: str) -> str:
    """"/a/b/train.py:12: code" -> "train.py:12: code" (a cell's "Cell In[5], line 3: code" stays)."""
    match = re.match(r"(.*?):(\d+): (.*)$", line)
    return f"{os.path.basename(match.group(1))}:{match.group(2)}: {match.group(3)}" if match else line


def _first_sentence(error: str) -> str:
    return error.split(". ", 1)[0].rstrip(".")


def _same_error(a: tuple[str, str] | None, b: tuple[str, str] | None) -> bool:
    """The same error at the same line; numbers aside (version counters grow with every run)."""
    return a == b or (a is not None and b is not None and a[1] == b[1]
                      and re.sub(r"\d+", "#", a[0]) == re.sub(r"\d+", "#", b[0]))


@dataclass
class _Record:
    """A backward call seen in one run."""

    function: str
    line: str
    retain_graph: bool
    create_graph: bool
    held_after_bytes: int = 0


class _Run:
    """One run of the step: the call whose retain_graph is turned off (None: none), what it recorded."""

    def __init__(self, target: int | None, meter: SavedTensorMeter) -> None:
        self.target, self.meter, self.depth = target, meter, 0
        self.calls: list[_Record] = []
        self.grads: dict[str, torch.Tensor | None] = {}
        self.stepped: set[int] = set()
        self.error: tuple[str, str] | None = None  # (the message's first line, the learner's line)


class _Audit:
    def __init__(self, step: Callable[[], Any], models: tuple[torch.nn.Module, ...],
                 optimizers: tuple[torch.optim.Optimizer, ...]) -> None:
        self.step, self.models, self.optimizers = step, models, optimizers
        self.lines: dict[tuple[str, int], str] = {}
        self.run: _Run | None = None
        self.undo: list[Callable[[], None]] = []
        known = known_names(step)
        by_id = {id(value): name for name, value in reversed(known.items())}
        # Each parameter's key in a gradient snapshot and its group (the model or optimizer named in the why).
        self.keys: dict[int, tuple[str, str]] = {}
        self.model_names = [by_id.get(id(m), f"models[{i}]" if len(models) > 1 else "model")
                            for i, m in enumerate(models)]
        modules = list(zip(self.model_names, models)) + [
            (n, v) for n, v in known.items() if isinstance(v, torch.nn.Module)]
        for name, module in modules:
            for pname, p in module.named_parameters():
                self.keys.setdefault(id(p), (f"{name}.{pname}", name))
        self.optimizer_params: list[list[torch.Tensor]] = []
        for i, optimizer in enumerate(optimizers):
            name = by_id.get(id(optimizer), f"optimizers[{i}]" if len(optimizers) > 1 else "optimizer")
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for j, p in enumerate(params):
                self.keys.setdefault(id(p), (f"{name}[{j}]", name))
            self.optimizer_params.append(params)
        self.groups = dict(self.keys.values())
        # Parameters an optimizer updates outside the models passed: held by a bare module so they are put back.
        covered = {id(p) for m in models for p in m.parameters()}
        loose = torch.nn.Module()
        loose._parameters.update((str(i), p) for i, p in enumerate(
            p for params in self.optimizer_params for p in params if id(p) not in covered))
        self.state = TrainingState((*models, loose), optimizers, step=step)
        self.buffers = [(b, b.detach().clone()) for m in models for b in m.buffers()]

    def restore(self) -> None:
        self.state.restore()
        with torch.no_grad():
            for buffer, value in self.buffers:
                buffer.copy_(value)

    # -- wrapping torch's entry points ----------------------------------------------------------------------
    def install(self) -> None:
        wrappers: dict[int, tuple[Any, Any]] = {}
        for label, owner, name in _ENTRY_POINTS:
            original = getattr(owner, name)
            wrappers[id(original)] = (original, self.wrap(label, original))
            setattr(owner, name, wrappers[id(original)][1])
            self.undo.append(functools.partial(setattr, owner, name, original))

        def swap(value: Any, put: Callable[[Any], None]) -> None:
            pair = wrappers.get(id(value))
            if pair is not None and pair[0] is value:
                put(pair[1])
                self.undo.append(functools.partial(put, value))

        namespace = getattr(self.step, "__globals__", {})
        for name, value in list(namespace.items()):  # from torch.autograd import grad
            swap(value, functools.partial(namespace.__setitem__, name))
        for cell in getattr(self.step, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell has no contents
                swap(cell.cell_contents, functools.partial(setattr, cell, "cell_contents"))
        for i, optimizer in enumerate(self.optimizers):
            self.undo.append(optimizer.register_step_pre_hook(functools.partial(self.on_step, i)).remove)

    def uninstall(self) -> None:
        while self.undo:
            self.undo.pop()()

    def wrap(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            run = self.run
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                bound = None  # let torch raise its own message
            if run is None or run.depth or bound is None:
                return original(*args, **kwargs)
            create = bool(bound.arguments.get("create_graph", False))
            retain = bound.arguments.get("retain_graph")
            record = _Record(label, learner_line(sys._getframe(1), self.lines),
                             create if retain is None else bool(retain), create)
            if len(run.calls) == run.target:
                bound.arguments["retain_graph"] = False
            run.calls.append(record)
            run.depth += 1
            try:
                return original(*bound.args, **bound.kwargs)
            finally:
                run.depth -= 1
                record.held_after_bytes = run.meter.graph_only_bytes

        return wrapper

    def on_step(self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        run = self.run
        if run is None or index in run.stepped:
            return
        run.stepped.add(index)
        for p in self.optimizer_params[index]:
            run.grads.setdefault(self.keys[id(p)][0], None if p.grad is None else p.grad.detach().clone())

    # -- runs -------------------------------------------------------------------------------------------------
    def once(self, target: int | None) -> _Run:
        meter = SavedTensorMeter()
        run = self.run = _Run(target, meter)
        with meter:
            try:
                self.step()
            except Exception as exc:  # the step's own error is part of the report
                run.error = self.error_of(exc)
            finally:
                self.run = None
        if not self.optimizers:
            for name, model in zip(self.model_names, self.models):
                run.grads.update((f"{name}.{k}", g) for k, g in gradients_of(model).items())
        return run

    def error_of(self, exc: BaseException) -> tuple[str, str]:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        lines = str(exc).strip().splitlines()
        # The meter's note on its own version check: the same error comes without a meter.
        first = re.sub(r"\s*\(Checked by SavedTensorMeter:.*\)$", "", lines[0] if lines else "")
        message = f"{type(exc).__name__}: {first}".rstrip(": ")
        return message, learner_line(None if tb is None else tb.tb_frame, self.lines)

    def difference(self, got: dict[str, torch.Tensor | None], reference: dict[str, torch.Tensor | None]) -> str:
        """"" when the gradients are the same (close), else which group's are off and by how much."""
        if set(got) != set(reference):
            return "not the same optimizers step: " + ", ".join(sorted(set(got) ^ set(reference))[:3])
        if compare_gradients(got, reference).close:
            return ""
        groups: dict[str, list[str]] = {}
        for key in reference:
            groups.setdefault(self.groups.get(key, key.split(".")[0]), []).append(key)
        parts = []
        for group, keys in groups.items():
            result = compare_gradients({k: got[k] for k in keys}, {k: reference[k] for k in keys})
            if not result.close:
                off = result.relative_error * 100
                parts.append(f"{group}'s gradients: {f'{off:.0f}%' if off >= 1 else 'under 1%'} off")
        return "; ".join(parts)

    def report(self) -> RetainAudit:
        base, unsteady = self.once(None), ""
        if any(c.retain_graph and not c.create_graph for c in base.calls):
            self.restore()
            control = self.once(None)  # nothing changed: the same result, or no verdict can be trusted
            unsteady = (self.difference(control.grads, base.grads) if _same_error(control.error, base.error)
                        else f"the second time it raises {control.error[0] if control.error else 'nothing'}")
        calls = [self.judge(i, c, base, unsteady) for i, c in enumerate(base.calls)]
        error, where = base.error or (None, None)
        return RetainAudit(error, calls, where)

    def judge(self, index: int, call: _Record, base: _Run, unsteady: str) -> BackwardCall:
        def verdict(needed: bool | None, why: str, fix: str) -> BackwardCall:
            return BackwardCall(index, call.line, call.function, call.retain_graph, call.create_graph, needed,
                                call.held_after_bytes, why, fix)

        if call.create_graph:
            return verdict(None, CREATE_GRAPH_NOTE, "nothing to change here")
        if not call.retain_graph:
            return verdict(None, "it does not retain the graph (retain_graph is off)", "nothing to change")
        if unsteady:
            return verdict(None, f"the step is not repeatable: run twice from the same state, {unsteady}",
                           "cannot tell: pass every model and optimizer the step trains, and take the batch "
                           "outside the step")
        self.restore()
        rerun = self.once(index)
        as_written = "" if base.error is None else f" (as written it raises {_first_sentence(base.error[0])})"
        if rerun.error is not None and not _same_error(rerun.error, base.error):
            message, where = rerun.error
            why = f"without it the step raises: {_first_sentence(message)} at {_short(where)}{as_written}"
            if base.error is not None:
                fix = ("keep it only while a later backward goes through this graph; the step fails either way, "
                       "so fix its error first (the fix may make this retain unnecessary)")
            elif _SECOND_TIME in message:
                fix = f"keep it: a later backward needs these buffers ({_short(where)})"
            else:
                fix = "keep it: the step fails without it"
            return verdict(True, why, fix)
        if base.error is not None and rerun.error is None:
            return verdict(False, f"without it the step runs{as_written}", "remove retain_graph=True")
        changed = self.difference(rerun.grads, base.grads)
        if changed:
            return verdict(True, f"without it the gradients change ({changed}){as_written}",
                           "keep it: without it the gradients change")
        without = rerun.calls[index].held_after_bytes if len(rerun.calls) > index else 0
        kept = format_bytes(max(0, call.held_after_bytes - without))
        if base.error is None:
            return verdict(False, f"without it the step runs and every gradient is the same: it only kept "
                                  f"{kept} alive", "remove retain_graph=True")
        return verdict(False, f"without it the step fails the same way{as_written} and every gradient before "
                              f"that is the same: it only kept {kept} alive",
                       "remove retain_graph=True (the step's own error remains)")


def audit_retain_graph(step: Callable[[], Any], models: torch.nn.Module | Iterable[torch.nn.Module] = (),
                       optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = ()) -> RetainAudit:
    """Run ``step`` (one training iteration, no arguments) as written, then once more per ``retain_graph=True``
    with only that one turned off, and say for each backward call whether its retain is needed (the step
    fails or its gradients change without it), can go, or is no retain; with the bytes only the graph still
    held right after the call, why and the fix. Pass the ``models`` and ``optimizers`` the step trains:
    their state, the random streams and the tensors the step's closure and globals hold are put back before
    every run and at the end.

    Used by notebook 05_your_training_step."""
    check_step(step)
    models = as_items(models, torch.nn.Module, "models", "torch.nn.Module")
    optimizers = as_items(optimizers, torch.optim.Optimizer, "optimizers", "torch.optim.Optimizer")
    audit = _Audit(step, models, optimizers)
    audit.install()
    try:
        with passed_optimizers_only(step, optimizers, "audit_retain_graph"):
            return audit.report()
    finally:
        audit.uninstall()
        audit.restore()
