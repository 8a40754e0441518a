"""GAN training steps built from four switches, as code that can be shown and run.

A :class:`StepSettings` names the four choices that decide what a SRGAN-shaped step does;
:func:`make_step` compiles the code it stands for. Every step function has the signature
``step(netG, netD, optimizerG, optimizerD, real, z)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SRGAN_SETTINGS", "STANDARD_SETTINGS", "StepSettings", "make_step"]

Step = Callable[..., Any]
LossD = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LossG = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepSettings:
    """The four choices that decide what a SRGAN-shaped GAN step does.

    ``retain_graph``: ``d_loss.backward(retain_graph=True)``. ``detach``: D's fake term sees
    ``fake.detach()``. ``fresh_pass``: ``g_loss`` comes from a new ``netD(fake)`` pass instead of
    reusing D's ``fake_out``. ``d_step_first``: ``optimizerD.step()`` runs before
    ``g_loss.backward()`` (otherwise after it).

    Used by :func:`make_step`, :class:`GanLab`, :data:`SRGAN_SETTINGS` and :data:`STANDARD_SETTINGS`.
    """

    retain_graph: bool
    detach: bool
    fresh_pass: bool
    d_step_first: bool

    def __post_init__(self) -> None:
        for name in ("retain_graph", "detach", "fresh_pass", "d_step_first"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StepSettings.{name} must be True or False, not {getattr(self, name)!r}.")

    @classmethod
    def all(cls) -> list[StepSettings]:
        """All 16 combinations, in a fixed order."""
        return [cls(*values) for values in itertools.product((False, True), repeat=4)]

    @property
    def label(self) -> str:
        """A short description, for tables."""
        return ", ".join(
            [
                "retain" if self.retain_graph else "no retain",
                "fake.detach()" if self.detach else "fake",
                "fresh netD(fake) for G" if self.fresh_pass else "G reuses fake_out",
                "D step before g_loss.backward()" if self.d_step_first else "D step after g_loss.backward()",
            ]
        )

    @property
    def code(self) -> str:
        """The step function these settings stand for, exactly as :func:`make_step` compiles it."""
        d_step = "    optimizerD.step()"
        lines = [
            "def step(netG, netD, optimizerG, optimizerD, real, z):",
            "    netD.zero_grad()",
            "    fake = netG(z)",
            "    real_out = netD(real)",
            f"    fake_out = netD({'fake.detach()' if self.detach else 'fake'})",
            "    d_loss = d_loss_fn(real_out, fake_out)",
            f"    d_loss.backward({'retain_graph=True' if self.retain_graph else ''})",
        ]
        if self.d_step_first:
            lines.append(d_step)
        lines += [
            "    netG.zero_grad()",
            f"    g_loss = g_loss_fn({'netD(fake)' if self.fresh_pass else 'fake_out'})",
            "    g_loss.backward()",
        ]
        if not self.d_step_first:
            lines.append(d_step)
        lines += ["    optimizerG.step()", "    return d_loss.item(), g_loss.item()"]
        return "\n".join(lines) + "\n"


SRGAN_SETTINGS = StepSettings(retain_graph=True, detach=False, fresh_pass=False, d_step_first=True)
STANDARD_SETTINGS = StepSettings(retain_graph=False, detach=True, fresh_pass=True, d_step_first=True)


def make_step(settings: StepSettings, d_loss_fn: LossD, g_loss_fn: LossG) -> Step:
    """Compile ``settings.code`` into a step function that uses the given loss functions.

    What runs is exactly the code the panel shows.

    Used by :class:`GanLab` and :func:`_judge_step_calls`.
    """
    if not isinstance(settings, StepSettings):
        raise TypeError(f"make_step() needs StepSettings, not {type(settings).__name__}.")
    if not callable(d_loss_fn) or not callable(g_loss_fn):
        raise TypeError("make_step() needs two loss functions: d_loss_fn(real_out, fake_out) and g_loss_fn(fake_out).")
    namespace: dict[str, Any] = {"d_loss_fn": d_loss_fn, "g_loss_fn": g_loss_fn}
    exec(compile(settings.code, f"<GAN step: {settings.label}>", "exec"), namespace)
    step = namespace["step"]
    step.label = settings.label  # shown as the step's name
    return step
