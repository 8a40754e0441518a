"""The fix for a second backward through buffers an earlier backward of the same iteration freed, in the learner's own
names: a loss built inside the loop that runs the backward line twice, a GAN's D loss on ``fake.detach()``, a retain in
the earlier backward only, the losses summed, the stale graph computed again after the step that changed its weights,
one of two updates kept (an epoch's total after per-batch steps), or a total added to again after its first backward
started again at 0 (SAM's second pass); and where a stale forward's lines are: the learner's line that computed it, in
the nearest of the raising backward's callers that did (:func:`line_of_a_caller`), and the end of the statement that
runs the step it goes again after (:func:`where_the_step_ends`).

Used by :mod:`backward_twice.judge.gan_retain`, :mod:`backward_twice.judge.verdicts` and
:mod:`backward_twice.report.error_item`.
"""

from __future__ import annotations

import ast
import linecache
import re
from typing import TYPE_CHECKING

from backward_twice.judge.closures import read_by_the_raising_closure
from backward_twice.judge.fixes import total_fix
from backward_twice.judge.uses import assigned_in_the_loss, read_in_the_loss, summed_over_steps
from backward_twice.record.learner import lines_of_file, site_of
from backward_twice.record.sources import class_around, function_around, parsed

if TYPE_CHECKING:
    from backward_twice.record.recorder import Recorder

__all__ = [
    "earlier_backward_in_its_function",
    "in_the_function_of",
    "keep_one_update",
    "line_of_a_caller",
    "second_backward_fix",
    "where_the_step_ends",
]

D_LOSS = re.compile(r"\bloss_?[Dd](?![a-z])|\b[Dd]_?loss|\berrD")  # a discriminator's loss: loss_D, d_loss, errD
G_OUTPUT = re.compile(r"(?i)^(?:self\.)?(?:fake\w*|gen(?:erated)?_\w+|\w*_fake)$")  # a generator's output, by name
_GAN = re.compile(r"(?i)fake|discriminator|\bnet_?D\b|\bD\(|\berrD|\bd_?loss|\bloss_?D\b|\bgen(erated)?_")  # G, D


