"""What the recorder can say about an error a backward raised, from what it saw: for "backward through the graph a
second time", the earlier call that freed the buffers, the name the walk reached them through and the other names it
reached them through on ways of their own; for the version check, the optimizer step that changed a saved tensor in
place (and whether it was the raising loss's own optimizer's), or else the learner's in-place statement that did; and
where an error the loop raised outside a backward rose in the learner's code (:func:`raised_at`).

Used by :mod:`backward_twice.judge.verdicts` and :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import traceback
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.autograd.graph import Node

from backward_twice.common.error_kinds import error_kind
from backward_twice.record.events import IterationEnd, StepEvent
from backward_twice.record.hand_update import hand_update
from backward_twice.record.in_place import changed_in_place
from backward_twice.record.learner import LearnersCode, first_line, learner_line, learner_line_at, skipped_dirs
from backward_twice.record.learner import site_of as site_of_line
from backward_twice.record.names import NamedGraph, named_optimizers, names_holding_graphs, site_of, unwrapped
from backward_twice.record.saved import (
    grad_fn_of,
    python_walk,
    weights_in,
    weights_past,
    weights_under,
)
from backward_twice.record.sources import function_around, parsed
from backward_twice.record.stale_step import step_that_changed
from backward_twice.record.walks import CallRecord, CallsSoFar, FreedEarlier

if TYPE_CHECKING:
    from backward_twice.record.lines import LineTracer
    from backward_twice.record.passes import IterationLoop, Link

__all__ = ["ErrorRecord", "Seen", "explain", "outside_the_loop", "raised_at", "raised_in"]


class Seen(Protocol):
    """What :func:`explain` reads of the recorder (:class:`backward_twice.record.recorder.Recorder`): where the
    learner's frames end, the names it saw holding graphs, the optimizers and steps it saw, and its calls."""

    @property
    def skipped(self) -> tuple[str, ...]: ...
    @property
    def events(self) -> int: ...
    @property
    def roots(self) -> Callable[[], list[tuple[str, Any]]] | None: ...
    @property
    def outermost(self) -> types.FrameType | None: ...
    @property
    def optimizers_seen(self) -> dict[int, weakref.ref[torch.optim.Optimizer]]: ...
    @property
    def names(self) -> dict[int, NamedGraph]: ...
    @property
    def steps(self) -> list[StepEvent]: ...
    @property
    def calls(self) -> CallsSoFar: ...
    @property
    def creation(self) -> LineTracer: ...
    @property
    def loop(self) -> IterationLoop: ...
    @property
    def marks(self) -> list[IterationEnd]: ...


