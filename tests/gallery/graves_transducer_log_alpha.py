"""An RNN transducer (Graves 2012) whose loss fills its forward variables in place, `log_alpha[:, t, u] = ...`.

Source: lorenlugosch/graves-transducers, models.py (commit 00b5221f502d5c38fefe436a407bd5bd08569af9): ComputeFBANK
(a learned per-bin `normalizer`, then the per-utterance mean subtracted in place, `fbanks[idx][:T_, :] -= ...`),
Conv, Encoder (conv with stride 2, LeakyReLU, bidirectional GRUs each with RNNOutputSelect, Dropout, Linear,
LeakyReLU, an average-pool Downsample after the first, a final Linear to the labels and blank), DecoderRNN
(GRUCells with dropout on a state of shape (batch, layers, hidden)), AutoregressiveDecoder (a learned
`initial_state` stacked per batch, start symbol, one step per label), TransducerLoss (the forward algorithm: `log_alpha
= torch.zeros(batch_size, T_max, U_max)` filled cell by cell, logsumexp of the blank and label moves, then the final
blank per utterance), and TransducerModel.forward/infer (the beam search, run on the batch's first utterance
every `print_interval` batches); training.py (commit 01a1d8c3b660f65657b2e8bc935c9c2d91370b16), Trainer (Adam,
StepLR) and Trainer.train(): per batch `log_probs = self.model(x,y,T,U)`, `loss = -log_probs.mean()`, the NaN
check, zero_grad, `loss.backward()`, `clip_grad_norm_` at 5, step, `train_loss += loss.item() * batch_size`, and at
`idx % print_interval == 0` the model's `infer` on the batch (its guess). At this commit the model calls awni/transducer's
compiled `Transducer` (a C++ extension); here it calls the file's own TransducerLoss, as its commented-out "my
implementation" call does, on the targets before they are flattened for awni's function, with the encoder's and the decoder's outputs each
log-softmaxed first, as transducer.ipynb (commit 4dfa8ac2068ccfe6c3d291d99d2c4210ec7c87f4) feeds that loss. The iteration is one batch
of train(). Retyped at CPU size: made-up FBANK features (batch 2, 12 frames, 4 mel bins) stand in for the
LibriSpeech waveforms and torchaudio's kaldi fbank (so ComputeFBANK multiplies the given features by its
normalizer), made-up targets of 2 tokens from 3 (blank 0; no padding, since gather cannot take -1), encoder hidden
6 with 2 layers, decoder hidden 5 with 1 layer, beam width 2, lr 0.001 as published; tqdm, the tokenizer's decoding,
the WER and the prints are left out, the config is a SimpleNamespace, and the published tabs are 4 spaces.
"""

import sys  # the published training.py calls sys.exit without importing sys
import types
from collections.abc import Callable

