"""Verdicts of ``with watch():`` on loop shapes the tool was once wrong on, each with its truth first established
without the tool (run the loop; apply a fix and run; count the passes): the name that carries a graph when two names
held one tensor, one finding per carried tensor, a retain that ``create_graph=True`` makes redundant, passes with no
backward call, a loop inside the closure an optimizer's ``step`` calls, a running total kept as a tensor (a note that
grows), and an actor-critic's in-place error (no GAN advice). (No note for names each iteration rebinds:
tests/test_learner_scripts.py, where they are a script's.)"""

from __future__ import annotations

import collections
import contextlib
import copy
import inspect
import re
import runpy
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from backward_twice.report.items import line_number
from backward_twice.watcher import watch


def _smoothed(fix: Callable[[dict[str, torch.Tensor | None]], None] | None = None) -> None:
    """A smoothed loss (the knowledge-distillation tutorial's train(), plus a moving average of the loss): ``smooth``
    starts as iteration 1's ``loss`` itself, and carries its graph on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    names: dict[str, torch.Tensor | None] = {"smooth": None}
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 3, (4,)))
        names["loss"] = loss
        if fix is not None:
            fix(names)
        loss = names["loss"]
        smooth = loss if names["smooth"] is None else 0.9 * names["smooth"] + 0.1 * loss
        names["smooth"] = smooth
        smooth.backward()
        optimizer.step()


def _carried_smooth() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    smooth = None
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 3, (4,)))
        smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
        smooth.backward()
        optimizer.step()


def _detach(name: str) -> Callable[[dict[str, torch.Tensor | None]], None]:
    def fix(names: dict[str, torch.Tensor | None]) -> None:
        value = names[name]
        names[name] = None if value is None else value.detach()

    return fix


def test_the_carrier_is_the_name_the_loop_reads_before_it_rebinds_it_not_one_it_rebinds_first() -> None:
    with pytest.raises(RuntimeError, match="second time"):  # as written
        _smoothed()
    _smoothed(_detach("smooth"))  # detaching smooth at the top of each pass runs
    with pytest.raises(RuntimeError, match="does not require grad"):  # detaching loss breaks the step
        _smoothed(_detach("loss"))
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _carried_smooth()
    [item] = w.report.items
    assert item.label.startswith("`smooth` carries iteration 1's graph into iteration 2"), item.label
    # smooth starts as None: a detach where it comes in would fail in iteration 1
    assert item.fix == "add `smooth = smooth.detach()` at the end of each iteration", item.fix


def _running_mean(retain: bool, detach: bool) -> list[float]:
    """A running mean of features carried across iterations, with the forum's band-aid on the backward."""
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 4)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.05)
    running_mean = torch.zeros(4)
    grads = []
    for _ in range(5):
        feats = encoder(torch.randn(8, 6))
        if detach:
            running_mean = running_mean.detach()
        running_mean = 0.9 * running_mean + 0.1 * feats.mean(0)
        loss = ((feats - running_mean) ** 2).mean()
        optimizer.zero_grad()
        loss.backward(retain_graph=retain)
        optimizer.step()
        grads.append(encoder.weight.grad.abs().sum().item())
    return grads


def test_a_carrier_rebound_every_iteration_is_one_finding_not_one_per_iteration() -> None:
    with pytest.raises(RuntimeError):  # without the band-aid the carried graph breaks iteration 2
        _running_mean(retain=False, detach=False)
    assert _running_mean(retain=True, detach=False) != _running_mean(retain=False, detach=True)  # it trains wrong
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 4)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.05)
    running_mean = torch.zeros(4)
    with watch() as w:
        for _ in range(5):
            feats = encoder(torch.randn(8, 6))
            running_mean = 0.9 * running_mean + 0.1 * feats.mean(0)
            loss = ((feats - running_mean) ** 2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    assert str(w).startswith("backward-twice: 1 thing to fix (5 iterations watched)"), str(w)
    [item] = w.report.items
    assert item.label.startswith("`running_mean` carries iteration 1's graph"), item.label
    assert "no name of yours" not in str(w)


def test_a_retain_beside_create_graph_can_go_because_create_graph_keeps_the_graph() -> None:
    """WGAN-GP's gradient penalty (eriklindernoren/PyTorch-GAN): the later ``d_loss.backward()`` does walk what the
    ``autograd.grad`` call kept, yet removing ``retain_graph=True`` changes nothing: ``create_graph`` keeps it."""

    def critic_step(retain: bool | None) -> float:
        torch.manual_seed(0)
        critic = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        points = torch.randn(6, 4, requires_grad=True)
        keywords = {} if retain is None else {"retain_graph": retain}
        (gradients,) = torch.autograd.grad(critic(points).sum(), points, create_graph=True, **keywords)
        d_loss = critic(torch.randn(6, 4)).mean() + ((gradients.norm(2, dim=1) - 1) ** 2).mean()
        d_loss.backward()
        return critic[0].weight.grad.sum().item()

    assert critic_step(True) == critic_step(None)  # without it: the same
    with pytest.raises(RuntimeError, match="second time"):  # d_loss.backward() walks what the grad call kept
        critic_step(False)
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with watch() as w:
        for _ in range(3):
            points = torch.randn(6, 4, requires_grad=True)
            (gradients,) = torch.autograd.grad(critic(points).sum(), points, create_graph=True, retain_graph=True)
            d_loss = critic(torch.randn(6, 4)).mean() + ((gradients.norm(2, dim=1) - 1) ** 2).mean()
            d_loss.backward()
    [item] = w.report.items
    assert "create_graph=True keeps the graph anyway" in item.label, item.label
    assert "no later backward walked" not in item.why, item.why
    assert item.fix.startswith("remove retain_graph=True at line ")
    assert not item.to_fix and w.report.headline.startswith("backward-twice: 1 note (3 iterations watched)")  # the
    # published loop is right as it stands: nothing to fix


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_passes_without_a_backward_still_count_as_iterations() -> None:
    """A replay buffer that trains once it holds 4 items (passes 1-4 have no backward), then a step every other
    pass (``if step % 2``): 7 passes of the loop ran, 2 with a backward. (A pass after the last backward is not
    seen: nothing of the watch runs there.)"""
    model, optimizer = _model_and_optimizer()
    buffer: list[torch.Tensor] = []
    ran = []
    with watch() as w:
        for step in range(7):
            ran.append(step)
            buffer.append(torch.randn(1, 3))
            if len(buffer) <= 3 or step % 2:
                continue
            loss = model(torch.cat(buffer[-3:])).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert len(ran) == 7
    assert str(w).startswith("backward-twice: healthy (7 iterations watched, 2 backward calls"), str(w)


def test_a_loop_inside_the_closure_an_optimizer_step_calls_is_not_the_iteration() -> None:
    """Lightning's test_step_with_optimizer_closure, in plain PyTorch: the closure runs two losses in a loop, and the
    optimizer's ``step`` calls it; an iteration is a pass of the loop that calls ``step``."""
    model, optimizer = _model_and_optimizer()
    with watch() as w:
        for _ in range(3):

            def closure() -> torch.Tensor:
                losses = []
                for backward_idx in range(2):
                    loss = model(torch.randn(4, 3)).pow(2).mean()
                    losses.append(loss)
                    loss.backward(retain_graph=backward_idx == 0)
                return torch.stack(losses).mean()

            optimizer.step(closure)
            optimizer.zero_grad()
    text = str(w)
    assert text.startswith("backward-twice: 1 thing to fix (3 iterations watched)"), text
    assert "`retain_graph=backward_idx == 0` at line" in text and "note" not in text


def test_a_loop_whose_body_rebinds_its_own_variable_counts_its_passes_and_stops_where_asked() -> None:
    """yunjey/pytorch-tutorial's feedforward network: ``images = images.reshape(-1, 64)`` in the body."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(4, 8, 8), torch.randint(0, 10, (4,))) for _ in range(5)]
    ran = []
    with watch(iterations=3) as w:
        for images, labels in batches:
            images = images.reshape(-1, 64)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ran.append(labels)
    assert len(ran) == 3
    assert str(w).startswith("backward-twice: healthy (3 iterations watched, then stopped as asked, 3 backward"), str(w)


@pytest.mark.parametrize("iterations", [None, 3, 4])
def test_an_inner_loop_that_rebinds_the_outer_loops_variable_counts_its_own_passes(iterations: int | None) -> None:
    """discuss.pytorch.org/t/120497's ensemble loop: ``images = images.reshape(...)`` inside the inner loop over
    models rebinds the outer loop's variable, which then changed at every event and read as a new outer pass: 9
    passes were "10 iterations", and ``iterations=3`` stopped after 2. The outer loop's counter (``j``) tells its
    passes; the name the body rebinds tells nothing."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [torch.randn(2, 4) for _ in range(3)]
    ran = []
    with watch(iterations=iterations) as w:
        for j, images in enumerate(loader):
            for i in range(3):
                images = images.reshape(2, 4)
                ran.append((j, i))
                loss = model(images).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert len(ran) == (iterations or 9)  # truth: the passes that ran
    watched = f"{iterations or 9} iterations watched" + (", then stopped as asked" if iterations else "")
    assert str(w).startswith(f"backward-twice: healthy ({watched}, {iterations or 9} backward calls"), str(w)


def _encoder(fix: str | None) -> float:
    """The PyTorch seq2seq tutorial's encoder, its hidden state carried from one sentence to the next: detached at the
    end of each iteration, or (wrongly) where it comes in, inside the loop over the sentence's words."""
    torch.manual_seed(0)
    embedding, gru = torch.nn.Embedding(10, 4), torch.nn.GRU(4, 4)
    optimizer = torch.optim.SGD([*embedding.parameters(), *gru.parameters()], lr=0.1)
    encoder_hidden = torch.zeros(1, 1, 4)
    for _ in range(3):
        words = torch.randint(0, 10, (5,))
        optimizer.zero_grad()
        outputs = []
        for word in words:
            if fix == "where it comes in":
                encoder_hidden = encoder_hidden.detach()
            output, encoder_hidden = gru(embedding(word).view(1, 1, -1), encoder_hidden)
            outputs.append(output)
        torch.cat(outputs).pow(2).mean().backward()
        optimizer.step()
        if fix == "at the end":
            encoder_hidden = encoder_hidden.detach()
    return gru.weight_ih_l0.grad.norm().item()


def test_a_carrier_read_in_a_loop_over_time_steps_is_detached_at_the_end_of_each_iteration() -> None:
    with pytest.raises(RuntimeError, match="second time"):
        _encoder(None)
    assert _encoder("where it comes in") != _encoder("at the end")  # inside the word loop it cuts each sentence too
    torch.manual_seed(0)
    embedding, gru = torch.nn.Embedding(10, 4), torch.nn.GRU(4, 4)
    optimizer = torch.optim.SGD([*embedding.parameters(), *gru.parameters()], lr=0.1)
    encoder_hidden = torch.randn(1, 1, 4)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        for _ in range(3):
            words = torch.randint(0, 10, (5,))
            optimizer.zero_grad()
            outputs = []
            for word in words:
                output, encoder_hidden = gru(embedding(word).view(1, 1, -1), encoder_hidden)
                outputs.append(output)
            torch.cat(outputs).pow(2).mean().backward()
            optimizer.step()
    [item] = w.report.items
    assert item.label.startswith("`encoder_hidden` carries iteration 1's graph"), item.label
    assert item.fix == "add `encoder_hidden = encoder_hidden.detach()` at the end of each iteration", item.fix


def _running_loss(iterations: int) -> torch.Tensor:
    """The CIFAR-10 tutorial's loop with ``running_loss += loss`` (no ``.item()``), after the step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    running_loss = torch.zeros(())
    for _ in range(iterations):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
        loss.backward()
        optimizer.step()
        running_loss += loss
    return running_loss


def _nodes(tensor: torch.Tensor) -> int:
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(child for child, _ in node.next_functions)
    return len(seen)


def test_a_running_total_kept_as_a_tensor_after_the_step_is_a_note_that_grows() -> None:
    assert _nodes(_running_loss(8)) > _nodes(_running_loss(4)) > _nodes(_running_loss(2))  # one graph more each pass
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    running_loss = torch.zeros(())
    with watch() as w:
        for _ in range(6):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
            loss.backward()
            optimizer.step()
            running_loss += loss
    text = str(w)
    assert text.startswith("backward-twice: 1 note (6 iterations watched)"), text
    assert "1. `running_loss` keeps one more iteration's graph alive every iteration" in text
    assert "running_loss += loss" in text and "grows here" in text


def test_an_actor_critic_in_place_error_gets_no_gan_advice() -> None:
    """An A2C step whose actor loss reuses the critic's value after the critic's step: the in-place error names the
    stale forward and the step, and says nothing of a GAN. The actor loss trains the actor through ``log_probs`` and
    reaches the critic only through ``advantage``: its detach is the fix, as pytorch/examples' actor_critic.py keeps
    the advantage a number (``R - value.item()``)."""
    torch.manual_seed(0)
    actor = torch.nn.Linear(4, 2)
    critic = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(2):
            state = torch.randn(6, 4)
            value = critic(state)
            advantage = torch.randn(6, 1) - value
            critic_optimizer.zero_grad()
            advantage.pow(2).mean().backward(retain_graph=True)
            critic_optimizer.step()
            log_probs = torch.log_softmax(actor(state), -1)[:, :1]
            actor_optimizer.zero_grad()
            (-(log_probs * advantage)).mean().backward()
            actor_optimizer.step()
    fix = w.report.items[0].fix
    assert fix.startswith("use `advantage.detach()` in the loss line ") and "after the step" not in fix, fix
    assert "GAN" not in str(w), str(w)


class _Critic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        features = torch.tanh(self.hidden(state))
        return self.out(features)


def _two_critic_calls() -> tuple[Any, str]:
    """DDPG's shape: one critic module, two calls in the loop (the value of the batch and of the next state), the
    first reused after the critic's step. Returns the watch and the line of the stale call."""
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(4, 4), _Critic()
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(2):
            state, next_state = torch.randn(6, 4), torch.randn(6, 4)
            value = critic(state)
            target = critic(next_state).detach()
            critic_optimizer.zero_grad()
            (value - target).pow(2).mean().backward(retain_graph=True)
            critic_optimizer.step()
            actor_optimizer.zero_grad()
            (-(value * actor(state).mean(-1, keepdim=True))).mean().backward()
            actor_optimizer.step()
    return w, "value = critic(state)"


def test_the_stale_line_of_an_in_place_error_is_the_loops_call_not_the_models_return() -> None:
    """The graph the step made stale was built in the model's ``forward`` (``return self.out(features)``), which runs
    for both critic calls: the report names the loop's call that built it. The actor's loss reaches the critic only
    through ``value``: its detach is the fix."""
    w, stale = _two_critic_calls()
    item = w.report.items[0]
    number = next(i for i, line in enumerate(inspect.getsource(_two_critic_calls).splitlines()) if stale in line)
    first = inspect.getsourcelines(_two_critic_calls)[1]
    assert item.label.startswith(f"this backward goes through line {first + number}, computed before the step"), item
    assert item.fix.startswith("use `value.detach()` in the loss line "), item.fix
    assert any(stale in line.code for line in item.lines), [line.code for line in item.lines]
    assert not any("return self.out(features)" in line.code for line in item.lines), item.lines


def test_where_the_old_graph_comes_in_is_a_line_that_ran() -> None:
    """word_language_model's ``repackage_hidden`` behind a flag that is off: the line that reads ``hidden`` first in
    the body never runs, so the graph comes in at the RNN's call, and the detach goes before that line."""
    torch.manual_seed(0)
    rnn = torch.nn.RNN(3, 4)
    optimizer = torch.optim.SGD(rnn.parameters(), lr=0.01)
    repackage = False
    hidden = torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        for _ in range(3):
            inputs = torch.randn(5, 2, 3)
            if repackage:
                hidden = hidden.detach()
            output, hidden = rnn(inputs, hidden)
            optimizer.zero_grad()
            output.pow(2).mean().backward()
            optimizer.step()
    item = w.report.items[0]
    assert "output, hidden = rnn(inputs, hidden)" in item.lines[0].code, item.lines
    call = next(
        n
        for n, line in enumerate(inspect.getsource(test_where_the_old_graph_comes_in_is_a_line_that_ran).splitlines())
        if "= rnn(inputs" in line
    )
    number = inspect.getsourcelines(test_where_the_old_graph_comes_in_is_a_line_that_ran)[1] + call
    assert item.fix == f"add `hidden = hidden.detach()` before line {number}", item.fix


class _LanguageModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.decoder = torch.nn.LSTM(4, 4), torch.nn.Linear(4, 1)

    def forward(self, inputs: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> Any:
        output, hidden = self.rnn(inputs, hidden)
        return self.decoder(output), hidden


def test_one_carrier_is_one_item_however_many_iterations_show_it() -> None:
    """word_language_model without ``repackage_hidden``, with the forum's band-aid and its manual update: the
    carried ``hidden`` is seen in iteration 1's graph (built in ``forward``, while lines are traced) and again in
    later ones (built at the loop's line, once they are not): one cause, one item."""
    torch.manual_seed(0)
    model = _LanguageModel()
    hidden = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    with watch() as w:
        for _ in range(6):
            model.zero_grad()
            output, hidden = model(torch.randn(3, 2, 4), hidden)
            output.pow(2).mean().backward(retain_graph=True)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    assert str(w).startswith("backward-twice: 1 thing to fix (6 iterations watched)"), str(w)
    assert w.report.items[0].label.startswith("`hidden` carries iteration 1's graph into iteration 2"), str(w)


def test_both_outputs_of_an_lstm_cell_are_detached_by_the_fix() -> None:
    """ikostrikov/pytorch-a3c's rollout without ``cx = cx.detach(); hx = hx.detach()``: ``hx`` and ``cx`` hold one
    node's outputs, and the fix that detaches only one still raises through the other."""
    torch.manual_seed(0)
    cell, head = torch.nn.LSTMCell(4, 8), torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-3)
    hx, cx = torch.zeros(1, 8), torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        for _ in range(3):
            loss = torch.zeros(())
            for _ in range(3):
                hx, cx = cell(torch.randn(1, 4), (hx, cx))
                loss = loss + head(hx).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    item = w.report.items[0]
    assert "`hx = hx.detach()`" in item.fix and "`cx = cx.detach()`" in item.fix, item.fix
    assert " carry iteration 1's graph into iteration 2" in item.label, item.label


def test_a_growing_list_is_one_note_not_one_per_item() -> None:
    """Bjarten/early-stopping-pytorch's shape, keeping each batch's ``loss`` in ``losses``: the list is the cause;
    ``losses[1]``, ``losses[2]``, ... each hold one graph and are not notes of their own."""
    torch.manual_seed(0)
    model, criterion = torch.nn.Linear(4, 1), torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(3, 4), torch.randn(3, 1)) for _ in range(3)]
    losses: list[torch.Tensor] = []
    with watch() as w:
        for _ in range(3):
            for inputs, targets in batches:
                optimizer.zero_grad()
                loss = criterion(model(inputs), targets)
                loss.backward()
                optimizer.step()
                losses.append(loss)
            with torch.no_grad():
                criterion(model(batches[0][0]), batches[0][1])
    assert str(w).startswith("backward-twice: 1 note (9 iterations watched)"), str(w)
    assert w.report.items[0].label.startswith("`losses` keeps one more iteration's graph alive"), str(w)


def test_an_in_place_error_in_iteration_2_names_the_stale_line_too() -> None:
    """TD3's delayed actor update (sfujim/TD3): the actor's Q is computed before the critic's step, and used only every
    second iteration, so the error comes in iteration 2, past the passes whose lines are traced; the node at the same
    place in iteration 1 gives the line."""
    torch.manual_seed(0)
    actor = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    critic = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for iteration in range(3):
            state, action, target = torch.randn(4, 3), torch.randn(4, 2), torch.randn(4, 1)
            q = critic(torch.cat([state, action], 1))
            actor_q = critic(torch.cat([state, actor(state)], 1))
            critic_optimizer.zero_grad()
            ((q - target) ** 2).mean().backward()
            critic_optimizer.step()
            if iteration % 2 == 1:
                actor_optimizer.zero_grad()
                (-actor_q.mean()).backward()
                actor_optimizer.step()
    item = w.report.items[0]
    assert any("actor_q = critic(torch.cat([state, actor(state)], 1))" in line.code for line in item.lines), item
    assert item.fix.startswith("compute line ") and "again after the step at line " in item.fix, item.fix


def test_a_graph_rebuilt_each_iteration_is_carried_without_piling_up() -> None:
    """SAC's automatic entropy tuning (pranz24/pytorch-soft-actor-critic): ``alpha = log_alpha.exp()`` at the end
    of an update is used by the next update's target under ``torch.no_grad()`` and by its policy loss. Each backward
    walks the previous update's one-node graph: carried, but it does not grow, and nothing comes in under no_grad."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(3, 1)
    policy_optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=1e-3)
    alpha: Any = 0.2
    with watch() as w:
        for _ in range(6):
            states = torch.randn(8, 3)
            with torch.no_grad():
                target = states.sum(1, keepdim=True) - alpha * 0.5
            log_pi = policy(states)
            policy_loss = (alpha * log_pi - target).pow(2).mean()
            policy_optimizer.zero_grad()
            policy_loss.backward()
            policy_optimizer.step()
            alpha_loss = -(log_alpha * (log_pi + 1.0).detach()).mean()
            alpha_optimizer.zero_grad()
            alpha_loss.backward()
            alpha_optimizer.step()
            alpha = log_alpha.exp()
    item = w.report.items[0]
    assert item.label.startswith("`alpha` carries iteration 1's graph into iteration 2"), str(w)
    assert "policy_loss = (alpha * log_pi - target)" in item.lines[0].code, item.lines
    assert "does not pile up" in item.why and "grow" not in item.why.replace("does not pile up", ""), item.why


def _train_returning_a_tensor(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    optimizer.zero_grad()
    loss = model(torch.randn(2, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss / 3  # after the step: the pass's last event is behind it


def test_a_name_rebound_each_pass_to_a_tensor_built_after_the_step_is_no_note() -> None:
    """A ``train()`` that returns ``loss / 3`` instead of ``loss.item() / 3``, its caller rebinding ``loss`` each
    pass: ``loss`` holds one pass's graph at a time, and is no note."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(12):
            loss = _train_returning_a_tensor(model, optimizer)
    assert w.healthy, str(w)
    assert loss.grad_fn is not None