@dataclass
class ErrorRecord:
    """The error a call (or the loop) raised: its first line, the learner's line, the call (None: not a backward),
    and the recorder's evidence: the call that freed the buffers needed, the name it was reached through, the
    optimizer step that changed a saved tensor in place."""

    message: str
    line: str
    call: int | None = None
    freed_by: int | None = None
    reached_through: NamedGraph | None = None
    changed_by_step: str | None = None
    stale_node: int | None = None  # the sequence number of the node whose saved weights the step changed
    changed_at: tuple[str, int] | None = None  # (file, line) of the learner's statement that changed one in place
    after_the_loop: bool = False  # raised outside the iteration loop, after its passes (no training error)
    held_now: bool = False  # ``reached_through`` holds the graph now, where the names seen earlier hold it no more
    through_walked: bool = True  # the call that freed the buffers walked through ``reached_through`` too (else two
    # losses meet below it, where no name of the learner's holds their graph: inside a model's ``forward``)
    parameter_through: str | None = None  # a parameter of the raising function that reaches the freed buffers
    # (``fake`` of CycleGAN's ``backward_D_basic(netD, real, fake)``, called with ``self.fake_B``, then ``self.fake_A``)
    through_sources: frozenset[int] = frozenset()  # ids of the leaves (weights) ``reached_through``'s graph reaches
    also_through: tuple[NamedGraph, ...] = ()  # other names held now whose old graph this call reaches (``x_pos``
    # beside ``x_neg``): the engine raised at the first freed node, the others would raise next
    caught: bool = False  # a backward's error the learner's code caught: the loop went on past it
    only_through: bool = False  # the loss trains no weight but through ``reached_through``: a detach of it leaves none
    stepped_between: str | None = None  # "file:line: code" of a call of an optimizer's own method (SAM's
    # ``first_step``) between the backward that freed the buffers and this one, in the raising function
    outer_through: NamedGraph | None = None  # ``reached_through``'s node under a name of an outer frame of the
    # learner's (the loop's ``ctx`` of ``loss, ctx = train_step(b, ctx)``, where the helper's parameter ``ctx`` held it)
    # after a step changed weights a stale forward saved: the name the walk reaches that forward through, when the
    # loss also trains weights outside it (SAC's alpha loss on ``log_pi``: detaching it keeps ``log_alpha``'s gradient)
    stale_through: str | None = None
    stale_only_through: bool = False  # and the walk reaches nothing older than that step but through that name: with
    # it detached, the later loss walks no buffers an earlier backward kept (a retain for it can go)
    another_trains: bool = False  # an optimizer of the learner's that did not step between the two backward calls holds
    # a weight ``reached_through``'s graph reaches (a backbone a student's and a teacher's optimizer both step)
    # other names held now through which the walk reaches buffers the same call freed, on a way of their own (mutual
    # learning: each network's loss reads the other's output), with the ids of the weights each one's graph reaches
    freed_also_through: tuple[tuple[NamedGraph, frozenset[int]], ...] = ()
    updated_by_hand: bool = False  # ``changed_by_step``: the learner's own update under no_grad (``p -= lr * p.grad``)
    past_the_loop: bool = (
        False  # a backward's after the loop ended: if the learner's code catches it, no training error
    )
    raised_inside: str | None = None  # "file:line: code" of the learner's call that raised inside this backward (an
    # ``autograd.grad`` a custom autograd.Function's backward runs): where the buffers it needs were freed
    raised_through: tuple[tuple[str, int], ...] = ()  # (file, line) of the learner's frames the raising call ran
    # under, innermost first (``update_params``'s backward, then ``learn``'s call of it): read for a stale forward
    trains_only_old: bool = False  # the loss reaches no weight but through graphs built before this pass: with what
    # carries them detached, it trains nothing (an episode's log-probs, read again)
    grad_off: bool = False  # autograd was off at the raising call (a ``torch.set_grad_enabled(False)`` left on)
    inference: bool = False  # and inference mode was on (a caller's ``torch.inference_mode()``)


