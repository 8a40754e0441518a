"""The item of an error no carried graph explains: the learner's line that raised, with what caused it where the
recording shows it (the optimizer step that changed the weights a stale forward saved, the learner's in-place
statement, the backward that freed the buffers, the operation that left a loss without a graph), one sentence of
why and one line of fix in their own names.

Used by :mod:`backward_twice.report.rendering`.
"""

from __future__ import annotations

import ast
import re

from backward_twice.common.error_kinds import LEAF_IN_PLACE
from backward_twice.judge.frozen import FROZEN, GRAD_OFF, GRAD_OFF_BEFORE, INFERENCE_BEFORE
from backward_twice.judge.second_backward import keep_one_update
from backward_twice.judge.uses import computed_again, summed_over_steps
from backward_twice.judge.verdicts import ErrorVerdict, LineVerdict
from backward_twice.record.learner import site_of
from backward_twice.report.items import CodeLine, Item, line_number, raising_line, span_of, split_line

__all__ = ["error_item"]

_GAN_HINT = "a GAN: G's loss on a fresh D(fake)"
# The errors whose fix is not a line of the learner's: (one sentence of why, one line of fix). PyTorch's message is
# shown once, by the traceback and in the evidence, which also holds the full advice (judge.fixes.ERROR_FIXES).
_ABOUT_THE_KIND = {
    "donated buffers": (
        "torch.compile compiled this backward for one use: it reuses the saved buffers, so a backward that retains"
        " them is refused",
        "call backward() once per forward, on the sum of the losses",
    ),
    "DDP ready only once": (
        "DistributedDataParallel averages the gradients once per forward; a second backward through the same"
        " parameters breaks that",
        "call backward() once per forward, on the sum of the losses (not static_graph=True or"
        " find_unused_parameters=True)",
    ),
    "no graph": (
        "the loss has no graph back to the weights: computed under torch.no_grad(), or from .detach()ed tensors or"
        " .item() numbers",
        "compute the loss outside torch.no_grad(), from the model's output as it is",
    ),
}

# G's optimizer's step: opt_G, optimizerG, g_optim, gen_opt
_GENERATOR_STEP = re.compile(r"(?i)\bopt(im|imizer)?_?g(en)?\b|\boptimizerG\b|\bgenerator|\bg(en)?_?opt(im|imizer)?\b")
_ON_A_FAKE = re.compile(r"(?i)fake|\berrG|\bg(en)?_?loss|\bloss_?G\b")  # a forward of D on G's output, or G's loss
_D_BACKWARD = re.compile(r"\bloss_?[Dd](?![a-z])|\b[Dd]_?loss|\berrD|[Dd]iscriminator")  # D's loss is what raised
_DISCRIMINATOR = re.compile(r"\bfake|[Dd]iscriminator|net_?D\b|_D\b|\bD\(|\bD_|\bd_loss|\berrD")


def _gan_hint(*code: str) -> str:
    """`` (a GAN: G's loss on a fresh D(fake))`` where the lines speak of a discriminator (``fake``, ``netD``,
    ``opt_D``, ``discriminator``); nothing for an actor and a critic, or a generator's own stale forward."""
    return f" ({_GAN_HINT})" if any(_DISCRIMINATOR.search(line) for line in code) else ""


