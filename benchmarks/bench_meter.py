"""What SavedTensorMeter costs: growth with live graphs, overhead per step, and the profiler for scale.

Prints figures and whether each target is met; asserts nothing (``make bench``). Built for a shared
2-core machine, where the speed of the same loop drifts by tens of percent within seconds: the
variants being compared run interleaved, one iteration or step of each in turn (rotating order), so
a drift hits them alike; figures are medians with their interquartile range. Times are the CPU
time of this thread (``time.thread_time``; torch runs on one thread), so time spent waiting for a
core that other work holds is not counted. The meter is never read inside a timed loop.

a. Growth: ``retain_graph=True`` with every loss kept in a list, 300 iterations of a two-head MLP,
   with and without the meter. A meter whose per-tensor cost grew with the live saved tensors
   would make its last block of 50 iterations slower than its first. Also the same loop with the
   second loss backwarded plainly each iteration (freeing its head's and the shared trunk's
   buffers) while every class loss is kept: buffers are freed every iteration while hundreds of
   saved tensors are alive, which is what a scan of all storages on release would make slower.
   Target: the meter's last/first block ratio within 0.05 of the plain loop's.
b. Overhead on a compute-bound step (an MLP, batch 128). Target: median paired ratio <= 1.05.
c. Overhead on a step of tiny operations (20 small Linear+ReLU layers), where the fixed cost per
   saved tensor dominates: the meter against identity saved-tensor hooks (the least any hooks
   cost) and against no hooks. Target: meter / identity hooks <= 1.15.
d. torch.profiler with ``profile_memory=True`` on the same tiny step, for scale.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from backward_twice import SavedTensorMeter

GROWTH_ITERATIONS, BLOCK, GROWTH_REPEATS = 300, 50, 3
MLP_PAIRS = 300
TINY_ROUNDS = 500
PROFILER_ROUNDS, PROFILER_STEPS = 20, 10
clock = time.thread_time


def median_iqr(values: list[float]) -> tuple[float, float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return statistics.median(values), q1, q3


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def interleaved(
    step: Callable[[str], None],
    names: list[str],
    rounds: int,
    steps: int = 1,
    around: dict[str, Callable[[], contextlib.AbstractContextManager]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per step of each variant in each round; the variants' order rotates every round."""
    for name in names:  # warm up every path
        for _ in range(5):
            step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            context = (around or {}).get(name, contextlib.nullcontext)()
            start = clock()
            with context:
                for _ in range(steps):
                    step(name)
            times[name].append((clock() - start) / steps)
    return times


def paired(times: dict[str, list[float]], top: str, bottom: str) -> tuple[float, float, float]:
    return median_iqr([a / b for a, b in zip(times[top], times[bottom])])


# -- a. growth ---------------------------------------------------------------------------------


def growth_loop(
    meter: SavedTensorMeter | None,
    second_loss_freed: bool,
    width: int = 256,
    batch: int = 64,
    after_forward: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """One iteration of the retain-and-keep loop as a function, and the list that keeps the losses.

    The trunk is Linear(32, width)-ReLU-Linear(width, width)-ReLU, the heads Linear(width, 10) with
    cross-entropy and Linear(width, 1) with MSE; SGD. tests/test_meter.py runs it small, with
    ``after_forward`` handed both losses before any backward (where its ground truth walks them).
    The forward runs in a helper, so no local variable holds an activation during backward.
    """
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()
    )
    head_class, head_value = torch.nn.Linear(width, 10), torch.nn.Linear(width, 1)
    params = [*trunk.parameters(), *head_class.parameters(), *head_value.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    inputs, labels, targets = torch.randn(batch, 32), torch.randint(0, 10, (batch,)), torch.randn(batch, 1)
    history: list[torch.Tensor] = []

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        with meter if meter is not None else contextlib.nullcontext():
            features = trunk(inputs)
            return F.cross_entropy(head_class(features), labels), F.mse_loss(head_value(features), targets)

    def iteration() -> None:
        optimizer.zero_grad()
        loss_class, loss_value = forward()
        if after_forward is not None:
            after_forward(loss_class, loss_value)
        if second_loss_freed:
            # Frees the value head's buffers and the trunk's (nodes both losses share); what the
            # class head saved stays with the kept class loss.
            loss_class.backward(retain_graph=True)
            loss_value.backward()
            history.append(loss_class)
        else:
            loss = loss_class + loss_value
            loss.backward(retain_graph=True)
            history.append(loss)
        optimizer.step()

    return iteration, history


def growth(second_loss_freed: bool) -> list[float]:
    """Prints block times of both loops per repeat; returns the meter-minus-plain ratio differences."""
    title = (
        "every loss kept, the value loss freed each iteration"
        if second_loss_freed
        else "every loss kept (history.append(loss))"
    )
    print(
        f"\na. Growth, retain_graph=True, {title}: {GROWTH_ITERATIONS} iterations, "
        f"one of each loop in turn; median ms per block of {BLOCK}"
    )
    differences = []
    for repeat in range(GROWTH_REPEATS):
        gc.collect()
        meter = SavedTensorMeter()
        loops = {"plain": growth_loop(None, second_loss_freed)[0], "meter": growth_loop(meter, second_loss_freed)[0]}
        times: dict[str, list[float]] = {"plain": [], "meter": []}
        for i in range(GROWTH_ITERATIONS):
            for name in ("plain", "meter") if (i + repeat) % 2 else ("meter", "plain"):
                start = clock()
                loops[name]()
                times[name].append(clock() - start)
        blocks = {
            name: [statistics.median(t[k : k + BLOCK]) * 1e3 for k in range(0, GROWTH_ITERATIONS, BLOCK)]
            for name, t in times.items()
        }
        ratios = {name: b[-1] / b[0] for name, b in blocks.items()}
        differences.append(ratios["meter"] - ratios["plain"])
        per_iteration = [m / p for m, p in zip(times["meter"], times["plain"])]
        paired_blocks = [statistics.median(per_iteration[k : k + BLOCK]) for k in range(0, GROWTH_ITERATIONS, BLOCK)]
        print(f"  repeat {repeat + 1} ({meter.saved_tensors} saved tensors alive at the end):")
        for name in ("plain", "meter"):
            print(f"    {name:5s} {' '.join(f'{v:6.3f}' for v in blocks[name])}   last/first {ratios[name]:.3f}")
        print(
            f"    meter/plain per iteration, block medians {' '.join(f'{v:.3f}' for v in paired_blocks)}; "
            f"difference of last/first ratios (meter - plain) {differences[-1]:+.3f}"
        )
        del loops
    return differences


# -- b. compute-bound step ---------------------------------------------------------------------


def mlp_overhead() -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(128, 256), torch.randint(0, 10, (128,))
    meter = SavedTensorMeter()
    contexts: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "meter": lambda: meter,
    }

    def step(name: str) -> None:
        optimizer.zero_grad()
        with contexts[name]():
            loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()

    times = interleaved(step, list(contexts), MLP_PAIRS)
    ratio, q1, q3 = paired(times, "meter", "plain")
    print(f"\nb. Overhead, MLP training step (batch 128, 256-512-512-10), {MLP_PAIRS} steps of each in turn")
    for name in contexts:
        print(f"  {name:6s} {statistics.median(times[name]) * 1e3:.3f} ms/step (median)")
    print(
        f"  meter / plain: {ratio:.3f} (median of paired steps; interquartile {q1:.3f}-{q3:.3f}); "
        f"target <= 1.05: {verdict(ratio <= 1.05)}"
    )
    return ratio


