"""The few-line twins the notebooks write before an instrument is first used, run on the page's own example and
checked against the instrument: 01's pack-hook byte counter against ``bt.SavedTensorMeter``, 04's walk over
``next_functions`` and its ``TorchFunctionMode`` against ``bt.reachable_nodes`` and ``bt.stamp_iteration``, 05's
gradient comparison against ``bt.gradient_check``; and what the text around each twin says it lacks.

A twin is a code cell tagged ``twin``, read from the committed notebook. The example is what the notebook's code
cells above it build, run here in order in one namespace as a kernel would run them (error demos, tagged
``raises-exception``, left out), each compiled from a file name linecache knows, so the tools find the lines.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import linecache
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import helpers as bt
from backward_twice.instruments.graph import ITERATION_KEY

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TWIN_TAG = "twin"
ERROR_DEMO_TAG = "raises-exception"


def cells(notebook: str) -> list[dict]:
    return json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def twins(notebook: str) -> list[int]:
    found = [i for i, cell in enumerate(cells(notebook)) if TWIN_TAG in cell.get("metadata", {}).get("tags", [])]
    assert found, f"{notebook}: no code cell tagged {TWIN_TAG!r}"
    assert all(cells(notebook)[i]["cell_type"] == "code" for i in found), f"{notebook}: a markdown cell is tagged"
    return found


def committed_stdout(cell: dict) -> str:
    return "".join("".join(out["text"]) for out in cell.get("outputs", []) if out.get("name") == "stdout")


def next_code_cell(notebook: str, index: int) -> int:
    return next(i for i, cell in enumerate(cells(notebook)) if i > index and cell["cell_type"] == "code")


def run_cell(namespace: dict, notebook: str, index: int, text: str | None = None) -> str:
    """Run one cell of the notebook (or ``text`` in its place) in ``namespace``; what it printed."""
    code = source(cells(notebook)[index]) if text is None else text
    name = f"{Path(notebook).stem}-twins-cell-{index}.py"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, name, "exec"), namespace)
    return printed.getvalue()


def page_before(notebook: str, index: int) -> dict:
    """The namespace a kernel holds when it reaches cell ``index``, the notebook having run from the top."""
    namespace: dict = {}
    for i, cell in enumerate(cells(notebook)[:index]):
        if cell["cell_type"] == "code" and ERROR_DEMO_TAG not in cell.get("metadata", {}).get("tags", []):
            run_cell(namespace, notebook, i)
    return namespace


@pytest.fixture(autouse=True)
def threads_put_back():
    """04 and 05 set one thread in their setup cell."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# -- 01: a pack-hook byte counter, then bt.SavedTensorMeter ------------------------------------------------
NB01 = "01_graph_buffers.ipynb"


def section_2_forward(page: dict) -> torch.Tensor:
    return F.mse_loss(page["model"](page["inputs"]), page["targets"])


def test_01_counter_gives_the_meters_saved_bytes_on_section_2s_graph() -> None:
    (twin,) = twins(NB01)
    page = page_before(NB01, twin)
    printed = run_cell(page, NB01, twin)
    counter = sum(page["held"].values())
    meter = bt.SavedTensorMeter()
    with meter:
        loss = section_2_forward(page)
    assert counter == meter.saved_bytes
    assert 0 < meter.graph_only_bytes < counter  # the batch, the targets and the weight are saved, not graph-only
    assert printed == committed_stdout(cells(NB01)[twin]) == f"{len(page['held'])} storages saved, {counter} B\n"
    comparison = committed_stdout(cells(NB01)[next_code_cell(NB01, twin)])
    assert f"counter {counter} B, meter {meter.saved_bytes} B, equal: True" in comparison, comparison
    assert f"graph-only bytes: meter {meter.graph_only_bytes} B" in comparison, comparison
    after = "".join(source(c) for c in cells(NB01)[next_code_cell(NB01, twin) + 1 :] if c["cell_type"] == "markdown")
    assert f"Here {meter.graph_only_bytes} of the {counter} bytes" in after
    del loss


def test_01_counter_counts_a_storage_two_nodes_saved_once() -> None:
    (twin,) = twins(NB01)
    page = page_before(NB01, twin)
    run_cell(page, NB01, twin)
    per_tensor: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        per_tensor.append(tensor.untyped_storage().nbytes())
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = section_2_forward(page)
    # The ReLU's result is the second Linear's input: saved twice, one storage.
    assert len(per_tensor) > len(page["held"]) and sum(per_tensor) > sum(page["held"].values())
    words = {5: "five", 6: "six"}
    said = source(cells(NB01)[twin + 1])
    assert f"had {words[len(per_tensor)]} saved tensors; they are {words[len(page['held'])]} storages" in said
    assert any(committed_stdout(c).startswith(f"{len(per_tensor)} saved tensors: ") for c in cells(NB01)[:twin])
    del loss


def test_01_counter_keeps_nothing_alive_and_keeping_the_tensor_would(saved_storages) -> None:
    """The twin's comment: ``pack`` returns ``tensor.detach()``, since keeping ``tensor`` would leak the graph.
    What dies with the twin's graph is the meter's graph-only figure; what survives, the page's variables. The
    ground truth is conftest's walk over the graph's ``_saved_*`` attributes."""
    (twin,) = twins(NB01)
    page = page_before(NB01, twin)
    meter = bt.SavedTensorMeter()
    with meter:
        loss = section_2_forward(page)
    graph_only = meter.graph_only_bytes
    del loss
    page_tensors = (page["inputs"], page["targets"], page["model"][2].weight)
    held_by_the_page = {t.untyped_storage().data_ptr() for t in page_tensors}
    twin_source = source(cells(NB01)[twin])
    assert "return tensor.detach()" in twin_source
    for code, leaks in ((twin_source, False), (twin_source.replace("return tensor.detach()", "return tensor"), True)):
        run_cell(page, NB01, twin, code)
        saved = saved_storages(page["small_loss"])
        assert {address for _, address in saved.refs} == set(page["held"])  # the counter saw every storage
        del page["small_loss"]
        dead_bytes = saved.dead_bytes()  # after a garbage collection
        alive = {address for (_, address), (ref, _) in saved.refs.items() if not ref.expired()}
        if leaks:
            assert alive > held_by_the_page and dead_bytes < graph_only
        else:
            assert alive == held_by_the_page and dead_bytes == graph_only


def test_01_counter_never_sees_a_python_number() -> None:
    """The page: every saved tensor reaches ``pack`` except a Python number, kept as an 8-byte tensor."""
    (twin,) = twins(NB01)
    page = page_before(NB01, twin)
    run_cell(page, NB01, twin)
    assert "all\nbut a Python number, such as the `2` that section 3 found kept as an 8-byte tensor" in source(
        cells(NB01)[twin - 1]
    )
    page["held"].clear()
    w = torch.ones(1024, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(page["pack"], lambda tensor: tensor):
        doubled = w * 2
    assert page["held"] == {}
    assert doubled.grad_fn._saved_other.nbytes == 8


# -- 04: a walk over next_functions and a TorchFunctionMode, then bt.reachable_nodes and bt.stamp_iteration --
NB04 = "04_carried_state.ipynb"


def page_04_with_twins() -> tuple[dict, int]:
    """The namespace after the twins, and the index of the cell that runs them on the page's example."""
    first, *rest = twins(NB04)
    page = page_before(NB04, first)
    for index in (first, *rest):
        run_cell(page, NB04, index)
    assert callable(page.get("walk")) and isinstance(page.get("StampIteration"), type)
    return page, next_code_cell(NB04, max(first, *rest))


def two_iterations(page: dict, *modes) -> torch.Tensor:
    """The page's example: two iterations of two characters, each inside the given modes."""
    h = torch.zeros(4, 64)
    for iteration, (inputs, targets) in enumerate(page["batches"][:2], start=1):
        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode(iteration))
            loss, h = page["chunk_loss"](page["model"], h, inputs[:2], targets[:2])
    return loss


def test_04_walk_counts_what_reachable_nodes_counts() -> None:
    page, example = page_04_with_twins()
    printed = run_cell(page, NB04, example)
    assert printed == committed_stdout(cells(NB04)[example])
    walk = page["walk"]
    loss = two_iterations(page, bt.stamp_iteration)
    assert len(walk(loss)) == bt.reachable_nodes(loss) > 2 * len(list(page["model"].parameters()))
    assert f"nodes a backward from iteration 2's loss walks: {bt.reachable_nodes(loss)}\n" in printed
    # A node reached by two paths (y * y) counts once, in both.
    x = torch.ones(3, requires_grad=True)
    y = x.exp()
    for root in ((y * y).sum(), (y * y + y).sum(), page["loss"]):
        assert len(walk(root)) == bt.reachable_nodes(root)
    assert len(walk((y * y).sum())) == 4  # sum, mul, exp, x's AccumulateGrad
    helper_cell = next(
        i
        for i, c in enumerate(cells(NB04))
        if c["cell_type"] == "code" and "bt.reachable_nodes(loss)" in source(c) and "walk(loss)" in source(c)
    )
    assert f"{bt.reachable_nodes(loss)} | walk(loss): {len(walk(loss))}" in committed_stdout(cells(NB04)[helper_cell])


def test_04_mode_stamps_every_node_as_stamp_iteration_does() -> None:
    page, example = page_04_with_twins()
    walk, stamp = page["walk"], page["StampIteration"]
    for modes in ((stamp, bt.stamp_iteration), (bt.stamp_iteration, stamp)):  # either one innermost
        nodes = walk(two_iterations(page, *modes))
        assert [n.metadata.get("iteration") for n in nodes] == [n.metadata.get(ITERATION_KEY) for n in nodes]
        marks = collections.Counter(n.metadata.get("iteration") for n in nodes)
        assert set(marks) == {1, 2, None} and marks[None] == len(list(page["model"].parameters()))
        del nodes
    printed = run_cell(page, NB04, example)
    assert f"by their mark: {marks}\n" in printed
    assert f"Iteration 2's loss reaches {marks[1]} nodes that iteration 1 built." in source(cells(NB04)[example + 1])
    # The drawing's counts of the helper's marks (operations only, leaves left out) are the twin's.
    helper_cell = next(i for i, c in enumerate(cells(NB04)) if "drawing.iteration_counts" in source(c))
    assert f"{ {k: marks[k] for k in (1, 2)} }" in committed_stdout(cells(NB04)[helper_cell])


def test_04_mode_marks_a_graph_built_before_the_first_block_and_stamp_iteration_does_not() -> None:
    """What the page says the twin lacks: bt.stamp_iteration also stops at the nodes of each call's inputs."""
    page, _ = page_04_with_twins()
    said = "".join(source(c) for c in cells(NB04) if c["cell_type"] == "markdown")
    assert "a graph built before the first block\nstays unmarked" in said
    w = torch.ones(3, requires_grad=True)
    before_the_loop = w.exp()
    with bt.stamp_iteration(1), page["StampIteration"](1):
        loss = (before_the_loop * 2).sum()
    assert loss.grad_fn.metadata.get("iteration") == loss.grad_fn.metadata.get(ITERATION_KEY) == 1
    assert before_the_loop.grad_fn.metadata.get("iteration") == 1
    assert ITERATION_KEY not in before_the_loop.grad_fn.metadata


# -- 05: one gradient comparison, then bt.gradient_check ------------------------------------------------------
NB05 = "05_your_training_step.ipynb"

FIRST_LOSS_ONLY = """
def first_loss_only():
    optimizer.zero_grad()
    F.cross_entropy(net(inputs), labels1).backward()
    optimizer.step()
"""
NEVER_CLEARED = """
def never_cleared():
    loss1 = F.cross_entropy(net(inputs), labels1)
    loss1.backward()
    loss2 = F.mse_loss(net(inputs), labels2)
    loss2.backward()
    optimizer.step()
"""


def comparison(notebook: str, twin: int, page: dict, step_name: str) -> bool:
    """The twin's verdict, with the page's step name bound to ``step_name``'s function."""
    page["reuse_fixed"], fixed = page[step_name], page["reuse_fixed"]
    try:
        printed = run_cell(page, notebook, twin)
    finally:
        page["reuse_fixed"] = fixed
    verdict = re.fullmatch(r"equal: (True|False)\n", printed)
    assert verdict, printed
    return verdict.group(1) == "True"


def check(page: dict, step_name: str):
    return bt.gradient_check(page[step_name], page["reuse_reference"], models=page["net"], optimizers=page["optimizer"])


def test_05_comparison_gives_gradient_checks_verdict_on_the_pages_step() -> None:
    (twin,) = twins(NB05)
    page = page_before(NB05, twin)
    assert committed_stdout(cells(NB05)[twin]) == "equal: True\n"
    result = check(page, "reuse_fixed")
    assert comparison(NB05, twin, page, "reuse_fixed") is result.passed is True
    assert "bt.gradient_check(reuse_fixed, reuse_reference" in source(cells(NB05)[next_code_cell(NB05, twin)])


def test_05_comparison_rejects_a_wrong_step_as_gradient_check_does() -> None:
    (twin,) = twins(NB05)
    page = page_before(NB05, twin)
    run_cell(page, NB05, twin, FIRST_LOSS_ONLY)
    assert comparison(NB05, twin, page, "first_loss_only") is False
    assert not check(page, "first_loss_only").passed


def test_05_what_gradient_check_adds_a_step_that_never_clears_grad_passes_once() -> None:
    """The page: "a step that never clears .grad passes once and fails there" (in the check's second run)."""
    (twin,) = twins(NB05)
    page = page_before(NB05, twin)
    run_cell(page, NB05, twin, NEVER_CLEARED)
    assert "a step that never clears `.grad` passes once and fails there" in source(cells(NB05)[twin + 1])
    page["net"].zero_grad()
    assert comparison(NB05, twin, page, "never_cleared") is True
    result = check(page, "never_cleared")
    assert not result.passed
    first_run, second_run = result.runs
    assert first_run.error is second_run.error is None
    first, second = first_run.models[0], second_run.models[0]
    assert first.equals_reference_at_start and not second.equals_reference_at_start
    assert not second.equals_reference_at_step


def test_05_comparison_puts_back_the_weights_and_clears_grad() -> None:
    (twin,) = twins(NB05)
    page = page_before(NB05, twin)
    net = page["net"]
    before = [p.detach().clone() for p in net.parameters()]
    assert all(p.grad is None for p in net.parameters())
    run_cell(page, NB05, twin)
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    assert all(p.grad is None for p in net.parameters())
    assert not page["optimizer"].state  # plain SGD keeps no state to put back
