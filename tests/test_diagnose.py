"""diagnose: one entry point that runs find_carried_graph and audit_retain_graph on a learner's step and reports it as
every way in does (one item per cause, ordered by what to fix first); its input checks, its state put back, its
renderings."""

from __future__ import annotations

import functools
import html
import importlib
import importlib.util
import inspect
import linecache
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from backward_twice.report.rendering import Item
from backward_twice.steps.audit import audit_retain_graph
from backward_twice.steps.carried import find_carried_graph
from backward_twice.steps.diagnose import Diagnosis, diagnose
from backward_twice.watcher import watch

HERE = os.path.basename(__file__)


def line_of(code: str) -> int:
    """The line number of ``code`` in this file (its first occurrence)."""
    with open(__file__, encoding="utf-8") as source:
        return next(number for number, text in enumerate(source, 1) if text.strip() == code)


def at(item: Item, code: str) -> bool:
    """One of the item's lines is ``code`` in this file (checked against the file itself)."""
    return any(
        line.place.startswith(f"{HERE}:")
        and line.code == code
        and linecache.getline(__file__, int(line.place.rsplit(":", 1)[1])).strip() == code
        for line in item.lines
    )


def rnn_step(retain: bool, with_optimizer: bool):
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    h = torch.zeros(1, 8)

    def step() -> None:
        nonlocal h
        x = torch.randn(1, 4)
        h = cell(x, h)
        loss = h.pow(2).sum()
        if retain:
            loss.backward(retain_graph=True)
        else:
            loss.backward()
        if with_optimizer:
            optimizer.step()
            optimizer.zero_grad()

    return step, cell, optimizer


def test_rnn_hidden_state_carried_raises_the_second_time_error() -> None:
    step, cell, _ = rnn_step(retain=False, with_optimizer=False)
    result = diagnose(step, models=cell)
    assert result.error_kind == "backward a second time" and "second time" in result.error
    [item] = result.items
    assert item.kind == "carried" and at(item, "h = cell(x, h)") and at(item, "loss.backward()")
    assert item.fix == f"add `h = h.detach()` before line {line_of('h = cell(x, h)')}" and item.to_fix
    assert not result.healthy and result.verdict.startswith("backward-twice: 1 thing to fix (2 runs of step;")


def test_the_forums_band_aid_is_one_item_the_carried_fix_with_its_retain_removed() -> None:
    step, cell, optimizer = rnn_step(retain=True, with_optimizer=True)
    result = diagnose(step, models=cell, optimizers=optimizer)
    assert result.error_kind == "in-place version error" and "inplace operation" in result.error
    # As written, run 2's backward walks run 1's h through the buffers the retain kept (then the optimizer's
    # in-place step trips the version check): the retain only serves the carried h. One item, one fix.
    [item] = result.items
    assert item.kind == "carried" and item.label.endswith("retain_graph=True only hides it")
    assert at(item, "h = cell(x, h)") and at(item, "loss.backward(retain_graph=True)")
    assert item.fix == (
        f"add `h = h.detach()` before line {line_of('h = cell(x, h)')}, and remove retain_graph=True at line "
        f"{line_of('loss.backward(retain_graph=True)')}"
    )
    assert [c.verdict for c in result.audit.calls] == ["goes with the carried fix"]
    assert not result.healthy and result.verdict.startswith("backward-twice: 1 thing to fix")


def test_two_losses_retained_on_both_keep_the_first_remove_the_second() -> None:
    torch.manual_seed(0)
    trunk, head1, head2 = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 1)
    x = torch.randn(16, 4)

    def step() -> None:
        features = trunk(x)
        l1 = head1(features).pow(2).mean()
        l2 = head2(features).abs().mean()
        l1.backward(retain_graph=True)
        l2.backward(retain_graph=True)

    result = diagnose(step, models=[trunk, head1, head2])
    assert result.error is None and result.error_kind is None and not result.carried.found
    [remove] = result.items  # the retain l2's backward needs is evidence, not an item: nothing to change there
    assert remove.kind == "retain can go" and at(remove, "l2.backward(retain_graph=True)") and remove.to_fix
    assert remove.fix.startswith("remove retain_graph=True at line ")
    assert "l1.backward(retain_graph=True): needed" in result.evidence()
    assert not result.healthy and result.verdict.startswith("backward-twice: 1 thing to fix")


def test_a_clean_mlp_step_is_healthy() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def step() -> None:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

    result = diagnose(step, models=model, optimizers=optimizer)
    assert result.healthy and result.verdict.startswith("backward-twice: healthy (3 runs of step,")
    assert result.error is None and not result.carried.found and result.items == ()


def test_an_error_of_another_kind_says_its_first_sentence_and_to_fix_it_first() -> None:
    model = nn.Linear(3, 1)

    def step() -> None:
        model(torch.randn(2, 3)).pow(2).mean().backward()
        model(torch.randn(2, 4))  # a wrong shape: nothing to do with retain_graph

    item = diagnose(step, models=model).items[0]
    assert item.label == "the loop raised RuntimeError"
    assert item.why == "the error says: mat1 and mat2 shapes cannot be multiplied (2x4 and 3x1)"
    assert item.fix == "fix this error first, then run the loop under the tool again"


def test_a_loss_without_a_graph() -> None:
    model = nn.Linear(4, 1)
    x = torch.randn(8, 4)

    def step() -> None:
        with torch.no_grad():
            loss = model(x).pow(2).mean()
        loss.backward()

    result = diagnose(step, models=model)
    assert result.error_kind == "no graph" and "does not require grad" in result.error
    assert result.error_line is not None and result.error_line.endswith(": loss.backward()")
    assert at(result.items[0], "loss.backward()") and "torch.no_grad()" in result.items[0].fix
    assert not result.healthy


def test_another_error_is_named_other_with_its_first_line() -> None:
    model = nn.Linear(4, 1)

    def step() -> None:
        model(torch.randn(8, 5)).sum().backward()

    result = diagnose(step, models=model)
    assert result.error_kind == "other" and "\n" not in result.error and result.error.startswith("RuntimeError")


def last_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"step": 42}, TypeError, "takes a step: a function of no arguments"),
        ({"step": lambda x: None}, TypeError, "no arguments"),
        ({"step": lambda: None, "models": [object()]}, TypeError, "models must be a torch.nn.Module"),
        ({"step": lambda: None, "optimizers": nn.Linear(2, 2)}, TypeError, "optimizers must be"),
        ({"step": lambda: None, "iterations": 0}, ValueError, "iterations must be a whole number from 1 up"),
    ],
)
def test_bad_input_is_refused_by_diagnose(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words) as info:
        diagnose(**kwargs)
    assert str(info.value).startswith("diagnose")
    assert last_frame(info.value) == "diagnose" and info.value.__suppress_context__


def test_state_is_put_back() -> None:
    step, cell, optimizer = rnn_step(retain=True, with_optimizer=True)
    for p in cell.parameters():
        p.grad = torch.full_like(p, 0.5)
    before = [(p.detach().clone(), p.grad.clone()) for p in cell.parameters()]
    h_before = step.__closure__[step.__code__.co_freevars.index("h")].cell_contents
    diagnose(step, models=cell, optimizers=optimizer)
    for (value, grad), p in zip(before, cell.parameters()):
        assert torch.equal(value, p) and torch.equal(grad, p.grad)
    assert step.__closure__[step.__code__.co_freevars.index("h")].cell_contents is h_before
    assert h_before.grad_fn is None


