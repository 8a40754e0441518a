"""helpers/lessons/gan_step/checks.py and penalty_check.py: the exercise checks, on right and wrong
answers written here."""

from __future__ import annotations

import pytest
import torch
from gan_steps import d_loss_fn, g_loss_fn, inputs_step, standard_step

from helpers.lessons.gan_step.checks import check_fixed_srgan_step, check_single_forward_step
from helpers.lessons.gan_step.penalty_check import check_gradient_penalty
from helpers.lessons.gan_step.steps import StepSettings, make_step

pytestmark = pytest.mark.usefixtures("one_thread")


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
