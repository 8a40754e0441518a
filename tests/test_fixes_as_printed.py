"""A carried graph's fix, pasted into the learner's loop exactly as the watch prints it, runs and trains as the
truth does (established here without the tool: the loop detached by hand, or as published)."""

from __future__ import annotations

import contextlib
import re
import runpy
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from backward_twice.watcher import watch

# An NTM's controller state on its module, as loudinthecloud/pytorch-ntm keeps it (``CopyTaskNTM.forward``:
# ``o, self.previous_state = self.ntm(x, self.previous_state)``, a tuple of (reads list, (h, c), heads list)), with
# ``init_sequence`` called once before the loop instead of per batch, and ``y, _ = net(x)`` in the loop.
NTM = """
import pytest
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 4)
        self.fc = nn.Linear(4, 1)

    def init_sequence(self):
        self.previous_state = ([torch.zeros(2, 4)], (torch.zeros(2, 4), torch.zeros(2, 4)), [torch.zeros(2, 6)])

    def forward(self, x):
        reads, (h, c), heads = self.previous_state
        h, c = self.cell(x + reads[0][:, :3], (h, c))
        self.previous_state = ([h * 2], (h, c), [heads[0] + h.sum()])
        return self.fc(h) + heads[0][:, :1], self.previous_state


torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
net.init_sequence()
for step in range(3):
    opt.zero_grad()
    for i in range(2):
        y, _ = net(torch.randn(2, 3))
    loss = y.pow(2).mean()
    loss.backward()
    opt.step()
    # END OF ITERATION
"""

# DeepDream's input optimisation (MultiTrickFox/Unconventional_Image_Manipulation, main.py): the image is what is
# trained, ``input = clamp(input, ...).detach().requires_grad_(True)`` at the end of each pass; here without the
# ``.detach()``, as a learner drops it.
DREAM = """
import pytest
import torch
from torch import nn

torch.manual_seed(0)
features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
input = torch.rand(1, 3, 6, 6, requires_grad=True)
for iteration in range(4):
    output = features(input)
    loss = output.pow(2).sum()
    loss.backward()
    with torch.no_grad():
        input -= input.grad * 1e-3
        input.grad = None
    input = torch.clamp(input, min=0, max=1).requires_grad_(True)
    # END OF ITERATION
"""


def _carried_fix(source: str, path: Path) -> str:
    """The fix of the carried graph's item, as a watch around the whole script prints it."""
    body = "\n".join(f"    {line}" for line in source.strip("\n").split("\n"))
    watched = f"try:\n  with watch() as w:\n{body}\nexcept Exception:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    report = runpy.run_path(str(path))["w"].report
    [item] = [item for item in report.items if item.kind == "carried"]
    return item.fix


def _fix_of(source: str, path: Path) -> str:
    """The statement the watch's carried graph's fix says to add at the end of each iteration."""
    printed = _carried_fix(source, path)
    fix = re.fullmatch(r"add `(.+)` at the end of each iteration", printed)
    assert fix is not None, printed
    return fix.group(1)


def _run(source: str, path: Path) -> dict:
    path.write_text(source)
    return runpy.run_path(str(path))


def _items_watched(source: str, path: Path) -> list:
    """The report's items for ``source`` run under ``watch()`` as a script (its error caught): ``source`` stands 3
    lines lower than in its own file."""
    path.write_text(
        "from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n"
        + "\n".join(f"    {line}" for line in source.strip("\n").split("\n"))
        + "\nexcept RuntimeError:\n  pass\n"
    )
    return list(runpy.run_path(str(path))["w"].report.items)


def _trains_as_by_hand(source: str, by_hand: str, fix: str, name: str, tmp_path: Path) -> None:
    """The loop with ``fix`` added at the end of each iteration trains ``name`` as the loop fixed ``by_hand`` does."""
    expected = _run(by_hand, tmp_path / "by_hand.py")[name].state_dict()
    fixed = _run(source.replace("    # END OF ITERATION", f"    {fix}"), tmp_path / "fixed.py")[name]
    assert all(torch.equal(fixed.state_dict()[key], value) for key, value in expected.items())


def test_a_state_of_lists_and_tuples_kept_on_a_module_is_detached_whole_by_the_printed_fix(tmp_path: Path) -> None:
    """The fix was "add `_[1] = tuple(s.detach() for s in _[1])`" (``_``, the throwaway of ``y, _ = net(x)``; a
    tuple's item cannot be assigned: a TypeError as printed), with the lists of the state given "keep detached copies
    (`_[2].append(out.detach())`)". The walk did not look into the module's tuple of tuples. The truth: detaching every
    tensor of ``net.previous_state`` at the end of each pass runs, and trains as the hand-detached loop."""
    by_hand = NTM.replace(
        "    # END OF ITERATION",
        "    r, cs, hs = net.previous_state\n"
        "    net.previous_state = ([t.detach() for t in r], tuple(t.detach() for t in cs), [t.detach() for t in hs])",
    )
    expected = _run(by_hand, tmp_path / "by_hand.py")["net"].state_dict()
    fix = _fix_of(NTM, tmp_path / "ntm.py")
    assert fix.startswith("net.previous_state = "), fix
    fixed = _run(NTM.replace("    # END OF ITERATION", textwrap.indent(fix, "    ")), tmp_path / "fixed.py")["net"]
    assert all(torch.equal(fixed.state_dict()[key], value) for key, value in expected.items())


def test_an_input_the_loop_trains_by_its_grad_keeps_asking_for_it_after_the_printed_detach(tmp_path: Path) -> None:
    """DeepDream without the ``.detach()``: the fix was "add `input = input.detach()`", which as printed raises at
    ``input.grad * 1e-3`` (a detached image has no ``.grad``). The truth: ``.detach().requires_grad_()`` runs and
    gives the published image."""
    published = DREAM.replace(".requires_grad_(True)\n", ".detach().requires_grad_(True)\n")
    expected = _run(published, tmp_path / "published.py")["input"]
    fix = _fix_of(DREAM, tmp_path / "dream.py")
    assert fix == "input = input.detach().requires_grad_()", fix
    fixed = _run(DREAM.replace("    # END OF ITERATION", f"    {fix}"), tmp_path / "fixed.py")["input"]
    assert torch.equal(fixed, expected)


# A module of recurrent state trained on a few batches: the loop the state tests below share.
TRAINED = """

torch.manual_seed(0)
model = {cls}()
optim = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in zip(torch.randn(4, 2, 3), torch.randn(4, 2, 1)):
    optim.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optim.step()
    # END OF ITERATION
"""

# A seq2seq's encoder and decoder states kept on the module by name (``self.states = {'enc': (h, c), 'dec': (h,
# c)}``), rebuilt each pass from the last one's: never detached.
STATES = """
import pytest
import torch
from torch import nn


class Seq2(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec, self.fc = nn.LSTMCell(3, 4), nn.LSTMCell(4, 4), nn.Linear(4, 1)
        self.states = {"enc": (torch.zeros(2, 4), torch.zeros(2, 4)), "dec": (torch.zeros(2, 4), torch.zeros(2, 4))}

    def forward(self, x):
        he, ce = self.enc(x, self.states["enc"])
        hd, cd = self.dec(he, self.states["dec"])
        self.states = {"enc": (he, ce), "dec": (hd, cd)}
        return self.fc(hd)

"""
STATES += TRAINED.format(cls="Seq2")


def test_states_kept_on_a_module_in_a_dict_of_tuples_are_named_and_detached_as_printed(tmp_path: Path) -> None:
    """The module's dict of (h, c) tuples was not looked into: "a tensor no name of yours holds", "detach the tensor
    that carries it". The truth: detaching each entry's tuple at the end of each pass runs and trains as the loop
    detached by hand."""
    by_hand = STATES.replace(
        "    # END OF ITERATION",
        "    model.states = {k: tuple(t.detach() for t in v) for k, v in model.states.items()}",
    )
    expected = _run(by_hand, tmp_path / "by_hand.py")["model"].state_dict()
    body = "\n".join(f"    {line}" for line in STATES.strip("\n").split("\n"))
    (tmp_path / "states.py").write_text(
        f"from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n{body}\nexcept Exception:\n  pass\n"
    )
    items = runpy.run_path(str(tmp_path / "states.py"))["w"].report.items
    fixes = [re.fullmatch(r"add `(.+)` at the end of each iteration", item.fix) for item in items]
    assert [item.label.split(" carries")[0] for item in items] == ["`model.states['enc']`", "`model.states['dec']`"]
    assert all(fixes), [item.fix for item in items]
    added = "\n".join(f"    {fix.group(1)}" for fix in fixes if fix)
    fixed = _run(STATES.replace("    # END OF ITERATION", added), tmp_path / "fixed.py")["model"]
    assert all(torch.equal(fixed.state_dict()[key], value) for key, value in expected.items())


# A universal adversarial perturbation kept on an attack object, updated by its method from its own ``.grad``
# (``self.delta = (self.delta + lr * self.delta.grad).clamp(...)``), without the detach that keeps it a leaf.
ATTACK = """
import pytest
import torch
from torch import nn


class Universal:
    def __init__(self, model):
        self.model = model
        self.delta = torch.zeros(1, 5, requires_grad=True)

    def step(self, batch):
        score = self.model(batch + self.delta).sum()
        score.backward()
        self.delta = (self.delta + 0.01 * self.delta.grad).clamp(-0.05, 0.05)


torch.manual_seed(0)
atk = Universal(nn.Linear(5, 2))
for b in torch.randn(5, 3, 5):
    atk.step(b)
    # END OF ITERATION
"""


def test_an_attribute_a_method_rebuilds_from_its_grad_is_carried_and_kept_a_leaf_by_the_printed_fix(
    tmp_path: Path,
) -> None:
    """The loop raised TypeError at ``self.delta.grad`` (None: a non-leaf), and that was all the report said: the
    walk into pass 1's ``delta`` was not taken for carried state, the attribute set in a method the loop calls. The
    truth: detached and asking for its gradient again, as the method's line should, it runs."""
    by_hand = ATTACK.replace(").clamp(-0.05, 0.05)", ").clamp(-0.05, 0.05).detach().requires_grad_()")
    expected = _run(by_hand, tmp_path / "by_hand.py")["atk"].delta
    fix = _fix_of(ATTACK, tmp_path / "attack.py")
    assert fix == "atk.delta = atk.delta.detach().requires_grad_()", fix
    fixed = _run(ATTACK.replace("    # END OF ITERATION", f"    {fix}"), tmp_path / "fixed.py")["atk"].delta
    assert torch.equal(fixed, expected)


# A stacked LSTM's (h, c) per layer kept on a plain object, the next pass's list built anew in a local list first
# (``new = []; ... new.append((h, c)); carry.layers = new``), never detached.
LAYERS = """
import pytest
import torch
from torch import nn

torch.manual_seed(0)
cells = nn.ModuleList([nn.LSTMCell(3, 4), nn.LSTMCell(4, 4)])
head = nn.Linear(4, 1)
opt = torch.optim.Adam([*cells.parameters(), *head.parameters()], lr=0.01)


class Carry:
    pass


carry = Carry()
carry.layers = [(torch.zeros(2, 4), torch.zeros(2, 4)) for _ in cells]
for x, y in zip(torch.randn(4, 2, 3), torch.randn(4, 2, 1)):
    opt.zero_grad()
    inp, new = x, []
    for cell, state in zip(cells, carry.layers):
        h, c = cell(inp, state)
        new.append((h, c))
        inp = h
    carry.layers = new
    ((head(inp) - y) ** 2).mean().backward()
    opt.step()
    # END OF ITERATION
"""


def test_layers_kept_on_a_plain_object_are_named_by_it_not_by_the_list_each_pass_builds(tmp_path: Path) -> None:
    """The carrier was ``new[0]``, the local list each pass starts empty, and its fix ``new[0] = tuple(...)`` left
    ``carry.layers`` holding the graph (it still raised). The truth: detaching ``carry.layers`` whole runs, and trains
    as the loop detached by hand."""
    by_hand = LAYERS.replace(
        "    # END OF ITERATION", "    carry.layers = [tuple(t.detach() for t in pair) for pair in carry.layers]"
    )
    fix = _fix_of(LAYERS, tmp_path / "layers.py")
    assert fix.startswith("carry.layers = "), fix
    _trains_as_by_hand(LAYERS, by_hand, fix, "head", tmp_path)


# A recurrent memory kept on the module as a dict of its last state and its history (the shape of memory-augmented
# models' ``self.memory = {'h': ..., 'past': [...]}``): each pass's state is both ``mem['h']`` and the last item of
# ``mem['past']``, and nothing is detached.
MEMORY = """
import pytest
import torch
from torch import nn


class MemNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.fc = nn.GRUCell(3, 4), nn.Linear(8, 1)
        self.mem = {"h": torch.zeros(2, 4), "past": []}

    def forward(self, x):
        h = self.cell(x, self.mem["h"])
        self.mem["past"].append(h)
        context = torch.stack(self.mem["past"]).mean(0)
        self.mem["h"] = h
        return self.fc(torch.cat([h, context], 1))

"""
MEMORY += TRAINED.format(cls="MemNet")


def test_one_state_held_under_two_entries_of_a_dict_is_detached_whole_as_printed(tmp_path: Path) -> None:
    """The command named `model.mem['h']` ("add `model.mem['h'] = model.mem['h'].detach()`", after which iteration 2
    still raised through ``mem['past'][0]``), a watch in the script `model.mem['past']` (keep detached copies, after
    which ``mem['h']`` still carried it). The truth: detaching both entries by hand runs; so does the printed fix."""
    by_hand = MEMORY.replace(
        "    # END OF ITERATION",
        '    model.mem = {"h": model.mem["h"].detach(), "past": [p.detach() for p in model.mem["past"]]}',
    )
    fix = _fix_of(MEMORY, tmp_path / "memory.py")
    assert fix.startswith("model.mem = torch.utils._pytree.tree_map("), fix
    _trains_as_by_hand(MEMORY, by_hand, fix, "model", tmp_path)


# SAC's automatic entropy tuning (pranz24/pytorch-soft-actor-critic, sac.py: ``self.alpha = args.alpha``, then
# ``self.alpha = self.log_alpha.exp()`` after each update), its settings unpacked from one tuple as a script does.
SAC = """
import pytest
import torch

torch.manual_seed(0)
gamma, alpha = 0.99, 0.2
policy = torch.nn.Linear(3, 1)
policy_optim = torch.optim.Adam(policy.parameters(), lr=1e-2)
log_alpha = torch.zeros(1, requires_grad=True)
alpha_optim = torch.optim.Adam([log_alpha], lr=1e-2)
for update in range(4):
    states = torch.randn(8, 3)
    log_pi = policy(states)
    policy_loss = (alpha * log_pi - gamma * states.sum(1, keepdim=True)).pow(2).mean()
    policy_optim.zero_grad()
    policy_loss.backward()
    policy_optim.step()
    alpha_loss = -(log_alpha * (log_pi + 1.0).detach()).mean()
    alpha_optim.zero_grad()
    alpha_loss.backward()
    alpha_optim.step()
    alpha = log_alpha.exp()
    # END OF ITERATION
"""


def test_a_carrier_that_starts_as_a_number_unpacked_from_a_tuple_is_detached_after_it_holds_a_tensor(
    tmp_path: Path,
) -> None:
    """The fix was "add `alpha = alpha.detach()` before line 14", where ``alpha`` is still the float 0.2 in the first
    iteration: an AttributeError as printed (a constant given by ``alpha = 0.2`` was known, one unpacked from a tuple
    was not). The truth: detaching it where it is assigned trains the same weights; so does the printed fix."""
    by_hand = SAC.replace("alpha = log_alpha.exp()", "alpha = log_alpha.exp().detach()")
    expected = _run(by_hand, tmp_path / "by_hand.py")["policy"].state_dict()
    fix = _fix_of(SAC, tmp_path / "sac.py")
    assert fix == "alpha = alpha.detach()", fix
    fixed = _run(SAC.replace("    # END OF ITERATION", f"    {fix}"), tmp_path / "fixed.py")["policy"]
    assert all(torch.equal(fixed.state_dict()[key], value) for key, value in expected.items())


