"""Notebook 05's gallery, run from the notebook's own code cells: the verdict the notebook states for every call
of every step, as written and fixed; the fixed steps give the reference gradients; every tool puts the state
back and keeps no graph alive. And the exercise's steps on the page are the check's own copies."""

from __future__ import annotations

import ast
import contextlib
import copy
import gc
import io
import json
import linecache
import random
import re
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import helpers as bt
from helpers.lessons import your_training_step as lesson

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_your_training_step.ipynb"

# name in the notebook's gallery -> (audit verdicts as written, diagnose's error kind, carried graph found,
#                                    audit verdicts of the fixed step)
GALLERY = {
    "reuse the graph (post 2)": (["can go", "not a retain"], None, False, ["not a retain", "not a retain"]),
    "two losses, retain first": (["needed", "not a retain"], None, False, ["not a retain"]),
    "two losses, retain both": (["needed", "can go"], None, False, ["not a retain"]),
    "SRGAN step": (["needed", "not a retain"], "in-place version error", False, ["not a retain", "not a retain"]),
    "single-forward GAN": (["needed", "not a retain"], None, False, ["needed", "not a retain"]),
    "actor-critic": (["needed", "not a retain"], None, False, ["not a retain"]),
    "RNN language model": (["goes with the carried fix"], "in-place version error", True, ["not a retain"]),
    "gradient penalty": (["can go", "not a retain"], None, False, ["can go", "not a retain"]),
}


def code_cells() -> list[tuple[int, str]]:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def error_demos() -> set[int]:
    """The cells that show a real traceback (tagged ``raises-exception``)."""
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return {i for i, c in enumerate(cells) if "raises-exception" in c.get("metadata", {}).get("tags", [])}


@pytest.fixture(scope="module")
def page():
    """The namespace after running every code cell of the notebook, each compiled from a file name that
    linecache knows, so the tools find the learner's lines as they do in a kernel."""
    threads = torch.get_num_threads()
    namespace: dict = {"__raised__": {}}
    demos = error_demos()
    with contextlib.redirect_stdout(io.StringIO()):
        for index, source in code_cells():
            name = f"notebook05_cell{index}.py"
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            try:
                exec(compile(source, name, "exec"), namespace)
            except Exception as error:  # an error demo's own: kept for the tests
                if index not in demos:
                    raise
                namespace["__raised__"][index] = error
    yield namespace
    torch.set_num_threads(threads)


def snapshot(objects: dict, step) -> tuple:
    models = objects["models"]
    models = list(models.values()) if isinstance(models, dict) else models
    models = [models] if isinstance(models, torch.nn.Module) else list(models)
    optimizers = objects["optimizers"]
    optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    params = [(p.detach().clone(), None if p.grad is None else p.grad.clone()) for m in models for p in m.parameters()]
    held = {name: step.__globals__[name] for name in step.__code__.co_names if name in step.__globals__}
    return (
        params,
        [copy.deepcopy(o.state_dict()) for o in optimizers],
        torch.get_rng_state(),
        random.getstate(),
        held,
        models,
        optimizers,
    )


def assert_same_state(before: tuple, step) -> None:
    params, states, rng, py_rng, held, models, optimizers = before
    now = [(p, p.grad) for m in models for p in m.parameters()]
    for (value, grad), (p, g) in zip(params, now):
        assert torch.equal(value, p)
        assert (grad is None and g is None) or torch.equal(grad, g)
    for state, optimizer in zip(states, optimizers):
        got = optimizer.state_dict()
        assert state["param_groups"] == got["param_groups"]
        for key, values in state["state"].items():
            assert all(not torch.is_tensor(v) or torch.equal(v, got["state"][key][k]) for k, v in values.items())
    assert torch.equal(rng, torch.get_rng_state()) and py_rng == random.getstate()
    for name, value in held.items():
        assert step.__globals__[name] is value, f"{name} is not the learner's object again"


