"""helpers/gan.py: the toy data, the step checker, the GAN lab (driven through its widgets) and the
exercise checks, each against computations made here, independently of the module."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
import torch

from helpers.gan import (
    GanLab,
    GanStepChecker,
    StepSettings,
    check_fixed_srgan_step,
    check_gradient_penalty,
    check_single_forward_step,
    make_step,
    ring_centers,
    ring_coverage,
    ring_of_gaussians,
    sample_distance,
    samples_figure,
    training_figure,
)

from gan_steps import IN_PLACE, SECOND_TIME, d_loss_fn, g_loss_fn, inputs_step, one_thread, standard_step  # noqa: F401


def mlp(n_in: int, n_out: int) -> torch.nn.Sequential:
    """Smaller than the notebook's networks: these tests judge logic, not learning."""
    return torch.nn.Sequential(torch.nn.Linear(n_in, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 16),
                               torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, n_out))


@pytest.fixture
def gan():
    torch.manual_seed(0)
    netG, netD = mlp(2, 2), mlp(2, 1)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-2)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    real, z = ring_of_gaussians(32, generator=generator), torch.randn(32, 2, generator=generator)
    return netG, netD, optimizerG, optimizerD, real, z


@pytest.fixture
def checker(gan):
    return GanStepChecker(*gan, d_loss_fn, g_loss_fn)


def reference(netG, netD, real, z):
    """Each network's gradient from its own loss alone, computed here by hand."""
    fake = netG(z)
    d_grads = torch.autograd.grad(d_loss_fn(netD(real), netD(fake.detach())), list(netD.parameters()))
    g_grads = torch.autograd.grad(g_loss_fn(netD(fake)), list(netG.parameters()))
    return d_grads, g_grads


def expected_outcome(settings: StepSettings) -> tuple[str, str | None]:
    """What each combination must do, reasoned out from the code, not from the module."""
    if not settings.retain_graph and (not settings.detach or not settings.fresh_pass):
        return "error", SECOND_TIME  # the second backward needs buffers the first one freed
    if settings.retain_graph and not settings.fresh_pass and settings.d_step_first:
        return "error", IN_PLACE  # g_loss goes through D's old graph after D's in-place step
    if not settings.d_step_first:
        return "silently wrong", None  # g_loss.backward() adds into D's .grad before D's step
    return "correct", None


# -- data ---------------------------------------------------------------------------------------

