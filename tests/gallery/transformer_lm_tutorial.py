"""The PyTorch tutorials' nn.Transformer language model: a square subsequent mask made before the batch loop.

Source: pytorch/tutorials, beginner_source/transformer_tutorial.py (commit e5f60c64367b2ff3c19e5b73a2c7eac4bf1269f1),
"Sequence-to-Sequence Modeling with nn.Transformer and TorchText". As published: TransformerModel (Embedding scaled
by sqrt(ninp), PositionalEncoding with its sin/cos buffer and dropout, nn.TransformerEncoder of
TransformerEncoderLayer(ninp, nhead, nhid, dropout), the decoder Linear, init_weights through `.data`,
generate_square_subsequent_mask), batchify, get_batch, CrossEntropyLoss, SGD(lr=5.0), StepLR(optimizer, 1.0,
gamma=0.95), and train(): `model.train()`, `src_mask = model.generate_square_subsequent_mask(bptt)` before the batch
loop, then per batch get_batch, optimizer.zero_grad(), a new mask when the batch is shorter than bptt (the last),
`output = model(data, src_mask)`, the loss on `output.view(-1, ntokens)`, backward,
`torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)`, optimizer.step(), `total_loss += loss.item()`. The
iteration is one batch of train(). Retyped at CPU size: WikiText-2 through torchtext (downloaded) replaced by a
made-up stream of 19 tokens from torch.randint over a vocabulary of 50, batch_size 4 (published 20), bptt 5
(published 35, so the fourth and last batch is 3 long and takes the new mask), emsize 16, nhid 16 (published 200),
nlayers 2, nhead 2, dropout 0.2 as published, max_len 64 (published 5000); the log every 200 batches, evaluate(),
the epoch loop with its scheduler.step() and the test left out.
"""

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401 (as published)

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class TransformerModel(nn.Module):

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__()
        from torch.nn import TransformerEncoder, TransformerEncoderLayer
        self.model_type = 'Transformer'
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

        self.init_weights()

    def generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        mask = mask.float().masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, float(0.0))
        return mask

    def init_weights(self):
        initrange = 0.1
        self.encoder.weight.data.uniform_(-initrange, initrange)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-initrange, initrange)

    def forward(self, src, src_mask):
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, src_mask)
        output = self.decoder(output)
        return output


class PositionalEncoding(nn.Module):

    def __init__(self, d_model, dropout=0.1, max_len=64):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)

        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer('pe', pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


device = torch.device("cpu")
NTOKENS = 50


def batchify(data, bsz):
    # Divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


bptt = 5
def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].reshape(-1)
    return data, target


def build() -> dict:
    torch.manual_seed(0)
    batch_size = 4
    train_data = batchify(torch.randint(0, NTOKENS, (19 * batch_size,)), batch_size)

    ntokens = NTOKENS # the size of vocabulary
    emsize = 16 # embedding dimension
    nhid = 16 # the dimension of the feedforward network model in nn.TransformerEncoder
    nlayers = 2 # the number of nn.TransformerEncoderLayer in nn.TransformerEncoder
    nhead = 2 # the number of heads in the multiheadattention models
    dropout = 0.2 # the dropout value
    model = TransformerModel(ntokens, emsize, nhead, nhid, nlayers, dropout).to(device)

    criterion = nn.CrossEntropyLoss()
    lr = 5.0 # learning rate
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)

    # train(), up to its batch loop
    model.train() # Turn on the train mode
    total_loss = 0.
    src_mask = model.generate_square_subsequent_mask(bptt).to(device)
    return {"model": model, "criterion": criterion, "optimizer": optimizer, "scheduler": scheduler,
            "train_data": train_data, "src_mask": src_mask, "total_loss": total_loss, "batch": 0}


def train_batch(state: dict) -> None:
    """One pass of train()'s `for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):`."""
    model, criterion, optimizer, train_data = state["model"], state["criterion"], state["optimizer"], state["train_data"]
    ntokens = NTOKENS
    batches = range(0, train_data.size(0) - 1, bptt)
    i = batches[state["batch"] % len(batches)]
    state["batch"] += 1
    data, targets = get_batch(train_data, i)
    optimizer.zero_grad()
    if data.size(0) != bptt:
        state["src_mask"] = model.generate_square_subsequent_mask(data.size(0)).to(device)
    output = model(data, state["src_mask"])
    loss = criterion(output.view(-1, ntokens), targets)
    loss.backward()  # @backward
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()

    state["total_loss"] += loss.item()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
