"""bentrevett's seq2seq tutorial 3 (Bahdanau attention): the decoder's hidden state starts from the encoder's.

Source: bentrevett/pytorch-seq2seq, "3 - Neural Machine Translation by Jointly Learning to Align and
Translate.ipynb" (commit 1df5de417ee05f1b7bcafe2c01fd0bf250df1a14): Encoder (Embedding, dropout, bidirectional GRU,
`hidden = torch.tanh(self.fc(torch.cat((hidden[-2,:,:], hidden[-1,:,:]), dim = 1)))` as the decoder's first hidden
state), Attention (`attn` Linear on the repeated hidden and the encoder outputs, tanh, a parameter `v` repeated per
batch, bmm, softmax), Decoder (Embedding, dropout, attention-weighted encoder outputs by bmm, GRU on the
concatenation, `assert (output == hidden).all()`, fc_out on output, weighted and embedded), Seq2Seq (`outputs =
torch.zeros(trg_len, batch_size, trg_vocab_size)` filled row by row with `outputs[t] = output`, teacher forcing when
`random.random() < teacher_forcing_ratio`, else `output.argmax(1)`), init_weights (normal 0.01, biases 0), Adam,
CrossEntropyLoss(ignore_index = TRG_PAD_IDX), train() (model.train(), `epoch_loss = 0`, per batch zero_grad, forward,
`output[1:].view(-1, output_dim)`, `loss.backward()`, `clip_grad_norm_(model.parameters(), clip)`, step, `epoch_loss
+= loss.item()`, `return epoch_loss / len(iterator)`) and evaluate() (model.eval(), torch.no_grad(), teacher forcing
off), called once per epoch after train(). The iteration here is one batch of train(); the epoch's last batch also
returns train()'s average and runs evaluate(), as the published epoch loop does next. Retyped at CPU size: made-up
Multi30k-shaped batches (3 training batches and 1 validation batch of 2 sentences, src len 5, trg len 6, `<sos>` = 2,
`<pad>` = 1 at the end of one target) in place of torchtext's Field/BucketIterator and spaCy; vocabularies of 9 and
10, embeddings 4, hidden 5 (encoder) and 6 (decoder), dropout 0.5 as published, CLIP 1 as published; the timing,
printing and saving of the best model's state_dict are left out.
"""

import math
import random
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

ITERATIONS = 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

SEED = 1234
device = torch.device('cpu')


class Encoder(nn.Module):
    def __init__(self, input_dim, emb_dim, enc_hid_dim, dec_hid_dim, dropout):
        super().__init__()

        self.embedding = nn.Embedding(input_dim, emb_dim)

        self.rnn = nn.GRU(emb_dim, enc_hid_dim, bidirectional = True)

        self.fc = nn.Linear(enc_hid_dim * 2, dec_hid_dim)

        self.dropout = nn.Dropout(dropout)

    def forward(self, src):

        #src = [src len, batch size]

        embedded = self.dropout(self.embedding(src))

        #embedded = [src len, batch size, emb dim]

        outputs, hidden = self.rnn(embedded)

        #initial decoder hidden is final hidden state of the forwards and backwards
        #  encoder RNNs fed through a linear layer
        hidden = torch.tanh(self.fc(torch.cat((hidden[-2,:,:], hidden[-1,:,:]), dim = 1)))

        #outputs = [src len, batch size, enc hid dim * 2]
        #hidden = [batch size, dec hid dim]

        return outputs, hidden


