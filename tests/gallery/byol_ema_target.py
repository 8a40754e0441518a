"""BYOL: an online encoder and predictor trained against a momentum (EMA) target encoder built lazily by deepcopy.

Source: lucidrains/byol-pytorch, byol_pytorch/byol_pytorch.py (commit 6717204748c2a4f4f44b991d4c59ce5b99995582)
and the README's usage loop (`loss = learner(images)`, `opt.zero_grad()`, `loss.backward()`, `opt.step()`,
`learner.update_moving_average()`): NetWrapper (a forward hook on the hidden layer stores
`flatten(output)` in `self.hidden`, the projector made on first use by the `singleton('projector')`
decorator), BYOL (`_get_target_encoder` a `copy.deepcopy` of the online encoder with requires_grad False,
made by the mock forward in `__init__`; the target projections under `torch.no_grad()` with `detach_()`, then
`.detach()` again in the loss), EMA and `update_moving_average` (`ma_params.data =
ema_updater.update_average(old_weight, up_weight)`), loss_fn as published, Adam lr 3e-4. Retyped at CPU size:
torchvision's resnet50 becomes conv 3->4 + BatchNorm + ReLU, average pool, Flatten, Linear(4, 10) with
`hidden_layer=-2` (the Flatten's output); image_size 8 (published 256), projection_size 8 (published 256),
projection_hidden_size 16 (published 4096); torchvision's default augmentation becomes the `augment_fn` the
README allows, a random flip and noise made of torch only (through the published RandomApply); 4 made-up
images a step (published 20).
"""

import copy
import random
from collections.abc import Callable
from functools import wraps

import torch
import torch.nn.functional as F
from torch import nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

# helper functions


def default(val, def_val):
    return def_val if val is None else val


def flatten(t):
    return t.reshape(t.shape[0], -1)


def singleton(cache_key):
    def inner_fn(fn):
        @wraps(fn)
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None:
                return instance

            instance = fn(self, *args, **kwargs)
            setattr(self, cache_key, instance)
            return instance

        return wrapper

    return inner_fn


def get_module_device(module):
    return next(module.parameters()).device


def set_requires_grad(model, val):
    for p in model.parameters():
        p.requires_grad = val


# loss fn


def loss_fn(x, y):
    x = F.normalize(x, dim=-1, p=2)
    y = F.normalize(y, dim=-1, p=2)
    return 2 - 2 * (x * y).sum(dim=-1)


# augmentation utils


class RandomApply(nn.Module):
    def __init__(self, fn, p):
        super().__init__()
        self.fn = fn
        self.p = p

    def forward(self, x):
        if random.random() > self.p:
            return x
        return self.fn(x)


# exponential moving average


class EMA:
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def update_average(self, old, new):
        if old is None:
            return new
        return old * self.beta + (1 - self.beta) * new


def update_moving_average(ema_updater, ma_model, current_model):
    for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters()):
        old_weight, up_weight = ma_params.data, current_params.data
        ma_params.data = ema_updater.update_average(old_weight, up_weight)


# MLP class for projector and predictor


def MLP(dim, projection_size, hidden_size=4096):
    return nn.Sequential(
        nn.Linear(dim, hidden_size),
        nn.BatchNorm1d(hidden_size),
        nn.ReLU(inplace=True),
        nn.Linear(hidden_size, projection_size),
    )


# a wrapper class for the base neural network
# will manage the interception of the hidden layer output
# and pipe it into the projecter and predictor nets


class NetWrapper(nn.Module):
    def __init__(self, net, projection_size, projection_hidden_size, layer=-2, use_simsiam_mlp=False):
        super().__init__()
        self.net = net
        self.layer = layer

        self.projector = None
        self.projection_size = projection_size
        self.projection_hidden_size = projection_hidden_size

        self.use_simsiam_mlp = use_simsiam_mlp

        self.hidden = {}
        self.hook_registered = False

    def _find_layer(self):
        if type(self.layer) == str:  # noqa: E721 (as published)
            modules = dict([*self.net.named_modules()])
            return modules.get(self.layer, None)
        elif type(self.layer) == int:  # noqa: E721 (as published)
            children = [*self.net.children()]
            return children[self.layer]
        return None

    def _hook(self, _, input, output):
        device = input[0].device
        self.hidden[device] = flatten(output)

    def _register_hook(self):
        layer = self._find_layer()
        assert layer is not None, f"hidden layer ({self.layer}) not found"
        handle = layer.register_forward_hook(self._hook)
        self.hook_registered = True

    @singleton("projector")
    def _get_projector(self, hidden):
        _, dim = hidden.shape
        create_mlp_fn = MLP
        projector = create_mlp_fn(dim, self.projection_size, self.projection_hidden_size)
        return projector.to(hidden)

    def get_representation(self, x):
        if self.layer == -1:
            return self.net(x)

        if not self.hook_registered:
            self._register_hook()

        self.hidden.clear()
        _ = self.net(x)
        hidden = self.hidden[x.device]
        self.hidden.clear()

        assert hidden is not None, f"hidden layer {self.layer} never emitted an output"
        return hidden

    def forward(self, x, return_projection=True):
        representation = self.get_representation(x)

        if not return_projection:
            return representation

        projector = self._get_projector(representation)
        projection = projector(representation)
        return projection, representation


