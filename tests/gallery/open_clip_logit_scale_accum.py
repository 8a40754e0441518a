"""OpenCLIP's train_one_epoch with accum_freq 2: features cached under no_grad, each batch's forward redone, and the
learnable `logit_scale` clamped in place after the step.

Source: mlfoundations/open_clip, src/training/train.py, train_one_epoch (commit
f65b5b02a4b919dff7f65e2a3304a4cec85d5f66), as published: `i_accum = i // args.accum_freq`, `scheduler(step)`,
`optimizer.zero_grad()`, the `accum_freq > 1` path (a first forward under `torch.no_grad()` whose
`model_out.pop("logit_scale")` and features go to `accum_features[key]`, images and texts to `accum_images` and
`accum_texts`, `continue` until `(i + 1) % accum_freq == 0`; then `optimizer.zero_grad()` and for each `j` the
forward again, `logit_scale = model_out.pop("logit_scale")`, `inputs[key] = torch.cat(accumulated[:j] +
[model_out[key]] + accumulated[j + 1:])`, `losses = loss(**inputs, logit_scale=logit_scale, output_dict=True)`,
`del inputs`, `total_loss = sum(losses.values())`, `losses["loss"] = total_loss`, `backward(total_loss, scaler)`),
then `clip_grad_norm_` and `optimizer.step()` (scaler None: precision fp32), the accumulators reset, and
`with torch.no_grad(): unwrap_model(model).logit_scale.clamp_(0, math.log(100))`; the logging block's meters
(`losses_m[key].update(val.item(), batch_size)`, `logit_scale.item()`) with `log_every_n_steps` 1, logging.info and
tb/wandb left out. ClipLoss from src/open_clip/loss.py (the world-size-1 path: `logit_scale * image_features @
text_features.T` both ways, `get_ground_truth` with its label cache, the two cross entropies halved, `output_dict`);
CLIP.forward from src/open_clip/model.py (`F.normalize` of both towers' features, `self.logit_scale.exp()` in an
output dict, `logit_scale` initialised to `np.log(1 / 0.07)`), encode_text's EOT pooling `x[torch.arange(x.shape[0]),
text.argmax(dim=-1)] @ self.text_projection`; cosine_lr from src/training/scheduler.py; main.py's AdamW with its
`exclude` rule (gain, bias, norm and logit_scale get no weight decay). Retyped at CPU size: the ViT becomes a
conv-pool-linear image tower (3x8x8 images), the text transformer one `nn.TransformerEncoderLayer` (width 8, 6 tokens,
vocabulary 10, a causal mask), embed_dim 8; 4 made-up batches of 3 pairs per epoch (2 optimizer steps); lr 1e-2,
warmup 1, grad_clip_norm 1.0; no DDP or horovod, `data['train'].set_epoch` and timing left out. One epoch per
iteration.
"""

import argparse
import math
from collections.abc import Callable

import numpy as np
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


class AverageMeter(object):
    """Computes and stores the average and current value"""

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


def unwrap_model(model):
    if hasattr(model, 'module'):
        return model.module
    else:
        return model


def backward(total_loss, scaler):
    if scaler is not None:
        scaler.scale(total_loss).backward()
    else:
        total_loss.backward()  # @backward


# ---------------------------------------------------------------- src/open_clip/loss.py


class ClipLoss(nn.Module):

    def __init__(self, local_loss=False, gather_with_grad=False, cache_labels=False, rank=0, world_size=1,
                 use_horovod=False):
        super().__init__()
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.cache_labels = cache_labels
        self.rank = rank
        self.world_size = world_size
        self.use_horovod = use_horovod

        # cache state
        self.prev_num_logits = 0
        self.labels = {}

    def get_ground_truth(self, device, num_logits) -> torch.Tensor:
        # calculated ground-truth and cache if enabled
        if self.prev_num_logits != num_logits or device not in self.labels:
            labels = torch.arange(num_logits, device=device, dtype=torch.long)
            if self.world_size > 1 and self.local_loss:
                labels = labels + num_logits * self.rank
            if self.cache_labels:
                self.labels[device] = labels
                self.prev_num_logits = num_logits
        else:
            labels = self.labels[device]
        return labels

    def get_logits(self, image_features, text_features, logit_scale):
        logits_per_image = logit_scale * image_features @ text_features.T
        logits_per_text = logit_scale * text_features @ image_features.T
        return logits_per_image, logits_per_text

    def forward(self, image_features, text_features, logit_scale, output_dict=False):
        device = image_features.device
        logits_per_image, logits_per_text = self.get_logits(image_features, text_features, logit_scale)

        labels = self.get_ground_truth(device, logits_per_image.shape[0])

        total_loss = (
            F.cross_entropy(logits_per_image, labels) +
            F.cross_entropy(logits_per_text, labels)
        ) / 2

        return {"contrastive_loss": total_loss} if output_dict else total_loss


