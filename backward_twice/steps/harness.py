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
  buffers, so it is still usable afterwards. Each run is one iteration (``next_iteration()`` after it), unless a
  loop of the step's own code holds its backward calls and its optimizers' steps (Reptile's inner loop, a TBPTT
  chunk loop that steps each chunk), or of a function of the learner's that a step with no backward of its own calls
  (``trainer.train_sequence(xs, ys)``): then, as in a watched loop, that loop's passes are the iterations (a run starts
  a new one too);
* before the first run, a :class:`backward_twice.steps.snapshot.CpuSnapshot` copies what the runs may change
  (the models, the optimizers, the random streams, what the step reaches by name) and puts it back after the last;
  an iterator the step reads from is left where the runs leave it (:attr:`StepRun.not_put_back` says how far);
* the gradients each optimizer receives are kept (on the CPU) at its first ``step()``; without optimizers, the
  models' ``.grad`` after the first run.

Used by :mod:`backward_twice.magic`, :mod:`backward_twice.steps.audit`, :mod:`backward_twice.steps.carried` and
:mod:`backward_twice.steps.diagnose`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from backward_twice.judge.failsafe import could_not_judge, judged
from backward_twice.judge.verdicts import Verdicts
from backward_twice.record.loops import calls_outside_loops, holds_a_backward, loops_of, step_calls
from backward_twice.record.names import CodeSite
from backward_twice.record.recorder import Recorder
from backward_twice.record.step_input import as_items, check_step, hook_owners, known_names
from backward_twice.steps.snapshot import CpuSnapshot, cpu_copy

__all__ = ["StepRun", "reachable", "reported", "run_step", "step_name"]

Built = TypeVar("Built")  # the report a tool builds


@dataclass
class StepRun:
    """What :func:`run_step` saw: the recorder, the verdicts, how many runs started, the gradients kept, and what
    the runs changed that nothing can put back."""

    recorder: Recorder
    verdicts: Verdicts
    runs: int
    gradients: dict[str, torch.Tensor | None] = field(default_factory=dict)
    not_put_back: tuple[str, ...] = ()  # what the runs changed that nothing can put back (an iterator moved on)
    problem: str | None = None  # the tool's own failure to judge the runs (then ``verdicts`` hold no finding)


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
    written, given = _as_written(step)  # a ``functools.partial(trainer.train_step, batch)``: the method, its batch
    names = {**given, **known_names(written)}
    found_models, found_optimizers = reachable(names.values())  # a wrapper's self._optim, a PPO's policy
    models = tuple({id(m): m for m in (*models, *found_models)}.values())
    optimizers = tuple({id(o): o for o in (*optimizers, *found_optimizers)}.values())
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"{who}: iterations must be a whole number from 1 up, got {iterations!r}")
    hooked = hook_owners(written, models)  # what the models' hooks write to (a list of activations), by its name
    snapshot = CpuSnapshot(written, models, optimizers, [*hooked, *given.items()])
    recorder = Recorder(
        keep_buffers=True, roots=lambda: [*known_names(written).items(), *given.items(), *hooked], on_leaf=snapshot.keep
    )
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
                kept.setdefault(
                    labels.get(id(p), f"parameter {len(kept)}"), None if p.grad is None else cpu_copy(p.grad)
                )

    recorder.before_step = capture
    code = getattr(written, "__code__", None)
    recorder.by_runs = code is None or not (
        _a_loop_holds_its_steps(code) or _calls_a_loop_that_holds_its_steps(code, names)
    )
    recorder.caught.by_runs = True  # a run that returns after its backward raised: the step caught it
    recorder.outermost = sys._getframe()  # the step's names are inside it; the caller's, outside
    if code is not None:
        recorder.roots_where = CodeSite(code.co_filename, code.co_firstlineno, code.co_name)
    runs = 0
    try:
        with recorder:
            before_each_run = getattr(step, "_before_each_run", None)  # %%diagnose: a fresh batch, as a loop's header
            for runs in range(1, iterations + 1):
                try:
                    if runs > 1 and callable(before_each_run):
                        before_each_run()
                    step()
                except Exception as exc:  # the step's own error is what the tools report
                    if recorder.error is None:
                        recorder.record_error(exc)
                    recorder.caught.let_out(exc)
                    break
                if gradients and runs == 1 and not optimizers:
                    for model in models:
                        for name, p in model.named_parameters():
                            kept[labels.get(id(p), name)] = None if p.grad is None else cpu_copy(p.grad)
                recorder.next_iteration(between_runs=True)
    finally:
        recorder.outermost = None  # a frame holds its variables: not kept past the run
        snapshot.restore()
    verdicts, problem = judged(recorder, f"the runs of {step_name(step)}", runs)
    return StepRun(recorder, verdicts, runs, kept, snapshot.moved(runs), problem)


