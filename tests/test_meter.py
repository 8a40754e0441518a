"""SavedTensorMeter against an independent ground truth: which saved storages really die."""

from __future__ import annotations

import gc
import importlib.util
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from backward_twice.instruments.meter import MeterReading, SavedTensorMeter

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _mlp_loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


# -- ground truth ----------------------------------------------------------------------------


def test_mlp_graph_only_bytes_match_storages_freed_by_backward(make_mlp, saved_storages):
    model = make_mlp()
    x = torch.randn(32, 8)
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, x)
    truth = saved_storages(loss)
    assert truth.dead_bytes() == 0  # the walk itself keeps nothing alive, and nothing died yet
    before = meter.graph_only_bytes
    loss.backward()
    died = truth.dead_bytes()
    assert died > 0
    assert before == died
    assert meter.graph_only_bytes == 0
    assert meter.peak_graph_only_bytes == before
    assert meter.saved_bytes == 0
    assert meter.saved_tensors == 0


def test_parameters_and_kept_input_do_not_count_but_inline_input_does(make_mlp, saved_storages):
    model = make_mlp()
    x_kept = torch.randn(5, 8)
    meter = SavedTensorMeter()

    def forward():
        x_inline = torch.randn(3, 8)  # only the graph will hold this one
        loss = model(x_kept).pow(2).sum() + model(x_inline).pow(2).sum()
        return loss, StorageWeakRef(x_inline.untyped_storage()), x_inline.untyped_storage().nbytes()

    with meter:
        loss, inline_ref, inline_bytes = forward()
    gc.collect()
    assert not inline_ref.expired(), "the graph saved the inline input, so it must still be alive"
    truth = saved_storages(loss)
    before_graph_only = meter.graph_only_bytes
    before_saved = meter.saved_bytes
    loss.backward()
    died = truth.dead_bytes()
    survived = truth.alive_bytes()

    assert inline_ref.expired()
    assert before_graph_only == died
    assert before_graph_only >= inline_bytes
    # Parameters and x_kept were saved too (they are what survived) and count in saved_bytes only.
    kept_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept_storages.add(x_kept.untyped_storage().data_ptr())
    surviving_keys = {ptr for (_, ptr), (ref, _) in truth.refs.items() if not ref.expired()}
    assert surviving_keys and surviving_keys <= kept_storages
    assert x_kept.untyped_storage().data_ptr() in surviving_keys
    assert before_saved == died + survived
    assert meter.graph_only_bytes == 0


def test_activation_saved_by_two_nodes_is_counted_once(saved_storages):
    torch.manual_seed(1)
    x = torch.randn(6, 7)
    w1 = torch.randn(7, 9, requires_grad=True)
    w2 = torch.randn(7, 9, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        h = torch.tanh(x @ w1)  # saved by TanhBackward (result) and by MulBackward (self)
        h2 = torch.sin(x @ w2)
        loss = (h * h2).sum() + h.exp().sum()
    del h, h2
    truth = saved_storages(loss)
    # h is saved twice: the meter counts every saved tensor but every storage once.
    assert truth.saved_attributes > len(truth.refs)
    assert meter.saved_tensors == truth.saved_attributes
    assert meter.saved_bytes == truth.total_bytes
    before = meter.graph_only_bytes
    loss.backward()
    assert before == truth.dead_bytes()
    assert meter.graph_only_bytes == 0


def test_retain_graph_frees_nothing_until_the_graph_is_dropped(make_mlp, saved_storages):
    model = make_mlp()
    x = torch.randn(16, 8)
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, x)
    truth = saved_storages(loss)
    before = meter.graph_only_bytes
    assert before > 0
    loss.backward(retain_graph=True)
    assert truth.dead_bytes() == 0
    assert meter.graph_only_bytes == before
    del loss
    died = truth.dead_bytes()
    assert died == before
    assert meter.graph_only_bytes == 0


def test_del_loss_without_backward_frees_the_graph(make_mlp, saved_storages):
    model = make_mlp()
    x = torch.randn(16, 8)
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, x)
    truth = saved_storages(loss)
    before = meter.graph_only_bytes
    del loss
    assert before == truth.dead_bytes() > 0
    assert meter.graph_only_bytes == 0
    assert meter.saved_tensors == 0


