"""What only notebook 01_graph_buffers uses: the table of which operations save what, and its exercise checks.

:func:`operation_table` runs each operation on fresh inputs, reads what its node saved and tries a
second backward. The checks: predict which second backward works (exercise 1), backpropagate three
times leaving no buffers (exercise 2), and a loop that records its losses with one graph alive at a
time (exercise 3).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch

from backward_twice.common.units import format_bytes
from backward_twice.instruments.graph import saved_tensors_of
from backward_twice.instruments.meter import SavedTensorMeter
from helpers.checks import (
    CheckResult,
    Rejected,
    checked,
    clear_multiple,
    flat,
    gradients_or_zeros,
    loop_passed,
    reject_peak,
    run_answer,
    run_loop,
)
from helpers.display import Table
from helpers.measure import gradients_close

__all__ = ["check_backward_three_times", "check_predictions", "check_training_loop", "operation_table"]

# Expression text -> function of (x, w) building it; the check measures the answers live.
SECOND_BACKWARD_QUESTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "(x + w).sum()": lambda x, w: (x + w).sum(),
    "(x * w).sum()": lambda x, w: (x * w).sum(),
    "x.exp().sum()": lambda x, w: x.exp().sum(),
    "x.view(2, 3).sum()": lambda x, w: x.view(2, 3).sum(),
    "(x * 2).sum()": lambda x, w: (x * 2).sum(),
    "x.mean()": lambda x, w: x.mean(),
}


def second_backward_works(loss: torch.Tensor) -> bool:
    """Backpropagate ``loss`` twice (plain ``backward()``); say whether the second one worked.

    Used by :func:`operation_table` and :func:`_second_backward_of`.
    """
    loss.backward()
    try:
        loss.backward()
    except RuntimeError as exc:
        if "backward through the graph a second time" in str(exc):
            return False
        raise
    return True


def _second_backward_of(expression: str) -> bool:
    x = torch.arange(1.0, 7.0, requires_grad=True)
    w = torch.full((6,), 0.5, requires_grad=True)
    return second_backward_works(SECOND_BACKWARD_QUESTIONS[expression](x, w))


def check_predictions(predictions: object) -> CheckResult:
    """Exercise 1: predict, per expression, whether a second plain backward() works.

    Used by notebook 01_graph_buffers.
    """
    if not isinstance(predictions, Mapping):
        return CheckResult(False, f"Give a dict of expression -> True/False, not {type(predictions).__name__}.")
    given = {expression: predictions[expression] for expression in predictions}  # read once
    unknown = [str(e) for e in given if e not in SECOND_BACKWARD_QUESTIONS]
    if unknown:
        return CheckResult(
            False,
            f"Unknown expression(s): {', '.join(unknown)}; predict for exactly these: "
            f"{', '.join(SECOND_BACKWARD_QUESTIONS)}.",
            "Keep the dict's keys as the cell gives them.",
        )
    missing = [e for e in SECOND_BACKWARD_QUESTIONS if given.get(e, ...) is ...]
    if missing:
        return CheckResult(
            False,
            f"Fill in True or False for: {', '.join(missing)}.",
            "Replace each ... with True (second backward works) or False (it raises).",
        )
    other = [e for e in SECOND_BACKWARD_QUESTIONS if type(given[e]) is not bool]
    if other:
        return CheckResult(
            False,
            f"Each prediction is True or False; {other[0]} has {given[other[0]]!r}"
            + (f" (and {len(other) - 1} more)." if len(other) > 1 else "."),
            "Write True (second backward works) or False (it raises), without quotes.",
        )
    wrong = [e for e in SECOND_BACKWARD_QUESTIONS if given[e] is not _second_backward_of(e)]
    if wrong:
        return CheckResult(
            False,
            f"{len(wrong)} of {len(SECOND_BACKWARD_QUESTIONS)} predictions are wrong: {', '.join(wrong)}.",
            "A second backward fails exactly when a node saved a tensor it needs for its gradient. "
            "Adding and viewing save nothing; multiplying saves the other factor, even a Python number.",
        )
    return CheckResult(True, "Every prediction matches what autograd does.")


def _backward_passes(loss: torch.Tensor) -> list[int]:
    """A list that gets one item per backward pass through ``loss`` (a prehook on its node)."""
    assert loss.grad_fn is not None, "the check's own loss has a graph"
    passes: list[int] = []
    loss.grad_fn.register_prehook(lambda grad_outputs: passes.append(1))
    return passes


@checked
def check_backward_three_times(backward_three_times: Callable[[torch.Tensor], None]) -> CheckResult:
    """Exercise 2: three backward passes through ``loss``, no buffers left. Used by notebook 01_graph_buffers.

    Calls the answer on two fresh losses of one weight. Each call must run exactly three backward
    passes through the loss (a hook on its ``grad_fn`` counts them, so ``(3 * loss).backward()`` is one)
    and add 3x one backward's gradient to ``weight.grad``; the second call starts from what the first
    left there. After each call, while the check still holds ``loss``, its graph must hold no buffers.
    """
    weight = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    meter = SavedTensorMeter()
    for call, inputs in enumerate((torch.tensor([0.5, 1.5, -1.0]), torch.tensor([-2.0, 0.25, 1.0]))):
        where = "" if call == 0 else "On a second call, with a fresh loss and .grad holding the first call's result, "
        with meter:
            loss = torch.tanh(inputs * weight).sum()
        (one,) = torch.autograd.grad(loss, weight, retain_graph=True)
        passes = _backward_passes(loss)
        before = gradients_or_zeros([weight])[0]
        run_answer(
            backward_three_times,
            loss,
            who="your function",
            where=where,
            hint="Every backward except the last needs retain_graph=True.",
        )
        grown = gradients_or_zeros([weight])[0] - before
        if len(passes) != 3:
            said = (
                f"backpropagated through loss {len(passes)} time{'s' if len(passes) != 1 else ''}, not 3."
                if passes
                else "did not backpropagate through the loss it was given."
            )
            if len(passes) == 1 and gradients_close(grown, 3 * one):
                said += (
                    " One pass with a gradient scaled by 3, such as (3 * loss).backward(), gives the same "
                    ".grad, but the exercise is three backward passes."
                )
            raise Rejected(
                f"your function {said}",
                "Call backward on the loss you are given three times: retain_graph=True on every call but the last.",
                where,
            )
        if weight.grad is None:
            raise Rejected(
                "weight.grad is None after your function: the passes left no gradient in .grad.",
                "torch.autograd.grad returns gradients; loss.backward() adds them into .grad.",
                where,
            )
        if weight.grad.requires_grad:
            raise Rejected(
                "weight.grad carries a graph of its own (create_graph=True builds one), which keeps memory alive.",
                "retain_graph=True is all a repeated backward needs.",
                where,
            )
        if not gradients_close(grown, 3 * one):
            k = clear_multiple(grown, one)
            amount = f"{k:.2f}x" if k is not None else "something that is not a multiple of"
            raise Rejected(
                f"weight.grad {'is' if call == 0 else 'grew by'} {amount} one backward's gradient; "
                "three backward passes add 3x.",
                "Each backward adds its gradient into .grad: do not zero or replace it between or after the calls.",
                where,
            )
        if left := meter.graph_only_bytes:
            raise Rejected(
                f"the gradient is right, but while loss is still referenced its graph holds "
                f"{format_bytes(left)} of buffers after your function.",
                "Only the backward calls that "
                "are followed by another one need retain_graph=True (a del inside your function drops "
                "only its own name for loss).",
                where,
            )
        del loss
    return CheckResult(
        True,
        "Three backward passes each call, .grad up by 3x one backward's gradient, and the "
        "last backward freed the buffers.",
    )


def _given_loop_fixed(model: torch.nn.Module, batches: Sequence[torch.Tensor]) -> list[float]:
    """Exercise 3's loop as it should be: the notebook's SGD (lr=0.1) step written out, losses as numbers."""
    history = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = model(batch).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:  # SGD too skips a parameter without a gradient
                    p.add_(p.grad, alpha=-0.1)  # what torch.optim.SGD(lr=0.1) does on CPU
        history.append(loss.item())
    return history


@checked
def check_training_loop(train: Callable[[torch.nn.Module, list[torch.Tensor]], list[float]]) -> CheckResult:
    """Exercise 3: the loop trains as given, records numbers, one graph at a time.

    Used by notebook 01_graph_buffers.

    Runs ``train`` twice on one model, the second time from the trained model with ``.grad`` filled
    (which the given loop's ``zero_grad`` discards). Each time its history and the parameters it leaves
    must match the fixed given loop run from the same state, no buffers may be left when it returns,
    and the graph-only bytes during the loop may not exceed 1.5x the fixed loop's peak (one graph): a
    graph retained by the last backward lives until ``loss`` is reassigned, in the next forward.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    batches = [torch.randn(16, 8) for _ in range(5)]
    training = (
        "Keep the loop's training as given: zero the gradients before each backward, one backward and "
        "one optimizer step (SGD, lr=0.1) per batch, and record loss.item()."
    )
    hints = (
        "Only a backward followed by another one through the same graph needs retain_graph=True.",
        "Store loss.item(), a plain Python number.",
        training,
        "A graph keeps its buffers until backward frees them or nothing references it: what still references one?",
        "A graph's buffers live until a backward frees them or nothing references it: a graph retained by its "
        "backward lives until loss is reassigned, in the middle of the next batch's forward, and a second "
        "forward builds a second graph while the first is alive.",
    )
    meter, had_tensors, graphs = SavedTensorMeter(), False, 0.0
    for call in range(2):
        where = "" if call == 0 else "On a second call (the model already trained, .grad already filled), "
        for p in model.parameters() if call else ():
            p.grad = torch.ones_like(p)
        reference = copy.deepcopy(model)
        meter.reset_peak()
        with meter:
            expected = _given_loop_fixed(reference, batches)
        one_graph = meter.peak_graph_only_bytes
        tensors, peak = run_loop(
            train,
            (model, batches),
            meter,
            expected,
            lambda i: f"the loss the given loop records at batch {i}",
            where,
            hints,
            one_graph,
            trained=list(model.parameters()),
        )
        if not gradients_close(flat(list(model.parameters())), flat(list(reference.parameters()))):
            raise Rejected("after your loop the model's parameters differ from the given loop's.", training, where)
        # The peak last: a loop that does not train as given is told that first, whatever its graphs held.
        reject_peak(meter, one_graph, 1.5 * one_graph, hints[4], where)
        had_tensors, graphs = had_tensors or tensors, max(graphs, peak)
    return loop_passed(
        "The loop trains as given and records numbers, with {memory} alive at once.", graphs, had_tensors
    )


def operation_table(
    operations: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    size: int = 1000,
    seed: int = 0,
) -> Table:
    """Run each operation on fresh inputs and report what its node saved and if backward twice works.

    Each operation gets ``x`` (``size`` floats, requires grad) and ``w`` (same shape, requires
    grad; a square matrix for operations whose name contains ``matmul``), and its result is
    summed to a scalar loss. The saved tensors are read straight from the graph nodes, so a
    Python number kept as a 0-dim tensor shows too. Used by notebook 01_graph_buffers.
    """
    if not isinstance(operations, Mapping) or not operations:
        raise TypeError("operation_table() takes a non-empty dict of name -> function(x, w).")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(
            f"operation_table(size=...) is the number of floats in x and w: a whole number of at least 1, not {size!r}."
        )
    rows = []
    generator = torch.Generator().manual_seed(seed)
    for name, operation in operations.items():
        if not callable(operation):
            raise TypeError(f"operation_table(): {name!r} is not a function of (x, w).")
        side = int(size**0.5)
        shape: tuple[int, ...] = (side, side) if "matmul" in name else (size,)
        x = torch.randn(shape, generator=generator).requires_grad_()
        w = torch.randn(shape, generator=generator).requires_grad_()
        out = operation(x, w)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"operation_table(): {name!r} returned {type(out).__name__}, not a tensor.")
        loss = out.sum()
        op_node = out.grad_fn
        saved = saved_tensors_of(op_node) if op_node is not None and op_node is not loss.grad_fn else []
        saved += saved_tensors_of(loss.grad_fn)
        described = (
            ", ".join(f"{info.name.removeprefix('_saved_')} {tuple(info.shape or ())}" for info in saved) or "nothing"
        )
        nbytes = sum(info.nbytes or 0 for info in saved)
        rows.append(
            [
                name,
                type(op_node).__name__ if op_node else "-",
                described,
                format_bytes(nbytes),
                "yes" if second_backward_works(loss) else "no: buffers freed",
            ]
        )
    return Table(["operation", "node", "saved for backward", "saved bytes", "second backward?"], rows)
