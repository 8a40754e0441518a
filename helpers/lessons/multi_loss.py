"""What only notebook 02_multi_loss uses: loop bodies measured for memory and time, and its exercise checks.

:func:`growth_experiment` takes loop bodies written in the notebook, ``body(state)``, where ``state``
lives as long as the loop (``state.history`` a list, ``state.total`` starting at ``0.0``), and runs
each twice, in separate runs, so the instrument never enters the figure it explains: a **bytes run**
inside a :class:`SavedTensorMeter` (graph-only bytes after every iteration and the autograd nodes its
backward calls walked, exact integers, the same on every machine) and a **time run** without it, the
bodies' iterations interleaved round-robin so a machine's slow drifts hit all alike. The checks: a two-loss loop that keeps no graph into the next
batch (exercise 1), and both losses' gradients in one pass (exercise 2).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from helpers.checks import (
    SECOND_CALL,
    CheckResult,
    Rejected,
    checked,
    gradient_problem,
    gradients_or_zeros,
    loop_passed,
    run_answer,
    run_loop,
)
from helpers.display import PngFigure, Table, format_bytes
from helpers.measure import profiler_peak_bytes, time_round_robin
from helpers.meter import SavedTensorMeter

__all__ = ["check_backward_both", "check_two_loss_loop", "growth_experiment"]

Body = Callable[[SimpleNamespace], object]
WARM_UP_ITERATIONS = 3


def new_loop_state() -> SimpleNamespace:
    """What one loop keeps across its iterations: ``history`` (a list) and ``total`` (``0.0``)."""
    return SimpleNamespace(history=[], total=0.0)


@dataclass
class GrowthResult:
    """Per body name and iteration: graph-only bytes and the autograd nodes its backward calls walked
    (bytes run, exact counts), and seconds (time run).

    Used by notebook 02_multi_loss.
    """

    iterations: int
    block: int
    graph_only_bytes: dict[str, list[int]] = field(default_factory=dict)
    backward_nodes: dict[str, list[int]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The bodies, in the order they were given."""
        return list(self.graph_only_bytes)

    def grows(self, name: str) -> bool:
        """True when the graph-only bytes after the last iteration exceed those after the first."""
        values = self.graph_only_bytes[name]
        return values[-1] > values[0]

    def growth_per_iteration(self, name: str) -> int:
        """Graph-only bytes added per iteration, averaged over the run and rounded down (0 when flat)."""
        values = self.graph_only_bytes[name]
        return (values[-1] - values[0]) // max(1, len(values) - 1)

    def block_milliseconds(self, name: str) -> list[float]:
        """The fastest iteration's milliseconds in each block of ``block`` consecutive iterations.

        The fastest rather than the median: other work on the machine only ever adds time, so the
        fastest iteration of a block is the one least disturbed by it.
        """
        times = self.seconds[name]
        return [min(times[start:start + self.block]) * 1e3
                for start in range(0, len(times) - self.block + 1, self.block)]

    def slowdown(self, name: str) -> float:
        """The last block's fastest iteration over the first block's (1.0: no slowdown)."""
        blocks = self.block_milliseconds(name)
        return blocks[-1] / blocks[0]

    def table(self, timing: bool = True) -> Table:
        """Per body: graph-only bytes at the end and per iteration; with ``timing``, the first and last
        block's fastest iteration and their ratio (machine-dependent, so leave it out where
        a notebook's output must be the same on every machine)."""
        headers = ["loop body", "graph-only bytes at the end", "growth per iteration"]
        if timing:
            headers += [f"ms/iteration, first {self.block}", f"ms/iteration, last {self.block}", "last / first"]
        rows = []
        for name in self.names:
            row: list[object] = [name, format_bytes(self.graph_only_bytes[name][-1]),
                                 format_bytes(self.growth_per_iteration(name))]
            if timing:
                blocks = self.block_milliseconds(name)
                row += [f"{blocks[0]:.2f}", f"{blocks[-1]:.2f}", f"{blocks[-1] / blocks[0]:.2f}"]
            rows.append(row)
        return Table(headers, rows)

    def chart(self) -> Figure:
        """Graph-only MiB per iteration (bytes run) and each block's fastest ms (time run), one line per body."""
        figure = PngFigure(figsize=(10, 3.4), dpi=90)
        memory_axes, time_axes = figure.subplots(1, 2)
        # Line styles as well as colours: bodies that grow alike draw on top of each other.
        styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1))]
        for index, name in enumerate(self.names):
            style = styles[index % len(styles)]
            values = self.graph_only_bytes[name]
            memory_axes.plot(range(1, len(values) + 1), [v / 2**20 for v in values], label=name, linestyle=style,
                             linewidth=2)
            blocks = self.block_milliseconds(name)
            centres = [self.block * i + self.block / 2 for i in range(len(blocks))]
            time_axes.plot(centres, blocks, label=name, linestyle=style, marker="o", markersize=3)
        memory_axes.set_xlabel("iteration")
        memory_axes.set_ylabel("graph-only MiB")
        memory_axes.set_title("Memory kept alive by graphs (meter run)")
        time_axes.set_xlabel("iteration")
        time_axes.set_ylabel(f"ms per iteration (fastest of {self.block})")
        time_axes.set_title("Time per iteration (run without meter)")
        time_axes.set_ylim(bottom=0)
        memory_axes.legend(fontsize=8)
        figure.tight_layout()
        return figure