# -- peak, reset, readings ---------------------------------------------------------------------


def test_peak_keeps_the_pre_backward_figure_without_a_prior_read(make_mlp, saved_storages):
    model = make_mlp()
    x = torch.randn(16, 8)
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, x)
    truth = saved_storages(loss)
    loss.backward()  # no figure read before: the meter must sample the peak itself
    died = truth.dead_bytes()
    assert meter.graph_only_bytes == 0
    assert meter.peak_graph_only_bytes == died > 0


def test_reset_peak_starts_from_the_current_figure(make_mlp):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, torch.randn(16, 8))
    loss.backward()
    assert meter.peak_graph_only_bytes > 0
    meter.reset_peak()
    assert meter.peak_graph_only_bytes == 0

    with meter:
        loss = _mlp_loss(model, torch.randn(4, 8))
    current = meter.graph_only_bytes
    meter.reset_peak()
    assert meter.peak_graph_only_bytes == current > 0


def test_saved_bytes_cover_graph_only_bytes_and_reading_agrees(make_mlp):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, torch.randn(16, 8))
    reading = meter.reading()
    assert isinstance(reading, MeterReading)
    assert reading.saved_bytes > reading.graph_only_bytes > 0  # parameters are saved, not graph-only
    assert reading.graph_only_bytes == meter.graph_only_bytes
    assert reading.saved_bytes == meter.saved_bytes
    assert reading.saved_tensors == meter.saved_tensors
    assert reading.peak_graph_only_bytes >= reading.graph_only_bytes
    loss.backward()
    assert meter.saved_bytes >= meter.graph_only_bytes
    text = repr(meter)
    assert text.startswith("SavedTensorMeter(") and "graph_only_bytes=0 B" in text


def test_counters_follow_frees_after_the_with_block(make_mlp):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        assert meter.active
        loss_a = _mlp_loss(model, torch.randn(16, 8))
        loss_b = _mlp_loss(model, torch.randn(16, 8))
    assert not meter.active
    both = meter.graph_only_bytes
    loss_a.backward()
    after_a = meter.graph_only_bytes
    assert 0 < after_a < both
    del loss_b
    gc.collect()
    assert meter.graph_only_bytes == 0


def test_tensors_saved_outside_the_block_are_not_counted(make_mlp):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        pass
    loss = _mlp_loss(model, torch.randn(16, 8))
    assert meter.saved_tensors == 0
    assert meter.graph_only_bytes == 0
    loss.backward()


def test_meter_keeps_no_graph_or_tensor_alive(make_mlp):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        hidden = torch.tanh(model[0](torch.randn(16, 8)))  # saved by TanhBackward: graph-only once dropped
        loss = hidden.pow(2).sum()
    hidden_storage = StorageWeakRef(hidden.untyped_storage())
    loss_ref = weakref.ref(loss)
    del loss, hidden
    gc.collect()
    assert loss_ref() is None
    assert hidden_storage.expired()
    assert meter.saved_tensors == 0
    assert meter.graph_only_bytes == 0


def test_peak_sees_a_rise_after_a_release_without_a_read(saved_storages):
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        small = torch.tanh(torch.randn(1, 64) @ w).sum()
        x_big = torch.randn(256, 64)
        hidden = torch.tanh(x_big @ w)
        big = hidden.exp().sum()
    truth = saved_storages(big)
    small.backward()
    del hidden, x_big  # now the big graph alone holds these
    big.backward()
    # The peak is the moment before big's backward, when its graph alone held all it saved.
    assert meter.peak_graph_only_bytes == truth.dead_bytes() > 0


def test_without_the_private_use_count_the_meter_refuses_to_guess(monkeypatch):
    import backward_twice.instruments.meter as meter_module

    monkeypatch.setattr(meter_module, "_storage_use_count", None)
    with pytest.raises(RuntimeError, match=r"_storage_Use_Count.*torch==2\.13\.0"):
        SavedTensorMeter()


