"""Every published loop of tests/gallery/ through every way in, against the TRUTH its probes established.

The ways in: ``watch()`` around the loop's own ``run``; ``backward-twice watch`` on the module file (its ``main``,
in this process: tests/test_cli.py runs the installed command itself); and ``diagnose``, ``audit_retain_graph``
and ``find_carried_graph`` on ``step_function``. The step tools run the step themselves, so afterwards the
learner's state must be as it was: parameters, ``.grad``, optimizer state, the state's own tensors (the leaves the
loop changes in place among them) and a graph built before the loop (still walkable: its saved tensors are there).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gallery import LOOPS

from backward_twice.cli import main as command
from backward_twice.record.saved import python_walk, saved_data
from backward_twice.steps.audit import audit_retain_graph
from backward_twice.steps.carried import find_carried_graph
from backward_twice.steps.diagnose import diagnose
from backward_twice.watcher import watch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
MODULES = {name: importlib.import_module(f"gallery.{name}") for name in LOOPS}
STEP_TOOLS = ("diagnose", "audit_retain_graph", "find_carried_graph")
VERDICTS = ("needed", "can go", "goes with the carried fix")
# needed as written, not once the error is fixed (a stale forward computed again after the step): the probes judge
# the loop as written, where it is needed
AS_WRITTEN = {"goes with the error's fix": "needed"}
# A framework's loop (FORMAT.md, "Framework loops") has no step of the learner's to hand a step tool: WAYS says so.
WITH_A_STEP = [name for name in LOOPS if "diagnose" in getattr(MODULES[name], "WAYS", ("diagnose",))]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit, NaN included: a buffer made with torch.Tensor(shape), as CycleGAN's input_A is, holds
    whatever memory it got, and a NaN there is put back as NaN, which torch.equal calls different."""
    return torch.equal(a, b) or (
        a.is_floating_point()
        and a.shape == b.shape
        and a.dtype == b.dtype
        and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    )


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def markers(module: Any) -> dict[int, str]:
    """Line number -> marker (``@name``) of the module's marked lines."""
    found = {}
    for number, text in enumerate(Path(module.__file__).read_text().splitlines(), start=1):
        match = re.search(r"#\s*(@\w+)", text)
        if match:
            found[number] = match.group(1)
    return found


def marker_of(line: str | None, module: Any) -> str:
    """The marker of a "file:line: code" line in the module's file, or the line itself."""
    match = re.match(r"(.*?):(\d+): ", line or "")
    if not match or Path(match.group(1)).resolve() != Path(module.__file__).resolve():
        return f"(not in the module: {line})"
    return markers(module).get(int(match.group(2)), f"(unmarked line {match.group(2)})")


def variable_matches(name: str | None, truth: str) -> bool:
    """``state['h_state']`` is the loop's ``h_state``; ``model.hidden[1]`` and ``actions.logits`` name
    ``model.hidden`` and ``actions``; ``self.reg_loss``, in a loop that is a method of the model (DeepFM's ``fit``),
    names ``model.reg_loss``."""
    if name is None:
        return False
    name = re.sub(r"^state\[['\"](\w+)['\"]\]", r"\1", name)
    if name.startswith("self.") and "." in truth:
        name = f"{truth.split('.', 1)[0]}.{name[len('self.') :]}"
    return name == truth or name.startswith((f"{truth}.", f"{truth}["))


def assert_same_findings(got: list[tuple[str | None, str]], truth: list[dict], what: str) -> None:
    """Each truth entry is found, and each finding is a truth entry (variable by :func:`variable_matches`)."""
    for entry in truth:
        assert any(variable_matches(v, entry["variable"]) and line == entry["line"] for v, line in got), (
            f"{what}: {entry} not found in {got}"
        )
    for v, line in got:
        assert any(variable_matches(v, e["variable"]) and line == e["line"] for e in truth), (
            f"{what}: {v} at {line} is not in TRUTH {truth}"
        )


def build_markers(module: Any) -> set[str]:
    """The markers on lines of ``build()``."""
    lines, _ = inspect.getsourcelines(module.build)
    start = module.build.__code__.co_firstlineno
    marks = markers(module)
    return {marks[n] for n in range(start, start + len(lines)) if n in marks}


