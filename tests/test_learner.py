"""backward_twice/record/learner.py: what the tools that run a learner's step share (input checks, the optimizer guard,
the names a step knows, notebook cells named as tracebacks name them)."""

from __future__ import annotations

import contextlib
import linecache
import sys
import types

import pytest
import torch

from backward_twice.record.learner import learner_line, lines_of_file, passed_optimizers_only, place, site_of
from backward_twice.record.step_input import as_items, check_step, known_names


class FakeCompiler:
    """IPython's compiler, as far as place uses it: cell files it knows, by execution count."""

    def __init__(self, cells: dict[str, int]) -> None:
        self.cells = cells

    def format_code_name(self, name: str):
        return ("Cell", f"In[{self.cells[name]}]") if name in self.cells else None


def test_cells_are_named_as_tracebacks_name_them(monkeypatch) -> None:
    shell = types.SimpleNamespace(compile=FakeCompiler({"/tmp/ipykernel_41/2901.py": 7}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert place("/tmp/ipykernel_41/2901.py", 3) == "Cell In[7], line 3"
    assert place("/a/train.py", 9) == "/a/train.py:9"


def test_outside_ipython_a_cell_file_keeps_its_path(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert place("/tmp/ipykernel_41/2901.py", 3) == "/tmp/ipykernel_41/2901.py:3"
    monkeypatch.delitem(sys.modules, "IPython")
    assert place("/tmp/ipykernel_41/2901.py", 3) == "/tmp/ipykernel_41/2901.py:3"


def test_the_learners_line_is_the_first_frame_of_their_own_code_named_as_a_cell(monkeypatch) -> None:
    cell_file = "/kernel-cells/ipykernel_1/123.py"  # not under /tmp: a clone of the repository may be there
    shell = types.SimpleNamespace(compile=FakeCompiler({cell_file: 7}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    source = "import sys\nframe = sys._getframe()\n"
    linecache.cache[cell_file] = (len(source), None, source.splitlines(True), cell_file)
    namespace: dict = {}
    exec(compile(source, cell_file, "exec"), namespace)
    try:
        assert learner_line(namespace["frame"], skipped=()) == "Cell In[7], line 2: frame = sys._getframe()"
        skipping_cells = learner_line(namespace["frame"], skipped=("/kernel-cells/",))  # the next frame out: this test
        assert skipping_cells.startswith(f"{__file__}:") and "skipping_cells = learner_line" in skipping_cells
    finally:
        del linecache.cache[cell_file]


def test_a_cells_line_is_read_back_to_its_file_and_cells_of_one_number_by_their_code(monkeypatch) -> None:
    """A judge that reads the learner's lines back from "Cell In[3], line 2: code" got nothing for a cell (site_of
    said None), so a ``%%diagnose`` cell's fixes fell back to generic text ("the earlier backward"). Cells run without
    history share a number: the code of the line tells them apart."""
    cells = {"/kernel-cells/ipykernel_1/11.py": "a = 1\nsetup = 2\n", "/kernel-cells/ipykernel_1/12.py": "b = 1\nc = 2"}
    shell = types.SimpleNamespace(compile=FakeCompiler(dict.fromkeys(cells, 3)))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    for name, source in cells.items():
        monkeypatch.setitem(linecache.cache, name, (len(source), None, source.splitlines(True), name))
    first, second = cells
    assert site_of("Cell In[3], line 2: setup = 2") == (first, 2)
    assert site_of("Cell In[3], line 2: c = 2") == (second, 2)
    assert site_of("Cell In[3], line 1") == (second, 1)  # no code to tell them apart: the latest
    assert lines_of_file("Cell In[3], line 1: a = 1") == ["a = 1", "setup = 2"]
    assert site_of("Cell In[4], line 1: a = 1") is None and site_of("/a/train.py:9: x = 1") == ("/a/train.py", 9)


def test_check_step_names_the_tool_and_what_to_do() -> None:
    def train(model, batch, *, lr, log=False, **extra):
        pass

    with pytest.raises(TypeError) as error:
        check_step(train, "diagnose")
    assert str(error.value) == (
        "diagnose takes a step with no arguments; yours needs (model, batch, lr): wrap it, "
        "e.g. lambda: train(model, batch, lr=lr)"
    )
    with pytest.raises(TypeError, match=r"^gradient_check takes a step: a function of no arguments .*got int$"):
        check_step(3, "gradient_check")
    check_step(lambda *args, scale=1.0: None)  # nothing required: fine


def test_as_items_takes_one_a_list_or_a_dicts_values() -> None:
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    assert as_items(a, torch.nn.Module, "models", "torch.nn.Module") == (a,)
    assert as_items([a, b], torch.nn.Module, "models", "torch.nn.Module") == (a, b)
    assert as_items({"D": a, "G": b}, torch.nn.Module, "models", "torch.nn.Module") == (a, b)
    with pytest.raises(TypeError, match=r"^tool: models must be a torch\.nn\.Module or a list of them; got str$"):
        as_items("net", torch.nn.Module, "models", "torch.nn.Module", "tool")


def test_known_names_come_from_the_closure_then_the_globals_read() -> None:
    net = torch.nn.Linear(1, 1)

    def step():
        return net, torch

    assert known_names(step) == {"net": net, "torch": torch}
    assert known_names(print) == {}


def test_an_optimizer_nobody_passed_is_stopped_before_it_steps() -> None:
    net = torch.nn.Linear(2, 1)
    known, stranger = torch.optim.SGD(net.parameters(), lr=1.0), torch.optim.SGD(net.parameters(), lr=1.0)
    stepped: list[int] = []
    stranger.register_step_post_hook(lambda *args: stepped.append(1))

    def step():
        net(torch.ones(1, 2)).sum().backward()
        known.step()
        with contextlib.suppress(Exception):  # a step's own except must not swallow the guard
            stranger.step()

    with (
        pytest.raises(
            ValueError,
            match=r"^tool: the step calls stranger \(SGD\)\.step\(\), an optimizer not in "
            r"optimizers: pass every optimizer",
        ),
        passed_optimizers_only(step, (known,), "tool"),
    ):
        step()
    assert stepped == []  # stopped before its update
    with passed_optimizers_only(step, (known, stranger), "tool"):
        step()  # both passed: nothing to stop
    known.step()  # outside: no guard left behind
