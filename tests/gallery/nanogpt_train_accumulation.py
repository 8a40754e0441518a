"""nanoGPT's train.py: gradient accumulation over micro-steps, a GradScaler, clipping, and estimate_loss under no_grad.

Source: karpathy/nanoGPT, train.py and model.py (commit e2221318e607eb5ee0669d6b7641af25a2111545): get_batch,
`@torch.no_grad() estimate_loss()` (model.eval(), eval_iters batches per split, `losses[k] = loss.item()`,
model.train()), get_lr (warm-up, cosine decay), `X, Y = get_batch('train')` before the loop, then per pass of
`while True`: the lr set in each param group, `if iter_num % eval_interval == 0 and master_process: losses =
estimate_loss()` (best_val_loss kept), then `for micro_step in range(gradient_accumulation_steps)`: `if ddp:
model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)`, `with ctx: logits, loss =
model(X, Y); loss = loss / gradient_accumulation_steps`, `X, Y = get_batch('train')` (prefetch),
`scaler.scale(loss).backward()`; `if grad_clip != 0.0: scaler.unscale_(optimizer);
torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)`, `scaler.step(optimizer)`, `scaler.update()`,
`optimizer.zero_grad(set_to_none=True)`, `lossf = loss.item() * gradient_accumulation_steps`, `iter_num += 1`,
`local_iter_num += 1`. model.py's GPT (weight tying of wte and lm_head, CausalSelfAttention with
scaled_dot_product_attention, MLP with GELU, pre-LayerNorm blocks, `_init_weights`, the scaled c_proj init) and
configure_optimizers (AdamW, decay and no-decay groups, fused only on CUDA). Retyped at CPU size: n_layer 2, n_head
2, n_embd 16, block_size 8, vocab_size 32, batch_size 2, gradient_accumulation_steps 2, eval_interval 2, eval_iters
2, dropout 0.0 (train.py's default), bias False, grad_clip 1.0, learning_rate 1e-3, warmup_iters 2, lr_decay_iters 10;
train and val data made up with numpy for the memmapped .bin files; not ddp (the `require_backward_grad_sync` line is
skipped as on one process), `ctx = nullcontext()` (device_type 'cpu'), `torch.amp.GradScaler("cpu",
enabled=(dtype == 'float16'))` with dtype 'float32' for `torch.cuda.amp.GradScaler(...)` (so the scaler is off, as
published on a GPU without float16); no compile, no checkpoints, no wandb, no timing/MFU. The module-level state of
the script is held in `state`; one pass of `while True` per iteration.
"""

import inspect
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- model.py


class LayerNorm(nn.Module):
    """ LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False """

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config

        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # https://paperswithcode.com/method/weight-tying

        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)

        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None

        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0}
        ]
        fused_available = 'fused' in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)
        return optimizer


# ---------------------------------------------------------------- train.py

gradient_accumulation_steps = 2
batch_size = 2
block_size = 8
eval_interval = 2
eval_iters = 2
learning_rate = 1e-3
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 10
min_lr = 1e-4
dtype = 'float32'
device = 'cpu'
device_type = 'cpu'
ddp = False
master_process = True
ctx = nullcontext()


def get_batch(state, split):
    data = state["train_data"] if split == 'train' else state["val_data"]
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y


@torch.no_grad()
def estimate_loss(state):
    model = state["model"]
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(state, split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def build() -> dict:
    torch.manual_seed(1337)
    rng = np.random.default_rng(0)
    train_data = rng.integers(0, 32, 256).astype(np.uint16)
    val_data = rng.integers(0, 32, 64).astype(np.uint16)
    model_args = dict(n_layer=2, n_head=2, n_embd=16, block_size=block_size, bias=False, vocab_size=32, dropout=0.0)
    gptconf = GPTConfig(**model_args)
    model = GPT(gptconf)
    model.to(device)
    scaler = torch.amp.GradScaler("cpu", enabled=(dtype == 'float16'))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    state = {"model": model, "optimizer": optimizer, "scaler": scaler, "train_data": train_data,
             "val_data": val_data, "iter_num": 0, "best_val_loss": 1e9, "local_iter_num": 0}
    X, Y = get_batch(state, 'train')  # fetch the very first batch
    state["X"], state["Y"] = X, Y
    return state


def iteration(state: dict) -> None:
    model, optimizer, scaler = state["model"], state["optimizer"], state["scaler"]
    iter_num = state["iter_num"]
    # determine and set the learning rate for this iteration
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr

    # evaluate the loss on train/val sets and write checkpoints
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss(state)
        if losses['val'] < state["best_val_loss"]:
            state["best_val_loss"] = losses['val']

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(state["X"], state["Y"])
            loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        state["X"], state["Y"] = get_batch(state, 'train')
        # backward pass, with gradient scaling if training in fp16
        scaler.scale(loss).backward()  # @backward
    # clip the gradient
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    # step the optimizer and scaler if training in fp16
    scaler.step(optimizer)
    scaler.update()
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)

    lossf = loss.item() * gradient_accumulation_steps
    state["iter_num"] += 1
    state["local_iter_num"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