def second_backward_fix(
    freed_at: str,
    raised_at: str,
    through: str,
    shared: bool = True,
    parameter: str | None = None,
    earlier_steps_its_source: bool | None = None,
    stepped: str | None = None,
) -> str:
    """The fix for a backward through buffers an earlier backward of the same iteration freed, reached through the
    learner's ``through``: the same backward line run twice (an inner loop, a WGAN's critic steps on one ``fake``)
    wants ``through`` built inside that loop or detached there; two backward lines (a GAN's D loss on ``fake``, then
    G's) want the earlier loss on ``through.detach()``, unless that loss must train what ``through`` comes from: then
    retain in the earlier backward only, as for two losses. When the earlier backward never walked ``through``
    (``shared`` False: two heads' losses meet inside a model's ``forward``), no detach of it applies. Where an
    optimizer stepped between the two backward calls, ``earlier_steps_its_source`` says whether it trains what
    ``through`` comes from: then the later loss detaches it (a world model's encoder trained by its own loss first),
    else the earlier one (a GAN's D loss). A D loss built
    in a function from its ``parameter`` (CycleGAN's ``backward_D_basic(netD, real, fake)``) detaches the parameter:
    one change for every call of it. ``stepped``: the line of a step between the two that changed the weights
    ``through``'s graph saved, where the later loss trains nothing but through it (SAM's ``first_step``, a REINFORCE
    update run twice): no retain keeps that graph usable and no detach leaves a gradient, so ``through`` is built
    again."""
    freer = site_of(freed_at)
    line = f"line {freer[1]}'s backward" if freer else "the earlier backward"
    freer_code = freed_at.split(": ", 1)[-1]
    if re.search(r"\bcreate_graph\s*=\s*True", freer_code) and re.search(r"\bretain_graph\s*=\s*False", freer_code):
        # MAML's inner step: create_graph=True keeps the graph for the outer backward, unless told not to
        where = f"line {freer[1]}" if freer else "the earlier call"
        return f"remove `retain_graph=False` from {where}: with create_graph=True the graph is kept unless it says so"
    if freer is not None and not re.search(r"(?:backward|grad)\s*\(", freer_code):  # a framework's backward
        loss = re.match(r"\s*([\w.]+(?:\[[^\]]*\])?)\s*\.backward\(", raised_at.split(": ", 1)[-1])  # (``fit``)
        spelled = loss.group(1) if loss else None
        own = re.sub(r"^\w+\.", "self.", spelled) if spelled and "." in spelled else spelled  # a callback's
        added = "this loss" if own is None else f"`{own}`" + (f" (`{spelled}` here)" if own != spelled else "")
        raiser = site_of(raised_at)
        backward = f" and remove the backward at line {raiser[1]}" if raiser else ""
        returned = "the loss your step returns"
        computed = _compute_loss_return(raiser) if raiser else None
        if re.search(r"\.training_step\(", freer_code) or _in_a_trainer_callback(raiser):  # Hugging Face's
            # ``Trainer``: its step returns the loss detached; the one it walks is ``compute_loss``'s, by default
            # the model's own
            returned = (
                f"the loss `compute_loss` returns (line {computed})"
                if computed
                else "the loss your model's forward returns"
            )
        return (
            f"add {added} to {returned}{backward}, so the framework's one backward walks both: a "
            "backward of its own after the framework's finds the buffers they share freed"
        )
    raiser = site_of(raised_at)
    later = raiser[1] if raiser is not None and ": " in raised_at else None
    root = re.match(r"\s*(\w+)\s*\.backward\(", raised_at.split(": ", 1)[-1])  # what both backward calls start
    total = root.group(1) if root and re.match(rf"\s*{root.group(1)}\s*\.backward\(", freer_code) else through
    restart = _added_to_between(total, freer, later) if freer is not None and freed_at != raised_at else None
    if restart is not None:  # SAM#10: ``loss += loss_t`` again after the first backward, the first pass's in it
        return (
            f"set `{total} = 0` before line {restart}, so line {later}'s backward walks only the losses added after "
            f"{line}: `{total}` still holds the ones that backward freed"
        )
    step = site_of(stepped) if stepped is not None else None
    if step is not None and freed_at == raised_at:
        whole = re.sub(r"\[\d+\]$", "", through)  # the list an episode fills, not its item
        return (
            f"run {line} once per graph: run again, it walks the graph its first run freed, whose weights the step "
            f"at line {step[1]} changed (or build `{whole}` again after that step)"
        )
    epoch = summed_over_steps(freer[0], freer[1], step[1], later) if step and freer and later else None
    if step is not None and epoch is not None and later is not None:  # an epoch's backward of the batches' losses,
        return keep_one_update(*epoch, step[1], later)  # each batch stepped
    made = assigned_in_the_loss(freer[0], freer[1], through) if step is not None and freer is not None else None
    fake = next((name for name in sorted(made[1]) if G_OUTPUT.search(name)), None) if made is not None else None
    if step is not None and freer is not None and made is not None and fake is not None:  # D's output on G's
        code = linecache.getline(freer[0], made[0]).split("#", 1)[0].strip()  # ``fake`` in both losses: D's
        return (  # loss walked G's graph too
            f"use `{fake}.detach()` at line {made[0]} (`{code}`), and compute `{through}` again from `{fake}` after "
            f"line {step[1]}'s step for line {later}'s backward: a GAN's D loss must not train what `{fake}` comes from"
        )
    if step is not None:
        return (
            f"compute `{through}` again after line {step[1]}'s step: line {later}'s backward needs the graph {line} "
            "freed, and that step changed the weights it saved"
        )
    if later is not None and D_LOSS.search(raised_at.split(": ", 1)[-1]) and not D_LOSS.search(freed_at):
        # G's backward first, then D's through the same fake: D's loss is the one to detach it in
        if parameter is not None and parameter != through:
            return (
                f"use `{parameter}.detach()` in the loss line {later}'s backward walks (a GAN's D loss must "
                f"not train what `{parameter}` comes from: `{through}` here)"
            )
        where = _where_the_later_loss_reads(raiser, later, through)
        return f"use `{through}.detach()` {where}: a GAN's D loss must not train what `{through}` comes from"
    losses = _losses_iterated(raised_at) if freed_at == raised_at else None
    if losses is not None:  # ``for loss in outputs: loss.backward()``: the losses of one forward, one by one
        shared_graph = (
            "one forward's graph"
            if re.match(rf"\s*{re.escape(through)}\s*\.", raised_at.split(": ", 1)[-1])
            else f"the graph `{through}` was built from"
        )
        return (
            f"sum the losses and call backward() once (`sum({losses}).backward()`), or add retain_graph=True to "
            f"each backward but the last: they share {shared_graph}"
        )
    summed = _summed_in_the_loop(through, raised_at) if freed_at == raised_at else None
    if summed is not None:  # gradient accumulation written as ``total = total + term; total.backward()``
        return total_fix(*summed, raised_at.split(": ", 1)[-1], site_of(raised_at))
    if freed_at != raised_at and _differentiates(through, freer_code) and _differentiates(through, raised_at):
        # one loss differentiated twice (DARTS: its gradient for the architecture, then for the weights): nothing
        # to detach, as detaching the root leaves nothing to differentiate
        return f"add retain_graph=True to {line} only: both differentiate `{through}`"
    closure = read_by_the_raising_closure(through, raiser) if freed_at == raised_at and raiser else None
    if closure is not None:  # LBFGS runs the closure (and its backward) several times in one step
        return closure
    if freed_at == raised_at:
        return (
            f"build `{through}` inside the loop that runs {line}, or use `{through}.detach()` there if this loss "
            f"needs no gradient through it"
        )
    if not shared:
        return (
            f"sum the losses and call backward() once, or add retain_graph=True to {line} only: both walk the graph "
            f"`{through}` was built from"
        )
    if earlier_steps_its_source is not None and later is not None:  # the step between the two backward calls tells
        if earlier_steps_its_source:  # which loss trains what ``through`` comes from: the other one must not
            where = _where_the_later_loss_reads(raiser, later, through)
            return (
                f"use `{through}.detach()` {where}: the step after {line} trains what `{through}` comes from, and this "
                "later loss must not"
            )
        read = read_in_the_loss(freer[0], freer[1], through) if freer else None
        code = linecache.getline(freer[0], read).split("#", 1)[0].strip() if freer and read else ""
        gan = " (a GAN's D loss)" if _GAN.search(f"{freer_code} {code} {through}") else ""  # not an encoder's
        untrained = f"does not train what `{through}` comes from{gan}"
        if freer is not None and read is not None and read != freer[1]:  # the line to change: where D's loss reads it
            return f"use `{through}.detach()` at line {read} (`{code}`): the step after {line} {untrained}"
        return f"use `{through}.detach()` in the loss {line} walks: the step after it {untrained}"
    if re.search(r"\bgrad\s*\(", freer_code) and not re.search(r"\bcreate_graph\s*=", freer_code):
        # a gradient the loss is built from (an input-gradient penalty) has no graph without create_graph=True
        return (
            f"add create_graph=True to line {freer[1] if freer else '?'}'s `autograd.grad` if the loss trains through "
            "the gradient it returns (a gradient penalty; it keeps the graph too), else retain_graph=True"
        )
    gan = " (a GAN's D loss)" if _GAN.search(f"{freer_code} {through}") else ""
    return (
        f"use `{through}.detach()` in the loss {line} walks if it must not train what `{through}` comes from{gan}; if "
        f"it must, sum the losses and call backward() once, or add retain_graph=True to {line} only"
    )


