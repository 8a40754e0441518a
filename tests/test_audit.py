"""audit_retain_graph: a gallery of training steps written as learners write them, each with the true verdict
for every backward call, and the tool's promises (state put back, nothing kept alive, torch's functions put
back, aliases recorded, bad input refused, the report readable)."""

from __future__ import annotations

import contextlib
import copy
import gc
import linecache
import os
import random
import re
import sys
import types
import weakref

import pytest
import torch
from gan_steps import inputs_step, single_forward_step, small_mlp, srgan_step, standard_step
from torch import nn
from torch.autograd import grad as autograd_grad

from backward_twice.steps.audit import CREATE_GRAPH_NOTE, BackwardCall, RetainAudit, audit_retain_graph

SECOND_TIME = "backward through the graph a second time"
IN_PLACE = "modified by an inplace operation"
HERE = os.path.basename(__file__)


def the_call(audit: RetainAudit, code: str, file: str = HERE) -> BackwardCall:
    """The call made at the line ``code`` of ``file`` (checked against the file itself)."""
    matches = [c for c in audit.calls if c.line.endswith(f": {code}")]
    assert len(matches) == 1, f"no single call at {code!r}:\n{audit}"
    path, line, _ = matches[0].line.split(":", 2)
    assert os.path.basename(path) == file
    assert linecache.getline(path, int(line)).strip() == code
    return matches[0]


def verdicts(audit: RetainAudit) -> list[bool | None]:
    return [c.needed for c in audit.calls]


@pytest.fixture
def two_heads():
    """A shared trunk, two heads, one optimizer and a batch."""
    torch.manual_seed(0)
    trunk, head1, head2 = nn.Sequential(nn.Linear(4, 16), nn.ReLU()), nn.Linear(16, 1), nn.Linear(16, 1)
    optimizer = torch.optim.SGD([*trunk.parameters(), *head1.parameters(), *head2.parameters()], lr=0.1)
    return trunk, head1, head2, optimizer, torch.randn(8, 4)


@pytest.fixture
def gan():
    torch.manual_seed(0)
    netG, netD = small_mlp(2, 2), small_mlp(2, 1)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-2)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-2)
    return netG, netD, optimizerG, optimizerD, torch.randn(32, 2), torch.randn(32, 2)


# -- the gallery -------------------------------------------------------------------------------------------