# The same memory on a plain object, rebuilt each pass from the loop's own ``h``: ``st.mem = {'h': h, 'past': [h,
# st.mem['h']]}``.
PLAIN_MEMORY = """
import pytest
import torch
from torch import nn


class State:
    pass


torch.manual_seed(0)
st = State()
cell, head = nn.GRUCell(3, 4), nn.Linear(4, 1)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=0.01)
st.mem = {"h": torch.zeros(2, 4), "past": []}
for x, y in zip(torch.randn(5, 2, 3), torch.randn(5, 2, 1)):
    opt.zero_grad()
    # COMES IN
    h = cell(x, st.mem["h"])
    st.mem = {"h": h, "past": [h, st.mem["h"]]}
    ((head(h) - y) ** 2).mean().backward()
    opt.step()
"""


def test_a_state_also_held_by_the_loops_own_variable_is_detached_whole_as_printed(tmp_path: Path) -> None:
    """The pass's ``h`` is a third name of the state's tensor, rebound before it is read: it carries nothing, yet it
    hid the state, and the fix was "keep detached copies in `st.mem['past']` (`...append(out.detach())`), or clear
    it each iteration" (no line appends; cleared, it still raises). The truth: ``st.mem['h'].detach()`` where it is
    read runs; so does the printed fix, placed where the state comes in."""
    by_hand = PLAIN_MEMORY.replace('cell(x, st.mem["h"])', 'cell(x, st.mem["h"].detach())')
    expected = _run(by_hand, tmp_path / "by_hand.py")["cell"].state_dict()
    printed = _carried_fix(PLAIN_MEMORY, tmp_path / "memory.py")
    fix = re.fullmatch(r"add `(.+)` before line \d+", printed)
    assert fix is not None and fix.group(1).startswith("st.mem = torch.utils._pytree.tree_map("), printed
    fixed = _run(PLAIN_MEMORY.replace("    # COMES IN", f"    {fix.group(1)}"), tmp_path / "fixed.py")["cell"]
    assert all(torch.equal(fixed.state_dict()[key], value) for key, value in expected.items())


# Labels made before the loop from weights that require grad (zhangyu2234/Deep-learning-by-hand, "1.3 Problems I
# encountered": ``Y = torch.mm(X, true_W) + true_b``), sliced into batches the loop takes as ``y``.
LABELS = """
import pytest
import torch

torch.manual_seed(0)
X = torch.randn(60, 2)
true_W, true_b = torch.randn(2, 1, requires_grad=True), torch.randn(1, requires_grad=True)
Y = torch.mm(X, true_W) + true_b
loader = [(X[i : i + 20], Y[i : i + 20]) for i in range(0, 60, 20)]
W, b = torch.zeros(2, 1, requires_grad=True), torch.zeros(1, requires_grad=True)
for epoch in range(2):
    for x, y in loader:
        # BODY BEGINS
        loss = ((torch.mm(x, W) + b - y) ** 2 / 2).sum()
        loss.backward()
        with torch.no_grad():
            for p in (W, b):
                p -= 0.01 * p.grad / 20
                p.grad.zero_()
"""


def test_an_item_the_loop_takes_from_a_graph_built_before_it_is_detached_as_the_body_begins(tmp_path: Path) -> None:
    """The fix was "compute `y` inside the loop (or `y = y.detach()`, if it needs no gradient)": ``y`` is what the
    loop's ``for`` gives, and the detach had no place to go. The truth: the labels made without a graph train the
    same weights as the printed fix."""
    by_hand = LABELS.replace("Y = torch.mm(X, true_W) + true_b", "Y = (torch.mm(X, true_W) + true_b).detach()")
    expected = _run(by_hand, tmp_path / "by_hand.py")["W"]
    printed = _carried_fix(LABELS, tmp_path / "labels.py")
    fix = re.fullmatch(r"add `(y = y\.detach\(\))` as the loop's body begins: .+", printed)
    assert fix is not None, printed
    fixed = _run(LABELS.replace("        # BODY BEGINS", f"        {fix.group(1)}"), tmp_path / "fixed.py")["W"]
    assert torch.equal(fixed, expected)


# zhirongw/lemniscate.pytorch's LinearAverage with its memory update moved from the Function's backward (on
# ``x.data``) into the forward, on ``x``: the buffer saved by ``mm`` is changed in place, from values with a graph.
MEMORY_BANK = """
import pytest
import torch
import torch.nn.functional as F


class LinearAverage(torch.nn.Module):
    def __init__(self, size, count, momentum=0.5):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("memory", F.normalize(torch.rand(count, size), dim=1))

    def forward(self, x, y):
        out = torch.mm(x, self.memory.t()) / 0.07
        weight_pos = self.memory.index_select(0, y) * self.momentum + x * (1 - self.momentum)
        updated_weight = F.normalize(weight_pos, dim=1)
        self.memory.index_copy_(0, y, updated_weight)
        return out


torch.manual_seed(0)
net = torch.nn.Linear(6, 4)
lemniscate = LinearAverage(4, 10)
optimizer = torch.optim.SGD(net.parameters(), lr=0.03, momentum=0.9)
for inputs, indexes in [(torch.randn(3, 6), torch.tensor([1, 4, 7])) for _ in range(3)]:
    optimizer.zero_grad()
    loss = F.cross_entropy(lemniscate(F.normalize(net(inputs), dim=1), indexes), indexes)
    loss.backward()
    optimizer.step()
"""


def test_a_buffer_changed_in_place_from_values_with_a_graph_is_written_out_of_place_detached(tmp_path: Path) -> None:
    """ "write line N out of place: `self.memory = self.memory.index_copy(0, y, updated_weight)`": as printed,
    iteration 2 raised "backward through the graph a second time" (the buffer carried iteration 1's graph). The
    truth: out of place from detached values (as the published update on ``x.data``) runs; the printed fix trains
    as that does."""
    path = tmp_path / "npid.py"
    body = "\n".join(f"    {line}" for line in MEMORY_BANK.strip("\n").split("\n"))
    path.write_text(
        f"from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n{body}\nexcept Exception:\n  pass\n"
    )
    [item] = runpy.run_path(str(path))["w"].report.items
    changed = "self.memory.index_copy_(0, y, updated_weight)"
    line = 4 + MEMORY_BANK.strip("\n").split("\n").index(f"        {changed}")  # below the watch's three lines
    printed = "self.memory = self.memory.index_copy(0, y, updated_weight).detach()"
    assert item.fix == f"write line {line} out of place, detached: `{printed}`", item.fix
    by_hand = _run(
        MEMORY_BANK.replace(changed, "self.memory = self.memory.index_copy(0, y, updated_weight.detach())"),
        tmp_path / "hand.py",
    )
    fixed = _run(MEMORY_BANK.replace(changed, printed), tmp_path / "fixed.py")
    assert all(torch.equal(a, b) for a, b in zip(by_hand["net"].parameters(), fixed["net"].parameters()))
    assert torch.equal(by_hand["lemniscate"].memory, fixed["lemniscate"].memory)


# MoCo's queue (facebookresearch/moco, builder.py) written in the forward, from keys the key encoder built with
# autograd recording (no ``torch.no_grad()`` around it), after ``l_neg`` saved the queue.
QUEUE = """
import pytest
import torch
import torch.nn.functional as F


class Moco(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_enc, self.k_enc = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
        self.register_buffer("queue", F.normalize(torch.randn(4, 6), dim=0))
        self.ptr = 0

    def forward(self, xq, xk):
        q, k = F.normalize(self.q_enc(xq), dim=1), F.normalize(self.k_enc(xk), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue], 1) / 0.07
        p = self.ptr
        self.queue[:, p:p + 2] = k.T
        self.ptr = (p + 2) % 6
        return logits


torch.manual_seed(0)
model = Moco()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    x = torch.randn(2, 5)
    loss = F.cross_entropy(model(x, x + 0.1 * torch.randn(2, 5)), torch.zeros(2, dtype=torch.long))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_buffer_changed_by_item_assignment_from_values_with_a_graph_is_copied_and_given_detached_ones(
    tmp_path: Path,
) -> None:
    """ "add `self.queue = self.queue.clone()` before line N": as printed, iteration 2 raised "backward through the
    graph a second time" (the copy took the keys' graph into the next iteration). The truth: the copy, storing
    detached keys, trains as the queue kept out of autograd does."""
    path = tmp_path / "moco.py"
    body = "\n".join(f"    {line}" for line in QUEUE.strip("\n").split("\n"))
    path.write_text(
        f"from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n{body}\nexcept Exception:\n  pass\n"
    )
    [item] = runpy.run_path(str(path))["w"].report.items
    changed = "self.queue[:, p:p + 2] = k.T"
    line = 4 + QUEUE.strip("\n").split("\n").index(f"        {changed}")  # below the watch's three lines
    assert item.fix == (
        f"add `self.queue = self.queue.clone()` before line {line}, and store a detached value there: "
        "`self.queue[:, p:p + 2] = k.T.detach()`"
    ), item.fix
    printed = "self.queue = self.queue.clone()\n        self.queue[:, p:p + 2] = k.T.detach()"
    by_hand = _run(  # the queue rebuilt out of place from the detached keys
        QUEUE.replace(changed, "self.queue = torch.cat([self.queue[:, :p], k.T.detach(), self.queue[:, p + 2 :]], 1)"),
        tmp_path / "hand.py",
    )
    fixed = _run(QUEUE.replace(changed, printed), tmp_path / "fixed.py")
    assert all(torch.equal(a, b) for a, b in zip(by_hand["model"].parameters(), fixed["model"].parameters()))


# A temporal graph network's node memory (memgraph/mage PR #121's TGN): a dict of each node's state by node id, kept
# across batches on a memory object, without the ``detach_tensor_grads()`` the thread's answer calls after each step.
TGN = """
import pytest
import torch
from torch import nn


class Memory:
    def __init__(self, memory_dimension):
        self.memory_dimension = memory_dimension
        self.memory_container = {}

    def get_node_memory(self, node):
        if node not in self.memory_container:
            self.memory_container[node] = torch.zeros(self.memory_dimension)
        return self.memory_container[node]

    def set_node_memory(self, node, value):
        self.memory_container[node] = value

    def detach_tensor_grads(self):
        for node in self.memory_container:
            self.memory_container[node] = self.memory_container[node].detach()