# ---------------------------------------------------------------- src/open_clip/model.py


class CLIP(nn.Module):
    def __init__(self, embed_dim=8, width=8, context_length=6, vocab_size=10, output_dict=True):
        super().__init__()
        self.output_dict = output_dict
        self.visual = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                                    nn.Linear(8, embed_dim))
        self.transformer = nn.TransformerEncoderLayer(width, 2, dim_feedforward=16, dropout=0.0, batch_first=True,
                                                      norm_first=True)
        self.context_length = context_length
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(torch.empty(width, embed_dim))
        self.register_buffer('attn_mask', self.build_attention_mask(), persistent=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)
        nn.init.normal_(self.text_projection, std=width ** -0.5)

    def build_attention_mask(self):
        # lazily create causal attention mask, with full attention between the vision tokens
        # pytorch uses additive attention mask; fill with -inf
        mask = torch.empty(self.context_length, self.context_length)
        mask.fill_(float("-inf"))
        mask.triu_(1)  # zero out the lower diagonal
        return mask

    def encode_image(self, image, normalize: bool = False):
        features = self.visual(image)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, text, normalize: bool = False):
        x = self.token_embedding(text)  # [batch_size, n_ctx, d_model]
        x = x + self.positional_embedding
        x = self.transformer(x, src_mask=self.attn_mask)
        x = self.ln_final(x)  # [batch_size, n_ctx, transformer.width]
        # take features from the eot embedding (eot_token is the highest number in each sequence)
        x = x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, image=None, text=None):
        image_features = self.encode_image(image, normalize=True) if image is not None else None
        text_features = self.encode_text(text, normalize=True) if text is not None else None
        if self.output_dict:
            return {
                "image_features": image_features,
                "text_features": text_features,
                "logit_scale": self.logit_scale.exp()
            }
        return image_features, text_features, self.logit_scale.exp()


# ---------------------------------------------------------------- src/training/scheduler.py


def assign_learning_rate(optimizer, new_lr):
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lr


def _warmup_lr(base_lr, warmup_length, step):
    return base_lr * (step + 1) / warmup_length


def cosine_lr(optimizer, base_lr, warmup_length, steps):
    def _lr_adjuster(step):
        if step < warmup_length:
            lr = _warmup_lr(base_lr, warmup_length, step)
        else:
            e = step - warmup_length
            es = steps - warmup_length
            lr = 0.5 * (1 + np.cos(np.pi * e / es)) * base_lr
        assign_learning_rate(optimizer, lr)
        return lr
    return _lr_adjuster


# ---------------------------------------------------------------- src/training/train.py


