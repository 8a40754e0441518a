"""Notebook 03's exercise checks against a catalogue of answers a learner would write.

Every WRONG answer is a real step (or penalty) function with one mistake, and must be rejected with
a message that names that mistake; every RIGHT answer is another correct way to write the step and
must be accepted. Each verdict must be the same when the same answer is checked twice. The starting
code of each exercise cell is here too, with the exact text the notebook prints for it.
"""

from __future__ import annotations

import pytest
import torch
from check_catalogue import ZEROED, ZEROED_WAYS
from gan_steps import d_loss_fn, g_loss_fn
from gan_steps import inputs_step as single_forward_inputs  # exercise 2's solution
from gan_steps import moved_step as d_step_after_g_backward
from gan_steps import single_forward_step as single_forward_autograd_grad  # exercise 1 allows autograd.grad
from gan_steps import srgan_step as srgan_start  # exercise 1's starting code
from torch.autograd import grad as imported_grad  # a name bound before the check starts

import helpers.lessons.gan_step.watch as watch
from helpers.lessons.gan_step import check_fixed_srgan_step, check_gradient_penalty, check_single_forward_step

pytestmark = pytest.mark.usefixtures("one_thread")


def verdict(check, answer):
    """Check an answer twice: the verdict must not depend on having been checked before."""
    first, second = check(answer), check(answer)
    assert (first.passed, first.message, first.hint) == (second.passed, second.message, second.hint)
    return first


# -- exercise 1: the copied SRGAN step, fixed ---------------------------------------------------------


