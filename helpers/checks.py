"""Check functions for the exercises: each runs the learner's answer live and says what is wrong.

Every check returns a :class:`CheckResult`, truthy when the answer is right and shown as the verdict
(a tick, or what is wrong plus a hint). It never raises on a wrong answer: an exception of any type
from the answer is the verdict. Each check runs the answer twice, the second time from the state the
first call left (``.grad`` filled, a trained model), against reference runs of right answers made in
the check; a :class:`SavedTensorMeter` counts graph buffers *while* the answer runs. Gradients are
compared with tolerances, and messages print only figures that are the same on every CPU: byte counts
of saved tensors, counts, their ratios, and a gradient's ratio only when it is a clear multiple (0.50x).
A check leaves the caller's random stream as it was. Used by notebooks 01_graph_buffers and 02_multi_loss.
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from helpers.meter import SavedTensorMeter, format_bytes

__all__ = [
    "CheckResult",
    "SECOND_BACKWARD_QUESTIONS",
    "check_backward_both",
    "check_backward_three_times",
    "check_predictions",
    "check_training_loop",
    "check_two_loss_loop",
]

# Expression text -> function of (x, w) building it; the check measures the answers live.
SECOND_BACKWARD_QUESTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "(x + w).sum()": lambda x, w: (x + w).sum(),
    "(x * w).sum()": lambda x, w: (x * w).sum(),
    "x.exp().sum()": lambda x, w: x.exp().sum(),
    "x.view(2, 3).sum()": lambda x, w: x.view(2, 3).sum(),
    "(x * 2).sum()": lambda x, w: (x * 2).sum(),
    "x.mean()": lambda x, w: x.mean(),
}
SECOND_CALL = "On a second call, with .grad holding the first call's gradients, "


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise answer: shown as text, truthy when the answer is right.

    Returned by every exercise check: these (notebooks 01_graph_buffers and 02_multi_loss) and
    those in :mod:`helpers.gan` (notebook 03_gan_step).
    """

    passed: bool
    message: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        text = ("✓ Correct. " if self.passed else "✗ Not yet. ") + self.message
        if self.hint and not self.passed:
            text += f"\n  Hint: {self.hint}"
        return text


class _Rejected(Exception):
    """Ends a check with a failing verdict: ``where`` + message, or the message capitalised unless it is code."""

    def __init__(self, message: str, hint: str = "", where: str = "") -> None:
        plain = message.split(" ", 1)[0].isalpha()
        text = where + message if where or not plain else message[:1].upper() + message[1:]
        super().__init__(text)
        self.result = CheckResult(False, text, hint)


def _checked(check: Callable[[Any], CheckResult]) -> Callable[[Any], CheckResult]:
    """Refuse a non-function, keep the caller's random stream, and turn a rejection into the verdict."""

    @functools.wraps(check)
    def run(answer: Any) -> CheckResult:
        if not callable(answer):
            return CheckResult(False, "Pass your function itself (without calling it).")
        with torch.random.fork_rng(devices=[]):  # a check must not disturb the learner's random stream
            try:
                return check(answer)
            except _Rejected as rejected:
                return rejected.result

    return run


def _run(answer: Callable[..., Any], *args: Any, who: str, hint: str = "", where: str = "") -> Any:
    """Call the learner's answer; an exception it raises becomes the verdict, with its own first line."""
    try:
        return answer(*args)
    except Exception as exc:  # noqa: BLE001 - every error in the answer is a verdict, never a crash
        lines = str(exc).strip().splitlines()
        text = lines[0][:90] + ("..." if len(lines[0]) > 90 else "") if lines else ""
        second = "backward through the graph a second time" in str(exc)  # the hint is about that error only
        raise _Rejected(f"{who} raised {type(exc).__name__}" + (f": {text}" if text else "."),
                        hint if second else "", where) from None


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's ``.grad`` (a copy), zeros where it is None."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def _scale(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """``k`` (2 decimals) when ``got`` is clearly ``k`` times ``want``, else None: the same on every CPU."""
    k = round(float(got @ want / (want @ want)), 2)
    return k if k and torch.allclose(got, k * want, rtol=1e-3, atol=1e-6) else None