# -- entering ----------------------------------------------------------------------------------


def test_nested_meters_raise_a_clear_error():
    outer, inner = SavedTensorMeter(), SavedTensorMeter()
    with outer:
        with pytest.raises(ValueError, match=r"another SavedTensorMeter is already active.*cannot be nested"), inner:
            pass
        assert outer.active and not inner.active
    assert not outer.active
    with inner:  # the failed nesting left nothing behind
        assert inner.active


def test_entering_the_same_meter_twice_nested_raises():
    meter = SavedTensorMeter()
    with meter:
        with pytest.raises(ValueError, match="this meter is already active"), meter:
            pass
        assert meter.active
    assert not meter.active


def test_meter_can_be_entered_again_sequentially(make_mlp, saved_storages):
    model = make_mlp()
    meter = SavedTensorMeter()
    with meter:
        loss_a = _mlp_loss(model, torch.randn(16, 8))
    with meter:
        loss_b = _mlp_loss(model, torch.randn(16, 8))
    truth_a, truth_b = saved_storages(loss_a), saved_storages(loss_b)
    total = meter.graph_only_bytes
    loss_a.backward()
    loss_b.backward()
    assert total == truth_a.dead_bytes() + truth_b.dead_bytes()
    assert meter.graph_only_bytes == 0


def test_exception_inside_the_block_deactivates_the_meter():
    meter = SavedTensorMeter()
    with pytest.raises(KeyError), meter:
        raise KeyError("boom")
    assert not meter.active
    with SavedTensorMeter() as other:  # no meter is left registered as active
        assert other.active


# -- devices -----------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_allocated_bytes_is_none_without_cuda():
    meter = SavedTensorMeter()
    assert meter.cuda_allocated_bytes is None
    assert meter.reading().cuda_allocated_bytes is None
    assert "cuda_allocated_bytes" not in repr(meter)


@requires_cuda
def test_cuda_mlp_ground_truth_and_allocator_drop(make_mlp, saved_storages):
    model = make_mlp(device="cuda")
    x = torch.randn(256, 8, device="cuda")
    _mlp_loss(model, x).backward()  # allocate .grad once, so the measured backward only frees
    meter = SavedTensorMeter()
    with meter:
        loss = _mlp_loss(model, x)
    truth = saved_storages(loss)
    torch.cuda.synchronize()
    before_graph_only = meter.graph_only_bytes
    allocated_before = torch.cuda.memory_allocated()
    assert meter.cuda_allocated_bytes == allocated_before
    loss.backward()
    torch.cuda.synchronize()
    gc.collect()
    drop = allocated_before - torch.cuda.memory_allocated()
    print(f"graph_only={before_graph_only} B, memory_allocated drop={drop} B")
    assert before_graph_only == truth.dead_bytes() > 0
    assert before_graph_only <= drop + 4096
    assert meter.graph_only_bytes == 0


# -- the in-place check ------------------------------------------------------------------------


def test_a_saved_tensor_modified_in_place_still_raises_inside_the_meter():
    weight = torch.randn(3, 3, requires_grad=True)
    with SavedTensorMeter():
        loss = (weight.t() * weight).sum()
    with torch.no_grad():
        weight.add_(1.0)
    with pytest.raises(
        RuntimeError,
        match=r"modified by an inplace operation: \[torch.FloatTensor \[3, 3\]\] "
        r"is at version 1; expected version 0",
    ):
        loss.backward()


def test_in_place_operations_before_saving_are_fine_inside_the_meter():
    x = torch.randn(5, requires_grad=True)
    with SavedTensorMeter():
        h = x * 2
        h.relu_()
        loss = (h * h).sum()
    loss.backward()
    assert torch.allclose(x.grad, 8 * x * (x > 0))


# -- cost that does not grow with live graphs, and exactness in long loops ---------------------
# The hot paths must do a fixed amount of work however many graphs are alive. Counted, not timed:
# every query of a storage's use count goes through the module-level function, which the fixture
# below replaces with a counting wrapper (the only per-storage work a scan does is that query).