def test_a_running_total_reset_every_few_passes_is_not_said_to_hold_them_all() -> None:
    """The CIFAR-10 tutorial's ``running_loss += loss`` (without ``.item()``), printed and reset every 3 passes: it
    holds a few iterations' graphs at a time, not every iteration's."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    running_loss: Any = 0
    with watch() as w:
        for iteration in range(1, 13):
            optimizer.zero_grad()
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            running_loss += loss
            if iteration % 3 == 0:
                running_loss = 0
    (item,) = w.report.items
    assert item.label == "`running_loss` keeps several iterations' graphs alive at once", str(w)
    assert "until the loop resets it" in item.why and "holds them all" not in item.why, item.why


@pytest.mark.parametrize("every", [3, 4, 8])
@pytest.mark.parametrize("passes", [12, 24])
def test_a_total_added_to_before_the_backward_and_reset_every_k_passes_holds_several(every: int, passes: int) -> None:
    """ML2021 HW7's loop (pai4451/ML2021#2): ``train_loss += loss`` before the backward, reset every K passes. It
    was "holds them all" at K=4 and K=8 (read at the first backward, from passes 1-4, 8, 16: after a reset the total
    already holds that pass's graph, so no read saw it hold fewer). The truth: after each reset the total holds no
    graph, and at most the K passes' since."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loss: Any = 0
    with watch() as w:
        for step in range(1, passes + 1):
            loss = ((model(torch.randn(8, 4)) - torch.randn(8, 1)) ** 2).mean()
            train_loss += loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % every == 0:
                train_loss = 0
    (item,) = w.report.items
    assert item.label == "`train_loss` keeps several iterations' graphs alive at once", str(w)
    assert "until the loop resets it" in item.why and "holds them all" not in item.why, item.why


def test_a_list_grown_with_an_attribute_is_found_at_its_append(tmp_path: Any) -> None:
    """The transformers tutorial's loop keeping ``outputs.loss`` for logging: the line where ``losses`` grows is the
    ``append`` (not ``losses = []``, which builds nothing), and what it appends is ``outputs.loss``."""
    from backward_twice.judge.notes import growing_line

    script = tmp_path / "train.py"
    script.write_text(
        "losses = []\nfor batch in loader:\n    outputs = model(**batch)\n    losses.append(outputs.loss)\n"
    )
    assert growing_line("losses", str(script)) == (4, "losses.append(outputs.loss)", "outputs.loss", "append")


def _maml_second_order(meta_steps: int, watched: int | None = None) -> tuple[list[torch.Tensor], Any]:
    """MAML with second-order inner steps (``create_graph=True`` through ``torch.func.functional_call``): the inner
    ``for k`` loop sits two loops in from the meta step's backward. Returns the weights after the run, and the
    watch (None: run bare)."""
    from torch.func import functional_call

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    meta_optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = dict(model.named_parameters())
    context = watch(iterations=watched) if watched is not None else contextlib.nullcontext()
    with context as w:
        for _ in range(meta_steps):
            meta_optimizer.zero_grad()
            meta_loss: Any = 0.0
            for _ in range(2):
                x_s, y_s, x_q, y_q = torch.randn(5, 4), torch.randn(5, 1), torch.randn(5, 4), torch.randn(5, 1)
                fast = dict(params)
                for _ in range(3):
                    loss = torch.nn.functional.mse_loss(functional_call(model, fast, (x_s,)), y_s)
                    grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
                    fast = {n: p - 0.1 * g for (n, p), g in zip(fast.items(), grads)}
                meta_loss = meta_loss + torch.nn.functional.mse_loss(functional_call(model, fast, (x_q,)), y_q)
            meta_loss.backward()
            meta_optimizer.step()
    return [p.detach().clone() for p in model.parameters()], w


def test_maml_stopped_after_n_iterations_stops_after_n_meta_steps_not_inside_the_inner_loop() -> None:
    """The watch is told the iterations before the meta backward ever ran: the inner loop is not the iteration,
    since its meta step's pass has a backward outside the loops inside it."""
    two_bare, _ = _maml_second_order(2)
    weights, w = _maml_second_order(6, watched=2)
    assert all(torch.equal(a, b) for a, b in zip(weights, two_bare))  # as after 2 bare meta steps
    assert w.healthy and "2 iterations watched, then stopped as asked, 14 backward calls" in str(w), str(w)


def test_a_cache_carried_whole_is_one_spelling_and_its_fix_as_printed_makes_the_loop_run() -> None:
    """The gallery's GPT-2 chat loop keeps the model's cache from step to step: the tensors that carry the old graph
    are the keys and values of each of its layers. They are spelled once (``layers[i]``) and detached by one
    statement; the truth: that statement, as the report prints it, run at the end of each iteration of the bare loop
    makes it run (it raises without)."""
    pytest.importorskip("transformers")
    from gallery import gpt2_cache_carried as loop

    state = loop.build()
    with contextlib.suppress(RuntimeError), watch() as w:
        loop.run(state, 3)
    (item,) = w.report.items
    owner = "state['past_key_values'].layers"
    assert item.label.startswith(f"`{owner}[i].keys` and `{owner}[i].values` (i = 0, 1) carry"), item.label
    assert "follows them into iteration 1's graph" in item.why, item.why
    statement = re.fullmatch(r"add `(.+)` at the end of each iteration", item.fix)
    assert statement is not None, item.fix
    assert (
        statement.group(1)
        == f"for layer in {owner}: layer.keys, layer.values = layer.keys.detach(), layer.values.detach()"
    )
    state = loop.build()
    with pytest.raises(RuntimeError, match="second time"):
        loop.run(state, 3)
    state = loop.build()
    for _ in range(3):
        loop.step(state)
        exec(statement.group(1), {"state": state})  # the fix as printed, run as the learner would


def test_what_the_loops_own_header_builds_from_a_generator_is_the_passs_own_graph() -> None:
    """``for feats, y in encoded(loader)``, whose generator runs the encoder for each batch: the encoder's graph is
    built by the ``for`` line, before the pass's first line, and was taken for a graph built before the loop and
    carried in, with the fix "compute `feats` inside the loop (or `feats = feats.detach()`)". The truth: the loop
    runs, and each backward reaches the encoder (a detach would leave its gradient None)."""
    torch.manual_seed(0)
    encoder, head = torch.nn.Linear(6, 4), torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    loader = [(torch.randn(8, 6), torch.randint(0, 2, (8,))) for _ in range(5)]

    def encoded(batches: list) -> Any:
        for x, y in batches:
            yield encoder(x), y

    reached = []
    with watch() as w:
        for feats, y in encoded(loader):
            loss = torch.nn.functional.cross_entropy(head(feats), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            reached.append(encoder.weight.grad is not None and bool(encoder.weight.grad.any()))
    assert reached == [True] * 5
    assert w.healthy and not w.verdicts.carried and w.verdicts.iterations_run == 5, str(w)


def test_a_carried_state_reset_in_place_after_the_step_is_one_item() -> None:
    """A recurrent actor-critic's band-aid: ``retain_graph=True`` against a carried ``hx``, and an episode reset in
    place after the step (``hx[done] = 0``). The reset puts a node no name holds in front of ``hx``'s graph, and a
    second item appeared: "a tensor no name of yours holds carries iteration 2's graph into iteration 3". The truth:
    the loop raises at iteration 3 as written and runs with ``hx = hx.detach()`` alone, the retain removed."""

    def recurrent(fix: bool) -> None:
        torch.manual_seed(0)
        cell, head = torch.nn.GRUCell(4, 8), torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=1e-2)
        hx = torch.zeros(3, 8)
        for update in range(6):
            hx = cell(torch.randn(3, 4), hx)
            loss = (head(torch.tanh(hx)) - 1.0).pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=not fix)
            optimizer.step()
            hx[torch.tensor([True, False, update % 2 == 1])] = 0.0
            if fix:
                hx = hx.detach()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        recurrent(fix=False)
    assert [c.name for c in w.verdicts.carried] == ["hx"], str(w)
    assert str(w).startswith("backward-twice: 1 thing to fix (3 iterations watched; the loop raised in iteration 3)")
    recurrent(fix=True)


class _RunningAverageMeter:
    """torchdiffeq's examples/ode_demo.py meter, fed the loss tensor instead of ``loss.item()``."""

    def __init__(self, momentum: float = 0.99) -> None:
        self.momentum, self.val, self.avg = momentum, None, 0.0

    def update(self, val: torch.Tensor) -> None:
        self.avg = val if self.val is None else self.avg * self.momentum + val * (1 - self.momentum)
        self.val = val


def test_a_meters_latest_value_is_no_note_beside_its_running_average() -> None:
    """A meter fed the loss tensor: its ``avg`` chains every pass's graph (a note), its ``val`` holds this pass's
    only, rebound at the next update. Both were notes: an object's attributes were grouped as one name. The truth:
    ``avg``'s graph reaches back to pass 1; ``val``'s to its own pass only."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    loss_meter = _RunningAverageMeter(0.97)
    with watch() as w:
        for _ in range(6):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 2)).abs().mean()
            loss.backward()
            optimizer.step()
            loss_meter.update(loss)
    assert loss_meter.val is loss and isinstance(loss_meter.avg, torch.Tensor) and loss_meter.avg.grad_fn is not None
    text = str(w)
    assert text.startswith("backward-twice: 1 note (6 iterations watched)"), text
    assert "1. `loss_meter.avg` keeps one more iteration's graph alive every iteration" in text, text
    assert "loss_meter.val" not in text


class _Hyper(torch.nn.Module):
    """g1910/HyperNetworks' shape (primary_net.py): a hypernetwork makes a layer's weights from a learned embedding,
    kept on the primary network by ``generate()``."""

    def __init__(self) -> None:
        super().__init__()
        self.hyper = torch.nn.Linear(4, 18)
        self.z = torch.nn.Parameter(torch.randn(4))
        self.W: torch.Tensor | None = None

    def generate(self) -> None:
        self.W = self.hyper(self.z).view(3, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.W is not None
        return torch.nn.functional.linear(x, self.W)


def test_weights_a_method_builds_before_the_loop_are_built_at_the_loops_call_of_it() -> None:
    """Weights generated once an epoch (``net.generate()`` before the batch loop) and reused by every batch: "built
    here, before the loop" was ``net = ...``, the line that made the network (its ``W`` was None then), since a
    node built before the loop was never looked up among the lines the tracer logged. The truth: the second batch
    raises, and calling ``net.generate()`` inside the batch loop (the printed "compute `net.W` inside the loop")
    runs."""

    def train(inside: bool) -> None:
        torch.manual_seed(0)
        net = _Hyper()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            net.generate()
            for _ in range(3):
                if inside:
                    net.generate()
                optimizer.zero_grad()
                net(torch.randn(5, 6)).pow(2).mean().backward()
                optimizer.step()

    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        train(inside=False)
    text = str(w)
    assert "1. `net.W` carries the graph built before the loop into iteration 2" in text, text
    built = text.splitlines()[2:4]
    assert built[0].endswith("| net.generate()") and built[1].endswith("| built here, before the loop"), text
    assert "fix: compute `net.W` inside the loop" in text, text
    train(inside=True)


class _Policy(torch.nn.Module):
    """pytorch/examples' reinforcement_learning/actor_critic.py: one trunk, an action head and a value head, and the
    ``SavedAction(log_prob, value)`` of each step kept for the episode's end."""

    def __init__(self) -> None:
        super().__init__()
        self.affine = torch.nn.Linear(4, 16)
        self.action_head, self.value_head = torch.nn.Linear(16, 2), torch.nn.Linear(16, 1)
        self.saved_actions: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.affine(x))
        return torch.softmax(self.action_head(x), dim=-1), self.value_head(x)


def _actor_critic(clear: str) -> list[float]:
    """Four episodes of five steps; ``clear``: "" (the learner forgot ``del model.saved_actions[:]``), "published"
    (the example's own line) or "printed" (the tool's fix). Returns the weights."""
    from collections import namedtuple

    saved_action = namedtuple("SavedAction", ["log_prob", "value"])
    torch.manual_seed(0)
    model = _Policy()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)

    def finish_episode(rewards: list[float]) -> None:
        saved_actions = model.saved_actions
        returns = torch.tensor(rewards)
        policy_losses, value_losses = [], []
        for (log_prob, value), reward in zip(saved_actions, returns):
            policy_losses.append(-log_prob * (reward - value.item()))
            value_losses.append(torch.nn.functional.smooth_l1_loss(value, reward.reshape(1)))
        optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        loss.backward()
        optimizer.step()
        if clear == "printed":
            model.saved_actions.clear()
        if clear == "published":
            del model.saved_actions[:]

    for _ in range(4):
        rewards = []
        for _ in range(5):
            probs, state_value = model(torch.randn(4))
            m = torch.distributions.Categorical(probs)
            action = m.sample()
            model.saved_actions.append(saved_action(m.log_prob(action), state_value))
            rewards.append(float(action))
        finish_episode(rewards)
    return [p for parameter in model.parameters() for p in parameter.flatten().tolist()]


def test_an_actor_critics_saved_actions_never_cleared_are_cleared_not_detached_item_by_item() -> None:
    """The example's ``del model.saved_actions[:]`` left out: the list of (log_prob, value) tuples kept every step's
    graph, and each tuple item and the ``for``'s ``log_prob`` and ``value`` were told to detach themselves
    (``saved_actions[0][1] = ...``: a namedtuple takes no item; and a detached log-prob trains nothing). The truth:
    episode 2 raises; with the printed ``model.saved_actions.clear()`` it runs to the published example's weights."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _actor_critic(clear="")
    text = str(w)
    assert text.startswith("backward-twice: 1 thing to fix (2 iterations watched"), text
    assert "1. `model.saved_actions` carries iteration 1's graph into iteration 2" in text, text
    assert "fix: clear `model.saved_actions` after each update (`model.saved_actions.clear()`)" in text, text
    assert "log_prob" not in text.split("fix:")[-1] and "[0][1]" not in text, text
    assert _actor_critic(clear="printed") == _actor_critic(clear="published")


class _TwoHeads(torch.nn.Module):
    """fungtion/DANN's shape (train/main.py): one trunk, a head per loss."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.a, self.b = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shared = self.trunk(x)
        return self.a(shared), self.b(shared)


def test_two_heads_losses_backward_one_by_one_are_told_to_sum_not_to_detach_the_second_heads_output() -> None:
    """Two heads' losses, one backward each: the first backward frees the trunk's buffers, which no name of the
    loop holds (they are the ``forward``'s). The fix began "use `out_b.detach()` in the loss line N's backward
    walks", a GAN's D-loss advice, though that loss never reads ``out_b`` (and a detached ``out_b`` leaves the second
    loss nothing to train: "does not require grad"). The truth: summed, one backward runs."""

    def train(summed: bool) -> None:
        torch.manual_seed(0)
        net = _TwoHeads()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            out_a, out_b = net(torch.randn(5, 4))
            loss_a, loss_b = out_a.pow(2).mean(), (out_b - 1).pow(2).mean()
            optimizer.zero_grad()
            if summed:
                (loss_a + loss_b).backward()
            else:
                loss_a.backward()
                loss_b.backward()
            optimizer.step()

    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        train(summed=False)
    fix = str(w).split("fix: ", 1)[-1]
    assert fix.startswith("sum the losses and call backward() once, or add retain_graph=True to line "), str(w)
    assert ".detach()" not in fix, str(w)
    train(summed=True)


def test_a_moving_window_of_losses_detaches_each_passs_loss_after_its_backward_not_as_it_is_kept() -> None:
    """A forum loop averaging the last three losses (``torch.stack(losses[-3:]).mean().backward()``): the fix was
    ``losses.append(loss.detach())``, after which the window has no graph ("element 0 of tensors does not require
    grad"). The truth: the second pass raises; with the printed line after the backward it runs, called healthy."""

    def train(after_the_step: Callable[[list[torch.Tensor]], None]) -> None:
        torch.manual_seed(0)
        net = torch.nn.Linear(5, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        losses = []
        for _ in range(6):
            loss = (net(torch.randn(4, 5)) - torch.randn(4, 1)).pow(2).mean()
            losses.append(loss)
            smoothed = torch.stack(losses[-3:]).mean()
            optimizer.zero_grad()
            smoothed.backward()
            optimizer.step()
            after_the_step(losses)

    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        train(lambda losses: None)
    backward = next(i for i, line in enumerate(inspect.getsource(train).splitlines()) if "smoothed.backward()" in line)
    line = inspect.getsourcelines(train)[1] + backward
    assert f"fix: add `losses[-1] = losses[-1].detach()` after line {line}'s backward" in str(w), str(w)
    with watch() as w:
        train(_detach_the_last)
    assert w.healthy, str(w)


def _detach_the_last(losses: list[torch.Tensor]) -> None:
    losses[-1] = losses[-1].detach()  # the printed fix (in the loop's function it would be an item set, read anew)


def _accumulating(adds: bool) -> list[float]:
    """A forum's gradient accumulation: backward() every batch, a step every 4th; ``adds``: the learner's
    ``loss += ...``, else the printed fix, ``loss = ...``. Returns the weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss: torch.Tensor | int = 0
    for i in range(8):
        if adds:
            loss += torch.nn.functional.mse_loss(model(torch.randn(4, 6)), torch.randn(4, 1)) / 4
        else:
            loss = torch.nn.functional.mse_loss(model(torch.randn(4, 6)), torch.randn(4, 1)) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
            loss = 0
    return [p for parameter in model.parameters() for p in parameter.flatten().tolist()]


def test_a_loss_added_to_and_backwarded_every_batch_is_assigned_not_added_to() -> None:
    """``loss += criterion(...) / 4; loss.backward()`` every batch: the fix was "add a number instead (`loss +=
    loss.item()`)", the total's own name for the term. backward() already sums each batch's gradient into ``.grad``,
    so the truth is the same loop with ``loss = ...``: it runs, healthy."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _accumulating(adds=True)
    fix = str(w).split("fix: ", 1)[-1]
    assert fix.startswith("assign instead of adding (`loss = torch.nn.functional.mse_loss("), str(w)
    with watch() as w:
        _accumulating(adds=False)
    assert w.healthy, str(w)


def test_a_list_grown_by_a_number_before_the_loop_and_a_loss_in_it_grows_at_the_losss_line() -> None:
    """A history that starts with a baseline number (``history.append(... .item())`` under ``no_grad``) and then
    keeps each pass's loss tensor: "grows here" was the baseline's line, the first of the file's lines that append
    to ``history``. The truth: the baseline is a float; every graph the list holds came from the loop's append."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = [torch.randn(8, 6) for _ in range(4)]
    history: list[float | torch.Tensor] = []
    with torch.no_grad():
        history.append(model(batches[0]).pow(2).mean().item())  # a baseline before training
    with watch() as w:
        for x in batches:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(loss)
    assert [type(h).__name__ for h in history] == ["float"] + ["Tensor"] * 4
    text = str(w)
    grows = next(i for i, line in enumerate(text.splitlines()) if line.endswith("grows here"))
    assert text.splitlines()[grows - 1].endswith("| history.append(loss)"), text


def test_a_loss_cut_off_by_data_and_made_to_require_grad_trains_nothing_and_is_not_healthy() -> None:
    """arcface-pytorch#56's band-aid: the metric head computes on ``.data``, the backward raised "does not require
    grad", and ``loss.requires_grad = True`` silenced it. The loop was "healthy". The truth: no weight of the model
    gets a gradient (each ``.grad`` stays None) and the weights never move; without ``.data`` they do."""

    def train(cut: bool) -> tuple[torch.nn.Linear, bool]:
        torch.manual_seed(0)
        model = torch.nn.Linear(10, 4)
        before = model.weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            output = model(torch.randn(8, 10))
            loss = torch.nn.functional.cross_entropy(output.data if cut else output, torch.randint(0, 4, (8,)))
            if cut:
                loss.requires_grad = True
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model, torch.equal(before, model.weight)

    with watch() as w:
        model, unchanged = train(cut=True)
    assert unchanged and model.weight.grad is None
    text = str(w)
    assert text.startswith("backward-twice: 1 thing to fix (3 iterations watched)"), text
    assert "1. the backward trains nothing: the loss it is called on has no graph" in text, text
    assert not w.healthy
    with watch() as w:
        model, unchanged = train(cut=False)
    assert not unchanged and w.healthy, str(w)


def test_an_item_a_later_iteration_appends_is_built_at_the_append_not_at_the_lists_first_line() -> None:
    """A list of log-probabilities summed each iteration and never cleared: the item iteration 2 appended was
    "built in iteration 2 at ``log_probs = []``", the list's first line, since the line tracer logs only the first
    pass. The truth: each item is ``out.sum()`` of ``log_probs.append(out.sum())`` (the only line that makes one)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    log_probs = []
    with watch() as w:
        for _ in range(3):
            out = model(x)
            log_probs.append(out.sum())
            loss = torch.stack(log_probs).sum()
            model.zero_grad()
            loss.backward(retain_graph=True)
    built = {finding.name: finding.built_at.split(": ", 1)[1] for finding in w.verdicts.carried}
    assert built == {"log_probs[0]": "log_probs.append(out.sum())", "log_probs[1]": "log_probs.append(out.sum())"}


def _gan_step_without_detach(retain: bool) -> None:
    """pix2pix's D update on ``fake`` without ``.detach()``, kept walkable for G's update by the retain."""
    torch.manual_seed(0)
    generator, discriminator = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    g_optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
    d_optimizer = torch.optim.SGD(discriminator.parameters(), lr=0.1)
    for _ in range(3):
        fake = generator(torch.randn(4, 2))
        d_optimizer.zero_grad()
        discriminator(fake).mean().backward(retain_graph=retain)
        d_optimizer.step()
        g_optimizer.zero_grad()
        (-discriminator(fake).mean()).backward()
        g_optimizer.step()


def test_a_healthy_run_whose_retain_a_later_backward_needs_says_so_in_its_headline() -> None:
    """It said "healthy (..., nothing carried, no retain_graph=True to drop)" of a loop with a retain, which reads as
    if it had none. The truth: without the retain, G's backward raises in iteration 1."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _gan_step_without_detach(retain=False)
    with watch() as w:
        _gan_step_without_detach(retain=True)
    with open(__file__, encoding="utf-8") as source:
        line = next(n for n, text in enumerate(source, 1) if "(fake).mean().backward(retain_graph=" in text)
    assert str(w).startswith(
        f"backward-twice: healthy (3 iterations watched, 6 backward calls, nothing carried, "
        f"retain_graph=True at line {line} needed)"
    ), str(w)


class _Ema:
    """An EMA as published (``self.shadow[name] = param.data.clone()``; ``update()`` blends each parameter in),
    retyped as learners do: without ``.data`` or ``torch.no_grad()`` in ``update()``."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {name: p.data.clone() for name, p in model.named_parameters()}

    def update(self, model: torch.nn.Module) -> None:
        for name, param in model.named_parameters():
            new_average = (1.0 - self.decay) * param + self.decay * self.shadow[name]
            self.shadow[name] = new_average.clone()


def _ema_loop(passes: int) -> _Ema:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ema, optimizer = _Ema(model, 0.9), torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(passes):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(8, 5)), torch.randn(8, 1)).backward()
        optimizer.step()
        ema.update(model)
    return ema


