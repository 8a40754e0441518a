"""Hugging Face's run_clm_no_trainer.py: accelerate, gradient accumulation, a linear schedule, a GPT-2 from a config.

Source: huggingface/transformers, examples/pytorch/language-modeling/run_clm_no_trainer.py (commit
3c354ea20e347edb9413ada30911e9fdc242719d): `Accelerator(gradient_accumulation_steps=...)`,
`AutoModelForCausalLM.from_config(config)` (no model_name_or_path), group_texts blocks whose labels are their
input_ids, `default_data_collator`, AdamW over the decay / no-decay groups (`no_decay = ["bias",
"layer_norm.weight"]`), `get_scheduler(name=args.lr_scheduler_type, ...)` with warm-up, `accelerator.prepare(model,
optimizer, train_dataloader, eval_dataloader, lr_scheduler)`, then per epoch `model.train()`, `total_loss = 0` (with
tracking), per batch `with accelerator.accumulate(model): outputs = model(**batch); loss = outputs.loss;
total_loss += loss.detach().float(); accelerator.backward(loss); optimizer.step(); lr_scheduler.step();
optimizer.zero_grad()`, `if accelerator.sync_gradients: completed_steps += 1`, the `max_train_steps` break; then
`model.eval()`, the eval batches `with torch.no_grad(): outputs = model(**batch)`, `loss = outputs.loss`,
`losses.append(accelerator.gather_for_metrics(loss.repeat(args.per_device_eval_batch_size)))`, `eval_loss =
torch.mean(losses)`, `perplexity = math.exp(eval_loss)`. Retyped at CPU size, with nothing downloaded:
`GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16, bos_token_id=99, eos_token_id=99)` and `AutoModelForCausalLM.from_config`,
blocks of 8 made-up token ids (4 training blocks in batches of 1, 2 eval blocks in batches of 2), a plain list of
dicts for the datasets, gradient_accumulation_steps 2, learning_rate 5e-4, weight_decay 0.01, linear schedule with 1
warm-up step, `cpu=True`; the tokenizer, datasets/map, tqdm, trackers, checkpointing and the hub push left out. One
epoch per iteration.
"""

import math
import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub: the model is built from its config

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, GPT2Config, default_data_collator, get_scheduler

FRAMEWORK = "transformers"
WAYS = ("watch", "command", "diagnose", "audit_retain_graph", "find_carried_graph")
ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def build() -> dict:
    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16, bos_token_id=99, eos_token_id=99)
    model = AutoModelForCausalLM.from_config(config)
    block_size = 8
    ids = torch.randint(0, 100, (6, block_size))
    lm_datasets = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in ids]
    train_dataset, eval_dataset = lm_datasets[:4], lm_datasets[4:]
    train_dataloader = DataLoader(train_dataset, shuffle=False, collate_fn=default_data_collator, batch_size=1)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=default_data_collator, batch_size=2)

    # Optimizer
    # Split weights in two groups, one with weight decay and the other not.
    no_decay = ["bias", "layer_norm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": 0.01,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=5e-4)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / 2)
    max_train_steps = 4 * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(
        name="linear",
        optimizer=optimizer,
        num_warmup_steps=1 * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    return {"accelerator": accelerator, "model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler,
            "train_dataloader": train_dataloader, "eval_dataloader": eval_dataloader,
            "max_train_steps": max_train_steps, "per_device_eval_batch_size": 2, "completed_steps": 0,
            "epoch": 0}


def train_epoch(state: dict, epoch: int) -> None:
    accelerator, model, optimizer = state["accelerator"], state["model"], state["optimizer"]
    lr_scheduler = state["lr_scheduler"]
    model.train()
    total_loss = 0
    active_dataloader = state["train_dataloader"]
    for step, batch in enumerate(active_dataloader):
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            # We keep track of the loss at each epoch
            total_loss += loss.detach().float()
            accelerator.backward(loss)  # @backward
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        # Checks if the accelerator has performed an optimization step behind the scenes
        if accelerator.sync_gradients:
            state["completed_steps"] += 1

        if state["completed_steps"] >= state["max_train_steps"]:
            break

    model.eval()
    losses = []
    for step, batch in enumerate(state["eval_dataloader"]):
        with torch.no_grad():
            outputs = model(**batch)

        loss = outputs.loss
        losses.append(accelerator.gather_for_metrics(loss.repeat(state["per_device_eval_batch_size"])))

    losses = torch.cat(losses)
    try:
        eval_loss = torch.mean(losses)
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    state["perplexity"] = perplexity
    state["train_loss"] = total_loss.item() / len(state["train_dataloader"])


def iteration(state: dict) -> None:
    train_epoch(state, state["epoch"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        train_epoch(state, epoch)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
