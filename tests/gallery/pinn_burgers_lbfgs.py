"""A physics-informed network for Burgers' equation, trained by one LBFGS step whose closure takes PDE derivatives.

Source: jayroxis/PINNs, "Burgers Equation/Burgers Inference (PyTorch).ipynb" (a PyTorch port of Raissi et al.'s
PINNs): DNN (Linear-Tanh stack in an OrderedDict), PhysicsInformedNN with `self.optimizer = torch.optim.LBFGS(...,
line_search_fn="strong_wolfe")`, net_f taking u_t, u_x and u_xx with `torch.autograd.grad(...,
retain_graph=True, create_graph=True)`, the closure `loss_func` (zero_grad, MSE on the boundary data plus the
mean squared residual, loss.backward(), a print every 100 calls) and `train()`: `self.optimizer.step(self.loss_func)`,
called once by the notebook. The configuration cell builds X_u_train from the t=0 row and the x=-1 and x=+1
columns of the solution grid and X_f_train by Latin hypercube sampling. Retyped at CPU size: layers
[2, 8, 8, 1] (published eight hidden layers of 20), N_u 10 (published 100), N_f 20 (published 10000); the
burgers_shock.mat grid (256 x 100 points) is replaced by a made-up 16 x 10 grid whose field, -sin(pi x) exp(-t),
has the published problem's initial and boundary values; pyDOE's lhs(2, N_f) is drawn with np.random.rand.
The training arrays are cast to float32 before PhysicsInformedNN is built: with the published float64 arrays,
`torch.tensor(X_u[:, 0:1], requires_grad=True).float()` makes x_u, t_u, x_f and t_f non-leaf copies whose
ToCopyBackward nodes, built before the loop, every closure's backward walks into float64 leaves that nothing
keeps; the gallery's probes then call x_u and t_u carried, yet detaching them changes nothing they can see
(only those dropped float64 leaves' .grad), so that truth cannot be checked; with float32 arrays `.float()`
returns the leaf itself. LBFGS max_iter and max_eval are 4 (published 50000 each); torch.manual_seed(1234) is
added (the notebook seeds only numpy); the CUDA device lines and the plots are left out. The autograd.grad calls
are joined on one line each so their keywords sit on one marked line.
"""

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

ITERATIONS = 1

