"""What a long run's older iterations leave behind: counts, not records, so a watch's memory stays bounded.

A recording keeps one :class:`backward_twice.record.walks.CallRecord` per backward call and one pass start per
iteration. Over a long run (``--iterations 100000``, a whole training) that grows without end, though a steady loop's
middle iterations tell nothing the first and the latest do not. :class:`Folder` folds them: every complete
iteration after the first :data:`KEEP_FIRST` and before the latest :data:`KEEP_LAST` whose calls are *plain* (none
walked an earlier iteration's graph, raised, or reached buffers an earlier call freed) becomes

* counts in the :class:`RetainTally` of each line that called ``retain_graph=True`` (runs, how many were needed
  and by a call of the same iteration, the most bytes kept, one call that needed them), which the verdicts add to
  the records they read;
* a :class:`Fold` in the :class:`CallLog`: a stretch of iterations that each made the same calls at the same lines,
  so a later reference to a folded call (the call that freed buffers an error needed, a late walk into buffers it
  kept) still reads its line and its iteration;
* no pass starts between its first and its last: :class:`backward_twice.record.iterations.Split` reads an iteration
  between two
  kept ends in proportion.

Without a loop of the learner's (a framework's ``fit``), the closing optimizer's steps split the run, and
:class:`StepFolder` folds the same way, the steps standing for the pass starts.

An iteration that is not plain keeps its records: it is the evidence a verdict cites. A loop whose every iteration
walks an earlier one's graph (a carried graph) keeps them all, as the graph itself grows with the run.

Used by :mod:`backward_twice.record.recorder` and :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from backward_twice.record.events import StepEvent
from backward_twice.record.passes import PassStart
from backward_twice.record.walks import CallRecord

__all__ = [
    "KEEP_FIRST",
    "KEEP_LAST",
    "CallLog",
    "Fold",
    "Folder",
    "RetainTally",
    "StepFolder",
    "count_retains",
    "steps_kept",
]

KEEP_FIRST, KEEP_LAST, _BATCH = 32, 32, 64  # iterations kept whole at the start and the end; folded at a time

Site = tuple[str, int]
_CALLS, _OPTIMIZER = operator.attrgetter("calls"), operator.attrgetter("optimizer")  # of a StepEvent


@dataclass(slots=True)
class RetainTally:
    """The ``retain_graph=True`` calls of one line, counted: runs, how many a later call needed (``here``: a call of
    the same iteration), the most bytes the graph held after one, whether any also made a graph, and the first call
    (by index) that needed them in the same iteration and in a later one."""

    first: int
    site: Site
    line: str
    runs: int = 0
    needed: int = 0
    needed_here: int = 0
    held: int = 0
    create_graph: bool = False
    needer_here: int | None = None
    needer_later: int | None = None

    def add(self, other: RetainTally) -> None:
        self.first = min(self.first, other.first)
        self.runs += other.runs
        self.needed += other.needed
        self.needed_here += other.needed_here
        self.held = max(self.held, other.held)
        self.create_graph = self.create_graph or other.create_graph
        self.needer_here = _earliest(self.needer_here, other.needer_here)
        self.needer_later = _earliest(self.needer_later, other.needer_later)


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def count_retains(
    calls: Iterable[CallRecord], same_iteration: Callable[[int, int], bool], tallies: dict[Site, RetainTally]
) -> None:
    """Add each call that kept its graph (as written: ``retain_graph`` or ``create_graph``) and ran to the tally of
    its line; ``same_iteration(call, later)`` tells whether a later call that needed its buffers ran in its
    iteration."""
    for call in calls:
        if not call.retain_graph or call.error is not None:  # the call that raised did not run
            continue
        tally = tallies.get(call.site)
        if tally is None:
            tally = tallies[call.site] = RetainTally(call.index, call.site, call.line)
        tally.runs += 1
        tally.held = max(tally.held, call.held_after_bytes)
        tally.create_graph = tally.create_graph or call.create_graph
        if call.needed_by:
            tally.needed += 1
            here = [n for n in call.needed_by if same_iteration(call.index, n)]
            if here:
                tally.needed_here += 1
                tally.needer_here = _earliest(tally.needer_here, here[0])
            else:
                tally.needer_later = _earliest(tally.needer_later, call.needed_by[0])


@dataclass(frozen=True)
class Fold:
    """Folded iterations ``first`` .. ``first + iterations - 1``, each of which made the calls ``pattern`` ((site,
    line) each, in order); its first call's index is ``calls``."""

    first: int
    iterations: int
    calls: int
    pattern: tuple[tuple[Site, str], ...]

    @property
    def end(self) -> int:
        """The index after its last call."""
        return self.calls + self.iterations * len(self.pattern)


