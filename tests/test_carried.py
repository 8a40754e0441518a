"""find_carried_graph: a catalogue of ways a graph is carried from one iteration into the next, each written
as a learner would, clean steps that must raise no alarm, and the tool's promises (state put back, nothing
kept alive, the step's error caught, bad input refused, the report readable)."""

from __future__ import annotations

import copy
import gc
import linecache
import os
import weakref

import pytest
import torch
from torch import nn

from backward_twice.steps.carried import CarriedGraphReport, CarriedTensor, find_carried_graph

SECOND_TIME = "backward through the graph a second time"
IN_PLACE = "modified by an inplace operation"
HERE = os.path.basename(__file__)


def the_finding(report: CarriedGraphReport, code: str) -> CarriedTensor:
    """The finding built at the learner's line ``code`` in this file (checked against the file itself)."""
    assert report.found, str(report)
    matches = [f for f in report.findings if f.created_at.endswith(f": {code}")]
    assert matches, f"no finding built at {code!r}:\n{report}"
    finding = matches[0]
    path, line, _ = finding.created_at.split(":", 2)
    assert os.path.basename(path) == HERE
    assert linecache.getline(path, int(line)).strip() == code
    return finding


# -- the catalogue of carried graphs ------------------------------------------------------------------


def test_rnn_hidden_state_not_detached() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    h = torch.zeros(1, 8)

    def step() -> None:
        nonlocal h
        x = torch.randn(1, 4)
        h = cell(x, h)
        loss = h.pow(2).sum()
        loss.backward()

    report = find_carried_graph(step, models=cell)
    finding = the_finding(report, "h = cell(x, h)")
    assert (finding.iteration, finding.shape, finding.reached_from) == (1, (1, 8), 2)
    assert "h = h.detach()" in finding.fix
    assert SECOND_TIME in report.error and report.iterations_run == 2


def test_lstm_state_tuple_carried() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 8, batch_first=True)
    state = None

    def step() -> None:
        nonlocal state
        x = torch.randn(2, 5, 4)
        out, state = lstm(x, state)
        out.sum().backward()

    report = find_carried_graph(step, models=lstm)
    assert sorted(f.name for f in report.findings) == ["state[0]", "state[1]"]  # h and c, in Python's spelling
    for finding in report.findings:
        assert finding.created_at.endswith(": out, state = lstm(x, state)")
        assert (finding.iteration, finding.shape) == (1, (1, 2, 8))
        assert "state = tuple(s.detach() for s in state)" in finding.fix
    assert SECOND_TIME in report.error


def test_gru_hidden_state_carried() -> None:
    torch.manual_seed(0)
    gru = nn.GRU(3, 5)
    head = nn.Linear(5, 1)
    hidden = torch.zeros(1, 1, 5)

    def step() -> None:
        nonlocal hidden
        out, hidden = gru(torch.randn(4, 1, 3), hidden)
        head(out).pow(2).mean().backward()

    report = find_carried_graph(step, models=(gru, head))
    finding = the_finding(report, "out, hidden = gru(torch.randn(4, 1, 3), hidden)")
    assert (finding.iteration, finding.shape) == (1, (1, 1, 5))
    assert "hidden = hidden.detach()" in finding.fix
    assert SECOND_TIME in report.error


def test_tensor_computed_before_the_loop_from_parameters() -> None:
    torch.manual_seed(0)
    encoder, head = nn.Linear(4, 8), nn.Linear(8, 1)
    x = torch.randn(3, 4)
    embedding = encoder(x)

    def step() -> None:
        loss = head(embedding).pow(2).mean()
        loss.backward()

    report = find_carried_graph(step, models=(encoder, head))
    finding = the_finding(report, "embedding = encoder(x)")
    assert (finding.iteration, finding.shape, finding.reached_from) == (
        None,
        (3, 8),
        2,
    )  # walked again in run 2, where it raises
    assert finding.used_at.endswith(": loss.backward()")  # the backward that walks it
    assert "embedding = embedding.detach()" in finding.fix and "inside the loop" in finding.fix
    assert SECOND_TIME in report.error


