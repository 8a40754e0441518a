"""The char-RNN name classifier: a fresh hidden state per name and a hand-written update on p.data.

Source: the PyTorch tutorial "Classifying Names with a Character-Level RNN" (pytorch/tutorials
intermediate_source/char_rnn_classification_tutorial.py, the version with `class RNN` built from
i2h/i2o Linear layers on torch.cat((input, hidden), 1)): train() does `hidden = rnn.initHidden()`,
`rnn.zero_grad()`, one rnn step per letter, NLLLoss on the last output, `loss.backward()`, then
`for p in rnn.parameters(): p.data.add_(p.grad.data, alpha=-learning_rate)`. Retyped at CPU size: 6
letters, 4 hidden units, 3 categories, fixed random one-hot names of 3-4 letters instead of the data files.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 3
n_letters = 6
n_hidden = 4
n_categories = 3
learning_rate = 0.005

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = self.i2h(combined)  # @build_hidden
        output = self.i2o(combined)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


def lineToTensor(letters):
    tensor = torch.zeros(len(letters), 1, n_letters)
    for li, letter in enumerate(letters):
        tensor[li][0][letter] = 1
    return tensor


def build() -> dict:
    torch.manual_seed(0)
    rnn = RNN(n_letters, n_hidden, n_categories)
    examples = [
        (torch.tensor([int(torch.randint(n_categories, ()))], dtype=torch.long),
         lineToTensor(torch.randint(n_letters, (3 + k % 2,)).tolist()))
        for k in range(ITERATIONS + 2)
    ]
    return {"rnn": rnn, "criterion": nn.NLLLoss(), "examples": examples, "iter": 0}


def train(rnn, criterion, category_tensor, line_tensor):
    hidden = rnn.initHidden()
    rnn.zero_grad()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()  # @backward
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-learning_rate)  # @update
    return output, loss.item()


def train_step(state: dict) -> None:
    category_tensor, line_tensor = state["examples"][state["iter"] % len(state["examples"])]
    state["iter"] += 1
    output, loss = train(state["rnn"], state["criterion"], category_tensor, line_tensor)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for iter in range(1, iterations + 1):
        train_step(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_step(state)


if __name__ == "__main__":
    run(build())