def test_ring_of_gaussians_lies_on_the_ring_and_is_reproducible():
    points = ring_of_gaussians(4000, generator=torch.Generator().manual_seed(0))
    assert points.shape == (4000, 2)
    radii = points.norm(dim=1)
    assert abs(float(radii.mean()) - 2.0) < 0.02 and float(radii.std()) < 0.15
    again = ring_of_gaussians(4000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(points, again)
    nearest = torch.cdist(points, ring_centers()).argmin(dim=1)
    counts = torch.bincount(nearest, minlength=8)
    assert counts.min() > 400 and counts.max() < 600  # every mode about 1/8 of the points


def test_ring_centers_are_evenly_spaced():
    centers = ring_centers(modes=4, radius=3.0)
    assert torch.allclose(centers, torch.tensor([[3.0, 0.0], [0.0, 3.0], [-3.0, 0.0], [0.0, -3.0]]), atol=1e-6)
    assert torch.allclose(ring_of_gaussians(5, modes=1, radius=1.0, std=0.0), torch.tensor([[1.0, 0.0]] * 5))


@pytest.mark.parametrize("call, error", [
    (lambda: ring_of_gaussians(0), ValueError),
    (lambda: ring_of_gaussians(2.5), TypeError),
    (lambda: ring_of_gaussians(True), TypeError),
    (lambda: ring_of_gaussians(10, std=-0.1), ValueError),
    (lambda: ring_of_gaussians(10, generator=0), TypeError),
    (lambda: ring_of_gaussians(10, modes=0), ValueError),
    (lambda: ring_of_gaussians(10, radius=0), ValueError),
    (lambda: ring_centers(radius="2"), TypeError),
])
def test_data_functions_reject_bad_input(call, error):
    with pytest.raises(error):
        call()


def test_sample_distance_is_zero_for_the_same_points_and_grows_with_a_shift():
    points = ring_of_gaussians(500, generator=torch.Generator().manual_seed(0))
    assert sample_distance(points, points) == 0.0
    shifted = points + torch.tensor([0.5, 0.0])
    assert sample_distance(points, shifted) == pytest.approx(sample_distance(shifted, points))
    assert sample_distance(points, points + torch.tensor([1.0, 0.0])) > sample_distance(points, shifted) > 0.2


def test_sample_distance_punishes_missing_modes():
    real = ring_of_gaussians(800, generator=torch.Generator().manual_seed(0))
    one_mode = ring_of_gaussians(800, modes=1, generator=torch.Generator().manual_seed(1))
    assert sample_distance(one_mode, real) > 1.0  # the other 7 modes' real points are far from every sample


@pytest.mark.parametrize("a, error", [
    ([[0.0, 0.0]], TypeError),
    (torch.zeros(5, 3), ValueError),
    (torch.zeros(5), ValueError),
    (torch.zeros(0, 2), ValueError),
])
def test_sample_distance_rejects_bad_input(a, error):
    with pytest.raises(error):
        sample_distance(a, torch.zeros(4, 2))


def test_ring_coverage_counts_modes_and_near_points():
    on_centers = ring_centers().repeat(10, 1)
    full = ring_coverage(on_centers)
    assert (full.modes_covered, full.modes, full.near_fraction) == (8, 8, 1.0)
    assert "8 of 8 modes" in str(full)
    one = ring_coverage(ring_centers()[:1].repeat(20, 1))
    assert one.modes_covered == 1
    blob = ring_coverage(torch.zeros(50, 2))
    assert blob.modes_covered == 0 and blob.near_fraction == 0.0
    with pytest.raises(ValueError):
        ring_coverage(on_centers, std=0)


def test_figures_render_as_png_and_check_their_input():
    real = ring_of_gaussians(100, generator=torch.Generator().manual_seed(0))
    png = samples_figure(real, real * 0.5, title="t")._repr_png_()
    assert png.startswith(b"\x89PNG")
    figure = training_figure(real, real * 0.1, real, [(1.0, 0.5)] * 30)
    assert figure._repr_png_().startswith(b"\x89PNG")
    assert "after 30 steps" in figure.axes[1].get_title()
    with pytest.raises(ValueError):
        training_figure(real, real, real, [])
    with pytest.raises(ValueError):
        training_figure(real, real, real, [(1.0,)])
    with pytest.raises(TypeError):
        samples_figure("points")


# -- steps from settings ----------------------------------------------------------------------------

def test_all_settings_are_the_16_distinct_combinations():
    combos = StepSettings.all()
    assert len(combos) == 16 == len(set(combos))
    assert len({c.code for c in combos}) == 16 and len({c.label for c in combos}) == 16


def test_settings_code_says_what_the_switches_say():
    code = StepSettings(retain_graph=True, detach=False, fresh_pass=False, d_step_first=True).code
    assert "d_loss.backward(retain_graph=True)" in code and "netD(fake)\n" in code
    assert "g_loss_fn(fake_out)" in code
    assert code.index("optimizerD.step()") < code.index("g_loss.backward()")
    code = StepSettings(retain_graph=False, detach=True, fresh_pass=True, d_step_first=False).code
    assert "d_loss.backward()\n" in code and "netD(fake.detach())" in code and "g_loss_fn(netD(fake))" in code
    assert code.index("optimizerD.step()") > code.index("g_loss.backward()")


def test_settings_reject_non_booleans():
    with pytest.raises(TypeError):
        StepSettings(1, True, True, True)


def test_make_step_runs_exactly_its_code(gan):
    netG, netD, optimizerG, optimizerD, real, z = gan
    srgan = make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn)
    with pytest.raises(RuntimeError, match=IN_PLACE):
        srgan(netG, netD, optimizerG, optimizerD, real, z)
    standard = make_step(StepSettings(False, True, True, True), d_loss_fn, g_loss_fn)
    before = [p.detach().clone() for p in netD.parameters()]
    d_value, g_value = standard(netG, netD, optimizerG, optimizerD, real, z)
    assert isinstance(d_value, float) and isinstance(g_value, float)
    assert any(not torch.equal(a, b) for a, b in zip(before, netD.parameters()))  # a real optimizer step