@dataclass
class _Queries:
    count: int = 0


@pytest.fixture
def use_count_queries(monkeypatch) -> _Queries:
    import backward_twice.instruments.meter as meter_module

    real = meter_module._storage_use_count
    queries = _Queries()

    def counting(key: int) -> int:
        queries.count += 1
        return real(key)

    monkeypatch.setattr(meter_module, "_storage_use_count", counting)
    return queries


def _retain_and_keep_loop(
    meter: SavedTensorMeter,
    free_value_loss: bool,
    after_forward: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[Callable[[], None], list]:
    """The loop benchmarks/bench_meter.py times, small: two heads on one trunk, retain_graph=True,
    every loss kept with its graph. With ``free_value_loss`` the value loss is backwarded plainly
    each iteration, which frees buffers (a release burst: the value head's and the shared trunk's)
    while the class graphs of all earlier iterations stay alive. ``after_forward`` is handed both
    losses before any backward or optimizer step (reading a saved parameter after
    ``optimizer.step()`` raises the in-place error, so the ground truth walks graphs there).
    """
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_meter.py"
    spec = importlib.util.spec_from_file_location("bench_meter", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.growth_loop(meter, free_value_loss, width=16, batch=4, after_forward=after_forward)


def _queries_per_iteration(queries: _Queries, iteration: Callable[[], object], iterations: int = 40) -> list[int]:
    counts = []
    for _ in range(iterations):
        before = queries.count
        iteration()
        counts.append(queries.count - before)
    return counts


def test_saving_and_retained_backward_query_no_storage_however_many_graphs_live(use_count_queries):
    meter = SavedTensorMeter()
    iteration, history = _retain_and_keep_loop(meter, free_value_loss=False)
    per_iteration = _queries_per_iteration(use_count_queries, iteration)
    # Pack, unpack (the retained backward unpacks every saved tensor) and the optimizer step:
    # no query, no scan, with 40 graphs alive.
    assert per_iteration == [0] * 40
    assert len(history) == 40 and meter.saved_tensors >= 40 * 10


def test_reading_queries_only_storages_not_yet_known_graph_only(use_count_queries):
    meter = SavedTensorMeter()
    iteration, _history = _retain_and_keep_loop(meter, free_value_loss=False)
    figures = []
    per_read = _queries_per_iteration(use_count_queries, lambda: (iteration(), figures.append(meter.graph_only_bytes)))
    # The iteration itself queries nothing (the test above). Each read queries this iteration's
    # storages (new, and unpacked by the retained backward) and the parameters and inputs (owned
    # outside the graph, so never confirmed): the same number every time, while the graph-only
    # storages of all earlier graphs, known as such, are not queried again.
    assert len(set(per_read)) == 1
    assert meter.saved_tensors >= 20 * per_read[-1]
    assert figures == sorted(figures) and figures[-1] > figures[0] > 0


def test_a_release_every_iteration_queries_the_same_storages_however_many_graphs_live(use_count_queries):
    meter = SavedTensorMeter()
    iteration, history = _retain_and_keep_loop(meter, free_value_loss=True)
    per_iteration = _queries_per_iteration(use_count_queries, iteration)
    # One release burst per iteration (the value loss's backward); its sample and its releases
    # query the storages saved or unpacked in this iteration and those owned outside the graph.
    # A scan of every storage would grow by one graph's storages per iteration.
    assert per_iteration[1] > 0
    assert len(set(per_iteration[1:])) == 1
    assert meter.saved_tensors >= 10 * per_iteration[-1]
    assert len(history) == 40


def _dead_bytes(walks: list) -> int:
    """Bytes of the walked storages that died, over several walks (distinct graphs), one collection."""
    gc.collect()
    return sum(nbytes for walk in walks for ref, nbytes in walk.refs.values() if ref.expired())


def test_peak_is_exact_in_the_retain_and_keep_loop(saved_storages):
    meter = SavedTensorMeter()
    walks: list = []
    iteration, history = _retain_and_keep_loop(
        meter, free_value_loss=False, after_forward=lambda *losses: walks.append(saved_storages(*losses))
    )
    for _ in range(12):
        iteration()
    assert _dead_bytes(walks) == 0
    del history[:]
    # Nothing was freed during the loop, so the peak was the moment before the list was dropped,
    # with all 12 graphs alive; no figure was read, so the meter sampled it at that release.
    died = _dead_bytes(walks)
    assert died > 0
    assert meter.peak_graph_only_bytes == died
    assert meter.graph_only_bytes == 0 and meter.saved_tensors == 0 and meter.saved_bytes == 0


def test_peak_is_exact_when_every_iteration_frees_buffers_while_graphs_are_kept(saved_storages):
    meter = SavedTensorMeter()
    class_walks: list = []
    value_walks: list = []

    def walk(loss_class: torch.Tensor, loss_value: torch.Tensor) -> None:
        class_walks.append(saved_storages(loss_class))
        value_walks.append(saved_storages(loss_value))

    iteration, history = _retain_and_keep_loop(meter, free_value_loss=True, after_forward=walk)
    for _ in range(12):
        iteration()
    # Each value backward freed its head's buffers and the trunk's (nodes both losses share), but
    # not what the class head saved too.
    freed_by_last_value_backward = _dead_bytes(value_walks[-1:])
    freed_during_loop = _dead_bytes(class_walks)
    del history[:]
    died_with_history = _dead_bytes(class_walks) - freed_during_loop
    assert freed_by_last_value_backward > 0 and died_with_history > 0
    # The highest point was just before the last value backward: what the 12 kept graphs still
    # held, plus what that backward then freed.
    assert meter.peak_graph_only_bytes == died_with_history + freed_by_last_value_backward
    assert meter.graph_only_bytes == 0 and meter.saved_tensors == 0


def test_a_tensor_unpacked_from_the_graph_is_an_owner_while_it_lives(saved_storages):
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        hidden = torch.tanh(torch.randn(4, 8) @ w)  # TanhBackward saves its result
        loss = hidden.sum()
    node, hidden_bytes = hidden.grad_fn, hidden.untyped_storage().nbytes()
    truth = saved_storages(loss)
    del hidden
    everything = meter.graph_only_bytes  # the inline input and the hidden activation
    held = node._saved_result
    assert meter.graph_only_bytes == everything - hidden_bytes
    view = held[1:]  # a view of it is an owner too
    del held
    assert meter.graph_only_bytes == everything - hidden_bytes
    del view
    assert meter.graph_only_bytes == everything
    held = node._saved_result  # once more, after the storage was found graph-only again
    assert meter.graph_only_bytes == everything - hidden_bytes
    del held, node
    loss.backward()
    assert truth.dead_bytes() == everything > hidden_bytes
    assert meter.peak_graph_only_bytes == everything and meter.graph_only_bytes == 0


def test_a_saved_sparse_tensor_trains_inside_the_meter_and_is_counted_in_no_figure():
    # For the gradient of the weights, torch.sparse.mm saves only its sparse operand, which has no strided storage
    # to ask about; the same product from a dense adjacency saves (and counts) the adjacency.
    adjacency = torch.eye(4).to_sparse()
    weights = torch.randn(4, 3, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        propagated = torch.sparse.mm(adjacency, weights)
        assert (meter.saved_tensors, meter.saved_bytes) == (0, 0)
    dense_only = SavedTensorMeter()
    with dense_only:
        dense = adjacency.to_dense() @ weights
        assert (dense_only.saved_tensors, dense_only.saved_bytes) == (1, 4 * 4 * 4)
    propagated.sum().backward()
    dense.sum().backward()
    assert weights.grad is not None
    assert torch.equal(weights.grad, 2 * torch.ones(4, 3))
    assert meter.saved_tensors == 0


def test_a_saved_sparse_tensor_changed_in_place_still_raises_inside_the_meter():
    adjacency = torch.eye(3).to_sparse().coalesce()
    weights = torch.randn(3, 2, requires_grad=True)
    with SavedTensorMeter():
        propagated = torch.sparse.mm(adjacency, weights)
    adjacency.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        propagated.sum().backward()
