"""How ``iterations=N`` stops a run (:class:`StopRecording`), and where it stops one that no loop of the learner's
splits (a framework's ``fit`` or ``train`` runs the iterations): :class:`StepCallStop` stops it as the learner's
step function is called again after N iterations, before its first line (a Lightning ``training_step`` with manual
optimization: stopped at its backward, the step had already moved the state it keeps on ``self`` one iteration on).

The step function is the learner's function that ran the run's first backward call (not a script's or a cell's top
level, which is never called again). The stop rides on ``sys.setprofile`` from the end of iteration N to that call:
a profile function sees each call, where a trace function would see each line, and the window is one iteration's
tail. Any error of its own switches it off; the recorder's stop at the next backward call or optimizer step stays.
A profiler of the learner's own, already set, is left alone (the stop comes at the backward then).

A framework's own loop is first asked to stop (:class:`FrameworkStop`), at the end of the optimizer step that ends
iteration N, as its own early stop asks: PyTorch Lightning's ``trainer.should_stop``, transformers'
``trainer.control.should_training_stop``. The framework then ends its loop after that step as its step limit does,
with its end-of-training hooks, where a stop raised into it would run its exception hooks (Lightning's
``on_exception``, where an ``OnExceptionCheckpoint`` writes a checkpoint). The stop is then raised where the learner's
call into the framework (``trainer.fit(...)``) returns (:meth:`FrameworkStop.stop_on_return`, on the same profile
hook): the code after it does not run, as after a loop of the learner's own. If the framework goes on anyway (a
``min_steps`` not met), the stop is raised as the learner's step function (``training_step``) is called again,
before its first line. Meanwhile no stop is raised at a backward or a step: the rest of the step that ended iteration
N runs (a second optimizer's backward and step, after the first's, in manual optimization). A trainer whose own limit
ends its loop with that very step (``max_steps``, the last batch of its last epoch) is neither asked nor stopped: no
pass N+1 was to come, and the learner's code after ``fit()`` runs, as it does after a loop of their own that ends by
itself.

A loop whose backward calls start late (a DQN's ``learning_starts``: no backward in its first thousand passes) is
not known as the iteration's loop until the first one runs. :func:`stop_before_any_event` stops it at the top of pass
N+1 all the same, when it is, as written, the innermost loop around a backward call of its code: the loop's passes
so far become the iterations.

A stop at the top of pass N+1 comes after the loop's ``for`` took that pass's item: :class:`TakenItem` keeps, at the
loop's header, the random streams and, at a script's or a cell's top level, the names the ``for`` binds, and puts them
back at the stop.

Used by :mod:`backward_twice.record.pass_stops` and :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import sys
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from backward_twice.record.coroutines import resumed
from backward_twice.record.loops import Loop, holds_a_backward
from backward_twice.record.unseen import real_getprofile

if TYPE_CHECKING:  # the stops load without torch (checked on interpreters that have none)
    from backward_twice.record.lines import LineTracer
    from backward_twice.record.passes import IterationLoop

__all__ = [
    "FrameworkStop",
    "StepCallStop",
    "StopRecording",
    "TakenItem",
    "next_pass_stops_before_any_event",
    "stop_before_any_event",
]

# The trainers asked to stop, by the class that defines them (a learner's subclass included): what to set
_TRAINERS = {
    ("pytorch_lightning.trainer.trainer", "Trainer"): "lightning",
    ("lightning.pytorch.trainer.trainer", "Trainer"): "lightning",
    ("transformers.trainer", "Trainer"): "transformers",
}
# The trainers' methods that run their loop, whose ``self`` is read: no other frame's variables are (a read keeps them
# on the frame until the next, up to Python 3.12)
_LOOP_METHODS = frozenset({"_run_stage", "_run_train", "_inner_training_loop"})
_DEPTH = 64  # frames looked through: a trainer's loop is a few dozen calls above an optimizer's step


class StopRecording(BaseException):
    """Raised at the top of the pass after the N iterations a recorder was told to watch; the watch swallows it.
    Not an Exception: the learner's own ``except Exception`` must not catch it."""


class StepCallStop:
    """The stop at the next call of the learner's step function, armed once iteration N has ended."""

    def __init__(self) -> None:
        self.code: types.CodeType | None = None  # the learner's function that ran the first backward call
        self._stop: Callable[[], BaseException | None] | None = None
        self._previous: Any = None

    def saw_backward(self, learners: types.FrameType | None) -> None:
        """A backward call ran in ``learners`` (the learner's innermost frame): the first one's function is the step."""
        if self.code is None and learners is not None and learners.f_code.co_name != "<module>":
            self.code = learners.f_code

    def arm(self, stop: Callable[[], BaseException | None]) -> None:
        """From now on, the next call of the step function raises what ``stop`` gives (None: no stop is due)."""
        if self.code is None or self._stop is not None:
            return
        self._stop, self._previous = stop, real_getprofile()
        if self._previous is None:  # a profiler of the learner's own stays theirs
            sys.setprofile(self._profile)
        else:
            self._stop = None

    def disarm(self) -> None:
        if self._stop is not None:
            self._stop = None
            if real_getprofile() == self._profile:
                sys.setprofile(None)

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code is not self.code or resumed(frame):  # not an ``async def`` step's ``await``
            return
        stop = self._stop
        self.disarm()
        try:
            raised = stop() if stop is not None else None
        except Exception:  # the recorder's own error: no stop here
            return
        if raised is not None:
            raise raised  # into the learner's step function, before its first line


class FrameworkStop:
    """The request to a framework's trainer, found on the stack, to end its loop after the step that runs now."""

    def __init__(self) -> None:
        self.asked = self._looked = False  # a trainer was asked; the stack was looked through
        self._lightning: Any = None  # the Lightning trainer told to stop: its flag is put back when the watch ends
        self._around: bool | None = None  # whether a trainer runs the loop (looked once)
        self._returning: types.FrameType | None = None  # the framework's call the learner's code made (``fit``)
        self._stop: Callable[[types.FrameType | None], BaseException] | None = None
        self._step: types.CodeType | None = None  # the learner's step function: called again, the trainer went on
        self._package = ""  # the asked trainer's top package (``pytorch_lightning``, ``transformers``)
        self.ends_on_its_own = False  # the step that ended iteration N was its last anyway: no stop was raised

    def runs_the_loop(self, frame: types.FrameType | None) -> bool:
        """Whether a trainer of a framework the tool knows runs the loop around ``frame`` (looked once a run): its
        iterations end at optimizer steps, where its gradient accumulation runs several backward calls each."""
        if self._around is None and frame is not None:
            try:
                self._around = _trainer_around(frame) is not None
            except Exception:  # a framework's change: the first backward's line counts the iterations
                self._around = False
        return bool(self._around)

    def ask(self, frame: types.FrameType | None) -> bool:
        """Ask the first trainer of a known framework around ``frame`` (once a run); whether one was asked."""
        if self._looked:
            return False
        self._looked = True
        try:
            self.asked = self._ask(frame)
            return self.asked
        except Exception:  # a framework's change: the stop raised at the next step or backward stays
            return False

    def _ask(self, frame: types.FrameType | None) -> bool:
        found = _trainer_around(frame)
        if found is None:
            return False
        kind, trainer, self._package = found
        if _ends_with_this_step(kind, trainer):  # its own limit ends it here: nothing to stop, the code after runs
            self.ends_on_its_own = True
            return False
        if kind == "lightning" and trainer.should_stop is False:
            trainer.should_stop, self._lightning = True, trainer
            return True
        if kind == "transformers":
            trainer.control.should_training_stop = True
            return True
        return False

    @property
    def armed(self) -> bool:
        """Whether the stop waits for the framework's call to return (or for the step function's next call): the
        rest of the step that ended iteration N runs on (a second optimizer's backward and step, after the first's)."""
        return self._returning is not None

    def stop_on_return(
        self,
        frame: types.FrameType,
        learners: Callable[[types.CodeType], bool],
        stop: Callable[[types.FrameType | None], BaseException],
        step: types.CodeType | None = None,
    ) -> None:
        """Once the trainer ends its loop as asked, raise ``stop()`` where the learner's code called into the
        framework (``trainer.fit(...)`` returns into the learner's line as the stop): the code after it does not
        run, as after a loop of the learner's own that stopped. The outermost call from the learner's code into
        the trainer's package, from ``frame`` out; not armed while a profiler of the learner's runs. If the trainer
        goes on instead (a ``min_steps`` not met), the stop is raised as the learner's ``step`` function (its
        ``training_step``) is called again, before its first line."""
        entry = None
        while frame is not None and frame.f_back is not None:
            package = str(frame.f_globals.get("__name__", "")).split(".")[0]
            if package == self._package and learners(frame.f_back.f_code):
                entry = frame
            frame = frame.f_back
        if entry is not None and real_getprofile() is None:
            self._returning, self._stop, self._step = entry, stop, step
            sys.setprofile(self._profile)

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is self._step and self._step is not None and not resumed(frame):
            stop = self._stop  # the trainer went on: pass N+1 starts here
            self._disarm()
            if stop is not None:
                raise stop(None)
        if event != "return" or frame is not self._returning:
            return
        stop = self._stop
        self._disarm()
        if stop is not None:
            raise stop(frame)  # out of the framework's call, into the learner's line

    def _disarm(self) -> None:
        self._returning = self._stop = self._step = None
        if real_getprofile() == self._profile:
            sys.setprofile(None)

    def put_back(self) -> bool:
        """Lightning's flag as a fit that stopped at its step limit leaves it (the next fit clears it anyway); whether
        a trainer was asked to stop."""
        self._disarm()
        trainer, self._lightning = self._lightning, None
        try:
            if trainer is not None and trainer.should_stop is True:
                trainer.should_stop = False
        except Exception:  # a framework's change: its flag stays as the stop left it
            pass
        return self.asked