class CallLog:
    """Every backward call of a recording, by index: the records kept, and the folded calls as :class:`Fold`
    stretches and :class:`RetainTally` counts. ``len`` counts both; iterating gives the kept records in order."""

    def __init__(self) -> None:
        self._kept: dict[int, CallRecord] = {}
        self.count = 0  # every call so far, kept or folded: what ``len`` gives
        self.folds: list[Fold] = []
        self.retains: dict[Site, RetainTally] = {}  # the folded calls' retains, by line
        self._needed_late: set[int] = set()  # folded calls a later call needed

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[CallRecord]:
        return iter(self._kept.values())

    def __getitem__(self, index: int) -> CallRecord:
        found = self.get(index + self.count if index < 0 else index)
        if found is None:
            raise IndexError(index)
        return found

    @property
    def kept(self) -> int:
        return len(self._kept)

    def append(self, call: CallRecord) -> None:
        self._kept[call.index] = call
        self.count = call.index + 1

    def record(self, index: int) -> CallRecord | None:
        """The call's record, if it was kept (not folded)."""
        return self._kept.get(index)

    def plain_records(self, start: int, end: int) -> list[CallRecord] | None:
        """The records of calls ``start`` .. ``end - 1`` if each was kept and is plain (walked nothing of an earlier
        iteration, raised nothing, met no freed buffer): what a fold may count; else None."""
        kept, records = self._kept, []
        for index in range(start, end):
            call = kept.get(index)
            if call is None or call.old or call.error is not None or call.first_freed is not None:
                return None
            records.append(call)
        return records

    def get(self, index: int) -> CallRecord | None:
        """The call's record; a folded call's stands in with its line and nothing else (None: no such call)."""
        kept = self._kept.get(index)
        if kept is not None:
            return kept
        fold = self._fold_of(index)
        if fold is None:
            return None
        site, line = fold.pattern[(index - fold.calls) % len(fold.pattern)]
        return CallRecord(index, site, line, "backward", False, False, 0, 0)

    def _fold_of(self, index: int) -> Fold | None:
        folds = [f for f in self.folds if f.pattern]  # iterations without a call hold no index
        position = bisect.bisect_right([f.calls for f in folds], index) - 1
        if position < 0 or index >= folds[position].end:
            return None
        return folds[position]

    def needed_later(self, index: int, by: int) -> None:
        """A later call (``by``) walked buffers that folded call ``index`` kept: count it with its line's retains."""
        fold = self._fold_of(index)
        if fold is None or index in self._needed_late:
            return
        self._needed_late.add(index)
        site, line = fold.pattern[(index - fold.calls) % len(fold.pattern)]
        tally = self.retains.setdefault(site, RetainTally(index, site, line))
        tally.needed += 1
        tally.needer_later = _earliest(tally.needer_later, by)

    def fold(self, first: int, calls: list[CallRecord], per_iteration: int, iterations: int) -> bool:
        """Fold ``calls``, every call of ``iterations`` iterations from ``first`` on (``per_iteration`` each, at the
        same lines in each). True when they continue the last fold (no pass start is needed between them)."""
        pattern = tuple((c.site, c.line) for c in calls[:per_iteration])
        start = calls[0].index if calls else -1
        if calls:
            same = lambda a, b: (a - start) // per_iteration == (b - start) // per_iteration  # noqa: E731
            count_retains(calls, same, self.retains)
        for call in calls:
            del self._kept[call.index]
        last = self.folds[-1] if self.folds else None
        continues = last is not None and last.pattern == pattern and last.first + last.iterations == first
        if last is not None and continues and (not calls or last.end == start):
            self.folds[-1] = dataclasses.replace(last, iterations=last.iterations + iterations)
            return True
        self.folds.append(Fold(first, iterations, start, pattern))
        return False


@dataclass(slots=True)
class Folder:
    """Folds a long run's plain iterations as the run goes (see the module's docstring): pass starts before
    ``position`` and iterations up to ``through`` are settled, folded or kept whole. A pass start stays where the
    split needs it to read an iteration exactly: the end of an iteration kept whole, a pass where the names were
    read (:attr:`backward_twice.record.passes.PassStart.looked`), and wherever the number of nodes an iteration builds
    changes (between two kept ends, iterations are read in proportion)."""

    position: int = 0
    through: int = KEEP_FIRST
    last_kind: tuple[tuple[Site, ...], int] | None = None  # the lines and node count of the last folded stretch

    def due(self, passes: list[PassStart]) -> bool:
        """Whether a batch of iterations is ready to fold: checked at each new pass, in constant time."""
        return bool(passes) and passes[-1].number - KEEP_LAST - self.through >= _BATCH

    def fold(self, log: CallLog, passes: list[PassStart]) -> None:
        """Fold the plain iterations after ``through`` and before the latest :data:`KEEP_LAST`."""
        limit = passes[-1].number - KEEP_LAST
        first = self.position
        while first < len(passes) and passes[first].number <= self.through:
            first += 1
        kept: list[PassStart] = []
        stretch: list[tuple[PassStart, list[CallRecord]]] = []  # plain iterations in a row, of one kind
        kind: tuple[tuple[Site, ...], int] | None = None

        def close() -> None:
            if stretch:
                calls = [c for _, records in stretch for c in records]
                opened = stretch[0][0]
                extended = log.fold(opened.number, calls, len(stretch[0][1]), len(stretch))
                if not extended or kind != self.last_kind or opened.looked:
                    kept.append(opened)
                self.last_kind = kind
                stretch.clear()

        position = first
        while position < len(passes) - 1 and passes[position].number <= limit:
            start, after = passes[position], passes[position + 1]
            calls = log.plain_records(start.calls, after.calls) if after.number == start.number + 1 else None
            if calls is not None:
                this = (tuple([c.site for c in calls]), after.sequence - start.sequence)
                if stretch and (this != kind or start.looked):
                    close()
                kind = this
                stretch.append((start, calls))
            else:
                close()
                self.last_kind = None
                kept.append(start)
            position += 1
        close()
        passes[first:position] = kept
        self.position = first + len(kept)
        self.through = passes[self.position].number - 1 if self.position < len(passes) else limit


