"""The claims notebook 03_gan_step states, asserted on its own model shapes, so a change in torch or
in the helpers that breaks a claim fails `make test` even before anyone re-reads the notebook.

Gradients are judged here with stub optimizers that only record ``.grad`` at ``step()``, which is
independent of the checker's learning-rate-0 approach; the checker must agree with them."""

from __future__ import annotations

import pytest
import torch
from gan_steps import (
    IN_PLACE,
    SECOND_TIME,
    d_loss_fn,
    g_loss_fn,
    inputs_step,
    make_gan,
    moved_step,
    single_forward_step,
    srgan_step,
    standard_step,
)

import helpers as bt
from helpers.lessons.gan_step.steps import StepSettings

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """A stand-in optimizer: ``step()`` records the module's gradients and changes nothing."""

    def __init__(self, module):
        self.module = module
        self.grads = None

    def step(self):
        self.grads = [None if p.grad is None else p.grad.clone() for p in self.module.parameters()]


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(1)
    return bt.ring_of_gaussians(128, generator=generator), torch.randn(128, 2, generator=generator)


def recorded_grads(step, real, z):
    netG, netD, _, _ = make_gan()
    optG, optD = Recorder(netG), Recorder(netD)
    step(netG, netD, optG, optD, real, z)
    return optD.grads, optG.grads


def reference_grads(real, z):
    netG, netD, _, _ = make_gan()
    fake = netG(z)
    d_grads = torch.autograd.grad(d_loss_fn(netD(real), netD(fake.detach())), list(netD.parameters()))
    g_grads = torch.autograd.grad(g_loss_fn(netD(fake)), list(netG.parameters()))
    return list(d_grads), list(g_grads)


def close(grads, reference):
    return all(g is not None and torch.allclose(g, r, rtol=1e-5, atol=1e-7) for g, r in zip(grads, reference))


def relative_error(grads, reference):
    diff = sum(float((g - r).pow(2).sum()) for g, r in zip(grads, reference)) ** 0.5
    return diff / sum(float(r.pow(2).sum()) for r in reference) ** 0.5


def test_the_copied_srgan_step_raises_the_in_place_error(batch):
    netG, netD, optimizerG, optimizerD = make_gan()
    message = IN_PLACE + r".*\[torch.FloatTensor \[64, 1\]\].*version 2; expected version 1"
    with pytest.raises(RuntimeError, match=message):
        srgan_step(netG, netD, optimizerG, optimizerD, *batch)


def test_the_optimizer_step_bumps_the_version_and_backward_does_not(batch):
    real, z = batch
    netG, netD, _optimizerG, optimizerD = make_gan()
    weight = netD[4].weight
    fake_out = netD(netG(z))
    saved = fake_out.grad_fn._saved_mat2
    assert saved.shape == (64, 1) and saved.data_ptr() == weight.data_ptr()
    assert weight._version == 1  # nn.Linear's in-place initialisation
    d_loss_fn(netD(real), fake_out).backward(retain_graph=True)
    assert weight._version == 1
    optimizerD.step()
    assert weight._version == 2
    with pytest.raises(RuntimeError, match=IN_PLACE):
        _ = fake_out.grad_fn._saved_mat2


def test_plain_saved_tensor_hooks_switch_the_in_place_check_off(batch):
    netG, netD, optimizerG, optimizerD = make_gan()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t):
        srgan_step(netG, netD, optimizerG, optimizerD, *batch)  # no error: nothing checks versions


def test_the_meter_repeats_the_in_place_check(batch):
    netG, netD, optimizerG, optimizerD = make_gan()
    with bt.SavedTensorMeter(), pytest.raises(RuntimeError, match=IN_PLACE):
        srgan_step(netG, netD, optimizerG, optimizerD, *batch)


def test_the_moved_step_runs_and_gives_d_the_gradient_of_both_losses(batch):
    real, z = batch
    netG, netD, optimizerG, optimizerD = make_gan()
    moved_step(netG, netD, optimizerG, optimizerD, real, z)  # a real Adam step: no error
    d_grads, g_grads = recorded_grads(moved_step, real, z)
    d_ref, g_ref = reference_grads(real, z)
    assert not close(d_grads, d_ref) and relative_error(d_grads, d_ref) > 1.0
    assert close(g_grads, g_ref)
    netG, netD, _, _ = make_gan()
    fake_out = netD(netG(z))
    both = torch.autograd.grad(d_loss_fn(netD(real), fake_out) + g_loss_fn(fake_out), list(netD.parameters()))
    assert close(d_grads, both)


@pytest.mark.parametrize("step", [standard_step, single_forward_step, inputs_step], ids=lambda s: s.__name__)
def test_the_correct_steps_match_the_reference(batch, step):
    d_grads, g_grads = recorded_grads(step, *batch)
    d_ref, g_ref = reference_grads(*batch)
    assert close(d_grads, d_ref) and close(g_grads, g_ref)


def test_the_checker_agrees_and_the_correct_steps_cost_the_same_graph_bytes(batch):
    checker = bt.GanStepChecker(*make_gan(), *batch, d_loss_fn, g_loss_fn)
    comparison = checker.compare(
        {
            "standard": standard_step,
            "single forward": single_forward_step,
            "copied SRGAN": srgan_step,
            "D step moved": moved_step,
        },
        reference="standard",
        rounds=2,
        progress=False,
    )
    assert comparison["copied SRGAN"].error_kind == "in-place modification"
    assert comparison["D step moved"].outcome == "silently wrong"
    assert not comparison["D step moved"].networks["D"].matches and comparison["D step moved"].networks["G"].matches
    assert comparison["standard"].outcome == comparison["single forward"].outcome == "correct"
    assert comparison["standard"].peak_graph_only_bytes == comparison["single forward"].peak_graph_only_bytes
    assert (comparison["single forward"].d_forward_calls, comparison["standard"].d_forward_calls) == (2, 3)


def test_the_sixteen_combinations(batch):
    lab = bt.GanLab(bt.GanStepChecker(*make_gan(), *batch, d_loss_fn, g_loss_fn))
    lab.run_all_button.click()
    assert lab.message == "Tried all 16: 8 raise, 5 are silently wrong, 3 are correct."
    correct = {s for s, r in lab.results.items() if r.outcome == "correct"}
    assert correct == {
        s for s in StepSettings.all() if s.d_step_first and s.fresh_pass and (s.detach or s.retain_graph)
    }
    standard = lab.results[StepSettings(False, True, True, True)].peak_graph_only_bytes
    assert lab.results[StepSettings(True, False, True, True)].peak_graph_only_bytes > standard


def test_training_with_the_correct_step_learns_the_ring():
    netG, netD, optimizerG, optimizerD = make_gan()
    batches = torch.Generator().manual_seed(100)
    evaluation = torch.Generator().manual_seed(3)
    eval_real, eval_z = bt.ring_of_gaussians(500, generator=evaluation), torch.randn(500, 2, generator=evaluation)
    with torch.no_grad():
        before = bt.sample_distance(netG(eval_z), eval_real)
    for _ in range(200):
        standard_step(
            netG,
            netD,
            optimizerG,
            optimizerD,
            bt.ring_of_gaussians(256, generator=batches),
            torch.randn(256, 2, generator=batches),
        )
    with torch.no_grad():
        samples = netG(eval_z)
    assert bt.sample_distance(samples, eval_real) < before / 3
    assert bt.ring_coverage(samples).modes_covered >= 6


def test_a_gradient_penalty_needs_create_graph(batch):
    real, z = batch
    netG, netD, _, _ = make_gan()
    fake = netG(z).detach()
    alpha = torch.rand(len(real), 1, generator=torch.Generator().manual_seed(2))

    def penalty(**options):
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
        (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, **options)
        return ((grad.norm(dim=1) - 1) ** 2).mean()

    assert not penalty().requires_grad and not penalty(retain_graph=True).requires_grad
    with_graph = penalty(create_graph=True)
    assert with_graph.grad_fn is not None and torch.equal(with_graph.detach(), penalty())

    patterns = {
        "none": lambda: d_loss_fn(netD(real), netD(fake)).backward(),
        "retain": lambda: (d_loss_fn(netD(real), netD(fake)) + 10 * penalty(retain_graph=True)).backward(),
        "create": lambda: (d_loss_fn(netD(real), netD(fake)) + 10 * penalty(create_graph=True)).backward(),
    }
    result = bt.compare_patterns(patterns, netD, reference="none", rounds=2, progress=False)
    assert result["retain"].bit_equal and not result["create"].close
    assert result["create"].peak_graph_only_bytes > result["none"].peak_graph_only_bytes


def test_create_graph_implies_retain_graph(batch):
    real, _ = batch
    _, netD, _, _ = make_gan()
    mixed = real.clone().requires_grad_()
    out = netD(mixed).sum()
    torch.autograd.grad(out, mixed, create_graph=True)
    torch.autograd.grad(out, mixed)  # the graph was kept
    out = netD(mixed).sum()
    torch.autograd.grad(out, mixed)
    with pytest.raises(RuntimeError, match=SECOND_TIME):
        torch.autograd.grad(out, mixed)
