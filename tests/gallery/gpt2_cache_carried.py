"""A hand-written GPT-2 chat fine-tuning loop that keeps the model's key/value cache from one step for the next.

Source: ManavR123/talk_to_transformers, training/train.py (DialoGPT fine-tuned on comment threads): per step,
`past_key_values = None`, then for each comment `j` of the thread the model is called with `use_cache=True`, the
first without labels, the others with `past_key_values=past_key_values, labels=new_inputs`, their losses summed
into `loss = torch.tensor(0).float()`; `past_key_values = outputs.past_key_values`; after the thread
`loss.backward()`, `optimizer.step()`, `optimizer.zero_grad()` (Adam, lr 1e-5). The mistake is the learner's: the
chat goes on from step to step, so the cache is not set to `None` at each step but kept (`state["past_key_values"]`)
and handed to the next step's first call, undetached. The step's backward then walks the cache's graph from the step
before, freed by that step's backward. The same mistake with a transformer's memory carried across segments is
jlamprou/Infini-Attention issue #3 ("Do we need `.backward(retain_graph=True)`?": "Trying to backward through the graph
a second time", fixed by detaching the memory), and huggingface/transformers pull request #5399 records that GPT-2's
`past` "should not be used for training". Retyped at CPU size, with nothing downloaded: `GPT2LMHeadModel(GPT2Config(
n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32))` for the pretrained DialoGPT, threads of two made-up
comments of 3 token ids and an end-of-text id (the tokenizer's output), a list for the DataLoader of batch size 1; the
keyword `cache=` and `outputs.cache` are transformers 5.24's names for `past_key_values` (the old names still work,
with a warning); `[-100:]` on the cache (a tuple of layers in the published version) and the wandb logging left out.

In transformers 5 the cache is a `DynamicCache`: its tensors are `past_key_values.layers[i].keys` and `.values`, and
`update` replaces them with `torch.cat([old, new], dim=-2)` on each call, so the object is the same from step to step
while the tensors it holds, and their graph, change.
"""

import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub: the model is built from its config

import torch
from transformers import GPT2Config, GPT2LMHeadModel

FRAMEWORK = "transformers"
WAYS = ("watch", "command", "diagnose", "audit_retain_graph", "find_carried_graph")
ITERATIONS = 3
VOCAB = 100
EOS = VOCAB - 1

TRUTH = {
    "error": {"kind": "backward a second time", "iteration": 2, "line": "@backward"},
    "retains": {},
    "carried": [{"variable": "past_key_values", "line": "@with_cache"}],
    "notes": [],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32, bos_token_id=EOS, eos_token_id=EOS)
    model = GPT2LMHeadModel(config)
    model.train()
    comments = torch.cat([torch.randint(0, EOS, (2 * (ITERATIONS + 1), 3)), torch.full((2 * (ITERATIONS + 1), 1), EOS)], 1)
    dataset = [[comments[2 * k : 2 * k + 1], comments[2 * k + 1 : 2 * k + 2]] for k in range(ITERATIONS + 1)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-5),
        "dataset": dataset,
        "past_key_values": None,
        "i": 0,
    }


def step(state: dict) -> None:
    model, optimizer, data = state["model"], state["optimizer"], state["dataset"][state["i"]]
    state["i"] += 1
    past_key_values = state["past_key_values"]  # the chat goes on: last step's cache, not None
    loss = torch.tensor(0).float()
    for j, new_inputs in enumerate(data):
        if past_key_values is None:
            outputs = model(input_ids=new_inputs, use_cache=True)
        else:
            outputs = model(input_ids=new_inputs, cache=past_key_values, labels=new_inputs, use_cache=True)  # @with_cache
            loss += outputs.loss

        past_key_values = outputs.cache
    state["past_key_values"] = past_key_values  # @keep_cache

    loss.backward()  # @backward
    optimizer.step()
    optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        step(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: step(state)


if __name__ == "__main__":
    run(build())
