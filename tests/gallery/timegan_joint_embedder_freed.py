"""TimeGAN's joint training: the generator's backward frees the embedding graph the embedder's loss reuses.

Source: AlanDongMu/TimeGAN_PytorchRebuild, timegan.py (commit 4834118c3089d0ee0521c2faa9fb0113c57047ae), networks.py
and utils.py (commit a43cfbd6be4b37821ba46380a4ebcf98b09f3f34) and run.py (commit
a43cfbd6be4b37821ba46380a4ebcf98b09f3f34), and its issue #2 (https://github.com/AlanDongMu/TimeGAN_PytorchRebuild/
issues/2, "Error running main on defaults": "RuntimeError: Trying to backward through the graph a second time ...
I have tried setting retain_graph=True but the error does not go away"); the repository's later run.py splits the
forward into `batch_forward()` and calls it again before `train_embedder`. As published: Embedder, Recovery,
Generator, Supervisor (num_layer - 1 layers) and Discriminator as GRU + Linear + Sigmoid, one Adam per network,
`gen_batch()` drawing a batch and running every network forward onto the model's attributes, train_generator (the
unsupervised, supervised and moment losses, one backward, generator and supervisor steps) and
train_embedder(join_train=True) (the reconstruction loss plus 0.1 of the supervised loss on the same batch's `H` and
`H_hat_supervise`), then train_discriminator on a fresh batch. One iteration is one pass of run.py's joint-training
loop (two generator/embedder rounds, one discriminator round). Retyped at CPU size: 16 made-up sequences of length
6 with 3 features (published: the stock data, 24 x 6), hidden_dim 4, num_layer 2, batch 4, gamma 1, lr 1e-3; the
options object is a SimpleNamespace; the two pre-training phases, printing and checkpoints left out.
"""

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 2

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 1, "line": "@e_backward"},
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def get_rnn_cell(module_name):
    assert module_name in ['gru', 'lstm']
    rnn_cell = None
    if module_name == 'gru':
        rnn_cell = nn.GRU
    elif module_name == 'lstm':
        rnn_cell = nn.LSTM
    return rnn_cell


class Embedder(nn.Module):
    def __init__(self, para):
        super(Embedder, self).__init__()
        rnn_cell = get_rnn_cell(para['module'])
        self.rnn = rnn_cell(input_size=para['input_dim'], hidden_size=para['hidden_dim'], num_layers=para['num_layer'],
                            batch_first=True)
        self.fc = nn.Linear(para['hidden_dim'], para['hidden_dim'])
        self.sigmoid = nn.Sigmoid()

    def forward(self, X):
        e_outputs, _ = self.rnn(X)
        H = self.fc(e_outputs)
        H = self.sigmoid(H)
        return H


class Recovery(nn.Module):
    def __init__(self, para):
        super(Recovery, self).__init__()
        rnn_cell = get_rnn_cell(para['module'])
        self.rnn = rnn_cell(input_size=para['hidden_dim'], hidden_size=para['input_dim'], num_layers=para['num_layer'],
                            batch_first=True)
        self.fc = nn.Linear(para['input_dim'], para['input_dim'])
        self.sigmoid = nn.Sigmoid()

    def forward(self, H):
        r_outputs, _ = self.rnn(H)
        X_tilde = self.fc(r_outputs)
        X_tilde = self.sigmoid(X_tilde)
        return X_tilde


class Generator(nn.Module):
    def __init__(self, para):
        super(Generator, self).__init__()
        rnn_cell = get_rnn_cell(para['module'])
        self.rnn = rnn_cell(input_size=para['input_dim'], hidden_size=para['hidden_dim'], num_layers=para['num_layer'],
                            batch_first=True)
        self.fc = nn.Linear(para['hidden_dim'], para['hidden_dim'])
        self.sigmoid = nn.Sigmoid()

    def forward(self, Z):
        g_outputs, _ = self.rnn(Z)
        E = self.fc(g_outputs)
        E = self.sigmoid(E)
        return E


