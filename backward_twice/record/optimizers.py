"""Optimizers and their steps as the recorder tells them from a frame, without calling anything: what a name or a
plain attribute holds (:func:`plain_value`), whether a value is an optimizer (:func:`is_optimizer`: not a scheduler),
and whether an optimizer's ``step()`` runs around a frame (:func:`inside_a_step`: LBFGS calling its closure).

Used by :mod:`backward_twice.record.hand_update`, :mod:`backward_twice.record.passes`,
:mod:`backward_twice.record.positions` and :mod:`backward_twice.record.recorder`.
"""

from __future__ import annotations

import ast
import os
import types
from typing import Any

import torch

__all__ = ["OPTIMIZERS", "inside_a_step", "is_optimizer", "plain_value"]

OPTIMIZERS = os.path.join(os.path.dirname(torch.optim.__file__), "")  # torch/optim/: every step() runs through it


def plain_value(frame: types.FrameType, expression: ast.expr | None) -> Any:
    """What a name or a chain of plain attributes (``self.opt_g``) holds in ``frame``, without calling anything."""
    if isinstance(expression, ast.Name):
        names = frame.f_locals
        if expression.id in names:
            return names[expression.id]
        return frame.f_globals.get(expression.id)
    if isinstance(expression, ast.Attribute):
        owner = plain_value(frame, expression.value)
        attributes = getattr(owner, "__dict__", None)
        return attributes.get(expression.attr) if isinstance(attributes, dict) else None
    return None


def inside_a_step(frame: types.FrameType | None) -> bool:
    """Whether an optimizer's ``step()`` runs further out than ``frame`` (LBFGS calling its closure): a stop raised
    there would leave the step half done."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(OPTIMIZERS):
            return True
        frame = frame.f_back
    return False


def is_optimizer(value: Any) -> bool:
    """An optimizer, a wrapper of one (Lightning's), or a GradScaler (``scaler.step(optimizer)``); never a
    learning-rate scheduler, which holds its optimizer as ``.optimizer`` too (``scheduler.step()`` once per epoch,
    outside the batch loop, must not make the epoch loop the iteration)."""
    if isinstance(value, torch.optim.Optimizer):
        return True
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return False
    inner = getattr(value, "_optimizer", None) or getattr(value, "optimizer", None)
    return isinstance(inner, torch.optim.Optimizer) or type(value).__name__ == "GradScaler"
