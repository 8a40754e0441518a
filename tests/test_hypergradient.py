"""Hypergradient descent, whose loop differentiates through its own last update by design: "Gradient Descent: The
Ultimate Optimizer", retyped from kach/gradient-descent-the-ultimate-optimizer
(src/gradient_descent_the_ultimate_optimizer/gdtuo.py: ``Optimizable``, ``SGD``, ``ModuleWrapper``; the README's
loop), shrunk to a two-layer net and a stack of two SGDs. Each step sets the model's parameters to
``p.detach() - g * alpha``: the next ``loss.backward(create_graph=True)`` walks that one update's graph, once, to give
``alpha`` its gradient. Nothing piles up and nothing is walked twice; as published it is healthy in every way in.
Without the ``detach`` of ``p`` the updates chain, and the watch says so."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from backward_twice import diagnose, watch

pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


class Optimizable:
    def __init__(self, parameters: dict[str, torch.Tensor], optimizer: Any) -> None:
        self.parameters = parameters
        self.optimizer = optimizer
        self.all_params_with_gradients: list[torch.Tensor] = []

    def begin(self) -> None:
        for param in self.all_params_with_gradients:
            param.grad = None
        self.all_params_with_gradients.clear()
        for param in self.parameters.values():
            param.requires_grad_()
            param.retain_grad()
            self.all_params_with_gradients.append(param)
        self.optimizer.begin()

    def zero_grad(self) -> None:
        for param in self.all_params_with_gradients:
            param.grad = torch.zeros_like(param)
        self.optimizer.zero_grad()


class NoOpOptimizer:
    def begin(self) -> None:
        pass

    def zero_grad(self) -> None:
        pass

    def step(self, params: dict[str, torch.Tensor]) -> None:
        pass


class SGD(Optimizable):
    def __init__(self, alpha: float, optimizer: Any = None, detach: bool = True) -> None:
        self.detach = detach
        super().__init__({"alpha": torch.tensor(alpha)}, optimizer or NoOpOptimizer())

    def step(self, params: dict[str, torch.Tensor]) -> None:
        self.optimizer.step(self.parameters)
        for name, param in params.items():
            g = param.grad.detach()
            p = param.detach() if self.detach else param
            params[name] = p - g * self.parameters["alpha"]


class ModuleWrapper(Optimizable):
    def __init__(self, module: torch.nn.Module, optimizer: Optimizable) -> None:
        self.module = module
        super().__init__(dict(module.named_parameters()), optimizer)

    def zero_grad(self) -> None:
        self.module.zero_grad()
        super().zero_grad()

    def step(self) -> None:
        self.optimizer.step(self.parameters)
        for name in list(dict(self.module.named_parameters())):
            owner, _, leaf = name.rpartition(".")
            module = self.module.get_submodule(owner)
            module._parameters[leaf] = None
            module._parameters[leaf] = self.parameters[name]  # type: ignore[assignment]


def _setup(detach: bool = True) -> tuple[torch.nn.Module, SGD, ModuleWrapper, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    optim = SGD(0.1, optimizer=SGD(1e-3), detach=detach)
    return model, optim, ModuleWrapper(model, optimizer=optim), torch.randn(24, 8), torch.randint(0, 3, (24,))


def _pass(mw: ModuleWrapper, inputs: torch.Tensor, labels: torch.Tensor, j: int) -> None:
    mw.begin()
    batch = slice((j % 3) * 8, (j % 3) * 8 + 8)
    loss = F.nll_loss(F.log_softmax(mw.module(inputs[batch]), dim=1), labels[batch])
    mw.zero_grad()
    loss.backward(create_graph=True)
    mw.step()


def _watched(iterations: int | None, detach: bool = True) -> tuple[Any, float]:
    _, optim, mw, inputs, labels = _setup(detach)
    with warnings.catch_warnings(), watch(iterations=iterations) as w:
        warnings.simplefilter("ignore")
        for j in range(6):
            _pass(mw, inputs, labels, j)
    return w, optim.parameters["alpha"].item()


def test_hypergradient_descent_is_healthy_watched_to_its_end() -> None:
    w, alpha = _watched(None)
    assert w.healthy, str(w)
    assert alpha != pytest.approx(0.1, abs=1e-9)  # alpha learned: each backward walked the last update


def test_hypergradient_descent_stopped_after_two_iterations_keeps_nothing_growing() -> None:
    """After pass 2 the optimizer holds its parameters' graphs and the list its ``begin()`` filled once: more graphs
    than after pass 1, though neither the dict nor the list holds more than it did (no "keeps one more iteration's
    graph alive every iteration")."""
    for iterations in (2, 3):
        w, _ = _watched(iterations)
        assert w.healthy, str(w)


def test_hypergradient_descent_as_a_step_for_diagnose_is_healthy() -> None:
    model, _, mw, inputs, labels = _setup()

    def step() -> None:
        _pass(mw, inputs, labels, 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        diagnosis = diagnose(step, models=[model], optimizers=[])
    assert diagnosis.healthy, str(diagnosis)


def test_updates_that_chain_without_the_detach_are_carried() -> None:
    """``p = param`` instead of ``param.detach()``: each update's graph reaches every earlier one."""
    w, _ = _watched(None, detach=False)
    assert not w.healthy, str(w)
    assert "carr" in w.report.items[0].label and "memory and time grow" in w.report.items[0].why, str(w)