def train_one_epoch(model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=None):
    model.train()

    dataloader = data['train']
    num_batches_per_epoch = len(dataloader) // args.accum_freq

    if args.accum_freq > 1:
        accum_images, accum_texts, accum_features = [], [], {}

    losses_m = {}
    for i, batch in enumerate(dataloader):
        i_accum = i // args.accum_freq
        step = num_batches_per_epoch * epoch + i_accum

        if not args.skip_scheduler:
            scheduler(step)

        images, texts = batch

        optimizer.zero_grad()

        if args.accum_freq == 1:
            model_out = model(images, texts)
            logit_scale = model_out["logit_scale"]
            losses = loss(**model_out, output_dict=True)

            total_loss = sum(losses.values())
            losses["loss"] = total_loss

            backward(total_loss, scaler)
        else:
            # First, cache the features without any gradient tracking.
            with torch.no_grad():
                model_out = model(images, texts)
                model_out.pop("logit_scale")
                for key, val in model_out.items():
                    if key in accum_features:
                        accum_features[key].append(val)
                    else:
                        accum_features[key] = [val]

                accum_images.append(images)
                accum_texts.append(texts)

            # If (i + 1) % accum_freq is not zero, move on to the next batch.
            if ((i + 1) % args.accum_freq) > 0:
                # FIXME this makes data time logging unreliable when accumulating
                continue

            # Now, ready to take gradients for the last accum_freq batches.
            # Re-do the forward pass for those batches, and use the cached features from the other batches as negatives.
            # Call backwards each time, but only step optimizer at the end.
            optimizer.zero_grad()
            for j in range(args.accum_freq):
                images = accum_images[j]
                texts = accum_texts[j]
                model_out = model(images, texts)
                logit_scale = model_out.pop("logit_scale")
                inputs = {}
                for key, val in accum_features.items():
                    accumulated = accum_features[key]
                    inputs[key] = torch.cat(accumulated[:j] + [model_out[key]] + accumulated[j + 1:])
                losses = loss(**inputs, logit_scale=logit_scale, output_dict=True)
                del inputs
                total_loss = sum(losses.values())
                losses["loss"] = total_loss
                backward(total_loss, scaler)

        if scaler is not None:
            if args.grad_clip_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip_norm, norm_type=2.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            if args.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip_norm, norm_type=2.0)
            optimizer.step()

        # reset gradient accum, if enabled
        if args.accum_freq > 1:
            accum_images, accum_texts, accum_features = [], [], {}

        # Note: we clamp to 4.6052 = ln(100), as in the original paper.
        with torch.no_grad():
            unwrap_model(model).logit_scale.clamp_(0, math.log(100))

        batch_count = i_accum + 1
        if i_accum % args.log_every_n_steps == 0 or batch_count == num_batches_per_epoch:
            batch_size = len(images)
            # NOTE loss is coarsely sampled, just master node and per log update
            for key, val in losses.items():
                if key not in losses_m:
                    losses_m[key] = AverageMeter()
                losses_m[key].update(val.item(), batch_size)

            logit_scale_scalar = logit_scale.item()
    # end for


def make_batch():
    images = torch.randn(3, 3, 8, 8)
    texts = torch.randint(0, 9, (3, 6))
    texts[:, -1] = 9  # the eot token, the highest number in each sequence
    return images, texts


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(accum_freq=2, skip_scheduler=False, grad_clip_norm=1.0, log_every_n_steps=1,
                              lr=1e-2, wd=0.2, beta1=0.9, beta2=0.98, eps=1e-6, warmup=1, epochs=4)
    model = CLIP()
    data = {'train': [make_batch() for _ in range(4)]}

    def exclude(n, p):
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or 'logit_scale' in n

    def include(n, p):
        return not exclude(n, p)

    named_parameters = list(model.named_parameters())
    gain_or_bias_params = [p for n, p in named_parameters if exclude(n, p) and p.requires_grad]
    rest_params = [p for n, p in named_parameters if include(n, p) and p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": gain_or_bias_params, "weight_decay": 0.},
            {"params": rest_params, "weight_decay": args.wd},
        ],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
    )
    scaler = None
    total_steps = (len(data['train']) // args.accum_freq) * args.epochs
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, total_steps)
    loss = ClipLoss(cache_labels=True)
    return {"model": model, "data": data, "loss": loss, "optimizer": optimizer, "scaler": scaler,
            "scheduler": scheduler, "args": args, "epoch": 0}


def epoch_body(state: dict, epoch: int) -> None:
    train_one_epoch(state["model"], state["data"], state["loss"], epoch, state["optimizer"], state["scaler"],
                    state["scheduler"], None, state["args"])


def iteration(state: dict) -> None:
    epoch_body(state, state["epoch"])
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        epoch_body(state, epoch)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
