"""Notebook 04's exercise checks: name the carried tensor in four snippets, write a truncated-BPTT loop, and
fix a loop that computes a tensor once before it.

The two loop checks run the learner's loop twice on the check's own model (the second call continues
from the first, with ``.grad`` holding its last gradients, and the first starts with ``.grad`` pre-filled),
inside a :class:`SavedTensorMeter` that is read at every ``optimizer.step()``: what a loop keeps alive
while it runs is the lesson, so it is measured there, not after the function returned. At every step the
check also notes whether the graph of an earlier batch's loss is still alive (a list of loss tensors) and
the gradient's norm; at every ``torch.autograd.backward`` (``loss.backward()`` goes through it) whether it
retained and what it left alive. A step on gradients the loop cleared after their backward is rejected first
(:mod:`helpers.zeroed`). The parameters after each call are compared with reference loops run in
the check, right and wrong, and with the right loop whose steps are scaled down to the learner's gradient
norms (accepted when that is norm clipping at one threshold above zero); a wrong answer is named by the mistake whose
parameters it reproduces. An accepted loop that retained, ran the model more than once per step or reads
``.data`` is told what that did. The names check runs :func:`find_carried_graph` on each snippet, so the
answer it expects is measured, not written down; it takes ``state[0]`` and ``state(0)`` alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from backward_twice.common.units import format_bytes
from backward_twice.instruments.meter import SavedTensorMeter
from backward_twice.record.step_input import known_names
from backward_twice.steps.carried import find_carried_graph
from helpers.checks import CheckResult, Rejected, checked, flat, run_answer
from helpers.lessons.carried_state.loop_watch import (
    LoopWatch,
    gradient_norm,
    is_norm_clipping,
    reads_data,
    scale_down_to,
)
from helpers.measure import gradients_close

__all__ = ["check_carried_names", "check_precomputed_fix", "check_truncated_bptt"]

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]
_LR = 0.1


# -- exercise 1: name the carried tensor ------------------------------------------------------------


def _referenced(step: Callable[[], Any], kind: type) -> list[Any]:
    """The objects of ``kind`` that ``step`` knows by name (its closure, the globals it reads), each once."""
    found = {id(v): v for v in known_names(step).values() if isinstance(v, kind)}
    return list(found.values())


def _spelled_alike(name: str) -> str:
    """One spelling for an item of a tuple: Python's ``state[0]`` and the finder's ``state(0)`` read the same."""
    return re.sub(r"\((\d+)\)", r"[\1]", re.sub(r"\s+", "", name))


def _matches(answer: str, name: str) -> bool:
    """``answer`` names the holder ``name``: the whole name (``state[0]`` or ``state(0)`` for the finder's
    "state(0)"), its variable ("state"), or the attribute ("memory" or "self.memory" for "model.memory")."""
    answer, name = _spelled_alike(answer), _spelled_alike(name)
    root = re.split(r"[^\w.]", name, maxsplit=1)[0]
    attribute = root.rsplit(".", 1)[-1]
    return answer in {name, root, attribute, f"self.{attribute}"}


def check_carried_names(answers: object) -> CheckResult:
    """Exercise 1: ``answers`` maps each snippet's step function to the name of the variable (or attribute)
    that carries a graph into the next iteration, or None when nothing does. The truth is measured:
    :func:`find_carried_graph` runs each step three times, with the modules and optimizers it uses put
    back afterwards.

    Used by notebook 04_carried_state.
    """
    if not isinstance(answers, Mapping) or not answers:
        return CheckResult(False, 'Pass a dict: {snippet_1: "name", snippet_2: None, ...}, one entry per snippet.')
    wrong = []
    for step, answer in answers.items():
        if not callable(step) or not hasattr(step, "__code__"):
            return CheckResult(False, f"The keys must be the snippet functions themselves; got {step!r}.")
        if answer is not None and not isinstance(answer, str):
            return CheckResult(False, f"{step.__name__}: answer with a name as a string, or None; got {answer!r}.")
        report = find_carried_graph(
            step, models=_referenced(step, torch.nn.Module), optimizers=_referenced(step, torch.optim.Optimizer)
        )
        names = sorted({f.name for f in report.findings if f.name is not None})
        if answer is None and report.found:
            wrong.append(f"{step.__name__}: something does carry a graph into the next iteration.")
        elif answer is not None and not report.found:
            wrong.append(
                f"{step.__name__}: nothing carries a graph across its iterations; {answer} is rebuilt "
                f"or detached in time."
            )
        elif answer is not None and not any(_matches(answer, n) for n in names):
            wrong.append(f"{step.__name__}: not {answer}.")
    if wrong:
        return CheckResult(
            False,
            " ".join(wrong),
            "Look for a tensor that survives the end of an iteration and "
            "is used by the next one, and that was built with a graph.",
        )
    return CheckResult(True, f"all {len(answers)} snippets named; find_carried_graph agrees on each.")


# -- the loops' own models and data -----------------------------------------------------------------


class _TinyCharRNN(torch.nn.Module):
    """The checks' own character model, with the notebook's interface: ``forward(chars, h) -> (logits, h)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(12, 6)
        self.cell = torch.nn.RNNCell(6, 10)
        self.out = torch.nn.Linear(10, 12)

    def forward(self, chars: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = []
        for c in chars:
            h = self.cell(self.embed(c), h)
            logits.append(self.out(h))
        return torch.stack(logits), h


class _EncoderHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _char_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(4)
    stream = torch.randint(0, 12, (33, 3), generator=generator)
    return [(stream[i : i + 8], stream[i + 1 : i + 9]) for i in range(0, 32, 8)]


def _chunk_loss(
    model: torch.nn.Module, h: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits, h = model(inputs, h)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), h


def _prefill(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)


def _state(model: torch.nn.Module) -> torch.Tensor:
    return flat([p.detach() for p in model.parameters()])


Reference = Callable[..., None]  # reference(model, optimizer, before_step=None): a loop the check runs itself
ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def _judge_loop(
    call: Callable[[ModelT, torch.optim.Optimizer], Any],
    make_model: Callable[[], ModelT],
    references: Mapping[str, Reference],
    steps: int,
    unit: tuple[str, str],
    counted: Callable[[ModelT], torch.nn.Module],
    what_runs: str,
    hint_error: str,
    hint_wrong: str,
) -> list[str]:
    """Run ``call`` (the learner's loop) twice on a model from ``make_model``, ``.grad`` pre-filled, watched by a
    :class:`LoopWatch`; compare its parameters after each call with ``references["right"]`` run the same way,
    and with the right loop clipped to the learner's gradient norms, naming the wrong reference it matches
    instead. ``unit`` is what one step is for ("batch", "batches"). Raises :class:`Rejected`; returns notes on
    an accepted loop (it clips, it retained, it ran ``counted`` more than once per step)."""
    torch.manual_seed(0)
    model, runs = make_model(), {name: make_model() for name in (*references, "clipped")}
    for other in runs.values():
        other.load_state_dict(model.state_dict())
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=_LR) for name, m in runs.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR)
    for m in (model, *runs.values()):
        _prefill(m)
    meter = SavedTensorMeter()
    watch = LoopWatch(model, optimizer, meter, counted(model))
    notes: dict[str, str] = {}
    norms: list[float] = []  # the learner's gradient norm at each step, both calls
    unclipped: list[float] = []  # the clipped reference's own, before it scales them
    for call_number in (1, 2):
        where = "" if call_number == 1 else "On a second call, continuing from the first: "
        before = _state(model)
        watch.clear()
        with meter, watch.watching():
            run_answer(
                call, model, optimizer, who="your loop", hint=hint_error, where=where, trained=list(model.parameters())
            )
        if len(watch.held) != steps:
            raise Rejected(
                f"optimizer.step() ran {len(watch.held)} times; one step per {unit[0]} is {steps}.",
                f"Call optimizer.step() once per {unit[0]}, after its backward.",
                where,
            )
        for name, reference in references.items():
            reference(runs[name], optimizers[name])
        norms += watch.norms

        def clip_as_the_learner(index: int, clipped_model: torch.nn.Module) -> None:
            unclipped.append(gradient_norm(clipped_model))
            scale_down_to(clipped_model, watch.norms[index])

        references["right"](runs["clipped"], optimizers["clipped"], before_step=clip_as_the_learner)
        got = _state(model)
        right = gradients_close(got, _state(runs["right"]))
        clipped = not right and is_norm_clipping(norms, unclipped) and gradients_close(got, _state(runs["clipped"]))
        if right or clipped:
            if held := max(watch.held):
                at = next(i for i, b in enumerate(watch.held, start=1) if b)
                if watch.retained_bytes:
                    raise Rejected(
                        f"when optimizer.step() ran at {unit[0]} {at}, graphs still held "
                        f"{format_bytes(held)} of saved buffers: a backward with retain_graph=True keeps "
                        "them, and no later backward goes through them.",
                        "Let each backward free its graph.",
                        where,
                    )
                raise Rejected(
                    f"when optimizer.step() ran at {unit[0]} {at}, graphs still held {format_bytes(held)} "
                    "of saved buffers that no backward had freed: a graph no backward went through (a "
                    "second forward, kept in a variable?) or one a backward retained was still alive.",
                    "Compute what you only log under torch.no_grad(), or from the loss with .item().",
                    where,
                )
            if any(watch.earlier_alive):
                at = watch.earlier_alive.index(True) + 1
                raise Rejected(
                    f"when optimizer.step() ran at {unit[0]} {at}, the graph of an earlier {unit[0]}'s loss "
                    "was still alive: your loop still holds that loss tensor (in a list?), or a tensor "
                    "computed from it, and with it that graph's nodes (backward() freed its buffers, not "
                    "its nodes).",
                    "For a log, keep numbers: loss.item().",
                    where,
                )
            if clipped:
                notes["clipped"] = (
                    "You also clip the gradient's norm, a common guard for recurrent networks: your "
                    "parameters are the right loop's with each step's gradient scaled down to the "
                    "norm yours had."
                )
            if watch.retained_bytes:
                kept = max(watch.retained_bytes)
                notes["retained"] = "retain_graph=True was not needed: no later backward goes through those graphs" + (
                    f", and it left up to {format_bytes(kept)} of buffers alive after a backward "
                    "until your loop dropped the graph, where a plain backward frees them at once."
                    if kept
                    else "."
                )
            if watch.runs > steps:
                notes["runs"] = (
                    f"Your loop ran {what_runs} {watch.runs} times in {steps} {unit[1]}: one run per "
                    f"{unit[0]} gives the same parameters, so the others only add their cost."
                )
            continue
        if gradients_close(got, before):
            raise Rejected("the parameters did not change: no gradient reached them.", hint_wrong, where)
        for name, message in _MISTAKES.items():
            if name in runs and gradients_close(got, _state(runs[name])):
                raise Rejected(message, _MISTAKE_HINTS.get(name, hint_wrong), where)
        raise Rejected("after your loop the parameters differ from those of the right loop.", hint_wrong, where)
    if reads_data(call):
        notes["data"] = (
            "Your code reads .data, which works here as .detach() would; prefer .detach(): a tensor "
            "taken with .data has a version counter of its own, so autograd cannot catch an in-place "
            "change to it."
        )
    return [notes[key] for key in ("clipped", "retained", "runs", "data") if key in notes]


