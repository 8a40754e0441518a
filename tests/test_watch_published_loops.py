"""Published loops retyped tiny, each judged in-process as the learner wrote it, with its truth from bare runs.

Each one was judged wrong once: a correct loop flagged with a fix that broke it, a carrier named by the wrong one of
two names, a list's fix that would have stopped the learning, one cause reported twice."""

from __future__ import annotations

import inspect
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backward_twice.watcher import watch


def _mutual_learning(models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
    """Deep Mutual Learning, ``train_one_epoch`` of github.com/chxy95/Deep-Mutual-Learning (trainer.py): each
    model's output is built in the batch's pass, and the per-model loop's backward walks it once."""
    torch.manual_seed(1)
    loader = [(torch.randn(5, 6), torch.randint(0, 3, (5,))) for _ in range(3)]
    for images, labels in loader:
        outputs = []
        for model in models:
            outputs.append(model(images))
        for i in range(len(models)):
            ce_loss = F.cross_entropy(outputs[i], labels)
            kl_loss = 0
            for j in range(len(models)):
                if i != j:
                    kl_loss += F.kl_div(
                        F.log_softmax(outputs[i], dim=1), F.softmax(outputs[j].detach(), dim=1), reduction="batchmean"
                    )
            loss = ce_loss + kl_loss / (len(models) - 1)
            optimizers[i].zero_grad()
            loss.backward()
            optimizers[i].step()


def _two_models() -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)) for _ in range(2)]
    return models, [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]


def test_an_output_each_pass_of_a_per_model_loop_walks_once_is_consumed_not_carried() -> None:
    """The truth: the loop runs bare to its end, and the same 6 backward calls train the same weights watched. It was
    "`outputs` carries the graph built before the loop into iteration 1", with a fix (detached outputs) that stops
    the training: element 0 of tensors does not require grad."""
    bare_models, bare_optimizers = _two_models()
    _mutual_learning(bare_models, bare_optimizers)
    models, optimizers = _two_models()
    with watch() as w:
        _mutual_learning(models, optimizers)
    assert w.healthy and w.verdicts.calls == 6, str(w)
    for bare, watched in zip(bare_models, models):
        assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), watched.parameters()))


class _Memory(torch.nn.Module):
    """Transformer-XL's segment recurrence (github.com/kimiyoung/transformer-xl, pytorch/mem_transformer.py): the
    forward returns ``[loss] + new_mems``, here with ``_update_mems`` outside ``torch.no_grad()``."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding, self.mix, self.out = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 16)

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems: torch.Tensor) -> list[torch.Tensor]:
        hidden = self.embedding(data)
        if mems:
            hidden = hidden + self.mix(mems[0][-data.size(0) :])
        loss = F.cross_entropy(self.out(hidden).view(-1, 16), target.view(-1))
        return [loss, torch.cat([*mems, hidden])[-4:]]


def _segments(model: torch.nn.Module, detach_mems: bool) -> None:
    """pytorch/train.py's loop: ``ret = para_model(data, target, *mems); loss, mems = ret[0], ret[1:]``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    corpus = torch.randint(0, 16, (17, 2), generator=torch.Generator().manual_seed(0))
    mems: tuple[torch.Tensor, ...] | list[torch.Tensor] = ()
    for i in range(0, corpus.size(0) - 1, 4):
        data, target = corpus[i : i + 4], corpus[i + 1 : i + 5]
        model.zero_grad()
        if detach_mems:  # the fix as the diagnosis prints it, before the line the graph comes in at
            mems = [m.detach() for m in mems]
        ret = model(data, target, *mems)
        loss, mems = ret[0], ret[1:]
        loss.backward()
        optimizer.step()


