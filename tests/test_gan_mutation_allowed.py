"""Notebook 03, section 4's last part: the copied SRGAN step under
``torch.autograd.graph.allow_mutation_on_saved_tensors()``, asserted without the notebook.

It runs; it copies each saved view of D's weights that ``optimizerD.step()`` changes (counted here by a dispatch
mode outside the context, which sees the ``aten.clone`` calls the context makes, not by the context's own record);
G's gradient goes through D before its step, so one step equals one single-forward step; the copies go with the
step's graph; the context intercepts the forward's, the backward's and the optimizer's operations; hooks outside it
see no saved tensor; a backward outside it, or a second context inside it, raises; and it costs time. The committed
outputs and the text must give the figures found here.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import pytest
import torch
from gan_steps import IN_PLACE, g_loss_fn, make_gan, single_forward_step, srgan_step, standard_step
from torch.utils._python_dispatch import TorchDispatchMode

import helpers as bt

pytestmark = pytest.mark.usefixtures("one_thread")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "03_gan_step.ipynb"
allow_mutation = torch.autograd.graph.allow_mutation_on_saved_tensors


class SeenOps(TorchDispatchMode):
    """Entered outside the context: every operation the context's own mode passes on, and the clones it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.cloned_bytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func))
        if func is torch.ops.aten.clone.default:
            self.cloned_bytes.append(out.nbytes)
        return out


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(1)
    return bt.ring_of_gaussians(256, generator=generator), torch.randn(256, 2, generator=generator)


def section() -> list[dict]:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    start = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("### The search result"))
    end = next(i for i, c in enumerate(cells) if i > start and "".join(c["source"]).startswith("## 5."))
    return cells[start:end]


def printed(cells: list[dict], ignored: bool) -> str:
    return "".join(
        "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
        for c in cells
        if c["cell_type"] == "code" and ("nbval-ignore-output" in c.get("metadata", {}).get("tags", [])) == ignored
        for out in c.get("outputs", [])
    )


def text(cells: list[dict]) -> str:
    return " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())


def test_the_copied_step_raises_bare_and_runs_under_the_context(batch) -> None:
    with pytest.raises(RuntimeError, match=IN_PLACE):
        srgan_step(*make_gan(), *batch)
    with allow_mutation():
        d_value, g_value = srgan_step(*make_gan(), *batch)
    assert f"no error: d_loss {d_value:.4f}, g_loss {g_value:.4f}" in printed(section(), ignored=False)


def test_it_copies_every_saved_view_of_ds_weights_the_step_changes(batch) -> None:
    netG, netD, optimizerG, optimizerD = make_gan()
    weights = [p.nbytes for name, p in netD.named_parameters() if name.endswith("weight")]
    seen, copies = SeenOps(), []
    with seen, allow_mutation() as mutation:
        optimizerD.register_step_post_hook(lambda *_: copies.extend(mutation.cloned.values()))
        srgan_step(netG, netD, optimizerG, optimizerD, *batch)
        assert not list(mutation.cloned.values())  # the step returned: its graph, and the copies, are gone
    # the pass on fake saved all three weights, the pass on real (no gradient for its input) the last two
    expected = sum(weights) + sum(weights[1:])
    assert sorted(seen.cloned_bytes) == sorted(c.nbytes for c in copies)
    assert sum(seen.cloned_bytes) == expected == 33_792 and len(copies) == 5
    assert 1.9 < expected / sum(weights) < 2  # "about twice D's weights"
    out = printed(section(), ignored=False)
    assert f"{expected:,} B copied; D's weights take {sum(weights):,} B" in out
    assert "5 saved tensors [(2, 64), (64, 64), (64, 64), (64, 1), (64, 1)]" in out
    assert f"it copied {expected:,} B" in text(section())


def test_gs_gradient_goes_through_d_before_its_step(batch) -> None:
    real, z = batch
    netG, netD, optimizerG, optimizerD = make_gan()
    received: list[torch.Tensor] = []
    optimizerG.register_step_pre_hook(lambda *_: received.extend(p.grad.clone() for p in netG.parameters()))
    with allow_mutation():
        srgan_step(netG, netD, optimizerG, optimizerD, real, z)
    netG_before, netD_before = make_gan()[:2]
    g_params = list(netG_before.parameters())
    old = torch.autograd.grad(g_loss_fn(netD_before(netG_before(z))), g_params)
    new = torch.autograd.grad(g_loss_fn(netD(netG_before(z))), g_params)
    assert all(torch.equal(got, want) for got, want in zip(received, old))
    relative = max(((got - want).norm() / want.norm()).item() for got, want in zip(received, new))
    assert relative > 0.05, relative
    out = printed(section(), ignored=False)
    assert "G's gradient vs G's loss through D before its step: bit-equal" in out
    assert "G's gradient vs G's loss through D after its step: different" in out


def test_one_step_under_the_context_is_one_single_forward_step(batch) -> None:
    mutated, single = make_gan(), make_gan()
    with allow_mutation():
        srgan_step(*mutated, *batch)
    single_forward_step(*single, *batch)
    for a, b in zip(mutated[:2], single[:2]):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert "one step of each leaves both networks bit-equal" in text(section())


def test_the_context_sees_every_operation_and_hooks_outside_it_see_no_saved_tensor(batch) -> None:
    seen = SeenOps()
    packed: list[int] = []
    outside = torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.nbytes) or t.detach(), lambda t: t)
    with outside, seen, allow_mutation():
        srgan_step(*make_gan(), *batch)
    assert not packed
    assert any("leaky_relu_backward" in op for op in seen.ops)  # the backward's
    assert any("addcdiv_" in op for op in seen.ops)  # Adam's update
    with outside:
        standard_step(*make_gan(), *batch)
    assert packed  # the same hooks, with no context inside them


def test_a_backward_outside_the_context_or_a_second_context_raises() -> None:
    a = torch.ones(3, requires_grad=True)
    with allow_mutation():
        out = (a * a).sum()
    with pytest.raises(AssertionError, match="backward outside of the 'allow_mutation_on_saved_tensors' context"):
        out.backward()
    with pytest.raises(RuntimeError, match="cannot be nested"), allow_mutation(), allow_mutation():
        pass


def test_it_costs_time_and_the_copies_are_not_what_costs(batch) -> None:
    def mutation_allowed(*args):
        with allow_mutation():
            return srgan_step(*args)

    shapes = [(2, 64), (64, 64), (64, 64), (64, 1), (64, 1)]
    views = [torch.randn(*shape[::-1]).t() for shape in shapes]
    runs = {"standard": standard_step, "mutation allowed": mutation_allowed}
    gans = {name: make_gan() for name in runs}
    times: dict[str, list[float]] = {name: [] for name in [*runs, "copies"]}
    for _ in range(7):
        for name, step in runs.items():
            start = time.perf_counter()
            step(*gans[name], *batch)
            times[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        [view.clone() for view in views]
        times["copies"].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    extra = median["mutation allowed"] - median["standard"]
    assert median["mutation allowed"] > 1.5 * median["standard"], median
    assert median["copies"] < min(0.1 * extra, 1e-3), median  # "well under a millisecond"
    # the committed run, which the text calls more than twice the standard step's time
    ratio = re.search(r"SRGAN, mutation allowed\s+(\d+\.\d+)x the standard step's time", printed(section(), True))
    assert ratio and float(ratio[1]) > 2, ratio
    assert "took more than twice as long as the standard step" in text(section())