def test_two_losses_on_one_trunk_the_first_retain_is_needed(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1 = head1(features).pow(2).mean()
        l2 = head2(features).abs().mean()
        l1.backward(retain_graph=True)
        l2.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [True, None]
    first = the_call(audit, "l1.backward(retain_graph=True)")
    assert (first.function, first.retain_graph, first.create_graph, first.index) == ("loss.backward", True, False, 0)
    assert SECOND_TIME in first.why and "l2.backward()" in first.why
    assert first.fix.startswith("keep it: a later backward needs these buffers")
    second = the_call(audit, "l2.backward()")
    assert (second.retain_graph, second.verdict) == (False, "not a retain")
    # l2's backward frees what it walked: nothing of its graph is held after it; l1's retain kept the trunk's.
    assert second.held_after_bytes == 0 < first.held_after_bytes


def test_retain_on_both_losses_only_the_first_is_needed(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1 = head1(features).pow(2).mean()
        l2 = head2(features).abs().mean()
        l1.backward(retain_graph=True)
        l2.backward(retain_graph=True)
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert verdicts(audit) == [True, False]
    first, second = the_call(audit, "l1.backward(retain_graph=True)"), the_call(audit, "l2.backward(retain_graph=True)")
    assert first.held_after_bytes > 0 and second.held_after_bytes > 0
    assert second.why.startswith("can go: in 2 runs no later backward walks the buffers it kept")
    assert second.why.endswith(f"it only kept {second.held_after_bytes} B alive")
    assert second.fix == "remove retain_graph=True" and second.verdict == "can go"


def test_reuse_the_graph_a_new_forward_builds_a_new_graph() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def step() -> None:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward(retain_graph=True)  # "reuse the graph"
        optimizer.step()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=model, optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [False, None]
    first = the_call(audit, 'loss.backward(retain_graph=True)  # "reuse the graph"')
    assert first.held_after_bytes > 0 and first.fix == "remove retain_graph=True"


def test_srgan_step_raises_in_place_and_its_retain_is_needed_for_the_second_backward(gan) -> None:
    netG, netD, optimizerG, optimizerD, real, z = gan
    audit = audit_retain_graph(
        lambda: srgan_step(netG, netD, optimizerG, optimizerD, real, z),
        models=[netG, netD],
        optimizers=[optimizerG, optimizerD],
    )
    assert IN_PLACE in audit.error and audit.error.startswith("RuntimeError: ")
    assert audit.error_line.endswith(": g_loss.backward()")
    assert verdicts(audit) == [True, None]
    first = the_call(audit, "d_loss.backward(retain_graph=True)", "gan_steps.py")
    assert SECOND_TIME in first.why and "g_loss.backward()" in first.why  # what it takes without it
    assert first.fix.startswith("keep it: a later backward needs these buffers (gan_steps.py:")
    the_call(audit, "g_loss.backward()", "gan_steps.py")


def test_single_forward_gan_with_autograd_grad(gan) -> None:
    netG, netD, optimizerG, optimizerD, real, z = gan

    def step() -> None:
        single_forward_step(netG, netD, optimizerG, optimizerD, real, z)

    audit = audit_retain_graph(step, models=[netG, netD], optimizers=[optimizerD, optimizerG])
    assert audit.error is None and verdicts(audit) == [True, None]
    first = the_call(audit, "d_grads = torch.autograd.grad(d_loss, d_params, retain_graph=True)", "gan_steps.py")
    assert first.function == "torch.autograd.grad" and SECOND_TIME in first.why
    assert (
        the_call(audit, "g_grads = torch.autograd.grad(g_loss, g_params)", "gan_steps.py").function
        == "torch.autograd.grad"
    )


def test_gradient_penalty_create_graph_is_reported_as_such(gan) -> None:
    netG, netD, _optimizerG, optimizerD, real, z = gan

    def step() -> None:
        optimizerD.zero_grad()
        fake = netG(z).detach()
        eps = torch.rand(real.shape[0], 1)
        x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
        grads = torch.autograd.grad(netD(x_hat).sum(), x_hat, create_graph=True)[0]
        penalty = (grads.norm(2, dim=1) - 1).pow(2).mean()
        d_loss = netD(fake).mean() - netD(real).mean() + 10 * penalty
        d_loss.backward()
        optimizerD.step()

    audit = audit_retain_graph(step, models=[netG, netD], optimizers=optimizerD)
    assert audit.error is None and verdicts(audit) == [None, None]
    penalty = the_call(audit, "grads = torch.autograd.grad(netD(x_hat).sum(), x_hat, create_graph=True)[0]")
    assert (penalty.create_graph, penalty.retain_graph) == (True, True)  # retain_graph defaults to create_graph
    assert penalty.why == CREATE_GRAPH_NOTE and penalty.verdict == "not a retain (create_graph)"


def test_a_step_without_retain(gan) -> None:
    netG, netD, optimizerG, optimizerD, real, z = gan

    def step() -> None:
        standard_step(netG, netD, optimizerG, optimizerD, real, z)

    audit = audit_retain_graph(step, models=[netG, netD], optimizers=[optimizerD, optimizerG])
    assert audit.error is None and verdicts(audit) == [None, None]
    assert [c.verdict for c in audit.calls] == ["not a retain", "not a retain"]


def test_grad_for_the_head_alone_frees_only_the_head_so_its_retain_can_go(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1, l2 = head1(features).pow(2).mean(), head2(features).pow(2).mean()
        grads = torch.autograd.grad(l1, list(head1.parameters()), retain_graph=True)
        l2.backward()
        for p, g in zip(head1.parameters(), grads):
            p.grad = g
        optimizer.step()

    # autograd.grad runs (and frees) only the nodes between l1 and head1's parameters: not the trunk.
    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [False, None]


def test_rnn_loop_with_one_backward() -> None:
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 8), nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    sequence, target = torch.randn(5, 2, 3), torch.randn(2, 1)

    def step() -> None:
        optimizer.zero_grad()
        h = torch.zeros(2, 8)
        for x in sequence:
            h = cell(x, h)
        loss = (head(h) - target).pow(2).mean()
        loss.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=[cell, head], optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [None]
    the_call(audit, "loss.backward()")


def test_retain_on_the_last_backward_only_can_go_also_judged_by_grad_without_optimizers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(8, 4)

    def step() -> None:
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward(retain_graph=True)

    audit = audit_retain_graph(step, models=model)
    assert audit.error is None and verdicts(audit) == [False]
    call = the_call(audit, "loss.backward(retain_graph=True)")
    assert call.held_after_bytes > 0 and call.fix == "remove retain_graph=True"


def test_actor_critic_with_a_shared_trunk() -> None:
    torch.manual_seed(0)
    trunk, actor, critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh()), nn.Linear(32, 2), nn.Linear(32, 1)
    optimizer = torch.optim.Adam([*trunk.parameters(), *actor.parameters(), *critic.parameters()], lr=1e-3)
    states, returns = torch.randn(16, 4), torch.randn(16)

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(states)
        dist = torch.distributions.Categorical(logits=actor(features))
        actions = dist.sample()
        values = critic(features).squeeze(-1)
        actor_loss = -(dist.log_prob(actions) * (returns - values).detach()).mean()
        critic_loss = (returns - values).pow(2).mean()
        actor_loss.backward(retain_graph=True)
        critic_loss.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, actor, critic], optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [True, None]
    assert SECOND_TIME in the_call(audit, "actor_loss.backward(retain_graph=True)").why