def _gradient_problem(params: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str,
                      known: Mapping[str, Sequence[torch.Tensor]]) -> str | None:
    """What is wrong with the parameters' ``.grad`` against ``expected`` (None: nothing), in true words.

    ``known`` names gradients that typical mistakes produce ("those of l1 alone"), recognised first.
    """
    if all(p.grad is None for p in params):
        return "every parameter's .grad is None: no gradient was left in .grad."
    if any(p.grad.requires_grad for p in params if p.grad is not None):
        return ".grad carries a graph of its own (create_graph=True builds one), which keeps memory alive."
    got, want = _flat(_grads(params)), _flat(expected)
    if _close(got, want):
        return None
    for description, grads in known.items():
        if _close(got, _flat(grads)):
            return f"the gradients are {description}, not {what}."
    k = _scale(got, want)
    return f"the gradients are {k:.2f}x {what}." if k is not None else f"the gradients differ from {what}."


def _run_loop(train: Callable[..., Any], args: tuple[Any, ...], meter: SavedTensorMeter, expected: Sequence[float],
              name: Callable[[int], str], where: str, hints: Sequence[str], one_graph: int, limit: float
              ) -> tuple[bool, float]:
    """Run a learner's loop under ``meter`` and judge what it returns and what its graphs held.

    The history must be a list of one number per batch equal to ``expected`` (tensors without a graph,
    ``loss.detach()``, count as numbers); no buffers may be left after it returns, and the peak during
    it may not exceed ``limit`` (from reference runs). ``hints``: on an error, on what is stored, on the
    values, on buffers left, on the peak. Returns whether the history held tensors, and the peak in
    graphs (peak / ``one_graph``), from byte counts, so the same on every CPU.
    """
    meter.reset_peak()
    with meter:
        history = _run(train, *args, who="your loop", where=where, hint=hints[0])
    if not isinstance(history, list) or len(history) != len(expected):
        got = ("None" if history is None else f"a list of {len(history)}" if isinstance(history, list)
               else f"a {type(history).__name__}")
        raise _Rejected(f"return a list with one number per batch ({len(expected)} items); yours returned {got}.",
                        "Append one number per batch and return the list.", where)
    tensors = [item for item in history if isinstance(item, torch.Tensor)]
    if any(t.grad_fn is not None for t in tensors):
        raise _Rejected("the history holds tensors that carry a grad_fn: each one keeps its whole graph (and any "
                        "retained buffers) reachable.", hints[1], where)
    if any(t.requires_grad for t in tensors):
        raise _Rejected("the history holds tensors that require grad: they carry no graph, but NumPy and plotting "
                        "refuse them.", hints[1], where)
    if not all(isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.numel() == 1) for v in history):
        raise _Rejected("each history item should be one number, such as loss.item().", hints[1], where)
    for i, (item, want) in enumerate(zip(history, expected)):
        if not math.isclose(float(item), want, rel_tol=1e-4, abs_tol=1e-6):
            raise _Rejected(f"history[{i}] is not {name(i)}.", hints[2], where)
    if left := meter.graph_only_bytes:
        raise _Rejected(f"after your loop returned, graphs still hold {format_bytes(left)} of buffers.", hints[3],
                        where)
    if (peak := meter.peak_graph_only_bytes) > limit:
        raise _Rejected(f"during your loop, graphs held up to {format_bytes(peak)} of buffers at once, "
                        f"{peak / one_graph:.1f}x what one batch's graph holds: buffers of an earlier graph were "
                        "still alive while another was built.", hints[4], where)
    return bool(tensors), peak / one_graph


def _passed(message: str, graphs: float, had_tensors: bool) -> CheckResult:
    """A loop's tick: ``message`` with ``{memory}`` filled in from the peak, and a note if it kept tensors."""
    memory = "never more than one graph's buffers" if graphs <= 1 else f"at most {graphs:.1f}x one graph's buffers"
    note = " (Detached tensors carry no graph; plain floats from .item() are the simplest to plot.)"
    return CheckResult(True, message.format(memory=memory) + (note if had_tensors else ""))


def second_backward_works(expression: str) -> bool:
    """Build ``expression`` on fresh ``x`` and ``w``, backward twice, say whether the second worked."""
    x = torch.arange(1.0, 7.0, requires_grad=True)
    w = torch.full((6,), 0.5, requires_grad=True)
    loss = SECOND_BACKWARD_QUESTIONS[expression](x, w)
    loss.backward()
    try:
        loss.backward()
    except RuntimeError:
        return False
    return True


