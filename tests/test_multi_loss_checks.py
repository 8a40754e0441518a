"""Notebook 02's exercise checks against a catalogue of answers a learner might write.

Every wrong answer must be rejected with a message that is true for it (asserted by a distinctive
part of it), every right answer accepted, and checking the same answer twice must give the same
verdict and text, leaving the random stream alone (tests/check_catalogue.py runs them).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from check_catalogue import catalogue_tests

from helpers.lessons.multi_loss import check_backward_both, check_two_loss_loop


def two_losses(net, x, labels, targets):  # the notebook's own
    logits, value = net(x)
    return F.cross_entropy(logits, labels), F.mse_loss(value, targets)


# -- exercise 1: a two-loss loop ------------------------------------------------------------------


def loop(backward, keep=lambda l1, l2: l1.item() + l2.item(), zero=None):
    """The exercise's loop with its backward calls, what it keeps, and where it zeroes .grad replaced."""

    def train_two_losses(net, batches):
        history = []
        if zero == "before the loop":
            net.zero_grad()
        for x, labels, targets in batches:
            if zero == "every batch":
                net.zero_grad()
            l1, l2 = two_losses(net, x, labels, targets)
            backward(l1, l2)
            history.append(keep(l1, l2))
        return history

    return train_two_losses


def retain_both(l1, l2):  # the exercise cell's backward calls
    l1.backward(retain_graph=True)
    l2.backward(retain_graph=True)


def retain_first(l1, l2):  # the notebook solution's alternative
    l1.backward(retain_graph=True)
    l2.backward()


def retain_first_l2(l1, l2):
    l2.backward(retain_graph=True)
    l1.backward()


def no_retain(l1, l2):
    l1.backward()
    l2.backward()


def summed(l1, l2):  # the notebook's solution
    (l1 + l2).backward()


def two_roots(l1, l2):
    torch.autograd.backward([l1, l2])


def overwrite_with_autograd_grad(l1, l2):
    params = list(_leaves(l1 + l2))
    for p, g in zip(params, torch.autograd.grad(l1 + l2, params)):
        p.grad = g


