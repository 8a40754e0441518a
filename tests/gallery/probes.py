"""Probes that establish each gallery loop's truth without the tool (backward_twice) or the course (helpers).

Everything here watches or varies the published loop from the outside:

- a loop is driven through its own `step_function`, one call per iteration, and its error is read
  from the traceback (the innermost frame in the loop's own file gives the marked line);
- a retain is judged by running a copy of the module whose marked `retain_graph=...` is switched off,
  for all its runs or for one run at a time (a textual change of that one keyword, exec'd under the
  module's own file name so line numbers stay those of the published code); a retain that changes the
  outcome only while a graph is carried into a later iteration (with the carried variables detached from
  iteration 2 on, removing it changes nothing) is the forum's band-aid: "goes with the carried fix";
- what a backward reaches is read by walking `grad_fn.next_functions` from its roots before it runs,
  and comparing each node's `_sequence_nr()` with the sequence number read at the iteration's start;
- which line built a node comes from a line tracer that records the sequence number each time a line
  of the loop's file starts;
- a carried tensor is also checked against a clean reference: detaching it at every iteration start
  must change the outcome (error or gradients); detaching a note must change nothing.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
import sys
import tokenize
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

MARKER = re.compile(r"#\s*(@\w+)")
RETAIN_KEYWORD = re.compile(r"retain_graph\s*=\s*([A-Za-z_][\w.]*)")

ERROR_KINDS = (
    ("Trying to backward through the graph a second time", "backward a second time"),
    ("modified by an inplace operation", "in-place version error"),
    # the same check for a saved output of a multi-output view (unbind, split, chunk, `for row in w`)
    ("its base or another view of its base has been modified inplace", "in-place version error"),
    ("does not require grad and does not have a grad_fn", "no graph"),
)


def error_kind(error: BaseException) -> str:
    text = str(error)
    for needle, kind in ERROR_KINDS:
        if needle in text:
            return kind
    return "other"


def source_path(module: types.ModuleType) -> Path:
    return Path(module.__file__).resolve()


def markers(module: types.ModuleType) -> dict[str, int]:
    """Marker name -> 1-based line number, read from the module's source."""
    found: dict[str, int] = {}
    for number, line in enumerate(source_path(module).read_text().splitlines(), start=1):
        match = MARKER.search(line)
        if match:
            assert match.group(1) not in found, f"{module.__name__}: marker {match.group(1)} used twice"
            found[match.group(1)] = number
    return found


def retain_lines(module: types.ModuleType) -> dict[int, str]:
    """Line number -> source line, for every call in the code (not in text) that passes retain_graph=.

    A `def f(retain_graph=True)` default is a parameter, not a call's keyword, and is left out."""
    source = source_path(module).read_text()
    lines = source.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    found = {}
    for index, token in enumerate(tokens[:-1]):
        following = tokens[index + 1]
        if token.type == tokenize.NAME and token.string == "retain_graph" and following.string == "=":
            if not lines[token.start[0] - 1].lstrip().startswith("def "):
                found[token.start[0]] = lines[token.start[0] - 1]
    return found


# ---------------------------------------------------------------- variants with a retain switched off


@dataclass
class RetainSwitch:
    """Decides, per marked line and per run of it, whether its retain_graph keeps its value."""

    drop: dict[str, set[int] | str] = field(default_factory=dict)  # marker -> run numbers, or "all"
    started: dict[str, int] = field(default_factory=dict)
    kept: dict[str, list[bool]] = field(default_factory=dict)  # per run, whether its value asked to retain

    def __call__(self, marker: str, value: Any) -> Any:
        self.started[marker] = self.started.get(marker, 0) + 1
        self.kept.setdefault(marker, []).append(bool(value))
        wanted = self.drop.get(marker, set())
        if wanted == "all" or (isinstance(wanted, set) and self.started[marker] in wanted):
            return None  # what the call gets when the keyword is not written at all
        return value


def variant(module: types.ModuleType, switch: RetainSwitch, marked: list[str]) -> types.ModuleType:
    """A fresh copy of the module whose marked retain_graph= keywords ask `switch` for their value."""
    path = source_path(module)
    lines = path.read_text().splitlines(keepends=True)
    where = markers(module)
    for marker in marked:
        number = where[marker]
        line = lines[number - 1]
        code, comment = line.split("#", 1)
        new_code, count = RETAIN_KEYWORD.subn(
            lambda m: f"retain_graph=__probe_retain__({marker!r}, {m.group(1)})", code
        )
        assert count == 1, f"{module.__name__}: {marker} must carry exactly one retain_graph="
        lines[number - 1] = new_code + "#" + comment
    copy = types.ModuleType(module.__name__ + "_probe_variant")
    copy.__file__ = str(path)
    copy.__dict__["__probe_retain__"] = switch
    sys.modules[copy.__name__] = copy
    try:
        exec(compile("".join(lines), str(path), "exec"), copy.__dict__)
    finally:
        del sys.modules[copy.__name__]
    return copy