torch.manual_seed(0)
memory = Memory(4)
updater = nn.GRUCell(3, 4)
head = nn.Linear(8, 1)
optimizer = torch.optim.Adam(list(updater.parameters()) + list(head.parameters()), lr=1e-2)
for src, dst in [(0, 1), (1, 2), (0, 2), (2, 3)]:
    msg = torch.randn(1, 3)
    for node in (src, dst):
        new = updater(msg, memory.get_node_memory(node)[None])[0]
        memory.set_node_memory(node, new)
    emb = torch.cat([memory.get_node_memory(src), memory.get_node_memory(dst)])
    loss = (head(emb) - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # END OF ITERATION
"""


def test_a_memory_kept_in_a_dict_by_node_id_is_detached_entry_by_entry_as_printed(tmp_path: Path) -> None:
    """The fix was "add `memory.memory_container = [m.detach() for m in memory.memory_container]`" (a dict read as a
    list: its keys are numbers; as printed, "'int' object has no attribute 'detach'"), and bt.diagnose detached
    ``memory.memory_container[0]`` alone (node 1's entry then raised). The truth: the thread's answer,
    ``memory.detach_tensor_grads()`` after each step, runs; the printed fix trains as it does."""
    fix = _fix_of(TGN, tmp_path / "tgn.py")
    assert fix.startswith("for key in memory.memory_container: "), fix
    by_hand = TGN.replace("    # END OF ITERATION", "    memory.detach_tensor_grads()")
    _trains_as_by_hand(TGN, by_hand, fix, "head", tmp_path)
    _trains_as_by_hand(TGN, by_hand, fix, "updater", tmp_path)
    setup = TGN.split("for src, dst in")[0]
    step = textwrap.dedent(
        """
        def step():
            src, dst = 0, 1
            msg = torch.randn(1, 3)
            for node in (src, dst):
                new = updater(msg, memory.get_node_memory(node)[None])[0]
                memory.set_node_memory(node, new)
            emb = torch.cat([memory.get_node_memory(src), memory.get_node_memory(dst)])
            loss = (head(emb) - 1.0).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


        diagnosis = diagnose(step, models=[updater, head], optimizers=[optimizer])
        """
    )
    (tmp_path / "tgn_step.py").write_text(f"from backward_twice import diagnose\n{setup}{step}")
    [item] = runpy.run_path(str(tmp_path / "tgn_step.py"))["diagnosis"].items
    assert item.fix == f"add `{fix}` at the end of each iteration", item.fix


# Deep mutual learning (Zhang et al., 2018) as a learner writes it: each network's loss reads the other's output,
# one step after each backward. Its published code detaches both peers' outputs.
MUTUAL = """
import pytest
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net1, net2 = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
opt1 = torch.optim.SGD(net1.parameters(), lr=0.1)
opt2 = torch.optim.SGD(net2.parameters(), lr=0.1)
for i in range(3):
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    out1, out2 = net1(x), net2(x)
    kl1 = F.kl_div(F.log_softmax(out1, -1), F.softmax(out2, -1), reduction="batchmean")
    loss1 = F.cross_entropy(out1, y) + kl1
    opt1.zero_grad()
    loss1.backward()
    opt1.step()
    kl2 = F.kl_div(F.log_softmax(out2, -1), F.softmax(out1, -1), reduction="batchmean")
    loss2 = F.cross_entropy(out2, y) + kl2
    opt2.zero_grad()
    loss2.backward()
    opt2.step()
"""


def test_two_losses_that_each_read_the_others_output_get_both_detaches_as_printed(tmp_path: Path) -> None:
    """The fix named one detach (`out2` in the first loss): applied, the next run raised at the same line, through
    `out1`. The truth: both detached, it runs and trains as the published code does; either one alone raises."""
    path = tmp_path / "mutual.py"
    watched = f"try:\n  with watch() as w:\n{textwrap.indent(MUTUAL, '    ')}\nexcept RuntimeError:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    [item] = runpy.run_path(str(path))["w"].report.items
    detaches = re.findall(r"use `(\w+)\.detach\(\)` at line (\d+) \(`", item.fix)
    assert sorted(name for name, _ in detaches) == ["out1", "out2"], item.fix
    lines = MUTUAL.split("\n")
    for name, number in detaches:  # the watched file has 3 lines more above the loop's source
        index = int(number) - 4
        assert "kl" in lines[index], (lines[index], item.fix)
        lines[index] = re.sub(rf"\b{name}\b", f"{name}.detach()", lines[index])
    fixed = _run("\n".join(lines), tmp_path / "fixed.py")
    by_hand = MUTUAL.replace("F.softmax(out2, -1)", "F.softmax(out2.detach(), -1)").replace(
        "F.softmax(out1, -1)", "F.softmax(out1.detach(), -1)"
    )
    expected = _run(by_hand, tmp_path / "by_hand.py")
    for net in ("net1", "net2"):
        assert torch.equal(fixed[net].weight, expected[net].weight)
    for alone in ("F.softmax(out2, -1)", "F.softmax(out1, -1)"):
        one = MUTUAL.replace(alone, alone.replace(", -1", ".detach(), -1"))
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            _run(one, tmp_path / "one.py")


# snntorch's Leaky neuron with init_hidden=True keeps its membrane on the module (``self.mem``), and a learner's
# network puts its neurons among other layers (jeshraghian/snntorch#250); nothing resets them between batches.
SPIKING = """
import torch
from torch import nn


class Leaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.mem = torch.zeros(0)

    def forward(self, x):
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.mem = 0.5 * self.mem + x
        return torch.sigmoid(self.mem - 1.0)


torch.manual_seed(0)
net = nn.Sequential(
    nn.Linear(4, 6), Leaky(), nn.Linear(6, 3), nn.ReLU(), Leaky(), nn.Flatten(), nn.Linear(3, 2), Leaky()
)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for batch in range(3):
    x = torch.randn(5, 4)
    loss = sum(net(x) for step in range(2)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    # END OF ITERATION
"""


def test_neurons_among_other_layers_are_detached_by_their_indices_as_printed(tmp_path: Path) -> None:
    """The fix was "add `for item in net: item.mem = item.mem.detach()`", which raises "'Linear' object has no
    attribute 'mem'": only some items of the list keep a state. The truth: those items detached by hand, it trains."""
    fix = _fix_of(SPIKING, tmp_path / "spiking.py")
    assert fix == "for i in (1, 4, 7): net[i].mem = net[i].mem.detach()", fix
    by_hand = SPIKING.replace(
        "    # END OF ITERATION", "    for layer in (net[1], net[4], net[7]):\n        layer.mem = layer.mem.detach()"
    )
    _trains_as_by_hand(SPIKING, by_hand, fix, "net", tmp_path)


# Karpathy's bigram model as a learner runs its notebook cells (karpathy/nn-zero-to-hero#31): the forward cell once,
# then the backward-and-update cell in a loop.
BIGRAM = """
import torch
import torch.nn.functional as F

g = torch.Generator().manual_seed(2147483647)
xs, ys = torch.tensor([0, 5, 13, 13, 1]), torch.tensor([5, 13, 13, 1, 0])
W = torch.randn((27, 27), generator=g, requires_grad=True)
xenc = F.one_hot(xs, num_classes=27).float()
logits = xenc @ W
counts = logits.exp()
prob = counts / counts.sum(1, keepdim=True)
loss = -prob[torch.arange(5), ys].log().mean()
for k in range(3):
    W.grad = None
    loss.backward()
    W.data += -0.1 * W.grad
"""


def test_a_loss_built_before_the_loop_names_every_line_its_graph_was_built_by(tmp_path: Path) -> None:
    """The fix was "compute `loss` inside the loop": moved alone, the loss still walks ``prob``'s graph, built before
    the loop too, and the loop raises at its second pass. The truth: the four lines of the forward moved into the
    loop (the lecture's own loop) run; the leaf ``W`` and the one-hot input, which built no graph, stay before it."""
    path = tmp_path / "bigram.py"
    watched = f"try:\n  with watch() as w:\n{textwrap.indent(BIGRAM, '    ')}\nexcept RuntimeError:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    [item] = runpy.run_path(str(path))["w"].report.items
    lines = re.search(r"with lines (\d+) to (\d+) that it comes from", item.fix)
    assert lines is not None and item.fix.startswith("compute `loss` inside the loop, with lines "), item.fix
    source = BIGRAM.split("\n")
    first, last = int(lines.group(1)) - 4, int(lines.group(2)) - 4  # the watched file has 3 lines above the source
    assert source[first].startswith("logits = ") and source[last].startswith("loss = "), item.fix
    moved = [f"    {line}" for line in source[first : last + 1]]
    header = source.index("for k in range(3):")
    fixed = _run("\n".join([*source[:first], source[header], *moved, *source[header + 1 :]]), tmp_path / "fixed.py")
    assert fixed["W"].grad is not None
    alone = BIGRAM.replace("loss = -prob", "for k in range(3):\n    loss = -prob").replace(
        "for k in range(3):\n    W", "    W", 1
    )
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(alone, tmp_path / "alone.py")


# Two names of one graph built before the loop: ``base`` is computed from ``act``, and each is read by the loop's loss.
TWO_NAMES_BEFORE = """
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
x, y = torch.randn(10, 4), torch.randn(10, 2)
feat = net[0](x)
act = net[1](feat)
base = act.mean(0, keepdim=True)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in range(3):
    pred = net[2](act)
    loss = ((pred - y) ** 2).mean() + 0.1 * base.pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_two_names_of_one_graph_built_before_the_loop_are_one_item_whose_fix_moves_every_line(tmp_path: Path) -> None:
    """Two items were given, one per name: "compute `act` inside the loop, with lines 8 to 9" (computed inside alone,
    ``base`` still walks the freed graph: the loop raises at its second pass) and, for ``base``, "one graph at a time
    (it does not pile up)" though the loop raised. The truth: the three lines moved into the loop run and train the
    first layer; ``act``'s two lines alone still raise."""
    path = tmp_path / "two_names.py"
    watched = f"try:\n  with watch() as w:\n{textwrap.indent(TWO_NAMES_BEFORE, '    ')}\nexcept RuntimeError:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    [item] = runpy.run_path(str(path))["w"].report.items
    assert item.label.startswith("`act` and `base` carry the graph built before the loop"), item.label
    lines = re.match(r"compute `act` and `base` inside the loop, with lines (\d+) to (\d+) that they come", item.fix)
    assert lines is not None, item.fix
    source = TWO_NAMES_BEFORE.split("\n")
    first, last = int(lines.group(1)) - 4, int(lines.group(2)) - 4  # the watched file has 3 lines above the source
    assert source[first].startswith("feat = ") and source[last].startswith("base = "), item.fix
    header = source.index("for epoch in range(3):")

    def inside(start: int, end: int, moved: bool = True) -> str:
        before = [line for n, line in enumerate(source[:header]) if not (moved and start <= n <= end)]
        computed = [f"    {line}" for line in source[start : end + 1]]
        return "\n".join([*before, source[header], *computed, *source[header + 1 :]])

    fixed = _run(inside(first, last), tmp_path / "fixed.py")
    assert fixed["net"][0].weight.grad is not None  # the first layer trains, through the lines moved in
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):  # ``act``'s lines alone
        _run(inside(first, last - 1, moved=False), tmp_path / "alone.py")


# The RNN regressor of MorvanZhou's tutorial with its hidden state in a dict that starts it as None (as ncps#62's CfC
# loop keeps ``state["hx"]``), and no ``.detach()``.
STATE_IN_A_DICT = """
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    rnn, head = nn.RNN(1, 8, batch_first=True), nn.Linear(8, 1)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=0.02)
    return {"rnn": rnn, "head": head, "opt": opt, "h_state": None}


state = build()
rnn, head = state["rnn"], state["head"]
for step in range(3):
    x, y = torch.randn(1, 4, 1), torch.randn(1, 4, 1)
    out, state["h_state"] = rnn(x, state["h_state"])
    loss = ((head(out) - y) ** 2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    # END OF ITERATION
"""


def test_a_state_a_dict_starts_as_none_is_detached_where_it_holds_a_tensor_as_printed(tmp_path: Path) -> None:
    """The fix was "add `state['h_state'] = state['h_state'].detach()` before line 19", which raises "'NoneType' object
    has no attribute 'detach'" in iteration 1: the dict is made with ``"h_state": None``. The truth: detached after
    each pass's step, it runs and trains as the tutorial's own detach."""
    fix = _fix_of(STATE_IN_A_DICT, tmp_path / "state.py")
    assert fix == "state['h_state'] = state['h_state'].detach()", fix
    guarded = '    if state["h_state"] is not None:\n        state["h_state"] = state["h_state"].detach()\n    out, '
    by_hand = STATE_IN_A_DICT.replace("    out, ", guarded, 1)  # detached as each pass begins, once it is a tensor
    _trains_as_by_hand(STATE_IN_A_DICT, by_hand, fix, "rnn", tmp_path)


# Relativistic AdvGAN's train_batch (GiorgosKarantonis/Adversarial-Attacks-with-Relativistic-AdvGAN#8): the G forward
# made once, in D's steps, then n_steps_G steps of G's loss on it, which also trains the target model's weights.
ADVGAN = """
import torch

torch.manual_seed(0)
G = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
D, target = torch.nn.Linear(4, 1), torch.nn.Linear(4, 3)
opt_G = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_D = torch.optim.Adam(D.parameters(), lr=1e-3)
for batch in range(2):
    x = torch.randn(8, 4)
    perturbation = G(x)
    adv_images = (perturbation.clamp(-0.3, 0.3) + x).clamp(0, 1)
    real_scores = D(x)
    opt_D.zero_grad()
    loss_D = (real_scores - 1).pow(2).mean() + D(adv_images.detach()).pow(2).mean()
    loss_D.backward()
    opt_D.step()
    for i in range(2):
        opt_G.zero_grad()
        loss_adv = target(adv_images).softmax(1)[:, 0].sum()
        loss_gan = (D(adv_images) - 1).pow(2).mean()
        loss_G = loss_gan + loss_adv + perturbation.norm()
        loss_G.backward(retain_graph=True)
        opt_G.step()
        # END OF ITERATION
"""


def test_a_forward_the_losss_own_step_left_stale_is_computed_again_as_printed(tmp_path: Path) -> None:
    """The fix was "use `loss_gan.detach()` ...: this loss does not train them", which still raises, and with the G
    loss's GAN term cut would train G less: G's own step, in the G loop, changed the forward made before it. The
    truth: the G forward and what the loop reads of it made again after each G step runs, as the issue's fix does."""
    path = tmp_path / "advgan.py"
    watched = f"try:\n  with watch() as w:\n{textwrap.indent(ADVGAN, '    ')}\nexcept RuntimeError:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    [item] = runpy.run_path(str(path))["w"].report.items
    printed = re.fullmatch(
        r"compute lines (\d+) and (\d+) again after the step at line \d+; remove retain_graph=True at line (\d+)",
        item.fix,
    )
    assert printed is not None, item.fix
    source = ADVGAN.split("\n")
    *again, retain = [source[int(number) - 4].strip() for number in printed.groups()]  # 3 lines above the source
    assert again == [line.strip() for line in source[10:12]], (again, item.fix)
    assert retain == "loss_G.backward(retain_graph=True)", item.fix  # each G step's graph is then walked once
    fixed = ADVGAN.replace("        # END OF ITERATION", "\n".join(f"        {line}" for line in again))
    fixed = fixed.replace("loss_G.backward(retain_graph=True)", "loss_G.backward()")
    by_hand = ADVGAN.replace(
        "        opt_G.zero_grad()", "        opt_G.zero_grad()\n" + "\n".join(f"        {line}" for line in again)
    )
    assert torch.equal(
        _run(fixed, tmp_path / "fixed.py")["G"][0].weight, _run(by_hand, tmp_path / "hand.py")["G"][0].weight
    )
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(ADVGAN.replace("loss_gan + loss_adv", "loss_gan.detach() + loss_adv"), tmp_path / "detached.py")


def test_a_state_a_nested_dict_starts_as_none_is_detached_where_it_holds_a_tensor_as_printed(tmp_path: Path) -> None:
    """The same state one dict further in (``"memory": {"h_state": None}``, read as ``state["memory"]["h_state"]``):
    "before line 19" again, "'NoneType' object has no attribute 'detach'" in iteration 1 as printed."""
    nested = STATE_IN_A_DICT.replace('"h_state": None}', '"memory": {"h_state": None}}').replace(
        'state["h_state"]', 'state["memory"]["h_state"]'
    )
    fix = _fix_of(nested, tmp_path / "state.py")
    assert fix == "state['memory']['h_state'] = state['memory']['h_state'].detach()", fix
    memory = 'state["memory"]["h_state"]'
    guarded = f"    if {memory} is not None:\n        {memory} = {memory}.detach()\n    out, "
    by_hand = nested.replace("    out, ", guarded, 1)  # detached as each pass begins, once it holds a tensor
    _trains_as_by_hand(nested, by_hand, fix, "rnn", tmp_path)


# SAM's two forward-backward passes over a multi-task loss, the second pass's tasks added onto the first pass's
# total (davda54/sam#10); SAM's ``first_step`` is the perturbation it makes between the passes.
SAM_TOTAL = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def step():
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6, 3)).float()
    output = model(x)
    loss = 0
    for t in range(3):
        loss += torch.nn.functional.binary_cross_entropy_with_logits(output[:, t], y[:, t])
    optimizer.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.grad)
{restart}    output = model(x)
    for t in range(3):
        loss += torch.nn.functional.binary_cross_entropy_with_logits(output[:, t], y[:, t])
    loss.backward()
    optimizer.step()


for i in range(3):
    step()
"""


def test_a_total_added_to_again_after_the_first_backward_is_started_again_as_printed(tmp_path: Path) -> None:
    """SAM#10: the second pass's ``loss += loss_t`` onto the first pass's total. The watch said "compute `loss` again
    after line N's step", diagnose "sum the losses ..., or add retain_graph=True to line N only" (the perturbation
    then raises the in-place error). The truth: the total started again at 0 before the second pass's tasks runs, as
    a second name for the second pass's total does; both ways print that."""
    script = SAM_TOTAL.format(restart="")
    path = tmp_path / "sam.py"
    watched = f"try:\n  with watch() as w:\n{textwrap.indent(script, '    ')}\nexcept RuntimeError:\n  pass\n"
    path.write_text(f"from backward_twice.watcher import watch\n{watched}")
    [item] = runpy.run_path(str(path))["w"].report.items
    printed = re.match(
        r"set `loss = 0` before line (\d+), so line \d+'s backward walks only the losses added", item.fix
    )
    assert printed is not None, item.fix
    assert script.split("\n")[int(printed.group(1)) - 4] == "    for t in range(3):", item.fix  # the second pass's
    setup = script.split("for i in range(3):")[0]
    path.write_text(f"from backward_twice import diagnose\n{setup}diagnosis = diagnose(step, models=model)\n")
    [diagnosed] = runpy.run_path(str(path))["diagnosis"].items
    assert re.sub(r"\d+", "N", diagnosed.fix) == re.sub(r"\d+", "N", item.fix), (diagnosed.fix, item.fix)
    fixed = _run(SAM_TOTAL.format(restart="    loss = 0\n"), tmp_path / "fixed.py")
    first, second = SAM_TOTAL.split("{restart}")
    second = second.replace("loss +=", "loss2 +=").replace("    loss.backward()", "    loss2.backward()")
    by_hand = _run(f"{first}    loss2 = 0\n{second}", tmp_path / "hand.py")  # the second pass's total by its own name
    assert all(torch.equal(a, b) for a, b in zip(fixed["model"].parameters(), by_hand["model"].parameters()))


# Recurrent cells at several depths of a ModuleList (one inside a nested block), run by an inner ``for layer in net``.
CELLS_AT_SEVERAL_DEPTHS = """
import torch
from torch import nn


class Cell(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.hidden = torch.zeros(3, n)

    def forward(self, x):
        self.hidden = torch.tanh(self.lin(x) + self.hidden)
        return self.hidden


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(n, n), Cell(n)])

    def forward(self, x):
        for l in self.layers:
            x = l(x)
        return x


torch.manual_seed(0)
net = nn.ModuleList([Cell(6), nn.Linear(6, 6), Block(6), nn.Linear(6, 6), Cell(6)])
head = nn.Linear(6, 1)
xs, ys = torch.randn(4, 3, 6), torch.randn(4, 3, 1)
opt = torch.optim.SGD([*net.parameters(), *head.parameters()], lr=0.05)
for t in range(4):
    h = xs[t]
    for layer in net:
        h = layer(h)
    loss = ((head(h) - ys[t]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    # END OF ITERATION
"""


def test_a_cell_last_run_by_an_inner_loop_is_named_by_its_module_path(tmp_path: Path) -> None:
    """The last cell was named `layer.hidden`, the inner loop's variable, which the next pass rebinds to each layer
    in turn (its fix works only while the cell stays last). The truth: every cell detached at the end of each pass,
    by hand, trains as the printed fixes applied; each fix names the cell by its path in ``net``."""
    path = tmp_path / "cells.py"
    body = "\n".join(f"    {line}" for line in CELLS_AT_SEVERAL_DEPTHS.strip("\n").split("\n"))
    path.write_text(
        f"from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n{body}\nexcept Exception:\n  pass\n"
    )
    fixes = [item.fix for item in runpy.run_path(str(path))["w"].report.items if item.kind == "carried"]
    statements = [s for fix in fixes for s in re.findall(r"`([^`]+ = [^`]+)`", fix)]
    assert not any(s.startswith("layer.") for s in statements), fixes
    assert {s.split(" = ")[0] for s in statements} == {"net[0].hidden", "net[2].layers[1].hidden", "net[4].hidden"}
    by_hand = CELLS_AT_SEVERAL_DEPTHS.replace(
        "    # END OF ITERATION",
        "    for m in net.modules():\n        if isinstance(m, Cell):\n            m.hidden = m.hidden.detach()",
    )
    expected = _run(by_hand, tmp_path / "by_hand.py")["net"].state_dict()
    printed = CELLS_AT_SEVERAL_DEPTHS.replace("    # END OF ITERATION", "".join(f"    {s}\n" for s in statements))
    fixed = _run(printed, tmp_path / "fixed.py")["net"].state_dict()
    assert all(torch.equal(fixed[key], value) for key, value in expected.items())