def test_make_step_rejects_bad_input():
    with pytest.raises(TypeError):
        make_step("standard", d_loss_fn, g_loss_fn)
    with pytest.raises(TypeError):
        make_step(StepSettings.all()[0], d_loss_fn, None)


# -- the checker ----------------------------------------------------------------------------------

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


def test_a_step_without_optimizer_steps_is_judged_by_its_final_grads(gan, checker):
    netG, netD, _, _, real, z = gan

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
    steps = {"standard": make_step(StepSettings(False, True, True, True), d_loss_fn, g_loss_fn),
             "srgan": make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn),
             "retained": make_step(StepSettings(True, True, True, True), d_loss_fn, g_loss_fn)}
    comparison = checker.compare(steps, rounds=3, progress=False)
    assert comparison["standard"].outcome == "correct" and comparison["srgan"].outcome == "error"
    assert comparison.time_ratio("standard") == 1.0 and comparison.time_ratio("srgan") is None
    assert comparison.time_ratio("retained") > 0
    assert set(comparison.profiler_peak_bytes) == {"standard", "retained"}
    assert comparison["retained"].peak_graph_only_bytes > comparison["standard"].peak_graph_only_bytes
    table = comparison.table()
    assert table.column("outcome") == ["correct", "error (in-place modification)", "correct"]
    assert table.column("time per step")[1] == "-"
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


# -- the lab --------------------------------------------------------------------------------------

