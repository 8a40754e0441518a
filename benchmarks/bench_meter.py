"""How much does SavedTensorMeter slow an MLP training step? Prints a ratio (target: <= 1.05).

Rounds of steps with and without the meter alternate in one run, and each round's two timings
form one paired ratio, so slow drifts of a shared machine cancel; the median ratio is reported
with its interquartile range.
"""

from __future__ import annotations

import statistics
import time

import torch

from helpers import SavedTensorMeter

ROUNDS, STEPS_PER_ROUND = 80, 10


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(128, 256), torch.randint(0, 10, (128,))
    meter = SavedTensorMeter()

    def step(measured: bool) -> None:
        optimizer.zero_grad()
        if measured:
            with meter:
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        else:
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()

    for _ in range(20):  # warm up both paths
        step(True)
        step(False)
    plain, metered, ratios = [], [], []
    for round_index in range(ROUNDS):
        seconds = {}
        for measured in ((False, True) if round_index % 2 else (True, False)):
            start = time.perf_counter()
            for _ in range(STEPS_PER_ROUND):
                step(measured)
            seconds[measured] = (time.perf_counter() - start) / STEPS_PER_ROUND
        plain.append(seconds[False])
        metered.append(seconds[True])
        ratios.append(seconds[True] / seconds[False])
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"MLP training step (batch 128, 256-512-512-10), {ROUNDS} alternating rounds of {STEPS_PER_ROUND} steps")
    print(f"  without meter: {statistics.median(plain) * 1e3:.3f} ms/step (median)")
    print(f"  with meter:    {statistics.median(metered) * 1e3:.3f} ms/step (median)")
    print(f"  overhead ratio: {statistics.median(ratios):.3f} (median of paired rounds; "
          f"interquartile {quartiles[0]:.3f}-{quartiles[2]:.3f}; target <= 1.05)")


if __name__ == "__main__":
    main()