def test_text_and_html_show_the_verdict_the_error_and_each_line() -> None:
    step, cell, optimizer = rnn_step(retain=True, with_optimizer=True)
    result = diagnose(step, models=cell, optimizers=optimizer)
    assert isinstance(result, Diagnosis) and len(result.items) == 1
    text, page = repr(result), result._repr_html_()
    assert text.startswith(result.verdict) and html.escape(result.verdict) in page
    assert result.error not in text and result.error in result.evidence()  # torch's message once: in the evidence
    assert "<details><summary>evidence</summary>" in page and html.escape(result.error) in page
    for item in result.items:
        assert item.label in text and item.fix in text and html.escape(item.fix) in page
        for line in item.lines:
            assert line.code in text and html.escape(line.code) in page
    assert "<script" not in page


def test_models_as_a_dict_and_an_optimizer_nobody_passed() -> None:
    torch.manual_seed(0)
    netG, netD = nn.Linear(2, 2), nn.Linear(2, 1)
    optimizerD = torch.optim.SGD(netD.parameters(), lr=0.1)
    optimizerG = torch.optim.SGD(netG.parameters(), lr=0.1)
    z = torch.randn(8, 2)

    def step() -> None:
        optimizerD.zero_grad()
        optimizerG.zero_grad()
        out = netD(netG(z))
        out.mean().backward()
        optimizerD.step()
        optimizerG.step()

    assert diagnose(step, models={"D": netD, "G": netG}, optimizers=[optimizerD, optimizerG]).healthy
    before = [p.detach().clone() for p in netG.parameters()]
    assert diagnose(step, models={"D": netD, "G": netG}, optimizers=optimizerD).healthy  # G's: found by its name
    assert all(torch.equal(b, p) for b, p in zip(before, netG.parameters())) and optimizerG.state_dict()["state"] == {}

    def hidden(optimizer: torch.optim.Optimizer):  # an optimizer no name of the step reaches
        return lambda: optimizer.step()

    update_g = hidden(optimizerG)

    def step_with_a_hidden_optimizer() -> None:
        optimizerD.zero_grad()
        netD(netG(z)).mean().backward()
        optimizerD.step()
        update_g()

    # adopted at its first step(), before it changes anything, and put back with the rest
    assert diagnose(step_with_a_hidden_optimizer, models={"D": netD, "G": netG}, optimizers=optimizerD).healthy
    assert all(torch.equal(b, p) for b, p in zip(before, netG.parameters()))
    assert optimizerG.state_dict()["state"] == {}


def test_a_detached_hidden_state_without_retain_is_healthy_and_state_is_put_back() -> None:
    torch.manual_seed(0)
    cell = nn.GRUCell(4, 8)
    optimizer = torch.optim.Adam(cell.parameters(), lr=0.1)
    h = h0 = torch.zeros(1, 8)

    def step() -> None:
        nonlocal h
        optimizer.zero_grad()
        h = cell(torch.randn(1, 4), h.detach())
        h.pow(2).sum().backward()
        optimizer.step()

    before = [p.detach().clone() for p in cell.parameters()]
    result = diagnose(step, models=cell, optimizers=optimizer)
    assert result.healthy and result.items == () and result.verdict.startswith("backward-twice: healthy")
    assert h is h0 and all(torch.equal(b, p) for b, p in zip(before, cell.parameters()))
    assert optimizer.state_dict()["state"] == {}


def test_a_retain_needed_by_a_step_that_fails_keeps_the_audits_words() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(5, 3)

    def step() -> None:
        optimizer.zero_grad()
        out = net(x)
        out.pow(2).mean().backward(retain_graph=True)
        optimizer.step()
        out.abs().mean().backward()  # through the weights the step just changed in place

    result = diagnose(step, models=net, optimizers=optimizer)
    assert result.error_kind == "in-place version error"
    [error] = result.items  # the retain the same run's second backward needs is evidence, not an item
    assert error.kind == "error"
    assert at(error, "out.abs().mean().backward()  # through the weights the step just changed in place")
    assert at(error, "optimizer.step()") and at(error, "out = net(x)")  # the step, and the forward it made stale
    assert error.fix.startswith("compute line ") and "again after the step at line " in error.fix
    assert "changed in place by the optimizer step at test_diagnose.py:" in result.evidence()


def test_a_graph_built_before_the_step_stays_usable_and_the_error_comes_at_iteration_2_as_written() -> None:
    torch.manual_seed(0)
    encoder, head = nn.Linear(4, 8), nn.Linear(8, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    features = torch.tanh(encoder(torch.randn(5, 4)))  # before the loop, with a graph

    def step() -> None:
        optimizer.zero_grad()
        head(features).pow(2).mean().backward()  # frees the pre-loop graph: the second iteration raises
        optimizer.step()

    result = diagnose(step, models=[encoder, head], optimizers=optimizer)
    assert result.error_kind == "backward a second time" and result.carried.iterations_run == 2
    assert result.error_line.endswith(
        ": head(features).pow(2).mean().backward()  # frees the pre-loop graph: the second iteration raises"
    )
    [finding] = result.carried.findings
    assert finding.name == "features" and finding.iteration is None
    assert finding.created_at.endswith(
        ": features = torch.tanh(encoder(torch.randn(5, 4)))  # before the loop, with a graph"
    )
    step()  # the learner's own first iteration still works: the tool's runs freed nothing
    with pytest.raises(RuntimeError, match="second time"):
        step()  # and the second fails, as written


def test_leaves_the_step_changes_in_place_are_put_back() -> None:
    torch.manual_seed(0)
    W = torch.randn(3, 1, requires_grad=True)  # a hand-written update, no optimizer
    image = torch.rand(2, 3, requires_grad=True)
    lbfgs = torch.optim.LBFGS([image], max_iter=3)
    before_w, before_image = W.detach().clone(), image.detach().clone()

    def step() -> None:
        loss = (image @ W).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            W.sub_(0.1 * W.grad)
            W.grad.zero_()

        def closure():
            lbfgs.zero_grad()
            objective = (image - 0.5).pow(2).sum()
            objective.backward()
            return objective

        lbfgs.step(closure)

    result = diagnose(step)  # nothing passed: W and the LBFGS image are found from the step's names
    assert result.healthy, result
    assert torch.equal(W, before_w) and W.grad is None
    assert torch.equal(image, before_image) and image.grad is None and lbfgs.state_dict()["state"] == {}


def test_a_graph_through_the_parameters_built_before_diagnose_is_still_walkable_and_attributes_are_put_back() -> None:
    """The runs step the optimizer (a version bump on every parameter) and a hand-written optimizer keeps its
    momentum as an attribute of each parameter; afterwards a graph the learner built before, which saved the
    parameters, backward()s as it would have without the tool, and the parameters carry the attributes they had."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(6, 4, requires_grad=True)  # its gradient needs the weight the graph saved
    model.weight.note = "the learner's own"  # type: ignore[attr-defined]

    class Momentum(torch.optim.Optimizer):
        def __init__(self, params) -> None:  # type: ignore[no-untyped-def]
            super().__init__(params, {"lr": 0.1})

        @torch.no_grad()
        def step(self, closure=None):  # type: ignore[no-untyped-def]
            for group in self.param_groups:
                for p in group["params"]:
                    if not hasattr(p, "velocity"):
                        p.velocity = torch.zeros_like(p)
                    p.velocity.mul_(0.9).add_(p.grad)
                    p.sub_(group["lr"] * p.velocity)

    optimizer = Momentum(model.parameters())
    built_before = model(x).pow(2).mean()  # saves the weight at its version now

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        optimizer.step()

    weight = model.weight.detach().clone()
    result = diagnose(step, models=model, optimizers=optimizer)
    assert result.healthy, result
    assert torch.equal(model.weight, weight)
    assert not hasattr(model.weight, "velocity") and not hasattr(model.bias, "velocity")
    assert model.weight.note == "the learner's own"  # type: ignore[attr-defined]
    built_before.backward()  # as without the tool: no in-place error from the runs' steps
    bare = nn.Linear(4, 1)
    bare.load_state_dict(model.state_dict())
    bare(x).pow(2).mean().backward()
    assert torch.allclose(model.weight.grad, bare.weight.grad)


def test_without_torchs_version_setter_the_values_are_still_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where PyTorch lacks its private setter: values and attributes come back; the version stays
    bumped (a graph built before then raises the in-place error when walked, as the docstring says)."""
    monkeypatch.delattr(torch._C._autograd, "_unsafe_set_version_counter")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 4, requires_grad=True)
    built_before = model(x).pow(2).mean()
    weight = model.weight.detach().clone()

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        optimizer.step()

    assert diagnose(step, models=model, optimizers=optimizer).healthy
    assert torch.equal(model.weight, weight) and model.weight.grad is None
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        built_before.backward()