def _added_to_between(through: str, freer: tuple[str, int], later: int | None) -> int | None:
    """The line to start ``through`` again at, where the code adds to it (``loss += loss_t``) between the backward at
    ``freer`` and the one at ``later`` in one function without assigning it: the loop that adds (its header), or the
    addition itself; None for any other code."""
    tree = parsed(freer[0])
    if tree is None or later is None or not through.isidentifier():
        return None
    function = function_around(tree, later)
    between = [n for n in ast.walk(function) if isinstance(n, ast.stmt) and freer[1] < n.lineno < later]
    assigned = any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == through for t in n.targets)
        for n in between
    )
    added = [
        n
        for n in between
        if isinstance(n, ast.AugAssign)
        and isinstance(n.op, ast.Add)
        and isinstance(n.target, ast.Name)
        and n.target.id == through
    ]
    if assigned or not added or function_around(tree, freer[1]) is not function:
        return None
    loops = [
        n
        for n in between
        if isinstance(n, (ast.For, ast.While)) and n.lineno <= added[0].lineno <= (n.end_lineno or n.lineno)
    ]
    return min((n.lineno for n in loops), default=added[0].lineno)


def _where_the_later_loss_reads(raiser: tuple[str, int] | None, later: int, through: str) -> str:
    """Where to put ``through.detach()`` in the loss the backward at line ``later`` walks: "at line 16 (`kl2 =
    ...`)", the line of it that reads ``through``, else "in the loss line 19's backward walks"."""
    read = read_in_the_loss(raiser[0], later, through) if raiser is not None else None
    if raiser is None or not read or read == later:
        return f"in the loss line {later}'s backward walks"
    return f"at line {read} (`{linecache.getline(raiser[0], read).split('#', 1)[0].strip()}`)"


