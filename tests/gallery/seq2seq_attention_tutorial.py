"""The PyTorch tutorial's seq2seq translation with an attention decoder: a step at a time, teacher forcing.

Source: pytorch/tutorials, intermediate_source/seq2seq_translation_tutorial.py (commit
05e7ce2c19e72d482475d91d458db210cdacec38, "NLP From Scratch: Translation with a Sequence to Sequence Network and
Attention", before its batched rewrite): Lang, EncoderRNN (Embedding, GRU, one word per call, initHidden),
AttnDecoderRNN (attn over `max_length` encoder outputs from the embedded input and the hidden state, bmm,
attn_combine, relu, GRU, log_softmax), tensorFromSentence (indexes + EOS, `.view(-1, 1)`), train() (initHidden,
both zero_grads, `encoder_outputs = torch.zeros(max_length, ...)` filled row by row with
`encoder_outputs[ei] = encoder_output[0, 0]`, `loss = 0` then `loss += criterion(...)` over the decoder steps,
teacher forcing when `random.random() < teacher_forcing_ratio`, otherwise `decoder_input =
topi.squeeze().detach()` and a stop at EOS, `loss.backward()`, both steps, `loss.item() / target_length`),
trainIters (SGD lr 0.01 for each, `training_pairs` drawn with random.choice before the loop, NLLLoss, the running
print/plot totals as floats). Retyped at CPU size: hidden 8 (published 256), MAX_LENGTH 6 (published 10), a
made-up corpus of four tiny French-English pairs in place of eng-fra.txt (read, normalised and filtered);
showPlot, evaluation and the printing are left out; random and torch are seeded in build().
"""

import random
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

device = torch.device("cpu")

SOS_token = 0
EOS_token = 1
MAX_LENGTH = 6


class Lang:
    def __init__(self, name):
        self.name = name
        self.word2index = {}
        self.word2count = {}
        self.index2word = {0: "SOS", 1: "EOS"}
        self.n_words = 2  # Count SOS and EOS

    def addSentence(self, sentence):
        for word in sentence.split(" "):
            self.addWord(word)

    def addWord(self, word):
        if word not in self.word2index:
            self.word2index[word] = self.n_words
            self.word2count[word] = 1
            self.index2word[self.n_words] = word
            self.n_words += 1
        else:
            self.word2count[word] += 1


def prepareData(lang1, lang2):
    """Stands in for readLangs + filterPairs: a few made-up pairs, already normalised and short."""
    pairs = [
        ["je suis froid .", "i am cold ."],
        ["il est grand .", "he is tall ."],
        ["elle est petite .", "she is small ."],
        ["nous sommes ici .", "we are here ."],
    ]
    input_lang, output_lang = Lang(lang1), Lang(lang2)
    for pair in pairs:
        input_lang.addSentence(pair[0])
        output_lang.addSentence(pair[1])
    return input_lang, output_lang, pairs


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size):
        super(EncoderRNN, self).__init__()
        self.hidden_size = hidden_size

        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).view(1, 1, -1)
        output = embedded
        output, hidden = self.gru(output, hidden)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, 1, self.hidden_size, device=device)


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, dropout_p=0.1, max_length=MAX_LENGTH):
        super(AttnDecoderRNN, self).__init__()
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.dropout_p = dropout_p
        self.max_length = max_length

        self.embedding = nn.Embedding(self.output_size, self.hidden_size)
        self.attn = nn.Linear(self.hidden_size * 2, self.max_length)
        self.attn_combine = nn.Linear(self.hidden_size * 2, self.hidden_size)
        self.dropout = nn.Dropout(self.dropout_p)
        self.gru = nn.GRU(self.hidden_size, self.hidden_size)
        self.out = nn.Linear(self.hidden_size, self.output_size)

    def forward(self, input, hidden, encoder_outputs):
        embedded = self.embedding(input).view(1, 1, -1)
        embedded = self.dropout(embedded)

        attn_weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        attn_applied = torch.bmm(attn_weights.unsqueeze(0), encoder_outputs.unsqueeze(0))

        output = torch.cat((embedded[0], attn_applied[0]), 1)
        output = self.attn_combine(output).unsqueeze(0)

        output = F.relu(output)
        output, hidden = self.gru(output, hidden)

        output = F.log_softmax(self.out(output[0]), dim=1)
        return output, hidden, attn_weights

    def initHidden(self):
        return torch.zeros(1, 1, self.hidden_size, device=device)