# Influence functions' LiSSA recursion (nimarb/pytorch_influence_functions, s_test; its issues #5 and #6): ``v``, a
# list of gradients taken with create_graph before the loop, and ``h_estimate`` built from it and from each pass's
# Hessian-vector product.
LISSA = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
params = list(model.parameters())
v = list(torch.autograd.grad(model(torch.randn(1, 6)).pow(2).sum(), params, create_graph=True))
# BEFORE THE LOOP
h_estimate = v.copy()
for _ in range(4):
    loss = model(torch.randn(4, 6)).pow(2).mean()
    first = torch.autograd.grad(loss, params, create_graph=True)
    hv = torch.autograd.grad(sum((g * h).sum() for g, h in zip(first, h_estimate)), params, create_graph=True)
    h_estimate = [a + 0.99 * b - c / 25 for a, b, c in zip(v, h_estimate, hv)]
    # END OF ITERATION
"""


def test_a_list_built_before_the_loop_and_walked_without_error_gets_its_detach_and_no_word_of_freeing(
    tmp_path: Path,
) -> None:
    """``v``'s item read "(the first backward freed the graph of the items built before the loop)" and "memory and
    time grow with each iteration", where nothing was freed (every call has create_graph) and ``v``'s one graph does
    not pile up; its one fix, "fill `v` inside the loop", keeps ``v``'s gradient in every product. The truth: with
    ``h_estimate`` detached each pass and ``v`` detached before the loop as printed, the estimate is the one of the
    hand fix that detaches both as each pass begins."""
    path = tmp_path / "lissa.py"
    body = "\n".join(f"    {line}" for line in LISSA.strip("\n").split("\n"))
    path.write_text(f"from backward_twice.watcher import watch\nwith watch() as w:\n{body}\n")
    items = {item.label.split("`")[1]: item for item in runpy.run_path(str(path))["w"].report.items}
    assert set(items) == {"h_estimate", "v"}, list(items)
    v = items["v"]
    assert "freed" not in v.why + v.fix and "grow" not in v.why, v
    detach_v = re.search(r"`(v = \[m\.detach\(\) for m in v\])` before it", v.fix)
    detach_h = re.fullmatch(r"add `(.+)` (?:at the end of each iteration|before line \d+)", items["h_estimate"].fix)
    assert detach_v is not None and detach_h is not None, (v.fix, items["h_estimate"].fix)
    printed = LISSA.replace("# BEFORE THE LOOP", detach_v.group(1)).replace(
        "    # END OF ITERATION", f"    {detach_h.group(1)}"
    )
    by_hand = LISSA.replace(
        "    loss = model",
        "    v = [t.detach() for t in v]\n    h_estimate = [t.detach() for t in h_estimate]\n    loss = model",
    )
    fixed, expected = _run(printed, tmp_path / "fixed.py"), _run(by_hand, tmp_path / "by_hand.py")
    assert all(torch.allclose(a, b) for a, b in zip(fixed["h_estimate"], expected["h_estimate"]))
    as_written = _run(LISSA, tmp_path / "as_written.py")["h_estimate"]
    assert not all(torch.allclose(a, b) for a, b in zip(as_written, expected["h_estimate"]))  # v's gradient counted


# A step whose second loss, written after the optimizer step, reads a feature made from the model's output before it.
LOSS_AFTER_THE_STEP = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
for x, y in data:
    opt.zero_grad()
    out = model(x)
    feats = out.tanh()
    F.mse_loss(feats, y).backward(retain_graph=True)
    opt.step()
    # RECOMPUTED
    loss_smooth = feats.pow(2).mean()
    loss_smooth.backward()
    opt.step()
"""


def test_a_loss_written_after_the_step_gets_every_line_it_reads_through_computed_again(tmp_path: Path) -> None:
    """The fix read "compute line 12 again after the step at line 15" (``out = model(x)``): applied, the loss still
    read ``feats`` of the old ``out`` and raised the same error, and the tool then named the same line. The truth:
    ``out`` and ``feats`` computed again after the step, the second backward runs."""
    *named, _ = _computed_again_as_printed(LOSS_AFTER_THE_STEP, tmp_path)
    assert named == ["out = model(x)", "feats = out.tanh()"], named
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(LOSS_AFTER_THE_STEP, tmp_path / "as_written.py")
    fixed = _recomputed(LOSS_AFTER_THE_STEP, named)
    assert _run(fixed, tmp_path / "fixed.py")["loss_smooth"].grad_fn is not None


TWO_MODULES_AFTER_THE_STEP = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
enc = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.{activation}, torch.nn.Linear(8, 8))
dec = torch.nn.Linear(8, 2)
opt = torch.optim.SGD([*enc.parameters(), *dec.parameters()], lr=0.1)
data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
for x, y in data:
    opt.zero_grad()
    h = enc(x)
    out = dec(h)
    F.mse_loss(out, y).backward(retain_graph=True)
    opt.step()
    # RECOMPUTED
    loss_reg = 0.1 * out.pow(2).mean()
    loss_reg.backward()
    opt.step()
"""


@pytest.mark.parametrize("activation", ["Tanh()", "ReLU()"])
def test_a_stale_forward_through_two_modules_is_computed_again_from_the_first(tmp_path: Path, activation: str) -> None:
    """The fix read "compute line 14 again" (``out = dec(h)``, whose saved weights the backward met first): applied,
    the backward still went through ``h = enc(x)`` of the old weights, raising again (Tanh saves its output) or,
    with ReLU, giving ``enc`` the gradient of the old forward. The truth: ``h`` and ``out`` computed again after the
    step trains as the hand fix."""
    source = TWO_MODULES_AFTER_THE_STEP.replace("{activation}", activation)
    *named, _ = _computed_again_as_printed(source, tmp_path)
    assert named == ["h = enc(x)", "out = dec(h)"], named
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(source, tmp_path / "as_written.py")
    printed = _run(_recomputed(source, named), tmp_path / "p.py")
    assert printed["loss_reg"].grad_fn is not None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in printed["enc"].parameters())


def _recomputed(source: str, lines: list[str]) -> str:
    """``source`` with ``lines`` computed again where it marks ``# RECOMPUTED``, and its one retain removed."""
    recomputed = source.replace("    # RECOMPUTED", "\n".join(f"    {code}" for code in lines))
    return recomputed.replace("backward(retain_graph=True)", "backward()")


def _computed_again_as_printed(source: str, tmp_path: Path) -> list[str]:
    """The lines of ``source`` that the watched loop's one item says to compute again after the step, and the step's
    line last; the item also says to remove the one retain, which only the stale forward's reuse needed (the
    fixed sources run without it: :func:`_recomputed`)."""
    path = tmp_path / "watched.py"
    body = "\n".join(f"    {line}" for line in source.strip("\n").split("\n"))
    path.write_text(
        f"from backward_twice.watcher import watch\ntry:\n  with watch() as w:\n{body}\nexcept RuntimeError:\n  pass\n"
    )
    [item] = runpy.run_path(str(path))["w"].report.items
    again = re.fullmatch(
        r"compute lines ([\d, ]+) and (\d+) again after (?:the step at )?line (\d+)"
        r"; remove retain_graph=True at line (\d+)",
        item.fix,
    )
    assert again is not None, item.fix
    lines = source.strip("\n").split("\n")
    assert "retain_graph=True" in lines[int(again.group(4)) - 4], item.fix  # the band-aid the reuse needed
    numbers = [*again.group(1).split(", "), again.group(2), again.group(3)]
    assert lines[int(again.group(3)) - 3].strip() == "# RECOMPUTED", item.fix  # where they go: after the update ends
    return [lines[int(n) - 4].strip() for n in numbers]  # 3 lines above the source in the watched file: the lines
    # to compute again, then the line they go after


UPDATED_BY_HAND_BETWEEN = """
import torch

torch.manual_seed(0)
w1 = (0.5 * torch.randn(3, 6)).requires_grad_()
w2 = (0.5 * torch.randn(6, 2)).requires_grad_()
for it in range(4):
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    h = torch.tanh(x @ w1)
    out = h @ w2
    loss1 = ((out - y) ** 2).mean()
    loss2 = out.abs().mean()
    loss1.backward(retain_graph=True)
    with torch.no_grad():
        for p in (w1, w2):
            p -= 0.1 * p.grad
            p.grad.zero_()
    # RECOMPUTED
    loss2.backward()
    with torch.no_grad():
        for p in (w1, w2):
            p -= 0.1 * p.grad
            p.grad.zero_()
"""


def test_a_hand_written_update_between_two_backward_calls_is_the_step_whose_forward_is_computed_again(
    tmp_path: Path,
) -> None:
    """``p -= lr * p.grad`` under no_grad between the two backward calls: "a tensor the graph saved was changed in
    place (x += ..., relu_(), optimizer.step()) ...: use the out-of-place form", which, applied to the update
    (``p = p - lr * p.grad``), leaves the weights untrained. The truth (no helpers): the forward computed again
    after the update's ``with`` block runs (inside it, the forward has no graph), and trains as the same loop with
    ``torch.optim.SGD``."""
    *named, update = _computed_again_as_printed(UPDATED_BY_HAND_BETWEEN, tmp_path)
    assert named == ["h = torch.tanh(x @ w1)", "out = h @ w2", "loss2 = out.abs().mean()"], named
    assert update == "p.grad.zero_()", update  # the end of the ``with torch.no_grad():`` that updates
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(UPDATED_BY_HAND_BETWEEN, tmp_path / "as_written.py")
    recomputed = _recomputed(UPDATED_BY_HAND_BETWEEN, named)
    fixed = _run(recomputed, tmp_path / "f.py")
    update = "    with torch.no_grad():\n        for p in (w1, w2):\n            p -= 0.1 * p.grad\n"
    by_optimizer = (
        recomputed.replace("for it in", "opt = torch.optim.SGD([w1, w2], lr=0.1)\nfor it in")
        .replace(update, "    opt.step()\n")
        .replace("            p.grad.zero_()", "    opt.zero_grad(set_to_none=False)")
    )
    assert "p -= " not in by_optimizer
    with_sgd = _run(by_optimizer, tmp_path / "sgd.py")
    assert torch.allclose(fixed["w1"], with_sgd["w1"]) and torch.allclose(fixed["w2"], with_sgd["w2"])


TOTAL_READ_AS_A_TENSOR = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
total_loss = 0.0
logged = []
for step in range(5):
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    loss = ((model(x) - y) ** 2).mean()
    total_loss += loss
    opt.zero_grad()
    total_loss.backward()
    opt.step()
    READ
"""

TOTAL_READS = {  # how the loop reads the total, and whether a float there would break the learner's own code
    "item": ("logged.append(total_loss.item())", True),
    "stacked": ("logged.append(total_loss)\ncurve = torch.stack(logged)", True),
    "isnan": ("if total_loss.isnan():\n        break", True),
    "f-string": ('logged.append(f"{total_loss:.3f}")', False),
    "print": ("print(step, total_loss)", False),
}


@pytest.mark.parametrize("read", TOTAL_READS)
def test_a_total_the_loop_reads_as_a_tensor_is_kept_one_without_its_graph(read: str, tmp_path: Path) -> None:
    """``total_loss += loss; total_loss.backward()``, the total then read by the loop: the fix "add a number instead
    (`total_loss += loss.item()`) and call backward() on this iteration's loss", applied, made the learner's own
    ``total_loss.item()``, ``.isnan()`` or ``torch.stack(logged)`` raise on a float. The truth (no helpers): the
    printed fix runs; a number is offered only where a float serves (an f-string, print)."""
    code, needs_a_tensor = TOTAL_READS[read]
    source = TOTAL_READ_AS_A_TENSOR.replace("READ", code.replace("\n", "\n    "))
    with pytest.raises(RuntimeError, match="second time"):
        _run(source, tmp_path / "as_written.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    kept = "a copy without its graph" if needs_a_tensor else "a number"
    printed = re.fullmatch(rf"add {kept} instead \(`(.+)`\) and call backward\(\) on this iteration's loss", item.fix)
    assert printed is not None, item.fix
    fixed = source.replace("total_loss += loss", printed.group(1)).replace("total_loss.backward()", "loss.backward()")
    ran = _run(fixed, tmp_path / "fixed.py")
    assert ran["step"] == 4 and not getattr(ran["total_loss"], "requires_grad", False)
    if needs_a_tensor:
        with pytest.raises((AttributeError, TypeError), match="float"):
            _run(fixed.replace(".detach()", ".item()"), tmp_path / "number.py")


LOSSES_LOGGED = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
lines = []
for step in range(4):
    x = torch.randn(6, 3)
    loss = (model(x) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
    READ
"""

LIST_READS = {  # how the loop reads its list of losses, and whether a float there would break the learner's code
    "an item in an f-string": ('lines.append(f"{losses[-1]:.4f}")', False),
    "summed in an f-string": ('lines.append(f"{sum(losses) / len(losses):.4f}")', False),
    "an item's method": ("lines.append(losses[-1].item())", True),
    "stacked": ("lines.append(torch.stack(losses).mean().item())", True),
}


@pytest.mark.parametrize("read", LIST_READS)
def test_a_list_of_losses_read_as_numbers_keeps_numbers(read: str, tmp_path: Path) -> None:
    """A list of losses read only as numbers (its last item, or its sum, in an f-string) was told to keep detached
    tensors: ``losses[-1]`` and ``sum(losses)`` counted as reads that need a tensor. The truth (no helpers): with
    ``loss.item()`` appended the loop prints the same lines and holds no graph; where the loop calls an item's
    method or stacks the list, a float raises, and the detached tensor is offered."""
    code, needs_a_tensor = LIST_READS[read]
    source = LOSSES_LOGGED.replace("READ", code)
    as_written = _run(source, tmp_path / "as_written.py")
    assert all(loss.requires_grad for loss in as_written["losses"])
    [item] = _items_watched(source, tmp_path / "watched.py")
    printed = re.match(r"`(losses\.append\(loss\.(item|detach)\(\)\))`", item.fix)
    assert printed is not None and (printed.group(2) == "detach") == needs_a_tensor, item.fix
    fixed = _run(source.replace("losses.append(loss)", printed.group(1)), tmp_path / "fixed.py")
    assert not any(getattr(loss, "requires_grad", False) for loss in fixed["losses"])
    assert [str(line) for line in fixed["lines"]] == [str(line) for line in as_written["lines"]] or needs_a_tensor
    if needs_a_tensor:
        with pytest.raises((AttributeError, TypeError)):
            _run(source.replace("losses.append(loss)", "losses.append(loss.item())"), tmp_path / "number.py")


LISTS_KEPT = """
import torch
torch.manual_seed(0)
cell = torch.nn.GRUCell(3, 4)
opt = torch.optim.SGD(cell.parameters(), lr=0.05)
history = []
for step in range(4):
    x = torch.randn(2, 3)
    h = cell(x)
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    record = [x, h, step]
    history.append(record)
"""


def test_a_list_of_lists_of_tensors_kept_is_told_to_detach_each_tensor(tmp_path: Path) -> None:
    """A replay memory of transitions, each a list (``storage.append(S)``, S = [word, states, encoded]; rentruewang/
    brief#1): the note's advice was "`states_list.append(S.detach())`", an AttributeError on a list. The truth (no
    helpers): the printed advice, applied, runs and leaves no graph in the list; ``.detach()`` on the item raises."""
    with pytest.raises(AttributeError, match="detach"):
        _run(LISTS_KEPT.replace("history.append(record)", "history.append(record.detach())"), tmp_path / "d.py")
    [item] = _items_watched(LISTS_KEPT, tmp_path / "watched.py")
    printed = re.fullmatch(r"`(history\.append\(.+\))`", item.fix)
    assert printed is not None and "tree_map" in item.fix, item.fix
    fixed = _run(LISTS_KEPT.replace("history.append(record)", printed.group(1)), tmp_path / "fixed.py")
    kept = [value for record in fixed["history"] for value in record if isinstance(value, torch.Tensor)]
    assert len(kept) == 8 and not any(value.requires_grad for value in kept)


PRIOR_BUILT_ONCE = """
import torch
import torch.distributions as dd
torch.manual_seed(0)
log_std = torch.nn.Parameter(torch.tensor([1.0]))
std = torch.exp(log_std)
mean = torch.nn.Parameter(torch.tensor([1.0]))
dist = dd.Normal(loc=mean, scale=std)
optim = torch.optim.SGD([log_std, mean], lr=0.01)
target = dd.Normal(5.0, 5.0)
for i in range(4):
    samples = dist.rsample((64,))
    cost = -(target.log_prob(samples) - dist.log_prob(samples)).sum()
    optim.zero_grad()
    cost.backward()
    optim.step()
"""