def explain(
    recorder: Seen, exc: BaseException, call: CallRecord, walked: list[Node], caller: types.FrameType
) -> ErrorRecord:
    """The error a backward call raised, with the recorder's evidence."""
    record = ErrorRecord(first_line(exc, 400), call.line, call.index)
    record.raised_inside = _raised_inside(recorder, exc)
    record.past_the_loop, record.grad_off = recorder.loop.past_its_end, not torch.is_grad_enabled()
    record.inference = torch.is_inference_mode_enabled()
    kind = error_kind(str(exc))
    freed = call.first_freed or _freed_unread(recorder, call, walked) if kind == "backward a second time" else None
    if freed is not None:
        record.freed_by = freed.freed_by
        live = {
            n.sequence: n
            for n, _ in names_holding_graphs(
                caller, recorder.skipped, recorder.events, recorder.roots, recorder.outermost
            )
        }
        record.reached_through, record.held_now, at = _through(recorder, walked, freed.position, live)
        # the first node an earlier call walked is the first it freed: a name above it lies on this call's way only
        first = call.first_walked_again if call.first_walked_again >= 0 else freed.position
        record.through_walked = call.first_freed is None or at == first
        through = record.reached_through
        record.through_sources = weights_under(walked[at]) if through and 0 <= at < len(walked) else frozenset()
        learners = _learners_frame(caller, recorder.skipped)
        freed_node = walked[freed.position]
        record.parameter_through = _parameter_through(learners, freed_node) if through and learners else None
        record.also_through = tuple(
            live[seq]
            for seq in call.frontier
            if seq in live and through is not None and live[seq].name != through.name and not live[seq].aliases
        )
        record.outer_through = _outer_name(recorder, learners, through) if through and learners else None
        trained = weights_under(walked[0])
        record.only_through = bool(through) and 0 <= at < len(walked) and trained <= record.through_sources
        freer, passes, marks = recorder.calls.record(freed.freed_by), recorder.loop.iteration_passes(), recorder.marks
        # what the loss trains through nodes built in this pass (a harness's run: since its last mark): none, and a
        # detach of the name that carries the old graph leaves it nothing to train
        since = passes[-1].sequence if passes else marks[-1].sequence if marks else None
        record.trains_only_old = bool(trained) and since is not None and not weights_past(walked[0], since)
        if learners is not None and freer is not None:
            record.stepped_between = _optimizer_call_between(freer.site, call.site, learners)
        record.another_trains = _another_trains(recorder, caller, record.through_sources, freed.freed_by, call.index)
        if through is not None and 0 <= at < len(walked):
            record.freed_also_through = _other_ways_in(walked, at, set(call.freed_seen), live)
    elif kind == "in-place version error":
        changed = step_that_changed(recorder, walked)
        if changed is not None:
            record.changed_by_step, record.stale_node = changed
            record.raised_through = _learner_sites(recorder, caller)
            if not _the_losss_own_step(changed[0], call.site):  # else the loss trains what went stale: no detach
                record.stale_through, record.stale_only_through = _detachable(
                    recorder, walked, changed[1], caller, call
                )
        else:
            record.changed_at = changed_in_place(walked, recorder.creation.line_of)
        earlier = recorder.calls.record(call.index - 1) if call.index else None
        learners = _learners_frame(caller, recorder.skipped)
        if record.changed_at is None and earlier is not None and learners is not None:  # SAM's ``first_step``
            record.stepped_between = _optimizer_call_between(earlier.site, call.site, learners)
        if record.changed_by_step is None and record.changed_at is None and record.stepped_between is None:
            passes = recorder.loop.iteration_passes()
            since = passes[-1].sequence if passes else -1
            in_the_raising_code = functools.partial(recorder.creation.call_line_of, site=call.site)
            by_hand = hand_update(walked, in_the_raising_code, call.site, learners, since)
            if by_hand is not None:
                record.changed_by_step, record.stale_node = learner_line_at(*by_hand[0]), by_hand[1]
                record.updated_by_hand = True
    return record


_MOST_OTHER_WAYS = 32  # names looked below, in walk order: an error's one-off cost


def _other_ways_in(
    walked: list[Node], at: int, freed: set[int], live: dict[int, NamedGraph]
) -> tuple[tuple[NamedGraph, frozenset[int]], ...]:
    """The names held now, other than the one at ``walked[at]`` and neither above nor below it, whose graphs reach a
    node of ``freed`` that the name at ``at`` does not: detaching that name alone, the walk still reaches freed
    buffers through them. The nearest the freed buffers of each way, with the weights its graph reaches."""
    through = walked[at]
    under_through = {id(n) for n in python_walk([through])}
    ways: list[tuple[NamedGraph, list[Node]]] = []
    for node in walked[1:]:
        named = live.get(node._sequence_nr())
        if named is None or id(node) in under_through or named.sequence == through._sequence_nr():
            continue
        below = python_walk([node])
        if any(n is through for n in below):
            continue
        if any(n._sequence_nr() in freed and id(n) not in under_through for n in below):
            ways.append((named, below))
        if len(ways) >= _MOST_OTHER_WAYS:
            break
    nearest = [
        (named, below)
        for named, below in ways
        if not any(other is not named and any(n._sequence_nr() == other.sequence for n in below) for other, _ in ways)
    ]
    return tuple((named, weights_in(below)) for named, below in nearest)