def error_item(error: ErrorVerdict, band_aid: LineVerdict | None = None) -> Item:
    raising = raising_line(error)
    lines = [raising]
    step = re.search(r"(?:optimizer step|your update) at (.+)$", error.evidence)
    freed = re.search(r"freed by the backward at (.+?) in iteration", error.evidence)
    fix = _first_clause(error.fix)
    if error.kind == "in-place version error":
        why = "backward needs the values the forward saved; an in-place change replaced them"
        label = "a tensor this backward needs was changed in place after the forward saved it"
        if step is not None:
            step_place, step_code = split_line(step.group(1))
            step_number = line_number(step_place)
            lines.insert(0, CodeLine(step_place, step_code, (0, len(step_code)), "changed the weights it saved"))
            label = f"this backward needs weights that the optimizer step at line {step_number} changed"
            why = f"this backward goes through a forward computed before line {step_number}'s step changed its weights"
            gan = _gan_hint(step_code, raising.code)
            fix = f"compute the forward again after line {step_number}'s step{gan}"
            if error.stale_line is not None:
                stale_place, stale_code = split_line(error.stale_line)
                stale_number = line_number(stale_place)
                lines.insert(
                    0, CodeLine(stale_place, stale_code, (0, len(stale_code)), "computed with the old weights")
                )
                label = (
                    f"this backward goes through line {stale_number}, computed before the step at line {step_number}"
                )
                gan = _gan_hint(step_code, raising.code, stale_code)
                if gan and not _ON_A_FAKE.search(stale_code + " " + raising.code):  # D's own penalty on real data
                    gan = ""  # (StyleGAN2's R1 ``autograd.grad`` of ``real_pred``): no G loss on a fresh D(fake)
                if gan and _GENERATOR_STEP.search(step_code):
                    # G stepped first, then D's backward walks G's graph through the fake made before that step
                    # (Lightning's basic GAN with G's backward retained): not G's loss on a fresh D(fake); G's own
                    # regularizer (StyleGAN2's path length on ``fake_img``) is no D's loss at all
                    gan = (
                        " (a GAN: D's loss on a fake G made after its step)" if _D_BACKWARD.search(raising.code) else ""
                    )
                again = _computed_again(error.stale_line, raising.code, step_number, error.line)
                after = f"line {error.step_ends}" if error.step_ends is not None else f"the step at line {step_number}"
                fix = f"compute {again} again after {after}{gan}"
                summed = _summed_over_steps(error.stale_line, error.line, step_number)
                if summed is not None:
                    fix = keep_one_update(*summed, step_number, line_number(raising.place))
                if error.stale_through is not None:  # the later loss trains other weights: it must not train these
                    name, later = error.stale_through, line_number(raising.place)
                    fix = (
                        f"use `{name}.detach()` in the loss line {later}'s backward walks: the step at line "
                        f"{step_number} changed the weights `{name}` comes from, and this loss does not train them"
                    )
                if band_aid is not None:  # the forum's band-aid that turned "a second time" into this error
                    fix += f"; remove retain_graph=True at line {line_number(split_line(band_aid.line)[0])}"
        elif error.changed_line is not None:
            changed_place, changed_code = split_line(error.changed_line)
            lines.insert(0, CodeLine(changed_place, changed_code, (0, len(changed_code)), "changed it in place"))
            changed_number = line_number(changed_place)
            label = f"line {changed_number} changed in place a tensor this backward needs"
            why = f"the forward saved that tensor for the backward; line {changed_number} replaced its values"
    elif error.kind == "backward a second time":
        if freed is not None:
            freed_place, freed_code = split_line(freed.group(1))
            lines.insert(0, CodeLine(freed_place, freed_code, (0, len(freed_code)), "freed the buffers"))
            label = f"a second backward through the graph that line {line_number(freed_place)}'s backward freed"
            if not re.search(r"(?:backward|grad)\s*\(", freed_code):  # ``trainer.fit(...)``: the framework's
                label = "a second backward through the graph the framework's backward freed"
        elif (inside := re.search(r"by a call inside this backward, at (.+)$", error.evidence)) is not None:
            inside_place, inside_code = split_line(inside.group(1))
            lines.append(CodeLine(inside_place, inside_code, (0, len(inside_code)), "runs again, on what it freed"))
            label = f"a second backward runs line {line_number(inside_place)} again, on the buffers its first run freed"
        else:
            label = "a second backward through a graph whose buffers were freed"
        why = "a backward frees the saved tensors it walked; this one needs them again"
    elif error.kind == "no graph" and (cut := error.cut) is not None and cut[1] == INFERENCE_BEFORE:
        label = "the loss has no graph: inference mode was already on when this code began"
        why = (
            "a `torch.inference_mode()` around it (a caller's, or a decorator's) was still in force: autograd recorded "
            "nothing, and `torch.set_grad_enabled(True)` does not undo it"
        )
        fix = "run the loop outside `torch.inference_mode()`, or inside `with torch.inference_mode(False):`"
    elif error.kind == "no graph" and (cut := error.cut) is not None and cut[1] == GRAD_OFF_BEFORE:
        label = "the loss has no graph: autograd was already off when this code began"
        why = (
            "a `torch.set_grad_enabled(False)` run before it (an earlier cell's), or a `torch.no_grad()` around it, "
            "was still in force: autograd recorded nothing"
        )
        fix = "call `torch.set_grad_enabled(True)` before the loop"
    elif error.kind == "no graph" and (cut := error.cut) is not None and cut[1] in (FROZEN, GRAD_OFF):
        cut_place, cut_code = split_line(cut[0])
        number = line_number(cut_place)
        if cut[1] == GRAD_OFF:
            lines.insert(0, CodeLine(cut_place, cut_code, (0, len(cut_code)), "autograd off from here"))
            label = f"the loss has no graph: line {number} turns autograd off"
            why = f"autograd records nothing from line {number} on, and the loss was computed before it was on again"
            fix = "call `torch.set_grad_enabled(True)` before the forward this loss is computed from"
        else:
            names = _listed([f"`{name}`" for name, _, _ in error.frozen])
            offs, ons = sorted({off for _, off, _ in error.frozen}), sorted({on for _, _, on in error.frozen if on})
            switched = f"line {offs[0]} switches" if len(offs) == 1 else f"lines {_listed(offs)} switch"
            lines.insert(0, CodeLine(cut_place, cut_code, (0, len(cut_code)), "switches their gradients off"))
            label = f"the loss has no graph: {switched} off the gradients of {names}"
            why = f"the loss is computed from {names}, whose weights had requires_grad=False when that forward ran"
            back_on = (f"line {ons[0]} switches" if len(ons) == 1 else f"lines {_listed(ons)} switch") if ons else ""
            fix = (
                f"compute this loss's forward through {names} after {back_on} their gradients back on, or do not "
                f"switch them off before it ({'line' if len(offs) == 1 else 'lines'} {_listed(offs)})"
                if ons
                else f"switch the gradients of {names} back on before the forward this loss is computed from"
            )
    elif error.kind == "no graph" and (cut := error.cut) is not None:
        cut_place, cut_code = split_line(cut[0])
        under = cut[1] == "torch.no_grad()"
        marked = "under torch.no_grad()" if under else "no gradient from here"
        lines.insert(
            0, CodeLine(cut_place, cut_code, None if under else span_of(cut_code, cut[1].rstrip("()")), marked)
        )
        number, what = line_number(cut_place), f"`{cut[1]}`"
        label = f"the loss has no graph: line {number}'s {what} gives values with no gradient"
        why = f"the loss is computed from line {number}, and {what} there cuts the graph back to the weights"
        if under:
            label = f"the loss has no graph: line {number} runs under `torch.no_grad()`"
            why = f"the loss is computed from line {number}, and autograd records nothing under `torch.no_grad()`"
        fix = (
            f"run line {number} outside torch.no_grad()"
            if under
            else (
                f"compute the loss from what line {number} applies {what} to"
                + (" (for classes: cross-entropy on the scores)" if cut[1].startswith((".arg", "torch.arg")) else "")
            )
        )
    elif error.kind in _ABOUT_THE_KIND:
        label = f"the loop raised PyTorch's {error.kind} error"
        why, fix = _ABOUT_THE_KIND[error.kind]
    elif LEAF_IN_PLACE in error.message:  # an EMA's update of a parameter, written without torch.no_grad()
        number = line_number(raising.place)
        label = f"line {number} changes a tensor that requires grad in place, with autograd recording"
        why = "a parameter (a leaf that requires grad) can be changed in place only where autograd does not record"
        fix = f"run line {number} under `with torch.no_grad():`"
    else:
        kind, _, said = error.message.partition(": ")
        why = f"the error says: {_first_sentence(said or kind)}"
        if error.caught:  # a hook of the learner's that skips a bad batch: its own choice, a note
            label = f"a backward raised {kind} in iteration {error.iteration}, and your code caught it"
            fix = "your loop went on past it, as you wrote it: nothing to change here"
            return Item("error", label, tuple(lines), why, fix, to_fix=False)
        # Not "before retain_graph matters": a retain or a carried graph may have mattered in the passes before it.
        label = f"the loop raised {kind}"
        fix = "fix this error first, then run the loop under the tool again"
    return Item("error", label, tuple(lines), why, fix)