_MISTAKES = {
    "no zero_grad": "the parameters are those of a loop that never zeroes .grad: each step used the sum of every "
    "earlier step's gradients, and what .grad held before the loop.",
    "zero after step": "the parameters are those of a loop that zeroes .grad only after its step: the first "
    "step used what .grad held before the loop.",
    "h from zeros": "the parameters are those of a loop that starts each batch from h = zeros: truncated BPTT "
    "carries h's values into the next batch and cuts only its graph.",
    "features once, retained": "the parameters are those of a loop that backpropagates every step through the "
    "features computed once, before the first step: the encoder's gradient comes from "
    "its first weights' graph every time.",
    "encoder frozen": "the parameters are those of a loop in which model.encoder never trains: its weights did "
    "not change, since the features were cut from its graph; the encoder is meant to train.",
}


_MISTAKE_HINTS = {
    "no zero_grad": "Call optimizer.zero_grad() before each backward.",
    "zero after step": "Call optimizer.zero_grad() before each backward, not only after the step.",
}


def _passed(message: str, notes: Sequence[str]) -> CheckResult:
    return CheckResult(True, " ".join([message, *notes]))


# -- exercise 2: truncated BPTT ---------------------------------------------------------------------


def _finish_step(
    index: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    before_step: Callable[[int, torch.nn.Module], None] | None,
    mistake: str | None,
) -> None:
    """How every reference batch ends: the check's look before the step, the step, and the 'zero after step'
    mistake."""
    if before_step is not None:
        before_step(index, model)
    optimizer.step()
    if mistake == "zero after step":
        optimizer.zero_grad()