def steps_kept(steps: list[StepEvent], log: CallLog, ends: set[int] | None = None) -> list[StepEvent]:
    """The optimizer steps of the iterations kept whole (a step after a folded iteration's last call is that
    iteration's), and each optimizer's last: with the loop's passes to split the run, the evidence reads only an
    optimizer's last step. ``ends``: when the steps split the run, the closing optimizer's steps that still end a
    kept iteration (by their positions), kept whatever their calls. The steps are in call order, as the folds are:
    each fold's steps are found by bisection, and only those are read one by one."""
    ranges = []
    for fold in log.folds:
        if fold.pattern:
            low, high = (
                bisect.bisect_right(steps, fold.calls, key=_CALLS),
                bisect.bisect_right(steps, fold.end, key=_CALLS),
            )
            if low < high:
                ranges.append((low, high))
    if not ranges:
        return steps
    later: set[int] = set()  # the optimizers that step after the position at hand: a step of no other is kept
    pieces: list[list[StepEvent]] = []  # from the last on
    end = len(steps)
    for low, high in reversed(ranges):
        pieces.append(steps[high:end])
        later.update(map(_OPTIMIZER, steps[high:end]))
        for position in range(high - 1, low - 1, -1):
            step = steps[position]
            if step.optimizer not in later or (ends is not None and position in ends):
                pieces.append([step])
            later.add(step.optimizer)
        end = low
    pieces.append(steps[:end])
    return list(itertools.chain.from_iterable(reversed(pieces)))


@dataclass(slots=True)
class StepFolder:
    """Folds a run the optimizer steps split (a framework's loop: no loop of the learner's encloses its backward
    calls) as :class:`Folder` folds a loop's passes: the closing optimizer's steps stand for the pass starts (step
    N ends iteration N), and the optimizer is fixed at the first fold (``closing``: the split reads it from here)."""

    folder: Folder = dataclasses.field(default_factory=Folder)
    closing: int | None = None

    def after_step(
        self, log: CallLog, steps: list[StepEvent], first: dict[int, int], start: int, read: int
    ) -> list[StepEvent]:
        """After the step ``steps[-1]``: the steps to keep, a batch of older iterations folded when one is due.
        ``first``: each optimizer's first event (the closing optimizer is the split's, the one whose first step came
        last); ``start``: the sequence counter where the run began; ``read``: the sightings so far."""
        closing = self.closing if self.closing is not None else max(first, key=first.__getitem__)
        step = steps[-1]
        if step.optimizer != closing or step.number + 1 - KEEP_LAST - self.folder.through < _BATCH:
            return steps
        return self.fold(log, steps, closing, start, read)

    def fold(self, log: CallLog, steps: list[StepEvent], closing: int, start: int, read: int) -> list[StepEvent]:
        """Fold the plain iterations ``steps`` split and return the steps to keep. An iteration in which the names
        were read keeps both its ends, so the sightings keep their iterations exactly."""
        self.closing = closing
        closers = [position for position, step in enumerate(steps) if step.optimizer == closing]
        # the sightings bounding each iteration: iteration j's reads are bounds[j - 1] .. bounds[j] - 1
        bounds = [0, *(read if steps[p].sighting < 0 else steps[p].sighting for p in closers), read]
        reads = [False, *(bounds[j] > bounds[j - 1] for j in range(1, len(bounds)))]
        passes = [PassStart(start, 0, 0, 1, reads[1])]
        for j, position in enumerate(closers, 2):  # step j - 1 opens iteration j: its start, iteration j - 1's end
            step = steps[position]
            passes.append(
                PassStart(step.sequence, step.calls, bounds[j - 1], step.number + 1, reads[j] or reads[j - 1])
            )
        self.folder.fold(log, passes)
        ends = {opened.number - 1 for opened in passes[1:]}  # the closing steps that still end a kept iteration
        return steps_kept(steps, log, {p for p in closers if steps[p].number in ends})
