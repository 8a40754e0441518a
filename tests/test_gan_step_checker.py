"""helpers/lessons/gan_step/checker.py: a step's gradients against reference gradients computed here by
hand, what a check leaves behind, and the comparison of steps' costs."""

from __future__ import annotations

import pytest
import torch
from gan_steps import d_loss_fn, g_loss_fn

from helpers.lessons.gan_step.checker import GanStepChecker
from helpers.lessons.gan_step.steps import StepSettings, make_step

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(netG, netD, real, z):
    """Each network's gradient from its own loss alone, computed here by hand."""
    fake = netG(z)
    d_grads = torch.autograd.grad(d_loss_fn(netD(real), netD(fake.detach())), list(netD.parameters()))
    g_grads = torch.autograd.grad(g_loss_fn(netD(fake)), list(netG.parameters()))
    return d_grads, g_grads


def test_checker_reference_matches_a_hand_computation(gan, checker):
    netG, netD, _, _, real, z = gan
    d_grads, g_grads = reference(netG, netD, real, z)
    assert all(torch.equal(a, b) for a, b in zip(checker.reference["D"].values(), d_grads))
    assert all(torch.equal(a, b) for a, b in zip(checker.reference["G"].values(), g_grads))


def test_check_leaves_weights_optimizer_state_and_grads_as_they_were(gan, checker):
    netG, netD, optimizerG, optimizerD, _, _ = gan
    weights = [p.detach().clone() for p in [*netG.parameters(), *netD.parameters()]]
    lrs = [group["lr"] for opt in (optimizerG, optimizerD) for group in opt.param_groups]
    for settings in (StepSettings(False, True, True, True), StepSettings(True, False, False, True)):
        checker.check(make_step(settings, d_loss_fn, g_loss_fn))
    assert all(torch.equal(a, b) for a, b in zip(weights, [*netG.parameters(), *netD.parameters()]))
    assert [group["lr"] for opt in (optimizerG, optimizerD) for group in opt.param_groups] == lrs
    assert optimizerD.state_dict()["state"] == {} and optimizerG.state_dict()["state"] == {}
    assert all(p.grad is None for p in [*netG.parameters(), *netD.parameters()])


def test_check_sorts_steps_into_error_silently_wrong_and_correct(checker):
    srgan = checker.check(make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn))
    assert srgan.outcome == "error" and srgan.error_kind == "in-place modification"
    assert srgan.networks == {} and srgan.peak_graph_only_bytes is None and "ERROR" in srgan.verdict
    moved = checker.check(make_step(StepSettings(True, False, False, False), d_loss_fn, g_loss_fn))
    assert moved.outcome == "silently wrong"
    assert not moved.networks["D"].matches and moved.networks["D"].relative_error > 0.1
    assert moved.networks["G"].matches and moved.networks["G"].bit_equal
    assert "SILENTLY WRONG" in moved.verdict and "WRONG" in repr(moved) and "WRONG" in moved._repr_html_()
    standard = checker.check(make_step(StepSettings(False, True, True, True), d_loss_fn, g_loss_fn))
    assert standard.outcome == "correct" and standard.step_calls == {"D": 1, "G": 1}
    assert standard.d_forward_calls == 3 and standard.peak_graph_only_bytes > 0
    assert standard.held_at_d_step is not None and standard.held_at_d_step > 0  # G's graph, still needed
    assert standard.table().column("verdict") == ["matches", "matches"]


