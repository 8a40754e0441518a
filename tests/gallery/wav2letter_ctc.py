"""torchaudio's Wav2Letter example: a CTC loss over MFCC frames, one backward per batch, clipped, then decoded.

Source: pytorch/audio, examples/pipeline_wav2letter/engine.py (commit 175cdf657f2fee872a26cc2af2ae8e6d4d3f6845),
train_one_epoch: per batch `outputs = model(inputs).transpose(-1, -2).transpose(0, 1)`, `loss = criterion(outputs,
targets, tensors_lengths, target_lengths)`, `optimizer.zero_grad()`, `loss.backward()`, `clip_grad_norm_` when
clip_grad is set, `optimizer.step()`, then `record_losses(outputs, targets, decoder, language_model, loss.item(),
metric)`, which decodes the (already backpropagated) outputs greedily; main(): `criterion =
torch.nn.CTCLoss(blank=encoded_char_blank, zero_infinity=False, reduction="sum")`, SGD. The model is torchaudio's
Wav2Letter (torchaudio/models/wav2letter.py, the example's own copy) for input_type "mfcc": a stack of Conv1d, each
followed by ReLU(inplace=True), the last one too, then `log_softmax(x, dim=1)`. Retyped at CPU size: 4 MFCC bins on
20 frames (published 13 on an utterance), hidden channels 250/2000 cut to 8/16, 5 classes (blank, space, three
letters; published 29), batches of 2 made up with the example's length function (`T // 2 + 1` for mfcc) and
targets of 2 or 3 labels; the GreedyDecoder (argmax over classes, then collapse), the CER/WER bookkeeping reduced to
the decode and a list; bg_iterator, the Logger, DataParallel, the scheduler and the signal handling left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
CLASSES = 5

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class Wav2Letter(nn.Module):
    def __init__(self, num_classes: int = 40, input_type: str = "waveform", num_features: int = 1,
                 hidden: int = 8, wide: int = 16) -> None:
        super().__init__()
        acoustic_num_features = hidden if input_type == "waveform" else num_features
        acoustic_model = nn.Sequential(
            nn.Conv1d(in_channels=acoustic_num_features, out_channels=hidden, kernel_size=48, stride=2, padding=23),
            nn.ReLU(inplace=True),
            nn.Conv1d(in_channels=hidden, out_channels=hidden, kernel_size=7, stride=1, padding=3),
            nn.ReLU(inplace=True),
            nn.Conv1d(in_channels=hidden, out_channels=hidden, kernel_size=7, stride=1, padding=3),
            nn.ReLU(inplace=True),
            nn.Conv1d(in_channels=hidden, out_channels=wide, kernel_size=32, stride=1, padding=16),
            nn.ReLU(inplace=True),
            nn.Conv1d(in_channels=wide, out_channels=wide, kernel_size=1, stride=1, padding=0),
            nn.ReLU(inplace=True),
            nn.Conv1d(in_channels=wide, out_channels=num_classes, kernel_size=1, stride=1, padding=0),
            nn.ReLU(inplace=True),
        )
        self.acoustic_model = acoustic_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.acoustic_model(x)
        x = nn.functional.log_softmax(x, dim=1)
        return x


class GreedyDecoder:
    def __call__(self, outputs):
        """Greedy Decoder. Returns highest probability of class labels for each timestep"""
        _, indices = torch.topk(outputs, k=1, dim=-1)
        return indices[..., 0]


def collate(batch_size, frames, generator):
    inputs = torch.randn(batch_size, 4, frames, generator=generator)
    target_lengths = torch.randint(2, 4, (batch_size,), generator=generator)
    targets = torch.randint(1, CLASSES, (batch_size, int(target_lengths.max())), generator=generator)
    tensors_lengths = torch.full((batch_size,), frames // 2 + 1, dtype=torch.long)
    return inputs, targets, tensors_lengths, target_lengths


def build() -> dict:
    torch.manual_seed(0)
    model = Wav2Letter(num_classes=CLASSES, input_type="mfcc", num_features=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, weight_decay=1e-5)
    criterion = torch.nn.CTCLoss(blank=0, zero_infinity=False, reduction="sum")
    generator = torch.Generator().manual_seed(1)
    data_loader = [collate(2, 20, generator) for _ in range(6)]
    model.train()
    return {"model": model, "optimizer": optimizer, "criterion": criterion, "data_loader": data_loader,
            "decoder": GreedyDecoder(), "batch": 0, "metric": [], "clip_grad": 1.0}


def iteration(state: dict) -> None:
    model, criterion, optimizer, decoder = state["model"], state["criterion"], state["optimizer"], state["decoder"]
    inputs, targets, tensors_lengths, target_lengths = state["data_loader"][state["batch"] % len(state["data_loader"])]
    state["batch"] += 1

    # keep batch first for data parallel
    outputs = model(inputs).transpose(-1, -2).transpose(0, 1)

    # CTC
    # outputs: input length, batch size, number of classes (including blank)
    loss = criterion(outputs, targets, tensors_lengths, target_lengths)

    optimizer.zero_grad()
    loss.backward()

    if state["clip_grad"] is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), state["clip_grad"])

    optimizer.step()

    output = outputs.transpose(0, 1).to("cpu")
    output = decoder(output)
    state["metric"].append((loss.item(), output.tolist()))


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
