"""A GPT-2 trained from scratch by the Hugging Face `Trainer`, as the course trains one.

Source: huggingface/course, chapters/en/chapter7/6.mdx ("Training a causal language model from scratch"): a config
made with `AutoConfig.from_pretrained("gpt2", vocab_size=len(tokenizer), n_ctx=context_length, bos_token_id=...,
eos_token_id=...)`, `model = GPT2LMHeadModel(config)`, `DataCollatorForLanguageModeling(tokenizer, mlm=False)` (the
labels are the inputs, the shift is done inside the model), `TrainingArguments(output_dir="codeparrot-ds",
per_device_train_batch_size=32, ..., gradient_accumulation_steps=8, num_train_epochs=1, weight_decay=0.1,
warmup_steps=1_000, lr_scheduler_type="cosine", learning_rate=5e-4, save_steps=5_000, fp16=True, push_to_hub=True)`,
`Trainer(model=model, tokenizer=tokenizer, args=args, data_collator=data_collator, train_dataset=...,
eval_dataset=...)` and `trainer.train()`. Retyped at CPU size, with nothing downloaded: `GPT2Config(n_layer=2,
n_head=2, n_embd=32, vocab_size=100, n_positions=32)` instead of the pretrained config and tokenizer, made-up token
ids (sequences of 8) whose labels are the inputs (what the collator makes) with `default_data_collator`, batches of 2,
no gradient accumulation, `max_steps` instead of an epoch, warm-up 1 step, no evaluation, saving, logging, fp16 or hub
push (`report_to="none"`, `use_cpu=True`), a temporary output folder.

The `Trainer` calls backward from its own `training_step` (`self.accelerator.backward(loss)`, which calls
`loss.backward()`) and the optimizer's `step` from its inner training loop: the learner's innermost line running
throughout is `trainer.train()`.
"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub: the model is built from its config

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

FRAMEWORK = "transformers"
WAYS = ("watch", "command")  # the Trainer runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
VOCAB = 100

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def build() -> dict:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1
    )
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, VOCAB - 1, (2 * (ITERATIONS + 1), 8))
    train_dataset = [{"input_ids": row, "labels": row.clone()} for row in tokens]
    return {"model": model, "train_dataset": train_dataset}


def run(state: dict, iterations: int = ITERATIONS, callbacks=()) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=2,
            max_steps=iterations,
            weight_decay=0.1,
            warmup_steps=1,
            lr_scheduler_type="cosine",
            learning_rate=5e-4,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=state["model"],
            args=args,
            data_collator=default_data_collator,
            train_dataset=state["train_dataset"],
            callbacks=list(callbacks),
        )
        trainer.train()  # @train


if __name__ == "__main__":
    run(build())