def test_total_loss_summed_then_backward() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    total_loss = 0.0

    def step() -> None:
        nonlocal total_loss
        loss = model(torch.randn(8, 4)).pow(2).mean()
        total_loss = total_loss + loss
        total_loss.backward()

    report = find_carried_graph(step, models=model)
    finding = the_finding(report, "total_loss = total_loss + loss")
    assert (finding.iteration, finding.shape) == (1, ())
    assert "total_loss += loss.item()" in finding.fix
    assert SECOND_TIME in report.error


class Memory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.memory = torch.zeros(1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(self.fc(x) + self.memory)
        self.memory = out
        return out


def test_state_kept_on_a_module() -> None:
    torch.manual_seed(0)
    model = Memory()

    def step() -> None:
        model(torch.randn(1, 4)).sum().backward()

    report = find_carried_graph(step, models=model)
    finding = the_finding(report, "out = torch.tanh(self.fc(x) + self.memory)")
    assert (finding.iteration, finding.shape) == (1, (1, 4))
    assert "model.memory = model.memory.detach()" in finding.fix
    assert SECOND_TIME in report.error


def test_running_average_of_features() -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 6)
    avg = torch.zeros(6)

    def step() -> None:
        nonlocal avg
        feats = net(torch.randn(5, 4)).mean(0)
        avg = 0.9 * avg + 0.1 * feats
        loss = (feats - avg).pow(2).sum()
        loss.backward()

    report = find_carried_graph(step, models=net)
    finding = the_finding(report, "avg = 0.9 * avg + 0.1 * feats")
    assert (finding.iteration, finding.shape) == (1, (6,))
    assert "avg = avg.detach()" in finding.fix
    assert SECOND_TIME in report.error


def test_list_of_outputs_reused() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    outputs = []

    def step() -> None:
        out = model(torch.randn(3, 4))
        outputs.append(out)
        torch.stack(outputs).sum().backward()

    report = find_carried_graph(step, models=model)
    finding = the_finding(report, "out = model(torch.randn(3, 4))")
    assert (finding.iteration, finding.shape) == (1, (3, 2))
    # The backward reads the whole list: clearing it is the fix (detached copies would leave it no graph at all).
    assert "`outputs.clear()`" in finding.fix and "detach" not in finding.fix
    assert SECOND_TIME in report.error

    def cleared() -> None:
        out = model(torch.randn(3, 4))
        outputs.append(out)
        torch.stack(outputs).sum().backward()
        outputs.clear()

    def detached_copies() -> None:
        out = model(torch.randn(3, 4))
        outputs.append(out.detach())
        torch.stack(outputs).sum().backward()

    outputs.clear()
    for _ in range(3):
        cleared()
    with pytest.raises(RuntimeError, match="does not require grad"):
        detached_copies()