def _nodes(tensor: torch.Tensor) -> int:
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def test_an_ema_shadow_dict_updated_with_autograd_on_is_one_note_of_the_dict_at_its_update_line() -> None:
    """It said "healthy": a key's dots (``ema.shadow['0.weight']``) were read as attributes below a submodule. The
    truth: each entry's graph grows with every update (node counts after 3 and 6 passes) and no backward walks it."""
    assert _nodes(_ema_loop(6).shadow["0.weight"]) > _nodes(_ema_loop(3).shadow["0.weight"]) > 1
    with watch() as w:
        ema = _ema_loop(6)
    line = inspect.getsourcelines(_Ema.update)[1] + 3
    assert str(w).startswith("backward-twice: 1 note (6 iterations watched)"), str(w)
    assert w.report.items[0].label == "`ema.shadow`'s 4 entries keep one more iteration's graph alive every iteration"
    assert f":{line}" in str(w) and "self.shadow[name] = new_average.clone()" in str(w), str(w)
    assert ema.shadow["0.weight"].grad_fn is not None  # watched, the loop left what it leaves bare


class _ActivationsAndGradients:
    """jacobgil/pytorch-grad-cam's activations_and_gradients.py: a forward hook appends each output, and
    ``__call__`` (never called while training) resets the lists."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.activations: list[torch.Tensor] = []
        layer.register_forward_hook(self.save_activation)

    def save_activation(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.activations.append(output)

    def __call__(self, x: torch.Tensor) -> None:
        self.activations = []


def test_a_list_a_callable_object_of_yours_grows_is_a_note_at_its_append() -> None:
    """It said "healthy": an object with a ``__call__`` was taken for a function and not looked into. The truth: the
    list holds one more output, with its graph, every pass."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    cam, optimizer = _ActivationsAndGradients(model[1]), torch.optim.SGD(model.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(5):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
            optimizer.step()
    assert len(cam.activations) == 5 and all(a.grad_fn is not None for a in cam.activations)
    assert str(w).startswith("backward-twice: 1 note (5 iterations watched)"), str(w)
    assert "`self.activations` keeps one more iteration's graph alive" in str(w), str(w)
    assert "self.activations.append(output.detach())" in str(w), str(w)


@pytest.mark.parametrize("iterations", [None, 2])
def test_a_loop_with_no_backward_counts_its_passes_by_its_steps(iterations: int | None) -> None:
    """Per-sample gradients by ``torch.func`` written into ``.grad`` (the per-sample-grads tutorial's DP-SGD use):
    it said "no backward call seen (1 iteration watched)" of 4 passes. The truth: the loop's 4 steps, 4 passes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def compute_loss(params: dict[str, torch.Tensor], sample: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(model, params, (sample[None],))
        return torch.nn.functional.cross_entropy(logits, target[None])

    per_sample = torch.func.vmap(torch.func.grad(compute_loss), in_dims=(None, 0, 0))
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(4)]
    passes = 0
    with watch(iterations=iterations) as w:
        for data, targets in batches:
            passes += 1
            grads = per_sample({k: v.detach() for k, v in model.named_parameters()}, data, targets)
            optimizer.zero_grad()
            for name, p in model.named_parameters():
                p.grad = grads[name].mean(0)
            optimizer.step()
    assert passes == (iterations or 4)
    watched = "2 iterations watched, then stopped as asked" if iterations else "4 iterations watched"
    assert str(w) == f"backward-twice: no backward call seen ({watched}): nothing to judge", str(w)


def test_an_ema_teachers_output_is_no_note_beside_its_parameters_growing_graph() -> None:
    """CuriousAI/mean-teacher's train() with ``update_ema_variables`` retyped without ``torch.no_grad()``: beside
    the parameters' item it gave "`ema_model_out` keeps one more iteration's graph alive", cited at the EMA update;
    detaching ``ema_model_out`` (as it said) leaves the growth as it is. The truth: the EMA's parameters carry the
    graph (their node count grows each pass); ``ema_model_out``, rebound each pass, grows only through them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ema_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    for param in ema_model.parameters():
        param.detach_()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    counts = []
    with watch() as w:
        for global_step in range(1, 5):
            ema_model_out = ema_model(torch.randn(4, 6))
            model_out = model(torch.randn(4, 6))
            consistency = torch.nn.functional.mse_loss(model_out.softmax(1), ema_model_out.detach().softmax(1))
            loss = torch.nn.functional.cross_entropy(model_out, torch.randint(0, 3, (4,))) + consistency
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            alpha = min(1 - 1 / (global_step + 1), 0.99)
            for ema_param, param in zip(ema_model.parameters(), model.parameters()):
                ema_param.mul_(alpha).add_(param, alpha=1 - alpha)
            counts.append(_nodes(ema_model[0].weight))
    assert counts == sorted(counts) and counts[-1] > counts[0], counts
    assert str(w).startswith("backward-twice: 1 thing to fix (4 iterations watched)"), str(w)
    assert w.report.items[0].label == "`ema_model`'s parameters hold a graph that grows every iteration", str(w)


class _SaveFeatures:
    """A forward hook's activation saver (``LayerActivations``/``SaveFeatures`` of style-transfer code): the hook
    appends each output to ``self.features``, which nothing clears."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.features: list[torch.Tensor] = []
        module.register_forward_hook(self.hook_fn)

    def hook_fn(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.features.append(output)


def test_a_list_a_hook_grows_and_every_backward_walks_is_one_carried_item_not_a_note_too() -> None:
    """An activation penalty summed over ``saver.features`` with the band-aid: beside the carried item it gave
    "`self.features` keeps one more iteration's graph alive ... `self.features.append(output.detach())`", which,
    applied, cuts the penalty out of the gradient. The truth: every backward walks the list (without the retain the
    second pass raises); it is one cause."""

    def run(retain: bool) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        saver, optimizer = _SaveFeatures(model[1]), torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            out = model(torch.randn(5, 6))
            loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 3, (5,)))
            loss = loss + 1e-2 * sum(f.pow(2).mean() for f in saver.features)
            optimizer.zero_grad()
            loss.backward(retain_graph=retain)
            optimizer.step()

    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(retain=False)
    with watch() as w:
        run(retain=True)
    assert str(w).startswith("backward-twice: 1 thing to fix (4 iterations watched)"), str(w)
    assert w.report.items[0].label.startswith("`saver.features` carries iteration 1's graph into iteration 2"), str(w)


def test_a_list_grown_in_two_branches_grows_at_the_one_that_ran() -> None:
    """``if keep_tensors: history.append(loss.detach()) else: history.append(loss)`` (Lightning's migration notes keep
    outputs so): it named the first branch, which never ran and is already the fix. The truth: the other branch
    runs each pass and keeps each loss with its graph."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    keep_tensors, history = False, []
    with watch() as w:
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(torch.randn(2, 3)).pow(2).mean()
            loss.backward()
            optimizer.step()
            if keep_tensors:
                history.append(loss.detach())
            else:
                history.append(loss)
    assert all(item.grad_fn is not None for item in history)
    assert "`history` keeps one more iteration's graph alive every iteration" in str(w), str(w)
    source, first = inspect.getsourcelines(test_a_list_grown_in_two_branches_grows_at_the_one_that_ran)
    line = first + next(i for i, text in enumerate(source) if text.strip() == "else:") + 1
    assert f"test_watch_verdicts.py:{line} | history.append(loss)\n" in str(w), str(w)


def _ema_update(ema_model: torch.nn.Module, model: torch.nn.Module, alpha: float, no_grad: bool) -> None:
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        for ema_param, param in zip(ema_model.parameters(), model.parameters()):
            ema_param.mul_(alpha).add_(param, alpha=1 - alpha)


def test_a_parameter_changed_in_place_with_autograd_recording_gets_torch_no_grad_at_that_line() -> None:
    """Mean teacher's EMA update on a teacher whose parameters require grad: it said "the loop raised RuntimeError,
    before retain_graph matters ... fix this error first". The truth: the update raises as written and runs under
    ``torch.no_grad()``."""
    torch.manual_seed(0)
    model, ema_model = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"), watch() as w:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 6)).pow(2).mean().backward()
            optimizer.step()
            _ema_update(ema_model, model, 0.99, no_grad=False)
    line = inspect.getsourcelines(_ema_update)[1] + 3
    assert f"1. line {line} changes a tensor that requires grad in place, with autograd recording" in str(w), str(w)
    assert f"fix: run line {line} under `with torch.no_grad():`" in str(w), str(w)
    _ema_update(ema_model, model, 0.99, no_grad=True)


def test_a_list_of_log_probs_the_loss_stacks_is_cleared_even_where_a_del_of_it_is_written() -> None:
    """REINFORCE's ``saved_log_probs`` stacked into the loss, with ``del saved_log_probs[:]`` written in a branch
    that does not run: the ``del`` was read as an indexed use, and the fix said "keep detached copies in
    `saved_log_probs` (...detach())", which leaves the loss no gradient ("element 0 of tensors does not require
    grad"). The truth: cleared after each update, the loop runs."""

    def run(clear: bool) -> None:
        torch.manual_seed(0)
        policy = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
        saved_log_probs, rewards, reset_each_episode = [], [], False
        for _ in range(3):
            distribution = torch.distributions.Categorical(logits=policy(torch.randn(4)))
            action = distribution.sample()
            saved_log_probs.append(distribution.log_prob(action))
            rewards.append(torch.tensor(1.0))
            policy_loss = -(torch.stack(saved_log_probs) * torch.stack(rewards)).mean()
            optimizer.zero_grad()
            policy_loss.backward()
            optimizer.step()
            if reset_each_episode:
                del saved_log_probs[:]
            if clear:  # the fix, as printed
                saved_log_probs.clear()

    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        run(clear=False)
    assert "fix: clear `saved_log_probs` after each update (`saved_log_probs.clear()`)" in str(w), str(w)
    run(clear=True)


class _Queue(torch.nn.Module):
    """facebookresearch/moco's builder.py, retyped without its ``@torch.no_grad()`` on ``_dequeue_and_enqueue`` and
    without ``.clone().detach()`` of the queue where the negatives are computed."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_q, self.encoder_k = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
        self.register_buffer("queue", torch.randn(4, 8))
        self.ptr = 0

    def _dequeue_and_enqueue(self, keys: torch.Tensor) -> None:
        self.queue[:, self.ptr : self.ptr + keys.shape[0]] = keys.T
        self.ptr = (self.ptr + keys.shape[0]) % 8

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        q, k = self.encoder_q(im_q), self.encoder_k(im_k)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue])
        logits = torch.cat([(q * k).sum(1, keepdim=True), l_neg], dim=1)
        self._dequeue_and_enqueue(k)
        return logits


def test_a_buffer_another_method_changes_in_place_is_named_at_that_methods_line() -> None:
    """It gave the in-place error's generic item ("... `x += ...`, `relu_()`, an optimizer step ..."): the change is
    in another method than the one whose line saved the queue. The truth: the enqueue's item assignment changes the
    queue the einsum saved; a copy made before it leaves the saved one as it was."""
    torch.manual_seed(0)
    model = _Queue()
    optimizer = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 6), torch.randn(4, 6)), torch.zeros(4).long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    line = inspect.getsourcelines(_Queue._dequeue_and_enqueue)[1] + 1
    assert f"1. line {line} changed in place a tensor this backward needs" in str(w), str(w)
    assert f"fix: add `self.queue = self.queue.clone()` before line {line}" in str(w), str(w)


def test_an_ema_a_lightning_hook_updates_with_autograd_on_is_fixed_at_the_hooks_line() -> None:
    """timm's ModelEmaV2 pattern in a LightningModule's ``on_train_batch_end``, without ``torch.no_grad()``: it
    named ``model = LitEma()`` ("run line N under torch.no_grad()", which changes nothing), the line tracer being off
    in a framework's loop. The truth: the EMA's parameters gain a graph each step at the hook's update."""
    pl = pytest.importorskip("pytorch_lightning")

    class LitEma(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(6, 2)
            self.ema = torch.nn.Linear(6, 2).requires_grad_(False)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            for ema_p, p in zip(self.ema.parameters(), self.net.parameters()):
                ema_p.mul_(0.9).add_(p, alpha=0.1)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.net.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 6), torch.randint(0, 2, (16,)))
    model = LitEma()
    trainer = pl.Trainer(
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with watch() as w:
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    assert model.ema.weight.grad_fn is not None
    line = inspect.getsourcelines(LitEma.on_train_batch_end)[1] + 2
    assert "1. `model.ema`'s parameters hold a graph that grows every iteration" in str(w), str(w)
    assert f"fix: run line {line} under `with torch.no_grad():`" in str(w), str(w)


def test_of_two_outputs_of_one_node_only_the_one_the_next_pass_reads_carries() -> None:
    """``pred, h = cell(x, h)`` where both outputs come from one node (a compiled cell's, here a ``chunk``'s): it said
    "`h` and `pred` carry ...", fix "add `h = h.detach()` and `pred = pred.detach()` before line N", a NameError in
    pass 1 (``pred`` is not bound yet). The truth: the pass rebinds ``pred`` before reading it; ``h`` alone carries,
    and with ``h`` detached there the loop runs."""

    def run(fixed: bool) -> None:
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        h = torch.zeros(2, 4)
        for _ in range(3):
            if fixed:  # the fix, as printed
                h = h.detach()
            pred, h = torch.tanh(layer(torch.cat([torch.randn(2, 4), h], 1))).chunk(2, dim=1)
            optimizer.zero_grad()
            pred.pow(2).mean().backward()
            optimizer.step()

    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        run(fixed=False)
    assert "1. `h` carries iteration 1's graph into iteration 2" in str(w), str(w)
    assert "fix: add `h = h.detach()` before line" in str(w), str(w)
    run(fixed=True)


def _encoder_then_head(detach_in: str | None) -> None:
    """ctallec/world-models' shape: the encoder's own loss trains the encoder (its optimizer steps), then a head is
    trained on the encoder's ``mu``; ``detach_in``: which loss reads ``mu.detach()`` ("encoder", "head", None)."""
    torch.manual_seed(0)
    encoder, head = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    head_optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    for _ in range(3):
        mu = torch.tanh(encoder(torch.randn(4, 3)))
        encoder_loss = ((mu.detach() if detach_in == "encoder" else mu) - 0.5).pow(2).mean()
        encoder_optimizer.zero_grad()
        encoder_loss.backward()
        encoder_optimizer.step()
        head_loss = head(mu.detach() if detach_in == "head" else mu).pow(2).mean()
        head_optimizer.zero_grad()
        head_loss.backward()
        head_optimizer.step()


def test_the_detach_goes_in_the_loss_whose_step_does_not_train_what_the_shared_tensor_comes_from() -> None:
    """It said "use `mu.detach()` in the loss line N's backward walks", N the encoder's own loss: applied, the
    encoder loss trains nothing (its loss has no graph) and the head's backward still raises. The truth: the step
    after the encoder's backward trains the encoder, so the head's loss is the one to read ``mu.detach()``."""
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        _encoder_then_head(detach_in="encoder")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _encoder_then_head(detach_in=None)
    source, first = inspect.getsourcelines(_encoder_then_head)
    head_line = first + next(i for i, text in enumerate(source) if "head_loss = head(" in text)
    assert f"fix: use `mu.detach()` at line {head_line} (`head_loss = head(" in str(w), str(w)
    _encoder_then_head(detach_in="head")


def test_a_carried_state_seen_without_the_line_tracer_gives_no_note_to_the_loss_that_reaches_into_it(
    tmp_path: Any,
) -> None:
    """Under a trace function of the learner's (coverage started at the script's top, a debugger), the watch cannot
    follow the loop's lines and splits the run by its optimizer's steps: the names are read after each step. The
    loss, rebound every pass, then held its pass's graph into the next, reaching back through the carried ``h`` into
    iteration 1's: "`loss` keeps one more iteration's graph alive every iteration", beside the carried item. The
    truth: every backward walks what ``loss`` reaches back into (the carried graph, item 1), and ``loss`` itself holds
    one pass's graph at a time; with ``h = h.detach()`` nothing is held or walked twice."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            from backward_twice import watch

            def theirs(frame, event, arg):
                return None

            torch.manual_seed(0)
            model = torch.nn.Linear(3, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(4)]
            h = torch.zeros(4, 2)
            sys.settrace(theirs)
            try:
                with watch() as w:
                    for x, y in data:
                        optimizer.zero_grad()
                        h = model(x) + h
                        loss = ((h - y) ** 2).mean()
                        loss.backward(retain_graph=True)
                        optimizer.step()
            finally:
                sys.settrace(None)
            """
        )
    )
    w = runpy.run_path(str(script))["w"]
    text = str(w)
    assert "iterations: by SGD.step()" in w.evidence(), w.evidence()  # the case: no line tracer
    assert text.startswith("backward-twice: 1 thing to fix (4 iterations watched)\n"), text
    assert "`h` carries iteration 1's graph into iteration 2" in text and "`loss` keeps" not in text, text


def _reptile(inner_step: str) -> list[float]:
    """Reptile's inner loop (joschu's reptile-sinewaves-demo.py, with a per-task ``copy.deepcopy`` as its ports
    have it), each inner step as ``inner_step`` says: "total" sums the task loss across steps and backwards the total
    (as learners break it), "published" backwards each step's loss, "fixed" is "total" with the tool's fix applied;
    the meta-model's weights after 3 tasks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x_all = torch.linspace(-5, 5, 10)[:, None]
    for _ in range(3):
        y_all = torch.sin(x_all + torch.rand(1) * 6) * (torch.rand(1) * 4.9 + 0.1)
        fast = copy.deepcopy(model)
        inner_opt = torch.optim.SGD(fast.parameters(), lr=0.02)
        task_loss: Any = 0
        for _ in range(2):
            inner_opt.zero_grad()
            pred = fast(x_all)
            if inner_step == "total":
                task_loss = task_loss + torch.nn.functional.mse_loss(pred, y_all)
                task_loss.backward()
            elif inner_step == "published":
                task_loss = torch.nn.functional.mse_loss(pred, y_all)
                task_loss.backward()
            else:
                loss = torch.nn.functional.mse_loss(pred, y_all)
                loss.backward()
                task_loss += loss.item()
            inner_opt.step()
        with torch.no_grad():
            for p, fp in zip(model.parameters(), fast.parameters()):
                p += 0.1 * (fp - p)
    return [p.sum().item() for p in model.parameters()]


def test_a_total_of_the_loss_whose_term_has_no_name_is_given_one_in_the_fix() -> None:
    """Reptile's ``task_loss = task_loss + F.mse_loss(pred, y_all); task_loss.backward()``: the fix was "add a
    number instead (`task_loss += loss.item()`) and call backward() on this iteration's loss", a NameError as printed
    (no ``loss`` in the loop). The truth: as written, inner step 2 raises; with this iteration's loss named, its
    backward called and a number added (the fix now printed), it runs and trains the published loop's weights."""
    with pytest.raises(RuntimeError, match="a second time"):
        _reptile("total")
    with contextlib.suppress(RuntimeError), watch() as w:
        _reptile("total")
    text = str(w)
    fix = (
        "fix: name this iteration's loss (`loss = torch.nn.functional.mse_loss(pred, y_all)`), call `loss.backward()`,"
        " and add a number instead (`task_loss += loss.item()`)"
    )
    assert "`task_loss` carries iteration 1's graph into iteration 2" in text and fix in text, text
    assert _reptile("fixed") == _reptile("published")  # the fix as printed trains the published loop's weights


PRUNED = """
import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from backward_twice import diagnose, watch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
prune.l1_unstructured(model[0], name="weight", amount=0.5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = list(zip(torch.randn(3, 6, 8), torch.randint(0, 3, (3, 6))))
with contextlib.suppress(RuntimeError), watch() as w:
    for data, target in batches:
        optimizer.zero_grad()
        reg = 1e-3 * model[0].weight.abs().sum()
        output = model(data)
        loss = F.cross_entropy(output, target) + reg
        loss.backward()
        optimizer.step()
"""


def test_a_pruned_weight_read_before_the_forward_that_rebuilds_it_is_read_after_it(tmp_path: Any) -> None:
    """An L1 penalty on a pruned layer's ``weight`` (pruning tutorial's ``prune.l1_unstructured``), read before
    ``model(data)``: pruning's forward pre-hook rebuilds ``weight = weight_orig * mask`` at each forward, so the read
    gets the previous iteration's, and pass 2 raises. The fix was "add `model[0].weight = model[0].weight.detach()`
    before line N": it runs, but the penalty then sends no gradient to ``weight_orig`` (it trains as without the
    penalty). The truth: read after the forward, as published, it runs and the penalty trains."""

    def trained(source: str) -> tuple[float, float]:
        script = tmp_path / "pruned.py"
        script.write_text("import contextlib\n" + source)
        model = runpy.run_path(str(script))["model"]
        return model[0].weight_orig.sum().item(), model[2].weight.sum().item()

    lines = PRUNED.split("\n")
    read, forward = (next(i for i, line in enumerate(lines) if key in line) for key in ("reg = ", "output = "))
    moved = "\n".join([*lines[:read], lines[forward], lines[read], *lines[forward + 1 :]])
    no_penalty = PRUNED.replace("reg = 1e-3 * model[0].weight.abs().sum()", "reg = 0")
    detached = PRUNED.replace("        reg = ", "        model[0].weight = model[0].weight.detach()\n        reg = ")
    assert trained(moved) != trained(no_penalty) and trained(detached) == trained(no_penalty)  # the truth
    (tmp_path / "pruned.py").write_text("import contextlib\n" + PRUNED)
    text = str(runpy.run_path(str(tmp_path / "pruned.py"))["w"])
    said = (
        f"fix: move line {read + 2} below line {forward + 2} (`output = model(data)`), which builds `model[0].weight`"
    )
    assert "`model[0].weight` carries iteration 1's graph into iteration 2" in text and said in text, text