class Supervisor(nn.Module):
    def __init__(self, para):
        super(Supervisor, self).__init__()
        rnn_cell = get_rnn_cell(para['module'])
        self.rnn = rnn_cell(input_size=para['hidden_dim'], hidden_size=para['hidden_dim'], num_layers=para['num_layer'] - 1,
                            batch_first=True)
        self.fc = nn.Linear(para['hidden_dim'], para['hidden_dim'])
        self.sigmoid = nn.Sigmoid()

    def forward(self, H):
        s_outputs, _ = self.rnn(H)
        S = self.fc(s_outputs)
        S = self.sigmoid(S)
        return S


class Discriminator(nn.Module):
    def __init__(self, para):
        super(Discriminator, self).__init__()
        rnn_cell = get_rnn_cell(para['module'])
        self.rnn = rnn_cell(input_size=para['hidden_dim'], hidden_size=para['hidden_dim'], num_layers=para['num_layer'],
                            batch_first=True)
        self.fc = nn.Linear(para['hidden_dim'], para['hidden_dim'])
        self.sigmoid = nn.Sigmoid()

    def forward(self, H):
        d_outputs, _ = self.rnn(H)
        Y = self.fc(d_outputs)
        Y = self.sigmoid(Y)
        return Y


def MinMaxScaler(data):
    min_val = np.min(np.min(data, axis=0), axis=0)
    data = data - min_val
    max_val = np.max(np.max(data, axis=0), axis=0)
    norm_data = data / (max_val + 1e-7)
    return norm_data, min_val, max_val


def extract_time(data):
    time = list()
    max_seq_len = 0
    for i in range(len(data)):
        max_seq_len = max(max_seq_len, len(data[i][:, 0]))
        time.append(len(data[i][:, 0]))
    return time, max_seq_len


def random_generator(batch_size, z_dim, max_seq_len, *T):
    Z_mb = list()
    for i in range(batch_size):
        if not T:
            temp = np.random.uniform(0., 1, [max_seq_len, z_dim])
        else:
            T_mb = T[0]
            temp = np.random.uniform(0., 1, [T_mb[i], z_dim])
        Z_mb.append(temp)
    return Z_mb


def batch_generator(data, time, batch_size):
    no = len(data)
    idx = np.random.permutation(no)
    train_idx = idx[:batch_size]
    X_mb = list(data[i] for i in train_idx)
    T_mb = list(time[i] for i in train_idx)
    return X_mb, T_mb


