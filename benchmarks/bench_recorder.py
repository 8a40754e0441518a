"""What watching a loop costs: the recorder (``watch()``) against the bare loop, and ``diagnose(step)`` against one
bare step. Prints the ratios with the number of runs behind each; asserts nothing (``make bench``).

Built for a shared 2-core machine: the variants run interleaved (a block of iterations of one, then of the other,
rotating which goes first), times are this thread's CPU time (``time.thread_time``: torch runs on one thread here),
and each figure is the median of the paired block ratios.

a. A compute-bound loop: an MLP of about 18M parameters, Adam, two losses on one trunk (the first backward retains
   the graph). Target: recorder / bare <= 1.05.
b. A tiny-op loop: 20 layers of width 32, Adam, batch 8, where the recorder's cost per node and per Python call
   shows most. Target: recorder / bare <= 1.25.
c. Peak memory in watch mode (torch.profiler's CPU allocations, a few iterations of loop a): no copy of
   parameters, gradients or optimizer state. Target: watched / bare <= 1.1.
d. ``diagnose(step)`` with its default 3 runs against one bare step (median of several). Target: <= runs + 1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from backward_twice.steps.diagnose import diagnose
from backward_twice.watcher import watch
from helpers.measure import profiler_peak_bytes

torch.set_num_threads(1)


def big_loop() -> tuple[Callable[[int], None], Callable[[], None]]:
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 2560),
        torch.nn.ReLU(),
        torch.nn.Linear(2560, 1024),
        torch.nn.ReLU(),
    )
    head_a, head_b = torch.nn.Linear(1024, 1), torch.nn.Linear(1024, 1)
    params = [*trunk.parameters(), *head_a.parameters(), *head_b.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-4)
    x = torch.randn(32, 1024)

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        head_a(features).pow(2).mean().backward(retain_graph=True)
        head_b(features).abs().mean().backward()
        optimizer.step()

    def loop(iterations: int) -> None:
        for _ in range(iterations):
            step()

    print(f"   (the MLP has {sum(p.numel() for p in params) / 1e6:.1f}M parameters)")
    return loop, step


def tiny_loop() -> tuple[Callable[[int], None], Callable[[], None]]:
    torch.manual_seed(0)
    layers = []
    for _ in range(20):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32)

    def step() -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    def loop(iterations: int) -> None:
        for _ in range(iterations):
            step()

    return loop, step


def paired(loop: Callable[[int], None], block: int, rounds: int) -> tuple[float, float, float]:
    """Median (and quartiles) of watched / bare over ``rounds`` pairs of ``block``-iteration blocks."""
    loop(2)  # warm up both paths
    with watch():
        loop(2)
    ratios = []
    for index in range(rounds):
        times = {}
        for name in ("bare", "watched") if index % 2 == 0 else ("watched", "bare"):
            start = time.thread_time()
            if name == "bare":
                loop(block)
            else:
                with watch():
                    loop(block)
            times[name] = time.thread_time() - start
        ratios.append(times["watched"] / times["bare"])
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return median, q1, q3


def report(label: str, ratio: float, low: float, high: float, runs: str, target: float) -> None:
    verdict = "within" if ratio <= target else "OVER"
    print(f"{label}: {ratio:.2f}x (quartiles {low:.2f}-{high:.2f}; {runs}) {verdict} the target {target}x")


def main() -> None:
    print("a. recorder on a compute-bound loop")
    loop, step = big_loop()
    rounds, block = 8, 3
    ratio, low, high = paired(loop, block, rounds)
    report("   watched / bare", ratio, low, high, f"{rounds} pairs of {block}-iteration blocks", 1.05)

    print("b. recorder on a tiny-op loop")
    tiny, _tiny_step = tiny_loop()
    rounds, block = 12, 50
    ratio, low, high = paired(tiny, block, rounds)
    report("   watched / bare", ratio, low, high, f"{rounds} pairs of {block}-iteration blocks", 1.25)

    print("c. peak memory in watch mode (loop a, 2 iterations; the lower of two measurements each, interleaved)")

    def watched() -> None:
        with watch():
            loop(2)

    peaks: dict[str, list[int]] = {"bare": [], "watched": []}
    for _ in range(2):
        peaks["bare"].append(profiler_peak_bytes(lambda: loop(2)))
        peaks["watched"].append(profiler_peak_bytes(watched))
    bare_peak, watched_peak = min(peaks["bare"]), min(peaks["watched"])
    print(
        f"   bare {bare_peak / 2**20:.1f} MiB, watched {watched_peak / 2**20:.1f} MiB: "
        f"{watched_peak / bare_peak:.3f}x, {'within' if watched_peak <= 1.1 * bare_peak else 'OVER'} the target 1.1x"
    )

    print("d. diagnose(step) against one bare step (loop a's step)")
    bare, whole = [], []
    for _ in range(5):
        start = time.thread_time()
        step()
        bare.append(time.thread_time() - start)
        start = time.thread_time()
        result = diagnose(step)
        whole.append(time.thread_time() - start)
    runs = result.carried.iterations_run
    ratio = statistics.median(whole) / statistics.median(bare)
    print(
        f"   diagnose / one bare step: {ratio:.2f}x with {runs} runs of the step (medians of 5 each), "
        f"{'within' if ratio <= runs + 1 else 'OVER'} the target {runs + 1}x"
    )


if __name__ == "__main__":
    main()