import numpy as np
import torch

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class TransducerLoss(torch.nn.Module):
    def __init__(self):
        super(TransducerLoss, self).__init__()

    def forward(self,encoder_out,decoder_out,targets,input_lengths,target_lengths,reduction="none",blank=0):
        """
        encoder_out: FloatTensor (N, max(input_lengths), #labels)
        decoder_out: FloatTensor (N, max(target_lengths)+1, #labels)
        targets: LongTensor (N, max(target_lengths))
        input_lengths: LongTensor (N)
        target_lengths: LongTensor (N)
        reduction: "none", "avg"
        blank: int
        """
        batch_size = encoder_out.shape[0]
        T_max = encoder_out.shape[1]
        U_max = decoder_out.shape[1]
        y = targets

        log_alpha = torch.zeros(batch_size, T_max, U_max)
        log_alpha = log_alpha.to(encoder_out.device)
        for t in range(T_max):
            for u in range(U_max):
                if u == 0:

                    if t == 0:
                        log_alpha[:, t, u] = 0.

                    else: #t > 0
                        null_t_1_0 = encoder_out[:, t-1, blank] + decoder_out[:, 0, blank]
                        log_alpha[:, t, u] = log_alpha[:, t-1, u] + null_t_1_0

                else: #u > 0

                    if t == 0:
                        y_0_u_1 = torch.gather(encoder_out[:, t], dim=1, index=y[:,u-1].view(-1,1) ).reshape(-1) + torch.gather(decoder_out[:, u-1], dim=1, index=y[:,u-1].view(-1,1)).reshape(-1)
                        log_alpha[:, t, u] = log_alpha[:,t,u-1] + y_0_u_1

                    else: #t > 0
                        y_t_u_1 = torch.gather(encoder_out[:, t], dim=1, index=y[:,u-1].view(-1,1)).reshape(-1) + torch.gather(decoder_out[:, u-1], dim=1, index=y[:,u-1].view(-1,1)).reshape(-1)
                        null_t_1_u = encoder_out[:, t-1, blank] + decoder_out[:, u, blank]

                        log_alpha[:, t, u] = torch.logsumexp(torch.stack([
                            log_alpha[:, t-1, u] + null_t_1_u,
                            log_alpha[:, t, u-1] + y_t_u_1
                        ]), dim=0)

        log_probs = []
        for i in range(batch_size):
            T = input_lengths[i]
            U = target_lengths[i]
            null_T_1_U = encoder_out[i, T-1, blank] + decoder_out[i, U, blank]
            log_p_y_x = log_alpha[i, T-1, U] + null_T_1_U
            log_probs.append(log_p_y_x)

        log_probs = torch.stack(log_probs)
        return log_probs

class TransducerModel(torch.nn.Module):
    def __init__(self, config):
        super(TransducerModel, self).__init__()
        self.encoder = Encoder(config)
        self.decoder = AutoregressiveDecoder(config)
        self.blank_index = self.encoder.blank_index; self.num_outputs = self.encoder.num_outputs  # noqa: E702 (as published)
        self.transducer_loss = TransducerLoss()
        self.beam_width = config.beam_width

    def forward(self, x, y, T, U):
        """
        returns log probs for each example
        """

        # move inputs to GPU
        if next(self.parameters()).is_cuda:
            x = x.cuda()
            y = y.cuda()

        # run the neural network
        encoder_out = self.encoder.forward(x, T) # (N, T, #labels)
        downsampling_factor = max(T) / encoder_out.shape[1]
        T = [round(t / downsampling_factor) for t in T]

        decoder_out = self.decoder.forward(y, U) # (N, U, #labels)

        T = torch.IntTensor(T)
        U = torch.IntTensor(U)

        # my implementation:
        log_probs = self.transducer_loss(encoder_out=encoder_out.log_softmax(2),
                        decoder_out=decoder_out.log_softmax(2),
                        targets=y,
                        input_lengths=T,
                        target_lengths=U,
                        reduction="none",
                        blank=self.blank_index)

        return log_probs

    def infer(self, x, T=None):
        # move inputs to GPU
        if next(self.parameters()).is_cuda:
            x = x.cuda()

        encoder_out = self.encoder.forward(x, T)
        batch_size = encoder_out.shape[0]
        downsampling_factor = max(T) / encoder_out.shape[1]
        T = [round(t / downsampling_factor) for t in T]
        decoded = []
        U_max = max(T)
        for i in range(batch_size):
            # Initialize the beam
            # t, u, y, state, log_prob
            beam = [
                [0, 0, [self.decoder.start_symbol], torch.stack([self.decoder.initial_state] * 1), 0.]
            ]

            # Until all hypotheses have reached the final timestep, continue
            done = False
            while not done:

                # Consider each hypothesis in beam
                extended_hypotheses = []
                for hypothesis in beam:
                    t = hypothesis[0]
                    u = hypothesis[1]
                    y_star = hypothesis[2]
                    decoder_state = hypothesis[3]
                    log_prob = hypothesis[4]

                    if t == T[i]-1: # we've reached the final timestep
                        extended_hypotheses.append(hypothesis)
                    else:
                        # Compute next step probs
                        decoder_input = torch.tensor([ y_star[-1] ] * 1).to(x.device)
                        decoder_out, decoder_state = self.decoder.forward_one_step(decoder_input, decoder_state)
                        joint_out = (encoder_out[i, t] + decoder_out).log_softmax(1).reshape(-1)

                        # Append extended hypotheses to extended_hypotheses
                        for l in range(joint_out.shape[0]): # not necessary to prune here?
                            y_u = l
                            t_extended = t + 1 if y_u == self.blank_index else t
                            u_extended = u     if y_u == self.blank_index else u + 1
                            y_star_extended = y_star if y_u == self.blank_index else y_star + [y_u]
                            log_prob_extended = log_prob + joint_out[y_u].item()

                            extended_hypothesis = [
                                t_extended,
                                u_extended,
                                y_star_extended,
                                decoder_state,
                                log_prob_extended
                            ]
                            extended_hypotheses.append(extended_hypothesis)

                # Set beam equal to top (beam_width) extended hypotheses
                beam_scores = torch.tensor([hypothesis[4] for hypothesis in extended_hypotheses])
                top_indices = beam_scores.topk(self.beam_width)[1]
                beam = [extended_hypotheses[index] for index in top_indices]
                t_beam = torch.tensor([hypothesis[0] for hypothesis in beam]) # timestep pointer for each hypothesis
                u_beam = torch.tensor([hypothesis[1] for hypothesis in beam])
                done = (u_beam > U_max).any() or not (t_beam < T[i]-1).all() # if hypothesis too long or all hypotheses have reached the final timestep, we're done

            # get top (0) hypothesis, which is the second (2) element of the beam entry, and remove the start symbol (1:)
            decoded_i = beam[0][2][1:]
            decoded.append(decoded_i)
        return decoded