def test_a_step_that_draws_its_batch_from_an_iterator_is_judged_from_what_ran() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    batches = iter([torch.randn(4, 3) for _ in range(5)])

    def step() -> None:
        model.zero_grad()
        model(next(batches)).pow(2).sum().backward(retain_graph=True)

    audit = audit_retain_graph(step, models=model)
    (call,) = audit.calls  # no run is compared with another: what each backward walks is the verdict
    assert call.needed is False and call.verdict == "can go" and call.fix == "remove retain_graph=True"
    [line] = audit.lines
    assert (line.verdict, line.runs, line.needed_runs) == ("can go", 2, 0)


def test_a_retain_on_a_carried_hidden_state_is_needed_by_the_next_runs_backward() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(3, 4)
    h = h0 = torch.zeros(1, 4)

    def step() -> None:
        nonlocal h
        h = cell(torch.randn(1, 3), h)
        h.pow(2).sum().backward(retain_graph=True)

    audit = audit_retain_graph(step, models=cell)  # run 2's backward walks h from run 1, through the retain
    assert audit.error is None and [c.verdict for c in audit.calls] == ["goes with the carried fix"]  # the band-aid
    assert audit.summary().endswith("1 retain_graph=True judged: 0 needed, 1 goes with the carried fix, 0 can go.")
    [line] = audit.lines
    assert (line.runs, line.needed_runs) == (2, 1) and "in iteration 2" in line.why
    assert h is h0, "the step's h is the learner's object again afterwards"


def test_single_forward_gan_with_backward_inputs(gan) -> None:
    netG, netD, optimizerG, optimizerD, real, z = gan

    def step() -> None:
        inputs_step(netG, netD, optimizerG, optimizerD, real, z)

    audit = audit_retain_graph(step, models={"G": netG, "D": netD}, optimizers=[optimizerD, optimizerG])
    assert audit.error is None and verdicts(audit) == [True, None]
    first = the_call(audit, "d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)", "gan_steps.py")
    assert SECOND_TIME in first.why