class Attention(nn.Module):
    def __init__(self, enc_hid_dim, dec_hid_dim):
        super().__init__()

        self.attn = nn.Linear((enc_hid_dim * 2) + dec_hid_dim, dec_hid_dim)
        self.v = nn.Parameter(torch.rand(dec_hid_dim))

    def forward(self, hidden, encoder_outputs):

        #hidden = [batch size, dec hid dim]
        #encoder_outputs = [src len, batch size, enc hid dim * 2]

        batch_size = encoder_outputs.shape[1]
        src_len = encoder_outputs.shape[0]

        #repeat encoder hidden state src_len times
        hidden = hidden.unsqueeze(1).repeat(1, src_len, 1)

        encoder_outputs = encoder_outputs.permute(1, 0, 2)

        energy = torch.tanh(self.attn(torch.cat((hidden, encoder_outputs), dim = 2)))

        #energy = [batch size, src len, dec hid dim]

        energy = energy.permute(0, 2, 1)

        #energy = [batch size, dec hid dim, src len]

        v = self.v.repeat(batch_size, 1).unsqueeze(1)

        #v = [batch size, 1, dec hid dim]

        attention = torch.bmm(v, energy).squeeze(1)

        #attention= [batch size, src len]

        return F.softmax(attention, dim=1)


class Decoder(nn.Module):
    def __init__(self, output_dim, emb_dim, enc_hid_dim, dec_hid_dim, dropout, attention):
        super().__init__()

        self.output_dim = output_dim
        self.attention = attention

        self.embedding = nn.Embedding(output_dim, emb_dim)

        self.rnn = nn.GRU((enc_hid_dim * 2) + emb_dim, dec_hid_dim)

        self.fc_out = nn.Linear((enc_hid_dim * 2) + dec_hid_dim + emb_dim, output_dim)

        self.dropout = nn.Dropout(dropout)

    def forward(self, input, hidden, encoder_outputs):

        #input = [batch size]
        #hidden = [batch size, dec hid dim]
        #encoder_outputs = [src len, batch size, enc hid dim * 2]

        input = input.unsqueeze(0)

        embedded = self.dropout(self.embedding(input))

        a = self.attention(hidden, encoder_outputs)

        a = a.unsqueeze(1)

        encoder_outputs = encoder_outputs.permute(1, 0, 2)

        weighted = torch.bmm(a, encoder_outputs)

        weighted = weighted.permute(1, 0, 2)

        rnn_input = torch.cat((embedded, weighted), dim = 2)

        output, hidden = self.rnn(rnn_input, hidden.unsqueeze(0))

        #this also means that output == hidden
        assert (output == hidden).all()

        embedded = embedded.squeeze(0)
        output = output.squeeze(0)
        weighted = weighted.squeeze(0)

        prediction = self.fc_out(torch.cat((output, weighted, embedded), dim = 1))

        #prediction = [batch size, output dim]

        return prediction, hidden.squeeze(0)


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder, device):
        super().__init__()

        self.encoder = encoder
        self.decoder = decoder
        self.device = device

    def forward(self, src, trg, teacher_forcing_ratio = 0.5):

        batch_size = src.shape[1]
        trg_len = trg.shape[0]
        trg_vocab_size = self.decoder.output_dim

        #tensor to store decoder outputs
        outputs = torch.zeros(trg_len, batch_size, trg_vocab_size).to(self.device)

        #encoder_outputs is all hidden states of the input sequence, back and forwards
        #hidden is the final forward and backward hidden states, passed through a linear layer
        encoder_outputs, hidden = self.encoder(src)

        #first input to the decoder is the <sos> tokens
        input = trg[0,:]

        for t in range(1, trg_len):

            #insert input token embedding, previous hidden state and all encoder hidden states
            #receive output tensor (predictions) and new hidden state
            output, hidden = self.decoder(input, hidden, encoder_outputs)

            #place predictions in a tensor holding predictions for each token
            outputs[t] = output

            #decide if we are going to use teacher forcing or not
            teacher_force = random.random() < teacher_forcing_ratio

            #get the highest predicted token from our predictions
            top1 = output.argmax(1)

            #if teacher forcing, use actual next token as next input
            #if not, use predicted token
            input = trg[t] if teacher_force else top1

        return outputs


def init_weights(m):
    for name, param in m.named_parameters():
        if 'weight' in name:
            nn.init.normal_(param.data, mean=0, std=0.01)
        else:
            nn.init.constant_(param.data, 0)