@contextlib.contextmanager
def no_graph_outlives(objects: dict):
    """Weak references to the storage of every output of every module while inside; all dead afterwards.

    One backward of a tiny graph first: when a backward raises inside a GRU's backward (the language model's
    in-place error at iteration 2), PyTorch's engine keeps what that graph saved until the next backward call
    (seen on torch 2.13 with nn.GRU, not nn.RNN or nn.LSTM, without any tool), which is not the tools' doing."""
    models = objects["models"]
    models = list(models.values()) if isinstance(models, dict) else models
    models = [models] if isinstance(models, torch.nn.Module) else list(models)
    refs: list[StorageWeakRef] = []

    def hook(module, args, output):
        for t in output if isinstance(output, tuple) else (output,):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                with contextlib.suppress(NotImplementedError):  # torch.func's wrapped tensors have no storage
                    refs.append(StorageWeakRef(t.untyped_storage()))

    handles = [m.register_forward_hook(hook) for model in models for m in model.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    torch.ones(1, requires_grad=True).mul(2).sum().backward()
    gc.collect()
    assert refs and all(ref.expired() for ref in refs), f"{sum(not r.expired() for r in refs)} outputs alive"


def verdicts(audit) -> list[str]:
    return [c.verdict for c in audit.calls]


@pytest.mark.parametrize("name", list(GALLERY))
def test_each_gallery_step_gets_the_verdict_the_notebook_states(page, name) -> None:
    step, fixed, reference, objects = page["gallery"][name]
    as_written, error_kind, carried, fixed_verdicts = GALLERY[name]
    before = snapshot(objects, step)
    with no_graph_outlives(objects):
        audit = bt.audit_retain_graph(step, **objects)
    assert_same_state(before, step)
    assert verdicts(audit) == as_written, audit
    with no_graph_outlives(objects):
        found = bt.diagnose(step, **objects)
    assert_same_state(before, step)
    assert (found.error_kind, found.carried.found) == (error_kind, carried), found
    assert verdicts(found.audit) == as_written
    with no_graph_outlives(objects):
        fixed_audit = bt.audit_retain_graph(fixed, **objects)
        check = bt.gradient_check(fixed, reference, **objects)
    assert_same_state(before, step)
    assert fixed_audit.error is None and verdicts(fixed_audit) == fixed_verdicts, fixed_audit
    assert check.passed, check
    for line in (c.line for c in audit.calls):  # the learner's lines, in the notebook's cells
        assert line.startswith("notebook05_cell"), line


def test_the_gallery_covers_every_step_the_notebook_names(page) -> None:
    assert list(page["gallery"]) == list(GALLERY)


def test_the_broken_steps_fail_the_gradient_check_and_what_they_compute_passes(page) -> None:
    gan, critic = page["gan"], page["critic"]
    wrong = bt.gradient_check(page["single_forward_step"], page["gan_reference"], **gan)
    assert not wrong and [m.reads for m in wrong.runs[0].models] == ["DIFFERENT", "DIFFERENT"]
    computed = bt.gradient_check(page["single_forward_step"], page["what_it_computes"], **gan)
    assert computed.simultaneous and not computed.alternating
    constant = bt.gradient_check(page["retain_only_step"], page["critic_reference"], **critic)
    assert not constant and "netD DIFFERENT" in repr(constant)
    assert verdicts(bt.audit_retain_graph(page["retain_only_step"], **critic)) == ["can go", "not a retain"]


def test_the_standard_gan_step_is_alternating_and_the_single_forward_fix_simultaneous(page) -> None:
    """Sections 2.3 and 2.4: at the optimizers' own learning rates the check tells the two fixed GAN steps apart."""
    standard = bt.gradient_check(page["standard_step"], page["gan_reference"], **page["gan"])
    single = bt.gradient_check(page["single_forward_fixed"], page["gan_reference"], **page["gan"])
    assert standard.alternating and not standard.simultaneous, standard
    assert single.simultaneous and not single.alternating, single
    for result, point in (
        (standard, "at its optimizer's step (DIFFERENT at the step's start)"),
        (single, "at the step's start (DIFFERENT at its optimizer's step)"),
    ):
        assert [m.reads for m in result.runs[0].models] == [
            "equal up to float rounding",
            f"equal up to float rounding {point}",
        ]


def test_the_srgan_diagnosis_names_the_error_line_and_keeps_the_audits_words(page) -> None:
    found = bt.diagnose(page["srgan_step"], **page["gan"])
    assert found.error_line.endswith(": g_loss.backward()")
    [error] = found.items  # the retain g_loss's backward needs in the same run is evidence, not an item
    assert error.kind == "error" and error.to_fix and "again after the step at line" in error.fix
    assert [line.code for line in error.lines][-2:] == ["optimizerD.step()", "g_loss.backward()"]
    assert "needed; needed in 1 of 1 runs" in found.evidence() and "g_loss.backward()" in found.evidence()


def test_the_language_model_diagnosis_names_hidden_and_the_retain_that_hides_it(page) -> None:
    found = bt.diagnose(page["lm_step"], **page["language_model"])
    [carried] = found.items  # the band-aid retain is part of the carried fix: one item, one fix
    assert carried.kind == "carried" and carried.label.endswith("retain_graph=True only hides it")
    assert "hidden = hidden.detach()" in carried.fix and "and remove retain_graph=True at line" in carried.fix
    assert bt.diagnose(page["lm_fixed"], **page["language_model"]).healthy


def test_the_watched_loop_raises_with_the_diagnosis_under_its_traceback(page) -> None:
    """Section 3's loop cell: no expect_error around it; the error goes up with the diagnosis as its note."""
    [error] = page["__raised__"].values()
    assert "backward through the graph a second time" in str(error)
    [note] = error.__notes__
    assert note.startswith("backward-twice: 1 thing to fix (2 iterations watched; the loop raised in iteration 2)")
    assert "`h` carries iteration 1's graph into iteration 2" in note and "output, h = lm_loop(data, h)" in note
    # cells run here as files (no kernel names them cells): the script's pointer; the kernel's is nbval's to check
    assert "fix: add `h = h.detach()` before line " in note and note.endswith("more: print(w.evidence())")


# -- the exercise --------------------------------------------------------------------------------------------


def functions(tree: ast.AST) -> dict[str, str]:
    return {
        node.name: ast.dump(ast.Module(body=node.body, type_ignores=[]))
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    }


def test_the_exercise_steps_on_the_page_are_the_checks_own() -> None:
    page_functions: dict[str, str] = {}
    for _, source in code_cells():
        page_functions.update(functions(ast.parse(source)))
    own = functions(ast.parse(Path(lesson.__file__).read_text(encoding="utf-8")))
    for name in ("adversarial_step", "head_grad_step", "regularised_step"):
        assert page_functions[name] == own[name], f"the notebook's {name} differs from the check's copy"


def test_the_exercise_setup_on_the_page_is_the_checks_own() -> None:
    setup = next(source for _, source in code_cells() if "xb, yb = " in source)
    lesson_source = Path(lesson.__file__).read_text(encoding="utf-8")
    for line in setup.splitlines()[1:]:  # after bt.seed_everything(0), the check's torch.manual_seed(0)
        assert line.strip() in lesson_source, line


def test_the_page_steps_get_the_verdicts_the_solution_gives(page) -> None:
    objects = {"models": page["model"], "optimizers": page["opt"]}
    got = {
        name: tuple(c.verdict for c in bt.audit_retain_graph(page[name], **objects).calls if c.retain_graph)
        for name in ("adversarial_step", "head_grad_step", "regularised_step")
    }
    assert got == {
        "adversarial_step": ("needed",),
        "head_grad_step": ("can go",),
        "regularised_step": ("needed", "can go"),
    }


# -- gradient_check's own promises ----------------------------------------------------------------------------


@pytest.fixture
def small():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(5, 3)
    return model, optimizer, x


def test_a_step_that_never_zeroes_grad_fails_on_the_second_run(small) -> None:
    model, optimizer, x = small

    def step():
        model(x).pow(2).mean().backward()
        optimizer.step()

    result = bt.gradient_check(step, lambda: model(x).pow(2).mean(), models=model, optimizers=optimizer)
    assert not result and [r.models[0].reads for r in result.runs] == [
        "equal up to float rounding",
        "DIFFERENT (the reference plus what .grad held as the step began: nothing cleared it)",
    ]
    assert repr(result).startswith("✗ step does not give the reference gradients:")


def test_the_weights_move_at_the_optimizers_learning_rate_and_everything_is_put_back(small) -> None:
    model, optimizer, x = small
    model(x).sum().backward()
    optimizer.step()
    before = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        [p.grad.clone() for p in model.parameters()],
    )
    seen = []

    def step():
        seen.append([p.detach().clone() for p in model.parameters()])
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    assert bt.gradient_check(step, lambda: model(x).pow(2).mean(), models={"net": model}, optimizers=[optimizer])
    assert not all(torch.equal(a, b) for a, b in zip(*seen))  # the second run starts where the first stepped to
    assert all(torch.equal(a, b) for a, b in zip(seen[0], before[0].values()))
    state, opt_state, grads = before
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert optimizer.state_dict()["param_groups"] == opt_state["param_groups"]
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