def test_three_losses_on_one_trunk_every_retain_but_the_last_is_needed(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1, l2, l3 = head1(features).pow(2).mean(), head2(features).abs().mean(), features.pow(2).mean()
        l1.backward(retain_graph=True)
        l2.backward(retain_graph=True)
        l3.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert verdicts(audit) == [True, True, None]
    assert "l3.backward()" in the_call(audit, "l2.backward(retain_graph=True)").why


def test_a_graph_that_saves_nothing_can_be_walked_twice_without_a_retain() -> None:
    w = nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(4)

    def step() -> None:
        optimizer.zero_grad()
        loss = (w + x).sum()  # an addition saves no tensor
        loss.backward(retain_graph=True)
        loss.backward()
        optimizer.step()

    audit = audit_retain_graph(step, optimizers=optimizer)
    assert verdicts(audit) == [False, None]
    call = the_call(audit, "loss.backward(retain_graph=True)")
    assert call.held_after_bytes == 0 and call.why.endswith("it only kept 0 B alive")


def test_a_swallowed_error_shows_as_changed_gradients(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1, l2 = head1(features).pow(2).mean(), head2(features).pow(2).mean()
        l1.backward(retain_graph=True)
        with contextlib.suppress(RuntimeError):  # the learner's own "fix"
            l2.backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert audit.error is None and verdicts(audit) == [True, None]
    first = the_call(audit, "l1.backward(retain_graph=True)")
    # as written l2's backward walks the trunk l1 kept: without the retain it would raise (and be swallowed)
    assert (
        first.why.startswith("needed in 2 of 2 runs: a later backward of the same iteration, test_audit.py:")
        and "l2.backward()" in first.why
    )
    assert first.fix.startswith("keep it: a later backward needs these buffers")


def test_a_gradient_norm_taken_after_backward_needs_the_retain() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 3)
    norms: list[float] = []
    note = norms.append  # the step holds a function, not the list: the audit leaves the list alone

    def step() -> None:
        optimizer.zero_grad()
        x_in = x.clone().requires_grad_()
        loss = model(x_in).pow(2).mean()
        loss.backward(retain_graph=True)
        (input_grad,) = torch.autograd.grad(loss, x_in)
        note(input_grad.norm().item())
        optimizer.step()

    audit = audit_retain_graph(step, models=model, optimizers=optimizer)
    assert verdicts(audit) == [True, None]
    assert [c.function for c in audit.calls] == ["loss.backward", "torch.autograd.grad"]
    assert len(norms) == 2  # the step ran as written, twice: never a run without the retain


def test_an_optimizer_nobody_passed_is_adopted_before_it_steps_and_put_back(two_heads) -> None:
    trunk, head1, _, optimizer, x = two_heads
    before = [p.detach().clone() for p in trunk.parameters()]

    def step() -> None:
        optimizer.zero_grad()
        head1(trunk(x)).sum().backward()
        optimizer.step()

    audit_retain_graph(step, models=[trunk, head1])  # the step names its optimizer: found and put back
    assert all(torch.equal(b, p) for b, p in zip(before, trunk.parameters()))
    steps = {"optimizer": lambda: optimizer.step()}.get  # reached only through a function: no name holds it

    def hidden_step() -> None:
        trunk.zero_grad()
        head1(trunk(x)).sum().backward()
        steps("optimizer")()

    state = optimizer.state_dict()
    audit = audit_retain_graph(hidden_step, models=[trunk, head1])
    assert audit.error is None
    assert all(torch.equal(b, p) for b, p in zip(before, trunk.parameters()))
    assert optimizer.state_dict() == state

    def builds_its_own() -> None:  # an optimizer made in every call (a learner's mistake; its state is new each time)
        adam = torch.optim.Adam(trunk.parameters(), lr=0.1)
        adam.zero_grad()
        head1(trunk(x)).sum().backward()
        adam.step()

    assert audit_retain_graph(builds_its_own, models=[trunk, head1]).error is None
    assert all(torch.equal(b, p) for b, p in zip(before, trunk.parameters()))


def test_a_notebook_cell_is_named_as_a_traceback_names_it(monkeypatch) -> None:
    cell = "/tmp/ipykernel_7/31415.py"
    source = "def step():\n    loss = (w * w).sum()\n    loss.backward(retain_graph=True)\n"
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    compiler = types.SimpleNamespace(format_code_name=lambda name: ("Cell", "In[12]") if name == cell else None)
    shell = types.SimpleNamespace(compile=compiler)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    w = nn.Parameter(torch.ones(3))
    namespace = {"w": w}
    exec(compile(source, cell, "exec"), namespace)
    audit = audit_retain_graph(namespace["step"])
    assert [c.line for c in audit.calls] == ["Cell In[12], line 3: loss.backward(retain_graph=True)"]
    assert "Cell In[12], line 3: loss.backward(retain_graph=True) | retain_graph=True | can go" in repr(audit)


# -- the tool's promises -----------------------------------------------------------------------------------


def test_state_is_put_back(two_heads) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(8, 4)
    model(x).sum().backward()
    optimizer.step()  # Adam has state now, and every parameter a .grad
    before = (
        copy.deepcopy(model.state_dict()),
        {n: p.grad.clone() for n, p in model.named_parameters()},
        copy.deepcopy(optimizer.state_dict()),
        torch.get_rng_state(),
        random.getstate(),
    )

    def step() -> None:
        optimizer.zero_grad()
        out = model(x + random.random())
        out.mean().backward(retain_graph=True)
        out.pow(2).mean().backward()
        optimizer.step()

    audit = audit_retain_graph(step, models=model, optimizers=optimizer)
    assert verdicts(audit) == [True, None]
    state, grads, opt_state, rng, py_rng = before
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # buffers too
    assert all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters())
    assert torch.equal(rng, torch.get_rng_state()) and py_rng == random.getstate()
    now = optimizer.state_dict()
    assert all(torch.equal(opt_state["state"][i]["exp_avg"], now["state"][i]["exp_avg"]) for i in now["state"])
    assert opt_state["param_groups"] == now["param_groups"]