LOADER_BUILT_FROM_FEATURES = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
conv = torch.nn.Conv1d(1, 2, 1)
feats = conv(torch.randn(16, 1, 8))
loader = DataLoader(TensorDataset(feats, torch.randn(16, 1)), batch_size=4, shuffle=True)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
steps = 0
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
"""


def test_a_distribution_built_once_from_a_graph_is_computed_in_the_loop_with_it(tmp_path: Path) -> None:
    """A distribution built before the loop from ``std = torch.exp(log_std)`` (discuss.pytorch.org 50139): "compute
    `std` inside the loop (or `std = std.detach()`...)"; done, ``dist`` still held the first ``std`` and the loop
    raised the same error. The truth (no helpers): ``std`` and ``dist`` both computed in the loop run, and train
    ``log_std``; ``std`` alone, computed or detached at the top of the loop, raises as before."""
    lines = PRIOR_BUILT_ONCE.strip("\n").split("\n")
    for alone in ("std = torch.exp(log_std)", "std = std.detach()"):
        with pytest.raises(RuntimeError, match="second time"):
            _run(PRIOR_BUILT_ONCE.replace("    samples =", f"    {alone}\n    samples ="), tmp_path / "alone.py")
    [item] = _items_watched(PRIOR_BUILT_ONCE, tmp_path / "watched.py")
    printed = re.match(r"compute `std` and `dist` inside the loop \(move lines (\d+) and (\d+) into it\)", item.fix)
    assert printed is not None, item.fix
    moved = [lines[int(number) - 3 - 1] for number in printed.groups()]
    assert moved == ["std = torch.exp(log_std)", "dist = dd.Normal(loc=mean, scale=std)"], moved
    fixed = "\n".join(line for line in lines if line not in moved).replace(
        "    samples =", "".join(f"    {line}\n" for line in moved) + "    samples ="
    )
    ran = _run(fixed, tmp_path / "fixed.py")
    assert ran["i"] == 3 and not torch.equal(ran["log_std"].detach(), torch.tensor([1.0]))


def test_features_a_data_loader_is_built_from_once_are_detached_where_they_are_built(tmp_path: Path) -> None:
    """``TensorDataset(conv(raw), y)`` in a DataLoader (denoising-diffusion-pytorch#109's cause): "compute `feats`
    inside the loop (or `feats = feats.detach()`...)", though the loop takes its batches from the loader, which
    keeps the first ``feats``: neither changes what it reads. The truth (no helpers): detached where it is built, the
    loop runs all its batches; detached at the top of the loop, it raises as before."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(
            LOADER_BUILT_FROM_FEATURES.replace("    loss =", "    feats = feats.detach()\n    loss ="),
            tmp_path / "a.py",
        )
    [item] = _items_watched(LOADER_BUILT_FROM_FEATURES, tmp_path / "watched.py")
    printed = re.match(r"add `(feats = feats\.detach\(\))` after line (\d+):", item.fix)
    assert printed is not None, item.fix
    lines = LOADER_BUILT_FROM_FEATURES.strip("\n").split("\n")
    after = int(printed.group(2)) - 3
    assert lines[after - 1] == "feats = conv(torch.randn(16, 1, 8))", lines[after - 1]
    fixed = "\n".join([*lines[:after], printed.group(1), *lines[after:]])
    assert _run(fixed, tmp_path / "fixed.py")["steps"] == 4


REPLAY_OF_TUPLES = """
import torch
torch.manual_seed(0)
policy = torch.nn.Linear(4, 3)
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
memory = []
s = torch.randn(4)
for t in range(6):
    dist = torch.distributions.Categorical(logits=policy(s))
    a = dist.sample()
    logp = dist.log_prob(a)
    r = float(a == 1)
    s2 = torch.randn(4)
    memory.append((s, a, logp, r, s2))
    opt.zero_grad()
    (-logp * (r + 0.1)).backward()
    opt.step()
    s = s2
"""


def test_a_list_of_tuples_kept_is_one_note_with_the_places_that_hold_graphs_detached(tmp_path: Path) -> None:
    """A replay memory of transitions appended as a tuple (``memory.append((s, a, logp, r, s2))``): 8 notes, one per
    item (``memory[0][2]``, ...), each "growing", with advice no line could take. The truth (no helpers): only
    ``logp`` holds a graph; with it detached at the append the loop trains the same and the memory holds none."""
    as_written = _run(REPLAY_OF_TUPLES, tmp_path / "as_written.py")
    assert [isinstance(x, torch.Tensor) and x.grad_fn is not None for x in as_written["memory"][0]] == [
        False,
        False,
        True,
        False,
        False,
    ]
    [item] = _items_watched(REPLAY_OF_TUPLES, tmp_path / "watched.py")
    assert item.fix == "`memory.append((s, a, logp.detach(), r, s2))`", item.fix
    fixed = _run(REPLAY_OF_TUPLES.replace("memory.append((s, a, logp, r, s2))", item.fix.strip("`")), tmp_path / "f.py")
    assert not any(getattr(x, "requires_grad", False) for record in fixed["memory"] for x in record)
    assert torch.equal(fixed["policy"].weight, as_written["policy"].weight)


SWITCHED_OFF = """
import torch
torch.manual_seed(0)
encoder, critic = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
opt_e = torch.optim.SGD(encoder.parameters(), lr=0.1)
opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)

def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag

for step in range(3):
    x = torch.randn(5, 4)
    requires_grad(encoder, False)
    code = encoder(x)
    c_loss = critic(code.detach()).pow(2).mean()
    opt_c.zero_grad()
    c_loss.backward()
    opt_c.step()
    requires_grad(encoder, True)
    requires_grad(critic, False)
    e_loss = (code - 1).pow(2).mean()
    opt_e.zero_grad()
    e_loss.backward()
    opt_e.step()
    requires_grad(critic, True)
"""


def test_weights_switched_off_before_the_forward_a_loss_comes_from_are_named(tmp_path: Path) -> None:
    """A GAN's toggles (rosinality/swapping-autoencoder#12's ``requires_grad(encoder, False)``) before the forward
    that a later loss reuses after switching them back on: "compute the loss outside torch.no_grad()", where the
    code has none. The truth (no helpers): as written the encoder's backward raises that the loss does not require
    grad; without the toggle before the forward it trains."""
    with pytest.raises(RuntimeError, match="does not require grad"):
        _run(SWITCHED_OFF, tmp_path / "as_written.py")
    [item] = _items_watched(SWITCHED_OFF, tmp_path / "watched.py")
    source = SWITCHED_OFF.strip("\n").split("\n")
    off = 3 + source.index("    requires_grad(encoder, False)") + 1
    on = 3 + source.index("    requires_grad(encoder, True)") + 1
    assert item.label == f"the loss has no graph: line {off} switches off the gradients of `encoder`", item.label
    assert item.fix == (
        f"compute this loss's forward through `encoder` after line {on} switches their gradients back on, or do not "
        f"switch them off before it (line {off})"
    ), item.fix
    fixed = _run(SWITCHED_OFF.replace("    requires_grad(encoder, False)\n", ""), tmp_path / "fixed.py")
    assert fixed["step"] == 2


def test_weights_switched_off_and_never_on_again_are_named_without_a_crash(tmp_path: Path) -> None:
    """The same toggles with the encoder never switched on again: the report's own code raised an IndexError
    ("could not judge this run"; ``bt.diagnose`` raised it into the learner's code). The truth (no helpers): as
    written it raises that the loss does not require grad; switched on before the forward, it trains."""
    source = SWITCHED_OFF.replace("    requires_grad(encoder, True)\n", "")
    with pytest.raises(RuntimeError, match="does not require grad"):
        _run(source, tmp_path / "as_written.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    assert item.fix == "switch the gradients of `encoder` back on before the forward this loss is computed from"
    fixed = source.replace("    code = encoder(x)", "    requires_grad(encoder, True)\n    code = encoder(x)")
    assert _run(fixed, tmp_path / "fixed.py")["step"] == 2


STEP_LOSSES_WALKED = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step_losses = []
for i in range(4):
    opt.zero_grad()
    loss = model(torch.randn(4, 4)).pow(2).mean()
    step_losses.append(loss)
    step_losses[-1].backward()
    opt.step()
"""


def test_a_list_whose_last_item_the_loop_calls_backward_on_keeps_a_detached_copy_after_the_backward(
    tmp_path: Path,
) -> None:
    """``step_losses.append(loss); step_losses[-1].backward()``: the note's advice was
    ``step_losses.append(loss.detach())``, after which the backward raised that the loss needs no grad. The truth
    (no helpers): the backward on ``loss`` and a detached copy kept train as written, and hold no graph."""
    as_written = _run(STEP_LOSSES_WALKED, tmp_path / "as_written.py")
    [item] = _items_watched(STEP_LOSSES_WALKED, tmp_path / "watched.py")
    assert item.fix == (
        "call `loss.backward()` in place of `step_losses[-1].backward()`, and `step_losses.append(loss.detach())`"
    ), item.fix
    fixed = STEP_LOSSES_WALKED.replace("step_losses[-1].backward()", "loss.backward()").replace(
        "step_losses.append(loss)", "step_losses.append(loss.detach())"
    )
    ran = _run(fixed, tmp_path / "fixed.py")
    assert torch.equal(ran["model"].weight, as_written["model"].weight)
    assert not any(loss.requires_grad for loss in ran["step_losses"])


AUTOGRAD_LEFT_OFF = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(5, 4)
    if step == 1:
        torch.set_grad_enabled(False)
        score = model(x).mean().item()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_autograd_turned_off_by_a_call_and_left_off_is_named_at_that_call(tmp_path: Path) -> None:
    """``torch.set_grad_enabled(False)`` called (not a ``with``) for an evaluation inside the loop, never turned on
    again: "compute the loss outside torch.no_grad()", where the code has none. The truth (no helpers): the backward
    of iteration 2 raises; with autograd turned on before the loss, the loop runs."""
    with torch.enable_grad(), pytest.raises(RuntimeError, match="does not require grad"):  # it leaves autograd off:
        _run(AUTOGRAD_LEFT_OFF, tmp_path / "as_written.py")  # the block puts it back on for the tests after this one
    with torch.enable_grad():
        [item] = _items_watched(AUTOGRAD_LEFT_OFF, tmp_path / "watched.py")
    assert torch.is_grad_enabled()
    off = 3 + AUTOGRAD_LEFT_OFF.strip("\n").split("\n").index("        torch.set_grad_enabled(False)") + 1
    assert item.label == f"the loss has no graph: line {off} turns autograd off", item.label
    assert item.fix == "call `torch.set_grad_enabled(True)` before the forward this loss is computed from", item.fix
    fixed = AUTOGRAD_LEFT_OFF.replace("    loss =", "    torch.set_grad_enabled(True)\n    loss =")
    with torch.enable_grad():
        assert _run(fixed, tmp_path / "fixed.py")["step"] == 2


TRAINER_TOTALS = """
import torch
class Trainer:
    def __init__(self):
        self.net = torch.nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.totals = {"loss": 0.0}
        self.best = torch.tensor(float("inf"))
    def epoch(self, batches):
        self.total = torch.zeros(())
        for x in batches:
            loss = (self.net(x) - 1).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.totals["loss"] = self.totals["loss"] + loss
            self.total = self.total + loss
        self.best = min(self.best, self.total)
torch.manual_seed(0)
trainer = Trainer()
batches = [torch.randn(4, 3) for _ in range(3)]
for _ in range(3):
    trainer.epoch(batches)
"""


def _losses_under(tensor: torch.Tensor) -> int:
    """How many steps' losses the graph under ``tensor`` holds (each step's loss ends in one ``MeanBackward0``)."""
    seen, layer = set(), [tensor.grad_fn]
    while layer:
        fresh = [node for node in layer if node is not None and node not in seen]
        seen.update(fresh)
        layer = [child for node in fresh for child, _ in node.next_functions]
    return sum(type(node).__name__ == "MeanBackward0" for node in seen)


def test_a_dicts_total_and_a_best_taken_by_min_are_noted_at_their_own_lines(tmp_path: Path) -> None:
    """``self.totals["loss"] = self.totals["loss"] + loss`` was noted at the loss's line as ``self.totals['loss']``
    (no line spelled its key with those quotes), and ``self.best = min(self.best, self.total)`` at the loss's line,
    "one more iteration's graph every iteration". The truth (no helpers): the dict's total holds all 9 steps' graphs,
    ``self.best`` one epoch's 3 (it takes the total's, and grows no further)."""
    trainer = _run(TRAINER_TOTALS, tmp_path / "as_written.py")["trainer"]
    assert _losses_under(trainer.totals["loss"]) == 9 and _losses_under(trainer.best) == 3
    items = {item.label.split("`")[1]: item for item in _items_watched(TRAINER_TOTALS, tmp_path / "watched.py")}
    totals, best = items['self.totals["loss"]'], items["self.best"]
    assert totals.lines[0].code == 'self.totals["loss"] = self.totals["loss"] + loss', totals
    assert totals.lines[0].span is not None and "every iteration" in totals.label
    assert best.lines[0].code == "self.best = min(self.best, self.total)", best
    assert best.label == "`self.best` keeps earlier iterations' graphs alive", best


def test_a_stale_forward_written_over_two_lines_is_computed_again_from_its_statements_first(tmp_path: Path) -> None:
    """Dreamer's ``imaginated_values = \\`` / ``value_model(...)`` before the value step, the actor's loss written
    after it from ``lambda_value_target`` (cross32768/Dreamer_PyTorch#2): "compute line 421 again" named the second
    line of the statement, and, applied, the loss still read the old target and raised the same error. The truth
    (no helpers): both statements computed again after the step run."""
    source = LOSS_AFTER_THE_STEP.replace("    out = model(x)", "    out = \\\n        model(x)")
    *named, _ = _computed_again_as_printed(source, tmp_path)
    assert named == ["out = \\", "feats = out.tanh()"], named
    statements = ["out = model(x)", "feats = out.tanh()"]
    fixed = _run(_recomputed(source, statements), tmp_path / "f.py")
    assert fixed["loss_smooth"].grad_fn is not None


UPDATED_BY_A_HELPER = """
import torch


def sgd(params, lr=0.1):
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad = None


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(3, 6), torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))

    @torch.no_grad()
    def update(self, lr):
        for p in self.parameters():
            p.sub_(lr * p.grad)
            p.grad = None


torch.manual_seed(0)
model = Net()
params = list(model.parameters())
for it in range(3):
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    h = torch.tanh(model.l1(x))
    out = model.l2(h)
    ((out - y) ** 2).mean().backward(retain_graph=True)
    UPDATE
    # RECOMPUTED
    loss2 = out.abs().mean()
    loss2.backward()
    UPDATE
"""


@pytest.mark.parametrize("update", ["sgd(model.parameters())", "model.update(0.1)", "sgd(params)"])
def test_an_update_a_function_of_the_learners_makes_is_the_step_whose_forward_is_computed_again(
    update: str, tmp_path: Path
) -> None:
    """The update under no_grad written in a helper (``sgd(params)``) or a module's method (``model.update(lr)``):
    the generic "use the out-of-place form" (applied to the update: the weights never train), or, over a list of the
    weights, "compute line N again" for ``out`` alone, ``h`` left on the old ``l1``. The truth (no helpers): ``h``
    and ``out`` computed again after the update run and train as the same loop does with ``torch.optim.SGD``."""
    source = UPDATED_BY_A_HELPER.replace("UPDATE", update)
    *named, step = _computed_again_as_printed(source, tmp_path)
    assert named == ["h = torch.tanh(model.l1(x))", "out = model.l2(h)"], named
    assert step == update, step
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(source, tmp_path / "as_written.py")
    recomputed = _recomputed(source, named)
    fixed = _run(recomputed, tmp_path / "fixed.py")
    by_optimizer = recomputed.replace(
        "params = list", "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nparams = list"
    )
    with_sgd = _run(by_optimizer.replace(f"    {update}\n", "    opt.step()\n    opt.zero_grad()\n"), tmp_path / "s.py")
    assert all(torch.allclose(a, b) for a, b in zip(fixed["model"].parameters(), with_sgd["model"].parameters()))


UPDATED_WITH_MOMENTUM_BY_HAND = """
import torch