@pytest.fixture
def two_networks():
    torch.manual_seed(0)
    netG, netD = (
        torch.nn.Linear(2, 2),
        torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)),
    )
    optG, optD = torch.optim.SGD(netG.parameters(), lr=0.1), torch.optim.SGD(netD.parameters(), lr=0.1)
    z, real = torch.randn(8, 2), torch.randn(8, 2)

    def reference():
        fake_out = netD(netG(z))
        return {"D": netD(real).mean() - fake_out.mean(), "G": fake_out.mean()}

    def alternating():
        fake = netG(z)
        optD.zero_grad()
        (netD(real).mean() - netD(fake.detach()).mean()).backward()
        optD.step()
        optG.zero_grad()
        netD(fake).mean().backward()  # through D as D's step left it
        optG.step()

    def simultaneous():
        optD.zero_grad()
        optG.zero_grad()
        fake_out = netD(netG(z))
        d_grads = torch.autograd.grad(netD(real).mean() - fake_out.mean(), list(netD.parameters()), retain_graph=True)
        g_grads = torch.autograd.grad(fake_out.mean(), list(netG.parameters()))
        for p, g in zip([*netD.parameters(), *netG.parameters()], d_grads + g_grads):
            p.grad = g
        optD.step()
        optG.step()

    return {"models": {"D": netD, "G": netG}, "optimizers": [optD, optG]}, reference, alternating, simultaneous