def test_the_audit_of_a_pruned_weights_band_aid_says_the_fix_the_other_ways_print(tmp_path: Any) -> None:
    """The band-aid on the pruned penalty above: the audit said "once `model[0].weight` is detached, no backward
    needs them", a fix the other ways no longer print (they say to read it after the forward)."""
    step = PRUNED.replace("loss.backward()", "loss.backward(retain_graph=True)")
    body = "\n".join(line[4:] for line in step.split("\n") if line.startswith("        "))  # the loop's body
    head = step.split("with contextlib.suppress")[0].rstrip()
    source = (
        f"{head}\nfrom backward_twice import audit_retain_graph\ndata, target = batches[0]\n"
        f"def step():\n{body}\naudit = audit_retain_graph(step, models=[model], optimizers=[optimizer])\n"
    )
    (tmp_path / "pruned_audit.py").write_text(source)
    said = str(runpy.run_path(str(tmp_path / "pruned_audit.py"))["audit"])
    assert "goes with the carried fix" in said and "is read after the call that builds it anew" in said, said
    assert "is detached" not in said, said


def test_a_total_added_to_with_plus_equals_comes_in_at_that_line(tmp_path: Any) -> None:
    """``adapt_loss += crit(out, ys)`` then ``adapt_loss.backward()`` (a Reptile port's inner loop): the graph of
    the last pass comes in at the ``+=``, which reads the old total; the item showed the backward's line twice, as
    "comes in here" and as the raising line."""
    (tmp_path / "adapt.py").write_text(
        textwrap.dedent(
            """
            import contextlib
            import torch
            from backward_twice import watch

            torch.manual_seed(0)
            learner = torch.nn.Linear(1, 1)
            opt = torch.optim.SGD(learner.parameters(), lr=0.02)
            xs, ys = torch.randn(10, 1), torch.randn(10, 1)
            adapt_loss = 0.0
            with contextlib.suppress(RuntimeError), watch() as w:
                for k in range(3):
                    opt.zero_grad()
                    out = learner(xs)
                    adapt_loss += torch.nn.functional.mse_loss(out, ys)
                    adapt_loss.backward()
                    opt.step()
            """
        )
    )
    text = str(runpy.run_path(str(tmp_path / "adapt.py"))["w"])
    assert "adapt.py:15 | adapt_loss += torch.nn.functional.mse_loss(out, ys)" in text, text
    assert "iteration 1's graph comes in here" in text and text.count("adapt.py:16 |") == 1, text


def test_a_deque_filled_before_the_loop_and_grown_with_appendleft_is_named_at_the_loops_append(tmp_path: Any) -> None:
    """A memory bank as ``collections.deque(maxlen=3)`` filled before the loop and given ``bank.appendleft(k)``
    each pass, ``k`` with its graph: the note pointed at the fill before the loop with the generic "keep a detached
    tensor instead". The truth: the loop's ``appendleft`` keeps the keys' graphs; detached, none."""
    (tmp_path / "bank.py").write_text(
        textwrap.dedent(
            """
            import collections
            import torch
            from backward_twice import watch

            torch.manual_seed(0)
            enc, key_enc = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
            opt = torch.optim.SGD(enc.parameters(), lr=0.03)
            bank = collections.deque(maxlen=3)
            for _ in range(3):
                bank.appendleft(torch.randn(4, 4))
            with watch() as w:
                for step in range(6):
                    q, k = enc(torch.randn(4, 6)), key_enc(torch.randn(4, 6))
                    loss = (q * k).sum() + (q @ torch.cat(list(bank)).detach().T).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    bank.appendleft(k)
            """
        )
    )
    namespace = runpy.run_path(str(tmp_path / "bank.py"))
    assert sum(key.grad_fn is not None for key in namespace["bank"]) == 3  # the truth, read without the tool
    text = str(namespace["w"])
    assert "1. `bank` keeps the last 3 iterations' graphs alive" in text, text
    assert "bank.py:19 | bank.appendleft(k)" in text and "keep in mind: `bank.appendleft(k.detach())`" in text, text


def test_a_memory_a_checkpointed_transformer_xl_carries_is_one_item_not_two(tmp_path: Any) -> None:
    """Transformer-XL's memory (kimiyoung/transformer-xl: ``mems`` from the layers' outputs ``hids``) with the
    forum's band-aid, its layers under ``torch.utils.checkpoint``: a second item "`hids` carries iteration 3's graph",
    though each pass assigns ``hids`` before it reads it. The truth: ``mems`` detached (the first item's fix) runs
    and is all it takes."""
    (tmp_path / "txl.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch.utils.checkpoint import checkpoint
            from backward_twice import watch

            torch.manual_seed(0)
            emb, out = torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)
            layers = torch.nn.ModuleList(torch.nn.Linear(16, 8) for _ in range(2))

            def model(data, mems):
                h = emb(data)
                hids = [h]
                for layer, mem in zip(layers, mems):
                    h = checkpoint(lambda a, b: torch.tanh(layer(torch.cat([a, b], -1))), h, mem, use_reentrant=False)
                    hids.append(h)
                return out(h), hids

            params = [*emb.parameters(), *layers.parameters(), *out.parameters()]
            optimizer = torch.optim.Adam(params, lr=1e-3)
            mems = [torch.zeros(2, 5, 8) for _ in range(2)]
            with watch() as w:
                for data, target in [(torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))) for _ in range(4)]:
                    optimizer.zero_grad()
                    logits, hids = model(data, mems)
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), target.reshape(-1))
                    loss.backward(retain_graph=True)
                    optimizer.step()
                    mems = [(0.5 * m + 0.5 * h) for m, h in zip(mems, hids)]
            """
        )
    )
    text = str(runpy.run_path(str(tmp_path / "txl.py"))["w"])
    assert text.startswith("backward-twice: 1 thing to fix (4 iterations watched)"), text
    assert "`mems` carries iteration 1's graph into iteration 2; retain_graph=True only hides it" in text, text
    assert "`hids`" not in text, text


def test_an_autograd_error_raised_around_the_batch_loop_is_judged_as_the_loops() -> None:
    """A hand-written stochastic weight average (the AveragedModel docstring's loop, its average done in place on a
    deepcopy, without torch.no_grad()), run in the epoch loop after the batch loop: "healthy (...; RuntimeError: a
    leaf Variable ... (raised after the loop) ended the run)", as if it were the script's own error after training.
    The truth: the average raises in epoch 3; under torch.no_grad() it runs."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    average = copy.deepcopy(model)
    loader = [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(2)]
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"), watch() as w:
        for epoch in range(4):
            for inputs, targets in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(inputs), targets).backward()
                optimizer.step()
            if epoch > 1:
                for p_average, p in zip(average.parameters(), model.parameters()):
                    p_average.mul_(0.5).add_(p * 0.5)
    [item] = w.report.items
    assert item.label.endswith("changes a tensor that requires grad in place, with autograd recording"), str(w)
    assert item.fix.startswith("run line ") and item.fix.endswith(" under `with torch.no_grad():`"), item.fix


class _Codebook(torch.nn.Module):
    """A VQ-VAE quantizer's EMA codebook (rosinality/vq-vae-2-pytorch, vqvae.py ``Quantize``), its buffer updates
    written without the published ``.data``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("embed", torch.randn(4, 3))
        self.register_buffer("embed_avg", self.embed.clone())

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot((flat @ self.embed).argmax(1), 3).float()
        if self.training:
            self.embed_avg.mul_(0.9).add_(flat.transpose(0, 1) @ onehot, alpha=0.1)
            self.embed.copy_(self.embed_avg / 2)
        return flat + ((onehot @ self.embed.t()) - flat).detach()


def test_buffers_an_ema_updates_with_autograd_recording_are_a_graph_that_grows() -> None:
    """The EMA's buffers updated in place outside torch.no_grad() (``.data`` dropped): "healthy", though each
    update chains the last one's graph onto the buffers (a submodule's tensors were read as its own bookkeeping,
    parameters excepted). The truth (no helpers): ``embed_avg.grad_fn`` reaches every earlier update; under
    torch.no_grad() the buffers hold none."""
    torch.manual_seed(0)
    encoder, codebook = torch.nn.Linear(4, 4), _Codebook()
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(5):
            optimizer.zero_grad()
            codebook(encoder(torch.randn(6, 4))).pow(2).mean().backward()
            optimizer.step()
    assert codebook.embed_avg.grad_fn is not None  # the truth: a graph kept on the buffer
    [item] = w.report.items
    assert item.label == "`codebook`'s buffers hold a graph that grows every iteration", str(w)
    first = inspect.getsourcelines(_Codebook.forward)[1] + 3
    assert item.fix == f"run lines {first} to {first + 1} under `with torch.no_grad():`", item.fix


class _SpectralNormed(torch.nn.Linear):
    """rosinality/igebm-pytorch's ``SpectralNorm`` (model.py), power iteration left out: a forward pre-hook assigns
    the registered buffer ``weight`` afresh from the parameter ``weight_orig`` at every forward."""

    def __init__(self) -> None:
        super().__init__(3, 1)
        weight = self.weight
        del self._parameters["weight"]
        self.register_parameter("weight_orig", weight)
        self.register_buffer("weight", weight.detach().clone())
        self.register_forward_pre_hook(_normalise_weight)


def _normalise_weight(module: torch.nn.Module, _: object) -> None:
    module.weight = module.weight_orig / module.weight_orig.norm()


def test_a_buffer_a_pre_hook_assigns_afresh_each_forward_holds_no_growing_graph() -> None:
    """IGEBM's spectral norm: "`lin.weight` holds a graph that grows every iteration ... run line N under `with
    torch.no_grad():`", which cuts the only way a gradient reaches ``weight_orig``: it never trains. The truth (no
    helpers): at each iteration's start the buffer's graph has the same nodes (one pass's); detaching it there
    trains the same weights."""
    torch.manual_seed(0)
    layer, x, y = _SpectralNormed(), torch.randn(8, 3), torch.randn(8, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(4):
            optimizer.zero_grad()
            ((layer(x) - y) ** 2).mean().backward()
            optimizer.step()
    assert layer.weight.grad_fn is not None and layer.weight_orig.grad is not None  # the truth: it trains
    assert w.report.items == (), str(w)
    assert str(w).startswith("backward-twice: healthy"), str(w)


def test_one_loss_differentiated_twice_keeps_its_graph_for_the_second_call() -> None:
    """DARTS' unrolled step (quark0/darts, cnn/architect.py): ``torch.autograd.grad(loss, arch_parameters())`` then
    ``torch.autograd.grad(loss, parameters())``, the published retain_graph=True dropped. The fix was "use
    `loss.detach()` in the loss line N's backward walks ... (a GAN's D loss)": detaching the root leaves nothing to
    differentiate ("element 0 of tensors does not require grad", as printed). The truth: a retain on the first call
    runs, as published."""
    torch.manual_seed(0)
    weights, alphas = torch.nn.Linear(3, 2), torch.nn.Parameter(torch.zeros(2))

    def unrolled_step(retain: bool) -> None:
        loss = (weights(torch.randn(4, 3)) * alphas.softmax(0)).pow(2).mean()
        architecture = torch.autograd.grad(loss, [alphas], retain_graph=retain)
        network = torch.autograd.grad(loss, list(weights.parameters()))
        alphas.grad = architecture[0]
        for p, g in zip(weights.parameters(), network):
            p.grad = g

    unrolled_step(retain=True)  # the truth: as published it runs
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        for _ in range(2):
            unrolled_step(retain=False)
    [item] = w.report.items
    lines, start = inspect.getsourcelines(test_one_loss_differentiated_twice_keeps_its_graph_for_the_second_call)
    first = start + next(i for i, text in enumerate(lines) if "architecture = torch.autograd.grad" in text)
    assert item.fix == f"add retain_graph=True to line {first}'s backward only: both differentiate `loss`", item.fix


def test_a_later_loss_that_trains_other_weights_detaches_the_stale_forward_instead_of_computing_it_again() -> None:
    """SAC's temperature loss on ``log_pi`` without its ``.detach()``, the policy's backward retained as the forum's
    band-aid (pranz24/pytorch-soft-actor-critic, sac.py): the policy's step changed the weights ``log_pi`` saved, and
    the fix was "compute line N again after the step", which runs but trains another policy than the published loop.
    The loss trains ``log_alpha``, and the policy only through ``log_pi``: its detach is the published code, whose
    weights the truth gives."""
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    policy_optim = torch.optim.SGD(policy.parameters(), lr=0.1)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_optim = torch.optim.SGD([log_alpha], lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(3):
            log_pi = torch.log(policy(torch.randn(8, 3)).sigmoid() + 1e-6)
            policy_loss = (0.2 * log_pi).mean()
            policy_optim.zero_grad()
            policy_loss.backward(retain_graph=True)
            policy_optim.step()
            alpha_loss = -(log_alpha * (log_pi - 1.0)).mean()
            alpha_optim.zero_grad()
            alpha_loss.backward()
            alpha_optim.step()
    [item] = w.report.items
    assert item.fix.startswith("use `log_pi.detach()` in the loss line "), item.fix
    retained = inspect.getsourcelines(
        test_a_later_loss_that_trains_other_weights_detaches_the_stale_forward_instead_of_computing_it_again
    )
    line = retained[1] + next(i for i, text in enumerate(retained[0]) if "backward(retain_graph=True)" in text)
    # the band-aid that turned "a second time" into this error goes with the fix: nothing else walks what it kept
    assert item.fix.endswith(f"this loss does not train them; remove retain_graph=True at line {line}"), item.fix
    [retain] = w.verdicts.lines
    assert retain.verdict == "goes with the error's fix", retain


def test_a_d_loss_computed_before_gs_step_detaches_the_fake_and_drops_gs_retain() -> None:
    """A Stack Overflow GAN step ("How does PyTorch's loss.backward() work when retain_graph=True is specified?"):
    G's and D's losses both computed first, G's backward retained and G stepped, then D's backward through the same
    ``fake``. The fix was "compute lines N and M again ... (a GAN: G's loss on a fresh D(fake))", on D's loss, with a
    new draw of noise, and the retain "needed". The accepted answer: ``fake.detach()`` in D's loss, no retain."""
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    disc = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optim_g, optim_d = torch.optim.Adam(gen.parameters(), lr=0.01), torch.optim.Adam(disc.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(4, 1), torch.zeros(4, 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(3):
            real, fake = torch.randn(4, 2), gen(torch.randn(4, 2))
            loss_g = criterion(disc(fake), ones)
            loss_d = criterion(disc(real), ones) + criterion(disc(fake), zeros)
            optim_g.zero_grad()
            loss_g.backward(retain_graph=True)
            optim_g.step()
            optim_d.zero_grad()
            loss_d.backward()
            optim_d.step()
    [item] = w.report.items
    assert item.fix.startswith("use `fake.detach()` in the loss line "), item.fix
    assert re.search(r"; remove retain_graph=True at line \d+$", item.fix), item.fix


def test_the_band_aid_for_an_lstms_two_states_names_both() -> None:
    """An LSTM's ``h0`` and ``c0`` carried across batches, "fixed" with ``retain_graph=True`` (a blog's loop, the
    forum's band-aid): the retain's verdict said "once `h0` no longer carries its graph", though detaching ``h0``
    alone still raises "a second time" through ``c0``. The truth: both detached, the loop runs without the retain."""
    torch.manual_seed(0)
    lstm, head = torch.nn.LSTM(3, 4, batch_first=True), torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
    h0, c0 = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError), watch() as w:
        for _ in range(3):
            out, (h0, c0) = lstm(torch.randn(2, 5, 3), (h0, c0))
            loss = head(out[:, -1]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    [line] = w.verdicts.lines
    assert line.fix == "remove retain_graph=True once `h0` and `c0` no longer carry their graph", line.fix
    assert "once `h0` and `c0` are detached" in line.why, line.why


def test_a_loss_computed_once_before_the_loop_is_built_there_and_computed_inside() -> None:
    """makemore's notebook (karpathy/nn-zero-to-hero#31): the forward cell run once, the backward-and-update cell
    run again. The item showed ``loss.backward()`` twice ("comes in here", then "raised") and never the line that
    built ``loss``, and the fix offered ``loss = loss.detach()``, after which its backward has no graph at all. The
    truth: the forward inside the loop runs."""
    torch.manual_seed(0)
    xenc, ys = torch.nn.functional.one_hot(torch.tensor([0, 5, 13]), 27).float(), torch.tensor([5, 13, 1])
    W = torch.randn(27, 27, requires_grad=True)
    logits = xenc @ W
    loss = -logits.log_softmax(1)[torch.arange(3), ys].mean()
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        for _ in range(3):
            W.grad = None
            loss.backward()
            W.data += -0.1 * W.grad
    [item] = w.report.items
    assert [line.label for line in item.lines] == [
        "built here, before the loop",
        'raised "Trying to backward through the graph a second time"',
    ], item.lines
    assert "loss = -logits.log_softmax(1)" in item.lines[0].code, item.lines
    assert item.fix == "compute `loss` inside the loop: its backward needs a graph built in the same iteration"


def _epoch_total_after_batch_steps(batch_steps: bool = True, epoch_update: bool = True, listed: bool = False) -> None:
    """A batch loop that steps after each batch's retained backward, then an epoch-level backward of the batches'
    total (``listed``: their list, stacked); the flags drop one of the two updates (the printed fix's two ways)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = torch.randn(3, 4, 3), torch.randn(3, 4, 1)
    for _ in range(2):
        total, losses = 0, []
        for x, y in zip(inputs, targets):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean() + 0.01 * (model.weight**2).sum()
            loss.backward(retain_graph=True)
            if batch_steps:
                opt.step()
            if listed:
                losses.append(loss)
            else:
                total = total + loss
        if epoch_update:
            opt.zero_grad()
            if listed:
                torch.stack(losses).mean().backward()
            else:
                (0.1 * total).backward()
            opt.step()


def test_a_total_of_losses_from_passes_a_step_came_between_keeps_one_update_not_computed_again() -> None:
    """The epoch's backward walks every batch's loss, and each batch's step changed the weights the earlier ones
    saved: "compute line N again after the step" still raised as printed (the next batch's step changes them
    again). The truth: bare, the in-place error; without the batch step, or without the epoch's update, it runs."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        _epoch_total_after_batch_steps()
    [fix] = [line for line in str(w).splitlines() if line.lstrip().startswith("fix:")]
    source, first = inspect.getsourcelines(_epoch_total_after_batch_steps)
    number = {key: first + next(i for i, line in enumerate(source) if key in line) for key in ("for x", "opt.step()")}
    backward = first + next(i for i, line in enumerate(source) if "(0.1 * total).backward()" in line)
    assert fix.strip() == (
        f"fix: `total` adds up losses of every pass of the loop at line {number['for x']}, and line "
        f"{number['opt.step()']}'s step changes the weights between them: keep one of the two updates (line "
        f"{number['opt.step()']}'s step, or line {backward}'s backward and the step after it)"
    ), fix
    _epoch_total_after_batch_steps(batch_steps=False)
    _epoch_total_after_batch_steps(epoch_update=False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as listed:
        _epoch_total_after_batch_steps(listed=True)  # a list the loop appends each batch's loss to, stacked
    [fix] = [line for line in str(listed).splitlines() if line.lstrip().startswith("fix:")]
    assert fix.strip().startswith(
        f"fix: `losses` adds up losses of every pass of the loop at line {number['for x']}"
    ), fix
    _epoch_total_after_batch_steps(batch_steps=False, listed=True)


def _hidden_kept_walkable(iterations: int) -> torch.Tensor:
    """A hidden state carried with the forum's band-aid, the weight rebuilt out of place each pass (no in-place
    error): each backward walks every earlier iteration's graph once there are three."""
    torch.manual_seed(0)
    weight = torch.randn(4, 4, requires_grad=True)
    h = torch.zeros(2, 4)
    for _ in range(iterations):
        h = torch.tanh(torch.randn(2, 4) + h @ weight)
        loss = h.pow(2).mean()
        loss.backward(retain_graph=True)
        weight = (weight - 0.01 * weight.grad).detach().requires_grad_()
    return h


def test_a_carried_graph_seen_for_two_iterations_of_a_stopped_run_is_not_said_never_to_pile_up() -> None:
    """``iterations=2`` on a hidden state kept walkable: "one graph at a time (it does not pile up)", where the third
    pass's backward walks both earlier graphs (the truth: the nodes reachable from ``h`` grow by the same count each
    pass; the whole run says "memory and time grow")."""
    counts = [_nodes(_hidden_kept_walkable(n)) for n in (2, 4, 6)]
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0, counts
    with watch(iterations=2) as w:
        _hidden_kept_walkable(6)
    [item] = w.report.items
    assert "does not pile up" not in item.why, item.why
    assert item.why.endswith("the run stopped after 2 iterations, and a longer one shows whether these graphs pile up")
    with watch() as whole:
        _hidden_kept_walkable(6)
    assert whole.report.items[0].why.endswith("memory and time grow with each iteration"), str(whole)


def _euler_ode_fit(in_place: bool, decay: bool = False) -> None:
    """torchdiffeq's ode_demo loop with a fixed-step Euler solver written inline, the state stepped in place
    (``y += dt * func(t0, y)``) or out of place (the printed fix)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def func(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return net(y**3)

    def odeint_euler(y0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ys, y = [y0], y0.clone()
        for t0, t1 in zip(t[:-1], t[1:]):  # noqa: RUF007  # as the demo writes it
            dt = t1 - t0
            if in_place:
                y += dt * func(t0, y)
            else:
                y = y + dt * func(t0, y)
            if decay:  # a second in-place statement, on what no function saved
                y *= 0.9
            ys.append(y.clone())
        return torch.stack(ys)

    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    true_y = torch.randn(5, 1, 2)
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.mean(torch.abs(odeint_euler(torch.tensor([[2.0, 0.0]]), torch.linspace(0, 1, 5)) - true_y))
        loss.backward()
        optimizer.step()


def test_a_tensor_the_caller_changes_in_place_after_a_function_saved_it_is_shown_at_the_callers_line() -> None:
    """The Euler step's ``y += dt * func(t0, y)``, where ``func`` saved ``y`` (``y**3``): the item was the generic
    "a tensor the graph saved was changed in place (x += ..., relu_(), optimizer.step())", no line of the learner's
    named. The truth: as written it raises; out of place, as printed, it runs."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        _euler_ode_fit(in_place=True)
    [item] = w.report.items
    source, first = inspect.getsourcelines(_euler_ode_fit)
    line = first + next(i for i, text in enumerate(source) if text.strip() == "y += dt * func(t0, y)")
    assert item.label == f"line {line} changed in place a tensor this backward needs", item
    assert item.fix == f"write line {line} out of place: `y = y + dt * func(t0, y)`", item.fix
    _euler_ode_fit(in_place=False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as decayed:
        _euler_ode_fit(in_place=True, decay=True)  # two in-place lines: the first after the save is the one
    assert decayed.report.items[0].fix == item.fix, decayed.report.items[0].fix
    _euler_ode_fit(in_place=False, decay=True)


def _laplace_pinn(neumann_inside: bool) -> None:
    """A PINN for Laplace's equation (a Q&A's "Solving 2D Laplace Equation with PINNs in PyTorch"): the Neumann term
    ``du/dy`` at the bottom edge from ``torch.autograd.grad`` before the loop, or (the accepted answer) inside it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x_range, y_zeros = torch.linspace(0.2, 0.8, 4), torch.zeros(4, requires_grad=True)

    def bottom() -> torch.Tensor:
        u_bottom = net(torch.stack([x_range, y_zeros], 1))
        return torch.autograd.grad(u_bottom.sum(), y_zeros, create_graph=True)[0]

    du_dy_bottom = bottom()
    for _ in range(3):
        optimizer.zero_grad()
        if neumann_inside:
            du_dy_bottom = bottom()
        xy = torch.rand(10, 2, requires_grad=True)
        u_xy = torch.autograd.grad(net(xy).sum(), xy, create_graph=True)[0]
        loss = u_xy.pow(2).mean() + du_dy_bottom.pow(2).mean()
        loss.backward()
        optimizer.step()


def test_a_gradient_taken_before_the_loop_is_the_graph_built_before_the_loop_not_iteration_1s() -> None:
    """The ``autograd.grad`` call before the loop, outside every loop, made the loop unusable ("iterations: by
    Adam.step()"): "`du_dy_bottom` carries iteration 1's graph into iteration 2 ... add `du_dy_bottom =
    du_dy_bottom.detach()` at the end of each iteration", which as printed silently stops the boundary term training
    (a watch started after that call said "built before the loop"). The truth: as written, iteration 2 raises;
    computed inside the loop, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _laplace_pinn(neumann_inside=False)
    [item] = w.report.items
    assert item.label.startswith("`du_dy_bottom` carries the graph built before the loop into iteration"), item
    assert item.fix.startswith("compute `du_dy_bottom` inside the loop"), item.fix
    assert "one per pass of your loop" in w.evidence(), w.evidence()
    _laplace_pinn(neumann_inside=True)


def _bigram(forward_inside: bool) -> None:
    """nn-zero-to-hero's bigram (karpathy/nn-zero-to-hero#31): the forward pass cell run once, the loss printed, the
    backward and update cell run again; ``forward_inside``: the forward run in each pass."""
    g = torch.Generator().manual_seed(2147483647)
    xs, ys = torch.tensor([0, 5, 13, 13, 1]), torch.tensor([5, 13, 13, 1, 0])
    W = torch.randn((27, 27), generator=g, requires_grad=True)
    xenc = torch.nn.functional.one_hot(xs, num_classes=27).float()

    def forward() -> torch.Tensor:
        counts = (xenc @ W).exp()
        prob = counts / counts.sum(1, keepdims=True)
        return -prob[torch.arange(5), ys].log().mean()

    loss = forward()
    for _ in range(3):
        if forward_inside:
            loss = forward()
        print(loss.item())
        W.grad = None
        loss.backward()
        W.data += -0.1 * W.grad


def test_a_read_for_a_number_is_not_where_a_graph_comes_in(capsys: pytest.CaptureFixture) -> None:
    """``print(loss.item())``, the body's first line, was shown as where "the graph built before the loop comes in
    here": ``.item()`` gives a number. The loss's own line, before the loop, is shown instead; computed inside the
    loop, as printed, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _bigram(forward_inside=False)
    [item] = w.report.items
    assert [line.code for line in item.lines] == ["loss = forward()", "loss.backward()"], item.lines
    assert item.lines[0].label == "built here, before the loop", item.lines[0]
    assert item.fix.startswith("compute `loss` inside the loop"), item.fix
    _bigram(forward_inside=True)


def _classify(form: str, fixed: bool) -> None:
    """A classifier whose loss is computed from ``softmax(...).argmax(...)`` (a forum's), or from numbers rewrapped
    in a tensor; ``fixed``: from what the cutting operation was applied to, as the printed fix says."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(torch.randn(2, 6, 4), torch.randint(0, 3, (2, 6))):
        if form == "argmax" and not fixed:
            preds = torch.softmax(model(x), dim=1).argmax(dim=1).float()
            loss = torch.nn.functional.mse_loss(preds, y.float())
        elif form == "argmax":
            loss = torch.nn.functional.cross_entropy(model(x), y)  # the scores the argmax was taken of
        elif form == "rewrapped" and not fixed:
            number = torch.nn.functional.mse_loss(model(x).sum(1), y.float()).item()
            loss = torch.tensor(number)  # the number made a tensor again: no graph, from the line before
        elif form == "rewrapped":
            loss = torch.nn.functional.mse_loss(model(x).sum(1), y.float())
        elif form == "method" and not fixed:
            loss = _Evaluator(model).loss(x, y)
        elif not fixed:
            loss = _evaluated(model, x, y)
        else:
            loss = torch.nn.functional.mse_loss(model(x).sum(1), y.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _evaluated(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x).sum(1), y.float())


class _Evaluator:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scores = self.model(x).sum(1)
        return torch.nn.functional.mse_loss(scores, y.float())


@pytest.mark.parametrize(
    ("form", "operation"),
    [
        ("argmax", "`.argmax()`"),
        ("rewrapped", "`.item()`"),
        ("evaluated", "`torch.no_grad()`"),
        ("method", "`torch.no_grad()`"),
    ],
)
def test_a_loss_without_a_graph_names_the_line_whose_operation_cut_it(form: str, operation: str) -> None:
    """ "element 0 of tensors does not require grad" for a loss on ``softmax(...).argmax(...)`` (a forum's
    classifier): the why said "computed under torch.no_grad(), or from .detach()ed tensors or .item() numbers", none of
    which the loop has. The item names the line and the operation; the loss computed from what it was applied to
    runs. A method of the learner's (``self.loss(x, y)``) is followed as a function is (its torch.no_grad() got the
    generic item)."""
    with pytest.raises(RuntimeError, match="does not require grad"), watch() as w:
        _classify(form, fixed=False)
    [item] = w.report.items
    if form in ("evaluated", "method"):  # the loss a function of the learner's computes under torch.no_grad()
        assert item.label.endswith("runs under `torch.no_grad()`"), item.label
        assert item.fix.startswith("run line ") and item.fix.endswith(" outside torch.no_grad()"), item.fix
    else:
        assert item.label.endswith(f"{operation} gives values with no gradient"), item.label
        assert item.fix.startswith("compute the loss from what line"), item.fix
    marked = "under torch.no_grad()" if form in ("evaluated", "method") else "no gradient from here"
    assert item.lines[0].label == marked, item.lines
    assert form in ("evaluated", "method") or operation.strip("`").rstrip("()") in item.lines[0].code, item.lines
    assert form != "method" or item.lines[0].code == "scores = self.model(x).sum(1)", item.lines
    _classify(form, fixed=True)