# ---------------------------------------------------------------- running a loop and reading its outcome


@dataclass(frozen=True)
class Outcome:
    error: tuple[str, int, str] | None  # (kind, iteration, marker of the raising line)
    fingerprint: tuple[torch.Tensor, ...]

    def same_as(self, other: Outcome) -> bool:
        if self.error != other.error or len(self.fingerprint) != len(other.fingerprint):
            return False
        return all(torch.equal(a, b) for a, b in zip(self.fingerprint, other.fingerprint))


def raising_marker(module: types.ModuleType, error: BaseException) -> str:
    path = str(source_path(module))
    line = None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    by_line = {number: name for name, number in markers(module).items()}
    return by_line.get(line, f"unmarked line {line}")


def tensors_of(value: Any, seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Every tensor a state holds: parameters and their grads, buffers, optimizer state, plain tensors."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
        if readable_grad_fn(value) is None and not value._is_view() and value.grad is not None:
            yield value.grad
    elif isinstance(value, torch.nn.Module):
        for tensor in list(value.parameters()) + list(value.buffers()):
            yield from tensors_of(tensor, seen)
    elif isinstance(value, torch.optim.Optimizer):
        for per_param in value.state.values():
            yield from tensors_of(per_param, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_of(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_of(item, seen)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
        yield from tensors_of(vars(value), seen)


def fingerprint(state: dict) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach().clone() for t in tensors_of(state))


BoundaryHook = Callable[[int, dict], None]


def drive(module: types.ModuleType, iterations: int, at_boundary: BoundaryHook | None = None) -> Outcome:
    """Build, then call the step function once per iteration; return the error and the final state."""
    state = module.build()
    step = module.step_function(state)
    for number in range(1, iterations + 1):
        if at_boundary is not None:
            at_boundary(number, state)
        try:
            step()
        except Exception as error:  # the loop's own error is the thing observed
            return Outcome((error_kind(error), number, raising_marker(module, error)), fingerprint(state))
    return Outcome(None, fingerprint(state))


def run_published(module: types.ModuleType, iterations: int) -> Outcome:
    """The module's own `run` (the loop as published), with its error read the same way."""
    state = module.build()
    try:
        module.run(state, iterations)
    except Exception as error:
        return Outcome((error_kind(error), -1, raising_marker(module, error)), fingerprint(state))
    return Outcome(None, fingerprint(state))


@dataclass
class RetainVerdict:
    verdict: str
    runs: int
    needed_runs: int


def judge_retains(module: types.ModuleType, iterations: int) -> dict[str, RetainVerdict]:
    """Each marked retain that ran, judged by running copies of the loop with it switched off: "can go" when
    that changes nothing, "needed" when it changes the outcome, and "goes with the carried fix" when it changes
    the outcome only while a graph is carried into a later iteration (:func:`goes_with_the_carried_fix`)."""
    marked = [name for name, number in markers(module).items() if number in retain_lines(module)]
    carried = list(observe_reach(module, iterations).carried) if marked else []
    counting = RetainSwitch()
    reference = drive(variant(module, counting, marked), iterations)
    verdicts = {}
    for marker in marked:
        started = counting.started.get(marker, 0)
        completed = started - 1 if reference.error is not None and reference.error[2] == marker else started
        without = drive(variant(module, RetainSwitch({marker: "all"}), marked), iterations)
        needed_runs = sum(
            not drive(variant(module, RetainSwitch({marker: {run}}), marked), iterations).same_as(reference)
            for run in range(1, completed + 1)
        )
        retained = sum(counting.kept.get(marker, [])[:completed])  # the runs that kept a graph: a run whose value
        if not retained:  # was false keeps nothing (EWC's last sample); a line that never ran (or only raised), or
            continue  # whose retain_graph= was never true (timm's `i < self.n_samples - 1`, one sample): no verdict
        verdict = "can go" if without.same_as(reference) else "needed"
        if verdict == "needed" and carried and goes_with_the_carried_fix(module, iterations, marker, marked, carried):
            verdict = "goes with the carried fix"
        verdicts[marker] = RetainVerdict(verdict, retained, needed_runs)
    return verdicts


def goes_with_the_carried_fix(
    module: types.ModuleType, iterations: int, marker: str, marked: list[str], carried: list[str]
) -> bool:
    """The band-aid: a retain the loop as written needs, but only because a graph is carried into a later
    iteration. With the carried variables detached at the start of every iteration after the first (what a
    backward of the same iteration needs is left as it is), removing it changes nothing."""
    detach = detaching(module, carried)

    def fixed(number: int, state: dict) -> None:
        if number > 1:
            detach(number, state)

    kept = drive(variant(module, RetainSwitch(), marked), iterations, fixed)
    dropped = drive(variant(module, RetainSwitch({marker: "all"}), marked), iterations, fixed)
    return dropped.same_as(kept)


# ---------------------------------------------------------------- what each backward reaches, and who built it


def bound_names(path: str) -> dict[int, set[str]]:
    """Line -> the names, attributes and string keys its assignments bind (``self.reg_loss += x``: reg_loss), and
    the lists it grows (``policy.saved_log_probs.append(x)``: saved_log_probs, which holds x's graph from there)."""
    found: dict[int, set[str]] = {}
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "insert")
            and isinstance(node.func.value, (ast.Name, ast.Attribute))
        ):
            grown = node.func.value
            found.setdefault(node.lineno, set()).add(grown.id if isinstance(grown, ast.Name) else grown.attr)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Store):
                        found.setdefault(node.lineno, set()).add(part.id)
                    elif isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                        found.setdefault(node.lineno, set()).add(part.attr)
                    elif isinstance(part, ast.Subscript) and isinstance(part.slice, ast.Constant):
                        found.setdefault(node.lineno, set()).add(str(part.slice.value))
    return found