class Conv(torch.nn.Module):
    def __init__(self, in_dim, out_dim, filter_length, stride):
        super(Conv, self).__init__()
        self.conv = torch.nn.Conv1d(	in_channels=in_dim,
                        out_channels=out_dim,
                        kernel_size=filter_length,
                        stride=stride
        )
        self.filter_length = filter_length

    def forward(self, x):
        out = x.transpose(1,2)
        left_padding = int(self.filter_length/2)
        right_padding = int(self.filter_length/2)
        out = torch.nn.functional.pad(out, (left_padding, right_padding))
        out = self.conv(out)
        out = out.transpose(1,2)
        return out

class Encoder(torch.nn.Module):
    def __init__(self, config):
        super(Encoder, self).__init__()
        self.layers = []

        # compute FBANK features from waveform
        layer = ComputeFBANK(config)
        self.layers.append(layer)
        out_dim = config.num_mel_bins

        # convolutional
        context_len = 11 # 11 fbank frames
        layer = Conv(in_dim=out_dim, out_dim=config.num_encoder_hidden, filter_length=context_len, stride=2)
        self.layers.append(layer)
        out_dim = config.num_encoder_hidden
        layer = torch.nn.LeakyReLU(0.125)
        self.layers.append(layer)

        for idx in range(config.num_encoder_layers):
            # recurrent
            layer = torch.nn.GRU(input_size=out_dim, hidden_size=config.num_encoder_hidden, batch_first=True, bidirectional=config.bidirectional)
            self.layers.append(layer)

            out_dim = config.num_encoder_hidden
            if config.bidirectional: out_dim *= 2

            # grab hidden states for each timestep
            layer = RNNOutputSelect()
            self.layers.append(layer)

            # dropout
            layer = torch.nn.Dropout(p=0.2)
            self.layers.append(layer)

            # fully-connected
            layer = torch.nn.Linear(out_dim, config.num_encoder_hidden)
            out_dim = config.num_encoder_hidden
            self.layers.append(layer)
            layer = torch.nn.LeakyReLU(0.125)
            self.layers.append(layer)

            # downsample
            if idx == 0:
                layer = Downsample(method="avg", factor=2, axis=1)
                self.layers.append(layer)

        # final classifier
        self.num_outputs = config.num_tokens + 1 # for blank symbol
        self.blank_index = 0 #this is hard-coded in awni's transducer code #config.num_tokens
        layer = torch.nn.Linear(out_dim, self.num_outputs)
        self.layers.append(layer)

        self.layers = torch.nn.ModuleList(self.layers)

    def forward(self, x, T):
        out = (x,T)
        for layer in self.layers:
            out = layer(out)

        return out

