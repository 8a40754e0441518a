"""How much does SavedTensorMeter slow an MLP training step? Prints a ratio (target: <= 1.05).

Steps with and without the meter alternate in one run, so machine noise hits both alike.
"""

from __future__ import annotations

import statistics
import time

import torch

from helpers import SavedTensorMeter

ROUNDS, STEPS_PER_ROUND = 40, 10


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
    plain, metered = [], []
    for round_index in range(ROUNDS):
        for measured in ((False, True) if round_index % 2 else (True, False)):
            start = time.perf_counter()
            for _ in range(STEPS_PER_ROUND):
                step(measured)
            (metered if measured else plain).append((time.perf_counter() - start) / STEPS_PER_ROUND)
    plain_ms, metered_ms = statistics.median(plain) * 1e3, statistics.median(metered) * 1e3
    print(f"MLP training step (batch 128, 256-512-512-10), {ROUNDS} alternating rounds of {STEPS_PER_ROUND} steps")
    print(f"  without meter: {plain_ms:.3f} ms/step (median)")
    print(f"  with meter:    {metered_ms:.3f} ms/step (median)")
    print(f"  overhead ratio: {metered_ms / plain_ms:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
