"""Knowledge distillation: a frozen teacher's logits, computed under torch.no_grad(), soften a student's targets.

Source: pytorch/tutorials, beginner_source/knowledge_distillation_tutorial.py (commit
035c541fa706ab2b1eca57e0625b5bbdca5e04cb; https://pytorch.org/tutorials/beginner/knowledge_distillation_tutorial.html):
DeepNN (the teacher) and LightNN (the student), train_knowledge_distillation(teacher, student, train_loader, epochs,
learning_rate, T, soft_target_loss_weight, ce_loss_weight, device): `ce_loss = nn.CrossEntropyLoss()`, Adam on the
student, teacher.eval(), student.train(), then per batch optimizer.zero_grad(), `with torch.no_grad(): teacher_logits
= teacher(inputs)`, `student_logits = student(inputs)`, soft_targets (softmax of teacher_logits / T), soft_prob
(log_softmax of student_logits / T), `soft_targets_loss = -torch.sum(soft_targets * soft_prob) /
soft_prob.size()[0] * (T**2)`, label_loss, `loss = soft_target_loss_weight * soft_targets_loss + ce_loss_weight *
label_loss`, loss.backward(), optimizer.step(), `running_loss += loss.item()`, and the epoch's print; called with
T=2, soft_target_loss_weight=0.25, ce_loss_weight=0.75, learning_rate=0.001. Retyped at CPU size: 8x8 images
(CIFAR-10's are 32x32) made up in a list of 2 batches of 4 standing in for the DataLoader, the teacher's convolutions
3->16->8 and 8->8->4 (published 3->128->64 and 64->64->32), the student's 3->4 and 4->4 (published 16), classifiers
16->32->10 and 16->8->10 (published 2048->512 and 1024->256); the teacher's pretraining with train() (another loop)
is left out, so the teacher is as initialised; what the function makes before its epoch loop (ce_loss, the
optimizer, the modes) is made by build(), and one pass of the epoch loop is an iteration.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.optim as optim

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

device = "cpu"


# Deeper neural network class to be used as teacher
class DeepNN(nn.Module):
    def __init__(self, num_classes=10):
        super(DeepNN, self).__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(8, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 4, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16, 32),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(32, num_classes)
        )

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


# Lightweight neural network class to be used as student
class LightNN(nn.Module):
    def __init__(self, num_classes=10):
        super(LightNN, self).__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(4, 4, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16, 8),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(8, num_classes)
        )

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


def build() -> dict:
    torch.manual_seed(42)
    nn_deep = DeepNN(num_classes=10)
    torch.manual_seed(42)
    new_nn_light = LightNN(num_classes=10)
    data = torch.Generator().manual_seed(0)
    train_loader = [(torch.randn(4, 3, 8, 8, generator=data), torch.randint(0, 10, (4,), generator=data))
                    for _ in range(2)]
    # what train_knowledge_distillation makes before its epoch loop
    teacher, student = nn_deep, new_nn_light
    ce_loss = nn.CrossEntropyLoss()
    optimizer = optim.Adam(student.parameters(), lr=0.001)
    teacher.to(device)
    student.to(device)
    teacher.eval()  # Teacher set to evaluation mode
    student.train() # Student to train mode
    return {"teacher": teacher, "student": student, "optimizer": optimizer, "ce_loss": ce_loss,
            "train_loader": train_loader, "epoch": 0, "epochs": 10, "T": 2, "soft_target_loss_weight": 0.25,
            "ce_loss_weight": 0.75}


def epoch_of_distillation(state: dict) -> None:
    teacher, student, optimizer, ce_loss = state["teacher"], state["student"], state["optimizer"], state["ce_loss"]
    train_loader, epoch, epochs, T = state["train_loader"], state["epoch"], state["epochs"], state["T"]
    soft_target_loss_weight, ce_loss_weight = state["soft_target_loss_weight"], state["ce_loss_weight"]

    running_loss = 0.0
    for inputs, labels in train_loader:
        inputs, labels = inputs.to(device), labels.to(device)

        optimizer.zero_grad()

        # Forward pass with the teacher model - do not save gradients here as we do not change the teacher's weights
        with torch.no_grad():
            teacher_logits = teacher(inputs)

        # Forward pass with the student model
        student_logits = student(inputs)

        #Soften the student logits by applying softmax first and log() second
        soft_targets = nn.functional.softmax(teacher_logits / T, dim=-1)
        soft_prob = nn.functional.log_softmax(student_logits / T, dim=-1)

        # Calculate the soft targets loss. Scaled by T**2 as suggested by the authors of the paper "Distilling the knowledge in a neural network"
        soft_targets_loss = -torch.sum(soft_targets * soft_prob) / soft_prob.size()[0] * (T**2)

        # Calculate the true label loss
        label_loss = ce_loss(student_logits, labels)

        # Weighted sum of the two losses
        loss = soft_target_loss_weight * soft_targets_loss + ce_loss_weight * label_loss

        loss.backward()  # @backward
        optimizer.step()

        running_loss += loss.item()

    print(f"Epoch {epoch+1}/{epochs}, Loss: {running_loss / len(train_loader)}")
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        epoch_of_distillation(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: epoch_of_distillation(state)


if __name__ == "__main__":
    run(build())