def _bptt_reference(mistake: str | None) -> Reference:
    def train(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        before_step: Callable[[int, torch.nn.Module], None] | None = None,
    ) -> None:
        h = torch.zeros(3, 10)
        for index, (inputs, targets) in enumerate(_char_batches()):
            h = torch.zeros(3, 10) if mistake == "h from zeros" else h.detach()
            loss, h = _chunk_loss(model, h, inputs, targets)
            if mistake is None or mistake == "h from zeros":
                optimizer.zero_grad()
            loss.backward()
            _finish_step(index, model, optimizer, before_step, mistake)

    return train


@checked
def check_truncated_bptt(train_truncated: Callable[..., Any]) -> CheckResult:
    """Exercise 2: ``train_truncated(model, optimizer, batches, h)`` trains on the batches in order, carrying
    ``h``'s values from batch to batch and cutting its graph at each boundary, one step per batch. Run twice
    on the check's own character model, ``.grad`` pre-filled, against reference loops.

    Used by notebook 04_carried_state.
    """
    references = {
        name: _bptt_reference(None if name == "right" else name)
        for name in ("right", "no zero_grad", "zero after step", "h from zeros")
    }
    notes = _judge_loop(
        lambda model, optimizer: train_truncated(model, optimizer, _char_batches(), torch.zeros(3, 10)),
        _TinyCharRNN,
        references,
        steps=4,
        unit=("batch", "batches"),
        counted=lambda model: model,
        what_runs="the model",
        hint_error="h still carries the previous batch's graph: cut it at the start of each batch.",
        hint_wrong="Each batch: h = h.detach(), forward, zero_grad, backward, step.",
    )
    return _passed(
        "each batch starts from the last one's h, cut from its graph, and no graph's buffers were "
        "alive at any optimizer.step().",
        notes,
    )


