"""draw_graph, saved_tensors_of and record_saved_tensors, before and after backward."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from torchviz import make_dot

from helpers.graph import AutogradGraph, draw_graph, record_saved_tensors, saved_tensors_of

SECOND_TIME = "backward through the graph a second time"
# torchviz 0.0.3 compares versions with distutils' LooseVersion.
pytestmark = pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")
requires_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")


def _build(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    inputs = torch.randn(5, 3)
    loss = model(inputs).pow(2).mean()
    return model, inputs, loss


def _saved_by_walk(loss: torch.Tensor) -> list[tuple[str, str, tuple[int, ...], str, int]]:
    """(node type, attribute, shape, dtype, nbytes) of every saved tensor, read directly, sorted."""
    found = []
    seen, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for name in dir(fn):
            if name.startswith("_saved_"):
                value = getattr(fn, name)
                if isinstance(value, torch.Tensor):
                    dtype = str(value.dtype).removeprefix("torch.")
                    found.append((type(fn).__name__, name, tuple(value.shape), dtype,
                                  value.numel() * value.element_size()))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return sorted(found)


def _as_table(graph: AutogradGraph) -> list[tuple]:
    return sorted((info.node, info.name, info.shape, info.dtype, info.nbytes) for info in graph.saved)


def test_before_backward_every_saved_tensor_is_listed_alive_with_its_size():
    _, _, loss = _build()
    expected = _saved_by_walk(loss)
    graph = draw_graph(loss)
    assert isinstance(graph, AutogradGraph)
    assert all(info.alive for info in graph.saved)
    assert _as_table(graph) == expected
    assert graph.summary() == f"{len(expected)} saved tensors: {len(expected)} alive, 0 freed"
    assert "FREED" not in graph.source


def test_after_plain_backward_everything_is_freed_but_sizes_recorded_before_are_kept():
    _, _, loss = _build()
    before = draw_graph(loss)
    loss.backward()
    after = draw_graph(loss)
    assert after.saved and not any(info.alive for info in after.saved)
    assert _as_table(after) == _as_table(before)
    assert all(info.shape is not None and info.nbytes for info in after.saved)
    n = len(before.saved)
    assert after.summary() == f"{n} saved tensors: 0 alive, {n} freed"
    assert "FREED" in after.text and "alive" not in after.text


def test_record_saved_tensors_then_backward_then_draw():
    _, _, loss = _build()
    recorded = record_saved_tensors(loss)
    assert recorded == len(_saved_by_walk(loss))
    loss.backward()
    graph = draw_graph(loss)
    assert len(graph.saved) == recorded
    assert all(not info.alive and info.shape is not None for info in graph.saved)


def test_drawn_only_after_backward_the_sizes_are_unknown():
    _, _, loss = _build()
    names = {row[1] for row in _saved_by_walk(loss)}
    loss.backward()
    graph = draw_graph(loss)
    assert {info.name for info in graph.saved} == names
    assert all(not info.alive and info.shape is None and info.nbytes is None for info in graph.saved)
    assert "size not recorded" in graph.text


def test_retain_graph_keeps_saved_tensors_alive():
    _, _, loss = _build()
    loss.backward(retain_graph=True)
    graph = draw_graph(loss)
    assert graph.saved and all(info.alive for info in graph.saved)
    loss.backward()
    assert not any(info.alive for info in draw_graph(loss).saved)


def test_saved_list_of_tensors_is_tracked_per_item():
    weights = torch.randn(5, requires_grad=True)
    index = torch.tensor([0, 2, 4])
    loss = weights[index].sum()
    index_node = loss.grad_fn.next_functions[0][0]
    before = saved_tensors_of(index_node)
    assert [(info.name, info.shape, info.dtype, info.alive) for info in before] == [
        ("_saved_indices[0]", (3,), "int64", True)
    ]
    loss.backward()
    after = saved_tensors_of(index_node)
    assert [(info.name, info.shape, info.alive) for info in after] == [("_saved_indices[0]", (3,), False)]


def test_same_seeded_graph_gives_the_same_dot_source_without_ids():
    model_a, _, loss_a = _build(seed=3)
    model_b, _, loss_b = _build(seed=3)
    source_a = draw_graph(loss_a, params=model_a).source
    source_b = draw_graph(loss_b, params=model_b).source
    assert source_a == source_b
    assert re.search(r"\d{10,}", source_a) is None
    # torchviz, by contrast, names nodes by id(): the reason draw_graph exists
    assert make_dot(loss_a).source != make_dot(loss_b).source


def test_torchviz_show_saved_fails_after_backward_but_draw_graph_works():
    model, _, loss = _build()
    loss.backward()
    with pytest.raises(RuntimeError, match=SECOND_TIME):
        make_dot(loss, params=dict(model.named_parameters()), show_saved=True)
    graph = draw_graph(loss, params=model)
    assert graph.saved and not any(info.alive for info in graph.saved)


def test_parameter_names_from_a_module_or_a_dict():
    model, _, loss = _build()
    from_module = draw_graph(loss, params=model).source
    for name, _ in model.named_parameters():
        assert name in from_module
    from_dict = draw_graph(loss, params={"first_weight": model[0].weight}).source
    assert "first_weight" in from_dict
    assert "0.weight" not in draw_graph(loss).source


def test_several_named_roots_and_show_saved_off():
    model, inputs, _ = _build()
    hidden = model[1](model[0](inputs))
    roots = {"sum_loss": hidden.sum(), "tanh_loss": torch.tanh(hidden).sum()}
    graph = draw_graph(roots)
    assert "sum_loss" in graph.source and "tanh_loss" in graph.source
    assert any(info.node == "TanhBackward0" for info in graph.saved)
    plain = draw_graph([hidden.sum()], show_saved=False)
    assert plain.saved == [] and "saved" not in plain.text


def test_bad_inputs():
    with pytest.raises(TypeError):
        draw_graph("not a tensor")
    with pytest.raises(TypeError):
        draw_graph({"loss": 3.0})
    with pytest.raises(ValueError, match="no autograd graph"):
        draw_graph(torch.ones(3).sum())
    with pytest.raises(ValueError):
        draw_graph([])
    _, _, loss = _build()
    with pytest.raises(TypeError):
        draw_graph(loss, params=["not", "a", "module"])
    with pytest.raises(TypeError):
        draw_graph(loss, params={"weight": 1.0})
    with pytest.raises(ValueError, match="no autograd graph"):
        record_saved_tensors(torch.zeros(2))


def test_leaf_requiring_grad_can_be_drawn():
    leaf = torch.ones(3, requires_grad=True)
    graph = draw_graph(leaf)
    assert graph.saved == []
    assert "leaf" in graph.text


def test_missing_dot_shows_install_help_and_text(monkeypatch, tmp_path):
    _, _, loss = _build()
    graph = draw_graph(loss)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    bundle = graph._repr_mimebundle_()
    text = bundle["text/plain"]
    for command in ("apt-get install -y graphviz", "brew install graphviz", "conda install"):
        assert command in text
    assert graph.text in text
    assert "image/svg+xml" not in bundle


@requires_dot
def test_svg_render_marks_freed_buffers():
    model, _, loss = _build()
    alive_svg = draw_graph(loss, params=model).pipe(format="svg").decode()
    assert "<svg" in alive_svg and "FREED" not in alive_svg
    loss.backward()
    freed_svg = draw_graph(loss, params=model).pipe(format="svg").decode()
    assert "<svg" in freed_svg and "FREED" in freed_svg


@requires_dot
def test_repr_mimebundle_with_dot_gives_svg():
    _, _, loss = _build()
    bundle = draw_graph(loss)._repr_mimebundle_()
    assert "image/svg+xml" in bundle
