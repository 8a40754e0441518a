"""``%%diagnose``: :func:`backward_twice.steps.diagnose.diagnose` on a loop body pasted into a notebook cell.

Load it once per kernel with ``%load_ext backward_twice`` (importing the package registers nothing). Then a
cell that starts with ``%%diagnose`` and the names of the models and optimizers the body trains::

    %%diagnose model optimizer
    optimizer.zero_grad()
    loss, h = chunk_loss(model, h, inputs, targets)
    loss.backward()
    optimizer.step()

runs the body as one iteration of a loop, in the notebook's namespace (a name the body assigns, like ``h``,
is the notebook's variable, as it would be in the loop), and shows the diagnosis. The body's lines are
named as the cell's own ("Cell In[7], line 4"), and everything the diagnosis changes is put back (a name the body
binds that the notebook did not have goes).

Used by learners on their own training step (README, "Bring your own training step").
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from backward_twice.record.learner import without_tool_frames
from backward_twice.steps.diagnose import Diagnosis, diagnose
from backward_twice.steps.harness import reachable

__all__ = ["diagnose_cell", "load_ipython_extension"]

_STEP_NAME = "_diagnosed_step"
_MISSING = object()


def _assigned_names(body: list[ast.stmt]) -> list[str]:
    """The names the body binds at its top level (``h = ...``, ``total += ...``, ``for x in ...``)."""
    names: set[str] = set()
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return sorted(names)


def _read_before_bound(body: list[ast.stmt]) -> set[str]:
    """The names a statement of the body reads before any earlier one (or its own target) binds them: the cell's
    inputs (``target`` of ``target = one_hot(target)``) and the state it carries (``h`` of ``h = cell(x, h)``)."""
    bound: set[str] = set()
    read: set[str] = set()
    for statement in body:
        value = statement.value if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else statement
        loads = (
            {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if value
            else set()
        )
        if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            loads.add(statement.target.id)
        read |= loads - bound
        bound |= {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return read


def _version_of(tensor: torch.Tensor) -> int:
    """Its version counter; -1 for a tensor that keeps none (made under ``torch.inference_mode()``)."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def _fresh_inputs(names: set[str], namespace: dict[str, Any]) -> Callable[[], None]:
    """What puts back, before each run after the first, the tensors without a graph among ``names`` that the last run
    rebound to another tensor without one: a batch's ``target`` the cell turns into one-hot, as the loop's header
    would give each pass a fresh batch. A name that now holds a graph is state the next run must read (a hidden
    state): it stays; so does one whose first tensor the run changed (fast FGSM's ``delta``, filled in place, made to
    require grad, then rebound to its detached copy): put back, it would bring the run's changes into the next."""
    kept = {
        name: (value, _version_of(value), value.requires_grad)
        for name in names
        if isinstance(value := namespace.get(name), torch.Tensor) and value.grad_fn is None
    }

    def put_back() -> None:
        for name, (value, version, requires_grad) in kept.items():
            now = namespace.get(name)
            changed = _version_of(value) != version or value.requires_grad != requires_grad
            if now is not value and isinstance(now, torch.Tensor) and now.grad_fn is None and not changed:
                namespace[name] = value

    return put_back


def _objects(line: str, namespace: dict[str, Any]) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    """The models and optimizers the names after ``%%diagnose`` give: each a variable of the notebook or an attribute
    of one (``trainer.cell``, read without running a property), a model, an optimizer, or an object that holds some
    (``trainer``, two levels deep)."""
    models, optimizers = [], []
    for name in line.split():
        root, *attributes = name.split(".")
        if root not in namespace:
            raise ValueError(
                f"%%diagnose: no variable named {root!r} in the notebook; name the models and "
                f"optimizers the cell trains, e.g. %%diagnose model optimizer"
            )
        value = namespace[root]
        for depth, attribute in enumerate(attributes, 1):
            value = _attribute(value, attribute)
            if value is _MISSING:
                known = ".".join([root, *attributes[: depth - 1]])
                raise ValueError(f"%%diagnose: {known} has no attribute {attribute!r} that holds a model or optimizer")
        held_models, held_optimizers = (
            ([], []) if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)) else reachable([value])
        )
        if isinstance(value, torch.nn.Module):
            models.append(value)
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
        elif held_models or held_optimizers:
            models += held_models
            optimizers += held_optimizers
        else:
            raise TypeError(
                f"%%diagnose: {name} is {_a(type(value).__name__)}; the names after %%diagnose are the "
                f"models (torch.nn.Module) and optimizers the cell trains, or objects that hold them"
            )
    return models, optimizers


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _attribute(value: Any, name: str) -> Any:
    """``value.name`` as an object holds it (a submodule of a module, an instance's own attribute), or ``_MISSING``:
    no property or ``__getattr__`` runs."""
    if isinstance(value, torch.nn.Module) and name in value._modules:
        return value._modules[name]
    found = inspect.getattr_static(value, name, _MISSING)
    return _MISSING if hasattr(found, "__get__") and not isinstance(found, torch.nn.Module) else found


