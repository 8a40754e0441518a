"""Truncated backpropagation through time: the word language model's chunk loop, hidden state repackaged per chunk.

Source: pytorch/examples, word_language_model/main.py (commit cd01f93000a6679e768700dd29e417a1e5fd10e5) with the
RNNModel of its model.py as of that time (dropout, optional tied weights, init_hidden by `weight.new_zeros`):
`hidden = model.init_hidden(args.batch_size)` at the start of train(), then for each chunk `for batch, i in
enumerate(range(0, train_data.size(0) - 1, args.bptt))`: get_batch, `model.zero_grad()`, `hidden =
repackage_hidden(hidden)` (a detach, recursively through the LSTM's (h, c) tuple), `output, hidden = model(data,
hidden)`, CrossEntropyLoss on `output.view(-1, ntokens)`, `loss.backward()`, `clip_grad_norm_`, and the
hand-written SGD `p.data.add_(-lr, p.grad.data)`. The iteration here is one chunk of that inner loop (a seventh
call starts the next epoch's train(), with a fresh init_hidden). Retyped at CPU size: a made-up corpus of 61
token ids from a vocabulary of 10 (the published Wikitext-2 corpus is read from disk), batch size 2, bptt 5,
emsize = nhid = 6, 2 LSTM layers, dropout 0.2 as published, lr 20 and clip 0.25 as published; logging left out.
`p.data.add_(-lr, p.grad.data)` (an overload torch no longer has) is written `p.data.add_(p.grad.data,
alpha=-lr)`, as later versions of the example do.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 4
bptt = 5
clip = 0.25
lr = 20

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "hidden", "line": "@rnn_forward"}],
    "modifies_in_place": [],
}


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        self.encoder.weight.data.uniform_(-initrange, initrange)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)  # @rnn_forward
        output = self.drop(output)
        decoded = self.decoder(output.view(output.size(0) * output.size(1), output.size(2)))
        return decoded.view(output.size(0), output.size(1), decoded.size(1)), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == 'LSTM':
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)


def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""

    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].view(-1)
    return data, target


def build() -> dict:
    torch.manual_seed(1111)
    corpus_train = torch.randint(0, 10, (61,))
    train_data = batchify(corpus_train, 2)
    ntokens = 10
    model = RNNModel('LSTM', ntokens, 6, 6, 2, 0.2, False)
    criterion = nn.CrossEntropyLoss()
    # train(): model.train() and the hidden state of the epoch's first chunk
    model.train()
    hidden = model.init_hidden(2)
    return {"model": model, "criterion": criterion, "train_data": train_data, "ntokens": ntokens,
            "hidden": hidden, "chunk": 0, "total_loss": 0.}


def train_chunk(state: dict) -> None:
    model, criterion, ntokens = state["model"], state["criterion"], state["ntokens"]
    starts = range(0, state["train_data"].size(0) - 1, bptt)
    batch = state["chunk"] % len(starts)
    i = starts[batch]
    state["chunk"] += 1
    if batch == 0 and state["chunk"] > 1:  # the next epoch's train(): a fresh hidden state
        model.train()
        state["hidden"] = model.init_hidden(2)
    data, targets = get_batch(state["train_data"], i)
    # Starting each batch, we detach the hidden state from how it was previously produced.
    # If we didn't, the model would try backpropagating all the way to start of the dataset.
    model.zero_grad()
    state["hidden"] = repackage_hidden(state["hidden"])  # @repackage
    output, state["hidden"] = model(data, state["hidden"])
    loss = criterion(output.view(-1, ntokens), targets)
    loss.backward()  # @backward

    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for p in model.parameters():
        p.data.add_(p.grad.data, alpha=-lr)

    state["total_loss"] += loss.item()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_chunk(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_chunk(state)


if __name__ == "__main__":
    run(build())
