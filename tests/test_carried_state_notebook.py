"""Notebook 04's own code, run here: its exercise cells fail their checks, the solutions its markdown hides pass
them, and the fixed steps of section 5 carry nothing while the broken ones carry what the text says.

The code cells run in order in one namespace, as a kernel would run them (no cell uses IPython magics).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import linecache
import re
from itertools import pairwise
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "04_carried_state.ipynb"


@pytest.fixture(scope="module")
def notebook() -> dict:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    namespace: dict = {"__name__": "__main__"}
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            filename = f"{NOTEBOOK.stem}-cell-{index}.py"  # in linecache, so the finder can quote lines
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            tree = ast.parse(source)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, filename, "exec"), namespace)
            if last is not None:
                results[index] = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
    solutions = [
        re.search(r"```python\n(.*?)```", "".join(c["source"]), re.S).group(1)
        for c in cells
        if c["cell_type"] == "markdown" and "<summary>Solution</summary>" in "".join(c["source"])
    ]
    return {"namespace": namespace, "results": results, "solutions": solutions}


def exercise_results(notebook: dict) -> list:
    return [r for r in notebook["results"].values() if type(r).__name__ == "CheckResult"]


def test_the_three_exercise_cells_fail_their_checks_as_committed(notebook) -> None:
    results = exercise_results(notebook)
    assert len(results) == 3
    assert not any(results), results


def test_each_hidden_solution_passes_its_check(notebook) -> None:
    namespace, solutions = notebook["namespace"], notebook["solutions"]
    assert len(solutions) == 3
    first = eval(solutions[0].strip(), namespace)
    assert first, repr(first)
    exec(solutions[1], namespace)
    assert namespace["bt"].check_truncated_bptt(namespace["train_truncated"]), "exercise 2's solution"
    exec(solutions[2], namespace)
    assert namespace["bt"].check_precomputed_fix(namespace["train_classifier"]), "exercise 3's solution"


@pytest.mark.parametrize(
    ("broken", "fixed"),
    [
        ("step_precomputed", "step_precomputed_fixed"),
        ("step_total", "step_total_fixed"),
        ("step_module_state", "step_module_state_fixed"),
        ("step_bank", "step_bank_fixed"),
        ("step_policy", "step_policy_fixed"),
        ("step_average", "step_average_fixed"),
        ("train_step", None),
    ],
)
def test_each_carrier_is_found_and_each_fix_carries_nothing(notebook, broken, fixed) -> None:
    namespace = notebook["namespace"]
    torch = namespace["torch"]
    # Each step starts from the state its own cell set up, not what later cells left behind.
    namespace.update(h=torch.zeros(4, 64), total_loss=0.0, bank=[], average=torch.zeros(16))
    namespace["remembers"].memory = torch.zeros(1, 8)
    models = [v for v in namespace.values() if isinstance(v, torch.nn.Module)]
    optimizers = [v for v in namespace.values() if isinstance(v, torch.optim.Optimizer)]
    before = [p.detach().clone() for model in models for p in model.parameters()]
    find = functools.partial(namespace["bt"].find_carried_graph, models=models, optimizers=optimizers)
    report = find(namespace[broken])
    assert report.found and "second time" in (report.error or ""), str(report)
    if fixed is not None:
        clean = find(namespace[fixed])
        assert not clean.found and clean.error is None, str(clean)
    after = [p.detach() for model in models for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "the finder did not put the weights back"


def test_retaining_walks_and_keeps_one_more_batch_per_iteration_and_detaching_stays_flat(notebook) -> None:
    growth = notebook["namespace"]["growth"]
    nodes, kept = growth.backward_nodes["retain_graph=True"], growth.graph_only_bytes["retain_graph=True"]
    assert len({b - a for a, b in pairwise(nodes)}) == 1 and nodes[1] > nodes[0]
    assert kept == [kept[0] * k for k in range(1, len(kept) + 1)] and kept[0] > 0
    assert len(set(growth.backward_nodes["h = h.detach()"])) == 1
    assert set(growth.graph_only_bytes["h = h.detach()"]) == {0}


def test_the_truncated_gradient_nears_the_full_one_as_the_window_grows(notebook) -> None:
    """The ignored cell's figures: the difference shrinks with k, is clear at k = 4, and is nil at k = 64."""
    namespace = notebook["namespace"]
    full, windows = namespace["full"], namespace["windows"]
    differences = [float((windows[k] - full).norm() / full.norm()) for k in (4, 8, 16, 32, 64)]
    assert all(a > b for a, b in pairwise(differences)), differences
    assert differences[0] > 0.05 and differences[-1] < 1e-6, differences


