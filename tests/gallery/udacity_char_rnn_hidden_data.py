"""Udacity's character-level LSTM (Anna Karenina): the hidden state carried across batches, repacked with `.data`.

Source: udacity/deep-learning-v2-pytorch, recurrent-neural-networks/char-rnn/Character_Level_RNN_Solution.ipynb
(commit 2be0def9a9c0ab86c2449ae42d1444f8283bf858), a port of karpathy's char-rnn: one_hot_encode, get_batches
(batch_size rows, windows of seq_length, targets shifted by one), CharRNN (LSTM with dropout and batch_first,
Dropout, fc; init_hidden from `weight.new(...).zero_()`), and train(): Adam, CrossEntropyLoss, a 1 - val_frac
split, per epoch `h = net.init_hidden(batch_size)`, per batch `h = tuple([each.data for each in h])` ("Creating new
variables for the hidden state, otherwise we'd backprop through the entire training history"), `net.zero_grad()`,
`output, h = net(inputs, h)`, `loss.backward()`, `clip_grad_norm_`, `opt.step()`, and every `print_every` steps a
validation pass (net.eval(), its own `val_h` repacked the same way, `val_losses.append(val_loss.item())`, no
torch.no_grad(), net.train()) whose print is left out here. The iteration is one batch of the inner loop (the
epoch's first batch also runs the epoch's `h = net.init_hidden(batch_size)`). Retyped at CPU size: a made-up text
of 30 characters over 7 symbols in place of anna.txt, n_hidden 4, n_layers 2, drop_prob 0.5 as published, batch
size 2, seq_length 3, lr 0.001 and clip 5 as published; val_frac 0.4 (published 0.1, which leaves no whole
validation batch of a text this short) and print_every 2 (published 10), so the validation pass runs; train_on_gpu
is False.
"""

import itertools
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F  # noqa: F401 (as published)
from torch import nn

ITERATIONS = 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "h", "line": "@net_forward"}],
    "modifies_in_place": [],
}

train_on_gpu = False


def one_hot_encode(arr, n_labels):

    # Initialize the the encoded array
    one_hot = np.zeros((np.multiply(*arr.shape), n_labels), dtype=np.float32)

    # Fill the appropriate elements with ones
    one_hot[np.arange(one_hot.shape[0]), arr.flatten()] = 1.

    # Finally reshape it to get back to the original array
    one_hot = one_hot.reshape((*arr.shape, n_labels))

    return one_hot


def get_batches(arr, batch_size, seq_length):
    '''Create a generator that returns batches of size
       batch_size x seq_length from arr.'''

    batch_size_total = batch_size * seq_length
    # total number of batches we can make
    n_batches = len(arr)//batch_size_total

    # Keep only enough characters to make full batches
    arr = arr[:n_batches * batch_size_total]
    # Reshape into batch_size rows
    arr = arr.reshape((batch_size, -1))

    # iterate through the array, one sequence at a time
    for n in range(0, arr.shape[1], seq_length):
        # The features
        x = arr[:, n:n+seq_length]
        # The targets, shifted by one
        y = np.zeros_like(x)
        try:
            y[:, :-1], y[:, -1] = x[:, 1:], arr[:, n+seq_length]
        except IndexError:
            y[:, :-1], y[:, -1] = x[:, 1:], arr[:, 0]
        yield x, y


class CharRNN(nn.Module):

    def __init__(self, tokens, n_hidden=256, n_layers=2,
                               drop_prob=0.5, lr=0.001):
        super().__init__()
        self.drop_prob = drop_prob
        self.n_layers = n_layers
        self.n_hidden = n_hidden
        self.lr = lr

        # creating character dictionaries
        self.chars = tokens
        self.int2char = dict(enumerate(self.chars))
        self.char2int = {ch: ii for ii, ch in self.int2char.items()}

        ## TODO: define the LSTM
        self.lstm = nn.LSTM(len(self.chars), n_hidden, n_layers,
                            dropout=drop_prob, batch_first=True)

        ## TODO: define a dropout layer
        self.dropout = nn.Dropout(drop_prob)

        ## TODO: define the final, fully-connected output layer
        self.fc = nn.Linear(n_hidden, len(self.chars))


    def forward(self, x, hidden):
        ''' Forward pass through the network.
            These inputs are x, and the hidden/cell state `hidden`. '''

        ## TODO: Get the outputs and the new hidden state from the lstm
        r_output, hidden = self.lstm(x, hidden)  # @lstm_forward

        ## TODO: pass through a dropout layer
        out = self.dropout(r_output)

        # Stack up LSTM outputs using view
        # you may need to use contiguous to reshape the output
        out = out.contiguous().view(-1, self.n_hidden)

        ## TODO: put x through the fully-connected layer
        out = self.fc(out)

        # return the final output and the hidden state
        return out, hidden


    def init_hidden(self, batch_size):
        ''' Initializes hidden state '''
        # Create two new tensors with sizes n_layers x batch_size x n_hidden,
        # initialized to zero, for hidden state and cell state of LSTM
        weight = next(self.parameters()).data

        if (train_on_gpu):
            hidden = (weight.new(self.n_layers, batch_size, self.n_hidden).zero_().cuda(),
                  weight.new(self.n_layers, batch_size, self.n_hidden).zero_().cuda())
        else:
            hidden = (weight.new(self.n_layers, batch_size, self.n_hidden).zero_(),
                      weight.new(self.n_layers, batch_size, self.n_hidden).zero_())

        return hidden