def test_an_alternating_step_and_a_simultaneous_one_are_told_apart(two_networks) -> None:
    objects, reference, alternating, simultaneous = two_networks
    first, second = (
        bt.gradient_check(alternating, reference, **objects),
        bt.gradient_check(simultaneous, reference, **objects),
    )
    assert first.alternating and not first.simultaneous and "alternating updates" in repr(first)
    assert second.simultaneous and not second.alternating and "simultaneous updates" in repr(second)
    assert [m.reads for m in first.runs[0].models] == [
        "equal up to float rounding",
        "equal up to float rounding at its optimizer's step (DIFFERENT at the step's start)",
    ]
    assert [m.reads for m in second.runs[0].models] == [
        "equal up to float rounding",
        "equal up to float rounding at the step's start (DIFFERENT at its optimizer's step)",
    ]


def test_at_learning_rate_0_the_two_cannot_be_told_apart(two_networks) -> None:
    objects, reference, alternating, simultaneous = two_networks
    for optimizer in objects["optimizers"]:
        optimizer.param_groups[0]["lr"] = 0.0
    for step in (alternating, simultaneous):
        result = bt.gradient_check(step, reference, **objects)
        assert result.alternating and result.simultaneous, result


def test_the_reference_reads_the_hidden_state_the_step_began_with_and_leaves_buffers_alone() -> None:
    torch.manual_seed(0)
    cell, norm = torch.nn.RNNCell(3, 4), torch.nn.BatchNorm1d(4)
    model = torch.nn.ModuleDict({"cell": cell, "norm": norm})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, h = torch.randn(6, 3), torch.zeros(6, 4)
    start, counted = h, []

    def step():
        nonlocal h
        counted.append(int(norm.num_batches_tracked))  # the reference's forward passes must not count
        optimizer.zero_grad()
        h = cell(x, h.detach())
        loss = norm(h).pow(2).mean()
        loss.backward()
        optimizer.step()

    def reference():
        return norm(cell(x, h.detach())).pow(2).mean()

    running = norm.running_mean.clone()
    result = bt.gradient_check(step, reference, models=model, optimizers=optimizer)
    assert result.alternating and result.simultaneous, result
    assert counted == [0, 1]
    assert torch.equal(norm.running_mean, running) and h is start


def test_a_reference_that_fails_at_the_optimizers_step_is_its_own_error_not_the_steps(small) -> None:
    model, optimizer, x = small
    calls = []

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    def reference():
        calls.append(None)
        if len(calls) > 1:
            raise KeyError("made up")
        return model(x).sum()

    with pytest.raises(KeyError, match="made up"):
        bt.gradient_check(step, reference, models=model, optimizers=optimizer)
    assert len(calls) == 2  # once as the step began, once at optimizer.step()


def test_a_step_that_raises_is_reported_with_its_error(small) -> None:
    model, _optimizer, x = small

    def step():
        loss = model(x).sum()
        loss.backward()
        loss.backward()

    result = bt.gradient_check(step, lambda: model(x).sum(), models=model)
    assert not result and len(result.runs) == 1
    assert result.runs[0].error.startswith("RuntimeError: Trying to backward through the graph a second time")


def test_bad_input_is_refused_clearly(small) -> None:
    model, optimizer, x = small

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    reference = lambda: model(x).sum()  # noqa: E731
    with pytest.raises(TypeError, match="gradient_check takes a step with no arguments; yours needs"):
        bt.gradient_check(lambda batch: None, reference, models=model)
    with pytest.raises(TypeError, match="gradient_check's reference takes a step: a function of no arguments"):
        bt.gradient_check(step, model(x).sum(), models=model)
    with pytest.raises(TypeError, match=re.escape("models must be a torch.nn.Module, a list of them or a dict")):
        bt.gradient_check(step, reference, models=[model, x], optimizers=optimizer)
    with pytest.raises(TypeError, match=re.escape("a dict of name -> torch.nn.Module")):
        bt.gradient_check(step, reference, models={"net": optimizer})
    with pytest.raises(
        TypeError,
        match=r"the reference must return a dict of model name -> loss with the names "
        r"\['a', 'b'\]",
    ):
        bt.gradient_check(step, reference, models={"a": model, "b": model[2]}, optimizers=optimizer)
    with pytest.raises(TypeError, match="one-number tensor with a graph"):
        bt.gradient_check(step, lambda: model(x), models=model, optimizers=optimizer)
    with pytest.raises(ValueError, match=r"the step calls optimizer \(Adam\).step\(\), an optimizer not in optimizers"):
        bt.gradient_check(step, reference, models=model)
    assert optimizer.param_groups[0]["lr"] == 0.1