def _forums_leaf(as_written: bool) -> torch.Tensor:
    """The forum's "fix" for "does not require grad": the loss's number made a tensor that requires grad, which runs
    and trains nothing; ``as_written`` False: the loss itself, as the printed fix says."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(torch.randn(3, 6, 4), torch.randn(3, 6, 1)):
        if as_written:
            mse = ((model(x) - y) ** 2).mean().item()
            loss = torch.tensor(mse, requires_grad=True)
        else:
            loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.weight.detach().clone()


def test_a_number_made_a_leaf_that_requires_grad_names_the_line_that_made_it_a_number() -> None:
    """``torch.tensor(loss.item(), requires_grad=True)``: "find where the loss's inputs lose their graph", where the
    same loop without requires_grad=True names the ``.item()`` line; and "compute ... without `.item()`; then drop
    `requires_grad = True`" still trained nothing as printed (a new tensor made from a tensor has no graph either).
    The truth: as written the weights never move; backward on that line's loss, without ``.item()``, trains them."""
    with watch() as w:
        untrained = _forums_leaf(as_written=True)
    [item] = w.report.items
    assert item.lines[0].code == "mse = ((model(x) - y) ** 2).mean().item()", item.lines
    number = item.lines[0].place.rsplit(":", 1)[1]
    assert item.fix == (
        f"call backward on the loss line {number} computes, without `.item()`, not on a new tensor made from its value"
    ), item.fix
    torch.manual_seed(0)
    assert torch.equal(untrained, torch.nn.Linear(4, 1).weight.detach())
    assert not torch.equal(_forums_leaf(as_written=False), untrained)


def test_a_loss_made_a_new_leaf_from_its_own_number_in_one_line_is_removed() -> None:
    """``loss = torch.tensor(loss.item(), requires_grad=True)`` on one line: the fix was "compute the loss from line N
    without `.item()`; then drop `requires_grad = True`", which trains nothing as printed either. The truth: without
    that line the weights train."""

    def train(as_written: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in zip(torch.randn(3, 8, 4), torch.randn(3, 8, 1)):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if as_written:
                loss = torch.tensor(loss.item(), requires_grad=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.weight.detach().clone()

    with watch() as w:
        untrained = train(as_written=True)
    [item] = w.report.items
    assert item.lines[0].code == "loss = torch.tensor(loss.item(), requires_grad=True)", item.lines
    number = item.lines[0].place.rsplit(":", 1)[1]
    assert item.fix == f"remove line {number}: call backward on the loss it makes a new tensor of", item.fix
    assert not torch.equal(train(as_written=False), untrained)


def test_the_band_aids_in_place_error_a_pass_later_says_which_graphs_the_backward_went_through() -> None:
    """An ``RNNCell``'s state carried with the forum's band-aid: iteration 2 runs (iteration 1's graph saves no
    weight on the state's path, its state being zeros), iteration 3 raises the in-place error in iteration 2's graph.
    The why said "follows `h` into iteration 1's graph, and `opt.step()` changed the weights it saved". The truth:
    detached after pass 1 only, it raises in pass 4; after every pass, all run."""

    def run(detach_after: Callable[[int], bool]) -> None:
        torch.manual_seed(0)
        rnn = torch.nn.RNNCell(3, 4)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        h = torch.zeros(2, 4)
        for i in range(1, 5):
            out = rnn(torch.randn(2, 3), h)
            loss = out.pow(2).mean()
            loss.backward(retain_graph=True)
            opt.step()
            opt.zero_grad()
            h = out.detach() if detach_after(i) else out

    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        run(lambda i: False)
    [item] = w.report.items
    assert w.report.headline.endswith("(3 iterations watched; the loop raised in iteration 3)"), w.report.headline
    assert item.why.startswith("this backward follows `h` into the graphs of iterations 1 and 2, and `opt.step()`")
    assert item.why.endswith("changed weights one of them saved"), item.why
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(lambda i: i == 1)
    run(lambda i: True)


def _train_then_fine_tune(detach_context: bool) -> float:
    """One step function called from a training loop, then from a fine-tuning loop that feeds each output back as
    the next step's context (``loss, ctx = train_step(b, ctx)``); ``detach_context``: the printed fix."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [torch.randn(3, 4) for _ in range(4)]

    def train_step(batch: torch.Tensor, ctx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        opt.zero_grad()
        out = model(batch if ctx is None else batch + ctx)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        return loss, out

    for _ in range(2):
        for b in data:
            train_step(b)
    ctx = torch.zeros(3, 4)
    for b in data:
        if detach_context:
            ctx = ctx.detach()
        loss, ctx = train_step(b, ctx)
        print(f"fine-tune loss {loss.item():.4f}")
    return model.weight.sum().item()


def test_a_state_a_helper_takes_as_a_parameter_is_named_by_the_loop_that_feeds_it_back() -> None:
    """The helper's ``ctx`` parameter held the graph when the fine-tuning loop's second call raised: "a tensor no
    name of yours holds carries iteration 9's graph ... detach the tensor that carries it", though the evidence said
    "reached them through ctx" (a detach in the helper, on its parameter, would break the training loop's calls,
    where it is None). The truth: detached where the loop feeds it back, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _train_then_fine_tune(detach_context=False)
    [item] = w.report.items
    source, first = inspect.getsourcelines(_train_then_fine_tune)
    line = first + next(i for i, text in enumerate(source) if text.strip() == "loss, ctx = train_step(b, ctx)")
    assert item.label.startswith("`ctx` carries"), item.label
    assert item.fix == f"add `ctx = ctx.detach()` before line {line}", item.fix
    assert item.lines[0].code == "loss, ctx = train_step(b, ctx)", item.lines
    _train_then_fine_tune(detach_context=True)


class _SAM(torch.optim.Optimizer):
    """davda54/sam's optimizer (sam.py), its ``first_step`` climbing to the worst nearby weights in place and
    ``second_step`` stepping the base optimizer from the original ones."""

    def __init__(self, params: Any, base_optimizer: Any, rho: float = 0.05, **kwargs: Any) -> None:
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for g in self.param_groups for p in g["params"]]), p=2)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * group["rho"] / (grad_norm + 1e-12))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


def _sam_one_forward(forward_again: bool) -> list[torch.Tensor]:
    """davda54/sam#45: the example's two forward-backward passes written with one forward (``forward_again``: the
    printed fix, the forward computed again after ``first_step``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = _SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    for images, target in [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(3)]:
        output = model(images)
        loss = torch.nn.functional.cross_entropy(output, target)
        loss.backward()
        optimizer.first_step(zero_grad=True)
        if forward_again:
            output = model(images)
        torch.nn.functional.cross_entropy(output, target).backward()
        optimizer.second_step(zero_grad=True)
    return [p.detach().clone() for p in model.parameters()]


def test_a_second_backward_after_an_optimizers_own_step_computes_the_forward_again() -> None:
    """SAM's two backward calls on one forward (davda54/sam#45): "use `output.detach()` in the loss ... or add
    retain_graph=True to line N's backward only", each of which fails as printed (no gradient; the in-place error,
    as ``first_step`` changed the weights the graph saved), and no ``step()`` hook sees ``first_step``. The truth:
    the forward computed again after it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _sam_one_forward(forward_again=False)
    [item] = w.report.items
    source, first = inspect.getsourcelines(_sam_one_forward)
    step = first + next(i for i, text in enumerate(source) if "first_step(" in text)
    assert item.fix.startswith(f"compute `output` again after line {step}'s step: line "), item.fix
    assert item.fix.endswith("and that step changed the weights it saved"), item.fix
    _sam_one_forward(forward_again=True)


def _reinforce_update_twice(once: bool) -> None:
    """REINFORCE's ``finish_episode()`` called twice in a row on one episode's log-probabilities (``once``: the
    printed fix)."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    saved_log_probs: list[torch.Tensor] = []

    def finish_episode() -> None:
        loss = torch.cat([-log_prob.view(1) for log_prob in saved_log_probs]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(2):
        for _ in range(3):
            m = torch.distributions.Categorical(logits=policy(torch.randn(4)))
            saved_log_probs.append(m.log_prob(m.sample()))
        finish_episode()
        if not once:
            finish_episode()
        saved_log_probs.clear()


def test_an_update_run_twice_on_one_episode_runs_once_per_graph() -> None:
    """The update written twice in a row (not in a loop): "build `log_prob` inside the loop that runs line N's
    backward, or use `log_prob.detach()`", where the episode's loop already builds it and a detach leaves no policy
    gradient. The truth: a retain raises the in-place error (the step changed the weights); once per episode runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _reinforce_update_twice(once=False)
    [item] = w.report.items
    assert item.fix.startswith("run line "), item.fix
    assert "once per graph: run again, it walks the graph its first run freed, whose weights the step at line" in (
        item.fix
    ), item.fix
    _reinforce_update_twice(once=True)