TRUTH = {
    "error": None,
    "retains": {
        "@u_t": {"verdict": "can go", "runs": 4, "needed_runs": 0},
        "@u_x": {"verdict": "can go", "runs": 4, "needed_runs": 0},
        "@u_xx": {"verdict": "can go", "runs": 4, "needed_runs": 0},
    },
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

device = torch.device('cpu')


# the deep neural network
class DNN(torch.nn.Module):
    def __init__(self, layers):
        super(DNN, self).__init__()

        # parameters
        self.depth = len(layers) - 1

        # set up layer order dict
        self.activation = torch.nn.Tanh

        layer_list = list()
        for i in range(self.depth - 1):
            layer_list.append(
                ('layer_%d' % i, torch.nn.Linear(layers[i], layers[i + 1]))
            )
            layer_list.append(('activation_%d' % i, self.activation()))

        layer_list.append(
            ('layer_%d' % (self.depth - 1), torch.nn.Linear(layers[-2], layers[-1]))
        )
        layerDict = OrderedDict(layer_list)

        # deploy layers
        self.layers = torch.nn.Sequential(layerDict)

    def forward(self, x):
        out = self.layers(x)
        return out


# the physics-guided neural network
class PhysicsInformedNN():
    def __init__(self, X_u, u, X_f, layers, lb, ub, nu):

        # boundary conditions
        self.lb = torch.tensor(lb).float().to(device)
        self.ub = torch.tensor(ub).float().to(device)

        # data
        self.x_u = torch.tensor(X_u[:, 0:1], requires_grad=True).float().to(device)
        self.t_u = torch.tensor(X_u[:, 1:2], requires_grad=True).float().to(device)
        self.x_f = torch.tensor(X_f[:, 0:1], requires_grad=True).float().to(device)
        self.t_f = torch.tensor(X_f[:, 1:2], requires_grad=True).float().to(device)
        self.u = torch.tensor(u).float().to(device)

        self.layers = layers
        self.nu = nu

        # deep neural networks
        self.dnn = DNN(layers).to(device)

        # optimizers: using the same settings
        self.optimizer = torch.optim.LBFGS(
            self.dnn.parameters(),
            lr=1.0,
            max_iter=4,
            max_eval=4,
            history_size=50,
            tolerance_grad=1e-5,
            tolerance_change=1.0 * np.finfo(float).eps,
            line_search_fn="strong_wolfe"       # can be "strong_wolfe"
        )

        self.iter = 0

    def net_u(self, x, t):
        u = self.dnn(torch.cat([x, t], dim=1))
        return u

    def net_f(self, x, t):
        """ The pytorch autograd version of calculating residual """
        u = self.net_u(x, t)

        u_t = torch.autograd.grad(u, t, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]  # @u_t
        u_x = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]  # @u_x
        u_xx = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x), retain_graph=True, create_graph=True)[0]  # @u_xx

        f = u_t + u * u_x - self.nu * u_xx
        return f

    def loss_func(self):
        self.optimizer.zero_grad()

        u_pred = self.net_u(self.x_u, self.t_u)
        f_pred = self.net_f(self.x_f, self.t_f)
        loss_u = torch.mean((self.u - u_pred) ** 2)
        loss_f = torch.mean(f_pred ** 2)

        loss = loss_u + loss_f

        loss.backward()  # @backward
        self.iter += 1
        if self.iter % 100 == 0:
            print(
                'Iter %d, Loss: %.5e, Loss_u: %.5e, Loss_f: %.5e' % (self.iter, loss.item(), loss_u.item(), loss_f.item())
            )
        return loss

    def train(self):
        self.dnn.train()

        # Backward and optimize
        self.optimizer.step(self.loss_func)  # @lbfgs_step


def build() -> dict:
    np.random.seed(1234)
    torch.manual_seed(1234)

    nu = 0.01 / np.pi

    N_u = 10
    N_f = 20
    layers = [2, 8, 8, 1]

    t = np.linspace(0, 0.99, 10).flatten()[:, None]
    x = np.linspace(-1, 1, 16).flatten()[:, None]
    X, T = np.meshgrid(x, t)
    Exact = -np.sin(np.pi * X) * np.exp(-T)

    X_star = np.hstack((X.flatten()[:, None], T.flatten()[:, None]))

    # Doman bounds
    lb = X_star.min(0)
    ub = X_star.max(0)

    xx1 = np.hstack((X[0:1, :].T, T[0:1, :].T))
    uu1 = Exact[0:1, :].T
    xx2 = np.hstack((X[:, 0:1], T[:, 0:1]))
    uu2 = Exact[:, 0:1]
    xx3 = np.hstack((X[:, -1:], T[:, -1:]))
    uu3 = Exact[:, -1:]

    X_u_train = np.vstack([xx1, xx2, xx3])
    X_f_train = lb + (ub - lb) * np.random.rand(N_f, 2)
    X_f_train = np.vstack((X_f_train, X_u_train))
    u_train = np.vstack([uu1, uu2, uu3])

    idx = np.random.choice(X_u_train.shape[0], N_u, replace=False)
    X_u_train = X_u_train[idx, :]
    u_train = u_train[idx, :]

    # float32 here (the published .mat data is float64): see the module docstring
    X_u_train, u_train, X_f_train = (a.astype(np.float32) for a in (X_u_train, u_train, X_f_train))

    model = PhysicsInformedNN(X_u_train, u_train, X_f_train, layers, lb, ub, nu)  # @model
    return {"model": model}


def iteration(state: dict) -> None:
    state["model"].train()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
