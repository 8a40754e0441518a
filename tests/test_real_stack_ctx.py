"""What notebook 06, section 4, says about a tensor kept as an attribute of a custom Function's ``ctx``, measured
on the notebook's shapes without the course's tools: the result ``ExpOnCtx`` keeps is the output itself (so it
holds no memory the output does not), an output on ``ctx`` makes a cycle only ``gc.collect()`` frees while a
non-output tensor there dies with its graph, and an attribute escapes the version check that
``save_for_backward`` gives, so an in-place change makes its gradient silently wrong."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_real_stack.ipynb"


class ExpSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        result = x.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


class ExpOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.result = x.exp()
        return ctx.result

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.result


class Expm1OnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.exp = x.exp()
        return ctx.exp - 1

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.exp


def alive_after_del_without_collector(make, attribute: str) -> bool:
    x = torch.randn(256, 1024, requires_grad=True)
    y = make.apply(x)
    y.sum().backward()
    kept = weakref.ref(getattr(y.grad_fn, attribute))
    gc.disable()
    try:
        del y
        return kept() is not None
    finally:
        gc.enable()
        gc.collect()


def test_the_tensor_on_ctx_is_the_output_and_only_an_output_makes_the_cycle() -> None:
    x = torch.randn(256, 1024, requires_grad=True)
    y = ExpOnCtx.apply(x)
    assert y.grad_fn.result is y
    assert Expm1OnCtx.apply(x).grad_fn.exp is not None
    assert alive_after_del_without_collector(ExpOnCtx, "result")
    assert not alive_after_del_without_collector(Expm1OnCtx, "exp")


def test_an_attribute_escapes_the_version_check_and_gives_a_wrong_gradient() -> None:
    x = torch.randn(256, 1024, requires_grad=True)
    y = ExpSaved.apply(x)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = ExpOnCtx.apply(x)
    y.mul_(2)
    y.sum().backward()
    right = 2 * x.detach().exp()
    assert not torch.allclose(x.grad, right) and torch.allclose(x.grad, 2 * right)


def test_the_notebook_says_so_and_no_longer_counts_the_output_as_held_memory() -> None:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(cell["source"]) for cell in cells)
    printed = "\n".join(
        "".join(output.get("text", "")) for cell in cells if cell["cell_type"] == "code" for output in cell["outputs"]
    )
    assert "still held by the graph after both" not in text + printed
    assert "the tensor kept on ctx is the output itself: True" in printed
    assert "after del y, the exp(x) kept on ctx is alive: False" in printed
    assert "ExpOnCtx: no error; gradient right: False | twice the right one: True" in printed
    assert "incorrect gradients (the\nversion check), memory leaks (the cycle), and saved-tensor hooks" in text
    assert "graph is walked twice and none is retained" not in text  # a vjp pullback retains