class _AverageMeter:
    """pytorch/examples' imagenet ``AverageMeter``, as published."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.val: Any = 0
        self.avg: Any = 0
        self.sum: Any = 0
        self.count = 0

    def update(self, val: Any, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def test_a_meter_fed_the_loss_tensor_is_one_note_at_the_line_that_feeds_it() -> None:
    """``losses.update(loss, n)`` without ``.item()`` (imagenet's meter, as learners often call it): two notes,
    "`losses.avg` keeps ..." and "`self.sum` keeps ..." at the meter's own lines, for one cause. The truth: fed the
    number, nothing is held (the meter's ``sum`` holds no graph)."""

    def train(as_number: bool) -> _AverageMeter:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = _AverageMeter()
        for _ in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item() if as_number else loss
            losses.update(value, 8)
        return losses

    with watch() as w:
        train(as_number=False)
    [item] = w.report.items
    assert item.label == "`losses` keeps one more iteration's graph alive every iteration", item.label
    assert [line.code for line in item.lines] == ["losses.update(value, 8)"], item.lines
    assert item.fix == "`losses.update(value.item(), 8)`", item.fix
    assert "`losses.avg` and `losses.sum` hold them all" in item.why or "`losses.sum` and `losses.avg`" in item.why
    assert not torch.is_tensor(train(as_number=True).sum)


class _Logger:
    """A learner's logger: one running total, grown in a method of its own."""

    def __init__(self) -> None:
        self.total: Any = 0.0
        self.steps = 0

    def log(self, loss: Any) -> None:
        self.total += loss
        self.steps += 1


class _Trainer:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=0.01)
        self.logger = _Logger()

    def train(self, as_number: bool) -> None:
        for _ in range(5):
            self.opt.zero_grad()
            batch_loss = (self.net(torch.randn(8, 4)) - 1).pow(2).mean()
            batch_loss.backward()
            self.opt.step()
            value = batch_loss.item() if as_number else batch_loss
            self.logger.log(value)


def test_a_logger_a_trainer_feeds_the_loss_tensor_is_one_note_at_the_trainers_call() -> None:
    """``self.logger.log(batch_loss)`` in a trainer's ``train()``, the logger's ``log`` growing ``self.total += loss``:
    "healthy", as a total two attribute levels below the loop's ``self`` was read as a submodule's bookkeeping; and
    fed at the script's top level, the note was ``self.total`` at the logger's own line. The truth: the total's
    graph reaches back to iteration 1, and fed the number it holds none."""
    trainer = _Trainer()
    with watch() as w:
        trainer.train(as_number=False)
    assert trainer.logger.total.grad_fn is not None
    [item] = w.report.items
    assert item.label == "`self.logger` keeps one more iteration's graph alive every iteration", item.label
    assert [line.code for line in item.lines] == ["self.logger.log(value)"], item.lines
    assert item.fix == "`self.logger.log(value.item())`", item.fix
    assert "`self.logger.total` holds them all" in item.why, item.why
    fed = _Trainer()
    with watch() as w:
        fed.train(as_number=True)
    assert not torch.is_tensor(fed.logger.total) and not w.report.items, w.report.items

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logger, top = _Logger(), _AverageMeter()
    with watch() as w:
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            logger.log(loss)
            top.update(loss, 1)
            loss.backward()
            opt.step()
    labels = [item.label for item in w.report.items]
    assert labels == [
        "`logger` keeps one more iteration's graph alive every iteration",
        "`top` keeps one more iteration's graph alive every iteration",
    ], labels
    assert [item.fix for item in w.report.items] == ["`logger.log(loss.item())`", "`top.update(loss.item(), 1)`"]


def test_a_history_dict_of_lists_in_the_loops_function_is_a_note() -> None:
    """``history = defaultdict(list)`` in a ``fit()`` function, ``history["loss"].append(l)``: "healthy" from the
    watch, as a function's dict was read as one rebuilt each pass (bt.diagnose on the same body gave the note). The
    truth: every loss it keeps has its graph."""

    def fit(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[Any]]:
        history: dict[str, list[Any]] = collections.defaultdict(list)
        for _ in range(5):
            opt.zero_grad()
            l = torch.nn.functional.cross_entropy(model(torch.randn(6, 5)), torch.randint(0, 3, (6,)))  # noqa: E741
            history["loss"].append(l)
            l.backward()
            opt.step()
        return history

    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    with watch() as w:
        history = fit(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    assert all(loss.grad_fn is not None for loss in history["loss"])
    [item] = w.report.items
    assert item.label == '`history["loss"]` keeps one more iteration\'s graph alive every iteration', item.label
    assert item.fix.startswith('`history["loss"].append(l.item())`'), item.fix


class _TinyDiscriminator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.nn.functional.leaky_relu(self.l1(x.flatten(1)), 0.2))


def _d_r1_loss(real_pred: torch.Tensor, real_img: torch.Tensor) -> torch.Tensor:
    (grad_real,) = torch.autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return (grad_real.view(grad_real.shape[0], -1).norm(2, dim=1) ** 2).mean()


def _stylegan2_r1(predict_again: bool) -> None:
    """rosinality/stylegan2-pytorch's train.py at an early commit (0832b16f): D's step, then its lazy R1 penalty
    through ``real_pred`` from before the step (``predict_again``: the printed fix, ``real_pred`` computed again)."""
    torch.manual_seed(0)
    discriminator = _TinyDiscriminator()
    d_optim = torch.optim.Adam(discriminator.parameters(), lr=0.002, betas=(0.0, 0.99))
    for i in range(3):
        real_img, fake_img = torch.randn(4, 1, 2, 2), torch.randn(4, 1, 2, 2)
        fake_pred = discriminator(fake_img)
        d_regularize = i % 2 == 0
        if d_regularize:
            real_img.requires_grad = True
        real_pred = discriminator(real_img)
        d_loss = torch.nn.functional.softplus(-real_pred).mean() + torch.nn.functional.softplus(fake_pred).mean()
        discriminator.zero_grad()
        d_loss.backward(retain_graph=d_regularize)
        d_optim.step()
        if d_regularize:
            if predict_again:
                real_pred = discriminator(real_img)
            r1_loss = _d_r1_loss(real_pred, real_img)
            discriminator.zero_grad()
            (5 * r1_loss).backward()
            d_optim.step()


def test_a_penalty_whose_function_takes_a_stale_forward_names_the_loops_line_and_no_gan_loss() -> None:
    """StyleGAN2's R1 penalty (``autograd.grad`` in ``d_r1_loss``) through ``real_pred`` from before D's step: "compute
    line N again after the step (a GAN: G's loss on a fresh D(fake))", line N the discriminator's ``forward`` (which
    the raising function never called) and no G loss in sight. The truth: ``real_pred`` computed again runs."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        _stylegan2_r1(predict_again=False)
    [item] = w.report.items
    assert item.lines[0].code == "real_pred = discriminator(real_img)", item.lines
    assert item.fix.startswith("compute line ") and "GAN" not in item.fix, item.fix
    _stylegan2_r1(predict_again=True)


def _pretrain_then_train(detach_after_pretraining: bool) -> None:
    """An encoder's output pretrained with a backward and a step of its own before the loop, then read by every pass
    of the loop (``detach_after_pretraining``: the printed fix's second way)."""
    torch.manual_seed(0)
    enc, head = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
    opt = torch.optim.SGD([*enc.parameters(), *head.parameters()], lr=0.1)
    emb = enc(torch.randn(8, 4))
    emb.pow(2).mean().backward()
    opt.step()
    if detach_after_pretraining:
        emb = emb.detach()
    for _ in range(3):
        loss = (head(emb) - torch.randn(8, 1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_pretraining_step_before_the_loop_is_before_the_loop_not_its_first_iteration() -> None:
    """A backward and an optimizer step of the learner's before the loop (outside every loop) made the loop unusable,
    the pretraining became iteration 1 and the fix "add `emb = emb.detach()` before line N", which as printed left
    the pretraining's backward no graph. The truth: the loop's first pass raises; detached after the pretraining, it
    runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _pretrain_then_train(detach_after_pretraining=False)
    [item] = w.report.items
    assert w.report.headline.endswith("(1 iteration watched; the loop raised in iteration 1)"), w.report.headline
    assert item.label == "`emb` carries the graph built before the loop into iteration 1", item.label
    assert "`emb = emb.detach()`" in item.fix, item.fix  # at the loop's line, or after the pretraining: both run
    _pretrain_then_train(detach_after_pretraining=True)


def test_a_number_read_through_a_chain_of_calls_is_not_where_a_graph_comes_in() -> None:
    """``print(h.norm().item())`` before ``h = rnn(x, h)``: the print was shown as where "iteration 1's graph comes
    in here", and the detach placed before it (which runs, at the wrong line). The state's own line is shown."""
    torch.manual_seed(0)
    rnn = torch.nn.RNNCell(3, 4)
    h = torch.zeros(2, 4)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        for x in torch.randn(3, 2, 3):
            print(h.norm().item(), h.detach().sum())
            h = rnn(x, h)
            h.pow(2).mean().backward()
    [item] = w.report.items
    assert item.lines[0].code == "h = rnn(x, h)" and item.lines[0].label.endswith("comes in here"), item.lines


def _epoch_of_listed_losses(retain: bool, batch_steps: bool = True) -> None:
    """The batches' losses appended to a list, each batch stepped, then ``total = torch.stack(losses).sum()`` and its
    backward and step after the loop (``retain``: each batch's backward keeps its graph)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(mlp.parameters(), lr=0.1)
    for batches in torch.randn(2, 3, 4, 3):
        losses = []
        for xb in batches:
            optimizer.zero_grad()
            loss = mlp(xb).pow(2).mean()
            loss.backward(retain_graph=retain)
            if batch_steps:
                optimizer.step()
            losses.append(loss)
        total = torch.stack(losses).sum()
        total.backward()
        optimizer.step()


@pytest.mark.parametrize("retain", [True, False])
def test_an_epochs_total_computed_from_a_list_after_the_loop_keeps_one_update(retain: bool) -> None:
    """``total = torch.stack(losses).sum()`` after the batch loop, then ``total.backward()``: "compute line N again
    after the step" (with the retain: the in-place error) or "compute `loss` again after line M's step" (without:
    "a second time"), neither of which runs as printed. The truth: without the batches' steps it runs."""
    error = "modified by an inplace operation" if retain else "backward through the graph a second time"
    with pytest.raises(RuntimeError, match=error), watch() as w:
        _epoch_of_listed_losses(retain)
    [item] = w.report.items
    assert item.fix.startswith("`losses` adds up losses of every pass of the loop at line "), item.fix
    assert "keep one of the two updates" in item.fix, item.fix
    _epoch_of_listed_losses(retain=True, batch_steps=False)


def test_a_retained_backward_again_after_an_optimizers_own_step_names_that_step() -> None:
    """SAM's one forward with the first backward retained (davda54/sam#45's variant): the second backward raises the
    in-place error, and the item was the generic "a tensor the graph saved was changed in place (x += ...,
    relu_(), optimizer.step()) ... (a GAN: G's loss on a fresh netD(fake))". ``first_step`` is named as the step that
    changed the weights; the forward computed again after it runs (the other test's printed fix)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = _SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    images, target = torch.randn(4, 6), torch.randint(0, 3, (4,))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(images), target)
            loss.backward(retain_graph=True)
            optimizer.first_step(zero_grad=True)
            loss.backward()
            optimizer.second_step(zero_grad=True)
    [item] = w.report.items
    assert item.lines[0].code == "optimizer.first_step(zero_grad=True)", item.lines
    assert item.fix.startswith("compute the forward again after line ") and "GAN" not in item.fix, item.fix


def _encoder_decoder(detach_at_the_decoders_loss: bool) -> torch.nn.Module:
    """An autoencoder's decoder step, then its encoder's, on one ``z`` (two optimizers, not a GAN)."""
    torch.manual_seed(0)
    encoder, decoder = torch.nn.Linear(6, 2), torch.nn.Linear(2, 6)
    opt_enc = torch.optim.SGD(encoder.parameters(), lr=0.1)
    opt_dec = torch.optim.SGD(decoder.parameters(), lr=0.1)
    for x in torch.randn(3, 4, 6):
        z = encoder(x)
        opt_dec.zero_grad()
        recon_loss = ((decoder(z.detach() if detach_at_the_decoders_loss else z) - x) ** 2).mean()
        recon_loss.backward()
        opt_dec.step()
        opt_enc.zero_grad()
        enc_loss = ((decoder(z) - x) ** 2).mean() + 0.01 * z.pow(2).mean()
        enc_loss.backward()
        opt_enc.step()
    return encoder


def test_a_second_backward_through_an_encoders_output_is_not_called_a_gans() -> None:
    """The fix ended "(a GAN's D loss)" on an encoder and a decoder trained by two optimizers. The truth: the detach
    the fix names runs, and nothing there is a GAN."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _encoder_decoder(detach_at_the_decoders_loss=False)
    [item] = w.report.items
    assert item.fix.startswith("use `z.detach()` at line "), item.fix
    assert "GAN" not in item.fix and "GAN" not in item.why, item
    assert _encoder_decoder(detach_at_the_decoders_loss=True).weight.isfinite().all()


def _generator_first(detach_in_ds_loss: bool) -> torch.nn.Module:
    """eriklindernoren/PyTorch-GAN's gan.py order: G's step first, then D's loss on the same ``gen_imgs``."""
    torch.manual_seed(0)
    generator, discriminator = torch.nn.Linear(2, 4), torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Sigmoid())
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=0.01)
    optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=0.01)
    adversarial_loss = torch.nn.BCELoss()
    for imgs in torch.randn(3, 5, 4):
        valid, fake = torch.ones(5, 1), torch.zeros(5, 1)
        optimizer_g.zero_grad()
        gen_imgs = generator(torch.randn(5, 2))
        g_loss = adversarial_loss(discriminator(gen_imgs), valid)
        g_loss.backward()
        optimizer_g.step()
        optimizer_d.zero_grad()
        real_loss = adversarial_loss(discriminator(imgs), valid)
        fake_loss = adversarial_loss(discriminator(gen_imgs.detach() if detach_in_ds_loss else gen_imgs), fake)
        d_loss = (real_loss + fake_loss) / 2
        d_loss.backward()
        optimizer_d.step()
    return discriminator


def test_a_d_loss_after_gs_step_is_told_the_line_where_it_reads_gs_output() -> None:
    """G's step first, then D's ``d_loss = (real_loss + fake_loss) / 2`` through the same ``gen_imgs``: the fix said
    "use `gen_imgs.detach()` in the loss line N's backward walks", not the line that reads it. The truth: detached
    there, the loop runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _generator_first(detach_in_ds_loss=False)
    [item] = w.report.items
    assert re.fullmatch(
        r"use `gen_imgs.detach\(\)` at line \d+ \(`fake_loss = adversarial_loss\(discriminator\(gen_imgs.detach\(\) if "
        r"detach_in_ds_loss else gen_imgs\), fake\)`\): a GAN's D loss must not train what `gen_imgs` comes from",
        item.fix,
    ), item.fix
    _generator_first(detach_in_ds_loss=True)


def _reinforce_with_baseline(forward_inside: bool) -> None:
    """sweetice/Deep-reinforcement-learning-with-pytorch's REINFORCE with baseline as its issue #37 posts it: an
    episode's log-probs kept before the update loop, an update per step, and an Adam made each pass over the policy's
    weights where the value network's were meant (its step changes nothing: none of them gets a gradient);
    ``forward_inside``: each update's log-prob computed in its own pass, from the states and actions kept."""
    torch.manual_seed(1)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    value = torch.nn.Linear(4, 1)
    optimizer_theta = torch.optim.Adam(policy.parameters(), lr=1e-3)
    states = list(torch.randn(4, 1, 4))
    log_act_prob, actions = [], []
    for state in states:
        m = torch.distributions.Categorical(torch.softmax(policy(state), dim=1))
        action = m.sample()
        log_act_prob.append(m.log_prob(action))
        actions.append(action)
    for i in range(len(states)):
        delta = 1.0 - value(states[i])
        optimizer_w = torch.optim.Adam(policy.parameters(), lr=1e-3)
        optimizer_w.zero_grad()
        (-delta).sum().backward(retain_graph=True)
        optimizer_w.step()
        optimizer_theta.zero_grad()
        if forward_inside:
            log_prob = torch.distributions.Categorical(torch.softmax(policy(states[i]), dim=1)).log_prob(actions[i])
        else:
            log_prob = log_act_prob[i]
        policy_loss_theta = (-log_prob * delta).sum()
        policy_loss_theta.backward(retain_graph=True)
        optimizer_theta.step()


def test_the_step_that_changed_saved_weights_is_the_one_that_updated_them() -> None:
    """Two Adams over the policy's weights, one of which never updates them: the why named `optimizer_w.step()`, and
    the fix was "add `log_act_prob[-1] = log_act_prob[-1].detach()` after line N's backward", which still raises (and
    would stop the policy learning). The truth: removing optimizer_w's step still raises; each log-prob computed in
    its own pass runs."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        _reinforce_with_baseline(forward_inside=False)
    item = w.report.items[0]
    assert "`optimizer_theta.step()` (line " in item.why, item.why
    assert item.fix == (
        "build the `log_act_prob` item each pass reads inside the loop: each backward walks a graph of its own"
    ), item.fix
    _reinforce_with_baseline(forward_inside=True)


def _gan_scoring_fake_once(fixed: bool) -> torch.nn.Module:
    """The Lightning basic GAN's manual step written with one ``d_fake = discriminator(fake)`` for both losses;
    ``fixed``: as the printed fix says (D's loss on ``fake.detach()``, ``d_fake`` again after D's step)."""
    torch.manual_seed(0)
    generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    discriminator = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=2e-4)
    optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for real in torch.randn(3, 4, 2):
        fake = generator(torch.randn(4, 4))
        d_fake = discriminator(fake.detach() if fixed else fake)
        d_loss = (bce(discriminator(real), torch.ones(4, 1)) + bce(d_fake, torch.zeros(4, 1))) / 2
        optimizer_d.zero_grad()
        d_loss.backward()
        optimizer_d.step()
        if fixed:
            d_fake = discriminator(fake)
        g_loss = bce(d_fake, torch.ones(4, 1))
        optimizer_g.zero_grad()
        g_loss.backward()
        optimizer_g.step()
    return generator


def test_a_gans_d_output_on_fake_used_by_both_losses_is_detached_for_d_and_computed_again_for_g() -> None:
    """The fix was "compute `d_fake` again after line N's step", which still raises as printed: D's backward walked
    G's graph behind ``fake`` too. The truth: ``fake.detach()`` where D's loss scores it, and ``d_fake`` computed
    again for G's loss after D's step, runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _gan_scoring_fake_once(fixed=False)
    [item] = w.report.items
    assert re.fullmatch(
        r"use `fake.detach\(\)` at line \d+ \(`d_fake = discriminator\(fake.detach\(\) if fixed else fake\)`\), and "
        r"compute `d_fake` again from `fake` after line \d+'s step for line \d+'s backward: a GAN's D loss must not "
        r"train what `fake` comes from",
        item.fix,
    ), item.fix
    _gan_scoring_fake_once(fixed=True)


def test_a_list_of_a_models_outputs_each_a_dict_of_tensors_is_a_note_of_the_list() -> None:
    """``self.step_outputs.append(outputs)`` of a Hugging Face model's outputs (a dict of ``loss`` and ``logits``
    each step): "healthy", as each new item was counted as a container of its own, holding two graphs as the last
    did. The truth: the list holds every step's graphs; detached entries hold none."""

    class Keeper:
        def __init__(self) -> None:
            self.step_outputs: list[dict[str, torch.Tensor]] = []

        def compute_loss(self, model: torch.nn.Module, x: torch.Tensor, detach: bool) -> torch.Tensor:
            logits = model(x)
            outputs = {"loss": logits.pow(2).mean(), "logits": logits}
            kept = {key: value.detach() for key, value in outputs.items()} if detach else outputs
            self.step_outputs.append(kept)
            return outputs["loss"]

    def train(detach: bool) -> Keeper:
        torch.manual_seed(0)
        model, keeper = torch.nn.Linear(4, 2), Keeper()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.randn(5, 3, 4):
            opt.zero_grad()
            keeper.compute_loss(model, x, detach).backward()
            opt.step()
        return keeper

    with watch() as w:
        keeper = train(detach=False)
    assert all(out["logits"].grad_fn is not None for out in keeper.step_outputs)
    [item] = w.report.items
    assert item.label == "`self.step_outputs` keeps one more iteration's graph alive every iteration", item.label
    assert item.fix.startswith("`self.step_outputs.append(kept['"), item.fix
    assert item.fix.endswith("].detach())`, with each entry you read detached"), item.fix
    assert all(out["logits"].grad_fn is None for out in train(detach=True).step_outputs)


_MEMORY: dict[int, torch.Tensor] = {}


def _memory_step(encoder: torch.nn.Module, optimizer: torch.optim.Optimizer, nodes: list[int]) -> None:
    """A node memory updated per node of a batch, a node met twice in one batch updated twice."""
    optimizer.zero_grad()
    out = []
    for j, n in enumerate(nodes):
        old = _MEMORY[n] if n in _MEMORY else torch.zeros(4)
        upd = torch.tanh(encoder(torch.cat([old, torch.full((4,), float(j))])))
        _MEMORY[n] = upd
        out.append(upd.sum())
    torch.stack(out).pow(2).mean().backward()
    optimizer.step()


def test_diagnose_places_a_memorys_detach_after_the_steps_loop_over_nodes_not_inside_it() -> None:
    """bt.diagnose placed "add `for key in memory: ...detach()`" before the line inside the step's loop over a
    batch's nodes, where it cuts the gradient between two updates of one node met twice in a batch (the watch said
    "at the end of each iteration")."""
    from backward_twice import diagnose

    _MEMORY.clear()
    torch.manual_seed(0)
    encoder = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.05)
    diagnosis = diagnose(lambda: _memory_step(encoder, optimizer, [4, 4, 3]), models=[encoder], optimizers=[optimizer])
    [item] = diagnosis.items
    assert item.fix == "add `for key in _MEMORY: _MEMORY[key] = _MEMORY[key].detach()` at the end of each iteration", (
        item.fix
    )


def _finish_episode(forward_inside: bool) -> None:
    """REINFORCE's update as a learner writes it: an update per step of an episode, over ``zip(saved_log_probs,
    returns)`` collected before the loop; ``forward_inside``: each log-prob computed in its own pass instead."""
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    states, actions, saved_log_probs = list(torch.randn(3, 4)), [], []
    for s in states:
        m = torch.distributions.Categorical(torch.softmax(policy(s), -1))
        actions.append(m.sample())
        saved_log_probs.append(m.log_prob(actions[-1]))
    returns = [1.0, 0.5, 1.0]
    if forward_inside:
        for s, a, ret in zip(states, actions, returns):
            log_prob = torch.distributions.Categorical(torch.softmax(policy(s), -1)).log_prob(a)
            optimizer.zero_grad()
            (-log_prob * ret).backward()
            optimizer.step()
        return
    for log_prob, ret in zip(saved_log_probs, returns):
        optimizer.zero_grad()
        policy_loss = -log_prob * ret
        policy_loss.backward()
        optimizer.step()


def test_log_probs_the_update_loop_takes_from_before_it_are_built_in_each_pass_not_detached() -> None:
    """The fix was "add `log_prob = log_prob.detach()` as the loop's body begins", which raises "does not require
    grad" as printed: the policy's loss trains it only through the log-prob. The truth: each log-prob computed in its
    own pass runs."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        _finish_episode(forward_inside=False)
    [item] = w.report.items
    assert item.fix == "build `log_prob` inside the loop: each backward walks a graph of its own", item.fix
    _finish_episode(forward_inside=True)


def test_a_retain_written_as_an_expression_is_named_as_written() -> None:
    """``loss.backward(retain_graph=(i == 0))``: the item said "retain_graph=True at line N ... remove
    retain_graph=True", words the line does not have. The truth: removed, the loop runs the same."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch() as w:
        for i, x in enumerate(torch.randn(3, 2, 4)):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward(retain_graph=(i == 0))
            opt.step()
    [item] = w.report.items
    assert item.label.startswith("`retain_graph=(i == 0)` at line "), item.label
    assert item.fix.startswith("remove `retain_graph=(i == 0)` at line "), item.fix
    assert item.lines[0].span is not None and item.lines[0].code[slice(*item.lines[0].span)] == "retain_graph=(i == 0)"


def test_a_total_that_grows_is_a_note_in_a_loop_of_three_passes() -> None:
    """A logger's running total fed after each step, in a loop of three passes: "healthy", as what the last pass's
    start held was read as a pass that never ran (the loop's last pass has no end of its own). The truth: at the end
    the total's graph reaches back to pass 1."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logger = _Logger()
    with watch() as w:
        for x in torch.randn(3, 8, 4):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            logger.log(loss)
    assert logger.total.grad_fn is not None
    [item] = w.report.items
    assert item.label == "`logger` keeps one more iteration's graph alive every iteration", item.label


def _shared_backbone(features_again: bool) -> torch.Tensor:
    """A student's and a teacher's head on one backbone, each optimizer stepping the backbone too; ``features_again``:
    the features computed again after the student's step, as the printed fix says."""
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    student_head, teacher_head = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
    opt_student = torch.optim.SGD([*backbone.parameters(), *student_head.parameters()], lr=0.1)
    opt_teacher = torch.optim.SGD([*backbone.parameters(), *teacher_head.parameters()], lr=0.1)
    for x, y in zip(torch.randn(3, 5, 4), torch.randint(0, 3, (3, 5))):
        feats = backbone(x)
        s_loss = torch.nn.functional.cross_entropy(student_head(feats), y)
        opt_student.zero_grad()
        s_loss.backward()
        opt_student.step()
        if features_again:
            feats = backbone(x)
        t_loss = torch.nn.functional.cross_entropy(teacher_head(feats), y)
        opt_teacher.zero_grad()
        t_loss.backward()
        opt_teacher.step()
    return backbone[0].weight.detach().clone()


def test_features_two_optimizers_both_train_are_computed_again_not_detached() -> None:
    """The fix was "use `feats.detach()` in the later loss: the step after ... trains what `feats` comes from, and this
    later loss must not", false when the later loss's own optimizer steps the backbone too: applied, the teacher's
    loss no longer trains it. The truth: computed again after the student's step, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _shared_backbone(features_again=False)
    [item] = w.report.items
    assert re.fullmatch(r"compute `feats` again after line \d+'s step: .*", item.fix), item.fix
    _shared_backbone(features_again=True)


def test_the_step_that_changed_saved_weights_is_named_by_its_statement_on_a_line_of_several() -> None:
    """``opt.zero_grad(); h = rnn(x, h); ...; opt.step()`` on one line: the why named the whole line as the step that
    changed the weights. The truth: the step is ``opt.step()``; the item's line stays the whole line."""
    torch.manual_seed(0)
    rnn = torch.nn.RNNCell(3, 4)
    opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
    h = torch.zeros(2, 4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), watch() as w:
        for x in torch.randn(4, 2, 3):
            opt.zero_grad(); h = rnn(x, h); h.pow(2).mean().backward(retain_graph=True); opt.step()  # noqa: E702  # fmt: skip
    [item] = w.report.items
    assert "`opt.step()` (line " in item.why, item.why


