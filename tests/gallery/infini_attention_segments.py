"""Infini-attention fine-tuning: a compressive memory (M, z) passed from segment to segment, a backward per segment.

Source: jlamprou/Infini-Attention, run_clm.py (commit 09d2d478cfd34a3d8539a69395c576079cf51488: per batch
`total_segment_loss = 0`, the batch cut by `torch.tensor_split` into segments, `M_Z = None`, then per segment
`outputs = model(input_ids=input_ids[i], attention_mask=..., labels=labels[i], M_Z=M_Z)`, `M_Z = outputs.M_Z`,
`loss = outputs.loss`, `accelerator.backward(loss)`, `total_loss += loss.detach().float()`, and after the
segments `optimizer.step()`, `lr_scheduler.step()`, `optimizer.zero_grad()`) with infiniAttention.py's
InfiniAttention (`_retrieve_from_memory`: `(elu(Q)+1) @ M / ((elu(Q)+1) @ z + 1e-8)`; `_update_memory`:
`M + (elu(K)+1)^T V`, `z + sum(elu(K)+1)`; `_long_term_injection`: `sigmoid(beta) * A_mem + (1 - sigmoid(beta)) *
A_dot`), as it was before the fix discussed in its issue #3 (https://github.com/jlamprou/Infini-Attention/issues/3,
"Do we need `.backward(retain_graph=True)`?": "It seems like we backprop multiple times for segments, so I have to
turn on `retain_graph=True` but it consumes more memory"; the author: "I'm also detaching M and z on def
_update_memory since there is no need to keep them on the backward"): the updated memory returned undetached,
and the reporter's `retain_graph=True` on the per-segment backward. Retyped at CPU size: a one-layer model
(embedding, one InfiniAttention of 2 heads of size 4 in place of Qwen2-MoE's attention, no rotary embedding, no
MLP, a linear LM head), batches of 2 sequences of 12 made-up tokens cut into 3 segments of 4 (published 2048),
`loss.backward` in place of `accelerator.backward`, the causal LM loss written out (logits shifted against the
labels), a LinearLR schedule in place of transformers' get_scheduler; logging and checkpointing left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3
VOCAB = 16
HIDDEN = 8
HEADS = 2
SEGMENT = 4

TRUTH = {
    "error": None,
    "retains": {"@backward": {"verdict": "needed", "runs": 9, "needed_runs": 6}},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


class InfiniAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.beta = nn.Parameter(torch.randn(1))

    def forward(self, hidden_states, M_Z=None):
        # Initialize memory and normalization term
        if M_Z is None:
            M = torch.zeros(self.num_heads, self.head_dim, self.head_dim)
            z = torch.zeros(self.num_heads, self.head_dim)
        else:
            M, z = M_Z

        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)

        memory_output = self._retrieve_from_memory(query_states, M, z)
        # Update memory with current segment's key and value states
        M, z = self._update_memory(key_states, value_states, M, z)

        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True)
        combined_output = self._long_term_injection(attn_output, memory_output)

        # Prepare output for this segment
        combined_output = combined_output.transpose(1, 2).contiguous()
        combined_output = combined_output.view(bsz, q_len, self.hidden_size)
        final_output = self.o_proj(combined_output)
        return final_output, (M, z)

    def _retrieve_from_memory(self, Q, M, z):
        # Retrieve context from compressive memory using linear attention (Eq. 3)
        M_s_1 = torch.matmul(F.elu(Q) + 1, M)
        Z_s_1 = torch.matmul(F.elu(Q) + 1, z.unsqueeze(-1)) + 1e-8
        A_mem = M_s_1 / Z_s_1
        return A_mem

    def _update_memory(self, K, V, M, z):
        updated_M = M + torch.matmul((F.elu(K) + 1).transpose(-2, -1), V).mean(dim=0)  # @update_memory
        updated_z = z + (F.elu(K) + 1).sum(dim=-2).mean(dim=0)
        return updated_M, updated_z

    def _long_term_injection(self, A_dot, A_mem):
        beta = torch.sigmoid(self.beta)
        A = beta * A_mem + (1 - beta) * A_dot
        return A


class Output:
    def __init__(self, loss, logits, M_Z):
        self.loss, self.logits, self.M_Z = loss, logits, M_Z


class InfiniLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.self_attn = InfiniAttention(HIDDEN, HEADS)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids, labels=None, M_Z=None):
        hidden_states = self.embed_tokens(input_ids)
        attn_out, M_Z = self.self_attn(hidden_states, M_Z=M_Z)  # @attention
        logits = self.lm_head(hidden_states + attn_out)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return Output(loss, logits, M_Z)


def build() -> dict:
    torch.manual_seed(0)
    model = InfiniLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=10)
    batches = [{"input_ids": torch.randint(0, VOCAB, (2, 3 * SEGMENT))} for _ in range(ITERATIONS)]
    for batch in batches:
        batch["labels"] = batch["input_ids"].clone()
    model.train()
    return {"model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler, "batches": batches,
            "total_loss": 0, "step": 0}


def iteration(state: dict) -> None:
    model, optimizer, lr_scheduler = state["model"], state["optimizer"], state["lr_scheduler"]
    batch = state["batches"][state["step"]]
    segment_length = SEGMENT
    total_segment_loss = 0
    # Segment the batch items into smaller chunks of segment_length tokens
    input_ids = torch.tensor_split(batch["input_ids"], list(range(segment_length, batch["input_ids"].shape[1], segment_length)), dim = 1)
    labels = torch.tensor_split(batch["labels"], list(range(segment_length, batch["labels"].shape[1], segment_length)), dim = 1)
    M_Z = None
    for i in range(len(input_ids)):
        outputs = model(input_ids=input_ids[i], labels=labels[i], M_Z=M_Z)
        M_Z = outputs.M_Z
        loss = outputs.loss
        loss.backward(retain_graph=True)  # @backward
        state["total_loss"] += loss.detach().float()
        total_segment_loss += loss.detach().float()
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
    state["step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for step in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
