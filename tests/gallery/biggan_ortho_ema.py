"""BigGAN-PyTorch: D steps then a G step through the G_D wrapper, modified ortho reg on .grad, and an EMA of G.

Source: ajbrock/BigGAN-PyTorch, train_fns.py (commit 19bf57b0e1a997b04a73c7349801f6bce1bf420a):
GAN_training_function's train(x, y) as published: zero both optimizers, torch.split x and y, toggle_grad(D, True)
and toggle_grad(G, False), num_D_steps of (z_.sample_(), y_.sample_(), `D_fake, D_real = GD(z_[:bs], y_[:bs],
x[counter], y[counter], train_G=False)`, discriminator_loss, D_loss.backward(), `utils.ortho(D, D_ortho)`,
D.optim.step()), the toggles swapped, G.optim.zero_grad(), `D_fake = GD(z_, y_, train_G=True)`, G_loss.backward(),
`utils.ortho(G, G_ortho, blacklist=G.shared's parameters)`, G.optim.step(), ema.update(state_dict['itr']), the
losses read with .item(); utils.py's ortho (`param.grad.data += strength * grad.view(param.shape)` under
torch.no_grad()), toggle_grad, ema (target_dict's `.data.copy_` of a decayed mix) and Distribution (a torch.Tensor
subclass whose sample_() refills it in place, and its `to`); BigGAN.py's G_D.forward (G under `torch.set_grad_enabled(train_G)`,
D on torch.cat([G_z, x]), split back into D_fake, D_real); losses.py's hinge losses; train.py's loop
(`state_dict['itr'] += 1`, G.train(), D.train(), G_ema.train(), then train(x, y)). The sign of ortho's update is
questioned in https://github.com/ajbrock/BigGAN-PyTorch/issues/90 (kept as published). Retyped at CPU size:
G is a linear layer to 4x4x4 with one class-conditional BatchNorm (gain and bias from the shared embedding) and
a conv to 1x8x8, D a conv, a linear head and the projection embedding; 3 classes, dim_z 4, batch_size 2,
num_D_steps 2, G_ortho = D_ortho = 1e-4 (the published default is 0.0, so ortho is switched on here), ema decay
0.999, Adam as configured (G lr 5e-5, D lr 2e-4, betas (0, 0.999)); the debug prints and the fp16 branches left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- utils.py
def toggle_grad(model, on_or_off):
    for param in model.parameters():
        param.requires_grad = on_or_off


def ortho(model, strength=1e-4, blacklist=[]):  # noqa: B006 (as published)
    with torch.no_grad():
        for param in model.parameters():
            if len(param.shape) < 2 or any([param is item for item in blacklist]):
                continue
            w = param.view(param.shape[0], -1)
            grad = (2 * torch.mm(torch.mm(w, w.t()) * (1. - torch.eye(w.shape[0], device=w.device)), w))
            param.grad.data += strength * grad.view(param.shape)


class ema(object):
    def __init__(self, source, target, decay=0.9999, start_itr=0):
        self.source = source
        self.target = target
        self.decay = decay
        self.start_itr = start_itr
        self.source_dict = self.source.state_dict()
        self.target_dict = self.target.state_dict()
        with torch.no_grad():
            for key in self.source_dict:
                self.target_dict[key].data.copy_(self.source_dict[key].data)

    def update(self, itr=None):
        if itr and itr < self.start_itr:
            decay = 0.0
        else:
            decay = self.decay
        with torch.no_grad():
            for key in self.source_dict:
                self.target_dict[key].data.copy_(self.target_dict[key].data * decay
                                                 + self.source_dict[key].data * (1 - decay))


class Distribution(torch.Tensor):
    def init_distribution(self, dist_type, **kwargs):
        self.dist_type = dist_type
        self.dist_kwargs = kwargs
        if self.dist_type == 'normal':
            self.mean, self.var = kwargs['mean'], kwargs['var']
        elif self.dist_type == 'categorical':
            self.num_categories = kwargs['num_categories']

    def sample_(self):
        if self.dist_type == 'normal':
            self.normal_(self.mean, self.var)
        elif self.dist_type == 'categorical':
            self.random_(0, self.num_categories)

    def to(self, *args, **kwargs):
        new_obj = Distribution(self)
        new_obj.init_distribution(self.dist_type, **self.dist_kwargs)
        new_obj.data = super().to(*args, **kwargs)
        return new_obj


def prepare_z_y(G_batch_size, dim_z, nclasses, device='cpu', z_var=1.0):
    z_ = Distribution(torch.randn(G_batch_size, dim_z, requires_grad=False))
    z_.init_distribution('normal', mean=0, var=z_var)
    z_ = z_.to(device, torch.float32)
    y_ = Distribution(torch.zeros(G_batch_size, requires_grad=False))
    y_.init_distribution('categorical', num_categories=nclasses)
    y_ = y_.to(device, torch.int64)
    return z_, y_


# ---------------------------------------------------------------- losses.py
def loss_hinge_dis(dis_fake, dis_real):
    loss_real = torch.mean(F.relu(1. - dis_real))
    loss_fake = torch.mean(F.relu(1. + dis_fake))
    return loss_real, loss_fake


def loss_hinge_gen(dis_fake):
    loss = -torch.mean(dis_fake)
    return loss


generator_loss = loss_hinge_gen
discriminator_loss = loss_hinge_dis


# ---------------------------------------------------------------- BigGAN.py, at CPU size
class ccbn(nn.Module):
    def __init__(self, output_size, input_size, eps=1e-5, momentum=0.1):
        super().__init__()
        self.gain = nn.Linear(input_size, output_size, bias=False)
        self.bias = nn.Linear(input_size, output_size, bias=False)
        self.eps, self.momentum = eps, momentum
        self.register_buffer('stored_mean', torch.zeros(output_size))
        self.register_buffer('stored_var', torch.ones(output_size))

    def forward(self, x, y):
        gain = (1 + self.gain(y)).view(y.size(0), -1, 1, 1)
        bias = self.bias(y).view(y.size(0), -1, 1, 1)
        out = F.batch_norm(x, self.stored_mean, self.stored_var, None, None, self.training, 0.1, self.eps)
        return out * gain + bias


class Generator(nn.Module):
    def __init__(self, dim_z=4, n_classes=3, shared_dim=4, ch=4, G_lr=5e-5, G_B1=0.0, G_B2=0.999):
        super().__init__()
        self.dim_z, self.ch = dim_z, ch
        self.shared = nn.Embedding(n_classes, shared_dim)
        self.linear = nn.Linear(dim_z + shared_dim, ch * 4 * 4)
        self.bn = ccbn(ch, shared_dim)
        self.output_layer = nn.Conv2d(ch, 1, 3, padding=1)
        self.optim = torch.optim.Adam(params=self.parameters(), lr=G_lr, betas=(G_B1, G_B2), weight_decay=0, eps=1e-8)

    def forward(self, z, y):
        h = self.linear(torch.cat([z, y], 1)).view(z.size(0), self.ch, 4, 4)
        h = F.interpolate(F.relu(self.bn(h, y)), scale_factor=2)
        return torch.tanh(self.output_layer(h))


class Discriminator(nn.Module):
    def __init__(self, n_classes=3, ch=4, D_lr=2e-4, D_B1=0.0, D_B2=0.999):
        super().__init__()
        self.conv = nn.Conv2d(1, ch, 3, stride=2, padding=1)
        self.linear = nn.Linear(ch, 1)
        self.embed = nn.Embedding(n_classes, ch)
        self.optim = torch.optim.Adam(params=self.parameters(), lr=D_lr, betas=(D_B1, D_B2), weight_decay=0, eps=1e-8)

    def forward(self, x, y=None):
        h = torch.sum(F.relu(self.conv(x)), [2, 3])
        out = self.linear(h)
        out = out + torch.sum(self.embed(y) * h, 1, keepdim=True)
        return out


class G_D(nn.Module):
    def __init__(self, G, D):
        super().__init__()
        self.G = G
        self.D = D

    def forward(self, z, gy, x=None, dy=None, train_G=False, return_G_z=False, split_D=False):
        with torch.set_grad_enabled(train_G):
            G_z = self.G(z, self.G.shared(gy))
        D_input = torch.cat([G_z, x], 0) if x is not None else G_z
        D_class = torch.cat([gy, dy], 0) if dy is not None else gy
        D_out = self.D(D_input, D_class)
        if x is not None:
            return torch.split(D_out, [G_z.shape[0], x.shape[0]])
        else:
            if return_G_z:
                return D_out, G_z
            else:
                return D_out


# ---------------------------------------------------------------- train_fns.py
def GAN_training_function(G, D, GD, z_, y_, ema, state_dict, config):
    def train(x, y):
        G.optim.zero_grad()
        D.optim.zero_grad()
        x = torch.split(x, config['batch_size'])
        y = torch.split(y, config['batch_size'])
        counter = 0

        if config['toggle_grads']:
            toggle_grad(D, True)
            toggle_grad(G, False)

        for step_index in range(config['num_D_steps']):
            for accumulation_index in range(config['num_D_accumulations']):
                z_.sample_()
                y_.sample_()
                D_fake, D_real = GD(z_[:config['batch_size']], y_[:config['batch_size']],
                                    x[counter], y[counter], train_G=False,
                                    split_D=config['split_D'])
                D_loss_real, D_loss_fake = discriminator_loss(D_fake, D_real)
                D_loss = (D_loss_real + D_loss_fake) / float(config['num_D_accumulations'])
                D_loss.backward()  # @d_backward
                counter += 1

            if config['D_ortho'] > 0.0:
                ortho(D, config['D_ortho'])

            D.optim.step()

        if config['toggle_grads']:
            toggle_grad(D, False)
            toggle_grad(G, True)

        G.optim.zero_grad()

        for accumulation_index in range(config['num_G_accumulations']):
            z_.sample_()
            y_.sample_()
            D_fake = GD(z_, y_, train_G=True, split_D=config['split_D'])
            G_loss = generator_loss(D_fake) / float(config['num_G_accumulations'])
            G_loss.backward()  # @g_backward

        if config['G_ortho'] > 0.0:
            ortho(G, config['G_ortho'], blacklist=[param for param in G.shared.parameters()])
        G.optim.step()

        if config['ema']:
            ema.update(state_dict['itr'])

        out = {'G_loss': float(G_loss.item()),
               'D_loss_real': float(D_loss_real.item()),
               'D_loss_fake': float(D_loss_fake.item())}
        return out
    return train


CONFIG = {'batch_size': 2, 'num_D_steps': 2, 'num_D_accumulations': 1, 'num_G_accumulations': 1,
          'toggle_grads': True, 'split_D': False, 'D_ortho': 1e-4, 'G_ortho': 1e-4, 'ema': True,
          'ema_decay': 0.999, 'ema_start': 0, 'n_classes': 3, 'dim_z': 4}


def build() -> dict:
    torch.manual_seed(0)
    config = dict(CONFIG)
    G = Generator(dim_z=config['dim_z'], n_classes=config['n_classes'])
    D = Discriminator(n_classes=config['n_classes'])
    G_ema = Generator(dim_z=config['dim_z'], n_classes=config['n_classes'])
    ema_ = ema(G, G_ema, config['ema_decay'], config['ema_start'])
    GD = G_D(G, D)
    state_dict = {'itr': 0, 'epoch': 0}
    G_batch_size = config['batch_size']
    z_, y_ = prepare_z_y(G_batch_size, G.dim_z, config['n_classes'])
    D_batch_size = config['batch_size'] * config['num_D_steps'] * config['num_D_accumulations']
    loader = [(torch.rand(D_batch_size, 1, 8, 8) * 2 - 1, torch.randint(0, config['n_classes'], (D_batch_size,)))
              for _ in range(ITERATIONS + 1)]
    train = GAN_training_function(G, D, GD, z_, y_, ema_, state_dict, config)
    return {"G": G, "D": D, "G_ema": G_ema, "GD": GD, "G_optim": G.optim, "D_optim": D.optim,
            "z_": z_, "y_": y_, "state_dict": state_dict, "config": config, "loader": loader, "train": train}


def iteration(state: dict) -> None:
    G, D, G_ema, state_dict, config = state["G"], state["D"], state["G_ema"], state["state_dict"], state["config"]
    x, y = state["loader"][state_dict['itr'] % len(state["loader"])]
    state_dict['itr'] += 1
    G.train()
    D.train()
    if config['ema']:
        G_ema.train()
    metrics = state["train"](x, y)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