def test_a_memory_two_names_hold_is_named_by_the_one_the_next_pass_reads() -> None:
    """``ret[1]`` and ``mems[0]`` are one tensor; the next pass reads ``mems`` (``*mems``) before it assigns it, and
    assigns ``ret`` before reading it. It was "`ret` carries ...", fix `ret = [m.detach() for m in ret]`, which
    detached the loss too. The truth: the loop raises in iteration 2 bare; with the printed fix it runs."""
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="second time"):
        _segments(_Memory(), detach_mems=False)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _segments(_Memory(), detach_mems=False)
    item = w.report.items[0]
    assert item.label.startswith("`mems` carries iteration 1's graph into iteration 2"), str(w)
    assert item.fix.startswith("add `mems = [m.detach() for m in mems]` before line"), item.fix
    _segments(_Memory(), detach_mems=True)  # the fix as printed: runs bare
    with watch() as fixed:
        _segments(_Memory(), detach_mems=True)
    assert fixed.healthy, str(fixed)


REINFORCE = """
import torch
import torch.nn.functional as F


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.affine = torch.nn.Linear(4, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        return F.softmax(self.affine(x), dim=-1)


torch.manual_seed(0)
policy = Policy()
optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)


def select_action(state):
    m = torch.distributions.Categorical(policy(state))
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    policy_loss = []
    for log_prob, reward in zip(policy.saved_log_probs, policy.rewards):
        policy_loss.append(-log_prob * reward)
    optimizer.zero_grad()
    policy_loss = torch.cat([loss.view(1) for loss in policy_loss]).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]{clear}
"""

EPISODE = """
import sys
import torch
import backward_twice as bt
import reinforce


def episode():
    for _ in range(3):
        reinforce.select_action(torch.randn(4))
        reinforce.policy.rewards.append(1.0)
    reinforce.finish_episode()


if sys.argv[1] == "diagnose":
    print(bt.diagnose(episode, models=reinforce.policy, optimizers=reinforce.optimizer))
else:
    for _ in range(3):
        episode()
    print("ran")
"""


def _python(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=240)


def test_a_list_an_update_in_another_module_sums_is_cleared_not_detached(tmp_path: Path) -> None:
    """REINFORCE of github.com/pytorch/examples (reinforcement_learning/reinforce.py) with ``del
    policy.saved_log_probs[:]`` left out, the common bug; ``bt.diagnose`` on an episode step of the learner's own,
    whose update is the module's ``finish_episode``. It said "keep detached copies in `pol.saved_log_probs`
    (`append(out.detach())`), or clear it": detached log-probabilities give no policy gradient. The truth: bare,
    episode 2 raises; with the list cleared after the update (as printed) three episodes run."""
    (tmp_path / "episode.py").write_text(EPISODE)
    (tmp_path / "reinforce.py").write_text(REINFORCE.format(clear=""))
    bare = _python(tmp_path, "episode.py", "bare")
    assert bare.returncode == 1 and "backward through the graph a second time" in bare.stderr
    diagnosed = _python(tmp_path, "episode.py", "diagnose")
    assert "1. `policy.saved_log_probs` carries iteration 1's graph into iteration 2\n" in diagnosed.stdout
    assert "fix: clear `policy.saved_log_probs` after each update" in diagnosed.stdout, diagnosed.stdout
    assert "detach" not in diagnosed.stdout.split("fix:")[1]
    (tmp_path / "reinforce.py").write_text(REINFORCE.format(clear="\n    policy.saved_log_probs.clear()"))
    assert _python(tmp_path, "episode.py", "bare").stdout == "ran\n"


MOMENTUM_ENCODER = """
import copy
import torch
import torch.nn.functional as F

torch.manual_seed(0)
online = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
target = copy.deepcopy(online)
for p in target.parameters():
    p.requires_grad = False
optimizer = torch.optim.SGD(online.parameters(), lr=0.05)
for step in range(4):
    x1, x2 = torch.randn(5, 6), torch.randn(5, 6)
    with torch.no_grad():
        t1, t2 = target(x1), target(x2)
    loss = (F.mse_loss(online(x1), t2) + F.mse_loss(online(x2), t1)) / 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for online_p, target_p in zip(online.parameters(), target.parameters()):
        target_p.mul_(0.99).add_(online_p, alpha=0.01)
print("graph on the target:", target[0].weight.grad_fn is not None)
"""