# main class


class BYOL(nn.Module):
    def __init__(
        self,
        net,
        image_size,
        hidden_layer=-2,
        projection_size=256,
        projection_hidden_size=4096,
        augment_fn=None,
        augment_fn2=None,
        moving_average_decay=0.99,
        use_momentum=True,
    ):
        super().__init__()
        self.net = net

        self.augment1 = augment_fn
        self.augment2 = default(augment_fn2, self.augment1)

        self.online_encoder = NetWrapper(
            net, projection_size, projection_hidden_size, layer=hidden_layer, use_simsiam_mlp=not use_momentum
        )

        self.use_momentum = use_momentum
        self.target_encoder = None
        self.target_ema_updater = EMA(moving_average_decay)

        self.online_predictor = MLP(projection_size, projection_size, projection_hidden_size)

        # get device of network and make wrapper same device
        device = get_module_device(net)
        self.to(device)

        # send a mock image tensor to instantiate singleton parameters
        self.forward(torch.randn(2, 3, image_size, image_size, device=device))

    @singleton("target_encoder")
    def _get_target_encoder(self):
        target_encoder = copy.deepcopy(self.online_encoder)
        set_requires_grad(target_encoder, False)
        return target_encoder

    def reset_moving_average(self):
        del self.target_encoder
        self.target_encoder = None

    def update_moving_average(self):
        assert self.use_momentum, (
            "you do not need to update the moving average, since you have turned off momentum for the target encoder"
        )
        assert self.target_encoder is not None, "target encoder has not been created yet"
        update_moving_average(self.target_ema_updater, self.target_encoder, self.online_encoder)

    def forward(self, x, return_embedding=False, return_projection=True):
        assert not (self.training and x.shape[0] == 1), (
            "you must have greater than 1 sample when training, due to the batchnorm in the projection layer"
        )

        if return_embedding:
            return self.online_encoder(x, return_projection=return_projection)

        image_one, image_two = self.augment1(x), self.augment2(x)

        online_proj_one, _ = self.online_encoder(image_one)
        online_proj_two, _ = self.online_encoder(image_two)

        online_pred_one = self.online_predictor(online_proj_one)
        online_pred_two = self.online_predictor(online_proj_two)

        with torch.no_grad():
            target_encoder = self._get_target_encoder() if self.use_momentum else self.online_encoder
            target_proj_one, _ = target_encoder(image_one)
            target_proj_two, _ = target_encoder(image_two)
            target_proj_one.detach_()
            target_proj_two.detach_()

        loss_one = loss_fn(online_pred_one, target_proj_two.detach())
        loss_two = loss_fn(online_pred_two, target_proj_one.detach())

        loss = loss_one + loss_two
        return loss.mean()


def sample_unlabelled_images():
    return torch.randn(4, 3, 8, 8)


def build() -> dict:
    torch.manual_seed(0)
    random.seed(0)
    resnet = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(4, 10),
    )
    augment = nn.Sequential(
        RandomApply(lambda x: torch.flip(x, dims=[3]), p=0.5),
        RandomApply(lambda x: x + 0.1 * torch.randn_like(x), p=0.8),
    )
    learner = BYOL(
        resnet, image_size=8, hidden_layer=-2, projection_size=8, projection_hidden_size=16, augment_fn=augment
    )
    opt = torch.optim.Adam(learner.parameters(), lr=3e-4)
    return {"learner": learner, "opt": opt}


def iteration(state: dict) -> None:
    learner, opt = state["learner"], state["opt"]
    images = sample_unlabelled_images()
    loss = learner(images)
    opt.zero_grad()
    loss.backward()  # @backward
    opt.step()
    learner.update_moving_average()  # update moving average of target encoder


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
