"""The claims notebook 02_multi_loss states, asserted on its own model shape, so a change in torch or
in the helpers that breaks a claim fails `make test` even before anyone re-reads the notebook."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helpers as bt

SECOND_TIME = "backward through the graph a second time"


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU()
        )
        self.classify = torch.nn.Linear(64, 10)
        self.regress = torch.nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(x)
        return self.classify(features), self.regress(features)


@pytest.fixture
def setup():
    torch.manual_seed(0)
    net = TwoHeads()
    x, labels, targets = torch.randn(16, 32), torch.randint(0, 10, (16,)), torch.randn(16, 1)

    def two_losses():
        logits, value = net(x)
        return F.cross_entropy(logits, labels), F.mse_loss(value, targets)

    return net, two_losses


def test_two_plain_backwards_fail_in_either_order_and_retaining_the_first_works(setup) -> None:
    _, two_losses = setup
    for first, second in ((0, 1), (1, 0)):
        losses = two_losses()
        losses[first].backward()
        with pytest.raises(RuntimeError, match=SECOND_TIME):
            losses[second].backward()
        losses = two_losses()
        losses[first].backward(retain_graph=True)
        losses[second].backward()


def test_the_four_patterns_compute_the_same_gradients(setup) -> None:
    net, two_losses = setup
    params = list(net.parameters())

    def a():
        l1, l2 = two_losses()
        l1.backward(retain_graph=True)
        l2.backward()

    def b():
        l1, l2 = two_losses()
        (l1 + l2).backward()

    def c():
        torch.autograd.backward(list(two_losses()))

    def d():
        l1, l2 = two_losses()
        g1 = torch.autograd.grad(l1, params, retain_graph=True, allow_unused=True)
        g2 = torch.autograd.grad(l2, params, allow_unused=True)
        for p, one, two in zip(params, g1, g2):
            p.grad = (0 if one is None else one) + (0 if two is None else two)

    comparison = bt.compare_patterns({"a": a, "b": b, "c": c, "d": d}, net, reference="b", rounds=2, progress=False)
    assert all(comparison[name].close for name in "abcd")
    assert comparison["c"].bit_equal
    peaks = {comparison[name].peak_graph_only_bytes for name in "abcd"}
    assert len(peaks) == 1 and peaks.pop() > 0
    assert comparison["a"].profiler_peak_bytes > comparison["b"].profiler_peak_bytes


def test_a_backward_frees_only_the_buffers_on_its_own_path(setup) -> None:
    _, two_losses = setup
    meter = bt.SavedTensorMeter()
    with meter:
        l1, l2 = two_losses()
    l1.backward(retain_graph=True)
    l2.backward()
    assert meter.graph_only_bytes > 0, "l1's head keeps its buffers after l2's plain backward"
    del l1, l2
    assert meter.graph_only_bytes == 0
    with meter:
        l1, l2 = two_losses()
    (l1 + l2).backward()
    assert meter.graph_only_bytes == 0


def test_the_reuse_the_graph_example_needs_no_retain_graph() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    criterion = torch.nn.CrossEntropyLoss()
    inputs, labels = torch.randn(3, 10), torch.LongTensor([1, 0, 1])
    grads = []
    for retain in (True, False):
        net.zero_grad(set_to_none=True)
        loss = criterion(net(inputs), labels)
        loss.backward(retain_graph=retain)
        loss = criterion(net(inputs), labels)
        loss.backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_memory_grows_only_with_retained_graphs_kept_reachable_and_work_only_when_graphs_chain(setup) -> None:
    net, two_losses = setup
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(retain_graph: bool) -> torch.Tensor:
        optimizer.zero_grad()
        loss = sum(two_losses())
        loss.backward(retain_graph=retain_graph)
        optimizer.step()
        return loss

    def keep_total(state) -> None:
        state.total += step(True)

    chained = TwoHeads()
    x, labels, targets = torch.randn(16, 32), torch.randint(0, 10, (16,)), torch.randn(16, 1)

    def backward_the_total(state) -> None:
        chained.zero_grad()
        logits, value = chained(x)
        state.total = state.total + F.cross_entropy(logits, labels) + F.mse_loss(value, targets)
        state.total.backward(retain_graph=True)

    bodies = {
        "retain, tensor": lambda state: state.history.append(step(True)),
        "retain, value": lambda state: state.history.append(step(True).item()),
        "free, tensor": lambda state: state.history.append(step(False)),
        "free, value": lambda state: state.history.append(step(False).item()),
        "retain, sum": keep_total,
        "chained": backward_the_total,
    }
    result = bt.growth_experiment(bodies, iterations=40, block=10, progress=False)
    assert {name for name in bodies if result.grows(name)} == {"retain, tensor", "retain, sum", "chained"}
    assert len({result.growth_per_iteration(name) for name in ("retain, tensor", "retain, sum", "chained")}) == 1
    # What notebook 02 prints: only the chained loop's backward walks more nodes at every iteration.
    for name, nodes in result.backward_nodes.items():
        if name == "chained":
            assert nodes[-1] > 10 * nodes[0], nodes
        else:
            assert len(set(nodes)) == 1, (name, nodes)


def test_an_optimizer_step_breaks_a_backward_through_earlier_iterations(setup) -> None:
    net, two_losses = setup
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    total = 0.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        for _ in range(2):
            optimizer.zero_grad()
            total = total + sum(two_losses())
            total.backward(retain_graph=True)
            optimizer.step()


def test_is_grads_batched_gives_each_losss_gradient_in_one_call_and_frees_the_graph(setup) -> None:
    net, two_losses = setup
    params = list(net.parameters())
    l1, l2 = two_losses()
    separate = [torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True) for loss in (l1, l2)]
    batched = torch.autograd.grad(torch.stack([l1, l2]), params, grad_outputs=torch.eye(2), is_grads_batched=True)
    for index, grads in enumerate(separate):
        for both, one in zip(batched, grads):
            expected = torch.zeros_like(both[index]) if one is None else one
            torch.testing.assert_close(both[index], expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match=SECOND_TIME):
        l1.backward()


def retain_then_backward_and_sum(net, batch):
    """Notebook 02's patterns (a) and (b), both bound to one new random batch of ``batch`` samples."""
    x, labels, targets = torch.randn(batch, 32), torch.randint(0, 10, (batch,)), torch.randn(batch, 1)

    def losses():
        logits, value = net(x)
        return F.cross_entropy(logits, labels), F.mse_loss(value, targets)

    def a():
        l1, l2 = losses()
        l1.backward(retain_graph=True)
        l2.backward()

    def b():
        sum(losses()).backward()

    return {"a": a, "b": b}


def test_the_extra_peak_of_retain_then_backward_is_a_second_set_of_gradients_not_the_buffers(setup) -> None:
    net, _ = setup
    gradient_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    extra, buffers = {}, {}
    for batch in (4, 1024):
        patterns = retain_then_backward_and_sum(net, batch)
        run = bt.compare_patterns(patterns, net, reference="b", rounds=1, progress=False)
        extra[batch] = run["a"].profiler_peak_bytes - run["b"].profiler_peak_bytes
        buffers[batch] = run["b"].peak_graph_only_bytes
    assert buffers[4] < 0.2 * gradient_bytes < 0.5 * gradient_bytes < extra[4], (buffers, extra, gradient_bytes)
    assert extra[1024] - extra[4] < 0.5 * (buffers[1024] - buffers[4]), (buffers, extra)
