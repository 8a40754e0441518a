"""BackwardLab, driven only through its widgets, checked against independent computations."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
import torch

from helpers.lab import BackwardLab

SECOND_TIME = "backward through the graph a second time"


def _bytes(label: widgets.Label) -> int:
    """'12,345 B (12.1 KiB)' -> 12345."""
    return int(label.value.split(" B", 1)[0].replace(",", ""))


@pytest.fixture
def single(make_mlp, saved_storages):
    """A one-loss lab on a small MLP, its forward function, and the bytes one graph holds alone."""
    model = make_mlp()
    inputs, targets = torch.randn(32, 8), torch.randn(32, 1)

    def forward():
        return torch.nn.functional.mse_loss(model(inputs), targets)

    truth = saved_storages(forward())  # the loss is dropped at once: every graph-only storage dies
    one_graph = truth.dead_bytes()
    assert one_graph > 0
    lab = BackwardLab(forward, model=model, watch="2.weight", iterations=3)
    return lab, forward, one_graph


@pytest.fixture
def multi(make_mlp):
    """A two-loss lab whose losses share a hidden layer (and its saved buffers)."""
    model = make_mlp()
    inputs = torch.randn(16, 8)

    def forward():
        hidden = torch.tanh(model[0](inputs))
        return {"recon": hidden.pow(2).mean(), "reg": hidden.exp().mean()}

    return BackwardLab(forward, model=model)


def _all_widgets(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _all_widgets(child)


def test_backward_before_forward_shows_an_error_and_the_panel_still_works(single):
    lab, _, _ = single
    lab.backward_buttons["loss"].click()
    assert lab.last_error is not None and "Forward" in lab.last_error
    assert "Error" in lab.status.value and "Forward" in lab.status.value
    assert lab.backward_calls == 0
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    assert lab.last_error is None
    assert lab.backward_calls == 1
    assert "Error" not in lab.status.value


def test_second_backward_without_retain_fails_in_the_panel(single):
    lab, _, _ = single
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    assert lab.last_error is None
    lab.backward_buttons["loss"].click()
    assert SECOND_TIME in lab.status.value
    assert SECOND_TIME in lab.last_error
    assert lab.backward_calls == 1
    assert lab.values["backward-calls"].value == "1"


def test_retain_on_backward_twice_doubles_the_gradient(single):
    lab, forward, _ = single
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    lab.backward_buttons["loss"].click()  # fails: retain is off
    lab.reset_button.click()
    assert lab.last_error is None and lab.backward_calls == 0
    watched = dict(lab.model.named_parameters())["2.weight"]
    assert watched.grad is None

    (reference,) = torch.autograd.grad(forward(), watched)
    lab.retain["loss"].value = True
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    lab.backward_buttons["loss"].click()
    assert lab.last_error is None
    assert lab.backward_calls == 2
    assert torch.allclose(watched.grad, 2 * reference, rtol=1e-5, atol=1e-7), (watched.grad, 2 * reference)
    assert "2.00× the first backward" in lab.values["grad"].value


def test_value_labels_agree_with_the_meter(single):
    lab, _, one_graph = single
    lab.retain["loss"].value = True
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    reading = lab.meter.reading()
    assert reading.graph_only_bytes == one_graph
    assert _bytes(lab.values["graph-only-bytes"]) == reading.graph_only_bytes
    assert _bytes(lab.values["saved-bytes"]) == reading.saved_bytes
    assert _bytes(lab.values["peak-bytes"]) == reading.peak_graph_only_bytes
    assert int(lab.values["saved-tensors"].value) == reading.saved_tensors
    assert lab.values["backward-calls"].value == str(lab.backward_calls) == "1"
    lab.retain["loss"].value = False
    lab.backward_buttons["loss"].click()
    assert lab.meter.graph_only_bytes == 0
    assert _bytes(lab.values["graph-only-bytes"]) == 0
    assert _bytes(lab.values["peak-bytes"]) == lab.meter.peak_graph_only_bytes >= one_graph
    lab.zero_grad_button.click()
    assert lab.values["grad"].value.startswith("None")


def test_history_with_retain_grows_linearly(single):
    lab, _, one_graph = single
    lab.retain["loss"].value = True
    lab.keep_history.value = True
    lab.iterations.value = 3
    seen = []
    for run in range(1, 4):
        lab.run_button.click()
        assert lab.last_error is None
        seen.append(lab.meter.graph_only_bytes)
        assert seen[-1] == run * 3 * one_graph
        assert _bytes(lab.values["graph-only-bytes"]) == seen[-1]
        assert lab.values["history"].value == str(run * 3)
    assert seen == sorted(set(seen))
    assert lab.progress.value == lab.progress.max == 3


def test_without_history_retained_graphs_do_not_pile_up(single):
    lab, _, one_graph = single
    lab.retain["loss"].value = True
    lab.iterations.value = 4
    lab.run_button.click()
    first = lab.meter.graph_only_bytes
    lab.run_button.click()
    assert lab.last_error is None
    assert lab.meter.graph_only_bytes == first == one_graph  # only the latest graph is reachable
    assert lab.values["history"].value == "0"


def test_history_without_retain_keeps_no_buffers(single):
    lab, _, _ = single
    lab.keep_history.value = True
    lab.iterations.value = 3
    lab.run_button.click()
    assert lab.last_error is None
    assert lab.meter.graph_only_bytes == 0
    assert lab.values["history"].value == "3"


def test_multi_loss_needs_retain_on_the_first_backward_only(multi):
    lab = multi
    assert lab.loss_names == ["recon", "reg"]
    lab.retain["recon"].value = True
    lab.forward_button.click()
    lab.backward_buttons["recon"].click()
    lab.backward_buttons["reg"].click()
    assert lab.last_error is None
    assert lab.backward_calls == 2
    # reg's backward freed the shared buffers; recon's own retained node still holds its input
    assert 0 < lab.meter.graph_only_bytes < lab.meter.peak_graph_only_bytes
    lab.reset_button.click()
    assert lab.meter.graph_only_bytes == 0

    lab.retain["recon"].value = False
    lab.forward_button.click()
    lab.backward_buttons["recon"].click()
    assert lab.last_error is None
    lab.backward_buttons["reg"].click()
    assert SECOND_TIME in lab.last_error
    assert lab.backward_calls == 1  # counted since the reset; the failed one does not count


def test_multi_loss_run_with_retain_on_neither_stops_with_the_iteration(multi):
    lab = multi
    lab.iterations.value = 2
    lab.run_button.click()
    assert "stopped at iteration 1 of 2" in lab.last_error and SECOND_TIME in lab.last_error
    lab.retain["recon"].value = True
    lab.run_button.click()
    assert lab.last_error is None


def test_bad_inputs(make_mlp):
    model = make_mlp()
    inputs = torch.randn(4, 8)
    with pytest.raises(TypeError):
        BackwardLab("not callable", model=model)
    with pytest.raises(TypeError):
        BackwardLab(lambda: model(inputs).sum(), model="not a module")
    with pytest.raises(ValueError, match="single number"):
        BackwardLab(lambda: model(inputs), model=model)
    with pytest.raises(ValueError, match="no autograd graph"):
        BackwardLab(lambda: inputs.sum(), model=model)
    with pytest.raises(TypeError):
        BackwardLab(lambda: 1.0, model=model)
    with pytest.raises(ValueError, match="no such parameter"):
        BackwardLab(lambda: model(inputs).sum(), model=model, watch="nope.weight")
    with pytest.raises(ValueError, match="no parameters"):
        BackwardLab(lambda: inputs.sum(), model=torch.nn.ReLU())
    lab = BackwardLab(lambda: model(inputs).sum(), model=model)
    with pytest.raises(ValueError, match="nope"):
        lab.backward("nope")
    with pytest.raises(ValueError):
        lab.run(0)


def test_forward_that_changes_its_losses_is_reported(make_mlp):
    model = make_mlp()
    inputs = torch.randn(4, 8)
    calls = []

    def forward():
        calls.append(1)
        out = model(inputs).sum()
        return {"a": out} if len(calls) == 1 else {"b": out}

    lab = BackwardLab(forward, model=model)
    lab.forward_button.click()
    assert lab.last_error is not None and "expected ['a']" in lab.last_error


def test_every_control_is_described_and_has_a_css_class(multi):
    controls = [w for w in _all_widgets(multi.panel) if isinstance(w, (widgets.Button, widgets.Checkbox))]
    # Forward, zero_grad, reset, run, and one backward button + checkbox per loss, plus keep_history
    assert len(controls) == 4 + 2 * len(multi.loss_names) + 1
    for control in controls:
        assert control.description.strip(), control
        assert control.tooltip and control.tooltip.strip(), control.description
        assert any(css.startswith("bt-") for css in control._dom_classes), control.description
    assert any(css.startswith("bt-") for css in multi.panel._dom_classes)


def test_chart_png_and_display(single, capsys):
    lab, _, _ = single
    lab.forward_button.click()
    png = lab.chart_png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    image = lab._chart_image()
    assert image.data == png and image.metadata == {
        "alt": "Chart. Bytes only the graph keeps alive, after each action: "
        "graph-only KiB against action (S start, F forward)."
    }
    lab._ipython_display_()  # outside a kernel this prints reprs; it must not raise
    lab.backward_buttons["loss"].click()  # updates the displayed chart
    assert lab.last_error is None
    capsys.readouterr()


def test_a_failed_backward_adds_a_chart_point_matching_the_counter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(16, 4)

    def forward():
        out = model(x)
        return {"first": out[:, 0].pow(2).mean(), "second": out[:, 1].exp().mean()}

    lab = BackwardLab(forward, model=model)
    lab.forward_button.click()
    lab.backward_buttons["first"].click()
    before = len(lab.actions)
    lab.backward_buttons["second"].click()
    assert lab.last_error and "second time" in lab.last_error
    assert len(lab.actions) == before + 1 and lab.actions[-1] == ("error", lab.meter.graph_only_bytes)


def _tick_labels(lab):
    axes = lab.chart_figure().axes[0]
    return [int(tick) for tick in axes.get_xticks()], [label.get_text() for label in axes.get_xticklabels()]


def test_each_chart_point_is_labelled_with_its_action(single, multi):
    lab, _, _ = single
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    lab.backward_buttons["loss"].click()  # fails: retain is off
    lab.zero_grad_button.click()
    lab.reset_button.click()
    assert _tick_labels(lab) == ([0], ["R"])  # Reset starts the chart again
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    assert _tick_labels(lab) == ([0, 1, 2], ["R", "F", "B"])
    assert lab.chart_figure().axes[0].get_xlabel() == "action (F forward, B backward, R reset)"

    multi.forward_button.click()
    multi.backward_buttons["recon"].click()
    multi.backward_buttons["reg"].click()  # fails: recon freed the shared hidden layer's buffers
    multi.zero_grad_button.click()
    assert _tick_labels(multi)[1] == ["S", "F", "B1", "E", "Z"]
    assert multi.chart_figure().axes[0].get_xlabel() == (
        "action (S start, F forward, B1 recon.backward(), E error, Z zero_grad)"
    )


def test_a_long_chart_labels_every_few_points_never_the_same_step_of_each_iteration(single):
    lab, _, _ = single
    lab.iterations.value = 40  # 81 points: a forward and a backward each iteration
    lab.run_button.click()
    ticks, labels = _tick_labels(lab)
    assert ticks == list(range(0, 81, 3))
    assert labels == ["S"] + ["F" if i % 2 else "B" for i in ticks[1:]]  # F, B, F, ...: not all forwards
    assert "one point in 3 labelled" in lab.chart_figure().axes[0].get_xlabel()


def test_reset_restores_the_panels_defaults(single):
    lab, _, _ = single
    lab.retain["loss"].value = True
    lab.keep_history.value = True
    lab.iterations.value = 7
    lab.run_button.click()
    assert lab.meter.graph_only_bytes > 0
    lab.reset_button.click()
    assert (lab.retain["loss"].value, lab.keep_history.value, lab.iterations.value) == (False, False, 3)
    assert lab.meter.graph_only_bytes == 0 and lab.losses_kept == 0
    assert "every box unticked" in lab.status.value
    # So the notebook's first step works right after Reset: a plain backward twice fails.
    lab.forward_button.click()
    lab.backward_buttons["loss"].click()
    lab.backward_buttons["loss"].click()
    assert SECOND_TIME in lab.last_error


TOO_LATE = "the flag acts on the backward that frees the buffers: here the earlier {}.backward()"


def test_retain_ticked_after_the_freeing_backward_says_the_flag_acts_on_that_one(single):
    lab, _, _ = single
    lab.forward_button.click()
    lab.retain["loss"].value = True  # before any backward: nothing to say
    assert "flag acts" not in lab.status.value
    lab.retain["loss"].value = False
    lab.backward_buttons["loss"].click()
    lab.retain["loss"].value = True
    assert TOO_LATE.format("loss") in lab.status.value and "Error" not in lab.status.value
    lab.backward_buttons["loss"].click()  # still fails: the buffers are gone
    assert SECOND_TIME in lab.last_error and TOO_LATE.format("loss") in lab.last_error
    lab.forward_button.click()  # a new graph, the box ticked before its backward: both work
    lab.backward_buttons["loss"].click()
    lab.backward_buttons["loss"].click()
    assert lab.last_error is None and "flag acts" not in lab.status.value


def test_with_two_losses_the_freeing_backward_is_the_other_loss(multi):
    multi.retain["reg"].value = True
    multi.forward_button.click()
    multi.backward_buttons["recon"].click()  # frees the hidden layer both losses share
    multi.backward_buttons["reg"].click()
    assert SECOND_TIME in multi.last_error and TOO_LATE.format("recon") in multi.last_error
    multi.reset_button.click()
    multi.forward_button.click()
    multi.backward_buttons["recon"].click()
    multi.backward_buttons["reg"].click()  # retain_graph off on both: the plain error, nothing added
    assert SECOND_TIME in multi.last_error and "flag acts" not in multi.last_error
