"""helpers/zeroed.py: an optimizer step on .grad cleared between its backward and the step.

The fact its message states is measured here without the course's code: with every step so taken, the weights
never change, for SGD, SGD with momentum and Adam, from .grad pre-filled, for each way of clearing in
tests/check_catalogue.py. Then what the watch blames, and what it does not.
"""

from __future__ import annotations

import pytest
import torch
from check_catalogue import ZEROED, ZEROED_WAYS

from helpers.zeroed import ZeroedSteps

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def model_and_batches():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, [torch.randn(16, 4) for _ in range(3)]


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def train(model, optimizer, batches, between=None, steps_cleared=None):
    for index, batch in enumerate(batches):
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        if between is not None and (steps_cleared is None or index in steps_cleared):
            between(optimizer, model)
        optimizer.step()


@pytest.mark.parametrize("way", list(ZEROED_WAYS))
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_steps_on_cleared_gradients_never_change_the_weights(kind, way) -> None:
    """The truth the message tells, from plain torch: run twice, from .grad pre-filled, the weights stay put."""
    model, batches = model_and_batches()
    optimizer = OPTIMIZERS[kind](model.parameters())
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    start = weights(model)
    for _ in range(2):
        train(model, optimizer, batches, ZEROED_WAYS[way])
    assert torch.equal(weights(model), start)


@pytest.mark.parametrize("way", list(ZEROED_WAYS))
def test_the_watch_blames_every_way_of_clearing(way) -> None:
    model, batches = model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = ZeroedSteps(list(model.parameters()))
    with watch.watching():
        train(model, optimizer, batches, ZEROED_WAYS[way])
    assert watch.problem() == "all 3 optimizer.step() calls " + ZEROED


def sam_like(model, optimizer, batch):
    """Two backward passes with a zero_grad between them, then the step: the gradient it follows is the second's."""
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.zero_grad()
    model(batch).pow(3).mean().backward()
    optimizer.step()


def second_backward_misses_a_layer(model, optimizer, batch):
    """zero_grad before a backward that reaches only the last layer: the first layer's .grad is not the step's."""
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.zero_grad()
    model[2](torch.tanh(model[0](batch)).detach()).pow(2).mean().backward()
    optimizer.step()


def cleared_by_autograd_grad(model, optimizer, batch):
    """No backward filled .grad: autograd.grad leaves it alone, and the step finds what .grad held before."""
    params = list(model.parameters())
    torch.autograd.grad(model(batch).pow(2).mean(), params)
    optimizer.step()


@pytest.mark.parametrize("step", [sam_like, second_backward_misses_a_layer, cleared_by_autograd_grad])
def test_a_zero_grad_before_the_backward_the_step_follows_is_not_blamed(step) -> None:
    model, batches = model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = ZeroedSteps(list(model.parameters()))
    with watch.watching():
        step(model, optimizer, batches[0])
    assert watch.problem() is None


def test_the_message_says_which_steps_which_weights_and_what_moved_them() -> None:
    model, batches = model_and_batches()
    watch = ZeroedSteps(list(model.parameters()), {})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch.watching():
        train(model, optimizer, batches, lambda o, m: m[0].zero_grad(), steps_cleared={1})
    assert watch.problem().startswith(
        "optimizer.step() call 2 of 3 ran with part of the gradients zeroed: .grad was cleared"
    ), watch.problem()
    assert "so the weights whose .grad was cleared did not change at that step;" in watch.problem()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with watch.watching():  # a second use forgets the first
        train(model, optimizer, batches, lambda o, m: o.zero_grad(set_to_none=False), steps_cleared={1, 2})
    assert watch.problem().startswith("2 of 3 optimizer.step() calls ran on zeroed gradients"), watch.problem()
    assert (
        "so those steps followed no gradient of their backward, only what the optimizer adds by itself"
        in watch.problem()
    )


def test_optimizers_are_named_as_the_check_names_them() -> None:
    model, batches = model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = ZeroedSteps(list(model.parameters()), {id(optimizer): "optimizerD"})
    with watch.watching():
        train(model, optimizer, batches[:1], lambda o, m: o.zero_grad())
    assert watch.problem() == "optimizerD.step() " + ZEROED


def test_an_optimizer_of_other_parameters_is_not_counted() -> None:
    model, batches = model_and_batches()
    other = torch.nn.Linear(2, 1)
    optimizer, other_optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.SGD(other.parameters(), lr=0.1),
    )
    watch = ZeroedSteps(list(model.parameters()))
    with watch.watching():
        for batch in batches[:2]:
            optimizer.zero_grad()
            model(batch).pow(2).mean().backward()
            optimizer.zero_grad()
            optimizer.step()
            other(torch.ones(1, 2)).sum().backward()
            other_optimizer.step()
    assert watch.steps == {"optimizer": 2}
    assert watch.problem() == "all 2 optimizer.step() calls " + ZEROED


def test_weight_decay_moves_weights_whose_grad_is_zeros_and_the_message_says_so() -> None:
    model, batches = model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    watch, start = ZeroedSteps(list(model.parameters())), weights(model)
    with watch.watching():
        train(model, optimizer, batches, lambda o, m: o.zero_grad(set_to_none=False))
    assert not torch.equal(weights(model), start)
    assert "so those steps followed no gradient of their backward, only what the optimizer adds" in watch.problem()