def reported(
    run: StepRun, step: Callable[[], Any], build: Callable[[StepRun], Built], claims_nothing: Callable[[str], Built]
) -> Built:
    """``build(run)``, a tool's report of the runs; where judging them failed (in the harness or in ``build``),
    ``claims_nothing(why)``: the report that says so and finds nothing. Nothing raises into the learner's code."""
    problem = run.problem
    if problem is None:
        try:
            return build(run)
        except Exception as error:
            problem = could_not_judge(f"the runs of {step_name(step)}", error)
    return claims_nothing(problem)


def step_name(step: Callable[[], Any]) -> str:
    """What the tools' reports call ``step``: its name ("train_step"), "the cell" (``%%diagnose``), "the step"."""
    name = getattr(step, "__name__", "step")
    return "the cell" if name == "<cell>" else "the step" if name.startswith("<") else name


def _as_written(step: Callable[[], Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The function a ``functools.partial`` (of a partial) calls, and the arguments it gives it, by the names of
    that function's parameters: what the step's code reads (``self`` of a bound method, ``batch``); an object's
    ``__call__`` bound to it; ``step`` itself and nothing else for any other callable."""
    given: dict[str, Any] = {}
    while isinstance(step, functools.partial):
        with contextlib.suppress(TypeError, ValueError):  # a builtin with no signature: its arguments stay unnamed
            bound = inspect.signature(step.func).bind_partial(*step.args, **step.keywords)
            given = {**bound.arguments, **given}
        step = step.func
    call = inspect.getattr_static(type(step), "__call__", None) if not isinstance(step, torch.nn.Module) else None
    if isinstance(call, types.FunctionType):  # an object of the learner's whose ``__call__`` is the step: that
        return types.MethodType(call, step), given  # method, bound to it
    return step, given


def _a_loop_holds_its_steps(code: types.CodeType) -> bool:
    """Whether a loop of ``code``'s own is the innermost around one of its backward calls and holds every one of
    them and every ``.step()`` it calls (Reptile's inner loop, with its inner optimizer's step): the loop a watch
    takes for the iteration's, around every event. A step whose optimizer steps after the loop (gradient
    accumulation) or whose second backward comes after it (a WGAN's critic loop, then G's) is one iteration a run."""
    calls = step_calls(code)
    return any(holds_a_backward(code, loop) and all(loop.holds(call.line) for call in calls) for loop in loops_of(code))


def _calls_a_loop_that_holds_its_steps(code: types.CodeType, names: Mapping[str, Any]) -> bool:
    """Whether a step with no backward of its own calls a function of the learner's whose own loop holds all of its
    backward and ``.step()`` calls (``trainer.train_sequence(xs, ys)``, truncated backpropagation over chunks): that
    loop's passes are the iterations, as a watch around the call counts them. ``names``: what the step knows objects
    by; an object's attribute is read from its class's ``__dict__`` (no property runs), and nothing is called."""
    if step_calls(code):
        return False
    for name, attribute in calls_outside_loops(code):
        value = names.get(name)
        try:
            if attribute is not None:
                value = inspect.getattr_static(type(value), attribute, None)
            function = getattr(value, "__func__", value)
        except Exception:  # an object that refuses to be read: no function of theirs found
            continue
        if isinstance(function, types.FunctionType) and _a_loop_holds_its_steps(function.__code__):
            return True
    return False


def reachable(values: Iterable[Any], depth: int = 0) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    """The modules and optimizers among ``values``, in their lists, tuples and dicts, and in the attributes of the
    objects they hold, two levels deep (``state["model"]``, ``ppo.policy``, ``pc_adam._optim``), and the optimizers
    a module keeps as an attribute (``self.meta_optim``): what a step's names, or ``%%diagnose trainer``, reach."""
    models: list[torch.nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    for value in values:
        if isinstance(value, torch.nn.Module):
            models.append(value)
            optimizers += [v for v in vars(value).values() if isinstance(v, torch.optim.Optimizer)]  # MAML's
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
        elif depth < 2 and isinstance(value, (list, tuple)):
            inner = reachable(value[:64], depth + 1)
            models += inner[0]
            optimizers += inner[1]
        elif depth < 2 and isinstance(value, dict):
            inner = reachable(list(value.values())[:64], depth + 1)
            models += inner[0]
            optimizers += inner[1]
        elif (
            depth < 2
            and hasattr(value, "__dict__")
            and not isinstance(value, (type, types.ModuleType))
            and not callable(value)
        ):
            inner = reachable(list(vars(value).values())[:64], depth + 1)
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