def test_a_bare_name_left_on_one_of_a_modules_parameters_is_no_second_item(tmp_path: Path) -> None:
    """A momentum encoder updated in place outside ``torch.no_grad()`` (BYOL's ``update_moving_average``,
    github.com/lucidrains/byol-pytorch, written in place), after ``for p in target.parameters(): p.requires_grad =
    False``: the script's ``p`` still names the last one. One cause, one item: it was two, the second "`p` holds a
    graph". The truth: bare, the target's weights end with a graph."""
    (tmp_path / "byol.py").write_text(MOMENTUM_ENCODER)
    assert _python(tmp_path, "byol.py").stdout == "graph on the target: True\n"
    watched = _python(tmp_path, "-m", "backward_twice", "watch", "byol.py")
    assert "backward-twice: 1 thing to fix (4 iterations watched)" in watched.stdout, watched.stdout
    assert "1. `target`'s parameters hold a graph that grows every iteration" in watched.stdout


def _conditional_gan(recompute: bool) -> None:
    """MorvanZhou/PyTorch-Tutorial, tutorial-contents/406_conditional_GAN.py: G's loss is built from D's output on
    the fakes before ``opt_D.step()``, with ``retain_graph=True`` on D's backward ("reusing computational graph")."""
    torch.manual_seed(0)
    generator = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    discriminator = torch.nn.Sequential(torch.nn.Linear(9, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    for _ in range(2):
        labels = torch.randint(0, 2, (4, 1)).float()
        paintings = torch.cat((generator(torch.cat((torch.randn(4, 5), labels), 1)), labels), 1)
        prob_artist0 = torch.sigmoid(discriminator(torch.cat((torch.randn(4, 8), labels), 1)))
        prob_artist1 = torch.sigmoid(discriminator(paintings))
        d_score1 = torch.log(1.0 - prob_artist1)
        d_loss = -torch.mean(torch.log(prob_artist0) + d_score1)
        g_loss = torch.mean(d_score1)
        opt_d.zero_grad()
        d_loss.backward(retain_graph=True)
        opt_d.step()
        if recompute:  # the fix as printed: the three lines G's loss is computed through, after the step
            prob_artist1 = torch.sigmoid(discriminator(paintings))
            d_score1 = torch.log(1.0 - prob_artist1)
            g_loss = torch.mean(d_score1)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()


def test_a_loss_built_before_the_step_is_computed_again_with_the_lines_it_comes_through() -> None:
    """It said "compute line <prob_artist1> again after the step": done alone, ``g_loss`` is still the old forward's
    and the same error comes back. The truth: bare, the in-place error; with the three lines of G's loss (not D's
    loss between them) computed again after the step, it runs."""
    with pytest.raises(RuntimeError, match="inplace"):
        _conditional_gan(recompute=False)
    with pytest.raises(RuntimeError, match="inplace"), watch() as w:
        _conditional_gan(recompute=False)
    source, first = inspect.getsourcelines(_conditional_gan)
    at: dict[str, int] = {}
    for index, text in enumerate(source):  # each name's first assignment: the loop's own, not the fix's
        at.setdefault(text.strip().split(" =")[0], first + index)
    lines = f"lines {at['prob_artist1']}, {at['d_score1']} and {at['g_loss']}"
    assert w.report.items[0].fix.startswith(f"compute {lines} again after the step at line "), w.report.items[0].fix
    _conditional_gan(recompute=True)


class _TwoHeads(torch.nn.Module):
    """mosaicml/composer#1240 ("Support sequence of losses in backwards pass"): a model whose ``loss`` returns a tuple
    of losses from one forward, which the trainer walked with one backward each."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.head_a, self.head_b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.trunk(batch))
        return self.head_a(h).pow(2).mean(), self.head_b(h).pow(2).mean()


def _each_loss(model: _TwoHeads, summed: bool) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        outputs = model.loss(torch.randn(5, 4))
        if summed:  # the fix as printed
            sum(outputs).backward()
        else:
            for loss in outputs:
                loss.backward()
        optimizer.step()


def test_the_losses_of_one_forward_walked_one_by_one_are_summed_not_detached() -> None:
    """It said "build `loss` inside the loop ..., or use `loss.detach()` there": ``loss`` is the loop's own item, and
    detached it trains nothing ("element 0 of tensors does not require grad"). The truth: bare, the second loss's
    backward raises; summed, the loop runs, and the trunk gets both heads' gradients."""
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="second time"):
        _each_loss(_TwoHeads(), summed=False)
    with pytest.raises(RuntimeError, match="second time"), watch() as w:
        _each_loss(_TwoHeads(), summed=False)
    fix = w.report.items[0].fix
    assert fix.startswith("sum the losses and call backward() once (`sum(outputs).backward()`)"), fix
    assert "detach" not in fix
    _each_loss(_TwoHeads(), summed=True)


class _ShadowByName(torch.nn.Module):
    """The EMA of discuss.pytorch.org/t/how-to-apply-exponential-moving-average-decay-for-variables/10856, kept by
    name in a dict on a module (``register(name, param)``, then ``ema(name, param)`` each step), with the
    ``.data`` of the thread's answer left out."""

    def __init__(self) -> None:
        super().__init__()
        self.shadow: dict[str, torch.Tensor] = {}

    def register(self, name: str, value: torch.Tensor) -> None:
        self.shadow[name] = value.clone()

    def forward(self, name: str, value: torch.Tensor) -> torch.Tensor:
        self.shadow[name] = (0.9 * value + 0.1 * self.shadow[name]).clone()
        return self.shadow[name]


def test_a_graph_an_ema_kept_by_name_on_a_module_grows_is_a_note_at_its_update_line() -> None:
    """It was "healthy": a dict on a module was no place the names were read from; on a plain object the note named
    the ``register`` line before the loop. The truth: the shadow's graph reaches one more update each step."""
    weight = torch.randn(3, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    ema = _ShadowByName()
    ema.register("weight", weight)
    with watch() as w:
        for _ in range(8):
            optimizer.zero_grad()
            (weight**2).sum().backward()
            optimizer.step()
            ema("weight", weight)
    [item] = w.report.items
    assert item.label == "`ema.shadow['weight']` keeps one more iteration's graph alive every iteration", str(w)
    assert item.lines[0].code == "self.shadow[name] = (0.9 * value + 0.1 * self.shadow[name]).clone()", item.lines
    seen, todo = {}, [ema.shadow["weight"].grad_fn]  # the truth: a graph one update (3 nodes) bigger each step
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen[id(node)] = node
            todo += [child for child, _ in node.next_functions]
    assert len(seen) > 3 * 8


def test_a_retain_that_keeps_a_graph_and_walks_it_again_on_one_line_is_shown_once() -> None:
    """CLIP's learnable temperature (``logit_scale = model.logit_scale.exp()``) hoisted before the loop, with the
    forum's retain: the line ``loss.backward(retain_graph=True)`` was shown twice, once as keeping the old graph and
    once as walking it again. The truth: without the retain, iteration 2 raises."""
    torch.manual_seed(0)
    log_scale = torch.nn.Parameter(torch.tensor(2.0))
    encoder = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD([log_scale, *encoder.parameters()], lr=0.1)
    logit_scale = log_scale.exp()
    with watch() as w:
        for _ in range(3):
            logits = logit_scale * encoder(torch.randn(5, 4))
            loss = F.cross_entropy(logits, torch.arange(3).repeat(2)[:5])
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    places = [line.place for line in w.report.items[0].lines]
    assert len(places) == len(set(places)), str(w)
    assert w.report.items[0].lines[-1].label.endswith(", and walks it again in iteration 2"), str(w)
    with pytest.raises(RuntimeError, match="second time"):
        for _ in range(2):
            encoder.zero_grad()
            F.cross_entropy(logit_scale * encoder(torch.randn(5, 4)), torch.arange(3).repeat(2)[:5]).backward()


class _TrainsItself(torch.nn.Module):
    """The forum thread discuss.pytorch.org/t/6795's model: ``forward`` keeps ``self.hidden``, ``train_it`` runs the
    step with the answer's ``retain_graph=True``; its state's cell under ``torch.utils.checkpoint`` (reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.cell, self.out = torch.nn.Linear(3, 8), torch.nn.Linear(16, 8), torch.nn.Linear(8, 1)
        self.hidden = torch.zeros(4, 8)
        self.opt = torch.optim.SGD(self.parameters(), lr=0.01)

    def step_cell(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.cell(torch.cat([e, h], 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.inp(x)
        self.hidden = torch.utils.checkpoint.checkpoint(self.step_cell, e, self.hidden, use_reentrant=True)
        return self.out(self.hidden)

    def train_it(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self(x), y)
        self.opt.zero_grad()
        loss.backward(retain_graph=True)
        self.opt.step()
        return loss


def test_a_state_a_method_keeps_on_self_is_named_once_by_the_loops_name_for_the_object() -> None:
    """The fix was "add `model.hidden = model.hidden.detach()` and `self.hidden = self.hidden.detach()` at the end
    of each iteration" for a loop at a script's top level, where ``self`` is no name (NameError applied as printed):
    a later pass was first seen inside ``train_it``, which names the same tensor ``self.hidden``. The truth: with
    ``model.hidden = model.hidden.detach()`` at the end of each pass and no retain, the loop runs."""
    torch.manual_seed(0)
    model = _TrainsItself()
    batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
    with watch() as w:
        for x, y in batches:
            model.train_it(x, y)
    [item] = w.verdicts.carried
    assert item.name == "model.hidden" and "`self.hidden = self.hidden.detach()`" not in str(w), str(w)
    assert "`model.hidden = model.hidden.detach()` at the end of each iteration" in str(w), str(w)


class _ForwardForwardLayer(torch.nn.Linear):
    """pytorch/examples mnist_forward_forward/main.py's ``Layer``, with the ``.detach()`` of ``train``'s return
    left out: the next layer's loop reads the graph this layer's outputs were built with, every pass."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return torch.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(
        self, x_pos: torch.Tensor, x_neg: torch.Tensor, fixed: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(5):  # the published num_epochs is larger; 5 puts the raise past the passes read in full
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + 2.0, g_neg - 2.0]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if fixed:  # the tool's fix, as printed
                x_neg = x_neg.detach()
                x_pos = x_pos.detach()
        return self.forward(x_pos), self.forward(x_neg)


def test_a_parameter_of_the_function_whose_loop_raises_is_named_as_the_carrier() -> None:
    """Forward-forward without the detach: the second layer's loop raises in its second pass. It was "a tensor no
    name of yours holds carries ...", with a fix that names nothing, though the error's own walk reached the buffers
    through ``x_neg``. The truth: ``x_pos`` and ``x_neg`` are the first layer's outputs, with its graph; detached
    (the published code), the loop runs."""
    torch.manual_seed(0)
    layers = [_ForwardForwardLayer(8, 6), _ForwardForwardLayer(6, 6)]
    x_pos, x_neg = torch.rand(4, 8), torch.rand(4, 8)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        h_pos, h_neg = x_pos, x_neg
        for layer in layers:
            h_pos, h_neg = layer.train_layer(h_pos, h_neg)
    names = [item.name for item in w.verdicts.carried]
    assert names and set(names) <= {"x_pos", "x_neg"}, str(w)
    # both carry: a fix naming one alone raised again, at the other (the engine stops at the first freed node)
    both = (
        "`x_neg = x_neg.detach()` and `x_pos = x_pos.detach()`",
        "`x_pos = x_pos.detach()` and `x_neg = x_neg.detach()`",
    )
    assert any(f"fix: add {fixes} at the end of each iteration" in str(w) for fixes in both), str(w)
    h_pos, h_neg = x_pos, x_neg
    for layer in layers:
        h_pos, h_neg = layer.train_layer(h_pos, h_neg, fixed=True)


class _CycleGan:
    """junyanz/pytorch-CycleGAN-and-pix2pix, models/cycle_gan_model.py: ``forward`` builds ``self.fake_B`` and
    ``self.fake_A``, ``backward_G`` trains both generators, then ``backward_D_A`` and ``backward_D_B`` each call
    ``backward_D_basic(netD, real, fake)``, whose ``netD(fake.detach())`` is retyped without the ``.detach()``
    (``detached=False``), as learners copy it. Linear generators and discriminators."""

    def __init__(self, detached: bool) -> None:
        torch.manual_seed(0)
        self.detached = detached
        self.netG_A, self.netG_B = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
        self.netD_A, self.netD_B = torch.nn.Linear(6, 1), torch.nn.Linear(6, 1)
        self.optimizer_G = torch.optim.Adam([*self.netG_A.parameters(), *self.netG_B.parameters()], lr=2e-4)
        self.optimizer_D = torch.optim.Adam([*self.netD_A.parameters(), *self.netD_B.parameters()], lr=2e-4)

    def backward_D_basic(self, netD: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        loss_D_real = F.mse_loss(netD(real), torch.ones(4, 1))
        pred_fake = netD(fake.detach() if self.detached else fake)
        loss_D = (loss_D_real + F.mse_loss(pred_fake, torch.zeros(4, 1))) * 0.5
        loss_D.backward()
        return loss_D

    def optimize_parameters(self, real_A: torch.Tensor, real_B: torch.Tensor) -> None:
        self.fake_B, self.fake_A = self.netG_A(real_A), self.netG_B(real_B)
        self.optimizer_G.zero_grad()
        loss_G = F.mse_loss(self.netD_A(self.fake_B), torch.ones(4, 1)) + F.mse_loss(
            self.netD_B(self.fake_A), torch.ones(4, 1)
        )
        loss_G = loss_G + F.l1_loss(self.netG_B(self.fake_B), real_A) + F.l1_loss(self.netG_A(self.fake_A), real_B)
        loss_G.backward()
        self.optimizer_G.step()
        self.optimizer_D.zero_grad()
        self.backward_D_basic(self.netD_A, real_B, _query(self.fake_B))
        self.backward_D_basic(self.netD_B, real_A, _query(self.fake_A))
        self.optimizer_D.step()


def _query(images: torch.Tensor) -> torch.Tensor:
    """util/image_pool.py's ``ImagePool.query`` while its pool fills: each image unsqueezed and the batch concatenated,
    retyped without its ``.data`` (so ``fake`` is a new tensor on ``self.fake_B``'s graph)."""
    return torch.cat([torch.unsqueeze(image, 0) for image in images], 0)


def test_a_gan_d_loss_built_in_a_function_of_the_fake_detaches_the_functions_parameter() -> None:
    """CycleGAN without ``fake.detach()``: it said "use `self.fake_B.detach()` in the loss line ...", and applied,
    the next run raised at ``self.fake_A``. The truth: ``backward_D_basic``'s ``fake`` is both; detached there (the
    published code), the loop runs."""
    batches = [(torch.randn(4, 6), torch.randn(4, 6)) for _ in range(3)]
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        model = _CycleGan(detached=False)
        for real_A, real_B in batches:
            model.optimize_parameters(real_A, real_B)
    line = inspect.getsourcelines(_CycleGan.backward_D_basic)[1] + 4
    assert f"fix: use `fake.detach()` in the loss line {line}'s backward walks" in str(w), str(w)
    model = _CycleGan(detached=True)
    for real_A, real_B in batches:
        model.optimize_parameters(real_A, real_B)


def _reinforce_updated_twice_per_episode(fill_inside: bool) -> list[float]:
    """pytorch/examples#151: reinforce.py's ``finish_episode()`` called more than once on one episode's
    ``saved_log_probs``; ``fill_inside``: the printed fix, the episode's rollout moved into the update loop."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    saved_log_probs: list[torch.Tensor] = []
    rewards: list[float] = []

    def rollout() -> None:
        for _ in range(4):
            m = torch.distributions.Categorical(logits=policy(torch.randn(4)))
            action = m.sample()
            saved_log_probs.append(m.log_prob(action))
            rewards.append(float(action))

    def finish_episode() -> None:
        returns = torch.tensor(rewards)
        policy_loss = [-log_prob * r for log_prob, r in zip(saved_log_probs, returns)]
        optimizer.zero_grad()
        torch.stack(policy_loss).sum().backward()
        optimizer.step()

    for _ in range(2):
        if not fill_inside:
            rollout()
        for _ in range(2):
            if fill_inside:
                rollout()
            finish_episode()
            if fill_inside:
                del saved_log_probs[:], rewards[:]
        del saved_log_probs[:], rewards[:]
    return [value for parameter in policy.parameters() for value in parameter.flatten().tolist()]


def test_a_list_filled_before_the_update_loop_is_filled_inside_it_not_cleared_after_each_update() -> None:
    """The list the episode's rollout fills before a loop of updates on it: "clear `saved_log_probs` after each
    update" left the second update ``torch.stack([])`` (a ValueError). The truth: bare, the second update raises;
    clearing after each update raises; a retain raises the in-place error (the first step changed the weights the
    graph saved); with the rollout inside the update loop, as printed, it runs."""
    with pytest.raises(RuntimeError, match="backward through the graph a second time"), watch() as w:
        _reinforce_updated_twice_per_episode(fill_inside=False)
    text = str(w)
    assert "1. `saved_log_probs` carries the graph built before the loop into iteration 2" in text, text
    assert "fix: fill `saved_log_probs` inside the loop, so each backward walks items built in its own" in text, text
    assert "clear()" not in text, text
    assert len(_reinforce_updated_twice_per_episode(fill_inside=True)) == 10


DEEP_SVDD = """
import torch
import backward_twice as bt

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.LeakyReLU(), torch.nn.Linear(8, 4, bias=False))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
train_loader = [torch.randn(5, 6) for _ in range(3)]


def init_center_c(train_loader, net, eps=0.1):
    c = torch.zeros(4)
    for inputs in train_loader:
        c += torch.sum(net(inputs), dim=0)
    c /= 15
    return c


c = init_center_c(train_loader, net)


def step(inputs):
    optimizer.zero_grad()
    loss = torch.mean(torch.sum((net(inputs) - c) ** 2, dim=1))
    loss.backward()
    optimizer.step()


try:
    with bt.watch() as w:
        for inputs in train_loader:
            step(inputs)
except RuntimeError:
    pass
diagnosis = bt.diagnose(lambda: step(train_loader[0]), models=net, optimizers=optimizer)


def step_inline():
    optimizer.zero_grad()
    loss = torch.mean(torch.sum((net(train_loader[0]) - c) ** 2, dim=1))
    loss.backward()
    optimizer.step()


inline = bt.diagnose(step_inline, models=net, optimizers=optimizer)
"""


def test_a_center_a_function_sums_before_the_loop_gets_one_fix_from_the_watch_and_from_diagnose(tmp_path: Path) -> None:
    """Deep SVDD (lukasruff/Deep-SVDD-PyTorch, deepSVDD_trainer.py) with ``init_center_c`` run without
    ``torch.no_grad()``: the watch said "add `c = c.detach()` at the end of each iteration", ``bt.diagnose`` "compute
    `c` inside the loop (or `c = c.detach()`, ...)". The watch read the function's own ``c += ...`` as the module's
    ``c`` carrying itself on. One graph built before the loop, one fix."""
    path = tmp_path / "svdd.py"
    path.write_text(DEEP_SVDD)
    names = runpy.run_path(str(path))
    [watched] = [item for item in names["w"].report.items if item.kind == "carried"]
    [diagnosed] = [item for item in names["diagnosis"].report.items if item.kind == "carried"]
    assert watched.fix == diagnosed.fix == "compute `c` inside the loop (or `c = c.detach()`, if it needs no gradient)"