class DecoderRNN(torch.nn.Module):
    def __init__(self, num_decoder_layers, num_decoder_hidden, input_size, dropout):
        super(DecoderRNN, self).__init__()

        self.layers = []
        self.num_decoder_layers = num_decoder_layers
        for index in range(num_decoder_layers):
            if index == 0:
                layer = torch.nn.GRUCell(input_size=input_size, hidden_size=num_decoder_hidden)
            else:
                layer = torch.nn.GRUCell(input_size=num_decoder_hidden, hidden_size=num_decoder_hidden)
            layer.name = "gru%d"%index
            self.layers.append(layer)

            layer = torch.nn.Dropout(p=dropout)
            layer.name = "dropout%d"%index
            self.layers.append(layer)
        self.layers = torch.nn.ModuleList(self.layers)

    def forward(self, input, previous_state):
        """
        input: Tensor of shape (batch size, input_size)
        previous_state: Tensor of shape (batch size, num_decoder_layers, num_decoder_hidden)
        Given the input vector, update the hidden state of each decoder layer.
        """
        state = []
        batch_size = input.shape[0]
        gru_index = 0
        for index, layer in enumerate(self.layers):
            if "gru" in layer.name:
                if index == 0:
                    gru_input = input
                else:
                    gru_input = layer_out  # noqa: F821 (as published)
                layer_out = layer(gru_input, previous_state[:, gru_index])
                state.append(layer_out)
                gru_index += 1
            else:
                layer_out = layer(layer_out)
        state = torch.stack(state, dim=1)
        return state

class AutoregressiveDecoder(torch.nn.Module):
    def __init__(self, config):
        super(AutoregressiveDecoder, self).__init__()
        self.layers = []
        num_decoder_hidden = config.num_decoder_hidden
        num_decoder_layers = config.num_decoder_layers
        input_size = num_decoder_hidden

        self.initial_state = torch.nn.Parameter(torch.randn(num_decoder_layers,num_decoder_hidden))
        self.embed = torch.nn.Embedding(num_embeddings=config.num_tokens + 1, embedding_dim=num_decoder_hidden)
        self.rnn = DecoderRNN(num_decoder_layers, num_decoder_hidden, input_size, dropout=0.5)
        self.num_outputs = config.num_tokens + 1 # for blank symbol
        self.linear = torch.nn.Linear(num_decoder_hidden,self.num_outputs)
        self.start_symbol = self.num_outputs - 1 # blank index == start symbol

    def forward_one_step(self, input, previous_state):
        embedding = self.embed(input)
        state = self.rnn.forward(embedding, previous_state)
        out = self.linear(state[:,-1])
        return out, state

    def forward(self, y, U):
        batch_size = y.shape[0]
        U_max = y.shape[1]
        outs = []
        state = torch.stack([self.initial_state] * batch_size).to(y.device)
        for u in range(U_max + 1): # need U+1 to get null output for final timestep
            if u == 0:
                decoder_input = torch.tensor([self.start_symbol] * batch_size).to(y.device)
            else:
                decoder_input = y[:,u-1]
            out, state = self.forward_one_step(decoder_input, state)
            outs.append(out)
        out = torch.stack(outs, dim=1)

        return out

class RNNOutputSelect(torch.nn.Module):
    def __init__(self):
        super(RNNOutputSelect, self).__init__()

    def forward(self, input):
        return input[0]