def _another_trains(
    recorder: Seen, frame: types.FrameType | None, sources: frozenset[int], freer: int, call: int
) -> bool:
    """Whether an optimizer the learner's frames from ``frame`` out name, other than those that stepped between call
    ``freer`` and ``call``, holds one of the weights ``sources``: the later loss's own optimizer trains them too."""
    between = {recorder.optimizers_seen.get(step.optimizer) for step in recorder.steps if freer < step.calls <= call}
    stepped = {id(optimizer) for reference in between if reference is not None and (optimizer := reference())}
    named = (optimizer for _, optimizer in named_optimizers(frame, recorder.skipped))
    others = (optimizer for optimizer in named if id(unwrapped(optimizer, stepped)) not in stepped)  # a wrapper's too
    return bool(sources) and any(_holds(optimizer, sources) for optimizer in others)


def _holds(optimizer: torch.optim.Optimizer, weights: frozenset[int]) -> bool:
    return any(id(p) in weights for group in optimizer.param_groups for p in group["params"])


def _freed_unread(recorder: Seen, call: CallRecord, walked: list[Node]) -> FreedEarlier | None:
    """The call that freed what ``call`` reached of an earlier iteration, when that call's walk was not read (no
    stamp tells it): a call not read walks its own iteration's graph only, so it is the first such call after the
    newest node of an earlier iteration that ``call`` reached was built."""
    newest = max(call.old, default=None)
    freer, index = None, call.index - 1
    while newest is not None and index >= 0:
        earlier = recorder.calls.record(index)
        if earlier is None:  # a long run's folded call: which one it was is not known
            return None
        if earlier.start <= newest:
            break
        if not earlier.read:
            freer = index
        index -= 1
    position = next((i for i, node in enumerate(walked) if node._sequence_nr() == newest), None)
    return None if freer is None or position is None else FreedEarlier(position, freer)


def _through(
    recorder: Seen, walked: list[Node], position: int, live: dict[int, NamedGraph]
) -> tuple[NamedGraph | None, bool, int]:
    """The name closest above the freed node in the walk: held by a frame now (``bank[0]`` after the loop rebound
    ``hidden``, which held it at the iteration's start), else kept at an event. A name kept at an event that nothing
    holds any more (an item of a list cleared since) gives way to state an object holds now further up the walk
    (a Lightning module's ``self.prev_epoch_mean``, set from that list at the epoch's end); the root (the loss) is
    none of it. Whether the name is that state, and where in the walk it holds the graph, are returned with it.
    ``live``: the names held now, by node."""
    held_now = {n.name for n in live.values()}
    stale: NamedGraph | None = None
    stale_at = position
    reaching = _reaching(walked, position)
    for index in range(position, -1, -1):
        if index not in reaching:  # run before it, off its way: a name of this pass's own (``positions``)
            continue
        sequence = walked[index]._sequence_nr()
        named = live.get(sequence)
        if named is not None and (stale is None or (index > 0 and any(c in named.name for c in ".["))):
            return named, stale is not None, index
        kept = recorder.names.get(sequence) if stale is None else None
        if kept is not None and kept.name in held_now:
            return kept, False, index
        if stale is None and kept is not None:
            stale, stale_at = kept, index
    return (stale, False, stale_at) if stale is not None else (None, False, position)


def _reaching(walked: list[Node], position: int) -> set[int]:
    """The positions in ``walked`` (the engine's order: a node before those it leads to) of the nodes whose graph
    reaches ``walked[position]``, that one included."""
    reaching = {position}
    ways = {id(walked[position])}
    for index in range(position - 1, -1, -1):
        if any(next_node is not None and id(next_node) in ways for next_node, _ in walked[index].next_functions):
            reaching.add(index)
            ways.add(id(walked[index]))
    return reaching


