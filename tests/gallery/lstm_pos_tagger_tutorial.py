"""The PyTorch tutorials' LSTM part-of-speech tagger: the hidden state kept on the module, reset per sentence.

Source: pytorch/tutorials, beginner_source/nlp/sequence_models_tutorial.py (commit
f77e1c2c11be5d612ed9adbc73a8b82904162c23), "Sequence Models and Long Short-Term Memory Networks", the example
"An LSTM for Part-of-Speech Tagging". As published at that commit: prepare_sequence, the two made-up sentences and
their DET/NN/V tags, word_to_ix and tag_to_ix, LSTMTagger (Embedding, nn.LSTM, the hidden2tag Linear,
`self.hidden = self.init_hidden()` in __init__, init_hidden returning zeros (h, c), and a forward that sets
`lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)` on the module and returns
log_softmax tag scores), NLLLoss, SGD(lr=0.1), the scores "before training" computed with the graph on
(`tag_scores = model(inputs)`, kept, as the script's global is, until the loop rebinds it), and per epoch, for each
sentence: model.zero_grad(), `model.hidden = model.init_hidden()` ("we need to clear out the hidden state of the
LSTM, detaching it from its history on the last instance"), prepare_sequence for words and tags,
`tag_scores = model(sentence_in)`, the loss, backward, optimizer.step(). The iteration is one epoch (both
sentences). Retyped: `autograd.Variable(...)` removed (the tensor itself), the forward's LSTM call on one line,
print calls left out; sizes as published (EMBEDDING_DIM 6, HIDDEN_DIM 6); 3 epochs instead of 300, and the check
after training left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "tag_scores", "line": "@log_softmax"}, {"variable": "model.hidden", "line": "@lstm_hidden"}],
    "modifies_in_place": [],
}


def prepare_sequence(seq, to_ix):
    idxs = [to_ix[w] for w in seq]
    tensor = torch.LongTensor(idxs)
    return tensor


# These will usually be more like 32 or 64 dimensional.
# We will keep them small, so we can see how the weights change as we train.
EMBEDDING_DIM = 6
HIDDEN_DIM = 6


class LSTMTagger(nn.Module):

    def __init__(self, embedding_dim, hidden_dim, vocab_size, tagset_size):
        super(LSTMTagger, self).__init__()
        self.hidden_dim = hidden_dim

        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)

        # The LSTM takes word embeddings as inputs, and outputs hidden states
        # with dimensionality hidden_dim.
        self.lstm = nn.LSTM(embedding_dim, hidden_dim)

        # The linear layer that maps from hidden state space to tag space
        self.hidden2tag = nn.Linear(hidden_dim, tagset_size)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        # Before we've done anything, we dont have any hidden state.
        # Refer to the Pytorch documentation to see exactly
        # why they have this dimensionality.
        # The axes semantics are (num_layers, minibatch_size, hidden_dim)
        return (torch.zeros(1, 1, self.hidden_dim),
                torch.zeros(1, 1, self.hidden_dim))

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)  # @lstm_hidden
        tag_space = self.hidden2tag(lstm_out.view(len(sentence), -1))
        tag_scores = F.log_softmax(tag_space, dim=1)  # @log_softmax
        return tag_scores


def build() -> dict:
    torch.manual_seed(1)
    training_data = [
        ("The dog ate the apple".split(), ["DET", "NN", "V", "DET", "NN"]),
        ("Everybody read that book".split(), ["NN", "V", "DET", "NN"])
    ]
    word_to_ix = {}
    for sent, tags in training_data:
        for word in sent:
            if word not in word_to_ix:
                word_to_ix[word] = len(word_to_ix)
    tag_to_ix = {"DET": 0, "NN": 1, "V": 2}

    model = LSTMTagger(EMBEDDING_DIM, HIDDEN_DIM, len(word_to_ix), len(tag_to_ix))
    loss_function = nn.NLLLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.1)

    # See what the scores are before training
    # Note that element i,j of the output is the score for tag j for word i.
    inputs = prepare_sequence(training_data[0][0], word_to_ix)
    tag_scores = model(inputs)  # @precheck
    return {"model": model, "loss_function": loss_function, "optimizer": optimizer, "training_data": training_data,
            "word_to_ix": word_to_ix, "tag_to_ix": tag_to_ix, "tag_scores": tag_scores}


def iteration(state: dict) -> None:
    model, loss_function, optimizer = state["model"], state["loss_function"], state["optimizer"]
    word_to_ix, tag_to_ix = state["word_to_ix"], state["tag_to_ix"]
    for sentence, tags in state["training_data"]:
        # Step 1. Remember that Pytorch accumulates gradients.
        # We need to clear them out before each instance
        model.zero_grad()

        # Also, we need to clear out the hidden state of the LSTM,
        # detaching it from its history on the last instance.
        model.hidden = model.init_hidden()

        # Step 2. Get our inputs ready for the network, that is, turn them into
        # Variables of word indices.
        sentence_in = prepare_sequence(sentence, word_to_ix)
        targets = prepare_sequence(tags, tag_to_ix)

        # Step 3. Run our forward pass.
        state["tag_scores"] = model(sentence_in)  # @forward

        # Step 4. Compute the loss, gradients, and update the parameters by
        #  calling optimizer.step()
        loss = loss_function(state["tag_scores"], targets)
        loss.backward()  # @backward
        optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):  # again, normally you would NOT do 300 epochs, it is toy data
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
