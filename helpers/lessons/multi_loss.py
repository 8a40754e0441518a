"""What only notebook 02_multi_loss uses: its exercise checks, a two-loss loop that keeps no graph into the
next batch (exercise 1), and both losses' gradients in one pass (exercise 2). The growth experiment it
runs lives in the core (:mod:`helpers.growth`), since notebook 04 measures carried state with it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.checks import (
    SECOND_CALL,
    CheckResult,
    Rejected,
    checked,
    gradient_problem,
    gradients_or_zeros,
    loop_passed,
    reject_peak,
    run_answer,
    run_loop,
)
from helpers.measure import profiler_peak_bytes

__all__ = ["check_backward_both", "check_two_loss_loop"]

# -- exercise checks -------------------------------------------------------------------------------


class _TwoHeads(torch.nn.Module):
    """The checks' own copy of notebook 02's model (smaller): a shared trunk, a classifier and a regressor."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(
            torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU()
        )
        self.classify = torch.nn.Linear(128, 4)
        self.regress = torch.nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(x)
        return self.classify(features), self.regress(features)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class _BatchGradients:
    """One batch's gradients of l1 and of l2 (one tensor per parameter, in the network's order), l1 + l2 as a number."""

    of_l1: tuple[torch.Tensor, ...]
    of_l2: tuple[torch.Tensor, ...]
    loss_sum: float


def _two_head_setup(batches: int) -> tuple[_TwoHeads, list[Batch], list[_BatchGradients]]:
    """The network, its batches, and each batch's gradients of l1 and of l2, and l1 + l2 as a number."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # inside the check's fork_rng
    net = _TwoHeads()
    data = [
        (
            torch.randn(64, 16, generator=generator),
            torch.randint(0, 4, (64,), generator=generator),
            torch.randn(64, 1, generator=generator),
        )
        for _ in range(batches)
    ]
    params, parts = list(net.parameters()), []
    for batch in data:  # autograd.grad leaves .grad untouched
        l1, l2 = _two_losses(net, *batch)
        g1 = torch.autograd.grad(l1, params, retain_graph=True, materialize_grads=True)
        g2 = torch.autograd.grad(l2, params, materialize_grads=True)
        parts.append(_BatchGradients(g1, g2, l1.item() + l2.item()))
    return net, data, parts


def _two_losses(
    net: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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
    head lives until l1 is reassigned), both measured here, but not two whole graphs; the history and
    the gradients are judged before that peak.
    """
    net, data, parts = _two_head_setup(batches=4)
    params, meter = list(net.parameters()), SavedTensorMeter()
    total = _add(*(_add(part.of_l1, part.of_l2) for part in parts))

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
    hints = (
        "Both losses share the trunk: the first backward through it must keep the buffers.",
        store,
        store + " The given loop takes no optimizer step: every batch's loss is computed at the same weights.",
        "Which backward is the last one through each graph? It should not retain.",
        "A graph's buffers live until a backward frees them or nothing references it: a graph retained by its "
        "last backward lives until l1 and l2 are reassigned, in the next batch's forward, and a second forward "
        "builds a second graph while the first is alive.",
    )
    had_tensors, graphs = False, 0.0
    for call in range(2):
        where = SECOND_CALL if call else ""
        before = gradients_or_zeros(params)
        tensors, peak = run_loop(
            train,
            (net, data),
            meter,
            [part.loss_sum for part in parts],
            lambda i: f"l1 + l2 of batch {i}",
            where,
            hints,
            one_graph,
        )
        _reject_wrong_sum(
            params,
            before,
            total,
            call,
            "the gradient of l1 + l2 summed over the batches",
            {
                "those of l1 alone": _add(*(part.of_l1 for part in parts)),
                "those of l2 alone": _add(*(part.of_l2 for part in parts)),
                "those of the last batch alone": _add(parts[-1].of_l1, parts[-1].of_l2),
            },
            "Backpropagate both losses once per batch, and do not zero .grad: the given loop adds up every batch's.",
            where,
        )
        reject_peak(meter, one_graph, limit, hints[4], where)  # after the gradients: a loop without them says so first
        had_tensors, graphs = had_tensors or tensors, max(graphs, peak)
    return loop_passed(
        "Right gradients, added up over both calls, numbers in the history, and {memory} alive at once.",
        graphs,
        had_tensors,
    )


def _reject_wrong_sum(
    params: Sequence[torch.Tensor],
    before: Sequence[torch.Tensor],
    total: Sequence[torch.Tensor],
    call: int,
    what: str,
    first_call_mistakes: Mapping[str, Sequence[torch.Tensor]],
    hint: str,
    where: str,
) -> None:
    """Reject unless ``.grad`` holds ``before`` plus ``total``; a wrong one is named among the known mistakes (the
    first call's, or, on the second call, the gradient of that call alone: ``.grad`` was discarded)."""
    known = first_call_mistakes if call == 0 else {"those of this call alone (what .grad held was discarded)": total}
    expected = what + (" added to what .grad held" if call else "")
    if problem := gradient_problem(params, _add(before, total), expected, known):
        raise Rejected(problem, hint, where)


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

    net, data, (part,) = _two_head_setup(batches=1)
    g1, g2 = part.of_l1, part.of_l2
    params, meter, total, walks = list(net.parameters()), SavedTensorMeter(), _add(g1, g2), []
    # once per backward pass through the trunk
    net.get_parameter("trunk.0.weight").register_hook(lambda grad: walks.append(1))
    for call in range(2):
        where = SECOND_CALL if call else ""
        before = gradients_or_zeros(params)
        with meter:
            l1, l2 = _two_losses(net, *data[0])
        walks.clear()
        run_answer(
            backward_both, l1, l2, who="your function", where=where, hint="The two losses share the trunk's buffers."
        )
        _reject_wrong_sum(
            params,
            before,
            total,
            call,
            "the gradient of l1 + l2",
            {"those of l1 alone": g1, "those of l2 alone": g2},
            "",
            where,
        )
        if left := meter.graph_only_bytes:
            raise Rejected(
                f"right gradients, but while l1 and l2 are still referenced the graph holds {format_bytes(left)} "
                "of buffers after your function.",
                "Buffers survive a backward that retains, and buffers off the last "
                "backward's path: a backward frees only what it walks through. One backward through everything frees "
                "it all.",
                where,
            )
        del l1, l2
    trunk_walks = len(walks)

    def lowest_peak(answer: Callable[[torch.Tensor, torch.Tensor], Any]) -> int:
        """The lower of two runs' allocation peaks of a whole step with ``answer``, .grad empty."""
        runs = []
        for _ in range(2):
            net.zero_grad(set_to_none=True)
            runs.append(
                profiler_peak_bytes(lambda: run_answer(answer, *_two_losses(net, *data[0]), who="your function"))
            )
        return min(runs)

    peaks = [lowest_peak(answer) for answer in (lambda l1, l2: (l1 + l2).backward(), backward_both)]
    if peaks[1] > 1.1 * peaks[0]:
        walked = (
            f": your function backpropagated through the shared trunk {trunk_walks} times, and each pass "
            "allocates the trunk's gradients again"
            if trunk_walks > 1
            else ""
        )
        return CheckResult(
            False,
            "Right gradients and no buffers left, but your step's peak allocation "
            f"(torch.profiler) is more than 1.1x that of one backward of l1 + l2{walked}.",
            "Can you do it in one backward pass?",
        )
    return CheckResult(
        True,
        "Right gradients, added to .grad on both calls, no buffers left, and a peak allocation "
        "within 10% of one backward of l1 + l2.",
    )