class Batch:
    """Stands in for a torchtext BucketIterator batch: `.src` [src len, batch size], `.trg` [trg len, batch size]."""

    def __init__(self, src, trg):
        self.src = src
        self.trg = trg


def made_up_batches(generator, count, input_dim, output_dim):
    batches = []
    for _ in range(count):
        src = torch.randint(3, input_dim, (5, 2), generator=generator)
        src[0] = 2
        trg = torch.randint(3, output_dim, (6, 2), generator=generator)
        trg[0] = 2
        trg[-1, 1] = 1
        batches.append(Batch(src, trg))
    return batches


def build() -> dict:
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)

    INPUT_DIM = 9
    OUTPUT_DIM = 10
    ENC_EMB_DIM = 4
    DEC_EMB_DIM = 4
    ENC_HID_DIM = 5
    DEC_HID_DIM = 6
    ENC_DROPOUT = 0.5
    DEC_DROPOUT = 0.5

    data = torch.Generator().manual_seed(0)
    train_iterator = made_up_batches(data, 3, INPUT_DIM, OUTPUT_DIM)
    valid_iterator = made_up_batches(data, 1, INPUT_DIM, OUTPUT_DIM)

    attn = Attention(ENC_HID_DIM, DEC_HID_DIM)
    enc = Encoder(INPUT_DIM, ENC_EMB_DIM, ENC_HID_DIM, DEC_HID_DIM, ENC_DROPOUT)
    dec = Decoder(OUTPUT_DIM, DEC_EMB_DIM, ENC_HID_DIM, DEC_HID_DIM, DEC_DROPOUT, attn)

    model = Seq2Seq(enc, dec, device).to(device)
    model.apply(init_weights)

    optimizer = optim.Adam(model.parameters())
    TRG_PAD_IDX = 1
    criterion = nn.CrossEntropyLoss(ignore_index = TRG_PAD_IDX)
    return {"model": model, "optimizer": optimizer, "criterion": criterion, "train_iterator": train_iterator,
            "valid_iterator": valid_iterator, "CLIP": 1, "batch": 0, "epoch_loss": 0, "history": []}


def evaluate(model, iterator, criterion):

    model.eval()

    epoch_loss = 0

    with torch.no_grad():

        for i, batch in enumerate(iterator):

            src = batch.src
            trg = batch.trg

            output = model(src, trg, 0) #turn off teacher forcing

            output_dim = output.shape[-1]

            output = output[1:].view(-1, output_dim)
            trg = trg[1:].view(-1)

            loss = criterion(output, trg)

            epoch_loss += loss.item()

    return epoch_loss / len(iterator)


def train_batch(state: dict) -> None:
    """One pass of train()'s `for i, batch in enumerate(iterator):`; the epoch's first batch starts train()."""
    model, optimizer, criterion, iterator, clip = (
        state["model"], state["optimizer"], state["criterion"], state["train_iterator"], state["CLIP"])
    i = state["batch"] % len(iterator)
    if i == 0:
        model.train()

        state["epoch_loss"] = 0
    batch = iterator[i]

    src = batch.src
    trg = batch.trg

    optimizer.zero_grad()

    output = model(src, trg)

    #trg = [trg len, batch size]
    #output = [trg len, batch size, output dim]

    output_dim = output.shape[-1]

    output = output[1:].view(-1, output_dim)
    trg = trg[1:].view(-1)

    loss = criterion(output, trg)

    loss.backward()  # @backward

    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)

    optimizer.step()

    state["epoch_loss"] += loss.item()  # @epoch_loss
    state["batch"] += 1

    if i == len(iterator) - 1:
        train_loss = state["epoch_loss"] / len(iterator)
        valid_loss = evaluate(model, state["valid_iterator"], criterion)
        state["history"].append((train_loss, math.exp(train_loss), valid_loss, math.exp(valid_loss)))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
