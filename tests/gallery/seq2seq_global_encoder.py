"""A batched seq2seq whose train() reads a global encoder output built once, not its own local one.

Source: vijendra-rana/Random, translation_with_batch.py (linked from spro/practical-pytorch issue #27,
"Batch support in seq2seq tutorial", where it raised "Trying to backward through the graph second
time" and its author could not see a second backward). Its train() computes
`encoder_outputs, encoder_hidden = encoder(...)` but copies `output_from_encoder[i]`, a module-level
name, into `encoder_outputs_for_decoder`; the global was made by running the encoder once outside the
loop (the script uses it without defining it; here build() makes it the same way). Retyped at CPU
size: vocabulary 10, hidden 8, batch 2, MAX_LENGTH 4, teacher forcing on as in the published train()
(which sets use_teacher_forcing = True), SGD; `F.softmax(x)` and `F.log_softmax(x)` get their implicit
dim=1 written out and `loss.data[0]` is `loss.item()`. The published unpacking
`en_sen,en_mask,dec_sen,dec_mask = next(batch_generator)` (which swaps what batchify yields) is kept;
so that it indexes within bounds, fake_data gives a pair's two sentences the same length.
"""

import random
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.autograd import Variable

ITERATIONS = 3
MAX_LENGTH = 4
batch_size = 2
hidden_size = 8
teacher_forcing_ratio = 0.5
output_from_encoder = None  # set by build(), read by train() as the published script does

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "output_from_encoder", "line": "@build_global"}],
    "notes": [],
    "modifies_in_place": [],
}


class EncoderRNN(nn.Module):
    def __init__(self, input_size, batch_size, hidden_size, n_layers=1):
        super().__init__()
        self.n_layers = n_layers
        self.batch_size = batch_size
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).view(-1, self.batch_size, self.hidden_size)
        output = embedded
        for i in range(self.n_layers):
            output, hidden = self.gru(output, hidden)
        return output, hidden

    def initHidden(self):
        return Variable(torch.zeros(self.n_layers, self.batch_size, self.hidden_size))


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, batch_size, n_layers=1, dropout_p=0.1, max_length=MAX_LENGTH):
        super().__init__()
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.n_layers = n_layers
        self.dropout_p = dropout_p
        self.max_length = max_length
        self.batch_size = batch_size
        self.embedding = nn.Embedding(self.output_size, self.hidden_size)
        self.attn = nn.Linear(self.hidden_size * 2, self.max_length)
        self.attn_combine = nn.Linear(self.hidden_size * 2, self.hidden_size)
        self.dropout = nn.Dropout(self.dropout_p)
        self.gru = nn.GRU(self.hidden_size, self.hidden_size)
        self.out = nn.Linear(self.hidden_size, self.output_size)

    def forward(self, input, hidden, encoder_outputs):
        embedded = self.embedding(input).view(1, batch_size, -1)
        embedded = self.dropout(embedded)
        attn_weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        encoder_outputs = encoder_outputs.transpose(1, 0)
        attn_weights = attn_weights.unsqueeze(1)
        attn_applied = torch.bmm(attn_weights, encoder_outputs)
        attn_applied = attn_applied.transpose(0, 1)
        output = torch.cat((embedded[0], attn_applied[0]), 1)
        output = self.attn_combine(output).unsqueeze(0)
        for i in range(self.n_layers):
            output = F.relu(output)
            output, hidden = self.gru(output, hidden)
        output = F.log_softmax(self.out(output[0]), dim=1)
        return output, hidden, attn_weights


def fake_data(no_of_pairs, max_size_len=3, max_vocab=10):
    encoding_sentences, decoding_sentences = [], []
    for i in range(no_of_pairs):
        length = random.randint(1, max_size_len)
        encoding_sentences.append([random.randint(3, max_vocab - 1) for num in range(length)])
        decoding_sentences.append([random.randint(3, max_vocab - 1) for num in range(length)])
    return encoding_sentences, decoding_sentences