def test_nothing_is_kept_alive(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads
    made: list[weakref.ref] = []
    keep = made.append  # a function the step holds, not the list

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        keep(weakref.ref(features))
        head1(features).sum().backward(retain_graph=True)
        head2(features).pow(2).sum().backward(retain_graph=True)
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    gc.collect()
    assert len(made) == 2  # as written, twice
    assert all(ref() is None for ref in made)
    for call in audit.calls:
        assert all(isinstance(v, (str, int, bool, type(None))) for v in vars(call).values())


def test_torch_functions_are_put_back_even_when_the_step_raises(two_heads) -> None:
    trunk, head1, _, _, x = two_heads
    originals = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad, autograd_grad)

    def step() -> None:
        head1(trunk(x)).sum().backward(retain_graph=True)
        raise ValueError("the learner's own bug\nsecond line")

    audit = audit_retain_graph(step, models=[trunk, head1])
    assert audit.error == "ValueError: the learner's own bug"
    assert audit.error_line.endswith(': raise ValueError("the learner\'s own bug\\nsecond line")')
    assert verdicts(audit) == [False]  # no later backward before the error walks what it kept
    assert "in 1 run before the error no later backward walks" in audit.calls[0].why
    assert (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad, autograd_grad) == originals
    assert torch.autograd.grad is autograd_grad and globals()["autograd_grad"] is autograd_grad


