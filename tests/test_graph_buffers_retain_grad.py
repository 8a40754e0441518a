"""Notebook 01, section 7: ``retain_grad()`` against ``retain_graph=True``, asserted without the notebook.

``retain_grad()`` stores a non-leaf tensor's gradient (one tensor of its size) and backward frees the buffers
as usual; ``retain_graph=True`` stores no such gradient and holds the buffers; reading a non-leaf's ``.grad``
without ``retain_grad()`` gives ``None`` and a UserWarning. Bytes come from conftest's walk over the graph's
``_saved_*`` attributes (weak references only), not from the course's meter; the committed outputs and the text
must give the same figures.
"""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_graph_buffers.ipynb"
SECOND_TIME = "backward through the graph a second time"
NOT_A_LEAF = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't be "
    "populated during autograd.backward(). If you indeed want the .grad field to be populated for a non-leaf "
    "Tensor, use .retain_grad() on the non-leaf Tensor."
)


def cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def section_7() -> list[dict]:
    found = cells()
    start = next(i for i, c in enumerate(found) if "".join(c["source"]).startswith("## 7. `retain_grad()`"))
    end = next(i for i, c in enumerate(found) if i > start and "".join(c["source"]).startswith("## 8."))
    return found[start:end]


def stdout(cell: dict) -> str:
    return "".join("".join(out["text"]) for out in cell.get("outputs", []) if out.get("name") == "stdout")


def section_5_network() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10)), torch.randn(64, 256)


def test_a_non_leafs_grad_is_none_with_the_warning_the_page_prints() -> None:
    x = torch.tensor([1.0, 2.0, 3.0])
    w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    hidden = x * w
    hidden.sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hidden.grad is None
    assert [c.category for c in caught] == [UserWarning]
    assert str(caught[0].message).startswith(NOT_A_LEAF)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(w.grad, x)  # a leaf's .grad: no warning
    assert not caught
    printed = "".join(stdout(c) for c in section_7())
    assert "hidden.grad: None | w.grad: [1.0, 2.0, 3.0]\nUserWarning:\n" in printed
    for sentence in NOT_A_LEAF.split(". "):
        assert "  " + sentence.rstrip(".") + ".\n" in printed


def test_retain_grad_keeps_the_gradient_and_frees_the_buffers(saved_storages) -> None:
    x = torch.tensor([1.0, 2.0, 3.0])
    w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    hidden = x * w
    hidden.retain_grad()
    loss = hidden.sum()
    saved = saved_storages(loss)
    assert saved.total_bytes > 0
    x_bytes = x.untyped_storage().nbytes()
    loss.backward()
    assert torch.equal(hidden.grad, torch.ones(3)) and hidden.retains_grad
    assert saved.alive_bytes() == x_bytes  # only x, which our variable holds, is still alive
    with pytest.raises(RuntimeError, match=SECOND_TIME):
        loss.backward()


@pytest.mark.parametrize("flag", ["retain_grad()", "retain_graph=True"])
def test_what_each_flag_keeps_after_backward_on_section_5s_network(flag: str, saved_storages) -> None:
    mlp, batch = section_5_network()
    hidden = mlp[:2](batch)
    loss = mlp[2:](hidden).logsumexp(dim=1).mean()
    saved = saved_storages(loss)
    elsewhere = {t.untyped_storage().data_ptr() for t in (batch, hidden, *mlp.parameters())}
    held_elsewhere = sum(nbytes for (_, address), (_, nbytes) in saved.refs.items() if address in elsewhere)
    if flag == "retain_grad()":
        hidden.retain_grad()
    loss.backward(retain_graph=flag == "retain_graph=True")
    graph_only = saved.alive_bytes() - held_elsewhere
    if flag == "retain_grad()":
        assert graph_only == 0
        assert hidden.grad.nbytes == hidden.nbytes == 64 * 512 * 4 == 131_072
        assert hidden.grad.grad_fn is None  # a plain tensor: it holds no graph
        kept = f"{hidden.grad.nbytes:,} B"
    else:
        assert not hidden.retains_grad
        # the second ReLU's output, the logits, the logsumexp result
        assert graph_only == 64 * 512 * 4 + 64 * 10 * 4 + 64 * 4 == 133_888
        kept = "None"
    line = f"{flag:<17}  hidden.grad: {kept:<9}  graph-only bytes after backward: {graph_only:,} B"
    assert line in "".join(stdout(c) for c in section_7())
    text = "".join("".join(c["source"]) for c in section_7() if c["cell_type"] == "markdown")
    assert "131,072 B" in text and "133,888 B" in text and "264,960 B" in text
    del loss
    assert saved.alive_bytes() == held_elsewhere  # the retained buffers go with the graph


@pytest.mark.parametrize("drop", ["hidden.grad = None", "del hidden"])
def test_the_kept_gradient_lives_as_long_as_the_tensor(drop: str) -> None:
    mlp, batch = section_5_network()
    hidden = mlp[:2](batch)
    hidden.retain_grad()
    mlp[2:](hidden).logsumexp(dim=1).mean().backward()
    grad = StorageWeakRef(hidden.grad.untyped_storage())
    gc.collect()
    assert not grad.expired()
    if drop == "del hidden":
        del hidden
    else:
        hidden.grad = None
    gc.collect()
    assert grad.expired()