torch.manual_seed(0)
l1, l2 = torch.nn.Linear(3, 6), torch.nn.Linear(6, 2)
params = [*l1.parameters(), *l2.parameters()]
buffers = [torch.zeros_like(p) for p in params]
for it in range(3):
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    h = torch.tanh(l1(x))
    out = l2(h)
    ((out - y) ** 2).mean().backward(retain_graph=True)
    with torch.no_grad():
        UPDATE
    # RECOMPUTED
    loss2 = out.abs().mean()
    loss2.backward()
    for p in params:
        p.grad = None
"""

UPDATES_BY_HAND = {
    "momentum": "for p, buf in zip(params, buffers):\n"
    "            buf.mul_(0.9).add_(p.grad)\n"
    "            p -= 0.1 * buf",
    "foreach": "torch._foreach_add_(params, [p.grad for p in params], alpha=-0.1)",
}


@pytest.mark.parametrize("update", UPDATES_BY_HAND)
def test_an_update_by_hand_over_zipped_buffers_or_foreach_is_the_step(update: str, tmp_path: Path) -> None:
    """A momentum kept by hand (``for p, buf in zip(params, buffers)``) named ``out`` alone, ``h`` left on the old
    ``l1``; ``torch._foreach_add_`` was not seen as an update at all (the generic in-place fix). The truth (no
    helpers): ``h`` and ``out`` computed again after the update run."""
    source = UPDATED_WITH_MOMENTUM_BY_HAND.replace("UPDATE", UPDATES_BY_HAND[update])
    *named, _ = _computed_again_as_printed(source, tmp_path)
    assert named == ["h = torch.tanh(l1(x))", "out = l2(h)"], named
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(source, tmp_path / "as_written.py")
    recomputed = _recomputed(source, named)
    assert _run(recomputed, tmp_path / "fixed.py")["loss2"].grad_fn is not None


DRAWN_BY_A_GENERATOR = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
frozen = False
if frozen:
    with torch.no_grad():
        data = torch.nn.Conv1d(1, 4, 1)(torch.randn(32, 1, 16)).mean(-1)
else:
    data = torch.nn.Conv1d(1, 4, 1)(torch.randn(32, 1, 16)).mean(-1)  # made once, outside the loop, with its graph
if frozen:
    data = data.detach()


def cycle():
    while True:
        perm = torch.randperm(data.shape[0])
        for i in range(0, data.shape[0], 8):
            yield data[perm[i : i + 8]]


batches = cycle()
for step in range(3):
    batch = next(batches)
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    # END OF ITERATION
"""


def test_a_global_a_generator_draws_from_is_detached_where_the_loop_can_assign_it(tmp_path: Path) -> None:
    """lucidrains/denoising-diffusion-pytorch#109: a conv applied to the data before the loop, a generator
    ``cycle()`` yielding batches of the global ``data`` (a ``data = data.detach()`` that never ran beside it): "add
    `data = data.detach()` before line 20", the generator's ``while True:``, where the assignment makes ``data`` its
    local (UnboundLocalError as printed). The truth (no helpers): detached in the loop, it runs."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(DRAWN_BY_A_GENERATOR, tmp_path / "as_written.py")
    fix = _carried_fix(DRAWN_BY_A_GENERATOR, tmp_path / "drawn.py")
    assert "before line" not in fix and "data = data.detach()" in fix, fix
    fixed = DRAWN_BY_A_GENERATOR.replace("    # END OF ITERATION", "    data = data.detach()")
    assert _run(fixed, tmp_path / "fixed.py")["step"] == 2


ENCODED_ONCE_ON_A_DATASET = """
import torch


class Dataset:
    def __init__(self, inputs, labels, encoder):
        self.inputs, self.labels, self.encoder = inputs, labels, encoder

    def materialize(self):
        self.features = self.encoder(self.inputs)  # encoded once, with its graph
        return self


def loader(ds, batch_size):
    for i in range(0, len(ds.labels), batch_size):
        yield ds.features[i : i + batch_size], ds.labels[i : i + batch_size]


torch.manual_seed(0)
dataset = Dataset(torch.randn(48, 6), torch.randint(0, 2, (48,)), torch.nn.Linear(6, 8)).materialize()
model = torch.nn.Linear(8, 2)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step, (x, y) in enumerate(loader(dataset, 16)):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_an_attribute_of_an_object_the_loop_draws_from_is_detached_after_it_is_built(tmp_path: Path) -> None:
    """pyg-team/pytorch-frame#229: texts encoded once onto the dataset, the loop drawing batches from
    ``loader(dataset, 16)``: "build `dataset` inside the loop", which the loop never reads (its ``for`` holds the
    old one: as printed, the second batch still raises). The truth (no helpers): detached after the line that built
    it, the loop runs."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(ENCODED_ONCE_ON_A_DATASET, tmp_path / "as_written.py")
    fix = _carried_fix(ENCODED_ONCE_ON_A_DATASET, tmp_path / "encoded.py")
    printed = re.fullmatch(r"add `(.+)` after line (\d+), if it needs no gradient", fix)
    assert printed is not None, fix
    lines = ENCODED_ONCE_ON_A_DATASET.strip("\n").split("\n")
    built = int(printed.group(2)) - 4  # 3 lines above the source in the watched file
    assert lines[built].startswith("dataset = Dataset("), lines[built]
    fixed = "\n".join([*lines[: built + 1], printed.group(1), *lines[built + 1 :]])
    assert _run(fixed, tmp_path / "fixed.py")["step"] == 2


TOTAL_ON_A_TRAINER = """
import torch


class Trainer:
    def __init__(self):
        self.m = torch.nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.05)
        self.acc = 0

    def train_step(self, x):
        self.opt.zero_grad()
        self.acc += self.m(x).abs().mean()
        self.acc.backward()
        self.opt.step()

    def healthy(self):
        return not bool(self.acc.isnan())


torch.manual_seed(0)
t = Trainer()
for x in torch.randn(4, 6, 3):
    t.train_step(x)
    assert t.healthy()
"""


def test_a_total_on_self_that_another_method_reads_as_a_tensor_is_kept_one_without_its_graph(tmp_path: Path) -> None:
    """``self.acc += ...; self.acc.backward()`` in ``train_step``, ``self.acc.isnan()`` in another method: the fix
    "add a number instead (`self.acc += loss.item()`)", applied, raised "'float' object has no attribute 'isnan'".
    The truth (no helpers): the printed fix (a copy without its graph) runs."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(TOTAL_ON_A_TRAINER, tmp_path / "as_written.py")
    [item] = _items_watched(TOTAL_ON_A_TRAINER, tmp_path / "watched.py")
    printed = re.fullmatch(
        r"name this iteration's loss \(`(loss = .+)`\), call `loss.backward\(\)`, and add a copy without its graph"
        r" instead \(`(.+)`\)",
        item.fix,
    )
    assert printed is not None, item.fix
    fixed = TOTAL_ON_A_TRAINER.replace(
        "        self.acc += self.m(x).abs().mean()\n        self.acc.backward()\n",
        f"        {printed.group(1)}\n        loss.backward()\n        {printed.group(2)}\n",
    )
    assert fixed != TOTAL_ON_A_TRAINER
    ran = _run(fixed, tmp_path / "fixed.py")
    assert not ran["t"].acc.requires_grad


PREDICTION_OUTSIDE_THE_CLOSURE = """
import torch

torch.manual_seed(0)
x, y = torch.rand(20, 3), torch.rand(20, 1)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.LBFGS(model.parameters(), max_iter=4)


def main():
    pred = model(x)
    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(pred, y)
        loss.backward()
        return loss
    optimizer.step(closure)


main()
"""


def test_a_prediction_an_lbfgs_closure_reads_from_outside_is_computed_inside_it(tmp_path: Path) -> None:
    """``pred = model(x)`` before ``optimizer.step(closure)``, read in the closure (pytorch#111369): "add `pred =
    pred.detach()` before line N", N inside the closure, where it made ``pred`` the closure's local
    (UnboundLocalError), and a detached ``pred`` leaves the loss no graph. The truth (no helpers): the forward moved
    into the closure runs."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(PREDICTION_OUTSIDE_THE_CLOSURE, tmp_path / "as_written.py")
    [item] = _items_watched(PREDICTION_OUTSIDE_THE_CLOSURE, tmp_path / "watched.py")
    printed = re.match(r"compute `pred` inside `closure` \(move line (\d+) into it, before line (\d+)\)", item.fix)
    assert printed is not None, item.fix
    lines = PREDICTION_OUTSIDE_THE_CLOSURE.strip("\n").split("\n")
    moved, before = int(printed.group(1)) - 4, int(printed.group(2)) - 4  # 3 lines above the source when watched
    assert lines[moved].strip() == "pred = model(x)" and lines[before].strip().startswith("loss = "), item.fix
    fixed = lines[:moved] + lines[moved + 1 : before] + ["        " + lines[moved].strip()] + lines[before:]
    assert _run("\n".join(fixed) + "\n", tmp_path / "fixed.py")["model"].weight.grad is not None


RETAINED_OUTSIDE_FREED_INSIDE = """
import torch


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with torch.enable_grad():
            y = x.detach().requires_grad_() ** 2
        ctx.save_for_backward(y, x)
        ctx.inner = y
        return x * 1

    @staticmethod
    def backward(ctx, g):
        y, _ = ctx.saved_tensors
        (grad,) = torch.autograd.grad(ctx.inner, ctx.inner.grad_fn.next_functions[0][0].variable, g)
        return grad


torch.manual_seed(0)
t = torch.rand(5, requires_grad=True)
opt = torch.optim.SGD([t], lr=0.1)
for it in range(3):
    opt.zero_grad()
    loss = Square.apply(t).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    opt.step()
"""


def test_a_graph_an_autograd_functions_own_grad_frees_is_fixed_there_not_at_the_retained_backward(
    tmp_path: Path,
) -> None:
    """The first backward already retains; the second raises because the ``torch.autograd.grad`` inside the
    Function's backward freed its own graph (pytorch#65536): "add retain_graph=True to the earlier backward only",
    which it has. The truth (no helpers): ``retain_graph=True`` on the inner call runs."""
    assert _with_the_printed_retain(RETAINED_OUTSIDE_FREED_INSIDE, tmp_path)["t"].grad is not None


def _with_the_printed_retain(source: str, tmp_path: Path) -> dict:
    """``source`` raises as written; watched, its one item says "pass retain_graph=True to the call at line N", an
    ``autograd.grad(..., g)`` call: the names of ``source`` run with that retain added there."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(source, tmp_path / "as_written.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    printed = re.match(r"pass retain_graph=True to the call at line (\d+)", item.fix)
    assert printed is not None, item.fix
    lines = source.strip("\n").split("\n")
    inner = int(printed.group(1)) - 4
    assert "torch.autograd.grad(" in lines[inner], item.fix
    lines[inner] = lines[inner].replace(", g)", ", g, retain_graph=True)")
    return _run("\n".join(lines) + "\n", tmp_path / "fixed.py")


TWO_GRADIENTS_INSIDE = """
import torch


class SmoothScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        with torch.enable_grad():
            x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
            out = torch.nn.functional.softplus(x_ * w_) * torch.sigmoid(x_)
        ctx.saved = (out, x_, w_)
        return out.detach()

    @staticmethod
    def backward(ctx, g):
        out, x_, w_ = ctx.saved
        gx = torch.autograd.grad(out, x_, g)[0]
        gw = torch.autograd.grad(out, w_, g)[0]
        return gx, gw


torch.manual_seed(0)
lin = torch.nn.Linear(3, 5)
scale = torch.nn.Parameter(torch.ones(5))
opt = torch.optim.SGD([*lin.parameters(), scale], lr=0.1)
for it in range(3):
    opt.zero_grad()
    SmoothScale.apply(lin(torch.randn(4, 3)), scale).pow(2).mean().backward()
    opt.step()
"""


def test_a_functions_second_inner_grad_is_fixed_at_the_first_that_freed_the_graph(tmp_path: Path) -> None:
    """A custom Function's ``backward`` asks for two gradients, one ``autograd.grad`` each; the second raises: "pass
    retain_graph=True to the call at line N" named the second call, with which it still raises. The truth (no
    helpers): retain_graph=True on the first call runs."""
    assert _with_the_printed_retain(TWO_GRADIENTS_INSIDE, tmp_path)["scale"].grad is not None


FEATURES_BUILT_BY_TWO_LINES_OUTSIDE_THE_CLOSURE = """
import torch

torch.manual_seed(0)
encoder, head = torch.nn.Linear(3, 5), torch.nn.Linear(5, 1)
optimizer = torch.optim.LBFGS([*encoder.parameters(), *head.parameters()], lr=0.5, max_iter=3)
x, y = torch.randn(20, 3), torch.randn(20, 1)
for step in range(2):
    h = encoder(x)
    z = torch.tanh(h) * 2
    def closure():
        optimizer.zero_grad()
        loss = ((head(z) - y) ** 2).mean()
        loss.backward()
        return loss
    optimizer.step(closure)
"""


def test_features_an_lbfgs_closure_reads_are_moved_into_it_with_the_line_they_come_from(tmp_path: Path) -> None:
    """``h = encoder(x)`` then ``z = torch.tanh(h) * 2`` before the closure that reads ``z``: "move line 12 into it",
    with which the closure still walks the graph ``h`` brings from outside, and raises. The truth (no helpers): both
    lines moved into the closure run."""
    with pytest.raises(RuntimeError, match="second time"):
        _run(FEATURES_BUILT_BY_TWO_LINES_OUTSIDE_THE_CLOSURE, tmp_path / "as_written.py")
    [item] = _items_watched(FEATURES_BUILT_BY_TWO_LINES_OUTSIDE_THE_CLOSURE, tmp_path / "watched.py")
    printed = re.match(
        r"compute `z` inside `closure` \(move lines (\d+) and (\d+) into it, before line (\d+)\)", item.fix
    )
    assert printed is not None, item.fix
    lines = FEATURES_BUILT_BY_TWO_LINES_OUTSIDE_THE_CLOSURE.strip("\n").split("\n")
    first, second, before = (int(n) - 4 for n in printed.groups())  # 3 lines above the source when watched
    assert [lines[first].strip(), lines[second].strip()] == ["h = encoder(x)", "z = torch.tanh(h) * 2"], item.fix
    assert lines[before].strip().startswith("loss = "), item.fix
    moved = ["        " + lines[first].strip(), "        " + lines[second].strip()]
    fixed = lines[:first] + lines[second + 1 : before] + moved + lines[before:]
    assert _run("\n".join(fixed) + "\n", tmp_path / "fixed.py")["encoder"].weight.grad is not None


TBPTT_DETACHED = """
import torch
torch.manual_seed(0)
cell, head = torch.nn.RNNCell(4, 8), torch.nn.Linear(8, 1)
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
xs, ys, h = torch.randn(4, 3, 4), torch.randn(4, 3, 1), torch.zeros(3, 8)
"""


@pytest.mark.parametrize("off_by", ["an earlier cell", "a caller's no_grad"])
def test_autograd_left_off_before_the_loop_is_named_not_the_loops_detach(off_by: str) -> None:
    """A cell runs ``torch.set_grad_enabled(False)``; the next, a watched loop whose state is ``h.detach()`` each pass,
    raises that the loss does not require grad. The report blamed the loop's ``.detach()`` ("compute the loss from what
    line 3 applies `.detach()` to"): with that fix applied it still raises. The truth (no helpers): with
    ``torch.set_grad_enabled(True)`` before the loop, the loop as written runs, its ``.detach()`` kept."""
    names: dict = {}
    exec(TBPTT_DETACHED, names)

    def train(watched: bool, grad_on_first: bool = False) -> None:
        if grad_on_first:
            torch.set_grad_enabled(True)
        names["w"] = watch() if watched else contextlib.nullcontext()
        with names["w"]:
            for i in range(4):
                h = names["cell"](names["xs"][i], names["h"].detach())
                loss = ((names["head"](h) - names["ys"][i]) ** 2).mean()
                names["opt"].zero_grad()
                loss.backward()
                names["opt"].step()
                names["h"] = h

    with torch.enable_grad():  # the test leaves autograd as it found it
        off = torch.no_grad() if off_by == "a caller's no_grad" else contextlib.nullcontext()
        if off_by == "an earlier cell":
            torch.set_grad_enabled(False)
        with off, pytest.raises(RuntimeError, match="does not require grad"):
            train(watched=False)
        if off_by == "an earlier cell":
            torch.set_grad_enabled(False)
        with off, pytest.raises(RuntimeError, match="does not require grad"):
            train(watched=True)
        [item] = names["w"].report.items
        with off:
            train(watched=False, grad_on_first=True)  # the fix as printed: the loop then runs
    assert item.label == "the loss has no graph: autograd was already off when this code began", item.label
    assert item.fix == "call `torch.set_grad_enabled(True)` before the loop", item.fix
    assert ".detach()" not in item.why and "torch.set_grad_enabled(False)" in item.why, item.why


