"""LoRA fine-tuning of a GPT-2 (microsoft/LoRA's NLG example): frozen base weights, only the low-rank adapters of
the attention's merged q/k/v projection train, with gradient accumulation and an evaluation inside the epoch.

Source: microsoft/LoRA, NLG/src/gpt2_ft.py (commit 2eb74c2dc816ffb89a8217158a837952df7cbcfe), as published:
train_validate (`model.train()`, per batch `_lm_logits, _lm_loss = model(_input, lm_labels=_target, lm_mask=_msk,
label_smooth=args.label_smooth)`, `_lm_loss = _lm_loss.mean()`, `train_step += 1`, `is_update = True if train_step
% args.grad_acc == 0 else False`, `avg_lm_loss.update(_lm_loss.item())`, `optimizer_step(_lm_loss/(args.grad_acc),
...)`, the log block resetting the meter, the eval block calling `evaluate` and then `model.train()`, `if train_step
== args.max_step: break`), optimizer_step (`_loss.backward()`, on `is_update` `clip_grad_norm_`, `step()`,
`zero_grad()`, and `_schedule.step()` every call), evaluate (`model.eval()`, `torch.no_grad()`), AverageMeter, the
`__main__` part that matters (`lora.mark_only_lora_as_trainable(lm_net)`, the optimizer, the scheduler, the epoch
loop carrying `train_step`); loralib/layers.py (same commit) as published: LoRALayer and MergedLinear (`lora_A`,
`lora_B` zero-initialised, `self.weight.requires_grad = False`, `fan_in_fan_out` transposing the weight,
`zero_pad` through `lora_ind`, forward `result += self.zero_pad(after_B) * self.scaling` in place, train/eval with
`merge_weights`); loralib/utils.py's mark_only_lora_as_trainable (bias 'none'); NLG/src/model.py's Attention
building `c_attn` as `lora.MergedLinear(nx, n_state * 3, r=config.lora_attn_dim, lora_alpha=config.lora_attn_alpha,
lora_dropout=config.lora_dropout, enable_lora=[True, False, True], fan_in_fan_out=True, merge_weights=False)` and
GPT2LMModel's masked loss (`CrossEntropyLoss(ignore_index=-1, reduce=False)` per token, `loss * lm_mask`,
`loss.sum() / (lm_mask.sum() + 0.0001)`, the lm head tied to `wte`). Retyped at CPU size: GPT-2 medium becomes one
block (n_embd 8, 2 heads, n_positions 6, vocabulary 11), lora_attn_dim 2, lora_alpha 4, lora_dropout 0.1; Conv1D's
c_proj and MLP become nn.Linear; `reduce=False` is written `reduction='none'`; FT_Dataset and the DataLoaders become
4 made-up training batches and 1 validation batch of 2 sequences; AdamW (create_adam_optimizer_from_args's
weight_decay 0.01, lr 1e-2) and a linear warmup-decay LambdaLR for create_optimizer_scheduler; grad_acc 2, clip
1.0, log_interval 2, eval_interval 2, save_interval and checkpoints left out, no fp16, no distributed
(`distributed_sync`, the sampler's set_epoch left out), rank 0 prints left out. One epoch of train_validate per
iteration.
"""

import argparse
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- loralib/layers.py


class LoRALayer():
    def __init__(
        self,
        r: int,
        lora_alpha: int,
        lora_dropout: float,
        merge_weights: bool,
    ):
        self.r = r
        self.lora_alpha = lora_alpha
        # Optional dropout
        if lora_dropout > 0.:
            self.lora_dropout = nn.Dropout(p=lora_dropout)
        else:
            self.lora_dropout = lambda x: x
        # Mark the weight as unmerged
        self.merged = False
        self.merge_weights = merge_weights


