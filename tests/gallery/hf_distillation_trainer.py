"""Knowledge distillation with the Hugging Face `Trainer`: a subclass whose `compute_loss` mixes the student's
cross-entropy with a temperature-scaled KL divergence to a frozen teacher's logits.

Source: LeTien12/SentimentAnalysis, src/engineer/student/update_model_student.py (commit
058f293f1ce8705e8323dd59af8138234175243f), the pattern of philschmid/knowledge-distillation-transformers-pytorch-sagemaker:
`DistillationTrainingArguments(TrainingArguments)` adding `alpha=0.5, temperature=2.0`; `DistillationTrainer(Trainer)`
with `teacher_model` kept as `self.teacher_model` and `compute_loss(self, model, inputs, return_outputs=False,
num_items_in_batch=None)`: `outputs_stu = model(**inputs)`, `loss_ce = outputs_stu.loss`, the teacher's logits under
`torch.no_grad()`, `loss_kd = self.args.temperature ** 2 * KLDivLoss(reduction="batchmean")(log_softmax(logits_stu
/ T), softmax(logits_tea / T))`, `loss = self.args.alpha * loss_ce + (1. - self.args.alpha) * loss_kd`. Retyped at
CPU size, with nothing downloaded: student and teacher are `BertForSequenceClassification` built from
`BertConfig`s (student 1 layer, hidden 16; teacher 2 layers, hidden 32; vocabulary 50, 3 labels) instead of the
pretrained checkpoints, made-up token ids (sequences of 8) with labels, batches of 2, `max_steps`, no evaluation,
saving, logging or hub push (`report_to="none"`, `use_cpu=True`), a temporary output folder.

The `Trainer` calls backward from its own `training_step` (`self.accelerator.backward(loss)`): the learner's innermost
line running throughout is `trainer.train()`.
"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub: the models are built from configs

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, default_data_collator

FRAMEWORK = "transformers"
WAYS = ("watch", "command")  # the Trainer runs the step: there is no step_function to hand to the step tools
ITERATIONS = 3
VOCAB = 50

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class DistillationTrainingArguments(TrainingArguments):
    def __init__(self, *args, alpha=0.5, temperature=2.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha = alpha
        self.temperature = temperature


class DistillationTrainer(Trainer):
    def __init__(self, *args, teacher_model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher_model = teacher_model

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs_stu = model(**inputs)
        # Extract cross-entropy loss and logits from student
        loss_ce = outputs_stu.loss
        logits_stu = outputs_stu.logits
        # Extract logits from teacher
        with torch.no_grad():
            outputs_tea = self.teacher_model(**inputs)
            logits_tea = outputs_tea.logits
        # Soften probabilities and compute distillation loss
        loss_fct = torch.nn.KLDivLoss(reduction="batchmean")
        loss_kd = self.args.temperature**2 * loss_fct(
            torch.nn.functional.log_softmax(logits_stu / self.args.temperature, dim=-1),
            torch.nn.functional.softmax(logits_tea / self.args.temperature, dim=-1),
        )
        # Return weighted student loss
        loss = self.args.alpha * loss_ce + (1.0 - self.args.alpha) * loss_kd
        return (loss, outputs_stu) if return_outputs else loss


def build() -> dict:
    torch.manual_seed(0)
    student = BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
            num_labels=3,
        )
    )
    teacher = BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            num_labels=3,
        )
    )
    teacher.eval()
    tokens = torch.randint(1, VOCAB, (2 * (ITERATIONS + 1), 8))
    labels = torch.randint(0, 3, (2 * (ITERATIONS + 1),))
    train_dataset = [
        {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": label}
        for row, label in zip(tokens, labels)
    ]
    return {"model": student, "teacher_model": teacher, "train_dataset": train_dataset}


def run(state: dict, iterations: int = ITERATIONS, callbacks=()) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = DistillationTrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=2,
            max_steps=iterations,
            learning_rate=5e-5,
            alpha=0.5,
            temperature=2.0,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = DistillationTrainer(
            model=state["model"],
            args=training_args,
            teacher_model=state["teacher_model"],
            data_collator=default_data_collator,
            train_dataset=state["train_dataset"],
            callbacks=list(callbacks),
        )
        trainer.train()  # @train


if __name__ == "__main__":
    run(build())