def check_predictions(predictions: Mapping[str, bool]) -> CheckResult:
    """Notebook 01_graph_buffers, exercise 1: predict, per expression, whether a second plain backward() works."""
    if not isinstance(predictions, Mapping):
        return CheckResult(False, f"Give a dict of expression -> True/False, not {type(predictions).__name__}.")
    missing = [e for e in SECOND_BACKWARD_QUESTIONS if not isinstance(predictions.get(e), bool)]
    if missing:
        return CheckResult(False, f"Fill in True or False for: {', '.join(missing)}.",
                           "Replace each ... with True (second backward works) or False (it raises).")
    wrong = [e for e in SECOND_BACKWARD_QUESTIONS if predictions[e] != second_backward_works(e)]
    if wrong:
        return CheckResult(
            False, f"{len(wrong)} of {len(SECOND_BACKWARD_QUESTIONS)} predictions are wrong: {', '.join(wrong)}.",
            "A second backward fails exactly when a node saved a tensor it needs for its gradient. "
            "Adding and viewing save nothing; multiplying saves the other factor, even a Python number.")
    return CheckResult(True, "Every prediction matches what autograd does.")


@_checked
def check_backward_three_times(backward_three_times: Callable[[torch.Tensor], None]) -> CheckResult:
    """Notebook 01_graph_buffers, exercise 2: three backward passes through ``loss``, no buffers left.

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
        passes: list[int] = []
        loss.grad_fn.register_prehook(lambda grad_outputs: passes.append(1))
        before = _grads([weight])[0]
        _run(backward_three_times, loss, who="your function", where=where,
             hint="Every backward except the last needs retain_graph=True.")
        grown = _grads([weight])[0] - before
        if len(passes) != 3:
            said = (f"backpropagated through loss {len(passes)} time{'s' if len(passes) != 1 else ''}, not 3."
                    if passes else "did not backpropagate through the loss it was given.")
            if len(passes) == 1 and _close(grown, 3 * one):
                said += (" One pass with a gradient scaled by 3, such as (3 * loss).backward(), gives the same "
                         ".grad, but the exercise is three backward passes.")
            raise _Rejected(f"your function {said}", "Call backward on the loss you are given three times: "
                            "retain_graph=True on every call but the last.", where)
        if weight.grad is None:
            raise _Rejected("weight.grad is None after your function: the passes left no gradient in .grad.",
                            "torch.autograd.grad returns gradients; loss.backward() adds them into .grad.", where)
        if weight.grad.requires_grad:
            raise _Rejected("weight.grad carries a graph of its own (create_graph=True builds one), which keeps "
                            "memory alive.", "retain_graph=True is all a repeated backward needs.", where)
        if not _close(grown, 3 * one):
            k = _scale(grown, one)
            amount = f"{k:.2f}x" if k is not None else "something that is not a multiple of"
            raise _Rejected(f"weight.grad {'is' if call == 0 else 'grew by'} {amount} one backward's gradient; "
                            "three backward passes add 3x.", "Each backward adds its gradient into .grad: do not "
                            "zero or replace it between or after the calls.", where)
        if left := meter.graph_only_bytes:
            raise _Rejected(f"the gradient is right, but while loss is still referenced its graph holds "
                            f"{format_bytes(left)} of buffers after your function.", "Only the backward calls that "
                            "are followed by another one need retain_graph=True (a del inside your function drops "
                            "only its own name for loss).", where)
        del loss
    return CheckResult(True, "Three backward passes each call, .grad up by 3x one backward's gradient, and the "
                             "last backward freed the buffers.")


def _given_loop_fixed(model: torch.nn.Module, batches: Sequence[torch.Tensor]) -> list[float]:
    """Exercise 3's loop as it should be: the notebook's SGD (lr=0.1) step written out, losses as numbers."""
    history = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = model(batch).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)  # what torch.optim.SGD(lr=0.1) does on CPU
        history.append(loss.item())
    return history


@_checked
def check_training_loop(train: Callable[[torch.nn.Module, list[torch.Tensor]], list[float]]) -> CheckResult:
    """Notebook 01_graph_buffers, exercise 3: the loop trains as given, records numbers, one graph at a time.

    Runs ``train`` twice on one model, the second time from the trained model with ``.grad`` filled
    (which the given loop's ``zero_grad`` discards). Each time its history and the parameters it leaves
    must match the fixed given loop run from the same state, no buffers may be left when it returns,
    and the graph-only bytes during the loop may not exceed 1.5x the fixed loop's peak (one graph): a
    graph retained by the last backward lives until ``loss`` is reassigned, in the next forward.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    batches = [torch.randn(16, 8) for _ in range(5)]
    training = ("Keep the loop's training as given: zero the gradients before each backward, one backward and "
                "one optimizer step (SGD, lr=0.1) per batch, and record loss.item().")
    hints = ("Only a backward followed by another one through the same graph needs retain_graph=True.",
             "Store loss.item(), a plain Python number.", training,
             "A graph keeps its buffers until backward frees them or nothing references it: what still references one?",
             "A graph retained by its backward keeps all its buffers until loss is reassigned, in the middle of the "
             "next batch's forward.")
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
        tensors, peak = _run_loop(train, (model, batches), meter, expected,
                                  lambda i: f"the loss the given loop records at batch {i}", where, hints,
                                  one_graph, 1.5 * one_graph)
        if not _close(_flat(list(model.parameters())), _flat(list(reference.parameters()))):
            raise _Rejected("after your loop the model's parameters differ from the given loop's.", training, where)
        had_tensors, graphs = had_tensors or tensors, max(graphs, peak)
    return _passed("The loop trains as given and records numbers, with {memory} alive at once.", graphs,
                   had_tensors)


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


@_checked
def check_two_loss_loop(train: Callable[[torch.nn.Module, list[Batch]], list[float]]) -> CheckResult:
    """Notebook 02_multi_loss, exercise 1: the given loop's gradients, l1 + l2 as numbers, one graph at a time.

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
        before = _grads(params)
        tensors, peak = _run_loop(train, (net, data), meter, [s for *_, (s,) in parts],
                                  lambda i: f"l1 + l2 of batch {i}", where, hints, one_graph, limit)
        known = ({"those of l1 alone": _add(*(g1 for g1, _, _ in parts)),
                  "those of l2 alone": _add(*(g2 for _, g2, _ in parts)),
                  "those of the last batch alone": _add(*parts[-1][:2])} if call == 0 else
                 {"those of this call alone (what .grad held was discarded)": total})
        if problem := _gradient_problem(params, _add(before, total), "the gradient of l1 + l2 summed over the "
                                        "batches" + (" added to what .grad held" if call else ""), known):
            raise _Rejected(problem, "Backpropagate both losses once per batch, and do not zero .grad: the given "
                                     "loop adds up every batch's.", where)
        had_tensors, graphs = had_tensors or tensors, max(graphs, peak)
    return _passed("Right gradients, added up over both calls, numbers in the history, and {memory} alive at once.",
                   graphs, had_tensors)


@_checked
def check_backward_both(backward_both: Callable[[torch.Tensor, torch.Tensor], None]) -> CheckResult:
    """Notebook 02_multi_loss, exercise 2: l1 + l2's gradient added to .grad, no buffers left, one backward's peak.

    Calls the answer on two fresh pairs of losses; the second time ``.grad`` holds the first call's
    gradients, and the new ones must be added. After each call, while the check still holds l1 and l2,
    the meter must read no buffers. Then torch.profiler's allocation peak of a whole step with the
    answer (``.grad`` empty) may exceed that of ``(l1 + l2).backward()`` by at most 10 %: the peaks are
    byte counts that repeat exactly run to run, and the lowest of two runs each is compared.
    """
    from helpers.compare import profiler_peak_bytes

    net, data, ((g1, g2, _),) = _two_head_setup(batches=1)
    params, meter, total, walks = list(net.parameters()), SavedTensorMeter(), _add(g1, g2), []
    net.trunk[0].weight.register_hook(lambda grad: walks.append(1))  # once per backward pass through the trunk
    for call in range(2):
        where = SECOND_CALL if call else ""
        before = _grads(params)
        with meter:
            l1, l2 = _two_losses(net, *data[0])
        walks.clear()
        _run(backward_both, l1, l2, who="your function", where=where, hint="The two losses share the trunk's buffers.")
        known = ({"those of l1 alone": g1, "those of l2 alone": g2} if call == 0 else
                 {"those of this call alone (what .grad held was discarded)": total})
        if problem := _gradient_problem(params, _add(before, total), "the gradient of l1 + l2"
                                        + (" added to what .grad held" if call else ""), known):
            raise _Rejected(problem, "", where)
        if left := meter.graph_only_bytes:
            raise _Rejected(
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
            runs.append(profiler_peak_bytes(lambda: _run(answer, *_two_losses(net, *data[0]), who="your function")))
        peaks.append(min(runs))
    if peaks[1] > 1.1 * peaks[0]:
        walked = (f": your function backpropagated through the shared trunk {trunk_walks} times, and each pass "
                  "allocates the trunk's gradients again" if trunk_walks > 1 else "")
        return CheckResult(False, "Right gradients and no buffers left, but your step's peak allocation "
                                  f"(torch.profiler) is more than 1.1x that of one backward of l1 + l2{walked}.",
                           "Can you do it in one backward pass?")
    return CheckResult(True, "Right gradients, added to .grad on both calls, no buffers left, and a peak allocation "
                             "within 10% of one backward of l1 + l2.")
