"""pytorch/examples' MNIST VAE: reparameterized samples, BCE + KL summed, the epoch's loss kept as a number.

Source: pytorch/examples, vae/main.py (commit cd01f93000a6679e768700dd29e417a1e5fd10e5). As published: VAE
(fc1 784->400, fc21 and fc22 400->20, fc3 20->400, fc4 400->784; encode with ReLU, reparameterize
`mu + eps*std` with `eps = torch.randn_like(std)`, decode through a sigmoid), Adam(lr=1e-3), loss_function
(`F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')` + KLD), and train(epoch)'s batch loop:
optimizer.zero_grad(), `recon_batch, mu, logvar = model(data)`, the loss, loss.backward(),
`train_loss += loss.item()` (a number carried across batches), optimizer.step(), the log_interval print of
`loss.item() / len(data)`. The iteration is one batch; `train_loss` is kept in the state for the epoch's print.
Retyped at CPU size: hidden 400 -> 32 and latent 20 -> 4, batch size 8 (published 128), made-up images in [0, 1]
of MNIST's shape (1x28x28) in a list standing in for the DataLoader, 3 batches; test() and save_image left out.
"""

from collections.abc import Callable

import torch
from torch import nn, optim
from torch.nn import functional as F

ITERATIONS = 3
BATCH_SIZE = 8
HIDDEN = 32
LATENT = 4
LOG_INTERVAL = 10

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(784, HIDDEN)
        self.fc21 = nn.Linear(HIDDEN, LATENT)
        self.fc22 = nn.Linear(HIDDEN, LATENT)
        self.fc3 = nn.Linear(LATENT, HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5*logvar)
        eps = torch.randn_like(std)
        return mu + eps*std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')

    # see Appendix B from VAE paper:
    # Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # https://arxiv.org/abs/1312.6114
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    return BCE + KLD


def build() -> dict:
    torch.manual_seed(1)
    device = torch.device("cpu")
    model = VAE().to(device)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    train_loader = [(torch.rand(BATCH_SIZE, 1, 28, 28), torch.zeros(BATCH_SIZE, dtype=torch.long))
                    for _ in range(ITERATIONS)]
    model.train()
    return {"model": model, "optimizer": optimizer, "train_loader": train_loader, "batch_idx": 0,
            "train_loss": 0}


def iteration(state: dict) -> None:
    model, optimizer = state["model"], state["optimizer"]
    device = torch.device("cpu")
    batch_idx = state["batch_idx"]
    data, _ = state["train_loader"][batch_idx % len(state["train_loader"])]
    state["batch_idx"] += 1
    data = data.to(device)
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    loss = loss_function(recon_batch, data, mu, logvar)
    loss.backward()  # @backward
    state["train_loss"] += loss.item()
    optimizer.step()
    if batch_idx % LOG_INTERVAL == 0:
        _ = loss.item() / len(data)  # the published print


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