def fixed_solution(netG, netD, optimizerG, optimizerD, real, z):  # the notebook's solution
    netD.zero_grad()
    fake = netG(z)
    real_out, fake_out = netD(real), netD(fake.detach())
    d_loss = d_loss_fn(real_out, fake_out)
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_optimizer_zero_grad(netG, netD, optimizerG, optimizerD, real, z):
    optimizerD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    optimizerG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_zero_to_zeros(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad(set_to_none=False)
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad(set_to_none=False)
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_zero_both_first(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_grads_set_to_none_by_hand(netG, netD, optimizerG, optimizerD, real, z):
    for parameter in [*netD.parameters(), *netG.parameters()]:
        parameter.grad = None
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_autograd_backward(netG, netD, optimizerG, optimizerD, real, z):
    optimizerD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    torch.autograd.backward(d_loss)
    optimizerD.step()
    optimizerG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    torch.autograd.backward([g_loss], grad_tensors=[torch.ones_like(g_loss)])
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def fixed_one_batched_d_pass(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    out = netD(torch.cat([real, fake.detach()]))
    d_loss = d_loss_fn(out[: len(real)], out[len(real) :])
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def never_zeroes(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def never_zeroes_g(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def zeroes_at_the_end(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    optimizerD.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    optimizerG.zero_grad()
    optimizerD.zero_grad()
    return d_loss.item(), g_loss.item()


def retain_on_d_backward(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward(retain_graph=True)
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def retain_on_last_backward(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward(retain_graph=True)
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def g_loss_on_detached_fake(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z).detach()
    d_loss = d_loss_fn(netD(real), netD(fake))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def zero_grad_after_backward(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    netD.zero_grad()
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    netG.zero_grad()
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def zero_grad_to_zeros_after_backward(netG, netD, optimizerG, optimizerD, real, z):
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    netD.zero_grad(set_to_none=False)
    optimizerD.step()
    g_loss = g_loss_fn(netD(fake))
    netG.zero_grad()
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def d_step_twice(netG, netD, optimizerG, optimizerD, real, z):
    fixed_solution(netG, netD, optimizerG, optimizerD, real, z)
    optimizerD.step()


def forgets_g_step(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    return d_loss.item(), g_loss.item()


def no_retain_no_detach(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def d_backward_twice(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward(retain_graph=True)
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def name_typo(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netg(z)  # noqa: F821 - the typo is the point
    return fake


class LearnerError(Exception):
    pass


def raises_own_exception(*args):
    raise LearnerError("my own error")


def exits(*args):
    raise SystemExit(1)


def str_fails(*args):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no text")

    raise Unprintable()


class ClearsThenSteps:
    """An optimizer as a learner's helper uses it: ``step()`` first clears .grad with ``clear(optimizer, network)``
    (tests/check_catalogue.py's ZEROED_WAYS), then steps."""

    def __init__(self, optimizer, network, clear):
        self.optimizer, self.network, self.clear = optimizer, network, clear

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)

    def step(self):
        self.clear(self.optimizer, self.network)
        self.optimizer.step()


def clearing(solution):
    """``solution`` (a step function) whose optimizers clear .grad between its backward and their step."""

    def with_clear(clear):
        def step(netG, netD, optimizerG, optimizerD, real, z):
            cleared = ClearsThenSteps(optimizerG, netG, clear), ClearsThenSteps(optimizerD, netD, clear)
            return solution(netG, netD, *cleared, real, z)

        return step

    return with_clear


def zeroed_steps(with_clear):
    """Each way of clearing .grad between backward and step (tests/check_catalogue.py), in ``with_clear(clear)``."""
    return [
        pytest.param(with_clear(clear), ["optimizerD.step() and optimizerG.step() " + ZEROED], id=name)
        for name, clear in ZEROED_WAYS.items()
    ]


def right_only_the_first_time(later=d_step_after_g_backward):
    """A step that keeps state between calls: right on its first call, then ``later`` (D's step moves)."""
    calls = []

    def step(netG, netD, optimizerG, optimizerD, real, z):
        calls.append(None)
        chosen = fixed_solution if len(calls) == 1 else later
        return chosen(netG, netD, optimizerG, optimizerD, real, z)

    return step


SRGAN_START_MESSAGE = (
    "✗ Not yet. Your step raised RuntimeError: one of the variables needed for gradient computation has been "
    "modified by an inplace operation: [torch.FloatTensor [32, 1]], which is output 0 of AsStrided, is at version "
    "2; expected version 1 instead.\n"
    "  Hint: optimizerD.step() changed D's weights in place while a graph still needed the old ones: compute every "
    "gradient that needs D's current weights before D's step."
)

# A step on .grad cleared after its backward (issue 26): named so, with where zero_grad() belongs.
ZEROED_D_ONLY = ["optimizerD.step() ran on zeroed gradients", "so the weights did not change at that step"]
EXERCISE_1_WRONG = [
    pytest.param(
        never_zeroes,
        ["second call in a row", "D's and G's optimizers", "nothing cleared D's and G's .grad before the backward"],
        id="never-zero-grad",
    ),
    pytest.param(
        never_zeroes_g,
        [
            "G's optimizer received twice the reference gradient, the sum of two steps' "
            "gradients: nothing cleared G's .grad"
        ],
        id="never-zero-grad-G",
    ),
    pytest.param(
        zeroes_at_the_end,
        ["when .grad already holds values", "clears .grad after using it"],
        id="zero-grad-only-at-the-end",
    ),
    pytest.param(
        d_step_after_g_backward,
        ["SILENTLY WRONG", "D's optimizer received the gradient of d_loss + g_loss"],
        id="d-step-after-g-backward",
    ),
    pytest.param(retain_on_d_backward, ["Right gradients, but the graphs held up to"], id="needless-retain"),
    pytest.param(
        retain_on_last_backward,
        ["the last backward of your step keeps its graph's buffers (retain_graph=True)"],
        id="retain-on-last-backward",
    ),
    pytest.param(g_loss_on_detached_fake, ["G's optimizer found no gradient at all"], id="g-loss-on-fake-detach"),
    pytest.param(zero_grad_after_backward, ZEROED_D_ONLY, id="zero-grad-after-backward"),
    pytest.param(zero_grad_to_zeros_after_backward, ZEROED_D_ONLY, id="zero-grad-to-zeros-after-backward"),
    *zeroed_steps(clearing(fixed_solution)),
    pytest.param(d_step_twice, ["calls optimizerD.step() 2 times"], id="d-step-twice"),
    pytest.param(forgets_g_step, ["never calls optimizerG.step()"], id="forgets-g-step"),
    pytest.param(no_retain_no_detach, ["backward through the graph a second time"], id="second-backward"),
    pytest.param(
        d_backward_twice,
        ["gradient of 2 × d_loss: 2 times d_loss's, as 2 backward passes of d_loss into D give"],
        id="d-backward-twice",
    ),
    pytest.param(name_typo, ["Your step raised NameError: name 'netg' is not defined"], id="name-error"),
    pytest.param(raises_own_exception, ["Your step raised LearnerError: my own error"], id="own-exception"),
    pytest.param(exits, ["Your step raised SystemExit"], id="system-exit"),
    pytest.param(str_fails, ["Your step raised Unprintable"], id="unprintable-exception"),
    pytest.param("fixed_step", ["Pass your step function itself"], id="not-a-function"),
]

EXERCISE_1_RIGHT = [
    pytest.param(fixed_solution, id="notebook-solution"),
    pytest.param(fixed_optimizer_zero_grad, id="optimizer-zero-grad"),
    pytest.param(fixed_zero_to_zeros, id="zero-grad-set-to-none-false"),
    pytest.param(fixed_zero_both_first, id="zero-both-at-the-start"),
    pytest.param(fixed_grads_set_to_none_by_hand, id="grad-none-by-hand"),
    pytest.param(fixed_autograd_backward, id="torch-autograd-backward"),
    pytest.param(fixed_one_batched_d_pass, id="one-batched-d-pass"),
    pytest.param(single_forward_autograd_grad, id="single-forward-autograd-grad"),
    pytest.param(single_forward_inputs, id="single-forward-inputs"),
]


def test_a_step_that_changes_between_calls_is_caught_on_a_later_call():
    result = check_fixed_srgan_step(right_only_the_first_time())
    assert not result and "Right on a first call, but called again from empty .grad, D's optimizer" in result.message
    for name, clear in ZEROED_WAYS.items():
        result = check_fixed_srgan_step(right_only_the_first_time(later=clearing(fixed_solution)(clear)))
        assert not result, name
        assert result.message.startswith("Right on a first call, but called again from empty .grad, optimizerD.step()")
        assert ZEROED in result.message, name


# -- exercise 2: one pass of D, with backward(inputs=...) ---------------------------------------------


def one_pass_start(netG, netD, optimizerG, optimizerD, real, z):  # the exercise cell's starting code
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(retain_graph=True)
    g_loss.backward()
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_optimizer_zero_grad(netG, netD, optimizerG, optimizerD, real, z):
    optimizerD.zero_grad()
    optimizerG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_zero_to_zeros_after_forward(netG, netD, optimizerG, optimizerD, real, z):
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    netD.zero_grad(set_to_none=False)
    netG.zero_grad(set_to_none=False)
    d_loss.backward(inputs=tuple(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=tuple(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_autograd_backward(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    torch.autograd.backward(d_loss, inputs=list(netD.parameters()), retain_graph=True)
    torch.autograd.backward(g_loss, inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_g_first(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    g_loss.backward(inputs=list(netG.parameters()), retain_graph=True)
    d_loss.backward(inputs=list(netD.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_batched(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    out = netD(torch.cat([real, netG(z)]))
    real_out, fake_out = out[: len(real)], out[len(real) :]
    d_loss, g_loss = d_loss_fn(real_out, fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_imported_grad(netG, netD, optimizerG, optimizerD, real, z):
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    for net, loss, keep in ((netD, d_loss, True), (netG, g_loss, False)):
        params = list(net.parameters())
        for parameter, gradient in zip(params, imported_grad(loss, params, retain_graph=keep)):
            parameter.grad = gradient
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_functional_vjp(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    # G's gradient through the functional API, which calls torch.autograd.grad inside
    fake = netG(z)
    _, (fake_grad,) = torch.autograd.functional.vjp(lambda f: g_loss_fn(netD(f)), (fake.detach(),))
    fake.backward(fake_grad, inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_second_d_pass(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    g_loss = g_loss_fn(netD(fake))
    d_loss.backward()
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_second_d_pass_by_forward(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    g_loss = g_loss_fn(netD.forward(fake))  # .forward() skips the module's own hooks
    d_loss.backward()
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_inputs_swapped(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netG.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netD.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_d_inputs_both_nets(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=[*netD.parameters(), *netG.parameters()], retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_never_zeroes(netG, netD, optimizerG, optimizerD, real, z):
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_zeroes_at_the_end(netG, netD, optimizerG, optimizerD, real, z):
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    netD.zero_grad()
    netG.zero_grad()
    return d_loss.item(), g_loss.item()


def one_pass_d_step_between(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    optimizerD.step()
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_no_retain(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()))
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_retains_both(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()), retain_graph=True)
    optimizerD.step()
    optimizerG.step()
    return d_loss.item(), g_loss.item()


def one_pass_forgets_g_step(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake_out = netD(netG(z))
    d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)
    g_loss.backward(inputs=list(netG.parameters()))
    optimizerD.step()
    return d_loss.item(), g_loss.item()


ONE_PASS_START_MESSAGE = (
    "✗ Not yet. SILENTLY WRONG: no error was raised, but the discriminator (D) gradient 171% off and the generator "
    "(G) gradient 90% off. Both optimizers would step in wrong directions. D's optimizer received the gradient of "
    "d_loss + g_loss, not of d_loss alone. G's optimizer received the gradient of d_loss + g_loss, not of g_loss "
    "alone.\n"
    "  Hint: D's gradient must come from d_loss alone (fake term on fake.detach() or through inputs=), G's from "
    "g_loss alone. Is a backward adding into the other network's .grad?"
)

EXERCISE_2_WRONG = [
    pytest.param(single_forward_autograd_grad, ["your step calls torch.autograd.grad (2 times"], id="autograd-grad"),
    pytest.param(
        one_pass_imported_grad, ["your step calls torch.autograd.grad (2 times"], id="autograd-grad-imported-before"
    ),
    pytest.param(
        one_pass_functional_vjp,
        ["your step calls torch.autograd.grad (1 time,", "through a function built on it"],
        id="autograd-functional-vjp",
    ),
    pytest.param(one_pass_second_d_pass, ["netD ran 3 times"], id="second-d-pass"),
    pytest.param(one_pass_second_d_pass_by_forward, ["netD ran 3 times"], id="second-d-pass-by-forward"),
    pytest.param(fixed_solution, ["netD ran 3 times"], id="standard-step"),
    pytest.param(
        one_pass_inputs_swapped,
        [
            "D's optimizer received the gradient of g_loss instead of d_loss's",
            "G's optimizer received the gradient of d_loss instead of g_loss's",
        ],
        id="inputs-list-the-wrong-net",
    ),
    pytest.param(
        one_pass_d_inputs_both_nets,
        ["G's optimizer received the gradient of d_loss + g_loss"],
        id="d-inputs-list-both-nets",
    ),
    pytest.param(
        one_pass_never_zeroes, ["nothing cleared D's and G's .grad before the backward"], id="never-zero-grad"
    ),
    pytest.param(one_pass_zeroes_at_the_end, ["clears .grad after using it"], id="zero-grad-only-at-the-end"),
    pytest.param(one_pass_d_step_between, ["modified by an inplace operation"], id="d-step-between-backwards"),
    pytest.param(one_pass_no_retain, ["backward through the graph a second time"], id="no-retain"),
    pytest.param(
        one_pass_retains_both,
        ["the last backward of your step keeps its graph's buffers"],
        id="retain-on-last-backward",
    ),
    pytest.param(one_pass_forgets_g_step, ["never calls optimizerG.step()"], id="forgets-g-step"),
    *zeroed_steps(clearing(single_forward_inputs)),
    pytest.param(name_typo, ["NameError"], id="name-error"),
    pytest.param(raises_own_exception, ["LearnerError: my own error"], id="own-exception"),
    pytest.param(None, ["Pass your step function itself"], id="not-a-function"),
]

EXERCISE_2_RIGHT = [
    pytest.param(single_forward_inputs, id="notebook-solution"),
    pytest.param(one_pass_optimizer_zero_grad, id="optimizer-zero-grad"),
    pytest.param(one_pass_zero_to_zeros_after_forward, id="zero-grad-set-to-none-false-after-forward"),
    pytest.param(one_pass_autograd_backward, id="torch-autograd-backward"),
    pytest.param(one_pass_g_first, id="g-loss-backward-first"),
    pytest.param(one_pass_batched, id="one-batched-d-pass"),
]


# -- exercise 3: a gradient penalty that does something ---------------------------------------------


def penalty_start(netD, real, fake, alpha):  # the exercise cell's starting code
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, retain_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_solution(netD, real, fake, alpha):  # the notebook's solution
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_grad_outputs(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = netD(mixed)
    (grad,) = torch.autograd.grad(out, mixed, grad_outputs=torch.ones_like(out), create_graph=True, retain_graph=True)
    return ((grad.norm(2, dim=1) - 1) ** 2).mean()


def penalty_lerp_vector_norm(netD, real, fake, alpha):
    mixed = torch.lerp(fake, real, alpha).detach().requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((torch.linalg.vector_norm(grad, dim=1) - 1) ** 2).mean()


def penalty_by_hand_norm(netD, real, fake, alpha):
    mixed = alpha * real + (1 - alpha) * fake
    mixed.requires_grad_()
    grad = imported_grad(netD(mixed).sum(), mixed, create_graph=True)[0]
    return (grad.pow(2).sum(dim=1).sqrt() - 1).pow(2).mean()


def penalty_functional_vjp(netD, real, fake, alpha):
    mixed = alpha * real + (1 - alpha) * fake
    _, grad = torch.autograd.functional.vjp(lambda x: netD(x).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_detached_leaf(netD, real, fake, alpha):
    return penalty_solution(netD, real, fake, alpha).detach().requires_grad_()


def penalty_grad_detached(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.detach().norm(dim=1) - 1) ** 2).mean()


def penalty_under_no_grad(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    with torch.no_grad():
        return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_wrong_tensor(netD, real, fake, alpha):
    fake.requires_grad_()
    mixed = alpha * real + (1 - alpha) * fake
    (grad,) = torch.autograd.grad(netD(mixed).sum(), fake, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_forgets_requires_grad(netD, real, fake, alpha):
    mixed = alpha * real + (1 - alpha) * fake
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_no_alpha(netD, real, fake, alpha):
    mixed = ((real + fake) / 2).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_own_alpha(netD, real, fake, alpha):
    alpha = torch.rand(len(real), 1)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_item(netD, real, fake, alpha):
    return penalty_solution(netD, real, fake, alpha).item()


def penalty_per_sample(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return (grad.norm(dim=1) - 1) ** 2


def penalty_whole_batch_norm(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return (grad.norm() - 1) ** 2


def penalty_output_mean(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).mean(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_backward_inside(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    netD(mixed).sum().backward(create_graph=True)
    return ((mixed.grad.norm(dim=1) - 1) ** 2).mean()


def penalty_freezes_d(netD, real, fake, alpha):
    for parameter in netD.parameters():
        parameter.requires_grad_(False)
    return penalty_solution(netD, real, fake, alpha)


def penalty_weights_frozen_then_restored(netD, real, fake, alpha):
    # the right value, computed with D's weights frozen; the only path to them adds zero
    for parameter in netD.parameters():
        parameter.requires_grad_(False)
    value = penalty_solution(netD, real, fake, alpha)
    for parameter in netD.parameters():
        parameter.requires_grad_(True)
    return value + 0 * sum(parameter.sum() for parameter in netD.parameters())


def penalty_mixes_in_place(netD, real, fake, alpha):
    mixed = real.mul_(alpha).add_((1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_right_once(netD, real, fake, alpha, _calls=[0]):  # noqa: B006 - the state is the bug
    _calls[0] += 1
    value = penalty_solution(netD, real, fake, alpha)
    return value if _calls[0] % 2 == 1 else value.detach()


def penalty_raises(netD, real, fake, alpha):
    raise KeyError("mixed")


PENALTY_START_MESSAGE = (
    "✗ Not yet. The value is right, but the penalty is a constant: no gradient reaches D's weights, so adding it to "
    "d_loss changes nothing.\n"
    "  Hint: retain_graph=True keeps buffers; only create_graph=True records the gradient computation itself so it "
    "can be differentiated."
)

EXERCISE_3_WRONG = [
    pytest.param(penalty_detached_leaf, ["leaf tensor with no grad_fn"], id="detach-requires-grad"),
    pytest.param(
        penalty_grad_detached, ["you used create_graph=True, but the penalty is a constant"], id="gradient-detached"
    ),
    pytest.param(
        penalty_under_no_grad, ["you used create_graph=True, but the penalty is a constant"], id="penalty-under-no-grad"
    ),
    pytest.param(penalty_wrong_tensor, ["The penalty is", "expected"], id="gradient-wrt-fake"),
    pytest.param(penalty_forgets_requires_grad, ["does not require grad"], id="forgets-requires-grad"),
    pytest.param(penalty_no_alpha, ["The penalty is", "expected"], id="mixed-without-alpha"),
    pytest.param(penalty_own_alpha, ["two different penalties for the same batch"], id="draws-its-own-alpha"),
    pytest.param(penalty_item, ["not a float (.item() and float() drop the graph)"], id="returns-item"),
    pytest.param(penalty_per_sample, ["returned shape (64,)"], id="per-sample-penalties"),
    pytest.param(penalty_whole_batch_norm, ["The penalty is", "expected"], id="norm-over-the-whole-batch"),
    pytest.param(penalty_output_mean, ["The penalty is", "expected"], id="mean-of-d-output"),
    pytest.param(
        penalty_backward_inside,
        ["left values in D's .grad"],
        id="backward-inside",
        marks=pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True"),
    ),
    pytest.param(penalty_freezes_d, ["switched off requires_grad on D's weights"], id="freezes-d"),
    pytest.param(
        penalty_weights_frozen_then_restored,
        ["gradient for D's", "differs from the reference"],
        id="weights-frozen-while-computing",
    ),
    pytest.param(penalty_mixes_in_place, ["changed real in place"], id="mixes-in-place"),
    pytest.param(penalty_right_once, ["Right on the first call, but not on the second"], id="right-only-once"),
    pytest.param(penalty_raises, ["Your function raised KeyError: 'mixed'"], id="raises"),
    pytest.param(lambda *args: 0.5, ["not a float"], id="returns-a-number"),
    pytest.param("gradient_penalty", ["Pass your function itself"], id="not-a-function"),
]

EXERCISE_3_RIGHT = [
    pytest.param(penalty_solution, id="notebook-solution"),
    pytest.param(penalty_grad_outputs, id="grad-outputs-and-retain"),
    pytest.param(penalty_lerp_vector_norm, id="lerp-and-vector-norm"),
    pytest.param(penalty_by_hand_norm, id="imported-grad-and-norm-by-hand"),
    pytest.param(penalty_functional_vjp, id="functional-vjp"),
]


# -- more answers a learner would write, for all three exercises ---------------------------------------


def triple_d_loss(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    (3 * d_loss).backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()


def g_loss_on_fake_data(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.detach()))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake.data))  # .data cuts G off, as .detach() does
    g_loss.backward()
    optimizerG.step()


def retain_instead_of_detach(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake))
    d_loss.backward(retain_graph=True)  # keeps G's buffers for g_loss, whose fresh D pass needs them
    optimizerD.step()
    netG.zero_grad()
    g_loss = g_loss_fn(netD(fake))
    g_loss.backward()
    optimizerG.step()


def g_step_first(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    netG.zero_grad()
    fake = netG(z)
    g_loss_fn(netD(fake)).backward()  # also adds g_loss's gradient into D's .grad
    optimizerG.step()
    d_loss_fn(netD(real), netD(fake.detach())).backward()
    optimizerD.step()


def d_loss_on_fake_data(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss = d_loss_fn(netD(real), netD(fake.data))
    d_loss.backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss_fn(netD(fake)).backward()
    optimizerG.step()


def fresh_fake_for_each_loss(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    d_loss_fn(netD(real), netD(netG(z).detach())).backward()
    optimizerD.step()
    netG.zero_grad()
    g_loss_fn(netD(netG(z))).backward()  # an extra G forward: the same fake, at learning rate 0 or not
    optimizerG.step()


def d_loss_through_inputs(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss_fn(netD(real), netD(fake)).backward(inputs=list(netD.parameters()))  # walks D only: G's buffers stay
    optimizerD.step()
    netG.zero_grad()
    g_loss_fn(netD(fake)).backward()
    optimizerG.step()


def d_frozen_for_g(netG, netD, optimizerG, optimizerD, real, z):
    netD.zero_grad()
    fake = netG(z)
    d_loss_fn(netD(real), netD(fake.detach())).backward()
    optimizerD.step()
    netD.requires_grad_(False)  # g_loss's backward then adds nothing into D
    netG.zero_grad()
    g_loss_fn(netD(fake)).backward()
    optimizerG.step()
    netD.requires_grad_(True)


def one_pass(
    d_backward,
    g_backward,
    zero=lambda netG, netD: (netD.zero_grad(), netG.zero_grad()),
    detach_fake=False,
    order="D, G",
):
    """Exercise 2's step with its backward calls, its zeroing and the fake batch's detach replaced."""

    def step(netG, netD, optimizerG, optimizerD, real, z):
        zero(netG, netD)
        fake = netG(z)
        fake_out = netD(fake.detach() if detach_fake else fake)
        d_loss, g_loss = d_loss_fn(netD(real), fake_out), g_loss_fn(fake_out)
        if order == "D, G":
            d_backward(d_loss, netD, netG)
            g_backward(g_loss, netD, netG, fake)
            optimizerD.step()
            optimizerG.step()
        else:  # G's backward and step first; D's graph saved only fake, not G's weights
            g_backward(g_loss, netD, netG, fake)
            optimizerG.step()
            d_backward(d_loss, netD, netG)
            optimizerD.step()

    return step


def d_into_d(d_loss, netD, netG):
    d_loss.backward(inputs=list(netD.parameters()), retain_graph=True)


def g_into_g(g_loss, netD, netG, fake):
    g_loss.backward(inputs=list(netG.parameters()))


def d_into_d_then_zero(d_loss, netD, netG):
    d_into_d(d_loss, netD, netG)
    netD.zero_grad()


def penalty_gradient(netD, real, fake, alpha, data=False):
    mixed = alpha * real + (1 - alpha) * fake
    mixed = (mixed.data if data else mixed).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return grad


def penalty_of(norm_term):
    """A penalty from D's gradient at the mixed points, with the term averaged replaced."""
    return lambda netD, real, fake, alpha: norm_term(penalty_gradient(netD, real, fake, alpha).norm(dim=1)).mean()


def penalty_on_detached_points(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    (grad,) = torch.autograd.grad(netD(mixed.detach()).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_from_torch_func(netD, real, fake, alpha):
    grad = torch.func.grad(lambda points: netD(points).sum())(alpha * real + (1 - alpha) * fake)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


def penalty_after_an_extra_forward(netD, real, fake, alpha):
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
    netD(mixed)  # a graph nobody uses: it goes when the function returns
    (grad,) = torch.autograd.grad(netD(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(dim=1) - 1) ** 2).mean()


FLOAT_WARNING = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning")

EXERCISE_1_WRONG += [
    pytest.param(
        triple_d_loss,
        ["D's optimizer received the gradient of 3 × d_loss: 3 times d_loss's", "or one pass of 3 × d_loss"],
        id="3-times-d-loss",
    ),
    pytest.param(g_loss_on_fake_data, ["G's optimizer found no gradient at all"], id="g-loss-on-fake-data"),
    pytest.param(
        retain_instead_of_detach,
        ["Right gradients, but the graphs held up to 129.5 KiB during your step; the standard step needs 96.5 KiB."],
        id="retain-instead-of-detach",
    ),
    pytest.param(
        g_step_first, ["D's optimizer received the gradient of d_loss + g_loss, not of d_loss alone"], id="g-step-first"
    ),
]
EXERCISE_1_RIGHT += [
    pytest.param(d_loss_on_fake_data, id="d-loss-on-fake-data"),
    pytest.param(fresh_fake_for_each_loss, id="extra-g-forward"),
    pytest.param(d_loss_through_inputs, id="d-loss-with-inputs"),
    pytest.param(d_frozen_for_g, id="d-frozen-for-g-loss"),
]
EXERCISE_2_WRONG += [
    pytest.param(
        one_pass(
            lambda d_loss, netD, netG: (3 * d_loss).backward(inputs=list(netD.parameters()), retain_graph=True),
            g_into_g,
        ),
        ["D's optimizer received the gradient of 3 × d_loss"],
        id="3-times-d-loss",
    ),
    pytest.param(
        one_pass(
            d_into_d, lambda g_loss, netD, netG, fake: g_loss.backward(inputs=list(netD.parameters())), detach_fake=True
        ),
        ["D's optimizer received the gradient of d_loss + g_loss", "G's optimizer found no gradient at all"],
        id="fake-detached",
    ),
    pytest.param(
        one_pass(d_into_d_then_zero, g_into_g),
        ["D's optimizer found no gradient at all"],
        id="zero-grad-between-the-backwards",
    ),
    pytest.param(
        one_pass(d_into_d, lambda g_loss, netD, netG, fake: torch.tensor(float(g_loss), requires_grad=True).backward()),
        ["G's optimizer found no gradient at all"],
        id="backward-of-a-float",
        marks=FLOAT_WARNING,
    ),
    pytest.param(
        one_pass(d_into_d, lambda g_loss, netD, netG, fake: g_loss.backward(inputs=[fake])),
        ["G's optimizer found no gradient at all"],
        id="g-inputs-fake",
    ),
]
EXERCISE_2_RIGHT += [
    pytest.param(
        one_pass(
            lambda d_loss, netD, netG: d_loss.backward(inputs=tuple(netD.parameters()), retain_graph=True),
            lambda g_loss, netD, netG, fake: g_loss.backward(inputs=tuple(netG.parameters())),
        ),
        id="inputs-as-tuples",
    ),
    pytest.param(
        one_pass(
            d_into_d,
            g_into_g,
            zero=lambda netG, netD: [setattr(p, "grad", None) for p in [*netD.parameters(), *netG.parameters()]],
        ),
        id="grad-none-by-hand",
    ),
    pytest.param(
        one_pass(
            lambda d_loss, netD, netG: d_loss.backward(inputs=list(netD.parameters())),
            lambda g_loss, netD, netG, fake: g_loss.backward(inputs=list(netG.parameters()), retain_graph=True),
            order="G, D",
        ),
        id="g-step-before-d-backward",
    ),
]
EXERCISE_3_WRONG += [
    pytest.param(lambda *args: 3 * penalty_solution(*args), ["The penalty is", "expected"], id="3-times-penalty"),
    pytest.param(
        lambda *args: torch.tensor(float(penalty_solution(*args)), requires_grad=True),
        ["The value is right, but the penalty is a leaf tensor with no grad_fn"],
        id="float-of-penalty",
        marks=FLOAT_WARNING,
    ),
    pytest.param(
        lambda netD, real, fake, alpha: ((penalty_gradient(netD, real, fake, alpha).data.norm(dim=1) - 1) ** 2).mean(),
        ["you used create_graph=True, but the penalty is a constant"],
        id="gradient-data",
    ),
    pytest.param(
        penalty_on_detached_points,
        [
            "Your function raised RuntimeError: The differentiated Tensor at index 0 "
            "appears to not have been used in the graph"
        ],
        id="d-on-detached-points",
    ),
    pytest.param(penalty_of(lambda norm: norm**2), ["The penalty is", "expected"], id="norm-squared-without-1"),
    pytest.param(penalty_of(lambda norm: (norm - 1).abs()), ["The penalty is", "expected"], id="absolute-not-squared"),
]
EXERCISE_3_RIGHT += [
    pytest.param(
        lambda netD, real, fake, alpha: (
            (penalty_gradient(netD, real, fake, alpha, data=True).norm(dim=1) - 1) ** 2
        ).mean(),
        id="mixed-points-from-data",
    ),
    pytest.param(penalty_of(lambda norm: (norm - 1).square()), id="square-method"),
    pytest.param(penalty_from_torch_func, id="torch-func-grad"),
    pytest.param(penalty_after_an_extra_forward, id="extra-d-forward"),
]


# -- the catalogue, all three exercises ---------------------------------------------------------------


def with_check(check, params):
    return [
        pytest.param(check, *param.values, id=f"ex{EXERCISE[check]}-{param.id}", marks=param.marks) for param in params
    ]


EXERCISE = {check_fixed_srgan_step: 1, check_single_forward_step: 2, check_gradient_penalty: 3}


@pytest.mark.parametrize(
    ("check", "answer", "expected"),
    [
        pytest.param(check_fixed_srgan_step, srgan_start, SRGAN_START_MESSAGE, id="ex1"),
        pytest.param(check_single_forward_step, one_pass_start, ONE_PASS_START_MESSAGE, id="ex2"),
        pytest.param(check_gradient_penalty, penalty_start, PENALTY_START_MESSAGE, id="ex3"),
    ],
)
def test_the_starting_code_gets_the_notebooks_message(check, answer, expected):
    assert repr(verdict(check, answer)) == expected


@pytest.mark.parametrize(
    ("check", "answer", "expected"),
    with_check(check_fixed_srgan_step, EXERCISE_1_WRONG)
    + with_check(check_single_forward_step, EXERCISE_2_WRONG)
    + with_check(check_gradient_penalty, EXERCISE_3_WRONG),
)
def test_wrong_answers_are_rejected_saying_what_is_wrong(check, answer, expected):
    result = verdict(check, answer)
    assert not result
    for text in expected:
        assert text in result.message


@pytest.mark.parametrize(
    ("check", "answer"),
    with_check(check_fixed_srgan_step, EXERCISE_1_RIGHT)
    + with_check(check_single_forward_step, EXERCISE_2_RIGHT)
    + with_check(check_gradient_penalty, EXERCISE_3_RIGHT),
)
def test_right_answers_are_accepted(check, answer):
    result = verdict(check, answer)
    assert result, result
    assert "call after call" in result.message


def test_exercise_3_hints_fit_the_mistake():
    assert "requires_grad_()" in check_gradient_penalty(penalty_forgets_requires_grad).hint
    assert "without .detach()" in check_gradient_penalty(penalty_detached_leaf).hint
    assert "create_graph" not in check_gradient_penalty(penalty_grad_detached).hint


# -- what the checks leave behind ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "answer"),
    [
        (check_fixed_srgan_step, never_zeroes),
        (check_single_forward_step, one_pass_imported_grad),
        (check_fixed_srgan_step, raises_own_exception),
        (check_gradient_penalty, penalty_own_alpha),
        (check_gradient_penalty, penalty_raises),
    ],
)
def test_checks_restore_autograd_and_the_random_stream(check, answer):
    engine, backward, grad = torch.autograd._engine_run_backward, torch.autograd.backward, torch.autograd.grad
    torch.manual_seed(123)
    state = torch.get_rng_state()
    check(answer)
    assert torch.equal(torch.get_rng_state(), state)
    assert (torch.autograd._engine_run_backward, torch.autograd.backward, torch.autograd.grad) == (
        engine,
        backward,
        grad,
    )


@pytest.mark.parametrize(
    ("check", "answer", "expected"),
    [
        (check_single_forward_step, single_forward_autograd_grad, "torch.autograd.grad (2 times"),
        (check_single_forward_step, one_pass_retains_both, "the last backward of your step keeps"),
        (check_single_forward_step, single_forward_inputs, None),
        (check_fixed_srgan_step, single_forward_autograd_grad, None),
        (check_gradient_penalty, penalty_grad_detached, "you used create_graph=True"),
        (check_gradient_penalty, penalty_solution, None),
    ],
)
def test_without_the_engine_entry_the_public_functions_are_watched(monkeypatch, check, answer, expected):
    """Where torch has no private engine entry, torch.autograd.backward and .grad are wrapped instead."""
    monkeypatch.setattr(watch, "_ENGINE_ENTRY", "_no_such_engine_entry")
    grad = torch.autograd.grad
    result = check(answer)
    assert torch.autograd.grad is grad
    if expected is None:
        assert result, result
    else:
        assert not result and expected in result.message