ONE_FORWARD_GAN = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
d = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
g_optimizer = torch.optim.Adam(g.parameters(), lr=1e-3)
d_optimizer = torch.optim.Adam(d.parameters(), lr=1e-3)
def losses(d, g, x_real):
    dgz = torch.sigmoid(d(g(torch.randn(x_real.shape[0], 4))))
    dx = torch.sigmoid(d(x_real))
    ones, zeros = torch.ones_like(dx), torch.zeros_like(dx)
    return F.binary_cross_entropy(dx, ones) + F.binary_cross_entropy(dgz, zeros), F.binary_cross_entropy(dgz, ones)
for step, x_real in enumerate([torch.randn(6, 2) + 2.0 for _ in range(3)]):
    d_loss, g_loss = losses(d, g, x_real)
    d_optimizer.zero_grad()
    d_loss.backward(retain_graph=True)
    d_optimizer.step()
    g_optimizer.zero_grad()
    g_loss.backward()
    g_optimizer.step()
"""


def test_a_retain_for_a_gans_second_loss_from_one_forward_goes_with_computing_that_forward_again(
    tmp_path: Path,
) -> None:
    """D's and G's losses from one call (a forum question, 2025: ``d_loss, g_loss = loss_nonsaturating(d, g, x)``),
    D stepped before ``g_loss.backward()``: the fix "compute line 16 again after the step" was right, but the
    ``retain_graph=True`` that only let G's backward reach that stale graph was left "needed" (G's nodes, built
    before D's in that call, counted as older than the stale forward); it took a second run of the tool. The truth
    (no helpers): as written, the in-place error; without the retain, "a second time"; with the forward computed
    again, the loop runs, and with the retain removed too it trains to the same weights."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _run(ONE_FORWARD_GAN, tmp_path / "as_written.py")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(ONE_FORWARD_GAN.replace("backward(retain_graph=True)", "backward()"), tmp_path / "no_retain.py")
    [item] = _items_watched(ONE_FORWARD_GAN, tmp_path / "watched.py")
    lines = ONE_FORWARD_GAN.strip("\n").split("\n")
    forward, step, retain = (
        3 + lines.index(code) + 1
        for code in (
            "    d_loss, g_loss = losses(d, g, x_real)",
            "    d_optimizer.step()",
            "    d_loss.backward(retain_graph=True)",
        )
    )
    assert item.fix.startswith(f"compute line {forward} again after the step at line {step}"), item.fix
    assert item.fix.endswith(f"; remove retain_graph=True at line {retain}"), item.fix
    again = ONE_FORWARD_GAN.replace(
        "    g_optimizer.zero_grad()", "    d_loss, g_loss = losses(d, g, x_real)\n    g_optimizer.zero_grad()"
    )
    torch.manual_seed(0)
    kept = _run(again, tmp_path / "again.py")
    removed = _run(again.replace("backward(retain_graph=True)", "backward()"), tmp_path / "again_no_retain.py")
    for net in ("g", "d"):
        assert all(torch.equal(a, b) for a, b in zip(kept[net].parameters(), removed[net].parameters(), strict=True))


DISTRIBUTION_BUILT_ONCE = """
import torch
from torch.distributions import Bernoulli
torch.manual_seed(0)
p = torch.tensor(0.2, requires_grad=True)
optimizer = torch.optim.SGD([p], lr=0.01)
pi = Bernoulli(p)
for step in range(3):
    optimizer.zero_grad()
    l1 = 2 * pi.log_prob(torch.tensor(1.0))
    l2 = 3 * pi.log_prob(torch.tensor(0.0))
    (l1 + l2).backward()
    optimizer.step()
"""


def test_a_distribution_built_once_before_the_loop_is_built_inside_it(tmp_path: Path) -> None:
    """``pi = Bernoulli(p)`` before the loop computes ``pi.logits`` at its first ``log_prob`` and keeps it
    (pytorch/pytorch#11192 in a loop): the fix was "compute `pi.logits` (line 10) again in each iteration", a line
    already in the loop, which gives back the cached tensor; with the forum's retain it was "add `pi.logits =
    pi.logits.detach()`", after which the loss trains nothing. The truth (no helpers): as written, "a second time" in
    pass 2; with line 7 moved into the loop it runs (and with the retain too)."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(DISTRIBUTION_BUILT_ONCE, tmp_path / "as_written.py")
    moved = DISTRIBUTION_BUILT_ONCE.replace("pi = Bernoulli(p)\n", "").replace(
        "    optimizer.zero_grad()\n", "    optimizer.zero_grad()\n    pi = Bernoulli(p)\n"
    )
    trained = _run(moved, tmp_path / "moved.py")["p"]
    band_aid = DISTRIBUTION_BUILT_ONCE.replace("(l1 + l2).backward()", "(l1 + l2).backward(retain_graph=True)")
    for source in (DISTRIBUTION_BUILT_ONCE, band_aid):
        [item] = _items_watched(source, tmp_path / "watched.py")
        built = 3 + source.strip("\n").split("\n").index("pi = Bernoulli(p)") + 1
        assert item.fix.startswith(f"build `pi` inside the loop (move line {built} into it)"), item.fix
    assert torch.allclose(
        trained, _run(moved.replace("backward()", "backward(retain_graph=True)"), tmp_path / "r.py")["p"]
    )


EVALUATE_LEAVES_AUTOGRAD_OFF = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 3), torch.randn(8, 1)
def evaluate(model, x, y):
    torch.set_grad_enabled(False)
    return F.mse_loss(model(x), y).item()
for step in range(3):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    score = evaluate(model, x, y)
"""


def test_autograd_left_off_by_a_function_the_loop_calls_is_named_at_that_functions_line(tmp_path: Path) -> None:
    """``evaluate()``, called at the end of each pass, turns autograd off with a call and never on again: the second
    pass's loss has no graph. The report said "autograd was already off when this code began" (the first pass
    trained) and "call `torch.set_grad_enabled(True)` before the loop", which leaves it raising. The truth (no
    helpers): as written "does not require grad" in pass 2; with autograd turned on before the loss, it runs."""
    with torch.enable_grad(), pytest.raises(RuntimeError, match="does not require grad"):
        _run(EVALUATE_LEAVES_AUTOGRAD_OFF, tmp_path / "as_written.py")
    with torch.enable_grad():
        [item] = _items_watched(EVALUATE_LEAVES_AUTOGRAD_OFF, tmp_path / "watched.py")
        off = 3 + EVALUATE_LEAVES_AUTOGRAD_OFF.strip("\n").split("\n").index("    torch.set_grad_enabled(False)") + 1
        assert item.label == f"the loss has no graph: line {off} turns autograd off", item.label
        fixed = EVALUATE_LEAVES_AUTOGRAD_OFF.replace("    loss =", "    torch.set_grad_enabled(True)\n    loss =")
        assert _run(fixed, tmp_path / "fixed.py")["step"] == 2


def test_inference_mode_around_the_loop_is_named_and_its_fix_trains() -> None:
    """A caller's ``torch.inference_mode()`` around ``train()``: "autograd was already off ... call
    `torch.set_grad_enabled(True)` before the loop", which inference mode ignores (it still raises). The truth (no
    helpers): the loop raises that the loss does not require grad; inside ``torch.inference_mode(False)`` it runs."""
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(escape: bool = False) -> None:
        with torch.inference_mode(False) if escape else contextlib.nullcontext():
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(4, 3)).pow(2).mean().backward()
                opt.step()

    w = watch()
    with torch.inference_mode(), pytest.raises(RuntimeError, match="does not require grad"), w:
        train()
    [item] = w.report.items
    assert item.label == "the loss has no graph: inference mode was already on when this code began", item.label
    assert "torch.inference_mode(False)" in item.fix, item.fix
    with torch.inference_mode():
        train(escape=True)


GAN_THIRD_LOSS = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
d = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
g_optimizer = torch.optim.Adam(g.parameters(), lr=1e-3)
d_optimizer = torch.optim.Adam(d.parameters(), lr=1e-3)
def losses(d, g, x_real, z):
    fake = g(z)
    dgz = torch.sigmoid(d(fake))
    dx = torch.sigmoid(d(x_real))
    ones, zeros = torch.ones_like(dx), torch.zeros_like(dx)
    d_loss = F.binary_cross_entropy(dx, ones) + F.binary_cross_entropy(dgz, zeros)
    return d_loss, F.binary_cross_entropy(dgz, ones), fake
for step, x_real in enumerate([torch.randn(6, 2) + 2.0 for _ in range(3)]):
    z = torch.randn(6, 4)
    d_loss, g_loss, fake = losses(d, g, x_real, z)
    aux = fake.pow(2).mean()
    d_optimizer.zero_grad()
    d_loss.backward(retain_graph=True)
    d_optimizer.step()
    g_optimizer.zero_grad()
    g_loss.backward()
    aux.backward()
    g_optimizer.step()
"""


def test_the_retain_stays_where_a_later_loss_still_walks_the_first_forward(tmp_path: Path) -> None:
    """A third loss computed from the first forward (``aux``) and walked after G's backward: computing that forward
    again for G's loss still leaves ``aux`` walking the first one, so the retain is needed; the fix said "remove
    retain_graph=True" too, and applied it raised "a second time". The truth (no helpers): with the forward computed
    again and the retain kept, the loop runs; with the retain removed as well, it raises."""
    [item] = _items_watched(GAN_THIRD_LOSS, tmp_path / "watched.py")
    assert item.fix.startswith("compute line ") and "remove retain_graph=True" not in item.fix, item.fix
    again = GAN_THIRD_LOSS.replace(
        "    g_optimizer.zero_grad()", "    d_loss, g_loss, _ = losses(d, g, x_real, z)\n    g_optimizer.zero_grad()"
    )
    _run(again, tmp_path / "again.py")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(again.replace("backward(retain_graph=True)", "backward()"), tmp_path / "again_no_retain.py")


TENSOR_LOGGER = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
class TensorLogger:
    def __init__(self):
        self.records = {}
    def log(self, name, value):
        self.records.setdefault(name, []).append(value)
logger = TensorLogger()
for x, y in [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]:
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    logger.log("train/loss", loss)
"""


def test_a_logger_of_the_learners_fed_the_loss_tensor_is_noted_at_the_call_that_feeds_it(tmp_path: Path) -> None:
    """``logger.log("train/loss", loss)`` into a dict of lists: the note sat at the loss line ("each iteration's
    graph starts here") with a fix that, applied there, leaves the loss no graph. The truth (no helpers): the records
    hold the graphs of all 4 passes; fed ``loss.item()``, they hold none and the weights are the same."""
    ran = _run(TENSOR_LOGGER, tmp_path / "as_written.py")
    assert sum(t.grad_fn is not None for t in ran["logger"].records["train/loss"]) == 4
    [item] = _items_watched(TENSOR_LOGGER, tmp_path / "watched.py")
    [line] = item.lines
    assert line.code == 'logger.log("train/loss", loss)' and item.fix == '`logger.log("train/loss", loss.item())`', (
        line,
        item.fix,
    )
    fixed = _run(TENSOR_LOGGER.replace('("train/loss", loss)', '("train/loss", loss.item())'), tmp_path / "f.py")
    assert torch.equal(fixed["model"].weight, ran["model"].weight)


DCGAN_BAND_AID = """
import torch
torch.manual_seed(0)
netG = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
netD = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1), torch.nn.Sigmoid())
criterion = torch.nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
for real in [torch.randn(6, 2) + 2.0 for _ in range(3)]:
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(6, 1))
    errD_real.backward()
    fake = netG(torch.randn(6, 4))
    output = netD(fake)
    errD_fake = criterion(output, torch.zeros(6, 1))
    errD_fake.backward(retain_graph=True)
    optimizerD.step()
    netG.zero_grad()
    output = netD(fake)
    errG = criterion(output, torch.ones(6, 1))
    errG.backward()
    optimizerG.step()
"""


def test_a_dcgan_d_loss_band_aid_is_needed_and_fake_detach_is_named_in_its_place(tmp_path: Path) -> None:
    """DCGAN with the forum's ``errD_fake.backward(retain_graph=True)`` in place of ``netD(fake.detach())``: "healthy
    ... retain_graph=True at line 16 needed" and "keep it", which endorses the band-aid. The truth (no helpers):
    without the retain, G's backward raises "a second time"; with ``fake.detach()`` in D's forward and no retain, the
    loop runs and trains to the same weights (D's loss never trained G: its gradients are zeroed before G's)."""
    as_written = _run(DCGAN_BAND_AID, tmp_path / "as_written.py")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(DCGAN_BAND_AID.replace("backward(retain_graph=True)", "backward()"), tmp_path / "no_retain.py")
    detached = DCGAN_BAND_AID.replace(
        "    output = netD(fake)\n    errD_fake", "    output = netD(fake.detach())\n    errD_fake"
    )
    fixed = _run(detached.replace("backward(retain_graph=True)", "backward()"), tmp_path / "fixed.py")
    for net in ("netG", "netD"):
        assert all(
            torch.equal(a, b) for a, b in zip(as_written[net].parameters(), fixed[net].parameters(), strict=True)
        )
    path = tmp_path / "watched.py"
    path.write_text(
        "from backward_twice.watcher import watch\nwith watch() as w:\n" + textwrap.indent(DCGAN_BAND_AID, "    ")
    )
    lines = DCGAN_BAND_AID.split("\n")
    retain, read = (
        lines.index("    errD_fake.backward(retain_graph=True)") + 3,
        lines.index("    output = netD(fake)") + 3,
    )
    headline = runpy.run_path(str(path))["w"].report.headline
    assert headline.endswith(
        f"retain_graph=True at line {retain} needed (or `fake.detach()` at line {read} in its place))"
    ), headline