class _EmaCodebook(nn.Module):
    """zalandoresearch/pytorch-vq-vae's VectorQuantizerEMA, its update as written: in training, each forward
    replaces its registered ``_ema_w`` parameter and its ``_ema_cluster_size`` buffer with new tensors."""

    def __init__(self) -> None:
        super().__init__()
        self._embedding = nn.Embedding(4, 3)
        self.register_buffer("_ema_cluster_size", torch.zeros(4))
        self._ema_w = nn.Parameter(torch.randn(4, 3))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        nearest = torch.cdist(inputs, self._embedding.weight).argmin(1)
        encodings = nn.functional.one_hot(nearest, 4).float()
        self._ema_cluster_size = self._ema_cluster_size * 0.99 + 0.01 * encodings.sum(0)
        self._ema_w = nn.Parameter(self._ema_w * 0.99 + 0.01 * (encodings.t() @ inputs.detach()))
        return self._embedding(nearest)


def test_parameters_and_buffers_the_step_replaces_are_put_back() -> None:
    torch.manual_seed(0)
    codebook = _EmaCodebook()
    optimizer = torch.optim.SGD(codebook.parameters(), lr=0.1)
    inputs = torch.randn(8, 3)
    ema_w, cluster_size = codebook._ema_w, codebook._ema_cluster_size
    before = ema_w.detach().clone()

    def step() -> None:
        optimizer.zero_grad()
        (codebook(inputs) - inputs).pow(2).mean().backward()
        optimizer.step()

    step()
    assert codebook._ema_w is not ema_w  # truth: a bare step replaces them
    codebook._ema_w, codebook._ema_cluster_size = ema_w, cluster_size
    codebook._embedding.weight.grad = None
    diagnose(step, models=codebook, optimizers=optimizer)
    assert codebook._ema_w is ema_w and codebook._ema_cluster_size is cluster_size
    assert torch.equal(codebook._ema_w.detach(), before)


def test_requires_grad_a_step_turns_off_and_the_grads_it_leaves_are_put_back() -> None:
    """rosinality/stylegan2-pytorch's train(): ``requires_grad(discriminator, False)`` before G's step, with
    D's gradients of its own step left on it."""
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(2, 3), nn.Linear(3, 1)
    g_optim = torch.optim.Adam(generator.parameters(), lr=1e-3)
    d_optim = torch.optim.Adam(discriminator.parameters(), lr=1e-3)

    def step() -> None:
        discriminator.requires_grad_(True)
        fake = generator(torch.randn(4, 2))
        d_loss = nn.functional.softplus(discriminator(fake.detach())).mean()
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()
        discriminator.requires_grad_(False)
        g_loss = nn.functional.softplus(-discriminator(generator(torch.randn(4, 2)))).mean()
        generator.zero_grad()
        g_loss.backward()
        g_optim.step()

    diagnose(step, models={"G": generator, "D": discriminator}, optimizers={"G": g_optim, "D": d_optim})
    for parameter in (*generator.parameters(), *discriminator.parameters()):
        assert parameter.requires_grad and parameter.grad is None


class _Policy(nn.Module):
    """pytorch/examples' REINFORCE policy: the episode's log-probs and rewards kept in lists on the module."""

    def __init__(self) -> None:
        super().__init__()
        self.affine = nn.Linear(4, 2)
        self.saved_log_probs: list[torch.Tensor] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.affine(x), dim=-1)


def test_lists_on_a_module_numpys_stream_and_attributes_the_runs_add_are_put_back() -> None:
    """REINFORCE whose ``finish_episode`` forgets ``del policy.saved_log_probs[:]``: diagnose's runs left the lists
    on the policy holding their log-probs (with graphs) and rewards, so the learner's own next loop raised another
    error than bare Python; numpy's global stream moved on, so the next batch differed; an attribute the step adds
    stayed. The truth: the state before diagnose, compared item by item."""
    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    policy = _Policy()
    policy.rewards.append(0.5)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    kept = list(policy.rewards)

    def finish_episode() -> None:
        for _ in range(3):
            probs = policy(torch.from_numpy(np.random.randn(1, 4)).float())
            action = torch.distributions.Categorical(probs).sample()
            policy.saved_log_probs.append(torch.distributions.Categorical(probs).log_prob(action))
            policy.rewards.append(float(action))
        policy.last_episode = len(policy.rewards)  # type: ignore[attr-defined]
        loss = -torch.cat(policy.saved_log_probs).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        del policy.rewards[1:]

    np.random.seed(0)
    numpy_before = np.random.get_state()
    diagnosis = diagnose(finish_episode, models=policy, optimizers=optimizer)
    assert "second time" in (
        diagnosis.error or ""
    )  # truth: bare, the second call raises (the list still holds call 1's)
    assert policy.saved_log_probs == [] and policy.rewards == kept and policy.rewards is not kept
    assert not hasattr(policy, "last_episode")
    numpy_after = np.random.get_state()
    assert (numpy_after[1] == numpy_before[1]).all() and numpy_after[2] == numpy_before[2]


def test_a_plain_object_whose_tensor_and_array_the_step_rebinds_is_put_back_without_comparing_them() -> None:
    """A hidden state and a running average kept on a plain object (``state.h = h.detach()``, ``tracker.avg =
    ...``): putting it back compared its attributes with ``!=``, and a tensor's or an array's comparison is
    elementwise; the tool raised "Boolean value of Tensor with more than one value is ambiguous" on a healthy step,
    and left the object as the runs left it. The truth: the step runs bare, and the object is as before."""
    import types

    import numpy

    cell = nn.GRUCell(3, 4)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    x = torch.randn(2, 3)
    state = types.SimpleNamespace(h=torch.zeros(2, 4), average=numpy.zeros(3), steps=0)
    before = dict(vars(state))

    def step() -> None:
        optimizer.zero_grad()
        h = cell(x, state.h)
        h.pow(2).mean().backward()
        optimizer.step()
        state.h, state.average, state.steps = h.detach(), state.average + 1.0, state.steps + 1

    result = diagnose(step, models=cell, optimizers=optimizer)
    assert result.healthy, str(result)
    assert all(vars(state)[name] is value for name, value in before.items()), vars(state)