def keep_one_update(total: str, header: int, step: int | str, backward: int | str) -> str:
    """The fix for an epoch's backward of ``total``, which the loop at ``header`` adds each batch's loss to, where
    each batch also steps at line ``step``: the two updates cannot both stand on the batches' graphs."""
    return (
        f"`{total}` adds up losses of every pass of the loop at line {header}, and line {step}'s step changes the "
        f"weights between them: keep one of the two updates (line {step}'s step, or line {backward}'s backward and "
        "the step after it)"
    )


def _differentiates(through: str, line: str) -> bool:
    """Whether ``line`` (its code) differentiates ``through`` itself: ``through.backward(``, or
    ``torch.autograd.grad(through, ...)``."""
    code, name = line.split(": ", 1)[-1], re.escape(through)
    return bool(re.search(rf"(?<![\w.]){name}\s*\.backward\(|\bgrad\(\s*(?:outputs\s*=\s*)?{name}\s*,", code))


def _summed_in_the_loop(through: str, raised_at: str) -> tuple[str, str] | None:
    """(the total's name, what is added) where the raising backward's file keeps ``through`` as a running total of
    losses (``total = total + loss_term`` or ``total += loss_term``) and that backward walks it (``total.backward()``):
    the same backward line, run again in an inner loop, walks the terms an earlier run of it freed."""
    if not re.match(rf"\s*{re.escape(through)}\s*\.backward\(", raised_at.split(": ", 1)[-1]):
        return None
    total = re.compile(rf"\s*({re.escape(through)})\s*(?:\+=|=\s*{re.escape(through)}\s*\+)\s*(.+)$")
    found = next(filter(None, map(total.match, lines_of_file(raised_at))), None)
    return (found.group(1), found.group(2).strip()) if found else None


def _losses_iterated(raised_at: str) -> str | None:
    """What the ``for`` around the raising line iterates, when its backward is called on that loop's own item
    (``for loss in outputs: loss.backward()``): the losses of one forward, each walked in turn; None otherwise."""
    site = site_of(raised_at)
    receiver = re.match(r"\s*(\w+)\s*\.backward\(", raised_at.split(": ", 1)[-1])
    tree = parsed(site[0]) if site is not None else None
    if tree is None or site is None or receiver is None:
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.For, ast.AsyncFor))
            and isinstance(node.target, ast.Name)
            and node.target.id == receiver.group(1)
            and node.body[0].lineno <= site[1] <= (node.end_lineno or node.lineno)
        ):
            return ast.unparse(node.iter)
    return None


def _in_a_trainer_callback(raiser: tuple[str, int] | None) -> bool:
    """Whether the raising line is in a class derived from a Hugging Face ``TrainerCallback``."""
    around = class_around(raiser) if raiser is not None else None
    return around is not None and any(ast.unparse(base).endswith("TrainerCallback") for base in around.bases)


def _compute_loss_return(raiser: tuple[str, int]) -> int | None:
    """The line of the first ``return`` of the ``compute_loss`` method of the class whose method raised (a Hugging
    Face ``Trainer`` subclass's), None where that class does not define one."""
    around = class_around(raiser)
    for method in around.body if around is not None else ():
        if isinstance(method, ast.FunctionDef) and method.name == "compute_loss":
            returns = [n.lineno for n in ast.walk(method) if isinstance(n, ast.Return) and n.value]
            return min(returns, default=None)
    return None