def test_check_records_what_the_optimizers_receive(gan, checker):
    netG, netD, _, _, real, z = gan
    moved = checker.check(make_step(StepSettings(True, False, False, False), d_loss_fn, g_loss_fn))
    fake_out = netD(netG(z))
    both = torch.autograd.grad(d_loss_fn(netD(real), fake_out) + g_loss_fn(fake_out), list(netD.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(moved.gradients["D"].values(), both))


def test_a_step_without_optimizer_steps_is_judged_by_its_final_grads(checker):
    def only_gradients(netG, netD, optimizerG, optimizerD, real, z):
        d_grads, g_grads = reference(netG, netD, real, z)
        for p, g in zip([*netD.parameters(), *netG.parameters()], [*d_grads, *g_grads]):
            p.grad = g

    result = checker.check(only_gradients)
    assert result.outcome == "correct" and result.step_calls == {"D": 0, "G": 0}
    assert result.held_at_d_step is None and result.name == "only_gradients"


def test_a_step_that_gives_g_no_gradient_is_wrong(checker):
    result = checker.check(make_step(StepSettings(True, True, False, False), d_loss_fn, g_loss_fn))
    assert result.outcome == "silently wrong"
    assert len(result.networks["G"].missing) == 6 and result.networks["G"].relative_error == pytest.approx(1.0)
    assert "no gradient" in result.networks["G"].describe()


def test_check_raises_bugs_that_are_not_autograd_errors(checker):
    def buggy(*args):
        raise KeyError("oops")

    with pytest.raises(KeyError):
        checker.check(buggy)
    with pytest.raises(TypeError):
        checker.check("not a step")


def test_checker_rejects_bad_input(gan):
    netG, netD, optimizerG, optimizerD, real, z = gan
    with pytest.raises(TypeError):
        GanStepChecker("G", netD, optimizerG, optimizerD, real, z, d_loss_fn, g_loss_fn)
    with pytest.raises(ValueError, match="optimizerG"):
        GanStepChecker(netG, netD, optimizerD, optimizerD, real, z, d_loss_fn, g_loss_fn)
    with pytest.raises(TypeError):
        GanStepChecker(netG, netD, optimizerG, "adam", real, z, d_loss_fn, g_loss_fn)
    with pytest.raises(TypeError):
        GanStepChecker(netG, netD, optimizerG, optimizerD, real.tolist(), z, d_loss_fn, g_loss_fn)
    with pytest.raises(TypeError):
        GanStepChecker(netG, netD, optimizerG, optimizerD, real, z, d_loss_fn, "bce")
    with pytest.raises(ValueError, match="single number"):
        GanStepChecker(netG, netD, optimizerG, optimizerD, real, z, lambda r, f: r - f, g_loss_fn)
    with pytest.raises(ValueError, match="no parameters"):
        GanStepChecker(netG, torch.nn.Identity(), optimizerG, optimizerD, real, z, d_loss_fn, g_loss_fn)


def test_compare_checks_and_measures_each_step(checker):
    steps = {
        "standard": make_step(StepSettings(False, True, True, True), d_loss_fn, g_loss_fn),
        "srgan": make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn),
        "retained": make_step(StepSettings(True, True, True, True), d_loss_fn, g_loss_fn),
    }
    comparison = checker.compare(steps, rounds=3, progress=False)
    assert comparison["standard"].outcome == "correct" and comparison["srgan"].outcome == "error"
    assert comparison.time_ratio("standard") == 1.0 and comparison.time_ratio("srgan") is None
    assert comparison.time_ratio("retained") > 0
    assert set(comparison.profiler_peak_bytes) == {"standard", "retained"}
    assert comparison["retained"].peak_graph_only_bytes > comparison["standard"].peak_graph_only_bytes
    table = comparison.table()
    assert table.column("outcome") == ["correct", "error (in-place modification)", "correct"]
    assert table.column("time per step")[1] == "-"
    portable = comparison.table(timing=False)
    assert portable.columns == [
        "step",
        "outcome",
        "D gradient vs reference",
        "G gradient vs reference",
        "peak graph-only (meter)",
    ]
    assert portable.column("outcome") == table.column("outcome")
    with pytest.raises(KeyError):
        comparison["nope"]


def test_compare_rejects_bad_input(checker):
    good = make_step(StepSettings(False, True, True, True), d_loss_fn, g_loss_fn)
    bad = make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn)
    with pytest.raises(TypeError):
        checker.compare({})
    with pytest.raises(TypeError):
        checker.compare({"a": 1})
    with pytest.raises(ValueError, match="reference"):
        checker.compare({"a": good}, reference="b")
    with pytest.raises(ValueError, match="raises"):
        checker.compare({"bad": bad, "good": good}, progress=False, rounds=1)
    with pytest.raises(ValueError):
        checker.compare({"a": good}, rounds=0)