def build() -> dict:
    torch.manual_seed(0)
    text = "abcab fecda bbe facde abdef cab"[:30]
    chars = tuple(sorted(set(text)))
    int2char = dict(enumerate(chars))
    char2int = {ch: ii for ii, ch in int2char.items()}
    encoded = np.array([char2int[ch] for ch in text])

    n_hidden=4
    n_layers=2
    net = CharRNN(chars, n_hidden, n_layers)

    # train(net, encoded, epochs=20, batch_size=2, seq_length=3, lr=0.001, print_every=2), up to its loops
    data, batch_size, seq_length, lr, clip, val_frac = encoded, 2, 3, 0.001, 5, 0.4
    net.train()

    opt = torch.optim.Adam(net.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()

    # create training and validation data
    val_idx = int(len(data)*(1-val_frac))
    data, val_data = data[:val_idx], data[val_idx:]

    if(train_on_gpu):
        net.cuda()

    n_chars = len(net.chars)
    return {"net": net, "opt": opt, "criterion": criterion, "data": data, "val_data": val_data,
            "batch_size": batch_size, "seq_length": seq_length, "clip": clip, "print_every": 2,
            "n_chars": n_chars, "counter": 0, "batch": 0, "h": None}


def train_batch(state: dict) -> None:
    net, opt, criterion = state["net"], state["opt"], state["criterion"]
    data, val_data, batch_size, seq_length = state["data"], state["val_data"], state["batch_size"], state["seq_length"]
    clip, print_every, n_chars = state["clip"], state["print_every"], state["n_chars"]
    n_batches = len(data) // (batch_size * seq_length)
    b = state["batch"] % n_batches
    state["batch"] += 1
    if b == 0:
        # initialize hidden state
        state["h"] = net.init_hidden(batch_size)
    x, y = next(itertools.islice(get_batches(data, batch_size, seq_length), b, None))
    state["counter"] += 1
    counter = state["counter"]

    # One-hot encode our data and make them Torch tensors
    x = one_hot_encode(x, n_chars)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)

    if(train_on_gpu):
        inputs, targets = inputs.cuda(), targets.cuda()

    # Creating new variables for the hidden state, otherwise
    # we'd backprop through the entire training history
    state["h"] = tuple([each.data for each in state["h"]])  # @repack

    # zero accumulated gradients
    net.zero_grad()

    # get the output from the model
    output, state["h"] = net(inputs, state["h"])  # @net_forward

    # calculate the loss and perform backprop
    loss = criterion(output, targets.view(batch_size*seq_length))
    loss.backward()  # @backward
    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    nn.utils.clip_grad_norm_(net.parameters(), clip)
    opt.step()

    # loss stats
    if counter % print_every == 0:
        # Get validation loss
        val_h = net.init_hidden(batch_size)
        val_losses = []
        net.eval()
        for x, y in get_batches(val_data, batch_size, seq_length):
            # One-hot encode our data and make them Torch tensors
            x = one_hot_encode(x, n_chars)
            x, y = torch.from_numpy(x), torch.from_numpy(y)

            # Creating new variables for the hidden state, otherwise
            # we'd backprop through the entire training history
            val_h = tuple([each.data for each in val_h])

            inputs, targets = x, y
            if(train_on_gpu):
                inputs, targets = inputs.cuda(), targets.cuda()

            output, val_h = net(inputs, val_h)
            val_loss = criterion(output, targets.view(batch_size*seq_length))

            val_losses.append(val_loss.item())

        net.train() # reset to train mode after iterationg through validation data

        state["last_stats"] = (counter, loss.item(), np.mean(val_losses))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