_MAX_KEPT_READ = 256  # as walks lists them: past it the list was cut, and no claim is made that a detach frees all


def _detachable(
    recorder: Seen, walked: list[Node], stale: int, caller: types.FrameType, call: CallRecord
) -> tuple[str | None, bool]:
    """The name held now, nearest the loss, whose graph reaches the ``stale`` node and leads to fewer weights than the
    loss trains: a ``.detach()`` of it leaves the loss its other weights (SAC's ``log_pi``, an actor-critic's
    ``advantage``), where an actor's loss through a stale critic trains the actor only through it (None). And
    whether every node the walk reached whose buffers an earlier backward kept lies in that name's graph: then with
    the detach the loss walks nothing an earlier backward kept."""
    target = next((node for node in walked if node._sequence_nr() == stale), None)
    if target is None or not walked:
        return None, False
    live = {
        n.sequence: n
        for n, _ in names_holding_graphs(caller, recorder.skipped, recorder.events, recorder.roots, recorder.outermost)
    }
    trained = weights_under(walked[0])
    for node in walked[1:]:
        named = live.get(node._sequence_nr())
        if named is None or named.container is not None or "." in named.name:
            continue
        below = python_walk([node])
        if any(reached is target for reached in below):
            leads_to = frozenset(id(n.variable) for n in below if hasattr(n, "variable"))
            if not trained - leads_to or leads_to - _stepped_since(recorder, stale):
                return None, False  # it also trains weights no step changed (an actor through ``q_pi``): keep it
            if step_that_changed(recorder, python_walk([walked[0]], avoiding=node)) is not None:
                return None, False  # another way in reaches weights a step changed (``a`` beside ``b``): still raises
            inside = {n._sequence_nr() for n in below}
            only = len(call.walked_kept) < _MAX_KEPT_READ and all(seq in inside for seq in call.walked_kept)
            return named.name, only
    return None, False


def _stepped_since(recorder: Seen, sequence: int) -> frozenset[int]:
    """The ids of the weights of each optimizer that stepped after node ``sequence`` was built."""
    stepped = {step.optimizer for step in recorder.steps if step.sequence > sequence}
    held = (recorder.optimizers_seen.get(key) for key in stepped)
    optimizers = [optimizer for reference in held if reference is not None and (optimizer := reference()) is not None]
    return frozenset(id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"])


def _optimizer_call_between(
    freed_at: tuple[str, int], raised_at: tuple[str, int], frame: types.FrameType
) -> str | None:
    """The learner's line, between ``freed_at`` and ``raised_at`` in the function ``frame`` runs, that calls a method
    of an optimizer that changes its weights (SAM's ``optimizer.first_step()``, which no ``step()`` hook sees)."""
    filename = raised_at[0]
    tree = parsed(filename) if freed_at[0] == filename == frame.f_code.co_filename else None
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and freed_at[1] < node.lineno < raised_at[1]
            and node.func.attr not in _KEEPS_THE_WEIGHTS
        ):
            continue
        owner = frame.f_locals.get(node.func.value.id, frame.f_globals.get(node.func.value.id))
        if isinstance(owner, torch.optim.Optimizer):
            return learner_line_at(filename, node.lineno)
    return None


_KEEPS_THE_WEIGHTS = frozenset({"zero_grad", "state_dict", "add_param_group", "register_step_pre_hook"})


def _outer_name(recorder: Seen, learners: types.FrameType, through: NamedGraph) -> NamedGraph | None:
    """``through``'s node under a name of the nearest frame of the learner's outside ``learners`` that names it."""
    frame = learners.f_back
    while frame is not None and frame is not recorder.outermost:
        if site_of(frame, recorder.skipped, outward=False)[0]:
            for named, _ in names_holding_graphs(
                frame, recorder.skipped, recorder.events, recorder.roots, recorder.outermost
            ):
                if named.sequence == through.sequence and named.frame != through.frame:
                    return named
        frame = frame.f_back
    return None