def test_a_window_loses_a_one_step_dependence_across_its_cut_and_keeps_a_longer_one_inside_it(notebook) -> None:
    """The ignored cell's figures: input 3 -> step 4 is exactly 0 with windows of 4 and not with full BPTT;
    input 0 -> step 3 is the same under both."""
    influence = notebook["namespace"]["influence"]
    assert influence(4, 3, 4) == 0 < influence(64, 3, 4)
    assert influence(4, 0, 3) == influence(64, 0, 3) > 0


def test_summed_chunks_give_full_bptt_with_its_peak_memory(notebook) -> None:
    namespace = notebook["namespace"]
    bt, torch = namespace["bt"], namespace["torch"]
    inputs, targets = namespace["inputs"], namespace["targets"]
    peaks = {}
    for name, gradient_of in (
        ("summed", namespace["gradient_of_summed_chunks"]),
        ("window of 64", namespace["gradient_with_window"]),
    ):
        meter = bt.SavedTensorMeter()
        with meter:
            gradient = gradient_of(16 if name == "summed" else 64, inputs, targets)
        peaks[name] = meter.peak_graph_only_bytes
        assert torch.allclose(gradient, namespace["full"], rtol=1e-4, atol=1e-6), name
    # The same to a few bytes (the chunks' scaled losses): what full BPTT holds, whatever the chunking.
    assert abs(peaks["summed"] - peaks["window of 64"]) < 0.001 * peaks["window of 64"], peaks


def test_checkpointed_chunks_hold_under_a_tenth_of_the_bytes_and_keep_the_exact_gradient(notebook) -> None:
    """4.3's text: chunking alone saves nothing, and checkpointing each chunk saves memory with the exact
    gradient. Counted with a saved-tensor hook of its own (not the course's meter): the distinct storages, other
    than the weights, that the graph still holds after the forward."""
    import weakref

    from torch.utils.checkpoint import checkpoint

    namespace = notebook["namespace"]
    torch, model, chunk_loss = namespace["torch"], namespace["tbptt_model"], namespace["chunk_loss"]
    inputs, targets = namespace["inputs"], namespace["targets"]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held = {}
    for checkpointed in (False, True):
        saved: dict = {}

        def pack(tensor, saved=saved):
            saved[tensor.untyped_storage().data_ptr()] = (weakref.ref(tensor), tensor.untyped_storage().nbytes())
            return tensor

        model.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            h, total = torch.zeros(4, 64), 0.0
            for start in range(0, 64, 16):
                chunk = (model, h, inputs[start : start + 16], targets[start : start + 16])
                loss, h = checkpoint(chunk_loss, *chunk, use_reentrant=False) if checkpointed else chunk_loss(*chunk)
                total = total + loss / 4
        held[checkpointed] = sum(n for ptr, (ref, n) in saved.items() if ref() is not None and ptr not in weights)
        total.backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.allclose(gradient, namespace["full"], rtol=1e-4, atol=1e-6), checkpointed
    assert 0.05 * held[False] < held[True] < 0.1 * held[False], held  # less than a tenth
    said = "".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"])
    assert "only cutting `h` does" not in said
    assert "checkpointing each chunk (`torch.utils.checkpoint`, notebook 06, section 1) saves it" in said


def test_an_lstm_needs_both_h_and_c_cut(notebook) -> None:
    namespace = notebook["namespace"]
    walked = namespace["train_lstm"](lambda state: tuple(s.detach() for s in state))
    assert len(set(walked)) == 1
    for keep in (0, 1):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            namespace["train_lstm"](
                lambda state, keep=keep: tuple(s if i == keep else s.detach() for i, s in enumerate(state))
            )


def test_detaching_the_whole_average_changes_iteration_1s_gradient_a_little(notebook) -> None:
    namespace = notebook["namespace"]
    difference = float((namespace["cut_all"] - namespace["cut_old"]).norm() / namespace["cut_old"].norm())
    assert 1e-4 < difference < 0.1, difference


def test_retaining_through_features_computed_once_trains_on_stale_gradients(notebook) -> None:
    """The ignored cell's figures: iteration 1's gradient is the current weights' one, later ones are not."""
    first, *later = notebook["namespace"]["differences"]
    assert first < 1e-6 and all(d > 0.01 for d in later), (first, later)