def by_the_truths_iterations(split: str | None, module: Any) -> bool:
    """Whether a tool counted iterations as TRUTH does (one per pass of ``run``'s loop, or per call of the step):
    where the loop the tool found is another (PPO's K epochs inside ``update``, a batch loop inside an epoch's
    ``iteration``), what is held at an iteration's start is another matter, and iteration numbers differ."""
    match = re.match(r"one per pass of your loop at .*?:(\d+): ", split or "")
    if match is None:
        return True
    lines, start = inspect.getsourcelines(module.run)
    return start <= int(match.group(1)) < start + len(lines)


def check_verdicts(
    module: Any,
    error: dict | None,
    lines: list[dict],
    carried: list[tuple[str | None, str]],
    notes: list[tuple[str | None, str]] | None,
    watched_build: bool = False,
    split: str | None = None,
) -> None:
    """``watched_build``: the command runs the whole file, ``build()`` included, so it sees a graph the script
    builds before its loop being built, at the line inside the model that built it, not at ``build()``'s line.
    ``split``: how the tool cut the run into iterations (see :func:`by_the_truths_iterations`)."""
    truth = module.TRUTH
    same_iterations = by_the_truths_iterations(split, module)
    if watched_build:
        inside = build_markers(module)
        carried = [
            (
                v,
                next(
                    (e["line"] for e in truth["carried"] if e["line"] in inside and variable_matches(v, e["variable"])),
                    line,
                ),
            )
            for v, line in carried
        ]
    if truth["error"] is None:
        assert error is None, f"no error in TRUTH, got {error}"
    else:
        assert error is not None, f"TRUTH says {truth['error']}, the tool saw no error"
        assert (error["kind"], marker_of(error["line"], module)) == (truth["error"]["kind"], truth["error"]["line"])
        assert error["iteration"] == truth["error"]["iteration"] or not same_iterations
    retains = {
        marker_of(line["line"], module): {**{k: line[k] for k in ("runs", "needed_runs")}, "verdict": verdict}
        for line in lines
        if (verdict := AS_WRITTEN.get(line["verdict"], line["verdict"])) in VERDICTS
    }
    assert retains == truth["retains"]
    assert_same_findings(carried, truth["carried"], "carried")
    if notes is not None and same_iterations:
        assert_same_findings(notes, truth["notes"], "notes")


def from_report(report: dict, module: Any) -> tuple:
    carried = [(c["variable"], marker_of(c["built_at"], module)) for c in report["carried"]]
    notes = [(n["variable"], marker_of(n["built_at"], module)) for n in report["notes"]]
    return report["error"], report["lines"], carried, notes, False, report["split"]


@pytest.mark.parametrize("name", LOOPS)
def test_watch_around_the_loops_own_run(name: str) -> None:
    module = MODULES[name]
    state = module.build()
    try:
        with watch() as w:
            module.run(state)
    except Exception:
        pass
    check_verdicts(module, *from_report(w.to_json(), module))