def _learners_frame(frame: types.FrameType | None, skipped: tuple[str, ...]) -> types.FrameType | None:
    """The first of the learner's frames from ``frame`` out (torch's ``backward`` is called from theirs)."""
    while frame is not None and not site_of(frame, skipped, outward=False)[0]:
        frame = frame.f_back
    return frame


def _raised_inside(recorder: Seen, exc: BaseException) -> str | None:
    """The innermost of the learner's lines the error passed through inside the backward call (its traceback starts
    at the call): a ``torch.autograd.grad`` or ``backward`` their autograd.Function's backward, or a hook, runs."""
    inside = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if site_of(frame, recorder.skipped, outward=False)[0]:
            inside = (frame.f_code.co_filename, line)
    return learner_line_at(*inside) if inside is not None else None


def _learner_sites(recorder: Seen, frame: types.FrameType | None) -> tuple[tuple[str, int], ...]:
    """(file, line) of each of the learner's frames from ``frame`` out to the watch's, innermost first."""
    sites = []
    while frame is not None:
        site = site_of(frame, recorder.skipped, outward=False)
        if site[0]:
            sites.append(site)
        if frame is recorder.outermost:
            break
        frame = frame.f_back
    return tuple(sites)


def _parameter_through(caller: types.FrameType, freed: Node) -> str | None:
    """The first parameter of the raising function (not a script's or a cell's top level) whose graph reaches the
    ``freed`` node: what every call of that function reads, whatever it was called with."""
    code = caller.f_code
    if not code.co_flags & inspect.CO_OPTIMIZED:
        return None
    count = code.co_argcount + code.co_kwonlyargcount
    for name in code.co_varnames[:count]:
        value = caller.f_locals.get(name)
        node = grad_fn_of(value) if isinstance(value, torch.Tensor) else None
        if node is not None and any(reached is freed for reached in python_walk([node])):
            return name
    return None


def _the_losss_own_step(step_line: str, raised_at: tuple[str, int]) -> bool:
    """Whether the step at ``step_line`` is the first optimizer step after the raising backward at ``raised_at`` in
    its function (AdvGAN's G steps: ``loss_G.backward(); optimizer_G.step()``, the G forward computed once before
    them): an earlier pass's step of the loss's own optimizer changed the weights, which this loss is to train, so it
    must compute them again, not detach them (SAC's alpha loss after the policy's step detaches ``log_pi``)."""
    step = site_of_line(step_line)
    tree = parsed(raised_at[0]) if step is not None and step[0] == raised_at[0] else None
    if tree is None or step is None:
        return False
    function = function_around(tree, raised_at[1])
    steps = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and node.lineno > raised_at[1]
    ]
    return min(steps, default=None) == step[1]


def outside_the_loop(exc: BaseException, loop: Link | None) -> bool:
    """Whether ``exc`` rose outside ``loop``, the iteration loop whose passes ran (after it: ``raise ValueError``
    after training), not from a line of its body or a call made there."""
    if loop is None:
        return False
    tb = exc.__traceback__
    while tb is not None:
        if id(tb.tb_frame) == loop.frame and loop.loop.header <= tb.tb_lineno <= loop.loop.body_last:
            return False
        tb = tb.tb_next
    return True


def raised_at(exc: BaseException, lines: dict[tuple[str, int], str] | None = None) -> str:
    """The learner's line where ``exc`` was raised: from its traceback's innermost frame outward, at the line the
    traceback gives (a frame's own line has moved on where a ``finally:`` ran since)."""
    learners = LearnersCode(skipped_dirs())
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        if learners(frame.f_code):
            return learner_line_at(frame.f_code.co_filename, line)
    return learner_line(raised_in(exc), lines)


def raised_in(exc: BaseException) -> types.FrameType | None:
    """The innermost frame of ``exc``'s traceback (None without one)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame
