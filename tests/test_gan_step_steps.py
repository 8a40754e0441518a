"""helpers/lessons/gan_step/steps.py: the 16 steps built from four switches, and the code they run."""

from __future__ import annotations

import pytest
import torch
from gan_steps import IN_PLACE, d_loss_fn, g_loss_fn

from helpers.lessons.gan_step.steps import StepSettings, make_step

pytestmark = pytest.mark.usefixtures("one_thread")


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
