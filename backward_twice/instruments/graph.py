"""Draw the autograd graph with the tensors each node saved, and whether each is alive or freed.

torchviz's ``make_dot(show_saved=True)`` reads ``grad_fn._saved_*``, which raises after backward,
and names nodes by ``id()``, so its output changes on every run. :func:`draw_graph` records what
each node saved the first time it sees it (in the node's ``metadata`` dict, which lives as long
as the node), tells freed from alive by trying to read each saved attribute, and numbers nodes in
walk order so the same graph always gives the same drawing. ``draw_graph(by_iteration=True)`` colours
each node by the loop iteration that stamped it in ``metadata[ITERATION_KEY]``.

Used by notebooks 01_graph_buffers, 02_multi_loss and 04_carried_state.
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import graphviz
import torch
from torch.autograd.graph import Node

from backward_twice.common.units import format_bytes
from backward_twice.steps.carried import ITERATION_KEY

__all__ = [
    "ITERATION_KEY",
    "AutogradGraph",
    "SavedTensorInfo",
    "dot_install_help",
    "draw_graph",
    "record_saved_tensors",
    "saved_tensors_of",
]

Roots = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
Params = torch.nn.Module | Mapping[str, torch.Tensor] | None

_RECORD_KEY = "backward_twice.saved"

# torchviz's palette, so drawings look like the make_dot ones learners meet elsewhere.
_OUTPUT_COLOUR = "darkolivegreen1"
_LEAF_COLOUR = "lightblue"
_SAVED_COLOUR = "orange"
_FREED_COLOUR = "white"
# Okabe-Ito's colour-blind-safe palette, cycled by iteration: (fill, the text colour readable on it). Its
# orange (#E69F00) is left out: it looks like the saved tensors' orange.
_ITERATION_PALETTE = (
    ("#009E73", "black"),
    ("#CC79A7", "black"),
    ("#0072B2", "white"),
    ("#F0E442", "black"),
    ("#56B4E9", "black"),
    ("#D55E00", "black"),
)
_UNSTAMPED = "before the loop"
# A white rectangle under the whole drawing. Graphviz paints a white polygon as the background, but when it
# shrinks a drawing to ``size`` it writes the scale rounded to two decimals, so the polygon can stop a few
# points short of the picture's right and bottom edges: a dark strip there in JupyterLab's dark theme.
SVG_BACKGROUND = '<rect width="100%" height="100%" fill="white"/>'
_FIRST_GROUP = re.compile(r'<g id="graph0"')

# The same commands as scripts/ensure-dot.sh prints (tests/test_graph.py keeps the two lists equal).
DOT_INSTALL_COMMANDS = {
    "Debian/Ubuntu": "sudo apt-get install -y graphviz",
    "Fedora": "sudo dnf install graphviz",
    "macOS (Homebrew)": "brew install graphviz",
    "Windows": "winget install --id Graphviz.Graphviz",
    "conda": "conda install -c conda-forge graphviz",
}


def dot_install_help() -> str:
    """How to install Graphviz's ``dot`` on each platform, shown by every notebook's drawings when it is missing."""
    lines = ["Graphviz's `dot` program is not installed, so the graph cannot be drawn as a picture."]
    lines.append("Install it, then restart the kernel:")
    lines += [f"  {platform:<17} {command}" for platform, command in DOT_INSTALL_COMMANDS.items()]
    return "\n".join(lines)


@dataclass(frozen=True)
class SavedTensorInfo:
    """One tensor a graph node saved for backward.

    ``shape``, ``dtype`` and ``nbytes`` are ``None`` when the buffer was freed before anything
    recorded it (draw the graph before backward to keep them). Listed in notebooks 01_graph_buffers
    and 02_multi_loss.
    """

    node: str
    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | None
    alive: bool

    def describe(self) -> str:
        """``'_saved_self (3, 4) float32 48 B alive'``."""
        state = "alive" if self.alive else "FREED"
        if self.shape is None:
            return f"{self.name} (size not recorded) {state}"
        nbytes = format_bytes(self.nbytes or 0)
        return f"{self.name} {tuple(self.shape)} {self.dtype} {nbytes} {state}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _saved_attribute_names(fn: Any) -> list[str]:
    return sorted(name for name in dir(fn) if name.startswith("_saved_"))


def _tensors_in(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                yield f"{name}[{i}]", item


@dataclass(frozen=True)
class _SavedNow:
    """A node's saved attributes as read now: each tensor still readable, by its name (``_saved_self``,
    ``_saved_tensors[0]``), and the names of the attributes already freed."""

    alive: dict[str, torch.Tensor]
    freed: tuple[str, ...]


def _read_saved(fn: Any) -> _SavedNow:
    """Readable saved tensors of a node, and the names of saved attributes already freed."""
    alive: dict[str, torch.Tensor] = {}
    freed: list[str] = []
    for name in _saved_attribute_names(fn):
        try:
            value = getattr(fn, name)
        except RuntimeError:
            freed.append(name)
            continue
        alive.update(_tensors_in(name, value))
    return _SavedNow(alive, tuple(freed))


def saved_tensors_of(fn: Any) -> list[SavedTensorInfo]:
    """What one graph node (a ``grad_fn``) saved, alive or freed, in a stable order.

    The first call while the buffers are alive records their shapes in ``fn.metadata`` so that
    later calls, after backward, can still say what was freed. Used by notebooks 01_graph_buffers, 02_multi_loss and
    04_carried_state.
    """
    node = type(fn).__name__
    saved_now = _read_saved(fn)
    metadata = getattr(fn, "metadata", None)
    recorded: list[SavedTensorInfo] = list(metadata.get(_RECORD_KEY, [])) if metadata is not None else []
    current = {
        name: SavedTensorInfo(node, name, tuple(t.shape), _dtype_name(t.dtype), t.numel() * t.element_size(), True)
        for name, t in saved_now.alive.items()
    }
    if metadata is not None and not recorded and current:
        metadata[_RECORD_KEY] = list(current.values())
        recorded = list(current.values())
    result: list[SavedTensorInfo] = []
    seen: set[str] = set()
    for info in recorded:
        still_alive = info.name in current
        result.append(replace(info, alive=still_alive))
        seen.add(info.name)
    for name, info in current.items():
        if name not in seen:
            result.append(info)
    for name in saved_now.freed:
        if not any(info.name == name or info.name.startswith(name + "[") for info in result):
            result.append(SavedTensorInfo(node, name, None, None, None, False))
    return result


def record_saved_tensors(roots: Roots) -> int:
    """Record what every node of the graph saved, so drawings after backward can show it.

    :func:`draw_graph` does this itself; call this when you want to backward before drawing.
    Returns how many saved tensors were recorded. Used by notebook 02_multi_loss.
    """
    return sum(len(saved_tensors_of(fn)) for fn in _walk(_root_tensors(roots, "record_saved_tensors")))


def _root_tensors(roots: Roots, caller: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(roots, torch.Tensor):
        named = [("output", roots)]
    elif isinstance(roots, Mapping):
        named = list(roots.items())
    elif isinstance(roots, (list, tuple)):
        named = [(f"output {i}", t) for i, t in enumerate(roots)]
    else:
        raise TypeError(
            f"{caller}() takes a tensor, a list of tensors or a dict of named tensors, not {type(roots).__name__}."
        )
    if not named:
        raise ValueError(f"{caller}() needs at least one tensor to draw.")
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{caller}(): {name!r} is a {type(tensor).__name__}, not a torch.Tensor.")
        if tensor.grad_fn is None and not tensor.requires_grad:
            raise ValueError(
                f"{caller}(): {name!r} has no autograd graph: it was computed from tensors that "
                "do not require grad (or under torch.no_grad(), or it was detached). Build it "
                "from parameters or from a tensor made with requires_grad=True."
            )
    return named


def _walk(named_roots: list[tuple[str, torch.Tensor]]) -> list[Node]:
    """Graph nodes in breadth-first order from the roots: the order names are given in."""
    order: list[Node] = []
    seen: set[int] = set()
    queue: list[Node | None] = [t.grad_fn for _, t in named_roots if t.grad_fn is not None]
    while queue:
        fn = queue.pop(0)
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        order.append(fn)
        queue.extend(next_fn for next_fn, _ in fn.next_functions)
    return order


class AutogradGraph(graphviz.Digraph):  # type: ignore[misc]  # graphviz ships no type information
    """A graphviz drawing of an autograd graph, with the saved tensors it lists.

    It shows as a picture in Jupyter, on a white background of its own (readable in a dark theme too: see
    :data:`SVG_BACKGROUND`). When Graphviz's ``dot`` is missing it shows the install
    commands and a text rendering instead of a traceback; ``.text`` always holds that rendering.
    Returned by :func:`draw_graph` in notebooks 01_graph_buffers and 02_multi_loss.

    ``iteration_counts`` maps each iteration drawn to its number of operation nodes (leaves, outputs
    and saved tensors are not counted), in order, with ``None`` last for nodes no iteration stamped:
    ``{1: 4, 2: 5, None: 1}``. It is ``{}`` unless drawn with ``by_iteration=True``.
    """

    saved: list[SavedTensorInfo]
    text: str
    iteration_counts: dict[int | None, int]

    def summary(self) -> str:
        """``'7 saved tensors: 4 alive, 3 freed'``: a stable line to print under a drawing."""
        alive = sum(info.alive for info in self.saved)
        return f"{len(self.saved)} saved tensors: {alive} alive, {len(self.saved) - alive} freed"

    def alt_text(self) -> str:
        """The drawing in words, for screen readers: the summary line, then the text rendering one
        node per clause (``"op1 PowBackward0 <- op2; saved _saved_self (2, 1) float32 8 B alive; ..."``)."""
        nodes = "; ".join(line.strip() for line in self.text.splitlines() if line.strip())
        return f"Autograd graph. {self.summary()}. {nodes}."

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, str] | tuple[dict[str, str], dict[str, dict[str, str]]]:
        if shutil.which("dot") is None:
            return {"text/plain": dot_install_help() + "\n\nThe graph as text:\n" + self.text}
        try:
            bundle: dict[str, str] = super()._repr_mimebundle_(include, exclude, **kwargs)
        except graphviz.ExecutableNotFound:
            return {"text/plain": dot_install_help() + "\n\nThe graph as text:\n" + self.text}
        svg = bundle.get("image/svg+xml")
        if not isinstance(svg, str):
            return bundle
        if SVG_BACKGROUND not in svg:
            # Readable on any page colour: see SVG_BACKGROUND.
            bundle["image/svg+xml"] = _FIRST_GROUP.sub(SVG_BACKGROUND + r"\g<0>", svg, count=1)
        # The output's metadata carries the words; the offline copy writes them into the image's alt.
        return bundle, {"image/svg+xml": {"alt": self.alt_text()}}


def _parameter_names(params: Params) -> dict[int, str]:
    if params is None:
        return {}
    if isinstance(params, torch.nn.Module):
        return {id(p): name for name, p in params.named_parameters()}
    if isinstance(params, Mapping):
        names: dict[int, str] = {}
        for name, p in params.items():
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"draw_graph(params=...): {name!r} is a {type(p).__name__}, not a tensor.")
            names[id(p)] = name
        return names
    raise TypeError(
        f"draw_graph(params=...) takes a torch.nn.Module or a dict of named tensors, not {type(params).__name__}."
    )


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def _saved_label(info: SavedTensorInfo) -> str:
    name = info.name.removeprefix("_saved_")
    state = "alive" if info.alive else "FREED"
    if info.shape is None:
        return f"{name}\n(size not recorded)\n{state}"
    return f"{name}\n{tuple(info.shape)} {info.dtype}\n{format_bytes(info.nbytes or 0)} {state}"


def _iteration_of(fn: Any) -> int | None:
    """The iteration stamped on a node under :data:`ITERATION_KEY`, or ``None`` when it has none."""
    metadata = getattr(fn, "metadata", None)
    value = metadata.get(ITERATION_KEY) if metadata is not None else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"draw_graph(by_iteration=True): {type(fn).__name__}.metadata[{ITERATION_KEY!r}] is {value!r}; "
            "stamp each node with the number of the iteration that built it: 1, 2, ..."
        )
    return value


def _iteration_look(iteration: int | None) -> tuple[str, dict[str, str]]:
    """The label line and node attributes that mark an operation built by ``iteration`` (None: unstamped)."""
    if iteration is None:
        return _UNSTAMPED, {"fillcolor": "white", "style": "filled,dashed"}
    fill, text = _ITERATION_PALETTE[(iteration - 1) % len(_ITERATION_PALETTE)]
    return f"iteration {iteration}", {"fillcolor": fill} | ({"fontcolor": text} if text != "black" else {})


def _iteration_counts(nodes: list[Node]) -> dict[int | None, int]:
    found = [_iteration_of(fn) for fn in nodes if not isinstance(getattr(fn, "variable", None), torch.Tensor)]
    keys = sorted({k for k in found if k is not None}) + ([None] if None in found else [])
    return {k: found.count(k) for k in keys}


def _add_iteration_legend(graph: AutogradGraph) -> None:
    """A column of swatches, one per iteration drawn (then one for unstamped nodes), in a box labelled legend."""
    with graph.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontname="monospace", fontsize="10", style="dashed")
        if not any(k is not None for k in graph.iteration_counts):
            legend.node("legend_none", f"no node carries\nmetadata[{ITERATION_KEY!r}]", fillcolor="white")
            return
        names = [f"legend_{k or 'none'}" for k in graph.iteration_counts]
        for name, k in zip(names, graph.iteration_counts):
            label, look = _iteration_look(k)
            legend.node(name, label, **look)
        for above, below in itertools.pairwise(names):
            legend.edge(above, below, style="invis")  # keeps them in order, top to bottom


def draw_graph(
    roots: Roots, params: Params = None, show_saved: bool = True, by_iteration: bool = False
) -> AutogradGraph:
    """The autograd graph behind ``roots`` with each node's saved tensors, alive or freed.

    ``roots`` is a tensor (usually a loss), a list of tensors or a dict of named tensors.
    ``params`` (a module or a dict of named tensors) names the leaves, as in torchviz. Colours
    follow torchviz: green outputs, blue leaves, grey operations, orange saved tensors; freed
    buffers are white, dashed and labelled FREED. Works before and after backward, and the same
    graph gives the same drawing on every run. Used by notebooks 01_graph_buffers, 02_multi_loss and 04_carried_state.

    ``by_iteration=True`` shows which loop iteration built each operation, read from the stamp a
    loop leaves in ``grad_fn.metadata[ITERATION_KEY]`` (1, 2, ...): stamped operations are filled
    with one Okabe-Ito colour per iteration (six, cycled) and labelled "iteration k"; once any node is stamped,
    unstamped ones are white, dashed and labelled "before the loop". A legend lists the colours
    (or says no node was stamped), and ``graph.iteration_counts`` says how many operations each
    iteration has in the drawing. Leaves, outputs and saved tensors look the same either way, and
    with ``by_iteration=False`` (the default) stamps are ignored.
    """
    named_roots = _root_tensors(roots, "draw_graph")
    param_names = _parameter_names(params)
    graph = AutogradGraph(
        node_attr={
            "style": "filled",
            "shape": "box",
            "align": "left",
            "fontsize": "10",
            "ranksep": "0.1",
            "height": "0.2",
            "fontname": "monospace",
        },
        # At most about 800 px wide, the width of a JupyterLab notebook column: wider graphs scale down.
        graph_attr={"size": "8.5,14"},
    )
    nodes = _walk(named_roots)
    node_ids = {id(fn): f"op{i}" for i, fn in enumerate(nodes)}
    graph.saved = []
    graph.iteration_counts = _iteration_counts(nodes) if by_iteration else {}
    stamped = any(k is not None for k in graph.iteration_counts)
    text_lines: list[str] = []

    for i, (name, tensor) in enumerate(named_roots):
        root_id = f"out{i}"
        graph.node(root_id, f"{name}\n{_shape(tensor)}", fillcolor=_OUTPUT_COLOUR)
        if tensor.grad_fn is not None:
            graph.edge(node_ids[id(tensor.grad_fn)], root_id)
            text_lines.append(f"{name} {_shape(tensor)} <- {node_ids[id(tensor.grad_fn)]}")
        else:
            text_lines.append(f"{name} {_shape(tensor)} (a leaf: no operations)")

    for fn in nodes:
        fn_id = node_ids[id(fn)]
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaf_name = param_names.get(id(variable), "")
            graph.node(fn_id, f"{leaf_name}\n{_shape(variable)}".strip(), fillcolor=_LEAF_COLOUR)
            text_lines.append(f"{fn_id} leaf {leaf_name or 'tensor'} {_shape(variable)}".replace("  ", " "))
            continue
        built_by, look = _iteration_look(_iteration_of(fn)) if stamped else ("", {})
        graph.node(fn_id, f"{type(fn).__name__}\n{built_by}" if built_by else type(fn).__name__, **look)
        inputs = []
        for next_fn, _ in fn.next_functions:
            if next_fn is not None:
                graph.edge(node_ids[id(next_fn)], fn_id)
                inputs.append(node_ids[id(next_fn)])
        saved = saved_tensors_of(fn) if show_saved else []
        graph.saved.extend(saved)
        text_lines.append(
            f"{fn_id} {type(fn).__name__} <- {', '.join(inputs) or 'nothing'}" + (f" ({built_by})" if built_by else "")
        )
        for j, info in enumerate(saved):
            saved_id = f"{fn_id}_saved{j}"
            label = _saved_label(info)
            if info.alive:
                graph.node(saved_id, label, fillcolor=_SAVED_COLOUR)
            else:
                graph.node(saved_id, label, fillcolor=_FREED_COLOUR, style="filled,dashed", fontcolor="gray40")
            graph.edge(saved_id, fn_id, dir="none", style="dotted" if not info.alive else "solid")
            text_lines.append(f"    saved {info.describe()}")
    if by_iteration:
        _add_iteration_legend(graph)
    graph.text = "\n".join(text_lines)
    return graph