def test_an_error_of_the_loops_own_after_a_carried_graph_does_not_say_retain_graph_never_mattered() -> None:
    """A hidden state carried with the forum's retain, then the loop's own ValueError in pass 3: its item read "the
    loop raised ValueError, before retain_graph matters", false after two passes the retain kept walkable. The truth:
    the carried item stands for the passes that ran (detached, the retain can go), and the error is named as raised."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = torch.zeros(5, 1)
    with pytest.raises(ValueError, match="bad batch"), watch() as w:
        for i in range(4):
            h = model(torch.randn(5, 3)) + h
            opt.zero_grad()
            h.pow(2).mean().backward(retain_graph=True)
            opt.step()
            if i == 2:
                raise ValueError("bad batch")
    carried, error = w.report.items
    assert carried.fix.startswith("add `h = h.detach()` before line "), carried.fix
    assert error.label == "the loop raised ValueError", error.label
    assert "retain_graph" not in error.label + error.why + error.fix, error
    assert str(w).startswith("backward-twice: 2 things to fix (3 iterations watched; the loop raised in iteration 3)")


@pytest.mark.parametrize("passes", [3, 5])
def test_a_pass_that_raises_before_its_first_backward_is_counted_as_its_own_iteration(passes: int) -> None:
    """A GRU's hidden state sized for full batches, and a short last batch: the forward of the last pass raises
    before its backward. Past the passes the line tracer follows (the third on), the error was put in the pass
    before it ("3 iterations watched; the loop raised in iteration 2" of a loop that ran its third pass). The truth:
    bare Python raises in the pass of the short batch, after the passes before it ran their backward."""
    torch.manual_seed(0)
    rnn, head = torch.nn.GRU(3, 8, batch_first=True), torch.nn.Linear(8, 1)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=0.01)
    batches = [torch.randn(4, 5, 3) for _ in range(passes - 1)] + [torch.randn(2, 5, 3)]
    backwards = 0
    with pytest.raises(RuntimeError, match="Expected hidden size"), watch() as w:
        hidden = torch.zeros(1, 4, 8)
        for x in batches:
            hidden = hidden.detach()
            out, hidden = rnn(x, hidden)
            loss = head(out[:, -1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            backwards += 1
            opt.step()
    assert backwards == passes - 1
    [error] = w.report.items
    assert error.label == "the loop raised RuntimeError", error.label
    assert f"; the loop raised in iteration {passes})" in str(w).split("\n")[0], str(w)


@pytest.mark.parametrize("passes", [3, 6])
def test_a_pass_of_a_while_loop_that_raises_before_its_first_backward_is_counted_as_its_own_iteration(
    passes: int,
) -> None:
    """A ``while`` over a dataset in slices of 3 against a fixed projection made for 3 rows: the last, short slice
    raises in its forward. Its pass, told by the lines a ``while``'s events come back to, was put in the pass before it
    ("2 iterations watched; the loop raised in iteration 2" of a loop that printed "pass 3"). The truth: bare Python
    raises in the pass of the short slice."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    projection, data = torch.randn(3, 2), torch.randn(3 * passes - 1, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    started = []
    with pytest.raises(RuntimeError, match="size of tensor"), watch() as w:
        start = 0
        while start < len(data):
            started.append(start)
            batch = data[start : start + 3]
            start += 3
            loss = (model(batch) * projection).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert len(started) == passes
    assert f"; the loop raised in iteration {passes})" in str(w).split("\n")[0], str(w)


class _TrainerWithATotal:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.total_loss: Any = 0.0

    def train(self, as_printed: bool) -> None:
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(self.net(torch.randn(5, 4)), torch.randn(5, 1))
            self.opt.zero_grad()
            if as_printed:
                self.total_loss += loss.item()
                loss.backward()
            else:
                self.total_loss += loss
                self.total_loss.backward()
            self.opt.step()


def test_a_total_of_losses_kept_on_self_gets_the_fix_a_total_under_a_plain_name_gets() -> None:
    """``self.total_loss += loss; self.total_loss.backward()`` in a trainer's method: "add `self.total_loss =
    self.total_loss.detach()` at the end of each iteration", where ``total_loss += loss`` gets "add a number
    instead": one mistake, two fixes by how the total is spelled. The truth: the number, and the iteration's own loss
    backpropagated, runs."""
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _TrainerWithATotal().train(as_printed=False)
    [item] = w.report.items
    assert item.fix.startswith("add a number instead (`self.total_loss += loss.item()`)"), item.fix
    _TrainerWithATotal().train(as_printed=True)


def test_a_retain_written_on_a_later_line_of_its_call_is_named_at_that_line() -> None:
    """WGAN-GP's penalty, and GAIL's, spread ``autograd.grad(...)`` over several lines with ``retain_graph=True`` on
    the last: the item named the call's first line ("retain_graph=True at line 22"), whose code has no retain. The
    truth: removing the keyword from the line that holds it runs the same (create_graph keeps the graph)."""
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(critic.parameters(), lr=0.01)
    with watch() as w:
        for _ in range(3):
            x = torch.randn(6, 2, requires_grad=True)
            out = critic(x)
            gradients = torch.autograd.grad(
                outputs=out,
                inputs=x,
                grad_outputs=torch.ones_like(out),
                create_graph=True,
                retain_graph=True,
            )[0]
            penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
            opt.zero_grad()
            (out.mean() + penalty).backward()
            opt.step()
    [item] = w.report.items
    [line] = item.lines
    assert line.code.strip() == "retain_graph=True," and line.code[slice(*line.span)] == "retain_graph=True", line
    assert f"line {line_number(line.place)}" in item.label and f"line {line_number(line.place)}" in item.fix, item


LOSSES_KEPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_dict, sizes = {}, []
with watch() as w:
    for i in range(8):
        loss = model(torch.randn(5, 4)).pow(2).mean()
        if i % 2 == 0:
            loss_dict["reg"] = model.weight.pow(2).sum() * 0.1
            loss = loss + loss_dict["reg"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        KEEP
        sizes.append(sum(nodes_reached(t) for v in loss_dict.values() for t in (v if isinstance(v, list) else [v])))
"""


@pytest.mark.parametrize(
    ("keep", "grows"),
    [
        ('loss_dict["loss"] = loss', False),
        ("loss_dict[i] = loss", True),
        ('loss_dict.setdefault("all", []).append(loss)', False),
    ],
)
def test_a_dict_of_losses_overwritten_every_iteration_is_no_growing_note(keep: str, grows: bool, tmp_path: Any) -> None:
    """StyleGAN2's ``loss_dict``: each iteration's losses stored under fixed keys, a regulariser's every second
    iteration, so the dict holds graphs of two iterations at a pass's start and one at its first backward. The item
    read "`loss_dict` keeps one more iteration's graph alive every iteration ... holds them all". The truth (the
    nodes the dict reaches, counted by a probe after each pass): they stay level over the run; a dict given a new key
    each iteration grows, and is still a note."""
    path = tmp_path / "losses_kept.py"
    path.write_text(f"from backward_twice.watcher import watch\n{LOSSES_KEPT.replace('KEEP', keep)}")
    ran = runpy.run_path(str(path), init_globals={"nodes_reached": _nodes})
    sizes, w = ran["sizes"], ran["w"]
    if "append" in keep:  # a list under a fixed key that grows: the note names it
        assert sizes[-1] > sizes[2] and any("loss_dict['all']" in item.label for item in w.report.items), str(w)
        return
    assert (max(sizes[2:]) > max(sizes[:2])) == grows, sizes  # the probe
    growing = [item for item in w.report.items if "loss_dict" in item.label and "every iteration" in item.label]
    assert bool(growing) == grows, str(w)


TOTAL_CAUGHT = """
import torch
from backward_twice.watcher import watch

torch.manual_seed(0)
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
total, caught = 0, []


def step():
    global total
    opt.zero_grad()
    loss = (net(torch.randn(4, 3)) - 1).pow(2).mean()
    total = total + loss  # COMMENT
    try:
        total.backward()
    except RuntimeError as error:
        caught.append(str(error))
        total = 0
    opt.step()


with watch() as w:
    for _ in range(3):
        step()
"""


def test_a_totals_fix_quotes_code_without_the_lines_comment(tmp_path: Any) -> None:
    """A step's running total of losses kept as a tensor, backpropagated, its error caught and the total reset: the
    fix read "name this iteration's loss (`loss = loss  # the epoch's total`)", the line's comment taken as the term
    added. The truth: without the comment the line is the same code, and gets the same fix."""
    fixes = []
    for comment in ("# the epoch's total", "", '* float("1#2".count("#"))  # a hash in a string is code'):
        path = tmp_path / f"total{len(fixes)}.py"
        path.write_text(TOTAL_CAUGHT.replace("# COMMENT", comment))
        ran = runpy.run_path(str(path))
        assert ran["caught"] and "second time" in ran["caught"][0]  # bare Python's step catches its error
        fixes.append(next(item.fix for item in ran["w"].report.items if item.to_fix))
    assert "#" not in fixes[0] and fixes[0] == fixes[1], fixes
    assert 'float("1#2".count("#"))`' in fixes[2], fixes  # the whole expression, its own hashes in their strings


def test_a_step_called_by_the_loop_has_its_own_forward_lines_named_for_the_stale_graph() -> None:
    """A step function (called by the watched loop) that steps between two backward calls of one forward, its error
    caught: the fix read "compute line N again", N the loop's line ``step()``. The truth: the forward is the step's
    own ``out = net(x)``; computed again after the step, the second backward runs."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    caught = []

    def step() -> None:
        opt.zero_grad()
        out = net(x)
        first, second = (out - y).pow(2).mean(), out.abs().mean()
        first.backward(retain_graph=True)
        opt.step()
        try:
            second.backward()
        except RuntimeError as error:
            caught.append(error)

    with watch() as w:
        for _ in range(3):
            step()
    assert len(caught) == 3
    [item] = w.report.items
    lines = [int(n) for n in re.findall(r"\d+", item.fix.split(" again")[0])]
    source, first = inspect.getsourcelines(step)
    named = [source[n - first].strip() for n in lines]
    assert named and named[0] == "out = net(x)" and not any(code == "step()" for code in named), (item.fix, named)


def _two_cells_carried(detach: tuple[str, ...]) -> None:
    """An encoder's and a decoder's states kept in one dict across batches, ``detach`` the ones detached first."""
    torch.manual_seed(0)
    cells = torch.nn.ModuleDict({"enc": torch.nn.RNNCell(3, 5), "dec": torch.nn.RNNCell(5, 5)})
    optimizer = torch.optim.SGD(cells.parameters(), lr=0.05)
    states = {"enc": torch.zeros(1, 5), "dec": torch.zeros(1, 5)}
    for _ in range(3):
        for key in detach:
            states[key] = states[key].detach()
        states["enc"] = cells["enc"](torch.randn(1, 3), states["enc"])
        states["dec"] = cells["dec"](states["enc"], states["dec"])
        optimizer.zero_grad()
        states["dec"].pow(2).mean().backward()
        optimizer.step()


def test_a_second_carrier_the_raising_backward_reached_freed_is_not_called_harmless() -> None:
    """Two states carried, the backward raising in iteration 2: the second item said "every backward follows
    `states['dec']` back into the previous iteration's graph, one graph at a time (it does not pile up)", as if
    it were harmless. The truth (no helpers): detaching either state alone still raises; both, it runs."""
    for alone in ("enc", "dec"):
        with pytest.raises(RuntimeError, match="second time"):
            _two_cells_carried((alone,))
    _two_cells_carried(("enc", "dec"))
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _two_cells_carried(())
    first, second = w.report.items
    assert "which that iteration's backward already freed" in first.why, str(w)
    assert second.why.endswith("already freed: with only the item above fixed, it still raises"), str(w)
    assert "does not pile up" not in str(w)


class _RunningMean(torch.nn.Module):
    """A layer keeping a running mean of its outputs in a registered buffer, updated with autograd recording."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.linear, self.in_place = torch.nn.Linear(3, 4), in_place
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.in_place:
            self.avg.mul_(0.9).add_(0.1 * h.mean(0))
        else:
            self.avg = 0.9 * self.avg + 0.1 * h.mean(0)
        return h


@pytest.mark.parametrize("in_place", [True, False])
def test_a_buffer_updated_from_itself_is_a_growing_graph_in_a_loop_of_two_passes(in_place: bool) -> None:
    """A running mean kept in a buffer with autograd recording, in a loop of 2 passes: "healthy" (its graph spans one
    pass at the only later start the loop reaches); from 3 passes on, "holds a graph that grows". The truth (no
    helpers): after pass 2 the buffer's graph reaches pass 1's nodes; under no_grad it holds none."""
    torch.manual_seed(0)
    layer = _RunningMean(in_place)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(2):
            optimizer.zero_grad()
            layer(torch.randn(5, 3)).pow(2).mean().backward()
            optimizer.step()
    assert layer.avg.grad_fn is not None  # the truth: the buffer keeps a graph, pass 1's inside pass 2's
    [item] = w.report.items
    assert item.label == "`layer.avg` holds a graph that grows every iteration", str(w)
    assert item.fix.endswith(" under `with torch.no_grad():`"), item.fix


def _features_before_the_loop(inside: bool) -> None:
    """A frozen encoder's features taken before the loop without ``no_grad`` (a forum's autoencoder), batches cut
    from them by their length; ``inside``: the features taken again inside the loop."""
    torch.manual_seed(0)
    encoder, classifier = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.1)
    inputs, labels = torch.randn(20, 4), torch.randint(0, 2, (20,))
    features = encoder(inputs)
    for _ in range(2):
        start = 0
        while start < len(features):
            end = min(start + 10, len(features))
            batch = encoder(inputs)[start:end] if inside else features[start:end]
            loss = torch.nn.functional.cross_entropy(classifier(batch), labels[start:end])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            start = end


def test_a_length_read_is_not_where_a_graph_comes_in() -> None:
    """``end = min(start + 10, len(features))`` was shown as where "the graph built before the loop comes in here":
    ``len()`` gives a number. The line that slices the features is. The truth (no helpers): as written the second
    batch raises; the features taken inside the loop, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _features_before_the_loop(inside=False)
    [item] = w.report.items
    assert item.lines[0].code.startswith("batch = "), item.lines
    assert item.lines[0].label == "the graph built before the loop comes in here", item.lines[0]
    _features_before_the_loop(inside=True)


class _CachedAttention(torch.nn.Module):
    """A hand-written attention keeping its keys and values in caches written by slice (meta-llama's ``cache_k``,
    ``cache_v``), never detached."""

    def __init__(self) -> None:
        super().__init__()
        self.wk, self.wv = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.cache_k, self.cache_v = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)

    def forward(self, x: torch.Tensor, detach: tuple[str, ...]) -> torch.Tensor:
        for name in detach:
            setattr(self, name, getattr(self, name).detach())
        self.cache_k[:, :3] = self.wk(x)
        self.cache_v[:, :3] = self.wv(x)
        scores = (x @ self.cache_k.transpose(1, 2)).softmax(-1)
        return scores @ self.cache_v


