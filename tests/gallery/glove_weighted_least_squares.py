"""GloVe's weighted least squares on a co-occurrence matrix, with the weights f(X_ij) computed per batch in numpy.

Source: kefirski/pytorch_GloVe, GloVe/glove.py (commit 59ea5989a84b5023d7d7aaa8a33ffccd4dc5cbc9) for the model and
README.md (commit 6eafe2abbfd320d9325a121df7b9879de367218e) for the training loop. As published: GloVe(co_oc,
embed_size, x_max=100, alpha=0.75) shifts the matrix by 1 (`co_oc + 1.0`), builds in_embed / in_bias / out_embed /
out_bias as nn.Embedding initialised by the (deprecated) `xavier_normal`; forward takes numpy index arrays, looks
up X_ij and the weights `_weight(x) = 1 if x > x_max else (x / x_max) ** alpha` with numpy, wraps them with
`Variable(t.from_numpy(...)).float()` (Variable dropped here: a plain tensor), and returns
`(t.pow(((in*out).sum(1) + in_bias + out_bias).squeeze(1) - t.log(X), 2) * weights).sum()` (as published, the
[batch, 1] biases broadcast the [batch] dot products to [batch, batch]: a published shape slip, kept). The README's
loop: `optimizer = Adagrad(glove.parameters(), 0.05)`, then per iteration `input, target = next_batch(batch_size)`,
`loss = glove(input, target)`, optimizer.zero_grad(), loss.backward(), optimizer.step(). Retyped at CPU size: a
made-up 10x10 integer co-occurrence matrix (published: the corpus's), embed_size 5, batch 6, next_batch draws index
arrays with numpy (the README leaves it to the reader); `import torch as t` as published.
"""

from collections.abc import Callable

import numpy as np
import torch as t
import torch.nn as nn
from torch.nn.init import xavier_normal
from torch.optim import Adagrad

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class GloVe(nn.Module):
    def __init__(self, co_oc, embed_size, x_max=100, alpha=0.75):
        """
        :param co_oc: Co-occurrence ndarray with shape of [num_classes, num_classes]
        :param embed_size: embedding size
        :param x_max: An int representing cutoff of the weighting function
        :param alpha: Ant float parameter of the weighting function
        """

        super(GloVe, self).__init__()

        self.embed_size = embed_size
        self.x_max = x_max
        self.alpha = alpha

        ''' co_oc Matrix is shifted in order to prevent having log(0) '''
        self.co_oc = co_oc + 1.0

        [self.num_classes, _] = self.co_oc.shape

        self.in_embed = nn.Embedding(self.num_classes, self.embed_size)
        self.in_embed.weight = xavier_normal(self.in_embed.weight)

        self.in_bias = nn.Embedding(self.num_classes, 1)
        self.in_bias.weight = xavier_normal(self.in_bias.weight)

        self.out_embed = nn.Embedding(self.num_classes, self.embed_size)
        self.out_embed.weight = xavier_normal(self.out_embed.weight)

        self.out_bias = nn.Embedding(self.num_classes, 1)
        self.out_bias.weight = xavier_normal(self.out_bias.weight)

    def forward(self, input, output):
        """
        :param input: An array with shape of [batch_size] of int type
        :param output: An array with shape of [batch_size] of int type
        :return: loss estimation for Global Vectors word representations
                 defined in nlp.stanford.edu/pubs/glove.pdf
        """

        batch_size = len(input)

        co_occurences = np.array([self.co_oc[input[i], output[i]] for i in range(batch_size)])
        weights = np.array([self._weight(var) for var in co_occurences])

        co_occurences = t.from_numpy(co_occurences).float()
        weights = t.from_numpy(weights).float()

        input = t.from_numpy(input)
        output = t.from_numpy(output)

        input_embed = self.in_embed(input)
        input_bias = self.in_bias(input)
        output_embed = self.out_embed(output)
        output_bias = self.out_bias(output)

        return (t.pow(
            ((input_embed * output_embed).sum(1) + input_bias + output_bias).squeeze(1) - t.log(co_occurences), 2
        ) * weights).sum()

    def _weight(self, x):
        return 1 if x > self.x_max else (x / self.x_max) ** self.alpha

    def embeddings(self):
        return self.in_embed.weight.data.cpu().numpy() + self.out_embed.weight.data.cpu().numpy()


def next_batch(state: dict, batch_size):
    """Made up: the README leaves next_batch to the reader; [batch_size] int64 index arrays."""
    rng = state["rng"]
    return rng.integers(0, 10, size=batch_size), rng.integers(0, 10, size=batch_size)


def build() -> dict:
    np.random.seed(3)
    t.manual_seed(3)
    rng = np.random.default_rng(3)
    co_oc_matrix = rng.integers(0, 150, size=(10, 10)).astype(np.float64)
    glove = GloVe(co_oc_matrix, 5)
    optimizer = Adagrad(glove.parameters(), 0.05)
    return {"glove": glove, "optimizer": optimizer, "rng": rng, "batch_size": 6}


def iteration(state: dict) -> None:
    glove, optimizer = state["glove"], state["optimizer"]
    input, target = next_batch(state, state["batch_size"])

    loss = glove(input, target)

    optimizer.zero_grad()
    loss.backward()  # @backward
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