def _computed_again(stale_line: str, raising_code: str, step: str, raising_line: str) -> str:
    """ "line 32", or "lines 32, 34 and 36" when the loss the raising backward starts from was computed from line 32
    before the step too: recomputing line 32 alone leaves that loss on the old forward (or, the step after the
    backward in a loop, each line from 32 to that loop the loop reads)."""
    site, raised = site_of(stale_line), site_of(raising_line)
    backward = raised[1] if site and raised and raised[0] == site[0] else None
    losses = _backwarded_names(raising_code)
    lines = (
        sorted({line for loss in losses for line in computed_again(site[0], site[1], loss, int(step), backward)})
        if site is not None and step.isdigit()
        else []
    )
    if len(lines) < 2:
        return f"line {line_number(split_line(stale_line)[0])}"
    return f"lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"


def _backwarded_names(code: str) -> list[str]:
    """The names the raising line's backward starts from: ``loss`` of ``loss.backward()``, ``a`` and ``b`` of
    ``(a * b).mean().backward()`` (not the functions it calls)."""
    plain = re.match(r"\s*([\w.]+)\s*\.backward\(", code)
    if plain is not None:
        return [plain.group(1)]
    try:
        tree = ast.parse(code.split("#", 1)[0].strip())
    except SyntaxError:
        return []
    receivers = [
        node.func.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"
    ]
    called = {id(node.func) for receiver in receivers for node in ast.walk(receiver) if isinstance(node, ast.Call)}
    return sorted(
        {
            node.id
            for receiver in receivers
            for node in ast.walk(receiver)
            if isinstance(node, ast.Name) and id(node) not in called
        }
    )


def _summed_over_steps(stale_line: str, raising_line: str, step: str) -> tuple[str, int] | None:
    """What :func:`.summed_over_steps` finds for these lines (a total of losses from passes a step came between)."""
    stale, raising = site_of(stale_line), site_of(raising_line)
    if stale is None or raising is None or stale[0] != raising[0] or not step.isdigit():
        return None
    return summed_over_steps(stale[0], stale[1], int(step), raising[1])


def _first_sentence(message: str, most: int = 110) -> str:
    """The first sentence of an error's message, cut at ``most`` characters: the whole message is in the evidence."""
    sentence = re.split(r"(?<=[.!?])\s", message.strip(), maxsplit=1)[0]
    return sentence if len(sentence) <= most else sentence[: most - 3].rstrip() + "..."


def _listed(words: list[str] | list[int]) -> str:
    """ "a", "a and b", "a, b and c"."""
    said = [str(word) for word in words]
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}"


def _first_clause(fix: str) -> str:
    """A fix's first sentence, without the notebook pointer: the rest is evidence."""
    return re.sub(r"\s*\(notebook \d+, section \d+\)$", "", fix.split(". ")[0]).rstrip(".")