# -- exercise 3: a tensor computed before the loop ---------------------------------------------------


def _classifier_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,), generator=generator)


def _classifier_reference(mistake: str | None) -> Reference:
    def train(
        model: _EncoderHead,
        optimizer: torch.optim.Optimizer,
        before_step: Callable[[int, torch.nn.Module], None] | None = None,
    ) -> None:
        inputs, labels = _classifier_data()
        features = model.encoder(inputs)
        for index in range(4):
            if mistake != "features once, retained":
                features = model.encoder(inputs)
            if mistake not in ("no zero_grad", "zero after step"):
                optimizer.zero_grad()
            loss = F.cross_entropy(model.head(features.detach() if mistake == "encoder frozen" else features), labels)
            loss.backward(retain_graph=mistake == "features once, retained")
            _finish_step(index, model, optimizer, before_step, mistake)

    return train


@checked
def check_precomputed_fix(train_classifier: Callable[..., Any]) -> CheckResult:
    """Exercise 3: ``train_classifier(model, optimizer, inputs, labels, steps)`` trains ``model.encoder`` and
    ``model.head`` together for ``steps`` steps. Run twice on the check's own model, ``.grad`` pre-filled,
    against reference loops.

    Used by notebook 04_carried_state.
    """
    references = {
        name: _classifier_reference(None if name == "right" else name)
        for name in ("right", "encoder frozen", "features once, retained", "no zero_grad", "zero after step")
    }
    notes = _judge_loop(
        lambda model, optimizer: train_classifier(model, optimizer, *_classifier_data(), 4),
        _EncoderHead,
        references,
        steps=4,
        unit=("step", "steps"),
        counted=lambda model: model.encoder,
        what_runs="model.encoder",
        hint_error="The features are computed once, so every step backpropagates through the same graph.",
        hint_wrong="Compute the features from model.encoder inside the loop, every step.",
    )
    return _passed(
        "the features are rebuilt every step, so each backward goes through this step's graph only, "
        "and the encoder trains.",
        notes,
    )