@pytest.mark.parametrize("name", LOOPS)
def test_the_command_on_the_module_file(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    module = MODULES[name]
    report_path = tmp_path / "report.json"
    status = command(["watch", "--json", str(report_path), module.__file__])
    assert status == (0 if module.TRUTH["error"] is None else 1)
    printed = capsys.readouterr()
    report = json.loads(report_path.read_text())
    # the diagnosis ends the script's output (a framework may print first), or its traceback when it raised; an
    # error before any backward call (wgan_gp_toy's autograd.grad refuses its shapes) is Python's alone
    shown = "\nbackward-twice: " in "\n" + (printed.out if module.TRUTH["error"] is None else printed.err)
    assert shown == (report["calls"] > 0 or module.TRUTH["error"] is None)
    module.build()  # the command ran the file as __main__; a loop that reads a global gets its own back here
    error, lines, carried, notes, _, split = from_report(report, module)
    check_verdicts(module, error, lines, carried, notes, watched_build=True, split=split)


def learner_state(state: dict) -> list[tuple[str, torch.Tensor | None]]:
    """Everything the step tools must leave as it was, by value (copies)."""
    kept: list[tuple[str, torch.Tensor | None]] = []
    for key, value in state.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for i, item in enumerate(values):
            if isinstance(item, torch.nn.Module):
                for pname, p in item.named_parameters():
                    kept.append((f"{key}.{pname}", p.detach().clone()))
                    kept.append((f"{key}.{pname}.grad", None if p.grad is None else p.grad.clone()))
                kept.extend((f"{key}.{b}", t.detach().clone()) for b, t in item.named_buffers())
            elif isinstance(item, torch.optim.Optimizer):
                for pid, entries in item.state_dict()["state"].items():
                    kept.extend(
                        (f"{key}.state[{pid}].{k}", v.clone())
                        for k, v in entries.items()
                        if isinstance(v, torch.Tensor)
                    )
            elif isinstance(item, torch.Tensor):
                kept.append((f"{key}[{i}]", item.detach().clone()))
                kept.append((f"{key}[{i}].grad", None if item.grad is None else item.grad.clone()))
    return kept


def graphs_before_the_loop(state: dict) -> dict[str, int]:
    """For each state tensor with a graph: how many of its nodes still hold saved tensors."""
    held = {}
    for key, value in state.items():
        tensor = value if isinstance(value, torch.Tensor) else None
        if tensor is not None and tensor.grad_fn is not None:
            held[key] = sum(1 for node in python_walk([tensor.grad_fn]) if saved_data(node))
    return held


def models_and_optimizers(state: dict) -> tuple[list, list]:
    values = [v for value in state.values() for v in (value if isinstance(value, (list, tuple)) else [value])]
    return (
        [v for v in values if isinstance(v, torch.nn.Module)],
        [v for v in values if isinstance(v, torch.optim.Optimizer)],
    )


def run_tool(tool: str, module: Any, state: dict) -> tuple:
    step = module.step_function(state)
    models, optimizers = models_and_optimizers(state)
    iterations = module.ITERATIONS
    if tool == "diagnose":
        d = diagnose(step, models=models, optimizers=optimizers, iterations=iterations)
        error = (
            None
            if d.error is None
            else {"kind": d.error_kind, "iteration": d.carried.iterations_run, "line": d.error_line}
        )
        carried = [(f.name, marker_of(f.created_at, module)) for f in d.carried.findings]
        return error, [vars(line) for line in d.audit.lines], carried, None
    if tool == "audit_retain_graph":
        a = audit_retain_graph(step, models=models, optimizers=optimizers, iterations=iterations)
        return None, [vars(line) for line in a.lines], None, None
    report = find_carried_graph(step, iterations=max(2, iterations), models=models, optimizers=optimizers)
    return None, None, [(f.name, marker_of(f.created_at, module)) for f in report.findings], None


@pytest.mark.parametrize("tool", STEP_TOOLS)
@pytest.mark.parametrize("name", WITH_A_STEP)
def test_the_step_tools_on_step_function_leave_the_learners_state_as_it_was(name: str, tool: str) -> None:
    module = MODULES[name]
    state = module.build()
    before, graphs = learner_state(state), graphs_before_the_loop(state)
    error, lines, carried, notes = run_tool(tool, module, state)
    if tool == "diagnose":
        check_verdicts(module, error, lines, carried, notes)
    elif tool == "audit_retain_graph":
        retains = {
            marker_of(line["line"], module): {**{k: line[k] for k in ("runs", "needed_runs")}, "verdict": verdict}
            for line in lines
            if (verdict := AS_WRITTEN.get(line["verdict"], line["verdict"])) in VERDICTS
        }
        assert retains == module.TRUTH["retains"]
    else:
        assert_same_findings(carried, module.TRUTH["carried"], "carried")
    after = learner_state(state)
    assert [k for k, _ in after] == [k for k, _ in before]
    changed = [
        k
        for (k, a), (_, b) in zip(before, after)
        if (a is None) != (b is None) or (a is not None and not same_values(a, b))
    ]
    assert not changed, f"{tool} left changed: {changed}"
    assert graphs_before_the_loop(state) == graphs, "a graph built before the loop lost its saved tensors"