def test_a_list_rebound_every_iteration_is_detached_item_by_item() -> None:
    """A Transformer-XL memory: the model returns a new list of layer outputs and the loop feeds it back. Clearing
    it would leave the next iteration an empty memory; detaching each item is the fix."""
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
    mems: list[torch.Tensor] | None = None

    def model(x: torch.Tensor, mems: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        new_mems = []
        for i, layer in enumerate(layers):
            x = layer(x if mems is None else x + mems[i])
            new_mems.append(x)
        return x.sum(), new_mems

    def step() -> None:
        nonlocal mems
        loss, mems = model(torch.randn(3, 4), mems)
        loss.backward()

    report = find_carried_graph(step, models=layers)
    assert report.findings and all("`mems = [m.detach() for m in mems]`" in f.fix for f in report.findings), report

    def fixed() -> None:
        nonlocal mems
        loss, mems = model(torch.randn(3, 4), mems)
        loss.backward()
        mems = [m.detach() for m in mems]

    mems = None
    for _ in range(3):
        fixed()


def test_a_list_read_by_slice_keeps_detached_copies() -> None:
    """A bank of recent features (notebook 04's): the backward reads old items by slice, and the current one
    through its own name, so detached copies in the bank are the fix."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    bank = []

    def step() -> None:
        hidden = model(torch.randn(3, 4))
        bank.append(hidden)
        recent = torch.cat(bank[-2:])
        (hidden.sum() + recent.sum()).backward()

    report = find_carried_graph(step, models=model)
    assert any("keep detached copies in `bank`" in finding.fix for finding in report.findings), report


def test_distribution_built_once_before_the_loop() -> None:
    torch.manual_seed(0)
    policy = nn.Linear(4, 3)
    obs = torch.randn(2, 4)
    dist = torch.distributions.Bernoulli(logits=policy(obs))

    def step() -> None:
        action = dist.sample()
        loss = -dist.log_prob(action).sum()
        loss.backward()

    report = find_carried_graph(step, models=policy)
    finding = the_finding(report, "dist = torch.distributions.Bernoulli(logits=policy(obs))")
    assert (finding.iteration, finding.shape) == (None, (2, 3))
    assert "build `dist` inside the loop" in finding.fix
    assert SECOND_TIME in report.error


def test_fake_batch_generated_once_before_the_loop() -> None:
    torch.manual_seed(0)
    netG, netD = nn.Linear(2, 3), nn.Linear(3, 1)
    optG = torch.optim.SGD(netG.parameters(), lr=0.1)
    fake = netG(torch.randn(4, 2))

    def step() -> None:
        optG.zero_grad()
        loss_G = -netD(fake).mean()
        loss_G.backward()
        optG.step()

    report = find_carried_graph(step, models=(netG, netD), optimizers=optG)
    finding = the_finding(report, "fake = netG(torch.randn(4, 2))")
    assert (finding.iteration, finding.shape) == (None, (4, 3))
    assert SECOND_TIME in report.error


def test_retain_graph_added_as_a_fix_still_carries() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    h = torch.zeros(1, 8)

    def step() -> None:
        nonlocal h
        h = cell(torch.randn(1, 4), h)
        h.pow(2).sum().backward(retain_graph=True)

    report = find_carried_graph(step, iterations=4, models=cell)
    assert report.error is None and report.iterations_run == 4
    finding = the_finding(report, "h = cell(torch.randn(1, 4), h)")
    assert len(report.findings) == 1  # one line, one finding: each iteration reaches the ones before
    assert (finding.iteration, finding.reached_from, finding.name) == (1, 2, "h")


def test_retain_graph_with_an_optimizer_step_raises_the_in_place_error() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    opt = torch.optim.SGD(cell.parameters(), lr=0.1)
    h = torch.zeros(1, 8)

    def step() -> None:
        nonlocal h
        opt.zero_grad()
        h = cell(torch.randn(1, 4), h)
        h.pow(2).sum().backward(retain_graph=True)
        opt.step()

    report = find_carried_graph(step, models=cell, optimizers=opt)
    finding = the_finding(report, "h = cell(torch.randn(1, 4), h)")
    assert finding.iteration == 1
    # iteration 2 walks back into h1's graph, which needs no weight (h0 needs no gradient); iteration 3
    # walks through h1 = cell(x, h1-1) into a weight the first opt.step() changed in place
    assert IN_PLACE in report.error and report.iterations_run == 3


# -- clean steps: no alarm ----------------------------------------------------------------------------


def test_clean_mlp_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        loss.item()

    report = find_carried_graph(step, iterations=4, models=model, optimizers=opt)
    assert (report.found, report.findings, report.error, report.iterations_run) == (False, (), None, 4)
    assert str(report) == "No graph carried across iterations in 4 iterations."


def test_clean_rnn_step_that_detaches_its_state() -> None:
    torch.manual_seed(0)
    cell, lstm = nn.RNNCell(4, 8), nn.LSTM(8, 8)
    opt = torch.optim.SGD([*cell.parameters(), *lstm.parameters()], lr=0.1)
    h, state = torch.zeros(1, 8), None

    def step() -> None:
        nonlocal h, state
        opt.zero_grad()
        h = cell(torch.randn(1, 4), h)
        out, state = lstm(h.unsqueeze(0), state)
        out.pow(2).sum().backward()
        opt.step()
        h = h.detach()
        state = tuple(s.detach() for s in state)

    report = find_carried_graph(step, models=(cell, lstm), optimizers=opt)
    assert not report.found and report.error is None


def test_clean_two_losses_retain_graph_on_the_first() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        out = model(torch.randn(3, 4))
        out.pow(2).mean().backward(retain_graph=True)
        out.abs().mean().backward()
        opt.step()

    report = find_carried_graph(step, models=model, optimizers=opt)
    assert not report.found and report.error is None


def test_clean_gan_step() -> None:
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    netD = nn.Sequential(nn.Linear(2, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()

    def step() -> None:
        real, noise = torch.randn(16, 2), torch.randn(16, 2)
        fake = netG(noise)
        optD.zero_grad()
        loss_D = bce(netD(real), torch.ones(16, 1)) + bce(netD(fake.detach()), torch.zeros(16, 1))
        loss_D.backward()
        optD.step()
        optG.zero_grad()
        loss_G = bce(netD(fake), torch.ones(16, 1))
        loss_G.backward()
        optG.step()

    report = find_carried_graph(step, models=(netG, netD), optimizers=(optG, optD))
    assert not report.found and report.error is None


def test_clean_steps_with_in_place_ops_no_grad_and_a_fresh_distribution() -> None:
    torch.manual_seed(0)
    policy = nn.Linear(4, 3)
    gru = nn.GRU(3, 3)
    opt = torch.optim.SGD([*policy.parameters(), *gru.parameters()], lr=0.1)
    baseline = torch.zeros(())

    def step() -> None:
        nonlocal baseline
        opt.zero_grad()
        logits = policy(torch.randn(2, 4))
        logits = logits * 1.0
        logits.mul_(0.5)
        out, _ = gru(logits.unsqueeze(0))
        dist = torch.distributions.Bernoulli(logits=out.squeeze(0))
        action = dist.sample()
        with torch.no_grad():
            reward = action.sum()
            baseline = 0.9 * baseline + 0.1 * reward
        loss = -(dist.log_prob(action).sum() * (reward - baseline))
        loss.backward()
        opt.step()
        loss.item()

    report = find_carried_graph(step, models=(policy, gru), optimizers=opt)
    assert not report.found and report.error is None


# -- promises -----------------------------------------------------------------------------------------


def test_parameters_grads_and_optimizer_state_are_put_back() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    opt_state = copy.deepcopy(opt.state_dict())
    rng = torch.get_rng_state()

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()

    find_carried_graph(step, models=[model], optimizers=[opt])
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    after = opt.state_dict()
    assert after["param_groups"] == opt_state["param_groups"]
    for key, value in opt_state["state"].items():
        assert torch.equal(value["momentum_buffer"], after["state"][key]["momentum_buffer"])
    assert torch.equal(rng, torch.get_rng_state())


def test_nothing_from_the_step_is_kept_alive() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    h = torch.zeros(1, 8)
    losses: list = []
    remember = losses.append  # the step holds a function, not the list: the tool leaves the list alone

    def step() -> None:
        nonlocal h
        h = cell(torch.randn(1, 4), h)
        loss = h.pow(2).sum()
        remember(weakref.ref(loss))
        loss.backward()

    report = find_carried_graph(step, models=cell)
    assert report.found and len(losses) == 2
    gc.collect()
    assert [ref() for ref in losses] == [None, None]
    h = None
    del step
    gc.collect()


def test_the_steps_exception_is_reported_not_raised() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("boom on the second call")

    report = find_carried_graph(step, iterations=5)
    assert report.error == "ValueError: boom on the second call"
    assert report.iterations_run == 2 and not report.found
    assert "Iteration 2 raised: ValueError: boom on the second call" in str(report)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"step": 3}, TypeError, "find_carried_graph takes a step: a function of no arguments"),
        ({"step": lambda x: x}, TypeError, r"find_carried_graph takes a step with no arguments; yours needs \(x\)"),
        (
            {"step": print, "models": [object()]},
            TypeError,
            "models must be a torch.nn.Module or a list of them; got object",
        ),
        (
            {"step": print, "models": {"m": object()}},
            TypeError,
            "models must be a torch.nn.Module or a list of them; got object",
        ),
        (
            {"step": print, "optimizers": nn.Linear(1, 1)},
            TypeError,
            "optimizers must be a torch.optim.Optimizer or a list of them; got Linear",
        ),
        ({"step": print, "iterations": 1}, ValueError, "iterations must be an int >= 2"),
        ({"step": print, "iterations": 2.0}, ValueError, "iterations must be an int >= 2"),
    ],
)
def test_bad_input_is_refused_clearly(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        find_carried_graph(**kwargs)


def test_text_and_html_show_the_verdict_the_line_and_the_fix() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    total_loss = 0.0

    def step() -> None:
        nonlocal total_loss
        total_loss = total_loss + model(torch.randn(2, 4)).sum()
        total_loss.backward()

    report = find_carried_graph(step, models=model)
    text, page = str(report), report._repr_html_()
    assert repr(report) == text
    assert text.startswith("Graph carried across iterations: 1 tensor(s) in 2 iterations.")
    code = "total_loss = total_loss + model(torch.randn(2, 4)).sum()"
    for shown in (text, page):
        assert "Graph carried across iterations" in shown and code in shown and HERE in shown
        assert "built in iteration 1" in shown and "total_loss += loss.item()" in shown
    assert find_carried_graph(lambda: None)._repr_html_() == (
        "<div><b>No graph carried across iterations in 3 iterations.</b></div>"
    )


def test_each_finding_names_what_held_it_preferring_the_steps_own_names() -> None:
    class Remembers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.memory = nn.Linear(3, 3), torch.zeros(1, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.memory = torch.tanh(self.layer(x) + self.memory)
            return self.memory

    remembers = Remembers()

    def step() -> None:
        remembers(torch.ones(1, 3)).sum().backward()

    report = find_carried_graph(step, models=remembers)
    assert [f.name for f in report.findings] == ["remembers.memory"]
    assert "remembers.memory = remembers.memory.detach()" in report.findings[0].fix
    assert remembers.memory.grad_fn is None, "the module's attribute was put back"


def test_stamp_iteration_marks_the_nodes_each_iteration_builds_down_to_its_inputs() -> None:
    from backward_twice.instruments.graph import ITERATION_KEY, draw_graph
    from backward_twice.steps.carried import stamp_iteration

    cell = nn.RNNCell(3, 4)
    x = torch.ones(2, 3, requires_grad=True) * 2  # built before the loop: stays unstamped
    h = torch.zeros(2, 4)
    for k in (1, 2):
        with stamp_iteration(k):
            h = cell(x, h)
            h.add_(1)  # an in-place op's new node belongs to this iteration too
    assert h.grad_fn.metadata[ITERATION_KEY] == 2
    assert ITERATION_KEY not in x.grad_fn.metadata
    counts = draw_graph(h, params=cell, by_iteration=True).iteration_counts
    assert set(counts) == {1, 2, None} and counts[1] == counts[2] and counts[None] == 1
    with pytest.raises(ValueError, match="whole number from 1 up"):
        stamp_iteration(0)


def test_models_can_be_given_by_name_as_the_other_tools_take_them() -> None:
    torch.manual_seed(0)
    gru = nn.GRUCell(2, 3)
    memory = torch.zeros(2, 3)

    def step() -> None:
        nonlocal memory
        memory = gru(torch.ones(2, 2), memory)
        memory.sum().backward()

    report = find_carried_graph(step, models={"gru": gru})
    assert [f.name for f in report.findings] == ["memory"]
    assert memory.grad_fn is None and gru.weight_ih.grad is None  # put back


def test_a_tensor_kept_only_for_logging_is_no_finding() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logged = {}

    def step() -> None:
        out = model(torch.randn(3, 4))
        logged["last"] = out  # kept to print, never backwarded again
        optimizer.zero_grad()
        out.pow(2).mean().backward()
        optimizer.step()

    report = find_carried_graph(step, models=model, optimizers=optimizer)
    assert not report.found and report.error is None and report.iterations_run == 3


def test_an_error_the_step_catches_is_named_at_the_run_that_first_raised_it() -> None:
    """A step that skips a batch whose backward raises (``try: ... except RuntimeError``) around a hidden state never
    detached: the report read "in 3 iterations. Iteration 3 raised", the last run, where run 2 raised first and the
    step went on. The truth: bare Python's step raises (and catches) at its second call and at every call after."""
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    h = torch.zeros(1, 8)
    skipped = []

    def step() -> None:
        nonlocal h
        h = cell(torch.randn(1, 4), h)
        try:
            h.pow(2).sum().backward()
        except RuntimeError:
            skipped.append(len(skipped))

    report = find_carried_graph(step, models=cell)
    assert report.iterations_run == 3 and SECOND_TIME in (report.error or ""), str(report)
    assert "Iteration 2 raised" in report.verdict() and "caught" in report.verdict(), report.verdict()
    skipped.clear()
    h = torch.zeros(1, 8)
    for _ in range(3):
        step()
    assert len(skipped) == 2  # runs 2 and 3, as bare Python runs them