def test_calls_through_imported_names_are_recorded(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads
    from torch.autograd import backward as autograd_backward

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1, l2 = head1(features).pow(2).mean(), head2(features).pow(2).mean()
        params = [*trunk.parameters(), *head1.parameters()]
        grads = autograd_grad(l1, params, retain_graph=True)
        for p, g in zip(params, grads):
            p.grad = g
        autograd_backward(l2, retain_graph=True)
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    first = the_call(audit, "grads = autograd_grad(l1, params, retain_graph=True)")
    second = the_call(audit, "autograd_backward(l2, retain_graph=True)")
    assert (first.function, second.function) == ("torch.autograd.grad", "torch.autograd.backward")
    assert verdicts(audit) == [True, False]
    assert torch.autograd.backward is autograd_backward


def test_bad_input_is_refused_clearly(two_heads) -> None:
    trunk, _, _, optimizer, x = two_heads

    def train_step(x, y, *, scale):
        pass

    with pytest.raises(TypeError) as error:
        audit_retain_graph(train_step)
    assert str(error.value) == (
        "audit_retain_graph takes a step with no arguments; yours needs (x, y, scale): "
        "wrap it, e.g. lambda: train_step(x, y, scale=scale)"
    )
    with pytest.raises(TypeError, match="function of no arguments"):
        audit_retain_graph(trunk(x))
    with pytest.raises(TypeError, match=re.escape("models must be a torch.nn.Module or a list of them; got Tensor")):
        audit_retain_graph(lambda: None, models=[trunk, x])
    with pytest.raises(
        TypeError, match=re.escape("optimizers must be a torch.optim.Optimizer or a list of them; got Sequential")
    ):
        audit_retain_graph(lambda: None, models=trunk, optimizers=trunk)
    assert audit_retain_graph(lambda: None, models=trunk, optimizers=optimizer).calls == []


def test_text_and_html_show_each_line_verdict_and_fix(two_heads) -> None:
    trunk, head1, head2, optimizer, x = two_heads

    def step() -> None:
        optimizer.zero_grad()
        features = trunk(x)
        l1, l2 = head1(features).pow(2).mean(), head2(features).pow(2).mean()
        l1.backward(retain_graph=True)
        l2.backward(retain_graph=True)
        (l1 + l2).backward()  # <fine>
        optimizer.step()

    audit = audit_retain_graph(step, models=[trunk, head1, head2], optimizers=optimizer)
    assert verdicts(audit) == [True, True, None]
    text, page = repr(audit), audit._repr_html_()
    assert text.startswith("retain_graph audit: 3 backward call(s); 2 retain_graph=True judged: 2 needed, 0 can go.")
    for call in audit.calls:
        short = f"{HERE}:{call.line.split(':')[1]}: {call.line.split(': ', 1)[1]}"
        (row,) = [r for r in text.splitlines() if r.startswith(f"  {call.index + 1}. {short} | ")]
        assert call.verdict in row and call.fix in row and f"retain_graph={call.retain_graph}" in row
        assert short.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;") in page
        assert f"<b>{call.verdict}</b>" in page
    assert "(l1 + l2).backward()  # &lt;fine&gt;" in page and "<fine>" not in page


def test_a_call_whose_retain_no_backward_needs_says_so_though_its_line_is_needed() -> None:
    """WGAN with weight clipping and five critic passes (martinarjovsky/WassersteinGAN's shape), ``fake`` drawn again
    each pass: only the last pass's retain keeps what the generator's backward walks. The rows of passes 1-4 say their
    call can go, and do not tell the learner to keep it for a later backward."""
    torch.manual_seed(0)
    generator, critic = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
    critic_optimizer = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    generator_optimizer = torch.optim.RMSprop(generator.parameters(), lr=5e-5)

    def step() -> None:
        for _ in range(5):
            fake = generator(torch.randn(8, 2))
            critic_optimizer.zero_grad()
            loss_critic = -(critic(torch.randn(8, 4)).mean() - critic(fake).mean())
            loss_critic.backward(retain_graph=True)
            critic_optimizer.step()
        generator_optimizer.zero_grad()
        (-critic(fake).mean()).backward()
        generator_optimizer.step()

    audit = audit_retain_graph(step, [generator, critic], [critic_optimizer, generator_optimizer])
    retains = [c for c in audit.calls if c.retain_graph]
    assert [c.verdict for c in retains] == ["can go"] * 4 + ["needed"], repr(audit)
    assert all(not c.fix.startswith("keep it") for c in retains[:4]), repr(audit)
    assert "no later backward walked" in retains[0].why, retains[0].why


def test_the_band_aid_on_an_lstm_state_goes_once_the_whole_state_is_detached() -> None:
    """A word-language-model step carrying ``hidden = (h, c)`` with the forum's ``retain_graph=True``: the retain
    goes once ``hidden`` is detached, both tensors of it; detaching ``hidden[0]`` alone still raises through
    ``hidden[1]``."""
    torch.manual_seed(0)
    lstm, head = nn.LSTM(3, 5), nn.Linear(5, 1)
    optimizer = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
    hidden = (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5))

    def step() -> None:
        nonlocal hidden
        output, hidden = lstm(torch.randn(4, 2, 3), hidden)
        optimizer.zero_grad()
        head(output).pow(2).mean().backward(retain_graph=True)

    audit = audit_retain_graph(step, [lstm, head], optimizer)
    [line] = audit.lines
    assert line.verdict == "goes with the carried fix", repr(audit)
    assert line.fix == "remove retain_graph=True once `hidden` no longer carries its graph", line.fix
    assert "once `hidden` is detached" in line.why, line.why


