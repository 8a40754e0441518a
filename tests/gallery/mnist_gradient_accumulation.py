"""Gradient accumulation: backward on every batch, an optimizer step and zero_grad every k batches.

Source: thealper2/mnist-gradient-accumulation, trainer.py (Trainer.train_epoch) and model.py (MNISTModel):
`self.optimizer.zero_grad()` once before the batches, then per batch `metrics =
self.model.get_loss_and_accuracy((data, target))`, `loss = loss / self.accumulation_steps`, `loss.backward()`,
running metrics from `loss.item()`, and `self.optimizer.step(); self.optimizer.zero_grad()` only when `(batch_idx
+ 1) % self.accumulation_steps == 0 or (batch_idx + 1) == len(self.train_loader)`; Adam. The iteration here is
one batch. Retyped at CPU size: images of 1x4x4 instead of 1x28x28 (fc1 takes 16 inputs instead of 28 * 28),
hidden size 8 (published 128), dropout 0.3 as published, batches of 4 made up with torch.randn and random labels
in a list standing in for the DataLoader (5 batches, so the last batch also steps; a sixth call starts the next
epoch with its zero_grad), accumulation_steps 2; tqdm, logging, validation and checkpoints left out.
"""

from collections.abc import Callable
from typing import Any, Dict, Tuple

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


class MNISTModel(nn.Module):
    """
    A simple feed-forward neural network for MNIST digit classification.
    """

    def __init__(self, hidden_size: int = 128, dropout_rate: float = 0.3):
        super(MNISTModel, self).__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(4 * 4, hidden_size)
        self.dropout1 = nn.Dropout(dropout_rate)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.dropout2 = nn.Dropout(dropout_rate)
        self.fc3 = nn.Linear(hidden_size, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)

        # First hidden layer with ReLU activation
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout1(x)

        # Second hidden layer with ReLU activation
        x = self.fc2(x)
        x = F.relu(x)
        x = self.dropout2(x)

        # Output layer (logits)
        x = self.fc3(x)

        return x

    def get_loss_and_accuracy(
        self, batch: Tuple[torch.Tensor, torch.Tensor]
    ) -> Dict[str, Any]:
        inputs, targets = batch

        # Forward pass
        outputs = self(inputs)

        # Calculate loss
        loss = F.cross_entropy(outputs, targets)

        # Calculate accuracy
        _, predicted = torch.max(outputs.data, 1)
        correct = (predicted == targets).sum().item()
        accuracy = correct / targets.size(0)

        return {
            "loss": loss,
            "accuracy": accuracy,
            "correct": correct,
            "total": targets.size(0),
        }


def build() -> dict:
    torch.manual_seed(0)
    model = MNISTModel(hidden_size=8)
    train_loader = [(torch.randn(4, 1, 4, 4), torch.randint(0, 10, (4,))) for _ in range(ITERATIONS)]
    optimizer = optim.Adam(model.parameters(), lr=0.001)
    model.train()
    return {"model": model, "optimizer": optimizer, "train_loader": train_loader, "accumulation_steps": 2,
            "step": 0, "running_loss": 0.0, "running_correct": 0, "running_total": 0}


def train_batch(state: dict) -> None:
    model, optimizer, accumulation_steps = state["model"], state["optimizer"], state["accumulation_steps"]
    batch_idx = state["step"] % len(state["train_loader"])
    data, target = state["train_loader"][batch_idx]
    state["step"] += 1
    if batch_idx == 0:
        # Reset gradients at the beginning (of each epoch)
        optimizer.zero_grad()

    # Get metrics (loss, accuracy)
    metrics = model.get_loss_and_accuracy((data, target))
    loss = metrics["loss"]

    # Scale the loss according to accumulation steps
    loss = loss / accumulation_steps

    # Backward pass
    loss.backward()  # @backward

    # Update metrics
    state["running_loss"] += loss.item() * accumulation_steps
    state["running_correct"] += metrics["correct"]
    state["running_total"] += metrics["total"]

    # Update weights if we reached accumulation steps or at the last batch
    if (batch_idx + 1) % accumulation_steps == 0 or (batch_idx + 1) == len(
        state["train_loader"]
    ):
        optimizer.step()
        optimizer.zero_grad()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        train_batch(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: train_batch(state)


if __name__ == "__main__":
    run(build())