def _all_widgets(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _all_widgets(child)


def test_lab_controls_have_descriptions_tooltips_and_classes(checker):
    lab = GanLab(checker)
    controls = [lab.retain, lab.detach, lab.fresh_pass, lab.order, lab.run_button, lab.run_all_button]
    for control in controls:
        assert control.description and control.tooltip
        assert any(name.startswith("bt-") for name in control._dom_classes)
    assert len(lab.order.tooltips) == len(lab.order.options)
    for widget in _all_widgets(lab.panel):
        if isinstance(widget, (widgets.Button, widgets.Checkbox, widgets.ToggleButtons)):
            assert widget in controls
    assert "bt-gan-lab" in lab.panel._dom_classes


def test_lab_starts_at_the_srgan_step_and_shows_its_code(checker):
    lab = GanLab(checker)
    assert lab.settings == StepSettings(True, False, False, True)
    assert "retain_graph=True" in lab.code.value
    lab.retain.value = False
    assert "retain_graph=True" not in lab.code.value
    lab.order.value = "after"
    code = lab.code.value
    assert code.index("g_loss.backward()") < code.index("optimizerD.step()")


@pytest.mark.parametrize("settings", StepSettings.all(), ids=lambda s: s.label)
def test_lab_verdict_for_each_combination_driven_by_widgets(checker, settings):
    lab = GanLab(checker)
    lab.retain.value = settings.retain_graph
    lab.detach.value = settings.detach
    lab.fresh_pass.value = settings.fresh_pass
    lab.order.value = "before" if settings.d_step_first else "after"
    lab.run_button.click()
    assert lab.last_error is None
    outcome, message = expected_outcome(settings)
    result = lab.last_check
    assert result is not None and result.outcome == outcome, result.verdict
    if message:
        assert message in result.error
        assert "ERROR" in lab.outcome.value and "not computed" in lab.values["d-grad"].value
        assert lab.values["peak-bytes"].value.startswith("not measured")
    else:
        assert lab.values["peak-bytes"].value.endswith("KiB")
        assert ("SILENTLY WRONG" in lab.outcome.value) == (outcome == "silently wrong")
        verdicts = lab.values["d-grad"].value + lab.values["g-grad"].value
        assert ("WRONG" in verdicts) == (outcome == "silently wrong")
    assert settings in lab.results and settings.label in lab.message


def test_lab_run_all_fills_the_table_and_keeps_the_switches(checker):
    lab = GanLab(checker)
    lab.detach.value = True
    before = lab.settings
    lab.run_all_button.click()
    assert lab.settings == before and len(lab.results) == 16
    table = lab.summary_table()
    assert len(table.rows) == 16 and "<table" in lab.summary.value
    outcomes = table.column("outcome")
    assert outcomes.count("correct") == 3 and outcomes.count("silently wrong") == 5
    assert outcomes.count("error: backward a second time") == 6 and outcomes.count("error: in-place modification") == 2
    assert lab.message == "Tried all 16: 8 raise, 5 are silently wrong, 3 are correct."
    retained = lab.results[StepSettings(True, True, True, True)].peak_graph_only_bytes
    assert retained > lab.results[StepSettings(False, True, True, True)].peak_graph_only_bytes


def test_lab_shows_handler_errors_and_keeps_working(checker):
    lab = GanLab(checker)

    def broken(real_out, fake_out):
        raise ValueError("broken loss")

    good = checker.d_loss_fn
    checker.d_loss_fn = broken
    lab.run_button.click()
    assert lab.last_error == "ValueError: broken loss"
    assert "broken loss" in lab.status.value and lab.message.startswith("Error")
    checker.d_loss_fn = good
    lab.run_button.click()
    assert lab.last_error is None and lab.last_check.outcome == "error"


def test_lab_rejects_bad_input(checker):
    with pytest.raises(TypeError):
        GanLab("checker")
    lab = GanLab(checker)
    with pytest.raises(TypeError):
        lab.settings = "standard"
    lab.settings = StepSettings(False, True, True, False)
    assert (lab.retain.value, lab.detach.value, lab.fresh_pass.value, lab.order.value) == (False, True, True, "after")


# -- exercise checks --------------------------------------------------------------------------------

def test_check_fixed_srgan_step():
    srgan = check_fixed_srgan_step(make_step(StepSettings(True, False, False, True), d_loss_fn, g_loss_fn))
    assert not srgan and "inplace operation" in srgan.message and "in place" in srgan.hint
    assert check_fixed_srgan_step(standard_step)
    assert check_fixed_srgan_step(inputs_step)  # a single-forward fix is a fix too
    moved = check_fixed_srgan_step(make_step(StepSettings(True, False, False, False), d_loss_fn, g_loss_fn))
    assert not moved and "SILENTLY WRONG" in moved.message
    retained = check_fixed_srgan_step(make_step(StepSettings(True, True, True, True), d_loss_fn, g_loss_fn))
    assert not retained and "Right gradients" in retained.message and "retain_graph" in retained.hint
    second = check_fixed_srgan_step(make_step(StepSettings(False, False, True, True), d_loss_fn, g_loss_fn))
    assert not second and "buffers the first one freed" in second.hint
    assert not check_fixed_srgan_step("not a function")

    def twice(netG, netD, optimizerG, optimizerD, real, z):
        standard_step(netG, netD, optimizerG, optimizerD, real, z)
        optimizerD.step()

    assert "calls optimizerD.step() 2 times" in check_fixed_srgan_step(twice).message

    def typo(*args):
        raise NameError("name 'netd' is not defined")

    result = check_fixed_srgan_step(typo)
    assert not result and "NameError" in result.message


def test_check_single_forward_step():
    assert check_single_forward_step(inputs_step)
    three = check_single_forward_step(standard_step)
    assert not three and "3 times" in three.message
    moved = check_single_forward_step(make_step(StepSettings(True, False, False, False), d_loss_fn, g_loss_fn))
    assert not moved and "SILENTLY WRONG" in moved.message and "inputs=" in moved.hint


def test_check_gradient_penalty():
    def penalty(netD, real, fake, alpha, **options):
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
        (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, **options)
        return ((grad.norm(dim=1) - 1) ** 2).mean()

    assert check_gradient_penalty(lambda *a: penalty(*a, create_graph=True))
    constant = check_gradient_penalty(lambda *a: penalty(*a, retain_graph=True))
    assert not constant and "constant" in constant.message and "create_graph" in constant.hint
    wrong_value = check_gradient_penalty(lambda *a: penalty(*a, create_graph=True) * 2)
    assert not wrong_value and "expected" in wrong_value.message
    assert not check_gradient_penalty(lambda *a: 0.5)
    assert not check_gradient_penalty("penalty")

    def detached_weights(netD, real, fake, alpha):
        # the right value, computed with D's weights frozen; the only path to them adds zero
        for p in netD.parameters():
            p.requires_grad_(False)
        value = penalty(netD, real, fake, alpha, create_graph=True)
        for p in netD.parameters():
            p.requires_grad_(True)
        return value + 0 * sum(p.sum() for p in netD.parameters())

    result = check_gradient_penalty(detached_weights)
    assert not result and "differs" in result.message

    def raises(*args):
        raise RuntimeError("boom")

    assert "boom" in check_gradient_penalty(raises).message