class TimeGAN:
    def __init__(self, opt, ori_data):

        self.opt = opt
        self.ori_data, self.min_val, self.max_val = MinMaxScaler(ori_data)
        self.ori_time, self.max_seq_len = extract_time(self.ori_data)
        self.no, self.seq_len, self.z_dim = np.asarray(ori_data).shape
        self.device = torch.device("cpu")

        # Create and initialize networks.
        self.para = dict()
        self.para['module'] = self.opt.module
        self.para['input_dim'] = self.z_dim
        self.para['hidden_dim'] = self.opt.hidden_dim
        self.para['num_layer'] = self.opt.num_layer
        self.embedder = Embedder(self.para).to(self.device)
        self.recovery = Recovery(self.para).to(self.device)
        self.generator = Generator(self.para).to(self.device)
        self.discriminator = Discriminator(self.para).to(self.device)
        self.supervisor = Supervisor(self.para).to(self.device)

        # Create and initialize optimizer.
        self.optim_embedder = torch.optim.Adam(self.embedder.parameters(), lr=self.opt.lr)
        self.optim_recovery = torch.optim.Adam(self.recovery.parameters(), lr=self.opt.lr)
        self.optim_generator = torch.optim.Adam(self.generator.parameters(), lr=self.opt.lr)
        self.optim_discriminator = torch.optim.Adam(self.discriminator.parameters(), lr=self.opt.lr)
        self.optim_supervisor = torch.optim.Adam(self.supervisor.parameters(), lr=self.opt.lr)

        # Set loss function
        self.MSELoss = torch.nn.MSELoss()
        self.BCELoss = torch.nn.BCELoss()

    def gen_batch(self):

        # Set training batch
        self.X, self.T = batch_generator(self.ori_data, self.ori_time, self.opt.batch_size)
        self.X = torch.tensor(np.array(self.X), dtype=torch.float32).to(self.device)
        # Random vector generation
        self.Z = random_generator(self.opt.batch_size, self.para['input_dim'], self.max_seq_len, self.T)
        self.Z = torch.tensor(np.array(self.Z), dtype=torch.float32).to(self.device)

        # total networks forward
        self.H = self.embedder(self.X)
        self.X_tilde = self.recovery(self.H)
        self.H_hat_supervise = self.supervisor(self.H)

        self.E_hat = self.generator(self.Z)
        self.H_hat = self.supervisor(self.E_hat)
        self.X_hat = self.recovery(self.H_hat)

        self.Y_real = self.discriminator(self.H)
        self.Y_fake = self.discriminator(self.H_hat)
        self.Y_fake_e = self.discriminator(self.E_hat)

    def train_embedder(self, join_train=False):
        self.embedder.train()
        self.recovery.train()
        self.optim_embedder.zero_grad()
        self.optim_recovery.zero_grad()
        self.E_loss_T0 = self.MSELoss(self.X, self.X_tilde)
        self.E_loss0 = 10 * torch.sqrt(self.E_loss_T0)
        if not join_train:
            # E0_solver
            self.E_loss0.backward()
        else:
            # E_solver
            self.G_loss_S = self.MSELoss(self.H[:, 1:, :], self.H_hat_supervise[:, :-1, :])
            self.E_loss = self.E_loss0 + 0.1 * self.G_loss_S
            self.E_loss.backward()  # @e_backward
        self.optim_embedder.step()
        self.optim_recovery.step()

    def train_generator(self):
        # G_solver
        self.optim_generator.zero_grad()
        self.optim_supervisor.zero_grad()
        self.G_loss_U = self.BCELoss(self.Y_fake, torch.ones_like(self.Y_fake))
        self.G_loss_U_e = self.BCELoss(self.Y_fake_e, torch.ones_like(self.Y_fake_e))
        self.G_loss_V1 = torch.mean(torch.abs(torch.sqrt(torch.std(self.X_hat, [0])[1] + 1e-6) - torch.sqrt(
            torch.std(self.X, [0])[1] + 1e-6)))
        self.G_loss_V2 = torch.mean(torch.abs((torch.mean(self.X_hat, [0])) - (torch.mean(self.X, [0]))))
        self.G_loss_V = self.G_loss_V1 + self.G_loss_V2
        self.G_loss_S = self.MSELoss(self.H_hat_supervise[:, :-1, :], self.H[:, 1:, :])
        self.G_loss = self.G_loss_U + \
                      self.opt.gamma * self.G_loss_U_e + \
                      torch.sqrt(self.G_loss_S) * 100 + \
                      self.G_loss_V * 100

        self.G_loss.backward()
        self.optim_generator.step()
        self.optim_supervisor.step()

    def train_discriminator(self):
        # D_solver
        self.discriminator.train()
        self.optim_discriminator.zero_grad()
        self.D_loss_real = self.BCELoss(self.Y_real, torch.ones_like(self.Y_real))
        self.D_loss_fake = self.BCELoss(self.Y_fake, torch.zeros_like(self.Y_fake))
        self.D_loss_fake_e = self.BCELoss(self.Y_fake_e, torch.zeros_like(self.Y_fake_e))
        self.D_loss = self.D_loss_real + \
                      self.D_loss_fake + \
                      self.opt.gamma * self.D_loss_fake_e
        # Train discriminator (only when the discriminator does not work well)
        if self.D_loss > 0.15:
            self.D_loss.backward()
            self.optim_discriminator.step()


def build() -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    opt = SimpleNamespace(module='gru', hidden_dim=4, num_layer=2, batch_size=4, gamma=1, lr=1e-3)
    ori_data = np.random.uniform(0., 1., (16, 6, 3))
    model = TimeGAN(opt, ori_data)
    return {"model": model}


def iteration(state: dict) -> None:
    model = state["model"]
    # Generator training (twice more than discriminator training)
    for kk in range(2):
        model.gen_batch()
        model.train_generator()
        model.train_embedder(join_train=True)
    # Discriminator training
    model.gen_batch()
    model.train_discriminator()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
