"""Lightning 2.x truncated backpropagation through time under manual optimization: each `training_step` splits its
batch along time and runs a backward and an optimizer step per split, detaching the hidden state between splits.

Source: Lightning-AI/pytorch-lightning, docs/source-pytorch/common/tbptt.rst (commit
1c4612e56450f78f5bd44e317ece42d7cdf1693c; lightning.ai/docs/pytorch/2.5.0/common/tbptt.html), the 2.x replacement of
the removed `truncated_bptt_steps` hook: `self.automatic_optimization = False`, `self.truncated_bptt_steps = 10`,
`self.my_rnn = ParityModuleRNN()`, in `training_step` `split_batches = split_batch(batch,
self.truncated_bptt_steps)`, `hiddens = torch.zeros(1, batch_size, hidden_dim, device=self.device)`, per split
`loss, hiddens = self.my_rnn(split_batch, hiddens)`, `self.backward(loss)`, `self.optimizer.step()`,
`self.optimizer.zero_grad()`, `hiddens = hiddens.detach()`, `return None`; `configure_optimizers` returns
`optim.Adam(self.my_rnn.parameters(), lr=0.001)`; `trainer.fit(model, train_dataloader)`. The example leaves
`split_batch`, `ParityModuleRNN`'s two-argument form and `self.optimizer` undefined; they are filled in the way the
example's own prose says (the batch split along the time dimension with `torch.split`, a one-layer RNN of hidden 20
from the `(x, y)` split and the hidden state to `(loss, hiddens)` as in Lightning's tests/helpers ParityModuleRNN,
an `nn.LSTM` replaced by `nn.GRU` so that the hidden state is the one tensor the example makes, and `self.optimizer
= self.optimizers()`), and the loop over `split_batches` iterates over the splits. Data: Lightning's tests'
`AverageDataset` (`input_seq = torch.randn(dataset_len, sequence_len, 10)`, `output_seq = top + bottom.roll(...)`).
Retyped at CPU size: batches of 2 sequences of 6 (published 10 of 100), `truncated_bptt_steps` 3 (10), hidden 4
(20); `Trainer(accelerator="cpu", limit_train_batches=..., max_epochs=1)` with no logger, checkpointing, progress
bar or model summary.

The backwards run from `training_step` in the learner's file (`self.backward` calls `loss.backward()`).
"""

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from pytorch_lightning import LightningModule
from torch.utils.data import DataLoader, Dataset

FRAMEWORK = "lightning"
WAYS = ("watch", "command")  # Lightning runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
BATCH_SIZE = 2
HIDDEN_DIM = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class AverageDataset(Dataset):
    def __init__(self, dataset_len=300, sequence_len=100):
        self.dataset_len = dataset_len
        self.sequence_len = sequence_len
        self.input_seq = torch.randn(dataset_len, sequence_len, 10)
        top, bottom = self.input_seq.chunk(2, -1)
        self.output_seq = top + bottom.roll(shifts=1, dims=-1)

    def __len__(self):
        return self.dataset_len

    def __getitem__(self, item):
        return self.input_seq[item], self.output_seq[item]


class ParityModuleRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(10, HIDDEN_DIM, batch_first=True)
        self.linear_out = nn.Linear(in_features=HIDDEN_DIM, out_features=5)

    def forward(self, batch, hiddens):
        x, y = batch
        seq, hiddens = self.rnn(x, hiddens)
        loss = F.mse_loss(self.linear_out(seq), y)
        return loss, hiddens


def split_batch(batch, split_size):
    x, y = batch
    return list(zip(torch.split(x, split_size, dim=1), torch.split(y, split_size, dim=1)))


class LitModel(LightningModule):
    def __init__(self):
        super().__init__()

        # 1. Switch to manual optimization
        self.automatic_optimization = False

        self.truncated_bptt_steps = 3
        self.my_rnn = ParityModuleRNN()  # Define RNN model using ParityModuleRNN

    # 2. Remove the `hiddens` argument
    def training_step(self, batch, batch_idx):
        self.optimizer = self.optimizers()

        # 3. Split the batch in chunks along the time dimension
        split_batches = split_batch(batch, self.truncated_bptt_steps)

        batch_size = BATCH_SIZE
        hidden_dim = HIDDEN_DIM
        hiddens = torch.zeros(1, batch_size, hidden_dim, device=self.device)
        for split_batch_ in split_batches:
            # 4. Perform the optimization in a loop
            loss, hiddens = self.my_rnn(split_batch_, hiddens)
            self.backward(loss)  # @backward
            self.optimizer.step()
            self.optimizer.zero_grad()

            # 5. "Truncate"
            hiddens = hiddens.detach()

        # 6. Remove the return of `hiddens`
        # Returning loss in manual optimization is not needed
        return None

    def configure_optimizers(self):
        return optim.Adam(self.my_rnn.parameters(), lr=0.001)


def build() -> dict:
    torch.manual_seed(0)
    model = LitModel()
    train_dataloader = DataLoader(
        AverageDataset(dataset_len=BATCH_SIZE * (ITERATIONS + 1), sequence_len=6), batch_size=BATCH_SIZE
    )
    return {"model": model, "train_dataloader": train_dataloader}


def run(state: dict, iterations: int = ITERATIONS, callbacks=()) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=iterations,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(state["model"], state["train_dataloader"])  # @fit


if __name__ == "__main__":
    run(build())
