"""Gradients kept with their graphs across updates: ``backward(create_graph=True)`` accumulates each call's gradient,
with its graph, into the weights' ``.grad``. Never reset after the update, the next call adds its graph to the old
one, and a second derivative through ``.grad`` walks back into the earlier updates' graphs, whose saved weights the
update changed (PyTorch warns of the reference cycle, and asks for ``.grad = None`` after use). The fix resets them.

Used by :mod:`backward_twice.judge.carried`.
"""

from __future__ import annotations

import re

__all__ = ["gradients_fix"]


def gradients_fix(name: str) -> str:
    """The fix for a carrier that is a weight's ``.grad`` (``model[0].weight.grad``): reset the gradients of the
    module it belongs to (``model``) after each update."""
    root = re.match(r"(?:self\.)?\w+", name)
    module = root.group(0) if root else "model"
    return (
        f"set the gradients to None after each update (`{module}.zero_grad(set_to_none=True)`, or your optimizer's "
        "`zero_grad()`): each `backward(create_graph=True)` adds its graph to what `.grad` still holds"
    )
