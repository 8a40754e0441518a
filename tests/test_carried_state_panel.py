"""CarriedLab (notebook 04's lab), driven by clicks: the errors it must show, the counters that grow or stay
flat, the two copies that keep the meter out of the time, and bad input refused with a clear message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.lessons.carried_state import CarriedLab


class TinyRNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.cell, self.out = torch.nn.Embedding(7, 4), torch.nn.RNNCell(4, 5), torch.nn.Linear(5, 7)

    def forward(self, chars, h):
        logits = []
        for c in chars:
            h = self.cell(self.embed(c), h)
            logits.append(self.out(h))
        return torch.stack(logits), h


def chunk_loss(model, h, inputs, targets):
    logits, h = model(inputs, h)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), h


@pytest.fixture()
def lab() -> CarriedLab:
    torch.manual_seed(0)
    stream = torch.randint(0, 7, (25, 2))
    batches = [(stream[i : i + 4], stream[i + 1 : i + 5]) for i in range(0, 20, 4)]
    return CarriedLab(chunk_loss, TinyRNN(), batches, hidden_size=5)


def run(lab: CarriedLab, detach: bool, retain: bool, step: bool, iterations: int) -> None:
    lab.reset_button.click()
    lab.detach.value, lab.retain.value, lab.step.value, lab.iterations.value = detach, retain, step, iterations
    lab.run_button.click()


def test_carrying_h_fails_in_iteration_2_and_the_panel_shows_it(lab) -> None:
    run(lab, detach=False, retain=False, step=True, iterations=3)
    assert lab.outcome == "iteration 2: backward a second time"
    assert "Error" in lab.status.value and "Reset" in lab.status.value
    assert len(lab.nodes) == len(lab.graph_only_bytes) == len(lab.backward_ms) == 1
    lab.run_button.click()  # clicked again without Reset: told what to do, still one iteration counted
    assert "press Reset" in lab.last_error and len(lab.backward_ms) == 1
    run(lab, detach=True, retain=False, step=True, iterations=3)
    assert lab.outcome == "ran 3 iterations" and lab.last_error is None


def test_retaining_without_a_step_walks_and_keeps_one_more_batch_per_iteration(lab) -> None:
    run(lab, detach=False, retain=True, step=False, iterations=5)
    assert lab.outcome == "ran 5 iterations"
    node_steps = {b - a for a, b in zip(lab.nodes, lab.nodes[1:])}
    byte_steps = {b - a for a, b in zip(lab.graph_only_bytes, lab.graph_only_bytes[1:])}
    assert len(node_steps) == 1 and node_steps.pop() > 0
    assert len(byte_steps) == 1 and byte_steps.pop() == lab.graph_only_bytes[0] > 0
    assert lab.values["iteration"].value == "5" and lab.values["nodes"].value == str(lab.nodes[-1])


def test_retaining_with_a_step_fails_with_the_version_error(lab) -> None:
    run(lab, detach=False, retain=True, step=True, iterations=4)
    assert lab.outcome == "iteration 2: in-place version error"


def test_detach_keeps_every_counter_flat_and_retain_on_top_keeps_one_batch(lab) -> None:
    run(lab, detach=True, retain=False, step=True, iterations=4)
    assert len(set(lab.nodes)) == 1 and lab.graph_only_bytes == [0] * 4
    run(lab, detach=True, retain=True, step=True, iterations=4)
    assert len(set(lab.nodes)) == 1 and len(set(lab.graph_only_bytes)) == 1 and lab.graph_only_bytes[0] > 0


def test_the_two_copies_train_alike_and_the_given_model_is_untouched(lab) -> None:
    given = [p.detach().clone() for p in lab._model.parameters()]
    run(lab, detach=True, retain=False, step=True, iterations=3)
    for counted, timed in zip(lab.counted.model.parameters(), lab.timed.model.parameters()):
        assert torch.equal(counted, timed)
    assert all(torch.equal(a, b) for a, b in zip(given, lab._model.parameters()))
    assert not torch.equal(given[0], next(lab.counted.model.parameters()))


def test_the_loop_shown_follows_the_toggles(lab) -> None:
    lab.detach.value, lab.retain.value, lab.step.value = True, True, False
    assert "h = h.detach()" in lab.loop.value and "retain_graph=True" in lab.loop.value
    assert "optimizer.step()" not in lab.loop.value
    lab.detach.value = False
    assert "h.detach()" not in lab.loop.value


def test_the_chart_is_a_png_of_the_run(lab) -> None:
    run(lab, detach=True, retain=False, step=True, iterations=2)
    assert lab.chart_png().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_loss": None}, "chunk_loss(model, h, inputs, targets)"),
        ({"model": "net"}, "takes a torch.nn.Module"),
        ({"batches": []}, "non-empty list of (inputs, targets)"),
        ({"hidden_size": 0}, "hidden_size=...) must be a positive whole number"),
        ({"batches": [(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))]}, "(steps, batch, ...)"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(kwargs, message) -> None:
    arguments = {
        "chunk_loss": chunk_loss,
        "model": TinyRNN(),
        "hidden_size": 5,
        "batches": [(torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 2, dtype=torch.long))],
    } | kwargs
    with pytest.raises(
        (TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        CarriedLab(**arguments)


def test_a_chunk_loss_without_a_graph_is_an_error_in_the_panel(lab) -> None:
    lab._chunk_loss = lambda model, h, inputs, targets: (torch.tensor(1.0), h)
    lab.run_button.click()
    assert "one-number tensor with a graph" in lab.last_error and "Error" in lab.status.value
