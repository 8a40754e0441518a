"""Hamiltonian Neural Network on the ideal mass-spring: the vector field is the symplectic gradient of a learned
scalar, `torch.autograd.grad(F2.sum(), x, create_graph=True)` inside the forward, and the loss is on that field.

Source: greydanus/hamiltonian-nn, experiment-spring/train.py (commit 702d88f836afd6419e2b058a376e585e90ef9fa6):
train() with `x = torch.tensor(data['x'], requires_grad=True, ...)` and `test_x` the same, then per step
`dxdt_hat = model.time_derivative(x)`, `loss = L2_loss(dxdt, dxdt_hat)`, `loss.backward() ; optim.step() ;
optim.zero_grad()`, the test loss from `model.time_derivative(test_x)` (a graph that is never backpropagated),
and the stats; hnn.py (commit 4009db67749f9b0483f7a49af86f42783078e1e4): HNN with `forward` (`y.split(1,1)`),
`time_derivative` (the solenoidal branch: `dF2 = torch.autograd.grad(F2.sum(), x, create_graph=True)[0]`,
`dF2 @ self.M.t()`) and `permutation_tensor`; nn_models.py (commit bbd2283ebb7b8c5fc2dd79cd3d094690470ca324): MLP
with `choose_nonlinearity` from utils.py, and `L2_loss` from utils.py. Retyped at CPU size: hidden_dim 16
(published 200), 3 steps (2000); experiment-spring/data.py's get_dataset (seed 0, test_split 0.5, t_span [0, 3],
timescale 10, noise_std 0.05) keeps its shapes and its noise, with 4 trajectories (published 50) solved in closed
form with numpy (q = r cos(2t + phase), p = r sin(2t + phase): the field `dynamics_fn` gives for H = p**2 + q**2)
in place of HIPS autograd and scipy's solve_ivp; argparse, `--verbose` printing, rk4 and saving left out. `x`
requires grad, so each `loss.backward()` also adds into `x.grad`, which nothing reads.
"""

from collections.abc import Callable

import numpy as np
import torch

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def L2_loss(u, v):
    return (u-v).pow(2).mean()


def choose_nonlinearity(name):
    if name == 'tanh':
        return torch.tanh
    elif name == 'relu':
        return torch.relu
    elif name == 'sigmoid':
        return torch.sigmoid
    elif name == 'softplus':
        return torch.nn.functional.softplus
    else:
        raise ValueError("nonlinearity not recognized")


class MLP(torch.nn.Module):
    '''Just a salt-of-the-earth MLP'''
    def __init__(self, input_dim, hidden_dim, output_dim, nonlinearity='tanh'):
        super(MLP, self).__init__()
        self.linear1 = torch.nn.Linear(input_dim, hidden_dim)
        self.linear2 = torch.nn.Linear(hidden_dim, hidden_dim)
        self.linear3 = torch.nn.Linear(hidden_dim, output_dim, bias=None)

        for l in [self.linear1, self.linear2, self.linear3]:
            torch.nn.init.orthogonal_(l.weight)  # use a principled initialization

        self.nonlinearity = choose_nonlinearity(nonlinearity)

    def forward(self, x, separate_fields=False):
        h = self.nonlinearity(self.linear1(x))
        h = self.nonlinearity(self.linear2(h))
        return self.linear3(h)