class Downsample(torch.nn.Module):
    """
    Downsamples the input in the time/sequence domain
    """
    def __init__(self, method="none", factor=1, axis=1):
        super(Downsample,self).__init__()
        self.factor = factor
        self.method = method
        self.axis = axis

    def forward(self, x):
        if self.method == "none":
            return x.transpose(self.axis, 0)[::self.factor].transpose(self.axis, 0)
        if self.method == "avg":
            return torch.nn.functional.avg_pool1d(x.transpose(self.axis, 2), kernel_size=self.factor, ceil_mode=True).transpose(self.axis, 2)
        if self.method == "max":
            return torch.nn.functional.max_pool1d(x.transpose(self.axis, 2), kernel_size=self.factor, ceil_mode=True).transpose(self.axis, 2)

class ComputeFBANK(torch.nn.Module):
    def __init__(self, config):
        super(ComputeFBANK,self).__init__()
        self.num_mel_bins = config.num_mel_bins
        self.subtract_mean = config.normalize_fbank
        self.normalizer = torch.nn.Parameter(torch.tensor([1/10] * self.num_mel_bins))

    def forward(self, input):
        """
        input : (x,T)
        x : FBANK features (made up; the published x are waveforms, given to torchaudio's kaldi fbank here)
        T : durations
        returns : (normalized) FBANK feature vectors
        """
        fbanks = []
        x,T = input
        batch_size = len(x)
        for idx in range(batch_size):
            fbank_ = x[idx]
            fbank_ = fbank_ * self.normalizer.unsqueeze(0)
            fbanks.append(fbank_)

        if self.subtract_mean:
            downsample_factor = max(T) / fbanks[0].shape[1]
            for idx in range(batch_size):
                T_ = int(T[idx] / downsample_factor)
                fbanks[idx][:T_, :] -= fbanks[idx][:T_, :].mean(0)

        fbank = torch.stack(fbanks)
        return fbank


class Trainer:
    def __init__(self, model, config):
        self.model = model
        self.config = config
        self.lr = config.lr
        self.lr_period = config.lr_period
        self.gamma = config.gamma
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=self.lr_period, gamma=self.gamma)
        self.epoch = 0
        self.best_WER = np.inf


def build() -> dict:
    config = types.SimpleNamespace(
        seed=1, num_mel_bins=4, normalize_fbank=True, num_encoder_hidden=6, num_encoder_layers=2,
        bidirectional=True, num_tokens=3, num_decoder_hidden=5, num_decoder_layers=1, beam_width=2,
        lr=0.001, lr_period=2, gamma=0.5, batch_size=2)
    torch.manual_seed(config.seed); np.random.seed(config.seed)  # noqa: E702 (as published)
    model = TransducerModel(config=config)
    trainer = Trainer(model=model, config=config)
    data = torch.Generator().manual_seed(7)
    loader = []
    for _ in range(3):
        x = torch.randn(2, 12, config.num_mel_bins, generator=data)
        y = torch.randint(1, config.num_tokens + 1, (2, 2), generator=data)
        loader.append((x, y, [12, 12], [2, 2], [0, 1]))
    # Trainer.train(train_dataset): the state before its batch loop
    trainer.model.train()
    return {"trainer": trainer, "model": model, "optimizer": trainer.optimizer, "loader": loader,
            "print_interval": 2, "train_WER": 0, "train_loss": 0, "num_examples": 0, "idx": 0}


def train_batch(state: dict) -> None:
    self = state["trainer"]
    idx = state["idx"] % len(state["loader"])
    batch = state["loader"][idx]
    state["idx"] += 1
    x,y,T,U,idxs = batch
    batch_size = len(x)
    log_probs = self.model(x,y,T,U)
    loss = -log_probs.mean()
    if torch.isnan(loss):
        sys.exit()
    self.optimizer.zero_grad()
    loss.backward()  # @backward
    clip_value = 5; torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip_value)  # noqa: E702 (as published)
    self.optimizer.step()
    state["train_loss"] += loss.item() * batch_size
    state["num_examples"] += batch_size
    if idx % state["print_interval"] == 0:
        guess = self.model.infer(x, T)[0][:U[0]]
        truth = y[0].cpu().data.numpy().tolist()[:U[0]]
        state["guess"] = (guess, truth)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
