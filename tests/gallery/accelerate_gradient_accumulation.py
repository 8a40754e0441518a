"""Hugging Face accelerate driving a hand-written loop with gradient accumulation (`accelerator.accumulate`).

Source: huggingface/accelerate, docs/source/usage_guides/gradient_accumulation.md
(https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation), the "Letting Accelerate handle
gradient accumulation" example: `Accelerator(gradient_accumulation_steps=2)`, `accelerator.prepare(model,
optimizer, training_dataloader, scheduler)`, then for each batch `with accelerator.accumulate(model):` output,
loss, `accelerator.backward(loss)`, `optimizer.step()`, `scheduler.step()`, `optimizer.zero_grad()`. Retyped at
CPU size: a Linear(4, 2) model, SGD lr 0.1, a StepLR scheduler, CrossEntropyLoss, a DataLoader of 8 made-up
samples in batches of 2 (one batch per iteration; the prepared loader's iterator is made in build()), on CPU.
"""

from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

FRAMEWORK = "transformers"
WAYS = ("watch", "command", "diagnose", "audit_retain_graph", "find_carried_graph")
ITERATIONS = 4

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
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    dataset = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    training_dataloader = torch.utils.data.DataLoader(dataset, batch_size=2)
    loss_function = torch.nn.CrossEntropyLoss()
    model, optimizer, training_dataloader, scheduler = accelerator.prepare(
        model, optimizer, training_dataloader, scheduler
    )
    return {
        "accelerator": accelerator,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "loss_function": loss_function,
        "batches": iter(training_dataloader),
    }


def iteration(state: dict) -> None:
    accelerator, model, optimizer = state["accelerator"], state["model"], state["optimizer"]
    input, target = next(state["batches"])
    with accelerator.accumulate(model):
        output = model(input)
        loss = state["loss_function"](output, target)
        accelerator.backward(loss)  # @backward
        optimizer.step()
        state["scheduler"].step()
        optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