class LineTracer:
    """Records, each time a line of one file starts, the autograd sequence number at that moment.

    Two records: the innermost line of the file that is running (inside a model's forward, say), and
    the line of `outer` (the loop's build()) that is running, for graphs built before the loop."""

    def __init__(self, path: Path, outer: types.CodeType | None = None) -> None:
        self.path = str(path)
        self.outer = outer
        self.numbers: list[int] = []
        self.lines: list[int] = []
        self.outer_numbers: list[int] = []
        self.outer_lines: list[int] = []

    def _mark(self, line: int, frame: types.FrameType | None = None) -> None:
        number = torch._C._autograd._get_sequence_nr()
        self.numbers.append(number)
        self.lines.append(line)
        if frame is not None and frame.f_code is self.outer:
            self.outer_numbers.append(number)
            self.outer_lines.append(line)

    def _local(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self._mark(frame.f_lineno, frame)
        elif event == "return" and frame.f_back is not None and frame.f_back.f_code.co_filename == self.path:
            self._mark(frame.f_back.f_lineno, frame.f_back)
        return self._local

    def _return_only(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        # a call made from the loop's file returns: the caller's line goes on building nodes
        if event == "return" and frame.f_back is not None:
            self._mark(frame.f_back.f_lineno, frame.f_back)
        return self._return_only

    def _global(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == self.path:
            return self._local
        if frame.f_back is not None and frame.f_back.f_code.co_filename == self.path:
            return self._return_only
        return None

    def line_of(self, sequence_nr: int) -> int | None:
        index = bisect.bisect_right(self.numbers, sequence_nr) - 1
        return self.lines[index] if index >= 0 else None

    def binding_line_of(self, sequence_nr: int, variable: str, lookback: int = 5000) -> int | None:
        """The last line that ran up to node ``sequence_nr``'s building and binds ``variable``'s last part (a name,
        an attribute or a string key), looking back at most ``lookback`` lines; else :meth:`line_of`."""
        binds = bound_names(self.path)
        wanted = re.split(r"[.\[\]'\"]+", variable.strip("]'\""))[-1]
        index = bisect.bisect_right(self.numbers, sequence_nr) - 1
        for position in range(index, max(-1, index - lookback), -1):
            if wanted in binds.get(self.lines[position], ()):
                return self.lines[position]
        return self.line_of(sequence_nr)

    def outer_line_of(self, sequence_nr: int) -> int | None:
        index = bisect.bisect_right(self.outer_numbers, sequence_nr) - 1
        return self.outer_lines[index] if index >= 0 else None

    def __enter__(self) -> LineTracer:
        self._previous = sys.gettrace()  # a coverage tracer, if one runs, gets its place back
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)


def grad_fns(value: Any) -> list[Any]:
    """The autograd nodes a variable holds directly (a tensor, a tuple of them, an object's tensors)."""
    return [fn for t in direct_tensors(value) if (fn := readable_grad_fn(t)) is not None]


def readable_grad_fn(tensor: torch.Tensor) -> Any:
    """``tensor.grad_fn``; None for a view of ``unbind``/``split``/``chunk`` whose base changed in place, whose
    ``grad_fn`` PyTorch refuses to give (nothing can be walked through it any more)."""
    try:
        return tensor.grad_fn
    except RuntimeError:
        return None


def direct_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in direct_tensors(item)]
    if isinstance(value, torch.distributions.Distribution):
        return [t for attr, t in vars(value).items() if isinstance(t, torch.Tensor) and not attr.startswith("_")]
    return []


def candidates(
    module: types.ModuleType, state: dict, tensors_of: Callable[[Any], list[torch.Tensor]] | None = None
) -> dict[str, Any]:
    """Named places a graph can outlive an iteration: state entries and module globals (tensors, tuples
    of them, distributions), then the tensor attributes of objects kept there (`model.hidden`,
    `actions.probs`). An attribute that only aliases another entry's tensor (a data loader's `labels`
    that is the state's `Y`) is left to that entry. ``tensors_of`` finds a value's tensors (default:
    :func:`direct_tensors`)."""
    tensors_of = direct_tensors if tensors_of is None else tensors_of
    top: dict[str, Any] = {}
    for name, value in list(state.items()) + list(vars(module).items()):
        if name in top or name.startswith("__") or isinstance(value, (types.ModuleType, type)):
            continue
        if tensors_of(value):
            top[name] = value
    owner_of = {id(t): name for name, value in top.items() for t in tensors_of(value)}
    found = dict(top)
    for name, value in state.items():
        if isinstance(value, (torch.Tensor, torch.optim.Optimizer, type)) or not hasattr(value, "__dict__"):
            continue
        for attr, held in vars(value).items():
            tensors = tensors_of(held)
            if attr.startswith("_") or not tensors:
                continue
            if all(owner_of.get(id(t), name) != name for t in tensors):
                continue  # an alias of another entry
            found[f"{name}.{attr}"] = held
    return found


@dataclass
class Reach:
    """Graphs that outlived their iteration: which backward walked them, and the line that built them."""

    carried: dict[str, str]  # variable -> marker of the line that built its node
    notes: dict[str, str]
    outcome: Outcome


def walk_old_nodes(roots: list[Any], start: int) -> dict[int, Any]:
    """The nodes built before `start` that a backward from `roots` reaches first, by id."""
    old: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [root for root in roots if root is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        number = node._sequence_nr()
        if number < start and type(node).__name__ != "AccumulateGrad":
            old[id(node)] = node
            continue
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return old


def observe_reach(module: types.ModuleType, iterations: int) -> Reach:
    """Drive the loop with every backward watched: a graph from an earlier iteration (or from before the
    first) that a backward walks is carried; one held at an iteration's start that none walks is a note."""
    starts: dict[int, int] = {}
    held_at: dict[int, dict[str, list[Any]]] = {}  # iteration -> variable -> its nodes (alive, old)
    reached: dict[int, dict[int, Any]] = {}  # iteration -> old nodes its backwards met first
    current = [0]
    original_backward = torch.autograd.backward
    original_grad = torch.autograd.grad

    def note_roots(outputs: Any) -> None:
        roots = [t.grad_fn for t in direct_tensors(outputs if isinstance(outputs, (list, tuple)) else [outputs])]
        number = current[0]
        if number:
            reached.setdefault(number, {}).update(walk_old_nodes(roots, starts[number]))

    def watched_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        note_roots(tensors)
        return original_backward(tensors, *args, **kwargs)

    def watched_grad(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        note_roots(outputs)
        return original_grad(outputs, *args, **kwargs)

    def at_boundary(number: int, state: dict) -> None:
        current[0] = number
        starts[number] = torch._C._autograd._get_sequence_nr()
        held_at[number] = {
            name: [fn for fn in grad_fns(value)] for name, value in candidates(module, state).items()
        }

    tracer = LineTracer(source_path(module), module.build.__code__)
    torch.autograd.backward, torch.autograd.grad = watched_backward, watched_grad
    try:
        with tracer:
            outcome = drive(module, iterations, at_boundary)
    finally:
        torch.autograd.backward, torch.autograd.grad = original_backward, original_grad

    by_line = {number: name for name, number in markers(module).items()}
    carried: dict[str, str] = {}
    notes: dict[str, str] = {}
    last = outcome.error[1] if outcome.error else iterations
    for number in range(1, last + 1):
        # everything a backward of this iteration or a later one walked below the old nodes it met
        walked: set[int] = set()
        for later in range(number, last + 1):
            for node in reached.get(later, {}).values():
                walked |= nodes_below(node)
        for name, nodes in held_at[number].items():
            for node in nodes:
                # named by the line that gave the variable its graph: of the lines of the loop's file that ran
                # up to the node's building, the last that binds the variable (``self.reg_loss += ...`` inside a
                # method build() calls; ``h_state`` in the forward that returns it), else the innermost line
                built = tracer.binding_line_of(node._sequence_nr(), name)
                marker = by_line.get(built, f"unmarked line {built}")
                if id(node) in walked:
                    carried.setdefault(name, marker)
                else:
                    notes.setdefault(name, marker)
    notes = {name: line for name, line in notes.items() if name not in carried}
    # an object reported as a whole is not reported again through its attributes in the same list
    carried = {name: line for name, line in carried.items() if name.rpartition(".")[0] not in carried}
    notes = {name: line for name, line in notes.items() if name.rpartition(".")[0] not in notes}
    frontier = {key: node for per_iteration in reached.values() for key, node in per_iteration.items()}
    explained: set[int] = set()
    for held in held_at.values():
        for nodes in held.values():
            for node in nodes:
                explained |= nodes_below(node)
    assert set(frontier) <= explained, f"{module.__name__}: a backward walked old nodes no named variable holds"
    return Reach(carried, notes, outcome)


def nodes_below(node: Any) -> set[int]:
    found: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current is None or id(current) in found:
            continue
        found.add(id(current))
        stack.extend(next_node for next_node, _ in current.next_functions)
    return found


# ---------------------------------------------------------------- clean references and in-place leaves


def detaching(
    module: types.ModuleType, names: list[str], detach: Callable[[Any], Any] | None = None
) -> BoundaryHook:
    """A boundary hook that replaces each named variable by a detached copy at every iteration start (made by
    ``detach``, default :func:`detach_value`)."""
    detach = detach_value if detach is None else detach

    def hook(number: int, state: dict) -> None:
        for name in names:
            owner, attr = resolve_owner(module, state, name)
            if not isinstance(owner, dict) and not hasattr(owner, attr):
                continue  # not made yet (pix2pix's `self.fake_B` before the first `forward`): nothing to detach
            value = owner[attr] if isinstance(owner, dict) else getattr(owner, attr)
            fresh = detach(value)
            if isinstance(owner, dict):
                owner[attr] = fresh
            else:
                setattr(owner, attr, fresh)

    return hook


def detach_value(value: Any) -> Any:
    if value is None or isinstance(value, (int, float)):  # not a graph yet (`h = None`, `total = 0`)
        return value
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple):
        return tuple(detach_value(item) for item in value)
    if isinstance(value, list):
        return [detach_value(item) for item in value]
    if isinstance(value, torch.distributions.Distribution):
        for attr, held in list(vars(value).items()):
            if isinstance(held, torch.Tensor):
                setattr(value, attr, held.detach())
        return value
    raise TypeError(f"cannot detach {type(value).__name__}")


def resolve_owner(module: types.ModuleType, state: dict, name: str) -> tuple[Any, str]:
    """Where a named variable lives: a state entry, a module global, or an attribute path below one."""
    head, *rest = name.split(".")
    scope = state if head in state else vars(module)
    if not rest:
        return scope, head
    owner: Any = scope[head]
    for part in rest[:-1]:
        owner = getattr(owner, part)
    return owner, rest[-1]


def run_steps(module: types.ModuleType, state: dict, iterations: int) -> None:
    """Call the loop's step ``iterations`` times, up to its first error."""
    step = module.step_function(state)
    for _ in range(iterations):
        try:
            step()
        except Exception:
            break


def leaves_changed_in_place(
    module: types.ModuleType, iterations: int, run: Callable[[types.ModuleType, dict, int], object] = run_steps
) -> list[str]:
    """State entries that are leaf tensors requiring grad, outside any model, whose values the loop changed when
    ``run`` drove it."""
    state = module.build()
    leaves = {
        name: (value, value.detach().clone(), value._version)
        for name, value in state.items()
        if isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad
    }
    run(module, state, iterations)
    return sorted(
        name for name, (value, before, version) in leaves.items()
        if value._version != version or not torch.equal(value.detach(), before)
    )