def test_the_band_aid_on_a_list_of_losses_goes_once_the_list_is_cleared_not_detached() -> None:
    """REINFORCE's ``log_probs`` list summed each iteration with the forum's retain: the fix clears the list, and
    the retain's why said "once `log_probs` is detached", which a list cannot be. The truth: with
    ``log_probs.clear()`` after the backward and no retain, the step runs three times."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    log_probs: list[torch.Tensor] = []

    def step(retain: bool = True, clear: bool = False) -> None:
        log_probs.append(model(x).sum())
        loss = torch.stack(log_probs).sum()
        model.zero_grad()
        loss.backward(retain_graph=retain)
        if clear:
            log_probs.clear()

    for _ in range(3):
        step(retain=False, clear=True)
    audit = audit_retain_graph(step, model)
    [line] = audit.lines
    assert line.verdict == "goes with the carried fix", repr(audit)
    assert "once `log_probs` is cleared" in line.why, line.why


def test_the_audit_of_a_step_that_catches_its_backwards_error_says_the_step_goes_on() -> None:
    """A step whose gradient hook raises on a bad batch and that skips it (``except FloatingPointError: return``):
    the audit said "As written the step raises FloatingPointError", where diagnose says the step caught it."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    runs = [0]

    def guard(grad: torch.Tensor) -> None:
        if not torch.isfinite(grad).all():
            raise FloatingPointError("non-finite gradient")

    net.weight.register_hook(guard)

    def step() -> None:
        runs[0] += 1
        x = torch.randn(8, 4)
        if runs[0] == 2:
            x[0, 0] = float("inf")
        opt.zero_grad()
        try:
            net(x).pow(2).mean().backward()
        except FloatingPointError:
            return
        opt.step()

    said = audit_retain_graph(step, models=net, optimizers=opt).summary()
    assert "As written a backward of the step raises FloatingPointError" in said, said
    assert "and the step catches it and goes on" in said, said


def test_a_retain_expression_false_for_the_last_call_is_no_retain_judged() -> None:
    """EWC's Fisher estimate (kuc2477/pytorch-ewc): one ``autograd.grad`` per sample of one batch's graph,
    ``retain_graph=(i < len(losses) - 1)``. The last call, with retain_graph=False, was counted among the
    "retain_graph=True judged" and called "can go". The truth (no helpers): the first two calls' retain is needed
    (dropped, the next call raises); the last keeps nothing."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(3, 3)

    def fisher_step() -> None:
        losses = model(x).squeeze(1).unbind()
        for i, loss in enumerate(losses):
            autograd_grad(loss, list(model.parameters()), retain_graph=i < len(losses) - 1)

    def without_the_first_retain() -> None:
        losses = model(x).squeeze(1).unbind()
        autograd_grad(losses[0], list(model.parameters()))
        autograd_grad(losses[1], list(model.parameters()))

    with pytest.raises(RuntimeError, match="second time"):
        without_the_first_retain()
    audit = audit_retain_graph(fisher_step, model)
    assert [c.retain_graph for c in audit.calls] == [True, True, False], audit
    assert verdicts(audit) == [True, True, None], audit
    assert "2 retain_graph=True judged: 2 needed, 0 can go." in audit.summary(), audit.summary()
    assert "can go" not in audit.calls[2].fix, audit.calls[2]
