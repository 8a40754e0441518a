"""Each gallery loop's TRUTH, checked against probes that never import the tool (backward_twice) or the course."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from collections.abc import Iterator

import pytest
import torch

from . import LOOPS, framework_probes, probes


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The loops are tiny; one thread keeps them fast on a shared machine and gives exact repeats."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The published loops warn as they did when published (CycleGAN's MSE on broadcast shapes): not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MODULES = {name: importlib.import_module(f"{__package__}.{name}") for name in LOOPS}
# A framework loop (FORMAT.md, "Framework loops": a module with FRAMEWORK) is checked by framework_probes, in the
# tests at the end of this file; every other loop by probes.py, in the tests below, as before.
PLAIN = [name for name in LOOPS if not hasattr(MODULES[name], "FRAMEWORK")]
FRAMEWORK_LOOPS = [name for name in LOOPS if hasattr(MODULES[name], "FRAMEWORK")]
KINDS = {"backward a second time", "in-place version error", "no graph", "other"}


def truth_markers(truth: dict) -> set[str]:
    names = set(truth["retains"])
    names |= {entry["line"] for entry in truth["carried"] + truth["notes"]}
    if truth["error"] is not None:
        names.add(truth["error"]["line"])
    return names


@pytest.mark.parametrize("name", PLAIN)
def test_module_follows_the_format(name: str) -> None:
    module = MODULES[name]
    source = probes.source_path(module).read_text()
    imported = {
        (alias.name if isinstance(node, ast.Import) else node.module).split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [node])
    }
    # torch, numpy where the published loop uses it (a course requirement), and the standard library
    assert imported <= {"torch", "numpy"} | set(sys.stdlib_module_names), imported
    assert isinstance(module.ITERATIONS, int) and 1 <= module.ITERATIONS <= 6
    assert set(module.TRUTH) == {"error", "retains", "carried", "notes", "modifies_in_place"}
    assert callable(module.build) and callable(module.run) and callable(module.step_function)
    assert '__name__ == "__main__"' in source
    assert probes.markers(module).keys() >= truth_markers(module.TRUTH)
    marked_lines = set(probes.markers(module).values())
    assert set(probes.retain_lines(module)) <= marked_lines, "every retain_graph= line carries a marker"
    retained = {probes.markers(module)[m] for m in module.TRUTH["retains"]}
    assert retained <= set(probes.retain_lines(module)), "TRUTH judges retain_graph= lines only"
    if module.TRUTH["error"] is not None:
        assert module.TRUTH["error"]["kind"] in KINDS


@pytest.mark.parametrize("name", PLAIN)
def test_loop_is_deterministic_from_build(name: str) -> None:
    module = MODULES[name]
    first = probes.drive(module, module.ITERATIONS)
    assert first.same_as(probes.drive(module, module.ITERATIONS))


@pytest.mark.parametrize("name", PLAIN)
def test_error_as_published(name: str) -> None:
    module = MODULES[name]
    outcome = probes.drive(module, module.ITERATIONS)
    expected = module.TRUTH["error"]
    if expected is None:
        assert outcome.error is None
    else:
        assert outcome.error == (expected["kind"], expected["iteration"], expected["line"])


@pytest.mark.parametrize("name", PLAIN)
def test_run_is_the_step_loop(name: str) -> None:
    """`run` (the loop as published) stops where the step-function loop stops, with the same error."""
    module = MODULES[name]
    expected = module.TRUTH["error"]
    if expected is None:
        assert probes.run_published(module, module.ITERATIONS).error is None
        return
    before = probes.run_published(module, expected["iteration"] - 1)
    at = probes.run_published(module, expected["iteration"])
    assert before.error is None
    assert at.error is not None and (at.error[0], at.error[2]) == (expected["kind"], expected["line"])


@pytest.mark.parametrize("name", PLAIN)
def test_retains_judged_by_removing_them(name: str) -> None:
    module = MODULES[name]
    verdicts = probes.judge_retains(module, module.ITERATIONS)
    found = {m: {"verdict": v.verdict, "runs": v.runs, "needed_runs": v.needed_runs} for m, v in verdicts.items()}
    assert found == module.TRUTH["retains"]


@pytest.mark.parametrize("name", PLAIN)
def test_carried_graphs_and_notes_by_what_backward_reaches(name: str) -> None:
    module = MODULES[name]
    reach = probes.observe_reach(module, module.ITERATIONS)
    assert reach.carried == {entry["variable"]: entry["line"] for entry in module.TRUTH["carried"]}
    assert reach.notes == {entry["variable"]: entry["line"] for entry in module.TRUTH["notes"]}


@pytest.mark.parametrize("name", PLAIN)
def test_carried_and_notes_against_a_clean_reference(name: str) -> None:
    """Detaching a carried graph at each iteration start changes the run (unless the truth says the gradient its
    walk sends is thrown away: then it does not); detaching a note changes nothing."""
    module = MODULES[name]
    reference = probes.drive(module, module.ITERATIONS)
    for entry in module.TRUTH["carried"]:
        detached = probes.drive(module, module.ITERATIONS, probes.detaching(module, [entry["variable"]]))
        assert detached.same_as(reference) != entry.get("gradient_used", True), entry
    notes = [entry["variable"] for entry in module.TRUTH["notes"]]
    if notes:
        assert probes.drive(module, module.ITERATIONS, probes.detaching(module, notes)).same_as(reference)


@pytest.mark.parametrize("name", PLAIN)
def test_leaves_the_loop_changes_in_place(name: str) -> None:
    module = MODULES[name]
    assert probes.leaves_changed_in_place(module, module.ITERATIONS) == sorted(module.TRUTH["modifies_in_place"])


def test_probe_sees_a_retain_switched_off() -> None:
    """The variant machinery itself: a two-backward toy whose retain is needed once, then can go."""
    import types

    source = (
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return {'w': torch.randn(3, requires_grad=True)}\n"
        "def step_function(state):\n"
        "    def step():\n"
        "        y = (state['w'] * 2).sin().sum()\n"
        "        y.backward(retain_graph=True)  # @first\n"
        "        y.backward()  # @second\n"
        "    return step\n"
    )
    assert torch.is_grad_enabled()
    module = types.ModuleType("toy_gallery_loop")
    path = probes.source_path(MODULES[LOOPS[0]]).parent / "_toy_probe_loop.py"
    path.write_text(source)
    try:
        module.__file__ = str(path)
        exec(compile(source, str(path), "exec"), module.__dict__)
        verdicts = probes.judge_retains(module, 2)
        assert (verdicts["@first"].verdict, verdicts["@first"].runs, verdicts["@first"].needed_runs) == ("needed", 2, 2)
    finally:
        path.unlink()


@pytest.mark.parametrize("name", LOOPS)
def test_runs_as_a_script(name: str) -> None:
    """`python tests/gallery/<name>.py` (the way `backward-twice watch` runs it) ends as TRUTH says."""
    import runpy
    import warnings

    module = MODULES[name]
    expected = module.TRUTH["error"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            runpy.run_path(str(probes.source_path(module)), run_name="__main__")
        except Exception as error:
            assert expected is not None, f"raised {error!r}"
            assert probes.error_kind(error) == expected["kind"]
            return
    assert expected is None, "the script ran to the end"


def test_loops_lists_every_gallery_module() -> None:
    folder = probes.source_path(MODULES[LOOPS[0]]).parent
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__", "probes", "framework_probes", "test_truth"}
    assert sorted(modules) == sorted(LOOPS)
    assert len(LOOPS) >= 40


# ---------------------------------------------------------------- framework loops (FORMAT.md, "Framework loops")


def imports_of(source: str) -> set[str]:
    return {
        (alias.name if isinstance(node, ast.Import) else node.module).split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [node])
    }


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_module_follows_the_format(name: str) -> None:
    module = MODULES[name]
    source = framework_probes.source_path(module).read_text()
    assert module.FRAMEWORK in framework_probes.PACKAGES
    framework = framework_probes.PACKAGES[module.FRAMEWORK]
    imported = imports_of(source)
    # torch, numpy, the standard library, and the module's own framework, which it does import
    assert imported <= {"torch", "numpy"} | set(sys.stdlib_module_names) | framework, imported
    assert imported & framework, f"FRAMEWORK is {module.FRAMEWORK!r}, but none of {sorted(framework)} is imported"
    assert isinstance(module.ITERATIONS, int) and 1 <= module.ITERATIONS <= 6
    assert set(module.TRUTH) == {"error", "retains", "carried", "notes", "modifies_in_place"}
    ways = set(module.WAYS)
    assert {"watch", "command"} <= ways <= set(framework_probes.WAYS), module.WAYS
    steps = ways & set(framework_probes.STEP_TOOLS)
    assert steps in (set(), set(framework_probes.STEP_TOOLS)), "the step tools come together, or not at all"
    assert callable(module.build) and callable(module.run)
    if steps:
        assert callable(module.step_function)
    else:
        # the framework runs the step: `run` takes the probes' callbacks, and there is no step_function to misuse
        assert not hasattr(module, "step_function")
        assert "callbacks" in inspect.signature(module.run).parameters
    assert '__name__ == "__main__"' in source
    assert framework_probes.markers(module).keys() >= truth_markers(module.TRUTH)
    marked_lines = set(framework_probes.markers(module).values())
    assert set(framework_probes.retain_lines(module)) <= marked_lines, "every retain_graph= line carries a marker"
    retained = {framework_probes.markers(module)[m] for m in module.TRUTH["retains"]}
    assert retained <= set(framework_probes.retain_lines(module)), "TRUTH judges retain_graph= lines only"
    if module.TRUTH["error"] is not None:
        assert module.TRUTH["error"]["kind"] in KINDS


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_loop_is_deterministic_from_build(name: str) -> None:
    module = MODULES[name]
    first = framework_probes.drive(module, module.ITERATIONS)
    assert first.same_as(framework_probes.drive(module, module.ITERATIONS))


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_error_as_published(name: str) -> None:
    """The error, and the iteration it comes in: counted by the step function's calls, or by the framework's own
    hook at each iteration's start (Lightning's on_train_batch_start, the Trainer's on_step_begin)."""
    module = MODULES[name]
    outcome = framework_probes.drive(module, module.ITERATIONS)
    expected = module.TRUTH["error"]
    if expected is None:
        assert outcome.error is None
    else:
        assert outcome.error == (expected["kind"], expected["iteration"], expected["line"])


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_run_is_the_probed_loop(name: str) -> None:
    """`run` with no probe attached (the loop as published) stops where the probed loop stops, with the same error."""
    module = MODULES[name]
    expected = module.TRUTH["error"]
    if expected is None:
        assert framework_probes.run_published(module, module.ITERATIONS).error is None
        return
    before = framework_probes.run_published(module, expected["iteration"] - 1)
    at = framework_probes.run_published(module, expected["iteration"])
    assert before.error is None
    assert at.error is not None and (at.error[0], at.error[2]) == (expected["kind"], expected["line"])


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_retains_judged_by_removing_them(name: str) -> None:
    module = MODULES[name]
    verdicts = framework_probes.judge_retains(module, module.ITERATIONS)
    found = {m: {"verdict": v.verdict, "runs": v.runs, "needed_runs": v.needed_runs} for m, v in verdicts.items()}
    assert found == module.TRUTH["retains"]


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_carried_graphs_and_notes_by_what_backward_reaches(name: str) -> None:
    module = MODULES[name]
    reach = framework_probes.observe_reach(module, module.ITERATIONS)
    assert reach.carried == {entry["variable"]: entry["line"] for entry in module.TRUTH["carried"]}
    assert reach.notes == {entry["variable"]: entry["line"] for entry in module.TRUTH["notes"]}


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_carried_and_notes_against_a_clean_reference(name: str) -> None:
    """Detaching a carried graph at each iteration start changes the run; detaching a note changes nothing."""
    module = MODULES[name]
    reference = framework_probes.drive(module, module.ITERATIONS)
    for entry in module.TRUTH["carried"]:
        hook = framework_probes.detaching(module, [entry["variable"]])
        assert not framework_probes.drive(module, module.ITERATIONS, hook).same_as(reference), entry
    notes = [entry["variable"] for entry in module.TRUTH["notes"]]
    if notes:
        hook = framework_probes.detaching(module, notes)
        assert framework_probes.drive(module, module.ITERATIONS, hook).same_as(reference)


@pytest.mark.parametrize("name", FRAMEWORK_LOOPS)
def test_framework_leaves_the_loop_changes_in_place(name: str) -> None:
    module = MODULES[name]
    expected = sorted(module.TRUTH["modifies_in_place"])
    assert framework_probes.leaves_changed_in_place(module, module.ITERATIONS) == expected