class HNN(torch.nn.Module):
    '''Learn arbitrary vector fields that are sums of conservative and solenoidal fields'''
    def __init__(self, input_dim, differentiable_model, field_type='solenoidal',
                 baseline=False, assume_canonical_coords=True):
        super(HNN, self).__init__()
        self.baseline = baseline
        self.differentiable_model = differentiable_model
        self.assume_canonical_coords = assume_canonical_coords
        self.M = self.permutation_tensor(input_dim)  # Levi-Civita permutation tensor
        self.field_type = field_type

    def forward(self, x):
        # traditional forward pass
        if self.baseline:
            return self.differentiable_model(x)

        y = self.differentiable_model(x)
        assert y.dim() == 2 and y.shape[1] == 2, "Output tensor should have shape [batch_size, 2]"
        return y.split(1, 1)

    def time_derivative(self, x, t=None, separate_fields=False):
        '''NEURAL ODE-STLE VECTOR FIELD'''
        if self.baseline:
            return self.differentiable_model(x)

        '''NEURAL HAMILTONIAN-STLE VECTOR FIELD'''
        F1, F2 = self.forward(x)  # traditional forward pass

        conservative_field = torch.zeros_like(x)  # start out with both components set to 0
        solenoidal_field = torch.zeros_like(x)

        if self.field_type != 'solenoidal':
            dF1 = torch.autograd.grad(F1.sum(), x, create_graph=True)[0]  # gradients for conservative field
            conservative_field = dF1 @ torch.eye(*self.M.shape)

        if self.field_type != 'conservative':
            dF2 = torch.autograd.grad(F2.sum(), x, create_graph=True)[0]  # @dF2_grad
            solenoidal_field = dF2 @ self.M.t()

        if separate_fields:
            return [conservative_field, solenoidal_field]

        return conservative_field + solenoidal_field

    def permutation_tensor(self, n):
        M = None
        if self.assume_canonical_coords:
            M = torch.eye(n)
            M = torch.cat([M[n//2:], -M[:n//2]])
        else:
            '''Constructs the Levi-Civita permutation tensor'''
            M = torch.ones(n, n)  # matrix of ones
            M *= 1 - torch.eye(n)  # clear diagonals
            M[::2] *= -1  # pattern of signs
            M[:, ::2] *= -1

            for i in range(n):  # make asymmetric
                for j in range(i+1, n):
                    M[i, j] *= -1
        return M


def get_trajectory(t_span=[0, 3], timescale=10, radius=None, y0=None, noise_std=0.05, **kwargs):  # noqa: B006 (as published)
    t_eval = np.linspace(t_span[0], t_span[1], int(timescale*(t_span[1]-t_span[0])))

    # get initial state
    if y0 is None:
        y0 = np.random.rand(2)*2-1
    if radius is None:
        radius = np.random.rand()*.9 + 0.1  # sample a range of radii
    y0 = y0 / np.sqrt((y0**2).sum()) * radius  # set the appropriate radius

    # closed form of solve_ivp(dynamics_fn, ...) for H = p**2 + q**2: a rotation at angular speed 2
    phase = np.arctan2(y0[1], y0[0])
    q, p = radius * np.cos(2 * t_eval + phase), radius * np.sin(2 * t_eval + phase)
    dqdt, dpdt = -2 * p, 2 * q
    dqdt, dpdt = dqdt[None], dpdt[None]

    # add noise
    q += np.random.randn(*q.shape)*noise_std
    p += np.random.randn(*p.shape)*noise_std
    return q, p, dqdt, dpdt, t_eval


def get_dataset(seed=0, samples=4, test_split=0.5, **kwargs):
    data = {'meta': locals()}

    # randomly sample inputs
    np.random.seed(seed)
    xs, dxs = [], []
    for s in range(samples):
        x, y, dx, dy, t = get_trajectory(**kwargs)
        xs.append(np.stack([x, y]).T)
        dxs.append(np.stack([dx, dy]).T)

    data['x'] = np.concatenate(xs)
    data['dx'] = np.concatenate(dxs).squeeze()

    # make a train/test split
    split_ix = int(len(data['x']) * test_split)
    split_data = {}
    for k in ['x', 'dx']:
        split_data[k], split_data['test_' + k] = data[k][:split_ix], data[k][split_ix:]
    data = split_data
    return data


class Args:
    input_dim = 2
    hidden_dim = 16
    learn_rate = 1e-3
    nonlinearity = 'tanh'
    total_steps = ITERATIONS
    print_every = 200
    baseline = False
    use_rk4 = False
    verbose = False
    field_type = 'solenoidal'
    seed = 0


def build() -> dict:
    args = Args()
    # set random seed
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    output_dim = args.input_dim if args.baseline else 2
    nn_model = MLP(args.input_dim, args.hidden_dim, output_dim, args.nonlinearity)
    model = HNN(args.input_dim, differentiable_model=nn_model,
                field_type=args.field_type, baseline=args.baseline)
    optim = torch.optim.Adam(model.parameters(), args.learn_rate, weight_decay=1e-4)

    # arrange data
    data = get_dataset(seed=args.seed)
    x = torch.tensor(data['x'], requires_grad=True, dtype=torch.float32)
    test_x = torch.tensor(data['test_x'], requires_grad=True, dtype=torch.float32)
    dxdt = torch.Tensor(data['dx'])
    test_dxdt = torch.Tensor(data['test_dx'])

    stats = {'train_loss': [], 'test_loss': []}
    return {"args": args, "model": model, "optim": optim, "x": x, "test_x": test_x, "dxdt": dxdt,
            "test_dxdt": test_dxdt, "stats": stats, "step": 0}


def iteration(state: dict) -> None:
    args, model, optim, stats, step = state["args"], state["model"], state["optim"], state["stats"], state["step"]
    x, test_x, dxdt, test_dxdt = state["x"], state["test_x"], state["dxdt"], state["test_dxdt"]

    # train step
    dxdt_hat = model.rk4_time_derivative(x) if args.use_rk4 else model.time_derivative(x)
    loss = L2_loss(dxdt, dxdt_hat)
    loss.backward() ; optim.step() ; optim.zero_grad()  # noqa: E702

    # run test data
    test_dxdt_hat = model.rk4_time_derivative(test_x) if args.use_rk4 else model.time_derivative(test_x)
    test_loss = L2_loss(test_dxdt, test_dxdt_hat)

    # logging
    stats['train_loss'].append(loss.item())
    stats['test_loss'].append(test_loss.item())
    if args.verbose and step % args.print_every == 0:
        print("step {}, train_loss {:.4e}, test_loss {:.4e}".format(step, loss.item(), test_loss.item()))
    state["step"] = step + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