def _leaves(root):
    """The parameters a graph reaches, found by walking grad_fn (as a learner without `net` might)."""
    found, seen, todo = [], set(), [root.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            found.append(node.variable)
        todo.extend(fn for fn, _ in node.next_functions)
    return found


def backward_of_a_float(l1, l2):
    torch.tensor(float(l1 + l2), requires_grad=True).backward()  # a new leaf: nothing reaches the network


def loop_forward_twice(net, batches):
    history = []
    for x, labels, targets in batches:
        l1, _ = two_losses(net, x, labels, targets)
        _, l2 = two_losses(net, x, labels, targets)  # a second graph, built while the first is alive
        l1.backward()
        l2.backward()
        history.append(l1.item() + l2.item())
    return history


def loop_with_an_optimizer_step(net, batches):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    history = []
    for x, labels, targets in batches:
        l1, l2 = two_losses(net, x, labels, targets)
        (l1 + l2).backward()
        optimizer.step()
        history.append(l1.item() + l2.item())
    return history


def loop_retain_then_del(net, batches):
    history = []
    for x, labels, targets in batches:
        l1, l2 = two_losses(net, x, labels, targets)
        l1.backward(retain_graph=True)
        l2.backward()
        history.append(l1.item() + l2.item())
        del l1, l2  # l1's head goes now, not in the next forward
    return history


def loop_generator(net, batches):
    for x, labels, targets in batches:
        l1, l2 = two_losses(net, x, labels, targets)
        (l1 + l2).backward()
        yield l1.item() + l2.item()


# -- exercise 2: two losses, least memory ----------------------------------------------------------


def both_as_given(l1, l2):  # the exercise cell as given
    l1.backward(retain_graph=True)
    l2.backward()


def both_as_given_then_del(l1, l2):
    l1.backward(retain_graph=True)
    l2.backward()
    del l1, l2


def both_sum_retained(l1, l2):
    (l1 + l2).backward(retain_graph=True)


def both_mean(l1, l2):
    torch.stack([l1, l2]).mean().backward()


def both_second_pass_through_everything(l1, l2):
    l1.backward(retain_graph=True)
    torch.autograd.backward([l2, 0 * l1])  # walks the whole graph again, so it frees every buffer


def both_detached(l1, l2):
    (l1 + l2).detach().backward()


def both_twice(l1, l2):
    (l1 + l2).backward()
    (l1 + l2).backward()


notebook_params = list(torch.nn.Linear(2, 2).parameters())  # the notebook's global `params`, another network's


def both_with_the_notebooks_params(l1, l2):
    grads = torch.autograd.grad(l1 + l2, notebook_params)
    for p, g in zip(notebook_params, grads):
        p.grad = g


def both_overwrite(l1, l2):
    overwrite_with_autograd_grad(l1, l2)


# -- the catalogue ---------------------------------------------------------------------------------

WRONG = [
    # exercise 1
    pytest.param(
        check_two_loss_loop,
        loop(retain_both, keep=lambda l1, l2: l1 + l2),
        "The history holds tensors that carry a grad_fn: each one keeps its whole graph",
        id="ex1-as-given",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(retain_both),
        "During your loop, graphs held up to 130.5 KiB of buffers at once, 2.0x what one batch's graph holds",
        id="ex1-retain-both-numbers",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: (l1 + l2).backward(retain_graph=True)),
        "During your loop, graphs held up to 130.5 KiB",
        id="ex1-sum-retained",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(summed, keep=lambda l1, l2: l1 + l2),
        "The history holds tensors that carry a grad_fn",
        id="ex1-tensors-without-retain",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(summed, keep=lambda l1, l2: (l1 + l2).detach().requires_grad_()),
        "tensors that require grad: they carry no graph",
        id="ex1-detach-requires-grad",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(summed, keep=lambda l1, l2: l1.item()),
        "history[0] is not l1 + l2 of batch 0.",
        id="ex1-history-of-l1",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(summed, zero="every batch"),
        "The gradients are those of the last batch alone, not the gradient of l1 + l2 summed over the batches.",
        id="ex1-zero-grad-inside",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(summed, zero="before the loop"),
        "On a second call, with .grad holding the first call's gradients, the gradients are those of this "
        "call alone (what .grad held was discarded)",
        id="ex1-zero-grad-before-the-loop",
    ),
    pytest.param(
        check_two_loss_loop, loop(lambda l1, l2: l1.backward()), "The gradients are those of l1 alone", id="ex1-l1-only"
    ),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: ((l1 + l2) / 2).backward()),
        "The gradients are 0.50x the gradient of l1 + l2 summed over the batches.",
        id="ex1-mean",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(overwrite_with_autograd_grad),
        "those of the last batch alone",
        id="ex1-autograd-grad-overwrites",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(no_retain),
        "Your loop raised RuntimeError: Trying to backward through the graph a second time",
        id="ex1-no-retain",
    ),
    pytest.param(check_two_loss_loop, loop_generator, "yours returned a generator", id="ex1-generator"),
    pytest.param(check_two_loss_loop, lambda net, batches: None, "yours returned None", id="ex1-forgot-return"),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: (3 * (l1 + l2)).backward()),
        "The gradients are 3.00x the gradient of l1 + l2 summed over the batches.",
        id="ex1-3-times-the-sum",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(backward_of_a_float),
        "Every parameter's .grad is None: no gradient was left in .grad.",
        id="ex1-backward-of-a-float",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: (l1 + l2.detach()).backward()),
        "The gradients are those of l1 alone",
        id="ex1-l2-detached",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: (l1 + l2).data.backward()),
        "Your loop raised RuntimeError: element 0 of tensors does not require grad",
        id="ex1-data-backward",
    ),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: (l1 + l2).backward(create_graph=True)),
        "After your loop returned, graphs still hold",
        id="ex1-create-graph",
        marks=pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning"),
    ),
    pytest.param(
        check_two_loss_loop,
        loop_forward_twice,
        "During your loop, graphs held up to 130.5 KiB of buffers at once, 2.0x what one batch's graph holds",
        id="ex1-forward-twice",
    ),
    pytest.param(
        check_two_loss_loop,
        loop_with_an_optimizer_step,
        "history[1] is not l1 + l2 of batch 1.",
        id="ex1-optimizer-step",
    ),
    # exercise 2
    pytest.param(
        check_backward_both,
        both_as_given,
        "Right gradients, but while l1 and l2 are still referenced the graph holds 33.0 KiB of buffers",
        id="ex2-as-given",
    ),
    pytest.param(
        check_backward_both,
        both_as_given_then_del,
        "while l1 and l2 are still referenced the graph holds 33.0 KiB",
        id="ex2-as-given-then-del",
    ),
    pytest.param(
        check_backward_both,
        retain_first_l2,
        "while l1 and l2 are still referenced the graph holds 32.2 KiB",
        id="ex2-l2-first",
    ),
    pytest.param(
        check_backward_both,
        both_sum_retained,
        "while l1 and l2 are still referenced the graph holds 65.3 KiB",
        id="ex2-sum-retained",
    ),
    pytest.param(
        check_backward_both,
        lambda l1, l2: l1.backward(),
        "The gradients are those of l1 alone, not the gradient of l1 + l2.",
        id="ex2-l1-only",
    ),
    pytest.param(check_backward_both, both_mean, "The gradients are 0.50x the gradient of l1 + l2.", id="ex2-mean"),
    pytest.param(
        check_backward_both,
        both_second_pass_through_everything,
        "peak allocation (torch.profiler) is more than 1.1x that of one backward of l1 + l2: your function "
        "backpropagated through the shared trunk 2 times",
        id="ex2-two-passes-freeing-all",
    ),
    pytest.param(
        check_backward_both,
        both_detached,
        "Your function raised RuntimeError: element 0 of tensors does not require grad",
        id="ex2-detached",
    ),
    pytest.param(
        check_backward_both,
        both_twice,
        "Your function raised RuntimeError: Trying to backward through the graph a second time",
        id="ex2-sum-twice",
    ),
    pytest.param(
        check_backward_both,
        both_with_the_notebooks_params,
        "Your function raised RuntimeError: The differentiated Tensor at index 0 appears to not have been",
        id="ex2-notebook-params",
    ),
    pytest.param(
        check_backward_both,
        both_overwrite,
        "On a second call, with .grad holding the first call's gradients, the gradients are those of this "
        "call alone (what .grad held was discarded)",
        id="ex2-overwrites-grad",
    ),
    pytest.param(check_backward_both, "not a function", "Pass your function itself", id="ex2-not-a-function"),
    pytest.param(
        check_backward_both,
        lambda l1, l2: (3 * (l1 + l2)).backward(),
        "The gradients are 3.00x the gradient of l1 + l2.",
        id="ex2-3-times-the-sum",
    ),
    pytest.param(
        check_backward_both,
        backward_of_a_float,
        "Every parameter's .grad is None: no gradient was left in .grad.",
        id="ex2-backward-of-a-float",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(
        check_backward_both,
        lambda l1, l2: (l1 + l2.detach()).backward(),
        "The gradients are those of l1 alone, not the gradient of l1 + l2.",
        id="ex2-l2-detached",
    ),
    pytest.param(
        check_backward_both,
        lambda l1, l2: torch.autograd.backward([l1, l2], retain_graph=True),
        "Right gradients, but while l1 and l2 are still referenced the graph holds 65.3 KiB",
        id="ex2-two-roots-retained",
    ),
    pytest.param(
        check_backward_both,
        lambda l1, l2: (l1 + l2).backward(create_graph=True),
        ".grad carries a graph of its own (create_graph=True builds one)",
        id="ex2-create-graph",
        marks=pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning"),
    ),
]