def _cached_attention(detach: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    attention = _CachedAttention()
    optimizer = torch.optim.SGD(attention.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        attention(torch.randn(2, 3, 4), detach).pow(2).mean().backward()
        optimizer.step()


def test_a_second_cache_written_by_slice_is_said_to_raise_too() -> None:
    """meta-llama/llama-cookbook#247: ``cache_k`` and ``cache_v`` both carried, the second item "one graph at a time
    (it does not pile up)": its own node (a slice's write) saves nothing, so it was not seen among the freed. The
    truth (no helpers): detaching either cache alone still raises; both, it runs."""
    for alone in ("cache_k", "cache_v"):
        with pytest.raises(RuntimeError, match="second time"):
            _cached_attention((alone,))
    _cached_attention(("cache_k", "cache_v"))
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _cached_attention(())
    first, second = w.report.items
    assert {"cache_k", "cache_v"} == {item.label.split("`")[1].rsplit(".", 1)[1] for item in (first, second)}, str(w)
    assert second.why.endswith("already freed: with only the item above fixed, it still raises"), str(w)


class _Agent:
    """toshikwa/soft-actor-critic.pytorch's SacAgent.learn(), shrunk (its issue #1): the policy loss is computed before
    the critic's step, and walked after it; ``alpha`` is ``log_alpha.exp()``, a graph made in ``__init__``."""

    def __init__(self) -> None:
        self.policy = torch.nn.Linear(3, 2)
        self.critic = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        self.policy_optim = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.q_optim = torch.optim.Adam(self.critic.parameters(), lr=1e-2)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=1e-2)
        self.alpha = self.log_alpha.exp()

    def policy_loss(self, states: torch.Tensor) -> torch.Tensor:
        actions = torch.tanh(self.policy(states))
        return (-self.critic(torch.cat([states, actions], 1)) - self.alpha * actions.sum(1, keepdim=True)).mean()

    def learn(self, states: torch.Tensor, late: bool, detach_alpha: bool) -> None:
        if detach_alpha:
            self.alpha = self.alpha.detach()
        q_loss = (self.critic(torch.cat([states, torch.rand(len(states), 2)], 1)) - 1).pow(2).mean()
        policy_loss = self.policy_loss(states) if not late else None
        _update(self.q_optim, q_loss)
        _update(self.policy_optim, self.policy_loss(states) if policy_loss is None else policy_loss)
        _update(self.alpha_optim, -(self.log_alpha * 0.5).mean())
        self.alpha = self.log_alpha.exp()


def _update(optim: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optim.zero_grad()
    loss.backward()
    optim.step()


def _sac(late: bool = False, detach_alpha: bool = False) -> None:
    torch.manual_seed(0)
    agent = _Agent()
    for states in torch.randn(3, 8, 3):
        agent.learn(states, late, detach_alpha)


def test_a_policy_loss_computed_before_the_critics_step_is_the_cause_not_a_graph_carried_beside_it() -> None:
    """It was "`agent.alpha` carries the graph built before the loop ... build `agent` inside the loop" (a new agent
    each pass: training from scratch), the stale policy loss unsaid. The truth: computed after the critic's step, the
    loop runs; ``alpha`` detached alone, it still raises."""
    with pytest.raises(RuntimeError, match="inplace"):
        _sac()
    with pytest.raises(RuntimeError, match="inplace"):
        _sac(detach_alpha=True)
    _sac(late=True)
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        _sac()
    first, *others = w.report.items
    source, start = inspect.getsourcelines(_Agent.learn)
    stale = next(start + i for i, code in enumerate(source) if code.strip().startswith("policy_loss = "))
    step_source, step_start = inspect.getsourcelines(_update)
    step = next(step_start + i for i, code in enumerate(step_source) if code.strip() == "optim.step()")
    assert first.label == f"this backward goes through line {stale}, computed before the step at line {step}", first
    q_update = next(start + i for i, code in enumerate(source) if code.strip().startswith("_update(self.q_optim"))
    assert first.fix == f"compute line {stale} again after line {q_update}", first.fix
    assert all("build `agent`" not in item.fix for item in others), [item.fix for item in others]


def _hand_update_then_reuse(again: bool) -> torch.nn.Module:
    """A hand-written update (a loop over the weights under ``no_grad``), then a smoothness loss on the prediction
    made before it; ``again``: the prediction computed again once the ``with`` block ends."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    xs, ys = torch.randn(3, 6, 3), torch.randn(3, 6, 2)
    for x, y in zip(xs, ys):
        yhat = net(x)
        (yhat - y).pow(2).mean().backward(retain_graph=not again)
        with torch.no_grad():
            for w in net.parameters():
                w -= 0.1 * w.grad
                w.grad = None
        if again:
            yhat = net(x)
        yhat.diff(dim=0).pow(2).mean().backward()
    return net


def test_a_forward_reused_after_a_hand_update_in_a_with_block_goes_again_after_the_block() -> None:
    """It said "compute line N again after the step at line M", M the update inside the ``for`` inside ``with
    torch.no_grad():``: put there, the forward runs under no_grad ("does not require grad"). The truth: computed again
    after the ``with`` block, the loop runs."""
    with pytest.raises(RuntimeError, match="inplace"):
        _hand_update_then_reuse(again=False)
    _hand_update_then_reuse(again=True)
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        _hand_update_then_reuse(again=False)
    [item] = w.report.items
    source, start = inspect.getsourcelines(_hand_update_then_reuse)
    forward = next(start + i for i, code in enumerate(source) if code.strip() == "yhat = net(x)")
    block_end = next(start + i for i, code in enumerate(source) if code.strip() == "w.grad = None")
    assert item.fix.startswith(f"compute line {forward} again after line {block_end}"), item.fix


def _heads_on_a_shared_body(again: bool) -> None:
    """Two heads on a shared body, each loss backwarded, one step, then a loss on both heads' old outputs;
    ``again``: the body and the heads computed again after the step."""
    torch.manual_seed(0)
    body, h1, h2 = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    opt = torch.optim.Adam([*body.parameters(), *h1.parameters(), *h2.parameters()], lr=0.01)
    for x in torch.randn(3, 5, 3):
        z = torch.tanh(body(x))
        a, b = h1(z), h2(z)
        opt.zero_grad()
        a.pow(2).mean().backward(retain_graph=True)
        b.abs().mean().backward(retain_graph=not again)
        opt.step()
        if again:
            z = torch.tanh(body(x))
            a, b = h1(z), h2(z)
        (a * b).mean().backward()
        opt.step()


def test_a_loss_on_two_stale_outputs_computes_both_again_not_one_detached() -> None:
    """``(a * b).mean().backward()`` after the step, ``a`` and ``b`` both on stepped heads: "use `b.detach()` in the
    loss ...: this loss does not train them", which, applied, still raised (``a`` saved stepped weights too), and
    the loss does train ``h2`` through ``b``. The truth (no helpers): ``b`` detached still raises; ``z``, ``a`` and
    ``b`` computed again after the step run, the second retain then not needed."""
    with pytest.raises(RuntimeError, match="inplace"):
        _heads_on_a_shared_body(again=False)
    _heads_on_a_shared_body(again=True)
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        _heads_on_a_shared_body(again=False)
    [item] = w.report.items
    source, start = inspect.getsourcelines(_heads_on_a_shared_body)
    z, heads = (
        next(start + i for i, code in enumerate(source) if code.strip() == want)
        for want in ("z = torch.tanh(body(x))", "a, b = h1(z), h2(z)")
    )
    assert item.fix.startswith(f"compute lines {z} and {heads} again after the step"), item.fix
    assert "detach" not in item.fix, item.fix


def _three_steps_then_a_check(catch: bool) -> list[str]:
    """Three passes of a plain loop, then the learner's own check after it: one more ``loss.backward()``, which
    raises (the last pass's backward freed that graph); ``catch``: the check catches it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = (model(torch.randn(5, 4)) - 1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    try:
        loss.backward()
    except RuntimeError as error:
        if not catch:
            raise
        return [str(error)]
    return []


def test_a_backward_after_the_loop_is_no_pass_of_it_and_caught_there_no_training_error() -> None:
    """A backward after the loop ended (the learner checks that the graph is freed) made the run split by the
    optimizer's steps, "4 iterations watched" of a loop of 3 passes, and, caught there, "1 thing to fix ... the loop
    raised in iteration 3" while the script went on and exited 0. The truth (no helpers): the loop runs 3 passes
    without error; the check raises after it."""
    assert _three_steps_then_a_check(catch=True)
    with watch() as w:
        assert _three_steps_then_a_check(catch=True)
    assert w.verdicts.error is None and not w.report.items, w.report
    assert w.report.headline.startswith("backward-twice: healthy (3 iterations watched"), w.report.headline
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _three_steps_then_a_check(catch=False)
    assert "(3 iterations watched; a backward after the loop raised)" in w.report.headline, w.report.headline
    [item] = w.report.items
    assert item.label.startswith("a second backward through the graph"), item.label


def _one_epoch_rebinding_its_names(
    model: torch.nn.Module, batches: list[tuple[list[torch.Tensor], None]], epoch: int
) -> int:
    """DINO's ``train_one_epoch`` shape: the body rebinds two of the names its ``for`` binds before its backward; the
    third (``_``, its loader's unused target) is the same in every pass."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    passes = 0
    for it, (images, _) in enumerate(batches):
        passes += 1
        it = len(batches) * epoch + it  # the global iteration, as DINO numbers it
        images = list(images)
        loss = model(images[0]).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return passes


def test_a_batch_loop_whose_body_rebinds_its_names_before_the_backward_counts_each_pass() -> None:
    """``it = len(data_loader) * epoch + it`` and ``images = [...]`` at the top of the body, in a function called
    once per epoch: "4 iterations watched" for 6 passes (3 epochs of 2), every pass after the tracer's first two read
    as the one before it. The truth: the loop's own count of its passes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    batches = [([torch.randn(1, 2)], None) for _ in range(2)]
    passes = 0
    with watch() as w:
        for epoch in range(3):
            passes += _one_epoch_rebinding_its_names(model, batches, epoch)
    assert passes == 6
    assert w.report.headline.startswith(f"backward-twice: healthy ({passes} iterations watched"), w.report.headline


def _one_epoch_stepping_every_other_pass(model: torch.nn.Module, batches: list[torch.Tensor]) -> int:
    """OpenCLIP's accumulation shape: the first pass of each pair only caches its batch and ``continue``s."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cached, passes = [], 0
    for i, x in enumerate(batches):
        passes += 1
        cached.append(x)
        if (i + 1) % 2 > 0:
            continue
        optimizer.zero_grad()
        model(torch.cat(cached)).pow(2).mean().backward()
        optimizer.step()
        cached.clear()
    return passes


@pytest.mark.parametrize("epochs", [2, 3])
def test_a_pass_with_no_backward_first_in_each_call_of_the_epoch_counts(epochs: int) -> None:
    """A pass that only caches and ``continue``s, first in each call of the epoch's function: "6 iterations watched"
    for 8 passes, the new call's first pass lost (the counter went back, in a frame of the same id, or the batches,
    the same objects each epoch, read as the last event's). The truth: the loop's own count of its passes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    batches = [torch.randn(3, 2) for _ in range(4 if epochs == 2 else 2)]
    passes = 0
    with watch() as w:
        for _ in range(epochs):
            passes += _one_epoch_stepping_every_other_pass(model, batches)
    assert w.report.headline.startswith(f"backward-twice: healthy ({passes} iterations watched"), w.report.headline


def _actor_critic_update(q_again: bool) -> None:
    """An actor's loss on ``q_pi = critic(s, a)``, computed before the critic's step and walked after it; the actor
    learns through ``q_pi`` into its action. ``q_again``: ``q_pi`` computed again after the critic's step."""
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(3, 2), torch.nn.Linear(5, 1)
    log_alpha = torch.zeros(1, requires_grad=True)  # SAC's temperature: the actor's loss trains it too
    actor_opt = torch.optim.Adam([*actor.parameters(), log_alpha], lr=1e-2)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for s, r in zip(torch.randn(3, 4, 3), torch.randn(3, 4, 1)):
        a = torch.tanh(actor(s))
        q_pi = critic(torch.cat([s, a], 1))
        critic_loss = (critic(torch.cat([s, a.detach()], 1)) - r).pow(2).mean()
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        if q_again:
            q_pi = critic(torch.cat([s, a], 1))
        actor_loss = (log_alpha.exp() * a.pow(2).sum(1, keepdim=True) - q_pi).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()


def test_a_stale_q_the_actor_learns_through_is_computed_again_not_detached() -> None:
    """It said "use `q_pi.detach()` in the loss ...: this loss does not train them": the actor's only way to Q is
    through ``q_pi``; detached, it trains on the action penalty alone. The truth (no helpers): ``q_pi`` computed
    again after the critic's step runs."""
    with pytest.raises(RuntimeError, match="inplace"):
        _actor_critic_update(q_again=False)
    _actor_critic_update(q_again=True)
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        _actor_critic_update(q_again=False)
    [item] = w.report.items
    source, start = inspect.getsourcelines(_actor_critic_update)
    q_pi = next(start + i for i, code in enumerate(source) if code.strip() == "q_pi = critic(torch.cat([s, a], 1))")
    assert item.fix.startswith(f"compute line {q_pi} again after the step"), item.fix


STALE_AT_A_SCRIPTS_TOP_LEVEL = """
import torch

torch.manual_seed(0)
value = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
value_opt = torch.optim.Adam(value.parameters(), lr=1e-2)
for step in range(3):
    delta = 1.0 - value(torch.randn(4))
    value_opt.zero_grad()
    (-delta).backward(retain_graph=True)
    value_opt.step()
    (delta * 2).backward()
"""


def test_a_stale_forward_at_a_scripts_top_level_is_named_there_when_the_script_is_run_from_code(tmp_path: Any) -> None:
    """A script run by ``runpy.run_path`` inside ``with watch():``: "this backward goes through line 4" named the
    runner's ``runpy.run_path(...)`` line, the nearest caller out of the script. The truth: the forward is the
    script's ``delta = ...`` (computed again after the step, it runs)."""
    script = tmp_path / "reinforce.py"
    script.write_text(STALE_AT_A_SCRIPTS_TOP_LEVEL)
    with pytest.raises(RuntimeError, match="inplace"):
        runpy.run_path(str(script))
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        runpy.run_path(str(script))
    item = w.report.items[0]
    forward = STALE_AT_A_SCRIPTS_TOP_LEVEL.split("\n").index("    delta = 1.0 - value(torch.randn(4))") + 1
    assert item.label.startswith(f"this backward goes through line {forward},"), item.label
    assert item.lines[0].place.startswith("reinforce.py:"), item.lines[0]


class _KeepsKL:
    """A training step that keeps each batch's KL term in a list, which another method stacks at the epoch's end
    (a Lightning module's ``on_train_batch_end`` / ``on_train_epoch_end``, as learners write them)."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(3, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.kls: list[torch.Tensor] = []

    def step(self, x: torch.Tensor) -> None:
        mu = self.model(x)
        kl = mu.pow(2).mean()
        self.opt.zero_grad()
        (mu.abs().mean() + kl).backward(retain_graph=False)
        self.opt.step()
        self.kls.append(kl)

    def epoch_end(self) -> torch.Tensor:
        return torch.stack(self.kls).mean()


def test_a_note_on_a_list_stacked_elsewhere_keeps_detached_tensors_not_numbers() -> None:
    """The note said "`self.kls.append(kl.item())`, or `kl.detach()` if you need the tensor": the first, applied,
    made the learner's own ``torch.stack(self.kls)`` raise on floats. The truth (no helpers): ``.detach()`` there
    runs and keeps the same weights."""
    torch.manual_seed(0)
    keeper = _KeepsKL()
    with watch() as w:
        for x in torch.randn(3, 4, 3):
            keeper.step(x)
    keeper.epoch_end()
    [note] = [item for item in w.report.items if item.kind == "note"]
    assert note.fix == "`self.kls.append(kl.detach())`", note.fix
    keeper.kls = [k.item() for k in keeper.kls]  # type: ignore[misc]
    with pytest.raises(TypeError, match="float"):
        keeper.epoch_end()


def _reinforce_updated_twice_on_one_episode(log_probs_as: str) -> list[torch.Tensor]:
    """pytorch/examples#151's REINFORCE: an episode's log-probs kept in a list, then two updates on samples of it.
    ``log_probs_as``: "kept" (as asked: the second update walks the episode's freed graph), "detached" (the list keeps
    detached copies), "computed again" (each update computes its samples' log-probs from the states and actions)."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
    states, actions, log_probs = [], [], []
    for _ in range(6):
        state = torch.randn(1, 4)
        m = torch.distributions.Categorical(logits=policy(state))
        action = m.sample()
        states.append(state)
        actions.append(action)
        log_probs.append(m.log_prob(action))
    if log_probs_as == "detached":
        log_probs = [log_prob.detach() for log_prob in log_probs]
    for picked in ([0, 2, 4], [2, 3, 4]):
        chosen = [log_probs[i] for i in picked]
        if log_probs_as == "computed again":
            chosen = [torch.distributions.Categorical(logits=policy(states[i])).log_prob(actions[i]) for i in picked]
        loss = -torch.cat(chosen).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in policy.parameters()]


def test_a_list_the_loss_trains_only_through_is_computed_again_not_kept_detached() -> None:
    """Two updates on one episode's kept log-probs: the fix said "keep detached copies in `log_probs`", with which
    the loss has no gradient and its backward raises. The truth (no helpers): as written, the second update raises;
    detached copies raise "does not require grad"; the log-probs computed again from the kept states and actions
    train."""
    with pytest.raises(RuntimeError, match="second time"):
        _reinforce_updated_twice_on_one_episode("kept")
    with pytest.raises(RuntimeError, match="does not require grad"):
        _reinforce_updated_twice_on_one_episode("detached")
    trained = _reinforce_updated_twice_on_one_episode("computed again")
    assert not torch.equal(trained[0], torch.nn.Linear(4, 2).weight)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _reinforce_updated_twice_on_one_episode("kept")
    source = inspect.getsource(_reinforce_updated_twice_on_one_episode).splitlines()
    line = _reinforce_updated_twice_on_one_episode.__code__.co_firstlineno + source.index(
        "        log_probs.append(m.log_prob(action))"
    )
    fixes = [item.fix for item in w.report.items]
    assert any(fix.startswith(f"compute `m.log_prob(action)` (line {line}) again") for fix in fixes), fixes
    assert not any("detached copies in `log_probs` (" in fix for fix in fixes), fixes


def _lbfgs_in_a_while_loop(optimizer_class: type[torch.optim.Optimizer]) -> tuple[int, int]:
    """A ``while`` loop whose one step is ``optimizer.step(closure)``: LBFGS calls the closure (and its backward)
    several times inside that step, SGD once. Returns (passes, backward calls)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    passes, backward_calls = 0, [0]
    while passes < 3:

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            backward_calls[0] += 1
            return loss

        optimizer.step(closure)
        passes += 1
    return passes, backward_calls[0]


@pytest.mark.parametrize("optimizer_class", [torch.optim.LBFGS, torch.optim.SGD])
def test_a_while_loop_whose_step_runs_a_closure_counts_its_own_passes(
    optimizer_class: type[torch.optim.Optimizer],
) -> None:
    """LBFGS in a ``while`` loop: "7 iterations watched" for 3 passes (each backward inside the step, and the step's
    own event after them, came back to the loop's line: a new pass each). The truth: the loop's own count."""
    passes, calls = _lbfgs_in_a_while_loop(optimizer_class)
    with watch() as w:
        assert _lbfgs_in_a_while_loop(optimizer_class) == (passes, calls)
    headline = f"backward-twice: healthy ({passes} iterations watched, {calls} backward call"
    assert w.report.headline.startswith(headline), w.report.headline


def _lbfgs_on_features(computed_inside: bool) -> list[torch.Tensor]:
    """An encoder and a head trained by LBFGS, the encoder's ``features`` computed outside the closure (as a learner
    wrote it: LBFGS's second call of the closure walks the graph the first call's backward freed) or inside it (the
    fix as printed: the line moved in)."""
    torch.manual_seed(0)
    encoder, head = torch.nn.Linear(5, 8), torch.nn.Linear(8, 1)
    optimizer = torch.optim.LBFGS([*encoder.parameters(), *head.parameters()], lr=0.5, max_iter=4)
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    for _ in range(2):
        features = torch.tanh(encoder(x))

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(head(features), y)  # noqa: B023 (the pass's own, as learners write it)
            loss.backward()
            return loss

        def closure_with_the_forward() -> torch.Tensor:
            optimizer.zero_grad()
            features = torch.tanh(encoder(x))
            loss = torch.nn.functional.mse_loss(head(features), y)
            loss.backward()
            return loss

        optimizer.step(closure_with_the_forward if computed_inside else closure)
    return [p.detach().clone() for p in [*encoder.parameters(), *head.parameters()]]


def test_a_forward_outside_the_closure_lbfgs_runs_twice_in_one_step_is_computed_inside_it() -> None:
    """LBFGS calls the closure several times in one step; ``features`` from outside it: "build `features` inside the
    loop that runs line N's backward" (the learner's loop builds it each pass already; the loop meant is LBFGS's).
    The truth (no helpers): as written the first step raises; computed inside the closure it trains."""
    with pytest.raises(RuntimeError, match="second time"):
        _lbfgs_on_features(computed_inside=False)
    _lbfgs_on_features(computed_inside=True)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _lbfgs_on_features(computed_inside=False)
    source = inspect.getsource(_lbfgs_on_features).splitlines()
    first = _lbfgs_on_features.__code__.co_firstlineno
    built = first + source.index("        features = torch.tanh(encoder(x))")
    read = first + next(
        i
        for i, line in enumerate(source)
        if line.endswith("(head(features), y)  # noqa: B023 (the pass's own, as learners write it)")
    )
    [item] = w.report.items
    assert item.fix.startswith(f"compute `features` inside `closure` (move line {built} into it, before line {read})")


class _Runner:
    """A learner's trainer class: ``self.total`` starts as a number, then ``+=`` each step's loss (in place, from the
    second step on); ``end_epoch`` compares it with ``self.best`` as tensors."""

    def __init__(self, in_place: bool) -> None:
        self.model = torch.nn.Linear(5, 3)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.in_place = in_place
        self.total: Any = 0.0
        self.best = torch.tensor(float("inf"))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        if self.in_place:
            self.total += loss
        else:
            self.total = self.total + loss

    def end_epoch(self) -> None:
        if self.best > self.total:
            self.best = self.total
        self.total = 0.0


def _epochs_of_a_runner(in_place: bool) -> _Runner:
    torch.manual_seed(0)
    runner = _Runner(in_place)
    batches = [(torch.randn(4, 5), torch.randint(0, 3, (4,))) for _ in range(3)]
    for _ in range(2):
        for x, y in batches:
            runner.step(x, y)
        runner.end_epoch()
    return runner


def _steps_held(tensor: torch.Tensor) -> int:
    """How many cross-entropy nodes the graph under ``tensor`` holds: one per step it still keeps."""
    return sum(type(node).__name__.startswith("NllLoss") for node in _walk_nodes(tensor.grad_fn))


def _walk_nodes(root: Any) -> list[Any]:
    seen, layer = {}, [root]
    while layer:
        fresh = {id(node): node for node in layer if node is not None and id(node) not in seen}
        seen.update(fresh)
        layer = [child for node in fresh.values() for child, _ in node.next_functions]
    return list(seen.values())


@pytest.mark.parametrize("in_place", [True, False], ids=["+=", "= ... +"])
def test_a_total_and_a_best_on_a_trainers_self_are_noted_each_where_it_grows(in_place: bool) -> None:
    """``self.total += loss`` (in place) in a trainer's method was "healthy": the note of ``r.total`` (read in the
    loop's frame, not growing) and ``self.total`` (growing) merged into the first. With ``self.best = self.total``
    too, the two were one note of ``self``, whose "fix" put ``.item()`` on the model's input. The truth (no helpers):
    ``self.best`` holds the graphs of 3 steps, ``self.total`` of each step of its epoch."""
    runner = _epochs_of_a_runner(in_place)
    assert _steps_held(runner.best) == 3
    with watch() as w:
        _epochs_of_a_runner(in_place)
    names = [item.label.split("`")[1] for item in w.report.items]
    assert names[0] == "self.total" and set(names) <= {"self.total", "self.best"}, w.report
    assert all(".item())" not in item.fix for item in w.report.items), w.report


def _anchor_built_before_the_loop(detached: bool) -> None:
    """An anchor's output computed once before the loop and the only input of each pass's loss (``detached``: the
    detach the fix offered)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    anchor, targets = torch.randn(8, 4), [torch.randn(8, 2) for _ in range(3)]
    anchor_out = model(anchor).detach() if detached else model(anchor)
    for target in targets:
        loss = torch.nn.functional.mse_loss(anchor_out, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _anchor_computed_inside_the_loop() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    anchor, targets = torch.randn(8, 4), [torch.randn(8, 2) for _ in range(3)]
    for target in targets:
        loss = torch.nn.functional.mse_loss(model(anchor), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_graph_built_before_the_loop_that_is_the_losss_only_way_is_not_offered_a_detach() -> None:
    """ "compute `anchor_out` inside the loop (or `anchor_out = anchor_out.detach()`, if it needs no gradient)": the
    loss trains through nothing else. The truth (no helpers): detached, its backward raises "does not require grad";
    computed inside the loop, it trains."""
    with pytest.raises(RuntimeError, match="does not require grad"):
        _anchor_built_before_the_loop(detached=True)
    _anchor_computed_inside_the_loop()
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _anchor_built_before_the_loop(detached=False)
    fixes = [item.fix for item in w.report.items]
    assert any(fix.startswith("compute `anchor_out` inside the loop") for fix in fixes), fixes
    assert not any("needs no gradient" in fix for fix in fixes), fixes


_SOME_PASSES: dict[str, Any] = {}


def _forward_in_every_other_call() -> None:
    """A step whose forward runs in every other call only (kept in a dict between calls), walked in each."""
    model, optimizer, x, y = _SOME_PASSES["parts"]
    if _SOME_PASSES["calls"] % 2 == 0:
        _SOME_PASSES["pred"] = model(x)
    _SOME_PASSES["calls"] += 1
    loss = ((_SOME_PASSES["pred"] - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_a_step_that_walks_an_earlier_calls_only_forward_is_told_to_compute_it_not_detach_it() -> None:
    """``bt.diagnose`` (a harness's runs, no loop of the learner's): "add `pred = pred.detach()` at the end of each
    iteration", with which the loss has no gradient. The truth (no helpers): the second call raises; with the forward
    in every call it trains."""
    from backward_twice.steps.diagnose import diagnose

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    _SOME_PASSES.update(parts=(model, optimizer, torch.randn(16, 3), torch.randn(16, 1)), calls=0)
    _forward_in_every_other_call()
    with pytest.raises(RuntimeError, match="second time"):
        _forward_in_every_other_call()
    _SOME_PASSES["calls"] = 0
    report = diagnose(_forward_in_every_other_call, models=model, optimizers=optimizer)
    fixes = [item.fix for item in report.report.items]
    assert any("again in each iteration that walks it" in fix for fix in fixes), fixes
    assert not any("'].detach()` at" in fix for fix in fixes), fixes


def _second_order_updates(reset: bool) -> None:
    """Micro-batches' ``backward(create_graph=True)`` accumulated in ``.grad``, then an update scaled by a Hessian-
    vector product through those gradients (AdaHessian-like, by hand); ``reset``: the gradients set to None after it
    (``model.zero_grad(set_to_none=True)``, the printed fix), as PyTorch's warning asks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    batches = [(torch.randn(3, 4), torch.randn(3, 1)) for _ in range(6)]
    for step in range(3):
        for x, y in batches[2 * step : 2 * step + 2]:
            loss = torch.nn.functional.mse_loss(model(x), y) / 2
            loss.backward(create_graph=True)
        params = list(model.parameters())
        grads = [p.grad for p in params]
        probes = [torch.randint_like(p, high=2) * 2 - 1 for p in params]
        curvatures = torch.autograd.grad(grads, params, grad_outputs=probes)
        with torch.no_grad():
            for p, g, h in zip(params, grads, curvatures):
                p -= 0.05 * g / (h.abs() + 1.0)
        if reset:
            model.zero_grad(set_to_none=True)


def test_gradients_left_with_their_graphs_across_updates_are_named_and_reset() -> None:
    """``backward(create_graph=True)`` into ``.grad``, never reset after the update: "a tensor no name of yours holds
    carries iteration 1's graph into iteration 2" (the weights' ``.grad`` held it). The truth (no helpers): as written
    the second update's Hessian-vector product walks iteration 1's graph, which the first one freed, and raises; with
    the gradients set to None after each update, it trains."""
    with pytest.raises(RuntimeError, match="second time"):
        _second_order_updates(reset=False)
    _second_order_updates(reset=True)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _second_order_updates(reset=False)
    [item] = w.report.items
    assert re.match(r"`model\[\d\]\.(weight|bias)\.grad` carries iteration 1's graph into iteration 2", item.label), (
        item
    )
    assert item.fix.startswith("set the gradients to None after each update (`model.zero_grad(set_to_none=True)`"), item
    assert "loss.backward(create_graph=True)" in item.lines[0].code, item


SPARSE_PROPAGATION_ONCE = """
import torch
torch.manual_seed(0)
graph = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [1, 0, 2]]), torch.ones(3), (6, 6))
emb = torch.nn.Parameter(torch.randn(6, 3))
opt = torch.optim.SGD([emb], lr=0.1)
propagated = torch.sparse.mm(graph, emb)
for batch in range(3):
    opt.zero_grad()
    propagated.pow(2).sum().backward()
    opt.step()
"""


def test_a_carried_graph_that_saved_a_sparse_tensor_is_judged_not_a_failure_of_the_tool(tmp_path: Path) -> None:
    """LightGCN's propagation (``torch.sparse.mm(graph, emb)``) computed once per epoch and reused by each batch: the
    tool read the bytes of the saved sparse adjacency through its storage, which a sparse tensor has not
    ("Cannot access storage of SparseTensorImpl"), switched itself off as it started, and the error came with no
    diagnosis. The truth (no helpers): "a second time" at the second batch; with the propagation inside the loop,
    it runs."""
    script = tmp_path / "lightgcn.py"
    script.write_text(SPARSE_PROPAGATION_ONCE)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        runpy.run_path(str(script))
    with pytest.raises(RuntimeError, match="backward through the graph a second time") as raised, watch() as w:
        runpy.run_path(str(script))
    assert w.report.stopped_watching is None, w.report.stopped_watching
    [item] = w.report.items
    assert "`propagated`" in item.label and "retain_graph" not in item.fix, (item.label, item.fix)
    assert any("backward-twice" in note for note in raised.value.__notes__)
    script.write_text(SPARSE_PROPAGATION_ONCE.replace("    propagated.pow", "    torch.sparse.mm(graph, emb).pow"))
    runpy.run_path(str(script))
