"""helpers/lessons/gan_step/panel.py: the GAN lab, driven through its widgets, against outcomes reasoned
out here from each step's code."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
from gan_steps import IN_PLACE, SECOND_TIME

from helpers.lessons.gan_step.panel import GanLab
from helpers.lessons.gan_step.steps import StepSettings

pytestmark = pytest.mark.usefixtures("one_thread")


def expected_outcome(settings: StepSettings) -> tuple[str, str | None]:
    """What each combination must do, reasoned out from the code, not from the module."""
    if not settings.retain_graph and (not settings.detach or not settings.fresh_pass):
        return "error", SECOND_TIME  # the second backward needs buffers the first one freed
    if settings.retain_graph and not settings.fresh_pass and settings.d_step_first:
        return "error", IN_PLACE  # g_loss goes through D's old graph after D's in-place step
    if not settings.d_step_first:
        return "silently wrong", None  # g_loss.backward() adds into D's .grad before D's step
    return "correct", None


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