# -- c, d. tiny-op step ------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """The profiler's C++ side prints two lines to stderr per session; hide them."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def tiny_overhead() -> float:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(20):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(16, 32)
    meter = SavedTensorMeter()

    def identity_hooks() -> torch.autograd.graph.saved_tensors_hooks:
        # Pack stores a detached tensor: keeping the one it is handed (which carries its grad_fn)
        # would leak every graph (see the field notes).
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t)

    def profiler() -> torch.profiler.profile:
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)

    contexts: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "identity hooks": identity_hooks,
        "meter": lambda: meter,
        "profiler": contextlib.nullcontext,
    }

    def step(name: str) -> None:
        optimizer.zero_grad()
        with contexts[name]():
            loss = model(inputs).pow(2).mean()
        loss.backward()
        optimizer.step()

    times = interleaved(step, ["plain", "identity hooks", "meter"], TINY_ROUNDS)
    # A profiling session has a start and stop cost, so the profiler runs whole rounds of steps,
    # paired with rounds of plain steps.
    with quiet_stderr():
        profiled = interleaved(
            step, ["plain", "profiler"], PROFILER_ROUNDS, PROFILER_STEPS, around={"profiler": profiler}
        )
    with meter:
        loss = model(inputs).pow(2).mean()
    per_step = meter.saved_tensors
    del loss
    print(
        f"\nc. Overhead, tiny-op step (20 x Linear(32, 32)+ReLU, batch 16, {per_step} saved tensors per step), "
        f"{TINY_ROUNDS} steps of each in turn"
    )
    for name in ("plain", "identity hooks", "meter"):
        print(f"  {name:15s} {statistics.median(times[name]) * 1e3:7.3f} ms/step (median)")
    target, q1, q3 = paired(times, "meter", "identity hooks")
    print(
        f"  meter / identity hooks: {target:.3f} (median of paired steps; interquartile {q1:.3f}-{q3:.3f}); "
        f"target <= 1.15: {verdict(target <= 1.15)}"
    )
    for top, bottom in (("meter", "plain"), ("identity hooks", "plain")):
        ratio, q1, q3 = paired(times, top, bottom)
        print(f"  {top} / {bottom}: {ratio:.3f} (interquartile {q1:.3f}-{q3:.3f})")
    ratio, q1, q3 = paired(profiled, "profiler", "plain")
    print(
        f"d. torch.profiler(profile_memory=True) on the same step, {PROFILER_ROUNDS} rounds of "
        f"{PROFILER_STEPS} steps, one session per round (its start and stop included):"
    )
    print(
        f"  profiler {statistics.median(profiled['profiler']) * 1e3:.3f} ms/step (median); "
        f"profiler / plain: {ratio:.3f} (interquartile {q1:.3f}-{q3:.3f})"
    )
    return target


def main() -> None:
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    start = time.perf_counter()
    kept = growth(second_loss_freed=False)
    freed = growth(second_loss_freed=True)
    mlp = mlp_overhead()
    tiny = tiny_overhead()
    print("\nTargets")
    for label, differences in (("a. growth, losses kept", kept), ("a. growth, value loss freed", freed)):
        middle = statistics.median(differences)
        print(
            f"  {label}: meter - plain last/first ratio {middle:+.3f} (median of {len(differences)} repeats: "
            f"{', '.join(f'{d:+.3f}' for d in differences)}); target within 0.05: {verdict(abs(middle) <= 0.05)}"
        )
    print(f"  b. MLP step, meter / plain {mlp:.3f}; target <= 1.05: {verdict(mlp <= 1.05)}")
    print(f"  c. tiny-op step, meter / identity hooks {tiny:.3f}; target <= 1.15: {verdict(tiny <= 1.15)}")
    print(f"Wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
