"""A PyTorch Lightning LSTM language model that keeps the last hidden state on `self` for the next batch, undetached.

Source: Lightning-AI/pytorch-lightning issue #655 ("How do you use the hidden state from the previous training step
in the next step?"): the asker's raw loop passes `hidden` from batch to batch with `hidden = detach_tensors(hidden)`;
the answer (BaohaoLiao, confirmed by williamFalcon) keeps it on the LightningModule, `self.previous_hidden = None` in
`__init__` and, in `training_step`, `output, hidden = model(text, self.previous_hidden)` then
`self.previous_hidden = detach_tensors(hidden)`. The LightningModule's shape (a `training_step` that returns the loss,
`configure_optimizers` returning SGD, `trainer.fit(model, train_dataloader)`) is Lightning's own
examples/pytorch/basics/transformer.py (`LanguageModel`). The mistake: the learner stores `hidden` as it comes
(`self.previous_hidden = hidden`), the line the answer wrote with `detach_tensors`, the same mistake as commenting out
`h_state = h_state.data` in MorvanZhou/PyTorch-Tutorial issue #57 ("Trying to backward through the graph a second
time"). Retyped at CPU size: vocabulary 12, embedding 6, LSTM hidden 8, batches of 2 sequences of 5 made-up tokens
(the published example reads WikiText2), `Trainer(accelerator="cpu", limit_train_batches=..., max_epochs=1)` with no
logger, checkpointing, progress bar or model summary; `import pytorch_lightning as pl` (the example's `lightning as
L`); `detach_tensors` is not written, so nothing else changes.

Lightning calls `training_step` inside the closure it hands to `optimizer.step`, and then `loss.backward()` from its
own `LightningModule.backward`, after `training_step` has returned: the learner's innermost line running when the
error is raised is `trainer.fit(...)`.
"""

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = "lightning"
WAYS = ("watch", "command")  # Lightning runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
VOCAB = 12

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@fit"},
    "retains": {},
    "carried": [{"variable": "model.previous_hidden", "line": "@lstm_forward"}],
    "notes": [],
    "modifies_in_place": [],
}


class LanguageModel(pl.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, 6)
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.decoder = nn.Linear(8, vocab_size)
        self.previous_hidden = None  # cache

    def forward(self, text, hidden):
        output, hidden = self.lstm(self.embedding(text), hidden)  # @lstm_forward
        return self.decoder(output), hidden

    def training_step(self, batch, batch_idx):
        text, target = batch
        output, hidden = self(text, self.previous_hidden)
        self.previous_hidden = hidden  # @keep_hidden
        loss = F.cross_entropy(output.reshape(-1, self.vocab_size), target.reshape(-1))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def build() -> dict:
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2 * (ITERATIONS + 2), 6))
    dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return {"model": LanguageModel(vocab_size=VOCAB), "train_dataloader": DataLoader(dataset, batch_size=2)}


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