def _check_arguments(bodies: object, iterations: object, block: object) -> None:
    if not isinstance(bodies, Mapping) or not bodies:
        raise TypeError("growth_experiment() takes a non-empty dict of name -> loop body function.")
    for name, body in bodies.items():
        if not callable(body):
            raise TypeError(f"Loop body {name!r} is a {type(body).__name__}, not a function of one argument (state).")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 2:
        raise ValueError(f"iterations must be a whole number of at least 2, not {iterations!r}.")
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= iterations:
        raise ValueError(f"block must be a whole number from 1 to iterations ({iterations}), not {block!r}.")


def _reachable_nodes(roots: Sequence[torch.Tensor]) -> int:
    """How many autograd nodes a backward from ``roots`` walks: every node reachable from their grad_fn."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return len(seen)


@contextlib.contextmanager
def _counting_backward_nodes(walked: list[int]) -> Iterator[None]:
    """Inside: each ``backward()`` first appends to ``walked`` the number of nodes it is about to walk."""
    original = torch.autograd.backward

    def counting(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        walked.append(_reachable_nodes([tensors] if isinstance(tensors, torch.Tensor) else list(tensors)))
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = counting
    try:
        yield
    finally:
        torch.autograd.backward = original


def growth_experiment(
    bodies: Mapping[str, Body],
    iterations: int = 100,
    block: int | None = None,
    progress: bool = True,
) -> GrowthResult:
    """Run each loop body ``iterations`` times, once for bytes (with the meter) and once for time (without).

    Each body is called as ``body(state)``, with a fresh ``state`` per body and per run
    (``state.history == []``, ``state.total == 0.0``); everything a body kept is dropped before the
    next run. The time run calls every body :data:`WARM_UP_ITERATIONS` times untimed first, then
    interleaves them (:func:`helpers.measure.time_round_robin`). ``block`` (default: a tenth of the
    iterations) is the block size for the per-block figures of :class:`GrowthResult`.

    Used by notebook 02_multi_loss.
    """
    block = max(1, iterations // 10) if block is None and isinstance(iterations, int) else block
    _check_arguments(bodies, iterations, block)
    assert block is not None
    result = GrowthResult(iterations, block)
    bar = tqdm(total=iterations * len(bodies), desc="bytes run", disable=not progress, leave=True)
    for name, body in bodies.items():
        meter, state, memory, nodes = SavedTensorMeter(), new_loop_state(), [], []
        for _ in range(iterations):
            walked: list[int] = []
            with meter, _counting_backward_nodes(walked):
                body(state)
            memory.append(meter.graph_only_bytes)
            nodes.append(sum(walked))
            bar.update()
        result.graph_only_bytes[name] = memory
        result.backward_nodes[name] = nodes
        del state
    for body in bodies.values():
        warm = new_loop_state()
        for _ in range(WARM_UP_ITERATIONS):
            body(warm)
        del warm
    bar.close()
    states = {name: new_loop_state() for name in bodies}
    result.seconds = time_round_robin({name: functools.partial(body, states[name]) for name, body in bodies.items()},
                                      iterations, progress=progress, desc="time run")
    del states
    if progress:
        print(f"Ran {iterations} iterations of each of {len(bodies)} loop bodies, once with the meter "
              "(bytes) and once without (time).")
    return result


# -- exercise checks -------------------------------------------------------------------------------

class _TwoHeads(torch.nn.Module):
    """The checks' own copy of notebook 02's model (smaller): a shared trunk, a classifier and a regressor."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                         torch.nn.ReLU())
        self.classify = torch.nn.Linear(128, 4)
        self.regress = torch.nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(x)
        return self.classify(features), self.regress(features)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _two_head_setup(batches: int) -> tuple[_TwoHeads, list[Batch], list[tuple[list[torch.Tensor], ...]]]:
    """The network, its batches, and per batch (gradient of l1, gradient of l2, [l1 + l2 as a number])."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # inside the check's fork_rng
    net = _TwoHeads()
    data = [(torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator),
             torch.randn(64, 1, generator=generator)) for _ in range(batches)]
    params, parts = list(net.parameters()), []
    for batch in data:  # autograd.grad leaves .grad untouched
        l1, l2 = _two_losses(net, *batch)
        g1 = torch.autograd.grad(l1, params, retain_graph=True, materialize_grads=True)
        g2 = torch.autograd.grad(l2, params, materialize_grads=True)
        parts.append((list(g1), list(g2), [l1.item() + l2.item()]))
    return net, data, parts


def _two_losses(net: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits, value = net(x)
    return F.cross_entropy(logits, labels), F.mse_loss(value, targets)


def _add(*gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [sum(parts, torch.zeros(())) for parts in zip(*gradients)]


@checked
def check_two_loss_loop(train: Callable[[torch.nn.Module, list[Batch]], list[float]]) -> CheckResult:
    """Exercise 1: the given loop's gradients, l1 + l2 as numbers, one graph at a time.

    Used by notebook 02_multi_loss.

    The given loop adds the gradients of l1 + l2 over all batches into ``.grad`` and zeroes nothing, so
    the check runs ``train`` twice on one network and the second call must add to what the first left.
    During the loop the graph-only bytes may reach what retaining on the first backward needs (l1's
    head lives until l1 is reassigned), both measured here, but not two whole graphs.
    """
    net, data, parts = _two_head_setup(batches=4)
    params, meter = list(net.parameters()), SavedTensorMeter()
    total = _add(*(_add(g1, g2) for g1, g2, _ in parts))

    def peak_of(backward: Callable[[torch.Tensor, torch.Tensor], Any]) -> int:
        meter.reset_peak()
        with meter:
            for batch in data:
                l1, l2 = _two_losses(net, *batch)  # alive until the next batch's forward, as in the learner's loop
                backward(l1, l2)
            del l1, l2
        net.zero_grad(set_to_none=True)
        return meter.peak_graph_only_bytes

    one_graph = peak_of(lambda l1, l2: (l1 + l2).backward())
    retained_first = peak_of(lambda l1, l2: (l1.backward(retain_graph=True), l2.backward()))
    limit = (retained_first + 2 * one_graph) / 2  # halfway to two whole graphs alive at once
    store = "Append (l1 + l2).item() or l1.item() + l2.item(): plain numbers."
    hints = ("Both losses share the trunk: the first backward through it must keep the buffers.", store, store,
             "Which backward is the last one through each graph? It should not retain.",
             "A graph retained by its last backward keeps all its buffers until l1 and l2 are reassigned, in the next "
             "batch's forward.")
    had_tensors, graphs = False, 0.0
    for call in range(2):
        where = SECOND_CALL if call else ""
        before = gradients_or_zeros(params)
        tensors, peak = run_loop(train, (net, data), meter, [s for *_, (s,) in parts],
                                  lambda i: f"l1 + l2 of batch {i}", where, hints, one_graph, limit)
        known = ({"those of l1 alone": _add(*(g1 for g1, _, _ in parts)),
                  "those of l2 alone": _add(*(g2 for _, g2, _ in parts)),
                  "those of the last batch alone": _add(*parts[-1][:2])} if call == 0 else
                 {"those of this call alone (what .grad held was discarded)": total})
        if problem := gradient_problem(params, _add(before, total), "the gradient of l1 + l2 summed over the "
                                        "batches" + (" added to what .grad held" if call else ""), known):
            raise Rejected(problem, "Backpropagate both losses once per batch, and do not zero .grad: the given "
                                     "loop adds up every batch's.", where)
        had_tensors, graphs = had_tensors or tensors, max(graphs, peak)
    return loop_passed("Right gradients, added up over both calls, numbers in the history, and {memory} alive at once.",
                   graphs, had_tensors)


@checked
def check_backward_both(backward_both: Callable[[torch.Tensor, torch.Tensor], None]) -> CheckResult:
    """Exercise 2: l1 + l2's gradient added to .grad, no buffers left, one backward's peak.

    Used by notebook 02_multi_loss.

    Calls the answer on two fresh pairs of losses; the second time ``.grad`` holds the first call's
    gradients, and the new ones must be added. After each call, while the check still holds l1 and l2,
    the meter must read no buffers. Then torch.profiler's allocation peak of a whole step with the
    answer (``.grad`` empty) may exceed that of ``(l1 + l2).backward()`` by at most 10 %: the peaks are
    byte counts that repeat exactly run to run, and the lowest of two runs each is compared.
    """

    net, data, ((g1, g2, _),) = _two_head_setup(batches=1)
    params, meter, total, walks = list(net.parameters()), SavedTensorMeter(), _add(g1, g2), []
    net.trunk[0].weight.register_hook(lambda grad: walks.append(1))  # once per backward pass through the trunk
    for call in range(2):
        where = SECOND_CALL if call else ""
        before = gradients_or_zeros(params)
        with meter:
            l1, l2 = _two_losses(net, *data[0])
        walks.clear()
        run_answer(backward_both, l1, l2, who="your function", where=where, hint="The two losses share the trunk's buffers.")
        known = ({"those of l1 alone": g1, "those of l2 alone": g2} if call == 0 else
                 {"those of this call alone (what .grad held was discarded)": total})
        if problem := gradient_problem(params, _add(before, total), "the gradient of l1 + l2"
                                        + (" added to what .grad held" if call else ""), known):
            raise Rejected(problem, "", where)
        if left := meter.graph_only_bytes:
            raise Rejected(
                f"right gradients, but while l1 and l2 are still referenced the graph holds {format_bytes(left)} "
                "of buffers after your function.", "Buffers survive a backward that retains, and buffers off the last "
                "backward's path: a backward frees only what it walks through. One backward through everything frees "
                "it all.", where)
        del l1, l2
    trunk_walks, peaks = len(walks), []
    for answer in (lambda l1, l2: (l1 + l2).backward(), backward_both):
        runs = []
        for _ in range(2):
            net.zero_grad(set_to_none=True)
            runs.append(profiler_peak_bytes(lambda: run_answer(answer, *_two_losses(net, *data[0]), who="your function")))
        peaks.append(min(runs))
    if peaks[1] > 1.1 * peaks[0]:
        walked = (f": your function backpropagated through the shared trunk {trunk_walks} times, and each pass "
                  "allocates the trunk's gradients again" if trunk_walks > 1 else "")
        return CheckResult(False, "Right gradients and no buffers left, but your step's peak allocation "
                                  f"(torch.profiler) is more than 1.1x that of one backward of l1 + l2{walked}.",
                           "Can you do it in one backward pass?")
    return CheckResult(True, "Right gradients, added to .grad on both calls, no buffers left, and a peak allocation "
                             "within 10% of one backward of l1 + l2.")