def _cell_file(shell: Any) -> str | None:
    """The file name IPython compiled the running cell under (the first frame out whose file its compiler
    names as a cell), or None outside a cell."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if shell.compile.format_code_name(frame.f_code.co_filename):
            return frame.f_code.co_filename
        frame = frame.f_back
    return None


def diagnose_cell(line: str, cell: str, shell: Any) -> Diagnosis:
    """Diagnose the loop body ``cell`` run in ``shell``'s namespace, with the models and optimizers ``line``
    names. The body is compiled under the running cell's own file name, whose cached lines become the cell as
    the learner wrote it, so each line reads "Cell In[n], line k" (k counting the ``%%diagnose`` line)."""
    if not cell.strip():
        raise ValueError("%%diagnose: the cell is empty; paste one iteration of your loop below the first line")
    namespace = shell.user_ns
    models, optimizers = _objects(line, namespace)
    source = f"%%diagnose {line}\n{cell}"
    python = shell.transform_cell(cell)  # ``!ls`` lines: one call each, as IPython runs them
    try:
        tree = ast.parse(python)
    except SyntaxError as exc:
        raise SyntaxError(
            f"%%diagnose: the cell is not Python: {exc.msg} (cell line {(exc.lineno or 0) + 1})"
        ) from None
    for node in ast.walk(tree):  # a line magic runs its statement in a scope of its own: what it binds is lost
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_line_magic":
            written = cell.splitlines()[node.lineno - 1].strip()
            raise ValueError(
                f"%%diagnose: cell line {node.lineno + 1} is an IPython magic ({written}); the cell runs as one "
                "Python function: write that line without the magic"
            )
    ast.increment_lineno(tree, 1)  # the %%diagnose line comes first in the cell
    body: list[ast.stmt] = list(tree.body)
    names = _assigned_names(body)
    if names:
        body.insert(0, ast.Global(names=names, lineno=2, col_offset=0))
    module = ast.parse(f"def {_STEP_NAME}():\n    pass\n")  # a function node as this Python builds one
    function = module.body[0]
    assert isinstance(function, ast.FunctionDef)  # the one statement parsed above
    function.body = body
    ast.fix_missing_locations(module)
    filename = _cell_file(shell) or shell.compile.cache(source, shell.execution_count)
    # The cell's own code is one call of the magic; its lines, as the learner sees them, are the source.
    linecache.cache[filename] = (len(source), None, [f"{text}\n" for text in source.splitlines()], filename)
    scope: dict[str, Any] = {}
    exec(compile(module, filename, "exec"), namespace, scope)
    step = scope[_STEP_NAME]
    step.__name__ = "<cell>"  # the report says "runs of the cell"
    step._before_each_run = _fresh_inputs(_read_before_bound(body) & set(names), namespace)
    diagnosis = diagnose(step, models=models, optimizers=optimizers)
    # the diagnosis is the cell's output, Out[n] of its In[n]: no name of the notebook holds it
    named = shell.compile.format_code_name(filename) or ("", "")
    number = re.fullmatch(r"In\[(\d+)\]", str(named[1]))
    output = f"Out[{number.group(1)}]" if number else "_"
    return replace(diagnosis, more=f"print({output}.evidence()) shows the evidence")


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%%diagnose`` cell magic (``%load_ext backward_twice``)."""
    from IPython.core.error import UsageError

    def magic(line: str, cell: str) -> Diagnosis:
        try:
            return diagnose_cell(line, cell, ipython)
        except (TypeError, ValueError, SyntaxError) as exc:  # a clear message, not a traceback from in here
            raise UsageError(str(exc)) from None
        except (KeyboardInterrupt, SystemExit) as exc:  # the cell's own: its traceback as the cell's, not the tool's
            exc.__traceback__ = without_tool_frames(exc.__traceback__)
            raise

    ipython.register_magic_function(magic, magic_kind="cell", magic_name="diagnose")