class MergedLinear(nn.Linear, LoRALayer):
    # LoRA implemented in a dense layer
    def __init__(
        self,
        in_features: int,
        out_features: int,
        r: int = 0,
        lora_alpha: int = 1,
        lora_dropout: float = 0.,
        enable_lora=[False],  # noqa: B006 (as published)
        fan_in_fan_out: bool = False,
        merge_weights: bool = True,
        **kwargs
    ):
        nn.Linear.__init__(self, in_features, out_features, **kwargs)
        LoRALayer.__init__(self, r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                           merge_weights=merge_weights)
        assert out_features % len(enable_lora) == 0, \
            'The length of enable_lora must divide out_features'
        self.enable_lora = enable_lora
        self.fan_in_fan_out = fan_in_fan_out
        # Actual trainable parameters
        if r > 0 and any(enable_lora):
            self.lora_A = nn.Parameter(
                self.weight.new_zeros((r * sum(enable_lora), in_features)))
            self.lora_B = nn.Parameter(
                self.weight.new_zeros((out_features // len(enable_lora) * sum(enable_lora), r))
            )  # weights for Conv1D with groups=sum(enable_lora)
            self.scaling = self.lora_alpha / self.r
            # Freezing the pre-trained weight matrix
            self.weight.requires_grad = False
            # Compute the indices
            self.lora_ind = self.weight.new_zeros(
                (out_features, ), dtype=torch.bool
            ).view(len(enable_lora), -1)
            self.lora_ind[enable_lora, :] = True
            self.lora_ind = self.lora_ind.view(-1)
        self.reset_parameters()
        if fan_in_fan_out:
            self.weight.data = self.weight.data.T

    def reset_parameters(self):
        nn.Linear.reset_parameters(self)
        if hasattr(self, 'lora_A'):
            # initialize A the same way as the default for nn.Linear and B to zero
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def zero_pad(self, x):
        result = x.new_zeros((*x.shape[:-1], self.out_features))
        result = result.view(-1, self.out_features)
        result[:, self.lora_ind] = x.reshape(
            -1, self.out_features // len(self.enable_lora) * sum(self.enable_lora)
        )
        return result.view((*x.shape[:-1], self.out_features))

    def train(self, mode: bool = True):
        def T(w):
            return w.T if self.fan_in_fan_out else w
        nn.Linear.train(self, mode)
        if self.merge_weights and self.merged:
            # Make sure that the weights are not merged
            if self.r > 0 and any(self.enable_lora):
                delta_w = F.conv1d(
                    self.lora_A.data.unsqueeze(0),
                    self.lora_B.data.unsqueeze(-1),
                    groups=sum(self.enable_lora)
                ).squeeze(0)
                self.weight.data -= self.zero_pad(T(delta_w * self.scaling))
            self.merged = False

    def eval(self):
        def T(w):
            return w.T if self.fan_in_fan_out else w
        nn.Linear.eval(self)
        if self.merge_weights and not self.merged:
            # Merge the weights and mark it
            if self.r > 0 and any(self.enable_lora):
                delta_w = F.conv1d(
                    self.lora_A.data.unsqueeze(0),
                    self.lora_B.data.unsqueeze(-1),
                    groups=sum(self.enable_lora)
                ).squeeze(0)
                self.weight.data += self.zero_pad(T(delta_w * self.scaling))
            self.merged = True

    def forward(self, x: torch.Tensor):
        def T(w):
            return w.T if self.fan_in_fan_out else w
        if self.merged:
            return F.linear(x, T(self.weight), bias=self.bias)
        else:
            result = F.linear(x, T(self.weight), bias=self.bias)
            if self.r > 0:
                after_A = F.linear(self.lora_dropout(x), self.lora_A)
                after_B = F.conv1d(
                    after_A.transpose(-2, -1),
                    self.lora_B.unsqueeze(-1),
                    groups=sum(self.enable_lora)
                ).transpose(-2, -1)
                result += self.zero_pad(after_B) * self.scaling
            return result


# ---------------------------------------------------------------- loralib/utils.py


def mark_only_lora_as_trainable(model: nn.Module, bias: str = 'none') -> None:
    for n, p in model.named_parameters():
        if 'lora_' not in n:
            p.requires_grad = False
    if bias == 'none':
        return


# ---------------------------------------------------------------- NLG/src/model.py (one block)


class Attention(nn.Module):
    def __init__(self, nx, n_ctx, config, scale=False):
        super(Attention, self).__init__()
        n_state = nx  # in Attention: n_state=768 (nx=n_embd)
        assert n_state % config.n_head == 0
        self.register_buffer("bias", torch.tril(torch.ones(n_ctx, n_ctx)).view(1, 1, n_ctx, n_ctx))
        self.n_head = config.n_head
        self.split_size = n_state
        self.scale = scale
        self.c_attn = MergedLinear(
            nx, n_state * 3,
            r=config.lora_attn_dim,
            lora_alpha=config.lora_attn_alpha,
            lora_dropout=config.lora_dropout,
            enable_lora=[True, False, True],
            fan_in_fan_out=True,
            merge_weights=False
        )
        self.c_proj = nn.Linear(n_state, nx)

    def _attn(self, q, k, v):
        w = torch.matmul(q, k)
        if self.scale:
            w = w / math.sqrt(v.size(-1))
        nd, ns = w.size(-2), w.size(-1)
        b = self.bias[:, :, ns - nd:ns, :ns]
        w = w * b - 1e10 * (1 - b)
        w = nn.Softmax(dim=-1)(w)
        return torch.matmul(w, v)

    def merge_heads(self, x):
        x = x.permute(0, 2, 1, 3).contiguous()
        new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)
        return x.view(*new_x_shape)  # in Tensorflow implem: fct merge_states

    def split_heads(self, x, k=False):
        new_x_shape = x.size()[:-1] + (self.n_head, x.size(-1) // self.n_head)
        x = x.view(*new_x_shape)  # in Tensorflow implem: fct split_states
        if k:
            return x.permute(0, 2, 3, 1).contiguous()  # (batch, head, head_features, seq_length)
        else:
            return x.permute(0, 2, 1, 3).contiguous()  # (batch, head, seq_length, head_features)

    def forward(self, x):
        hidden_states = x
        x = self.c_attn(x)
        query, key, value = x.split(self.split_size, dim=2)
        query = self.split_heads(query)
        key = self.split_heads(key, k=True)
        value = self.split_heads(value)
        a = self._attn(query, key, value)
        a = self.merge_heads(a)
        a = self.c_proj(a)
        return a


class Block(nn.Module):
    def __init__(self, n_ctx, config, scale=False):
        super(Block, self).__init__()
        nx = config.n_embd
        self.ln_1 = nn.LayerNorm(nx, eps=config.layer_norm_epsilon)
        self.attn = Attention(nx, n_ctx, config, scale)
        self.ln_2 = nn.LayerNorm(nx, eps=config.layer_norm_epsilon)
        self.mlp = nn.Sequential(nn.Linear(nx, 4 * nx), nn.GELU(), nn.Linear(4 * nx, nx))

    def forward(self, x):
        a = self.attn(self.ln_1(x))
        x = x + a
        m = self.mlp(self.ln_2(x))
        x = x + m
        return x


class GPT2LMModel(nn.Module):
    def __init__(self, config):
        super(GPT2LMModel, self).__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList([Block(config.n_ctx, config, scale=True) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied weights

    def forward(self, input_ids, lm_labels=None, lm_mask=None, label_smooth=0.0):
        _batch, _len = input_ids.shape
        position_ids = torch.arange(0, _len, dtype=torch.long).unsqueeze(0).expand_as(input_ids)
        hidden_states = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            hidden_states = block(hidden_states)
        hidden_states = self.ln_f(hidden_states)
        lm_logits = self.lm_head(hidden_states)
        if lm_labels is not None:
            if label_smooth > 0.0001:
                logprobs = torch.nn.functional.log_softmax(lm_logits.view(-1, lm_logits.size(-1)), dim=-1)
                nll_loss = -logprobs.gather(dim=-1, index=lm_labels.view(-1).unsqueeze(1))
                nll_loss = nll_loss.squeeze(1)
                smooth_loss = -logprobs.mean(dim=-1)
                loss = (1.0 - label_smooth) * nll_loss + label_smooth * smooth_loss
                loss = loss.view(_batch, _len)
            else:
                loss_fct = nn.CrossEntropyLoss(ignore_index=-1, reduction='none')
                loss = loss_fct(lm_logits.view(-1, lm_logits.size(-1)), lm_labels.view(-1)).view(_batch, _len)

            if lm_mask is None:
                lm_mask = torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
            loss = loss * lm_mask

            loss = loss.sum() / (lm_mask.sum() + 0.0001)
            return lm_logits, loss
        return lm_logits, None


# ---------------------------------------------------------------- NLG/src/gpt2_ft.py


class AverageMeter(object):
    """Computes and stores the average and current value
         Imported from https://github.com/pytorch/examples/blob/master/imagenet/main.py#L247-L262
    """
    def __init__(self):
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def optimizer_step(_loss, _optimizer, _model, _schedule, args, is_update=True):
    _loss.backward()  # @backward

    if is_update:
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(_model.parameters(), args.clip)

        _optimizer.step()
        _optimizer.zero_grad()

    if _schedule is not None:
        _schedule.step()


def evaluate(model, valid_loader, args):
    model.eval()
    avg_lm_loss = AverageMeter()

    with torch.no_grad():
        for idx, data in enumerate(valid_loader):
            data = {key: value for key, value in data.items()}

            _input = data['input']
            _target = data['target']
            _msk = data['mask']

            _lm_logits, _loss = model(_input, lm_labels=_target, lm_mask=_msk)
            loss = _loss.mean()

            avg_lm_loss.update(loss.item())

    return avg_lm_loss.avg, math.exp(avg_lm_loss.avg)


def train_validate(
    model,
    optimizer,
    scheduler,
    train_loader,
    valid_loader,
    args,
    train_step=0,
    epoch=0
):
    model.train()
    avg_lm_loss = AverageMeter()
    best_val_ppl = None

    for idx, data in enumerate(train_loader):
        data = {key: value for key, value in data.items()}

        _input = data['input']
        _target = data['target']
        _msk = data['mask']

        _lm_logits, _lm_loss = model(
            _input, lm_labels=_target, lm_mask=_msk, label_smooth=args.label_smooth
        )

        _lm_loss = _lm_loss.mean()

        train_step += 1
        is_update = True if train_step % args.grad_acc == 0 else False
        avg_lm_loss.update(_lm_loss.item())
        optimizer_step(
            _lm_loss/(args.grad_acc), optimizer, model, scheduler, args, is_update=is_update
        )

        if train_step % args.log_interval == 0:
            lr = optimizer.param_groups[0]['lr']
            log_str = f'| epoch {epoch:3d} step {train_step:>8d} | {idx + 1:>6d} batches | ' \
                      f'lr {lr:.3g} | loss {avg_lm_loss.val:5.2f} | avg loss {avg_lm_loss.avg:5.2f} | ' \
                      f'ppl {math.exp(avg_lm_loss.avg):5.2f}'
            avg_lm_loss.reset()

        # evaluation interval
        if train_step % args.eval_interval == 0:
            valid_loss, valid_ppl = evaluate(model, valid_loader, args)

            if best_val_ppl is None or valid_ppl < best_val_ppl:
                best_val_ppl = valid_ppl

            model.train()

        if train_step == args.max_step:
            break

    return train_step


def make_batch(batch_size=2, seq_len=6, vocab=11):
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1))
    mask = torch.ones(batch_size, seq_len)
    mask[:, :2] = 0  # the context is not predicted, only the completion
    return {'input': tokens[:, :-1].contiguous(), 'target': tokens[:, 1:].contiguous(), 'mask': mask}


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(grad_acc=2, clip=1.0, log_interval=2, eval_interval=2, max_step=1000,
                              label_smooth=0.0, lr=1e-2, weight_decay=0.01, warmup_step=2, lora_dim=2)
    config = argparse.Namespace(vocab_size=11, n_positions=6, n_ctx=6, n_embd=8, n_layer=1, n_head=2,
                                layer_norm_epsilon=1e-5, lora_attn_dim=args.lora_dim, lora_attn_alpha=4,
                                lora_dropout=0.1)
    train_loader = [make_batch() for _ in range(4)]
    valid_loader = [make_batch()]
    lm_net = GPT2LMModel(config)
    if args.lora_dim > 0:
        mark_only_lora_as_trainable(lm_net)
    optimizer = torch.optim.AdamW([p for p in lm_net.parameters() if p.requires_grad], lr=args.lr,
                                  weight_decay=args.weight_decay)
    max_step = 4 * len(train_loader)

    def lr_lambda(current_step):
        if current_step < args.warmup_step:
            return float(current_step) / float(max(1, args.warmup_step))
        return max(0.0, float(max_step - current_step) / float(max(1, max_step - args.warmup_step)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return {"lm_net": lm_net, "optimizer": optimizer, "scheduler": scheduler, "train_loader": train_loader,
            "valid_loader": valid_loader, "args": args, "train_step": 0, "epoch": 1}


def iteration(state: dict) -> None:
    state["train_step"] = train_validate(
        state["lm_net"], state["optimizer"], state["scheduler"], state["train_loader"], state["valid_loader"],
        state["args"], train_step=state["train_step"], epoch=state["epoch"]
    )
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    train_step = 0
    for epoch in range(1, iterations + 1):
        train_step = train_validate(
            state["lm_net"], state["optimizer"], state["scheduler"], state["train_loader"], state["valid_loader"],
            state["args"], train_step=train_step, epoch=epoch
        )


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