def test_a_modules_plain_attributes_and_the_learners_own_random_streams_are_put_back() -> None:
    """``self.calls += 1`` and ``self.tag = ...`` in a forward, and batches drawn from a ``torch.Generator``, a
    ``random.Random`` and numpy's ``default_rng`` of the learner's: the runs left them as three calls leave them, so
    the learner's next batch was another than without the tool. The truth: what the objects say before and after."""
    import random

    import numpy

    class Counted(nn.Linear):
        def __init__(self) -> None:
            super().__init__(3, 1)
            self.calls, self.tag, self.last = 0, "fresh", None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls, self.tag = self.calls + 1, f"called {self.calls + 1}"
            self.last = super().forward(x)
            return self.last

    model = Counted()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    streams = torch.Generator().manual_seed(1), random.Random(2), numpy.random.default_rng(3)

    def step() -> None:
        x = torch.randn(4, 3, generator=streams[0]) * streams[1].random() * float(streams[2].random())
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    before = (streams[0].get_state(), streams[1].getstate(), streams[2].bit_generator.state)
    assert diagnose(step, models=model, optimizers=optimizer).healthy
    assert (model.calls, model.tag, model.last) == (0, "fresh", None)
    assert torch.equal(streams[0].get_state(), before[0]) and streams[1].getstate() == before[1]
    assert streams[2].bit_generator.state == before[2]