RIGHT = [
    pytest.param(check_two_loss_loop, loop(summed), id="ex1-solution"),
    pytest.param(check_two_loss_loop, loop(retain_first), id="ex1-solution-alternative"),
    pytest.param(check_two_loss_loop, loop(retain_first_l2), id="ex1-retain-l2-first"),
    # float() keeps a number, as .item() does; torch 2.13 also warns that the sum requires grad.
    pytest.param(
        check_two_loss_loop,
        loop(two_roots, keep=lambda l1, l2: float(l1 + l2)),
        id="ex1-two-roots-float",
        marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning"),
    ),
    pytest.param(check_two_loss_loop, loop(summed, keep=lambda l1, l2: (l1 + l2).detach()), id="ex1-detach"),
    pytest.param(check_two_loss_loop, loop(summed, keep=lambda l1, l2: (l1 + l2).item()), id="ex1-item-of-sum"),
    pytest.param(check_two_loss_loop, loop(summed, keep=lambda l1, l2: (l1 + l2).data), id="ex1-data"),
    pytest.param(check_two_loss_loop, loop(summed, keep=lambda l1, l2: (l1 + l2).tolist()), id="ex1-tolist"),
    pytest.param(check_two_loss_loop, loop(lambda l1, l2: torch.stack([l1, l2]).sum().backward()), id="ex1-stack-sum"),
    pytest.param(
        check_two_loss_loop,
        loop(lambda l1, l2: torch.autograd.backward(l1 + l2)),
        id="ex1-autograd-backward-of-the-sum",
    ),
    pytest.param(check_two_loss_loop, loop_retain_then_del, id="ex1-retain-first-then-del"),
    pytest.param(check_backward_both, summed, id="ex2-solution"),
    pytest.param(check_backward_both, lambda l1, l2: torch.stack([l1, l2]).sum().backward(), id="ex2-stack-sum"),
    pytest.param(check_backward_both, lambda l1, l2: l1.add(l2).backward(), id="ex2-add-method"),
    pytest.param(check_backward_both, lambda l1, l2: (l1 + l2).backward(torch.tensor(1.0)), id="ex2-explicit-gradient"),
    pytest.param(
        check_backward_both,
        lambda l1, l2: torch.autograd.backward([l1, l2], grad_tensors=[torch.tensor(1.0), torch.tensor(1.0)]),
        id="ex2-two-roots-grad-tensors",
    ),
    pytest.param(check_backward_both, two_roots, id="ex2-two-roots"),
    pytest.param(check_backward_both, lambda l1, l2: sum([l1, l2]).backward(), id="ex2-builtin-sum"),
]


test_wrong_answer_is_rejected_for_its_true_reason, test_right_answer_is_accepted = catalogue_tests(WRONG, RIGHT)


def test_the_solutions_alternative_keeps_l1s_head_until_the_next_batch_and_is_still_accepted() -> None:
    summed_result = check_two_loss_loop(loop(summed))
    retained_result = check_two_loss_loop(loop(retain_first))
    assert "never more than one graph's buffers" in summed_result.message
    assert "at most 1.5x one graph's buffers" in retained_result.message