def where_the_step_ends(
    stale: tuple[str, int], step: tuple[str, int], callers: tuple[tuple[str, int], ...]
) -> int | None:
    """The last line of the statement, beside the one that computed ``stale`` in its function, that runs the step at
    ``step``: the ``with torch.no_grad():`` around a hand update's loop, or the last call before the raising one of
    the function that steps (``update_params(self.q2_optim, ...)``, its ``optim.step()`` in ``update_params``; the
    raising call among ``callers``, the raising backward's frames, innermost first). None where that is the step's
    own line, or nothing there runs it."""
    tree = parsed(stale[0])
    if tree is None:
        return None
    function = function_around(tree, stale[1])
    stepper = parsed(step[0])
    stepping = function_around(stepper, step[1]) if stepper is not None else None
    own = step[0] == stale[0] and function_around(tree, step[1]) is function
    name = getattr(stepping, "name", None)
    raising = next(
        (line for file, line in callers if file == stale[0] and function_around(tree, line) is function), None
    )
    for block in _blocks_around(function, stale[1]):
        after = [s for s in block if s.lineno > stale[1]]
        if own:
            holding = next((s for s in after if s.lineno <= step[1] <= (s.end_lineno or s.lineno)), None)
            if holding is not None:
                end = holding.end_lineno or holding.lineno
                return None if end == step[1] else end
        elif name is not None and raising is not None:
            before = [s for s in after if (s.end_lineno or s.lineno) < raising]
            calling = [s for s in before if any(_calls(node, name) for node in ast.walk(s))]
            if calling:
                return calling[-1].end_lineno or calling[-1].lineno
    return None


def _blocks_around(function: ast.AST, line: int) -> list[list[ast.stmt]]:
    """The statement lists of ``function`` that hold ``line``, innermost first."""
    blocks: list[list[ast.stmt]] = []
    body: list[ast.stmt] | None = getattr(function, "body", None)
    while body:
        blocks.append(body)
        holding = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        inner = [
            b
            for field in ("body", "orelse", "finalbody", "handlers")
            for b in [getattr(holding, field, None)]
            if isinstance(b, list) and b and any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in b)
        ]
        if holding is None or isinstance(holding, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not inner:
            break
        body = inner[0]
    return blocks[::-1]


def _calls(node: ast.AST, name: str) -> bool:
    """Whether ``node`` calls a function named ``name`` (``update_params(...)``, ``self.update(...)``)."""
    if not isinstance(node, ast.Call):
        return False
    called = node.func
    return (isinstance(called, ast.Name) and called.id == name) or (
        isinstance(called, ast.Attribute) and called.attr == name
    )


def line_of_a_caller(
    recorder: Recorder, node: int, own_line: tuple[str, int], callers: tuple[tuple[str, int], ...]
) -> tuple[str, int] | None:
    """The line of the nearest of ``callers`` (the raising call's outer frames, innermost first) that built ``node``:
    its own line ``own_line`` where that function runs it (``logits = net(x)`` of ``one_step``, which calls
    ``update``), else the line of its call that led there; None when none of them did."""
    for caller in callers:
        if in_the_function_of(own_line, caller):
            return own_line  # the caller's own code built it: not the call out of it
        line = recorder.creation.call_line_of(node, caller)
        if line != own_line:
            return line
    return None


def in_the_function_of(site: tuple[str, int], raised: tuple[str, int]) -> bool:
    """Whether ``site`` lies in the function of the line ``raised`` (a step that built its forward and raised), or
    both at a script's top level."""
    tree = parsed(raised[0]) if site[0] == raised[0] else None
    if tree is None:
        return False
    function = function_around(tree, raised[1])
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a script's top level: its own lines
        return function_around(tree, site[1]) is tree
    return function.body[0].lineno <= site[1] <= (function.end_lineno or 0)


def earlier_backward_in_its_function(filename: str, line: int) -> int | None:
    """The line of the nearest ``autograd.grad``, ``backward`` or ``autograd.backward`` call before ``line`` in the
    function around it (a custom autograd.Function's ``backward`` asking for two gradients, one call each): the call
    that freed the graph the one at ``line`` walks. None where none comes before it (one call in a loop)."""
    tree = parsed(filename)
    function = function_around(tree, line) if tree is not None else None
    if tree is None or function is None:
        return None
    calls = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in ("grad", "backward")
        and node.lineno < line
        and function_around(tree, node.lineno) is function
    ]
    return max(calls, default=None)
