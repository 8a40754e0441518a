"""draw_graph, saved_tensors_of and record_saved_tensors, before and after backward."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from torchviz import make_dot

from backward_twice.instruments.graph import (
    DOT_INSTALL_COMMANDS,
    ITERATION_KEY,
    AutogradGraph,
    dot_install_help,
    draw_graph,
    record_saved_tensors,
    saved_tensors_of,
)

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
    seen, stack = {}, [loss.grad_fn]  # the nodes kept: a dead node's id can be taken by the next one read
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for name in dir(fn):
            if name.startswith("_saved_"):
                value = getattr(fn, name)
                if isinstance(value, torch.Tensor):
                    dtype = str(value.dtype).removeprefix("torch.")
                    found.append(
                        (type(fn).__name__, name, tuple(value.shape), dtype, value.numel() * value.element_size())
                    )
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


def test_the_drawings_and_make_lab_give_the_same_install_commands():
    script = (Path(__file__).resolve().parent.parent / "scripts" / "ensure-dot.sh").read_text(encoding="utf-8")
    message = script.split("it is not installed. Install it:\n", 1)[1].split("MSG", 1)[0]
    listed = dict(re.findall(r"^  ([^:\n]+):\s+(\S.*)$", message, re.MULTILINE))
    assert listed == DOT_INSTALL_COMMANDS
    for platform, command in DOT_INSTALL_COMMANDS.items():
        assert f"{platform}" in dot_install_help() and command in dot_install_help()


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
    graph = draw_graph(loss)
    bundle, metadata = graph._repr_mimebundle_()
    assert "image/svg+xml" in bundle
    # The words for screen readers: the summary, then every node of the text rendering.
    alt = metadata["image/svg+xml"]["alt"]
    assert alt == graph.alt_text() and alt.startswith(f"Autograd graph. {graph.summary()}. output ")
    assert all(line.strip() in alt for line in graph.text.splitlines())


@requires_dot
def test_the_alt_text_reaches_the_output_metadata():
    from IPython.core.formatters import DisplayFormatter

    _, _, loss = _build()
    graph = draw_graph(loss)
    data, metadata = DisplayFormatter().format(graph)
    assert "<svg" in data["image/svg+xml"] and metadata == {"image/svg+xml": {"alt": graph.alt_text()}}


def _nodes_not_in(fn, known: dict[int, object]) -> list:
    """Nodes reachable from ``fn`` that are not in ``known`` (id -> node), added to it as they are found."""
    found, stack = [], [fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in known:
            continue
        known[id(node)] = node  # keeps the node alive, so its id is never reused
        found.append(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return found


def _rnn_loop(steps: int = 3, stamp: bool = True):
    """``h = tanh(W @ x_t + U @ h)`` with the hidden state carried over, each iteration's nodes stamped.

    ``h`` starts as ``tanh(h0)``, built before the loop and never stamped. Returns the last
    iteration's loss and the parameters by name.
    """
    torch.manual_seed(0)
    params = {
        "W": torch.randn(4, 3, requires_grad=True),
        "U": torch.randn(4, 4, requires_grad=True),
        "h0": torch.randn(4, requires_grad=True),
    }
    xs = torch.randn(steps, 3)
    h = torch.tanh(params["h0"])
    known: dict[int, object] = {}
    _nodes_not_in(h.grad_fn, known)
    for k, x in enumerate(xs, start=1):
        h = torch.tanh(params["W"] @ x + params["U"] @ h)
        loss = (h**2).sum()
        for node in _nodes_not_in(loss.grad_fn, known):
            if stamp:
                node.metadata[ITERATION_KEY] = k
    return loss, params


def _op_nodes(source: str) -> dict[str, tuple[str, str]]:
    """``opN`` -> (label, the rest of its attributes) for every operation and leaf node in a DOT source."""
    return {
        m["id"]: (m["label"], m["attrs"])
        for m in re.finditer(
            r'^\t(?P<id>op\d+) \[label=(?P<label>"[^"]*"|\S+)(?P<attrs>[^\]]*)\]$', source, re.MULTILINE
        )
    }


def test_by_iteration_colours_and_labels_each_node_by_the_iteration_that_built_it():
    loss, params = _rnn_loop(steps=3)
    graph = draw_graph(loss, params=params, by_iteration=True)
    # each iteration builds Mv, Mv, Add, Tanh; the last also Pow and Sum; tanh(h0) came before the loop
    assert graph.iteration_counts == {1: 4, 2: 4, 3: 6, None: 1}
    nodes = _op_nodes(graph.source)
    fills: dict[str, set[str]] = {}
    for label, attrs in nodes.values():
        line = label.strip('"').split("\n")[-1]
        fill = re.search(r"fillcolor=\"?([^\s\"]+)", attrs)
        if line.startswith("iteration "):
            fills.setdefault(line, set()).add(fill.group(1))
    assert sorted(fills) == ["iteration 1", "iteration 2", "iteration 3"]
    assert all(len(colours) == 1 for colours in fills.values())  # one colour per iteration...
    assert len(set().union(*fills.values())) == 3  # ...and a different one for each
    before = [(label, attrs) for label, attrs in nodes.values() if "before the loop" in label]
    assert len(before) == 1 and before[0][0].startswith('"TanhBackward0')
    assert "fillcolor=white" in before[0][1] and "dashed" in before[0][1]
    # parameters and saved tensors keep their look: no leaf is labelled by iteration
    leaves = [label for label, attrs in nodes.values() if "lightblue" in attrs]
    assert len(leaves) == 3 and not any("iteration" in label or "loop" in label for label in leaves)
    assert "iteration" not in "".join(re.findall(r"op\d+_saved\d+ \[[^\]]*\]", graph.source))
    assert "(iteration 2)" in graph.text and "(before the loop)" in graph.text


def test_by_iteration_legend_lists_every_iteration_drawn():
    loss, params = _rnn_loop(steps=2)
    source = draw_graph(loss, params=params, by_iteration=True).source
    legend = source[source.index("subgraph cluster_legend") :]
    assert "label=legend" in legend
    for line in ("iteration 1", "iteration 2", "before the loop"):
        assert line in legend
    assert "iteration 3" not in source
    # the swatches use the nodes' colours
    for k in (1, 2):
        colour = re.search(rf'legend_{k} \[label="iteration {k}" fillcolor="(#[0-9A-F]{{6}})"', legend).group(1)
        assert re.search(rf'label="\w+\niteration {k}" fillcolor="{colour}"', source)


def test_by_iteration_without_stamps_only_adds_a_legend_saying_so():
    loss, params = _rnn_loop(steps=2, stamp=False)
    plain = draw_graph(loss, params=params).source
    graph = draw_graph(loss, params=params, by_iteration=True)
    assert graph.iteration_counts == {None: 11}
    assert "iteration" not in graph.text and "loop" not in graph.text
    legend_at = graph.source.index("\tsubgraph cluster_legend")
    assert graph.source[:legend_at] == plain.removesuffix("}\n")
    assert "no node carries" in graph.source[legend_at:] and ITERATION_KEY in graph.source[legend_at:]


def test_by_iteration_off_draws_exactly_what_draw_graph_drew_before_it_existed():
    loss, params = _rnn_loop(steps=1)
    graph = draw_graph(loss, params=params)
    assert graph.iteration_counts == {}
    assert "iteration" not in graph.source and "loop" not in graph.source and "legend" not in graph.source
    assert graph.source == OLD_RNN_SOURCE


def test_by_iteration_rejects_a_stamp_that_is_not_an_iteration_number():
    loss, params = _rnn_loop(steps=1)
    loss.grad_fn.metadata[ITERATION_KEY] = "one"
    with pytest.raises(ValueError, match="iteration that built it"):
        draw_graph(loss, params=params, by_iteration=True)
    assert draw_graph(loss, params=params).source  # ignored when not drawing by iteration


def test_by_iteration_colours_cycle_and_text_stays_readable():
    loss, params = _rnn_loop(steps=9)
    graph = draw_graph(loss, params=params, by_iteration=True, show_saved=False)
    assert list(graph.iteration_counts) == [*range(1, 10), None]
    colour = {
        k: re.search(rf'legend_{k} \[label="iteration {k}" fillcolor="(#\w+)"', graph.source).group(1)
        for k in range(1, 10)
    }
    assert len(set(colour.values())) == 6 and colour[7] == colour[1] and colour[9] == colour[3]
    assert "orange" not in colour.values() and "#E69F00" not in colour.values()  # saved tensors' colour
    assert 'fillcolor="#0072B2" fontcolor=white' in graph.source  # white text on the dark blue


@requires_dot
def test_by_iteration_renders_to_svg_after_backward_too():
    loss, params = _rnn_loop(steps=2)
    svg = draw_graph(loss, params=params, by_iteration=True).pipe(format="svg").decode()
    assert "<svg" in svg and "iteration 2" in svg and "before the loop" in svg
    loss.backward()
    svg = draw_graph(loss, params=params, by_iteration=True).pipe(format="svg").decode()
    assert "iteration 1" in svg and "FREED" in svg


# draw_graph(_rnn_loop(steps=1)) as drawn by backward_twice/instruments/graph.py before by_iteration existed (commit
# bc79062).
OLD_RNN_SOURCE = """digraph {
\tgraph [size="8.5,14"]
\tnode [align=left fontname=monospace fontsize=10 height=0.2 ranksep=0.1 shape=box style=filled]
\tout0 [label="output
()" fillcolor=darkolivegreen1]
\top0 -> out0
\top0 [label=SumBackward0]
\top1 -> op0
\top1 [label=PowBackward0]
\top2 -> op1
\top1_saved0 [label="self
(4,) float32
16 B alive" fillcolor=orange]
\top1_saved0 -> op1 [dir=none style=solid]
\top2 [label=TanhBackward0]
\top3 -> op2
\top2_saved0 [label="result
(4,) float32
16 B alive" fillcolor=orange]
\top2_saved0 -> op2 [dir=none style=solid]
\top3 [label=AddBackward0]
\top4 -> op3
\top5 -> op3
\top4 [label=MvBackward0]
\top6 -> op4
\top4_saved0 [label="vec
(3,) float32
12 B alive" fillcolor=orange]
\top4_saved0 -> op4 [dir=none style=solid]
\top5 [label=MvBackward0]
\top7 -> op5
\top8 -> op5
\top5_saved0 [label="self
(4, 4) float32
64 B alive" fillcolor=orange]
\top5_saved0 -> op5 [dir=none style=solid]
\top5_saved1 [label="vec
(4,) float32
16 B alive" fillcolor=orange]
\top5_saved1 -> op5 [dir=none style=solid]
\top6 [label="W
(4, 3)" fillcolor=lightblue]
\top7 [label="U
(4, 4)" fillcolor=lightblue]
\top8 [label=TanhBackward0]
\top9 -> op8
\top8_saved0 [label="result
(4,) float32
16 B alive" fillcolor=orange]
\top8_saved0 -> op8 [dir=none style=solid]
\top9 [label="h0
(4)" fillcolor=lightblue]
}
"""