@pytest.mark.parametrize("tool", [diagnose, audit_retain_graph, find_carried_graph], ids=lambda t: t.__name__)
def test_numpy_arrays_the_step_shuffles_in_place_are_put_back(tool: Callable[..., Any]) -> None:
    """SASRec's in-process sampler shuffles its users' index array in place (``self.rng.shuffle(self.uids)``): the
    tools put back its stream and its counter, and left the array shuffled, so the learner's next batches were others
    than without the tool. The truth: the arrays before and after, and the learner's run after the tool's."""
    import numpy

    class Sampler:
        def __init__(self) -> None:
            self.rng, self.uids, self.counter = numpy.random.RandomState(0), numpy.arange(6), 0

    def steps_taken(tool_first: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Linear(6, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {"sampler": Sampler(), "order": numpy.arange(6)}

        def step() -> None:
            sampler = state["sampler"]
            sampler.rng.shuffle(sampler.uids)
            numpy.random.RandomState(1).shuffle(state["order"])
            sampler.counter += 1
            x = torch.tensor(sampler.uids * state["order"], dtype=torch.float32)[None]
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

        if tool_first:
            tool(step, models=model, optimizers=optimizer)
            assert state["sampler"].counter == 0
            assert state["sampler"].uids.tolist() == state["order"].tolist() == list(range(6))
        for _ in range(3):
            step()
        return model.weight.detach().clone()

    assert torch.equal(steps_taken(tool_first=True), steps_taken(tool_first=False))


def test_attributes_the_step_keeps_on_itself_are_put_back() -> None:
    """``step.calls += 1`` (a counter on the step function itself, read to freeze a layer after N calls): the
    tools left it three calls on, and the learner's own run froze the layer early. The truth: the counter before
    and after."""
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        step.calls += 1  # type: ignore[attr-defined]
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()

    step.calls = 0  # type: ignore[attr-defined]
    assert diagnose(step, models=model, optimizers=optimizer).healthy
    assert step.calls == 0  # type: ignore[attr-defined]


def test_an_error_of_the_tools_own_judgment_is_said_and_raises_nothing_into_the_learners_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An IndexError in the report's own code (the switched-off item of an earlier commit, found by a probe) went up
    through ``bt.diagnose`` into the learner's code, where the watch says "could not judge this run". The truth:
    the step's runs still happen and are put back; the diagnosis says the tool failed and claims no health."""
    import backward_twice.steps.diagnose as diagnosing

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise IndexError("list index out of range")

    monkeypatch.setattr(diagnosing, "build_report", broken)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()

    result = diagnose(step, models=model, optimizers=optimizer)
    assert result.verdict.startswith("backward-twice could not judge the runs of step (an error of its own: IndexError")
    assert not result.healthy and torch.equal(model.weight, before)
    assert "could not judge" in str(result)


def test_a_trainers_bound_method_as_the_step_has_its_self_found_and_put_back() -> None:
    """``bt.diagnose(trainer.train_step)``: its model, optimizer and counter live on ``self``, which no closure or
    global name reaches; the runs left the batch norm's running statistics and ``self.global_step`` three runs on.
    The truth: what the trainer holds before and after."""

    class Trainer:
        def __init__(self) -> None:
            self.model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
            self.global_step = 0
            self.x, self.y = torch.randn(6, 3), torch.randn(6, 1)

        def train_step(self) -> None:
            self.optimizer.zero_grad()
            ((self.model(self.x) - self.y) ** 2).mean().backward()
            self.optimizer.step()
            self.global_step += 1

    trainer = Trainer()
    norm = trainer.model[1]
    before = norm.running_mean.clone(), int(norm.num_batches_tracked), trainer.model[0].weight.detach().clone()
    assert diagnose(trainer.train_step).healthy
    assert torch.equal(norm.running_mean, before[0]) and int(norm.num_batches_tracked) == before[1]
    assert torch.equal(trainer.model[0].weight, before[2]) and trainer.global_step == 0


def test_a_graph_built_before_the_runs_is_walked_again_in_the_same_iteration_by_every_way_in() -> None:
    """A loss term built once before the loop and added each iteration, with the forum's retain (the thread
    discuss.pytorch.org/t/what-does-the-backward-function-do/9944): ``bt.diagnose`` said "into iteration 1",
    ``bt.watch`` "into iteration 2". The truth: without the retain, iteration 2 raises; the walk again is its."""
    w = torch.randn(3, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1)
    pre = torch.tanh(w).sum()

    def step(retain: bool = True) -> None:
        optimizer.zero_grad()
        ((w**2).sum() + pre).backward(retain_graph=retain)
        optimizer.step()

    diagnosed = diagnose(step).items[0].label
    with watch() as watched:
        for _ in range(3):
            step()
    assert diagnosed == watched.report.items[0].label, (diagnosed, str(watched))
    assert diagnosed.startswith("`pre` carries the graph built before the loop into iteration 2"), diagnosed
    step(retain=False)  # the truth: the first walk without the retain runs; the next raises
    with pytest.raises(RuntimeError, match="second time"):
        step(retain=False)


def _maml_step_that_frees_its_inner_graph() -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """A MAML inner step written ``torch.autograd.grad(..., create_graph=True, retain_graph=False)``: the explicit
    False frees the inner graph, which the outer backward walks again."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 3))
    optimizer = torch.optim.SGD([w], lr=0.01)
    x = torch.randn(2, 3)

    def step() -> None:
        optimizer.zero_grad()
        inner = torch.tanh(x @ w).pow(2).sum()
        (g,) = torch.autograd.grad(inner, [w], create_graph=True, retain_graph=False)
        (x @ (w - 0.1 * g)).pow(2).sum().backward()
        optimizer.step()

    return optimizer, step


def test_a_step_whose_inner_grad_frees_its_graph_raises_under_every_way_in_and_names_that_call() -> None:
    """It was "healthy (3 runs of step ...)" under diagnose, and the command named only the outer backward with "add
    retain_graph=True to the earlier backward only": create_graph=True was read as keeping the graph. The truth: the
    step raises on its first call, and runs without the ``retain_graph=False``."""
    _, step = _maml_step_that_frees_its_inner_graph()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        step()
    line = next(
        n
        for n, text in enumerate(linecache.getlines(__file__), 1)
        if "[w], create_graph=True, retain_graph=False)" in text
    )
    fix = (
        f"fix: remove `retain_graph=False` from line {line}: with create_graph=True the graph is kept unless it says so"
    )
    optimizer, step = _maml_step_that_frees_its_inner_graph()
    diagnosis = diagnose(step, models=[], optimizers=[optimizer])
    assert str(diagnosis).startswith("backward-twice: 1 thing to fix (1 run of step; run 1 raised)"), str(diagnosis)
    assert fix in str(diagnosis), str(diagnosis)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w_:
        for _ in range(2):
            step()
    assert fix in str(w_) and f":{line} | " in str(w_), str(w_)
    optimizer, step = _maml_step_that_frees_its_inner_graph()
    inner = audit_retain_graph(step, models=[], optimizers=[optimizer]).calls[0]
    assert (inner.verdict, inner.fix) == (
        "not a retain (retain_graph=False)",
        "remove retain_graph=False: a later backward walks it",
    )


_MEMS: dict[str, tuple[torch.Tensor, ...]] = {}


def test_memory_a_step_keeps_from_a_tuple_it_unpacks_is_named_by_what_keeps_it() -> None:
    """Transformer-XL's ``ret = model(data, target, *mems); loss, mems = ret[0], ret[1:]`` without the memory's
    detach: diagnose said "`ret` carries ...", fix ``ret = tuple(s.detach() for s in ret)``, which detaches the
    loss too ("element 0 of tensors does not require grad"). The truth: ``mems`` keeps run 1's graph for run 2;
    detached before the model reads it, the step runs."""
    torch.manual_seed(0)
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def model(x: torch.Tensor, *mems: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = layer(x) + (mems[0] if mems else 0)
        return (h.pow(2).mean(), h)

    def step(fixed: bool = False) -> None:
        if fixed:  # the fix, as printed
            _MEMS["m"] = tuple(s.detach() for s in _MEMS["m"])
        ret = model(torch.randn(1, 2), *_MEMS["m"])
        loss, _MEMS["m"] = ret[0], ret[1:]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    _MEMS["m"] = ()
    diagnosis = diagnose(step, models=[layer], optimizers=[optimizer])
    assert "1. `_MEMS['m']` carries iteration 1's graph into iteration 2" in str(diagnosis), str(diagnosis)
    assert "fix: add `_MEMS['m'] = tuple(s.detach() for s in _MEMS['m'])`" in str(diagnosis), str(diagnosis)
    for _ in range(3):
        step(fixed=True)


_entropy: Any = 0


def test_a_regulariser_summed_across_steps_and_read_by_the_loss_starts_at_zero_each_step() -> None:
    """A2C's ``entropy += dist.entropy().mean()`` set to 0 once, above the loop, read by the loss: diagnose said
    "add a number instead (`entropy += loss.item()`)", a NameError applied (no ``loss`` there yet) and, as a number,
    no gradient for the entropy term. The truth: starting at 0 each step, the step runs and the term trains."""
    torch.manual_seed(0)
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step(fixed: bool = False) -> None:
        global _entropy
        p = layer(torch.randn(1, 2)).softmax(-1)
        if fixed:  # the fix, as printed
            _entropy = 0
        _entropy += -(p * p.log()).sum()
        loss = p[0, 0] - 0.01 * _entropy
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    diagnosis = diagnose(step, models=[layer], optimizers=[optimizer])
    line = next(n for n, text in enumerate(linecache.getlines(__file__), 1) if "_entropy += -(p" in text)
    assert f"fix: set `_entropy = 0` before line {line}" in str(diagnosis), str(diagnosis)
    for _ in range(3):
        step(fixed=True)


_rollout_entropy: Any = 0


def test_a_regulariser_a_rollout_loop_adds_to_starts_at_zero_before_that_loop() -> None:
    """A2C's step: ``entropy += dist.entropy().mean()`` in the rollout's loop, read by the update's loss after it:
    the reset was put before the ``+=`` line, inside the loop, which keeps only the last step's term. The truth: the
    published code sets ``entropy = 0`` before the rollout."""
    torch.manual_seed(0)
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step() -> None:
        global _rollout_entropy
        for _ in range(3):
            p = layer(torch.randn(1, 2)).softmax(-1)
            _rollout_entropy += -(p * p.log()).sum()
        loss = p[0, 0] - 0.01 * _rollout_entropy
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    diagnosis = diagnose(step, models=[layer], optimizers=[optimizer])
    source, first = inspect.getsourcelines(step)
    rollout = first + next(i for i, text in enumerate(source) if "for _ in range(3):" in text)
    assert f"fix: set `_rollout_entropy = 0` before line {rollout}" in str(diagnosis), str(diagnosis)


# Paperspace's hooks post's model (blog.paperspace.com/pytorch-hooks-gradient-clipping-debugging): ``forward`` keeps
# its hidden activation as ``self.h``, which the loop appends to a list
HOOKED_NET = (
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc1, self.fc2 = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)\n"
    "    def forward(self, x):\n"
    "        h = torch.relu(self.fc1(x))\n"
    "        self.h = h\n"
    "        return self.fc2(h)\n"
)


def test_a_list_the_step_fills_from_a_model_of_another_module_is_named_at_the_steps_append(tmp_path: Path) -> None:
    """Paperspace's hooks post with its ``Net`` in a module of its own: ``activations.append(net.h)``, ``net.h`` set in
    ``forward``. The note named the module's ``h = torch.relu(self.fc1(x))`` (where the graph is built) with "keep a
    detached tensor (`.detach()`) instead": the line that grows the list was looked for in that module only. The
    truth, as with the model in the step's file: the step's append, and its detach."""
    (tmp_path / "hooked_net.py").write_text("import torch\n" + HOOKED_NET, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("hooked_net", tmp_path / "hooked_net.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    activations: list[torch.Tensor] = []

    def step() -> None:
        optimizer.zero_grad()
        out = net(torch.ones(2, 3))
        activations.append(net.h)
        out.pow(2).mean().backward()
        optimizer.step()

    diagnosis = diagnose(step, models=[net], optimizers=[optimizer])
    [item] = diagnosis.items
    assert at(item, "activations.append(net.h)"), str(diagnosis)
    assert item.fix == "`activations.append(net.h.detach())`", str(diagnosis)


def reptile_task_step(retain: bool) -> tuple[Callable[[], None], nn.Module]:
    """One task of Reptile (joschu's reptile-sinewaves-demo.py, a per-task ``copy.deepcopy`` as its ports write it),
    with the inner loop's loss kept as a running total ``task_loss = task_loss + ...``, as a learner writes it; with
    ``retain``, the forum's band-aid on its backward."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    x_all = torch.linspace(-5, 5, 10)[:, None]
    y_all = torch.sin(x_all + 1.0) * 2.0

    def step() -> None:
        fast = copy.deepcopy(model)
        inner_opt = torch.optim.SGD(fast.parameters(), lr=0.02)
        task_loss = 0
        for _ in range(2):
            inner_opt.zero_grad()
            pred = fast(x_all)
            task_loss = task_loss + nn.functional.mse_loss(pred, y_all)
            if retain:
                task_loss.backward(retain_graph=True)
            else:
                task_loss.backward()
            inner_opt.step()
        with torch.no_grad():
            for p, fp in zip(model.parameters(), fast.parameters()):
                p += 0.1 * (fp - p)

    return step, model


@pytest.mark.parametrize("retain", [False, True])
def test_a_step_whose_own_loop_carries_a_total_is_judged_by_that_loops_passes(retain: bool) -> None:
    """Reptile's inner loop inside the step: each run of the step was one iteration, so the total carried from the
    inner loop's pass 1 into pass 2 read as an in-place error of one iteration ("compute lines N and M again after
    the step") and the audit said "keep it" for the band-aid, while ``bt.watch`` on the same loop named the total.
    The truth (no helpers): pass 2's backward walks pass 1's graph through ``task_loss``; the innermost loop around
    the backward calls is the step's own ``for``, so its passes are the iterations, as in every way in."""
    step, model = reptile_task_step(retain)
    result = diagnose(step, models=model)
    total = "task_loss = task_loss + nn.functional.mse_loss(pred, y_all)"
    [item] = result.items
    assert item.kind == "carried" and "`task_loss` carries iteration 1's graph into iteration 2" in item.label
    assert at(item, total), repr(result)
    assert result.verdict.startswith("backward-twice: 1 thing to fix (2 iterations watched in 1 run of step;")
    with pytest.raises(RuntimeError), watch() as watched:
        step()
    assert [(i.label, i.lines, i.fix) for i in watched.report.items] == [(item.label, item.lines, item.fix)]
    if retain:
        retained = line_of("task_loss.backward(retain_graph=True)")
        assert item.fix.endswith(f"and remove retain_graph=True at line {retained}")
        audit = audit_retain_graph(step, models=model)
        assert [c.verdict for c in audit.calls] == ["goes with the carried fix"], audit


class ChunkTrainer:
    """Truncated backpropagation over chunks of a sequence, in a method of the learner's trainer, its hidden state
    kept on itself and never detached."""

    def __init__(self) -> None:
        self.cell, self.out = nn.GRUCell(3, 4), nn.Linear(4, 1)
        self.opt = torch.optim.SGD([*self.cell.parameters(), *self.out.parameters()], lr=0.1)

    def train_sequence(self, xs: torch.Tensor, ys: torch.Tensor) -> None:
        self.h = torch.zeros(2, 4)
        for t in range(0, len(xs), 2):
            self.opt.zero_grad()
            loss: Any = 0
            for s in range(t, t + 2):
                self.h = self.cell(xs[s], self.h)
                loss = loss + ((self.out(self.h) - ys[s]) ** 2).mean()
            loss.backward()
            self.opt.step()


def test_a_step_that_calls_a_method_whose_loop_holds_its_steps_is_judged_by_that_loops_passes() -> None:
    """``bt.diagnose(lambda: trainer.train_sequence(xs, ys))`` was "1 run of step; ... build `self.h` inside the
    loop that runs line N's backward" (one iteration that backwards twice), where a watch around the same call says
    "`self.h` carries iteration 1's graph into iteration 2" with its detach. The truth (no helpers): pass 2 of the
    chunk loop raises "a second time"; ``self.h = self.h.detach()`` at the end of its passes runs."""
    torch.manual_seed(0)
    trainer = ChunkTrainer()
    xs, ys = torch.randn(6, 2, 3), torch.randn(6, 2, 1)
    result = diagnose(lambda: trainer.train_sequence(xs, ys), models=[trainer.cell, trainer.out])
    headline = "backward-twice: 1 thing to fix (2 iterations watched in 1 run of the step;"
    assert result.verdict.startswith(headline), result
    [item] = result.items
    with pytest.raises(RuntimeError, match="second time"), watch() as watched:
        trainer.train_sequence(xs, ys)
    assert [(i.label, i.fix) for i in watched.report.items] == [(item.label, item.fix)]
    assert item.fix == "add `self.h = self.h.detach()` at the end of each iteration", item.fix


def test_a_step_with_a_loop_around_some_of_its_backward_calls_is_judged_by_its_runs() -> None:
    """A WGAN step: the critic's loop holds D's backward, G's backward comes after it. No loop of the step holds
    every backward call, so the step's runs stay its iterations."""
    torch.manual_seed(0)
    generator, critic = nn.Linear(2, 2), nn.Linear(2, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(critic.parameters())

    def step() -> None:
        for _ in range(3):
            opt_d.zero_grad()
            d_loss = critic(generator(torch.randn(4, 2)).detach()).mean() - critic(torch.randn(4, 2)).mean()
            d_loss.backward()
            opt_d.step()
        opt_g.zero_grad()
        g_loss = -critic(generator(torch.randn(4, 2))).mean()
        g_loss.backward()
        opt_g.step()

    result = diagnose(step, models=[generator, critic], optimizers=[opt_g, opt_d])
    assert result.healthy and result.verdict.startswith("backward-twice: healthy (3 runs of step, 12 backward calls")


def test_a_step_that_catches_its_backwards_error_is_counted_by_its_runs_and_says_so() -> None:
    """A step that skips the rest when its backward raises (``except RuntimeError: return``), its hidden state
    carried: the report said "4 runs of step; run 2 raised" for 3 runs that all returned. The truth: 3 runs, the
    second one's backward raised and the step went on; the carried state is still the cause."""
    torch.manual_seed(0)
    cell = nn.RNNCell(2, 3)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    state = {"h": torch.zeros(1, 3)}

    def step() -> None:
        optimizer.zero_grad()
        state["h"] = cell(torch.randn(1, 2), state["h"])
        try:
            state["h"].pow(2).mean().backward()
        except RuntimeError:
            return
        optimizer.step()

    result = diagnose(step, models=cell, optimizers=optimizer)
    caught = "backward-twice: 1 thing to fix (3 runs of step; a backward raised in run 2, and your code caught it)"
    assert result.verdict == caught, repr(result)
    assert result.items[0].kind == "carried" and "`state['h']` carries" in result.items[0].label, repr(result)


def test_a_step_that_accumulates_gradients_over_a_loop_is_one_iteration_a_run_as_the_watch_counts_it() -> None:
    """Gradient accumulation inside the step (backward in a loop over micro-batches, the optimizer's step after it):
    diagnose said "9 iterations watched in 3 runs of step" where the watch, around three calls of the same step,
    says 3 iterations. The step's loop holds its backward calls but not its step: a run is the iteration."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        for _ in range(3):
            (model(torch.randn(2, 3)).pow(2).mean() / 3).backward()
        optimizer.step()

    result = diagnose(step, models=model, optimizers=optimizer)
    assert result.verdict.startswith("backward-twice: healthy (3 runs of step, 9 backward calls"), result.verdict
    with watch() as watched:
        for _ in range(3):
            step()
    assert str(watched).startswith("backward-twice: healthy (3 iterations watched, 9 backward calls"), str(watched)


def test_the_way_to_the_evidence_uses_the_learners_own_name_for_the_diagnosis() -> None:
    """The footer said "print(diagnosis.evidence())" whatever the diagnosis was called (``d = bt.diagnose(step)``: a
    NameError as printed). It names the caller's variable, and says what to call where none holds it."""
    model = nn.Linear(2, 1)

    def step() -> None:
        model(torch.ones(1, 2)).sum().backward(retain_graph=True)  # a retain that can go: one item, and the footer

    d = diagnose(step, models=[model])
    assert repr(d).splitlines()[-1] == "more: print(d.evidence()) shows the evidence", repr(d)
    assert repr(diagnose(step, models=[model])).splitlines()[-1] == (
        "more: .evidence() of this diagnosis shows the evidence"
    )


def test_a_second_backward_through_a_loss_the_first_walked_gets_one_fix_in_every_way_in() -> None:
    """SAC's temperature loss without its ``.detach()`` of ``log_pi`` (pranz24/pytorch-soft-actor-critic, sac.py):
    the watch said "use `log_pi.detach()` in the loss line N's backward walks", diagnose "sum the losses ..., or add
    retain_graph=True" (which makes the loop raise an in-place error: the policy's step comes between). With every
    call retaining, diagnose saw the first freed node with saved tensors, past ``log_pi``'s own node (a sum, which
    saves none), and took ``log_pi`` for a name on the later loss's way only."""
    torch.manual_seed(0)
    policy = nn.Linear(3, 1)
    policy_optim = torch.optim.SGD(policy.parameters(), lr=0.1)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_optim = torch.optim.SGD([log_alpha], lr=0.1)
    states = torch.randn(8, 3)

    def update() -> None:
        log_pi = torch.log(policy(states).sigmoid() + 1e-6).sum(1)
        policy_loss = (0.2 * log_pi).mean()
        policy_optim.zero_grad()
        policy_loss.backward()
        policy_optim.step()
        alpha_loss = -(log_alpha * (log_pi - 1.0)).mean()
        alpha_optim.zero_grad()
        alpha_loss.backward()
        alpha_optim.step()

    result = diagnose(update, models=[policy], optimizers=[policy_optim, alpha_optim])
    with pytest.raises(RuntimeError, match="second time"), watch() as watched:
        for _ in range(3):
            update()
    assert [i.fix for i in result.items] == [i.fix for i in watched.report.items], (result, watched)
    assert result.items[0].fix.startswith("use `log_pi.detach()` at line "), result.items[0].fix
    assert "(`alpha_loss = -(log_alpha * (log_pi - 1.0)).mean()`)" in result.items[0].fix, result.items[0].fix


def _state_carried_into_two_roots() -> tuple[Callable[[], None], list[nn.Module], torch.optim.Optimizer]:
    """A step whose one backward call takes two losses (``torch.autograd.backward([l1, l2])``), with its state kept by
    ``.clone()`` (which keeps the graph): as written, run 2's call walks run 1's freed graph."""
    torch.manual_seed(0)
    cell, head = nn.Linear(4, 4), nn.Linear(4, 1)
    optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    x, state = torch.randn(3, 4), {"h": torch.zeros(3, 4)}

    def step() -> None:
        optimizer.zero_grad()
        h = torch.tanh(cell(x) + state["h"])
        l1, l2 = head(h).pow(2).mean(), h.abs().mean()
        torch.autograd.backward([l1, l2])
        optimizer.step()
        state["h"] = h.clone()

    return step, [cell, head], optimizer


def test_one_backward_call_of_two_losses_raises_where_the_step_as_written_does() -> None:
    """The tools walk a call of several roots before the engine runs: where the step as written raises, that walk
    raised inside the recorder, which switched itself off ("an error of its own"), gave a second item (retain or sum
    the losses, each of which still raises), an audit with no error, and find_carried_graph's "Iteration 3 raised".
    The truth: bare Python raises "backward through the graph a second time" at run 2, and a detach of the state
    fixes it."""
    step, models, optimizer = _state_carried_into_two_roots()
    result = diagnose(step, models=models, optimizers=optimizer)
    assert "stopped watching" not in result.verdict and result.error_kind == "backward a second time", result.verdict
    [item] = result.items
    assert item.kind == "carried" and item.fix.startswith("add `state['h'] = state['h'].detach()`"), item.fix
    assert result.verdict.startswith("backward-twice: 1 thing to fix (2 runs of step; run 2 raised)"), result.verdict
    audit = audit_retain_graph(step, models=models, optimizers=optimizer)
    assert audit.error is not None and "backward through the graph a second time" in audit.error, audit.error
    carried = find_carried_graph(step, models=models, optimizers=optimizer)
    assert carried.iterations_run == 2 and "Iteration 2 raised" in carried.verdict(), carried.verdict()
    step()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        step()  # bare Python, from the state the tools put back


class _LoggingTrainer:
    """A trainer whose step keeps a running total of its losses, and a count, on itself."""

    def __init__(self) -> None:
        self.model = nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.running_loss = 0.0
        self.steps = 0

    def train_step(self, batch: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = self.model(batch).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.running_loss += loss
        self.steps += 1


@pytest.mark.parametrize("tool", [diagnose, audit_retain_graph, find_carried_graph])
def test_a_partial_of_a_trainers_method_is_read_and_put_back_as_the_method_is(tool: Callable[..., Any]) -> None:
    """``functools.partial(trainer.train_step, batch)``: "healthy", the total kept on the trainer unseen, and the
    runs left ``trainer.running_loss`` a tensor holding their graphs and ``trainer.steps`` at 3 (the same method
    through a lambda was read and put back). The truth (no helpers): three plain calls leave ``running_loss`` with a
    graph (``AddBackward0``)."""
    torch.manual_seed(0)
    trainer, batch = _LoggingTrainer(), torch.randn(4, 3)
    truth = _LoggingTrainer()
    for _ in range(3):
        truth.train_step(batch)
    assert truth.running_loss.grad_fn is not None
    weights = trainer.model.weight.detach().clone()
    result = tool(functools.partial(trainer.train_step, batch))
    assert trainer.running_loss == 0.0 and trainer.steps == 0, vars(trainer)
    assert torch.equal(trainer.model.weight, weights)
    if tool is diagnose:
        assert any("running_loss" in item.label for item in result.report.items), str(result)


class _Distribution(torch.Tensor):
    """BigGAN-PyTorch's ``utils.Distribution``: attributes set after construction, and a ``to`` that reads them."""

    def init_distribution(self, dist_type: str) -> None:
        self.dist_type = dist_type

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        new_obj = _Distribution(self)
        new_obj.init_distribution(self.dist_type)
        new_obj.data = super().to(*args, **kwargs)
        return new_obj


@pytest.mark.parametrize("tool", [diagnose, audit_retain_graph, find_carried_graph])
def test_a_tensor_subclass_with_its_own_to_is_copied_without_running_it(tool: Callable[..., Any]) -> None:
    """BigGAN's noise ``z_``, a ``Distribution`` refilled in place each step: every step tool raised the subclass's
    AttributeError from copying it (its ``to`` reads ``dist_type``, which a detached copy lacks) before the step
    ran. The truth (no helpers): the step runs as written, and its noise is refilled each run."""
    torch.manual_seed(0)
    noise = _Distribution(torch.randn(2, 3))
    noise.init_distribution("normal")
    layer = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step() -> None:
        noise.normal_()
        optimizer.zero_grad()
        layer(noise).sum().backward()
        optimizer.step()

    step()  # the truth: it runs
    values, weights = noise.clone(), layer.weight.detach().clone()
    result = tool(step)
    assert "raised" not in str(result), str(result)
    assert torch.equal(noise, values) and torch.equal(layer.weight, weights) and noise.dist_type == "normal"


class _CallableTrainer(_LoggingTrainer):
    """A trainer whose ``__call__`` is its step (its parent's), the batch kept on it."""

    def __init__(self, batch: torch.Tensor) -> None:
        super().__init__()
        self.batch = batch

    def __call__(self) -> None:
        self.train_step(self.batch)


_GLOBAL_TRAINER = _CallableTrainer(torch.randn(4, 3))


@pytest.mark.parametrize("handed", ["the object", "a lambda calling a global one"])
def test_an_object_whose_call_is_the_step_is_read_and_put_back_as_its_method_is(handed: str) -> None:
    """``bt.diagnose(stepper)``, an object whose ``__call__`` trains: "healthy", its running total unseen, and the
    runs left ``running_loss`` a tensor with their graphs and ``steps`` at 3; through ``lambda: stepper()`` on a
    global the note came but the object stayed changed (a callable global was not read as state). The truth (no
    helpers): three plain calls leave ``running_loss`` with a graph."""
    torch.manual_seed(0)
    trainer = _CallableTrainer(torch.randn(4, 3)) if handed == "the object" else _GLOBAL_TRAINER
    trainer.running_loss, trainer.steps = 0.0, 0
    step = trainer if handed == "the object" else (lambda: _GLOBAL_TRAINER())
    result = diagnose(step)
    assert trainer.running_loss == 0.0 and trainer.steps == 0, vars(trainer)
    assert any("running_loss" in item.label for item in result.report.items), str(result)


@pytest.mark.parametrize("broken", ["judge.failsafe.judge", "steps.audit.audit_report", "steps.carried.carried_report"])
def test_every_step_tool_says_when_its_own_judgment_fails_and_raises_nothing_into_the_learners_code(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bt.audit_retain_graph`` and ``bt.find_carried_graph`` had no guard: an error of the judgment's own code
    (``judge`` itself, or the report each builds) went up into the learner's code; ``bt.diagnose`` guarded only its
    report. The truth: the step's runs still happen and are put back, and each tool says it could not judge and
    claims nothing (no "can go", no "no graph carried", no health)."""
    module, name = broken.rsplit(".", 1)

    def planted(*args: Any, **kwargs: Any) -> Any:
        raise IndexError("a planted failure")

    for where in (f"backward_twice.{module}", "backward_twice.steps.diagnose"):  # diagnose holds the reports' builders
        if where.endswith("diagnose") and module.startswith("judge"):
            continue
        monkeypatch.setattr(importlib.import_module(where), name, planted)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()

    def train_step() -> None:
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward(retain_graph=True)
        optimizer.step()

    said = "backward-twice could not judge the runs of train_step (an error of its own: IndexError: a planted failure)"
    diagnosis = diagnose(train_step, models=model, optimizers=optimizer)
    audit = audit_retain_graph(train_step, models=model, optimizers=optimizer)
    carried = find_carried_graph(train_step, models=model, optimizers=optimizer)
    assert torch.equal(model.weight, before)
    if broken != "steps.carried.carried_report":
        assert audit.summary() == said and repr(audit).startswith(f"retain_graph audit: {said}"), repr(audit)
        assert not audit.calls and not audit.lines
    if broken != "steps.audit.audit_report":
        assert carried.verdict() == said and str(carried) == said and not carried.found, str(carried)
    assert diagnosis.verdict == said and not diagnosis.healthy and not diagnosis.items, diagnosis.verdict


def _gallery_variant(tmp_path: Path, name: str, *changes: tuple[str, str]) -> Any:
    """The gallery module ``name`` with each (line as published, lines in its place) changed, imported from
    ``tmp_path``."""
    source = (Path(__file__).parent / "gallery" / f"{name}.py").read_text(encoding="utf-8")
    for published, changed in changes:
        assert source.count(published + "\n") == 1, published
        source = source.replace(published + "\n", changed)
    (tmp_path / f"{name}_variant.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"{name}_variant", tmp_path / f"{name}_variant.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_carried_graph_whose_step_first_meets_a_changed_saved_tensor_gets_the_in_place_error_as_written(
    tmp_path: Path,
) -> None:
    """pyg's TGN without its ``memory.detach()``: the step as written raises PyTorch's in-place error at run 3 (a
    node its backward runs first saved a tensor since changed in place), before it reaches iteration 1's freed graph.
    The step tools, which keep every call's buffers to read the walks, raised "backward through the graph a second
    time" at the freed node instead: the wrong error, and a "why" about buffers the step as written never reaches."""
    module = _gallery_variant(tmp_path, "tgn_memory_detach", ("    memory.detach()  # @detach", ""))
    step = module.step_function(module.build())
    with pytest.raises(RuntimeError) as as_written:
        for _ in range(3):
            step()
    assert "modified by an inplace operation" in str(as_written.value)
    for tool in (diagnose, find_carried_graph, audit_retain_graph):
        state = module.build()
        models = [value for value in state.values() if isinstance(value, nn.Module)]
        optimizers = [value for value in state.values() if isinstance(value, torch.optim.Optimizer)]
        report = str(tool(module.step_function(state), models=models, optimizers=optimizers))
        assert "second time" not in report, report
        if tool is not audit_retain_graph:  # the audit's two runs end before run 3
            assert "modified by an inplace operation" in report, report


def test_a_tuple_carried_into_the_next_iteration_is_no_note_as_well(tmp_path: Path) -> None:
    """pytorch-ntm's copy task with ``net.init_sequence`` called once, before the loop: diagnose's item 1 was the
    carried ``previous_state`` (its items), and a note said the same tuple holds graphs no later backward walks."""
    once = "    net.init_sequence(2)\n    return {"
    module = _gallery_variant(
        tmp_path,
        "ntm_copy_task_init_sequence",
        ("    net.init_sequence(batch_size)  # @init_sequence", ""),
        (
            '    return {"net": net, "criterion": nn.BCELoss(), "optimizer": optimizer, "loader": loader, "batch": 0,',
            once + '"net": net, "criterion": nn.BCELoss(), "optimizer": optimizer, "loader": loader, "batch": 0,\n',
        ),
    )
    state = module.build()
    models = [value for value in state.values() if isinstance(value, nn.Module)]
    optimizers = [value for value in state.values() if isinstance(value, torch.optim.Optimizer)]
    report = str(diagnose(module.step_function(state), models=models, optimizers=optimizers))
    assert "`state['net'].previous_state` carries iteration 1's graph into iteration 2" in report, report
    assert "no later backward walks them" not in report, report
    assert "note" not in report.splitlines()[0], report


def test_a_models_growing_state_read_from_the_callers_dict_is_one_note_per_tensor(tmp_path: Path) -> None:
    """RealNVP's BatchNorm with its running statistics kept with their graphs (h69b), its model handed to diagnose
    from the caller's dict: every note came twice, under the step's ``model.model[1].running_mean`` and under the
    caller's ``state['model'].model[1].running_mean`` (16 notes for 8 tensors)."""
    module = _gallery_variant(
        tmp_path,
        "realnvp_2d_moons",
        ("        self.running_mean = m", "        self.running_mean = 0.9 * self.running_mean + 0.1 * m\n"),
        ("        self.running_var = v", "        self.running_var = 0.9 * self.running_var + 0.1 * v\n"),
    )
    state = module.build()
    report = str(diagnose(module.step_function(state), models=[state["model"]], optimizers=[state["optimizer"]]))
    assert report.startswith("backward-twice: 8 notes ("), report
    assert "state['model'].model[1].running_mean" not in report, report