def _ends_with_this_step(kind: str, trainer: Any) -> bool:
    """Whether the trainer's own limits end its loop with the optimizer step that runs now (read in that step, before
    the trainer counts it): transformers' ``max_steps`` reached; Lightning's ``max_steps``, or the last batch of its
    last epoch (``max_epochs``, ``limit_train_batches``). A trainer asked to stop there would end as it ends anyway,
    and the stop raised where its call returns would cut the learner's code after ``fit()`` that python runs. False
    where a limit cannot be read."""
    try:
        if kind == "transformers":
            state = trainer.state
            return bool(state.max_steps and state.max_steps > 0 and state.global_step + 1 >= state.max_steps)
        max_steps = trainer.max_steps
        if max_steps is not None and max_steps >= 0 and trainer.global_step + 1 >= max_steps:
            return True
        batches = trainer.num_training_batches
        last_batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready >= batches
        max_epochs = trainer.max_epochs
        last_epoch = max_epochs is not None and max_epochs >= 0 and trainer.current_epoch + 1 >= max_epochs
        return bool(last_batch and last_epoch)
    except Exception:  # a framework's change: asked, as before
        return False


def _trainer_around(frame: types.FrameType | None) -> tuple[str, Any, str] | None:
    """(its framework, the trainer, the framework's top package) of the first trainer of a known framework whose loop
    runs around ``frame`` (the package of the framework's own class: a learner's subclass lives elsewhere)."""
    for _ in range(_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        trainer: Any = frame.f_locals.get("self") if code.co_name in _LOOP_METHODS and code.co_argcount else None
        defined = next((key for key in map(_defined_by, type(trainer).__mro__) if key in _TRAINERS), None)
        if defined is not None:
            return _TRAINERS[defined], trainer, defined[0].split(".")[0]
        frame = frame.f_back
    return None


def _defined_by(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__name__


def stop_before_any_event(
    passes: IterationLoop, tracer: LineTracer, iterations: int | None, frame: types.FrameType, loop: Loop
) -> bool:
    """Whether pass N+1 of ``loop`` (in ``frame``) begins before any backward call or step ran, ``loop`` being the
    innermost around a backward call of its code, as written: then it is made the iteration's loop, its passes so far
    the iterations, and the caller stops here."""
    seen = tracer.latest.get((id(frame), loop.header))
    if iterations is None or passes.chain is not None or seen is None or seen.count <= iterations:
        return False
    if not holds_a_backward(frame.f_code, loop, _learners_function(frame)):
        return False
    from backward_twice.record.passes import Link, PassStart  # loaded with the recorder already: no cost here

    link = Link(frame.f_code, loop, id(frame))
    passes.chain = [link]
    passes.passes[link.key] = [PassStart(seen.first, 0, number=1)]
    if iterations > 1:
        passes.passes[link.key].append(PassStart(seen.first, 0, number=iterations))  # the ones between: folded
    return True


def next_pass_stops_before_any_event(
    passes: IterationLoop, tracer: LineTracer, iterations: int | None, frame: types.FrameType, loop: Loop
) -> bool:
    """At ``loop``'s header: whether :func:`stop_before_any_event` stops the pass it starts next, if it starts one."""
    return _due_before_any_event(passes, tracer, iterations, frame, loop, begun=0)


def _due_before_any_event(
    passes: IterationLoop, tracer: LineTracer, iterations: int | None, frame: types.FrameType, loop: Loop, begun: int
) -> bool:
    seen = tracer.latest.get((id(frame), loop.header))
    if iterations is None or passes.chain is not None or seen is None or seen.count - begun < iterations:
        return False
    return holds_a_backward(frame.f_code, loop, _learners_function(frame))


def _learners_function(frame: types.FrameType) -> Callable[[str, str | None], types.CodeType | None]:
    """What a call in ``frame``'s code names, when it is a function of the same file (``optimize_model``,
    ``agent.learn``): its code. Nothing is called, and an object's attribute is read from its class's ``__dict__``
    (no property runs)."""

    def resolve(name: str, attribute: str | None) -> types.CodeType | None:
        try:
            names = frame.f_locals
            value = names[name] if name in names else frame.f_globals.get(name)
            if attribute is not None:
                value = inspect.getattr_static(type(value), attribute, None)
            function = getattr(value, "__func__", value)
            code = function.__code__ if isinstance(function, types.FunctionType) else None
        except Exception:  # a namespace that refuses to be read: no function of theirs found
            return None
        return code if code is not None and code.co_filename == frame.f_code.co_filename else None

    return resolve


class TakenItem:
    """What a loop's header changes as it takes the item of pass N+1, kept there and put back at the stop at that
    pass's top: the random streams, which reading the item may draw from (a ``Dataset``'s random crop), and, in a
    script's or a notebook cell's top level, the names its ``for`` binds (the next cell sees pass N's ``i`` and ``x``),
    and the place of an iterator of Python's own its iterable names (``it = iter(batches)`` read on by a next cell:
    ``for x in it``, ``enumerate(it)``). The state is then that of N passes (a ``while``'s condition drawing from a
    stream included). A function's variables are not written (no frame is): the stop unwinds its frame. An iterator
    of another kind that the iterable names (a DataLoader's, a generator) keeps the item it gave, as nothing can take
    it back, and then so do the others it names (``zip(it, other)``), and the streams keep what giving it drew: the
    state of a loop that breaks at the top of pass N+1."""

    def __init__(self) -> None:
        self._where: tuple[int, int] | None = None  # (id(frame), header line) of the loop whose header kept them
        self._names: dict[str, Any] = {}
        self._namespace: dict[str, Any] | None = None  # the top level's names (a module's dict, not a frame's)
        self._streams: list[tuple[Callable[[Any], Any], Any]] = []  # how to set each stream, and its state
        self._places: list[tuple[Any, Any]] = []  # (an iterator of Python's own, its place)

    def keep(self, frame: types.FrameType, loop: Loop) -> None:
        self._where = (id(frame), loop.header)
        top_level = not frame.f_code.co_flags & inspect.CO_OPTIMIZED and frame.f_locals is frame.f_globals
        self._namespace = frame.f_globals if top_level else None  # a module's dict (a cell's, IPython's user_ns)
        if self._namespace is not None:
            self._names = {name: self._namespace.get(name, _UNBOUND) for name in loop.targets}
        self._places = _iterator_places(frame, loop)
        restored = {id(iterator) for iterator, _ in self._places}
        if any(id(it) not in restored for it in _iterators_named(frame, loop)):  # one keeps its item: so do all (the
            self._places, self._streams = [], []  # ``zip(it, other)`` of a bare break), with what taking them drew
        else:
            self._streams = _random_streams()

    def put_back(self, frame: types.FrameType, loop: Loop) -> None:
        """Put back what ``loop``'s header kept in ``frame``."""
        if self._where == (id(frame), loop.header):
            names = self._namespace if self._namespace is not None else {}
            for name, value in self._names.items():
                if value is not _UNBOUND:
                    names[name] = value
                else:
                    names.pop(name, None)
            for set_state, state in self._streams:
                set_state(state)
            for iterator, place in self._places:
                with contextlib.suppress(Exception):  # as it was read: a list's iterator at index N
                    iterator.__setstate__(place)
        self.forget()

    def forget(self) -> None:
        self._where, self._names, self._namespace, self._streams, self._places = None, {}, None, [], []


_UNBOUND = object()  # a name the loop binds that its header found unbound (the body deleted it)


def _iterators_named(frame: types.FrameType, loop: Loop) -> list[Iterator[Any]]:
    """The iterators the names ``loop``'s iterable reads hold (``it`` of ``for x in it``, ``enumerate(it)``)."""
    names = frame.f_locals  # read only: the values the names hold
    values = (names[name] if name in names else frame.f_globals.get(name) for name in loop.iterable or ())
    return [value for value in values if isinstance(value, Iterator)]


def _iterator_places(frame: types.FrameType, loop: Loop) -> list[tuple[Any, Any]]:
    """(iterator, place) for each name ``loop``'s iterable reads that holds an iterator of Python's own whose place
    can be read and set (a list's, a tuple's, a range's: ``__reduce__`` and ``__setstate__``)."""
    places = []
    for value in _iterators_named(frame, loop):
        kind = type(value)
        if kind.__module__ == "builtins" and hasattr(value, "__setstate__"):
            reduced = value.__reduce__()
            if isinstance(reduced, tuple) and len(reduced) == 3:
                places.append((value, reduced[2]))
    return places


def _random_streams() -> list[tuple[Callable[[Any], Any], Any]]:
    """Python's, PyTorch's (CPU, and CUDA once started) and NumPy's global random streams, where loaded: how to set
    each, and its state now."""
    kept: list[tuple[Callable[[Any], Any], Any]] = [(random.setstate, random.getstate())]
    torch = sys.modules.get("torch")
    if torch is not None:
        kept.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_initialized():
            kept.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        kept.append((numpy.random.set_state, numpy.random.get_state()))
    return kept