def test_a_distribution_a_function_builds_once_before_the_loop_is_built_inside_it(tmp_path: Path) -> None:
    """``pi = make_pi(p)``, a function of the script that returns ``Bernoulli(p)``: the fix was the old "compute
    `pi.logits` (line 14) again in each iteration", naming the loss line. The truth (no helpers): as written "a second
    time" in pass 2; with line 8 moved into the loop it runs."""
    source = DISTRIBUTION_BUILT_ONCE.replace(
        "pi = Bernoulli(p)\n", "def make_pi(p):\n    return Bernoulli(p)\npi = make_pi(p)\n"
    )
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(source, tmp_path / "as_written.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    built = 3 + source.strip("\n").split("\n").index("pi = make_pi(p)") + 1
    assert item.fix.startswith(f"build `pi` inside the loop (move line {built} into it)"), item.fix
    moved = source.replace("pi = make_pi(p)\n", "").replace(
        "    optimizer.zero_grad()\n", "    optimizer.zero_grad()\n    pi = make_pi(p)\n"
    )
    _run(moved, tmp_path / "moved.py")


# lab-cosmo/torch-pme#62 ("Caching destroys computational graph"): a calculator caches its k-vectors, computed from
# ``cell`` with their graph, and computes them again only when the cell's values change; each pass builds a fresh
# ``cell`` that needs a gradient, with the same values.
CACHED_ON_SELF = """
import torch
from torch import nn


class Calculator(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self._cell_cache = None
        self._kvectors = None

    def forward(self, positions, cell):
        if self._cell_cache is None or not torch.allclose(cell, self._cell_cache):
            self._kvectors = torch.linalg.inv(cell).T * self.scale
            self._cell_cache = cell.detach().clone()
        return torch.cos(positions @ self._kvectors).sum() / torch.det(cell)


torch.manual_seed(0)
calculator = Calculator()
optimizer = torch.optim.SGD(calculator.parameters(), lr=0.01)
cell_grads = []
for _ in range(3):
    positions = torch.rand(5, 3, requires_grad=True)
    cell = (5 * torch.eye(3)).requires_grad_()
    optimizer.zero_grad()
    calculator(positions, cell).backward()
    optimizer.step()
    cell_grads.append(cell.grad)
    # END OF ITERATION
"""


def test_a_value_a_method_caches_with_its_graph_is_computed_every_call_not_detached(tmp_path: Path) -> None:
    """The watch named ``self._kvectors`` (no ``self`` where the loop runs: a NameError as printed) with "add
    `self._kvectors = self._kvectors.detach()` at the end of each iteration"; in a watch around an imported loop, the
    carrier was ``positions``, built fresh each pass. The truth, without the tool: the loop with the cache's ``if``
    always true is the calculator as it should be; detaching the cached value runs but gives another pass's ``cell``
    no gradient through it (``cell.grad`` differs from pass 2 on). The fix as printed, computing the line every
    call, trains as that."""
    guard = "        if self._cell_cache is None or not torch.allclose(cell, self._cell_cache):"
    assert CACHED_ON_SELF.count(guard) == 1
    uncached = _run(CACHED_ON_SELF.replace(guard, "        if True:"), tmp_path / "uncached.py")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(CACHED_ON_SELF, tmp_path / "as_written.py")
    detached = _run(
        CACHED_ON_SELF.replace("    # END OF ITERATION", "    calculator._kvectors = calculator._kvectors.detach()"),
        tmp_path / "detached.py",
    )
    assert not torch.allclose(detached["cell_grads"][1], uncached["cell_grads"][1])
    [item] = [item for item in _items_watched(CACHED_ON_SELF, tmp_path / "watched.py") if item.kind == "carried"]
    assert item.label.startswith("`calculator._kvectors` carries iteration 1's graph"), item.label
    line = 3 + next(
        i for i, text in enumerate(CACHED_ON_SELF.strip("\n").split("\n"), 1) if "self._kvectors = torch" in text
    )
    assert item.fix == (
        f"compute line {line} on every call (the `if` at line {line - 1} skips it once `self._cell_cache` is set): "
        "each later pass reuses the graph of the pass that computed it"
    ), item.fix
    fixed = _run(CACHED_ON_SELF.replace(guard, "        if True:"), tmp_path / "fixed.py")  # the line, every call
    assert all(torch.equal(a, b) for a, b in zip(fixed["cell_grads"], uncached["cell_grads"], strict=True))


def test_a_value_cached_on_a_module_imported_from_another_file_is_named_there_not_by_a_fresh_input(
    tmp_path: Path,
) -> None:
    """The same loop in a module the learner imports, run under ``watch()`` from another file: the carrier was
    ``positions`` ("add `positions = positions.detach()` before line N", which still raises), a tensor each pass
    builds afresh. The names walk had read the module's attributes once, while ``self._kvectors`` was still None,
    and never looked at it again; and the error's evidence took the nearest name in the engine's order, which does
    not lead to the freed graph."""
    head, loop = CACHED_ON_SELF.split("torch.manual_seed(0)\n")
    module = head + "def train():\n" + textwrap.indent("torch.manual_seed(0)\n" + loop, "    ")
    (tmp_path / "pme_like.py").write_text(module)
    (tmp_path / "driver.py").write_text(
        "import sys\nsys.path.insert(0, sys.argv[1])\nimport pme_like\nfrom backward_twice.watcher import watch\n"
        "try:\n    with watch() as w:\n        pme_like.train()\nexcept RuntimeError:\n    pass\n"
    )
    saved = sys.argv
    sys.argv = ["driver.py", str(tmp_path)]
    try:
        report = runpy.run_path(str(tmp_path / "driver.py"))["w"].report
    finally:
        sys.argv = saved
        sys.modules.pop("pme_like", None)
    [item] = [item for item in report.items if item.kind == "carried"]
    assert item.label.startswith("`calculator._kvectors` carries iteration 1's graph"), item.label
    assert "positions" not in item.fix, item.fix


LOG_BY_SETDEFAULT = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
log = {}
for _ in range(6):
    out = model(torch.randn(8, 4))
    loss = out.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    log.setdefault("loss", []).append(loss)
    log.setdefault("mean", []).append(out.mean())
"""


def test_a_list_a_dict_makes_at_its_first_append_keeps_its_setdefault_in_the_printed_fix(tmp_path: Path) -> None:
    """``log.setdefault("loss", []).append(loss)`` (h71a): the fix was ``log['loss'].append(loss.item())``, a KeyError
    as printed at the first pass, and ``out.mean()`` appended got no line at all. The truth (no helpers): as written
    the lists hold 12 graphs; with each printed line in place of its append, none, and the weights are the same."""
    ran = _run(LOG_BY_SETDEFAULT, tmp_path / "as_written.py")
    assert sum(t.grad_fn is not None for kept in ran["log"].values() for t in kept) == 12
    fixes = sorted(
        re.match(r"`([^`]+)`", item.fix).group(1) for item in _items_watched(LOG_BY_SETDEFAULT, tmp_path / "w.py")
    )
    assert fixes == [
        'log.setdefault("loss", []).append(loss.item())',
        'log.setdefault("mean", []).append(out.mean().item())',
    ], fixes
    fixed_source = LOG_BY_SETDEFAULT
    for fix in fixes:  # each in place of the append whose list it names, indented as that append
        head = re.escape(fix.split(".append(")[0])
        fixed_source = re.sub(rf"(?m)^(\s*){head}\.append\(.*\)$", lambda m, f=fix: m.group(1) + f, fixed_source)
    assert fixed_source.count(".item())") == 2, fixed_source
    fixed = _run(fixed_source, tmp_path / "fixed.py")
    assert all(isinstance(v, float) for kept in fixed["log"].values() for v in kept)
    assert torch.equal(fixed["model"].weight, ran["model"].weight)


MUTUAL_OVER_MODELS = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)) for _ in range(2)]
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
loss_kl = torch.nn.KLDivLoss(reduction="batchmean")
for images, labels in [(torch.randn(6, 8), torch.randint(0, 4, (6,))) for _ in range(3)]:
    outputs = []
    for model in models:
        outputs.append(model(images))
    for i in range(2):
        ce_loss = F.cross_entropy(outputs[i], labels)
        kl_loss = 0
        for j in range(2):
            if i != j:
                kl_loss += loss_kl(F.log_softmax(outputs[i], dim=1),
                                   F.softmax(outputs[j], dim=1))
        loss = ce_loss + kl_loss
        optimizers[i].zero_grad()
        loss.backward()
        optimizers[i].step()
"""


@pytest.mark.parametrize("retain", ["", "retain_graph=True"])
def test_mutual_learning_over_a_list_of_models_detaches_the_other_models_output_as_printed(
    tmp_path: Path, retain: str
) -> None:
    """Deep mutual learning's loop over its models (chxy95/Deep-Mutual-Learning#5): each model's loss reads the other's
    output as its target. The fix was "compute `model(images)` (line 11) again ... detached copies in `outputs` would
    train nothing" (with the band-aid: "build the `outputs` item each pass reads inside the loop"). The truth (no
    helpers): as written pass 2 raises (a second backward; with the retain, the in-place error of model 0's step);
    with the thread's answer, `outputs[j].detach()` where the target is read, it trains; the printed fix is that."""
    source = MUTUAL_OVER_MODELS.replace("loss.backward()", f"loss.backward({retain})")
    error = "modified by an inplace operation" if retain else "backward through the graph a second time"
    with pytest.raises(RuntimeError, match=error):
        _run(source, tmp_path / "as_written.py")
    thread = _run(source.replace("softmax(outputs[j]", "softmax(outputs[j].detach()"), tmp_path / "thread.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    printed = re.match(r"use `outputs\[j\]\.detach\(\)` at line (\d+): ", item.fix)
    assert printed is not None and "outputs[i]" in item.fix, item.fix
    assert ("remove retain_graph=True at line 23" in item.fix) == bool(retain), item.fix
    lines = source.split("\n")
    at = int(printed.group(1)) - 3  # the watched copy stands 3 lines lower; ``lines[0]`` is the empty first
    assert "outputs[j]" in lines[at], (at, lines[at])
    lines[at] = lines[at].replace("outputs[j]", "outputs[j].detach()")
    fixed = _run("\n".join(lines).replace(f"backward({retain})", "backward()"), tmp_path / "fixed.py")
    for mine, theirs in zip(fixed["models"], thread["models"], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), theirs.parameters(), strict=True))


INPUT_GRADIENT_PENALTY = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for data, target in [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]:
    data.requires_grad = True
    opt.zero_grad()
    output = net(data)
    loss_super = torch.nn.functional.cross_entropy(output, target)
    grad_x, = torch.autograd.grad(output.sum(), data)
    loss = loss_super + 0.1 * grad_x.pow(2).sum()
    loss.backward()
    opt.step()
"""


def test_a_gradient_penalty_written_without_create_graph_gets_create_graph_as_printed(tmp_path: Path) -> None:
    """Double backprop without ``create_graph=True`` (h72b): "use `output.detach()` ... or add retain_graph=True to
    line 13's backward only", where the detach raises ("does not require grad") and the retain trains exactly as no
    penalty at all. The truth (no helpers): as written the loss's backward raises; with the retain, the weights are
    those of ``loss_super`` alone; with ``create_graph=True`` on the grad line, the penalty trains."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(INPUT_GRADIENT_PENALTY, tmp_path / "as_written.py")
    [item] = _items_watched(INPUT_GRADIENT_PENALTY, tmp_path / "watched.py")
    assert item.fix.startswith("add create_graph=True to line 13's `autograd.grad` if the loss trains through"), item
    assert item.fix.endswith(", else retain_graph=True"), item.fix
    grad_line = "torch.autograd.grad(output.sum(), data"
    created = _run(INPUT_GRADIENT_PENALTY.replace(grad_line, f"{grad_line}, create_graph=True"), tmp_path / "c.py")
    retained = _run(INPUT_GRADIENT_PENALTY.replace(grad_line, f"{grad_line}, retain_graph=True"), tmp_path / "r.py")
    without = INPUT_GRADIENT_PENALTY.replace(" + 0.1 * grad_x.pow(2).sum()", "")  # the grad kept: the same draws
    no_penalty = _run(without.replace(grad_line, f"{grad_line}, retain_graph=True"), tmp_path / "n.py")
    weights = [[p.detach() for p in ran["net"].parameters()] for ran in (created, retained, no_penalty)]
    assert all(torch.equal(a, b) for a, b in zip(weights[1], weights[2], strict=True))
    assert not all(torch.allclose(a, b) for a, b in zip(weights[0], weights[2], strict=True))


TOTAL_LOGGED_EVERY_K = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_loss = 0
logged = []
for step in range(1, 13):
    loss = ((model(torch.randn(8, 4)) - torch.randn(8, 1)) ** 2).mean()
    train_loss += loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 4 == 0:
        logged.append(train_loss.item() / 4)
        train_loss = 0
"""


@pytest.mark.parametrize("read", ["train_loss.item() / 4", "float(train_loss) / 4"])
def test_a_total_the_loop_reads_as_a_tensor_is_added_to_detached_as_printed(tmp_path: Path, read: str) -> None:
    """ML2021 HW7's ``train_loss += output.loss``, logged with ``train_loss.item()`` (pai4451/ML2021#2): the note said
    "keep a number (`.item()`) or a detached tensor (`.detach()`)", whose first, applied, raised "'float' object has
    no attribute 'item'" at the log line. The truth (no helpers): the thread's ``.detach()`` trains and logs as
    written; where the log reads a number (``float(...)``), ``.item()`` does too (a float total: equal to rounding)."""
    source = TOTAL_LOGGED_EVERY_K.replace("train_loss.item() / 4", read)
    ran = _run(source, tmp_path / "as_written.py")
    [item] = _items_watched(source, tmp_path / "watched.py")
    printed = re.match(r"`([^`]+)`", item.fix)
    assert printed is not None, item.fix
    expected = "train_loss += loss.detach()" if ".item()" in read else "train_loss += loss.item()"
    assert printed.group(1) == expected, item.fix
    fixed = _run(source.replace("    train_loss += loss\n", f"    {printed.group(1)}\n"), tmp_path / "fixed.py")
    assert fixed["logged"] == pytest.approx(ran["logged"]) and torch.equal(fixed["model"].weight, ran["model"].weight)


MUTUAL_OVER_A_DICT = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
models = {k: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)) for k in "ab"}
opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
kl = torch.nn.KLDivLoss(reduction="batchmean")
for images, labels in [(torch.randn(6, 8), torch.randint(0, 4, (6,))) for _ in range(3)]:
    outputs = {k: m(images) for k, m in models.items()}
    for k in outputs:
        kl_loss = 0
        for other in outputs:
            if other != k:
                kl_loss += kl(F.log_softmax(outputs[k], dim=1), F.softmax(outputs[other], dim=1))
        loss = F.cross_entropy(outputs[k], labels) + kl_loss
        opts[k].zero_grad()
        loss.backward()
        opts[k].step()
"""


def test_mutual_learning_over_a_dict_of_models_detaches_the_other_models_output_as_printed(tmp_path: Path) -> None:
    """The same over a dict of models (h73a): "compute `outputs['a']` inside the loop", which, applied, still raised
    a second backward. The truth: the target's ``outputs[other].detach()`` trains; the printed fix is that."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(MUTUAL_OVER_A_DICT, tmp_path / "as_written.py")
    hand = MUTUAL_OVER_A_DICT.replace("softmax(outputs[other]", "softmax(outputs[other].detach()")
    thread = _run(hand, tmp_path / "hand.py")
    [item] = _items_watched(MUTUAL_OVER_A_DICT, tmp_path / "watched.py")
    printed = re.match(r"use `outputs\[other\]\.detach\(\)` at line (\d+): ", item.fix)
    assert printed is not None, item.fix
    lines = MUTUAL_OVER_A_DICT.split("\n")
    at = int(printed.group(1)) - 3  # the watched copy stands 3 lines lower; ``lines[0]`` is the empty first
    assert "softmax(outputs[other]" in lines[at], lines[at]
    lines[at] = lines[at].replace("outputs[other]", "outputs[other].detach()")
    fixed = _run("\n".join(lines), tmp_path / "fixed.py")
    for k in "ab":
        assert all(torch.equal(a, b) for a, b in zip(fixed["models"][k].parameters(), thread["models"][k].parameters()))


MUTUAL_OVER_ZIP = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)) for _ in range(2)]
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
start = [p.detach().clone() for m in models for p in m.parameters()]
kl = torch.nn.KLDivLoss(reduction="batchmean")
for images, labels in [(torch.randn(6, 8), torch.randint(0, 4, (6,))) for _ in range(3)]:
    outputs = [model(images) for model in models]
    for i, (opt, out) in enumerate(zip(optimizers, outputs)):
        kl_loss = 0
        for j, other in enumerate(outputs):
            if j != i:
                kl_loss = kl_loss + kl(F.log_softmax(out, dim=1), F.softmax(other, dim=1))
        loss = F.cross_entropy(out, labels) + kl_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_mutual_learning_over_zip_detaches_the_other_models_output_as_printed(tmp_path: Path) -> None:
    """The same over ``zip(optimizers, outputs)`` (h73a): "add `out = out.detach()` as the loop's body begins",
    which, applied, trained nothing (both models kept their first weights). The truth: ``other.detach()`` in the
    target trains every model; the printed fix is that."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run(MUTUAL_OVER_ZIP, tmp_path / "as_written.py")
    [item] = _items_watched(MUTUAL_OVER_ZIP, tmp_path / "watched.py")
    printed = re.match(r"use `other\.detach\(\)` at line (\d+): ", item.fix)
    assert printed is not None and "trains through `out`" in item.fix, item.fix
    lines = MUTUAL_OVER_ZIP.split("\n")
    at = int(printed.group(1)) - 3  # the watched copy stands 3 lines lower; ``lines[0]`` is the empty first
    lines[at] = lines[at].replace("softmax(other,", "softmax(other.detach(),")
    fixed = _run("\n".join(lines), tmp_path / "fixed.py")
    hand = _run(MUTUAL_OVER_ZIP.replace("softmax(other,", "softmax(other.detach(),"), tmp_path / "hand.py")
    now = [p for m in fixed["models"] for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(now, [p for m in hand["models"] for p in m.parameters()]))
    assert all(not torch.equal(a, b) for a, b in zip(now, fixed["start"]))  # every model trained