def batchify(pairs_sorted, batch_size):
    num_batches = len(pairs_sorted) // batch_size
    while True:
        for i in range(num_batches):
            pairs_result = pairs_sorted[i:i + batch_size]
            encoding_sentences = [pair[0] for pair in pairs_result]
            max_encoding_length = len(encoding_sentences[-1])
            encoding_sentences = [s + [0] * (max_encoding_length - len(s)) + [1] for s in encoding_sentences]
            encoding_mask = [list(map(lambda a: 0 if a == 0 else 1, s)) for s in encoding_sentences]
            decoding_sentences = [pair[1] for pair in pairs_result]
            max_decoding_length = len(max(decoding_sentences, key=len))
            decoding_sentences = [s + [0] * (max_decoding_length - len(s)) + [1] for s in decoding_sentences]
            decoding_mask = [list(map(lambda a: 0 if a == 0 else 1, s)) for s in decoding_sentences]
            yield Variable(torch.LongTensor(encoding_sentences)), Variable(torch.LongTensor(decoding_sentences)), \
                Variable(torch.LongTensor(encoding_mask)), Variable(torch.LongTensor(decoding_mask))
        pairs_sorted = pairs_sorted[::-1]


def train(encoder_sentences, decoder_sentences, decoder_mask, encoder, decoder, encoder_optimizer, decoder_optimizer, max_len=MAX_LENGTH):
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    encoder_outputs, encoder_hidden = encoder(encoder_sentences, encoder.initHidden())

    encoder_outputs_for_decoder = Variable(torch.zeros(max_len, batch_size, hidden_size))
    for i in range(output_from_encoder.size(0)):
        encoder_outputs_for_decoder[i] = output_from_encoder[i]  # @read_global

    decoder_input = Variable(torch.LongTensor([2] * batch_size)).view(-1, 1)
    decoder_hidden = encoder_hidden
    use_teacher_forcing = True if random.random() < teacher_forcing_ratio else False
    decoding_len = decoder_sentences.size()[1]
    loss = 0
    use_teacher_forcing = True
    if use_teacher_forcing:
        for i in range(decoding_len):
            output_from_decoder, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs_for_decoder)
            tmp = decoder_sentences[:, i].contiguous().view(-1, 1)
            word_loss = output_from_decoder.gather(1, tmp) * decoder_mask[:, i].float().contiguous().view(-1, 1)
            loss += -1 * word_loss.sum()
            decoder_input = decoder_sentences[:, i].contiguous().view(-1, 1)
    loss.backward()  # @backward
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.item() / decoding_len


def build() -> dict:
    global output_from_encoder
    torch.manual_seed(0)
    random.seed(0)
    encoder = EncoderRNN(10, hidden_size=hidden_size, batch_size=batch_size)
    attn_decoder1 = AttnDecoderRNN(hidden_size, 10, 1, dropout_p=0.1)
    encoding, decoding = fake_data(8)
    pairs_sorted = sorted(zip(encoding, decoding), key=lambda pair: len(pair[0]))
    batch_gen = batchify([list(pair) for pair in pairs_sorted], batch_size)
    sample_sentences = next(batchify([list(pair) for pair in pairs_sorted], batch_size))[0]
    output_from_encoder, _ = encoder(sample_sentences, encoder.initHidden())  # @build_global
    return {
        "encoder": encoder,
        "decoder": attn_decoder1,
        "batch_generator": batch_gen,
        "encoder_optimizer": optim.SGD(encoder.parameters(), lr=0.01),
        "decoder_optimizer": optim.SGD(attn_decoder1.parameters(), lr=0.01),
    }


def train_step(state: dict) -> float:
    en_sen, en_mask, dec_sen, dec_mask = next(state["batch_generator"])
    return train(en_sen, dec_sen, dec_mask, state["encoder"], state["decoder"],
                 state["encoder_optimizer"], state["decoder_optimizer"])


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for iter in range(1, iterations + 1):
        train_step(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_step(state)


if __name__ == "__main__":
    run(build())