def indexesFromSentence(lang, sentence):
    return [lang.word2index[word] for word in sentence.split(" ")]


def tensorFromSentence(lang, sentence):
    indexes = indexesFromSentence(lang, sentence)
    indexes.append(EOS_token)
    return torch.tensor(indexes, dtype=torch.long, device=device).view(-1, 1)


def tensorsFromPair(pair):
    input_tensor = tensorFromSentence(input_lang, pair[0])
    target_tensor = tensorFromSentence(output_lang, pair[1])
    return (input_tensor, target_tensor)


teacher_forcing_ratio = 0.5


def train(
    input_tensor,
    target_tensor,
    encoder,
    decoder,
    encoder_optimizer,
    decoder_optimizer,
    criterion,
    max_length=MAX_LENGTH,
):
    encoder_hidden = encoder.initHidden()

    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()

    input_length = input_tensor.size(0)
    target_length = target_tensor.size(0)

    encoder_outputs = torch.zeros(max_length, encoder.hidden_size, device=device)

    loss = 0

    for ei in range(input_length):
        encoder_output, encoder_hidden = encoder(input_tensor[ei], encoder_hidden)
        encoder_outputs[ei] = encoder_output[0, 0]  # @encoder_outputs_row

    decoder_input = torch.tensor([[SOS_token]], device=device)

    decoder_hidden = encoder_hidden

    use_teacher_forcing = True if random.random() < teacher_forcing_ratio else False

    if use_teacher_forcing:
        # Teacher forcing: Feed the target as the next input
        for di in range(target_length):
            decoder_output, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs)
            loss += criterion(decoder_output, target_tensor[di])
            decoder_input = target_tensor[di]  # Teacher forcing

    else:
        # Without teacher forcing: use its own predictions as the next input
        for di in range(target_length):
            decoder_output, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs)
            topv, topi = decoder_output.topk(1)
            decoder_input = topi.squeeze().detach()  # detach from history as input

            loss += criterion(decoder_output, target_tensor[di])
            if decoder_input.item() == EOS_token:
                break

    loss.backward()  # @backward

    encoder_optimizer.step()
    decoder_optimizer.step()

    return loss.item() / target_length


def build() -> dict:
    """What trainIters makes before its loop (the optimizers, training_pairs, the criterion), on the tutorial's
    corpus, encoder1 and attn_decoder1."""
    global input_lang, output_lang, pairs
    random.seed(0)
    torch.manual_seed(0)
    input_lang, output_lang, pairs = prepareData("fra", "eng")
    hidden_size = 8
    encoder1 = EncoderRNN(input_lang.n_words, hidden_size).to(device)
    attn_decoder1 = AttnDecoderRNN(hidden_size, output_lang.n_words, dropout_p=0.1).to(device)
    learning_rate = 0.01
    n_iters = 6
    encoder_optimizer = optim.SGD(encoder1.parameters(), lr=learning_rate)
    decoder_optimizer = optim.SGD(attn_decoder1.parameters(), lr=learning_rate)
    training_pairs = [tensorsFromPair(random.choice(pairs)) for i in range(n_iters)]
    criterion = nn.NLLLoss()
    return {
        "encoder": encoder1,
        "decoder": attn_decoder1,
        "encoder_optimizer": encoder_optimizer,
        "decoder_optimizer": decoder_optimizer,
        "training_pairs": training_pairs,
        "criterion": criterion,
        "iter": 1,
        "print_loss_total": 0,
        "plot_loss_total": 0,
    }


def iteration(state: dict) -> None:
    training_pair = state["training_pairs"][state["iter"] - 1]
    input_tensor = training_pair[0]
    target_tensor = training_pair[1]

    loss = train(
        input_tensor,
        target_tensor,
        state["encoder"],
        state["decoder"],
        state["encoder_optimizer"],
        state["decoder_optimizer"],
        state["criterion"],
    )
    state["print_loss_total"] += loss
    state["plot_loss_total"] += loss
    state["iter"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for iter in range(1, iterations + 1):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
