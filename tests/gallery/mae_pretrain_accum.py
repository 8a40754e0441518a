"""MAE pre-training's train_one_epoch: random masking of patches, a loss on the masked patches only, accumulation
through the native loss scaler, `loss /= accum_iter` in place.

Source: facebookresearch/mae, engine_pretrain.py, train_one_epoch (commit be47fef7a727943547afb0c670cf1b26034c3c89),
as published: `optimizer.zero_grad()` once, then per batch `lr_sched.adjust_learning_rate(optimizer, data_iter_step
/ len(data_loader) + epoch, args)` every `accum_iter` steps, `loss, _, _ = model(samples,
mask_ratio=args.mask_ratio)`, `loss_value = loss.item()` and its `math.isfinite` check, `loss /= accum_iter`,
`loss_scaler(loss, optimizer, parameters=model.parameters(), update_grad=(data_iter_step + 1) % accum_iter == 0)`,
`optimizer.zero_grad()` after each update, the meters fed `loss_value` and the lr; util/misc.py (same commit):
NativeScalerWithGradNormCount (`self._scaler.scale(loss).backward(create_graph=create_graph)`, then on
`update_grad` `unscale_`, `get_grad_norm_(parameters)` with clip_grad None, `step`, `update`) and get_grad_norm_;
util/lr_sched.py's adjust_learning_rate (half-cycle cosine after warmup, `lr_scale` groups); models_mae.py (commit
6a2ba402291005b003a70e99f7c87d1a2c376b0d): MaskedAutoencoderViT's patchify, random_masking (`noise =
torch.rand(N, L)`, two argsorts, `torch.gather` of the kept patches, the binary `mask` unshuffled by
`ids_restore`), forward_encoder (pos_embed added, masking, the cls token prepended), forward_decoder (`mask_token`
repeated, the unshuffle `torch.gather`, the cls token put back, `x = x[:, 1:, :]`), forward_loss with
`norm_pix_loss` (`(loss * mask).sum() / mask.sum()`), the fixed (requires_grad=False) positional embeddings.
main_pretrain.py's set-up: AdamW with betas (0.9, 0.95) on timm's param groups (no weight decay for biases and 1-d
parameters), `NativeScaler()`. Retyped at CPU size: images 3x8x8 with patch size 2 (16 patches; published 224 and
16), embed_dim 8, depth 1, 2 heads, decoder_embed_dim 8, decoder_depth 1; timm's Block becomes a pre-norm
`nn.TransformerEncoderLayer` (no dropout), PatchEmbed a strided Conv2d, the sin-cos positional tables small random
fixed tensors; `torch.cuda.amp.autocast()` left out (fp32 on CPU) and the scaler's GradScaler is
`torch.amp.GradScaler("cpu")` (published: CUDA's); accum_iter 2 over 4 made-up batches of 2 images per epoch;
blr 1.5e-4 * 2 / 256 becomes lr 1e-2, warmup_epochs 0, epochs 4; `torch.cuda.synchronize()`, all_reduce_mean and
the log writer left out. One epoch per iteration.
"""

import argparse
import math
import sys
from collections.abc import Callable

import torch
import torch.nn as nn

ITERATIONS = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- models_mae.py


class PatchEmbed(nn.Module):
    def __init__(self, img_size=8, patch_size=2, in_chans=3, embed_dim=8):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def Block(dim, num_heads, mlp_ratio):
    return nn.TransformerEncoderLayer(dim, num_heads, dim_feedforward=int(dim * mlp_ratio), dropout=0.0,
                                      activation="gelu", batch_first=True, norm_first=True)


class MaskedAutoencoderViT(nn.Module):
    """ Masked Autoencoder with VisionTransformer backbone
    """
    def __init__(self, img_size=8, patch_size=2, in_chans=3,
                 embed_dim=8, depth=1, num_heads=2,
                 decoder_embed_dim=8, decoder_depth=1, decoder_num_heads=2,
                 mlp_ratio=2., norm_layer=nn.LayerNorm, norm_pix_loss=False):
        super().__init__()

        # --------------------------------------------------------------------------
        # MAE encoder specifics
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        num_patches = self.patch_embed.num_patches

        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim), requires_grad=False)  # fixed

        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, mlp_ratio)
            for i in range(depth)])
        self.norm = norm_layer(embed_dim)
        # --------------------------------------------------------------------------

        # --------------------------------------------------------------------------
        # MAE decoder specifics
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim, bias=True)

        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))

        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, decoder_embed_dim),
                                              requires_grad=False)  # fixed sin-cos embedding

        self.decoder_blocks = nn.ModuleList([
            Block(decoder_embed_dim, decoder_num_heads, mlp_ratio)
            for i in range(decoder_depth)])

        self.decoder_norm = norm_layer(decoder_embed_dim)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size**2 * in_chans, bias=True)  # decoder to patch
        # --------------------------------------------------------------------------

        self.norm_pix_loss = norm_pix_loss

        self.initialize_weights()

    def initialize_weights(self):
        # the fixed positional tables (published: 2D sin-cos), small and fixed here
        self.pos_embed.data.copy_(0.1 * torch.randn_like(self.pos_embed))
        self.decoder_pos_embed.data.copy_(0.1 * torch.randn_like(self.decoder_pos_embed))
        torch.nn.init.normal_(self.cls_token, std=.02)
        torch.nn.init.normal_(self.mask_token, std=.02)

    def patchify(self, imgs):
        """
        imgs: (N, 3, H, W)
        x: (N, L, patch_size**2 *3)
        """
        p = self.patch_embed.patch_size[0]
        assert imgs.shape[2] == imgs.shape[3] and imgs.shape[2] % p == 0

        h = w = imgs.shape[2] // p
        x = imgs.reshape(shape=(imgs.shape[0], 3, h, p, w, p))
        x = torch.einsum('nchpwq->nhwpqc', x)
        x = x.reshape(shape=(imgs.shape[0], h * w, p**2 * 3))
        return x

    def random_masking(self, x, mask_ratio):
        """
        Perform per-sample random masking by per-sample shuffling.
        Per-sample shuffling is done by argsort random noise.
        x: [N, L, D], sequence
        """
        N, L, D = x.shape  # batch, length, dim
        len_keep = int(L * (1 - mask_ratio))

        noise = torch.rand(N, L, device=x.device)  # noise in [0, 1]

        # sort noise for each sample
        ids_shuffle = torch.argsort(noise, dim=1)  # ascend: small is keep, large is remove
        ids_restore = torch.argsort(ids_shuffle, dim=1)

        # keep the first subset
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))

        # generate the binary mask: 0 is keep, 1 is remove
        mask = torch.ones([N, L], device=x.device)
        mask[:, :len_keep] = 0
        # unshuffle to get the binary mask
        mask = torch.gather(mask, dim=1, index=ids_restore)

        return x_masked, mask, ids_restore

    def forward_encoder(self, x, mask_ratio):
        # embed patches
        x = self.patch_embed(x)

        # add pos embed w/o cls token
        x = x + self.pos_embed[:, 1:, :]

        # masking: length -> length * mask_ratio
        x, mask, ids_restore = self.random_masking(x, mask_ratio)

        # append cls token
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        cls_tokens = cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)

        # apply Transformer blocks
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)

        return x, mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        # embed tokens
        x = self.decoder_embed(x)

        # append mask tokens to sequence
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)  # no cls token
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))  # unshuffle
        x = torch.cat([x[:, :1, :], x_], dim=1)  # append cls token

        # add pos embed
        x = x + self.decoder_pos_embed

        # apply Transformer blocks
        for blk in self.decoder_blocks:
            x = blk(x)
        x = self.decoder_norm(x)

        # predictor projection
        x = self.decoder_pred(x)

        # remove cls token
        x = x[:, 1:, :]

        return x

    def forward_loss(self, imgs, pred, mask):
        """
        imgs: [N, 3, H, W]
        pred: [N, L, p*p*3]
        mask: [N, L], 0 is keep, 1 is remove,
        """
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.e-6)**.5

        loss = (pred - target) ** 2
        loss = loss.mean(dim=-1)  # [N, L], mean loss per patch

        loss = (loss * mask).sum() / mask.sum()  # mean loss on removed patches
        return loss

    def forward(self, imgs, mask_ratio=0.75):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio)
        pred = self.forward_decoder(latent, ids_restore)  # [N, L, p*p*3]
        loss = self.forward_loss(imgs, pred, mask)
        return loss, pred, mask


# ---------------------------------------------------------------- util/misc.py, util/lr_sched.py


class SmoothedValue(object):
    def __init__(self):
        self.total = 0.0
        self.count = 0

    def update(self, value, n=1):
        self.count += n
        self.total += value * n


class MetricLogger(object):
    def __init__(self, delimiter="\t"):
        self.meters = {}
        self.delimiter = delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if v is None:
                continue
            if isinstance(v, torch.Tensor):
                v = v.item()
            assert isinstance(v, (float, int))
            self.meters.setdefault(k, SmoothedValue()).update(v)


def get_grad_norm_(parameters, norm_type: float = 2.0) -> torch.Tensor:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if len(parameters) == 0:
        return torch.tensor(0.)
    device = parameters[0].grad.device
    if norm_type == math.inf:
        total_norm = max(p.grad.detach().abs().max().to(device) for p in parameters)
    else:
        total_norm = torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type).to(device) for p in parameters]),
                                norm_type)
    return total_norm


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)  # @backward
        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm


def adjust_learning_rate(optimizer, epoch, args):
    """Decay the learning rate with half-cycle cosine after warmup"""
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * \
            (1. + math.cos(math.pi * (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)))
    for param_group in optimizer.param_groups:
        if "lr_scale" in param_group:
            param_group["lr"] = lr * param_group["lr_scale"]
        else:
            param_group["lr"] = lr
    return lr


# ---------------------------------------------------------------- engine_pretrain.py


def train_one_epoch(model: torch.nn.Module,
                    data_loader, optimizer: torch.optim.Optimizer,
                    device: torch.device, epoch: int, loss_scaler,
                    log_writer=None,
                    args=None):
    model.train(True)
    metric_logger = MetricLogger(delimiter="  ")

    accum_iter = args.accum_iter

    optimizer.zero_grad()

    for data_iter_step, (samples, _) in enumerate(data_loader):

        # we use a per iteration (instead of per epoch) lr scheduler
        if data_iter_step % accum_iter == 0:
            adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)

        samples = samples.to(device, non_blocking=True)

        loss, _, _ = model(samples, mask_ratio=args.mask_ratio)

        loss_value = loss.item()

        if not math.isfinite(loss_value):
            print("Loss is {}, stopping training".format(loss_value))
            sys.exit(1)

        loss /= accum_iter
        loss_scaler(loss, optimizer, parameters=model.parameters(),
                    update_grad=(data_iter_step + 1) % accum_iter == 0)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()

        metric_logger.update(loss=loss_value)

        lr = optimizer.param_groups[0]["lr"]
        metric_logger.update(lr=lr)

    return {k: meter.total / meter.count for k, meter in metric_logger.meters.items()}


def param_groups_weight_decay(model, weight_decay=1e-5, no_weight_decay_list=()):
    """timm.optim.optim_factory.param_groups_weight_decay (add_weight_decay in the timm MAE pins)."""
    decay = []
    no_decay = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {'params': no_decay, 'weight_decay': 0.},
        {'params': decay, 'weight_decay': weight_decay}]


def build() -> dict:
    torch.manual_seed(0)
    args = argparse.Namespace(accum_iter=2, mask_ratio=0.75, norm_pix_loss=True, weight_decay=0.05, lr=1e-2,
                              min_lr=0., warmup_epochs=0, epochs=4)
    model = MaskedAutoencoderViT(norm_pix_loss=args.norm_pix_loss)
    data_loader = [(torch.randn(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)) for _ in range(4)]
    # following timm: set wd as 0 for bias and norm layers
    param_groups = param_groups_weight_decay(model, args.weight_decay)
    optimizer = torch.optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = NativeScalerWithGradNormCount()
    return {"model": model, "data_loader": data_loader, "optimizer": optimizer, "loss_scaler": loss_scaler,
            "args": args, "epoch": 0}


def epoch_body(state: dict, epoch: int) -> None:
    train_one_epoch(state["model"], state["data_loader"], state["optimizer"], torch.device("cpu"), epoch,
                    state["loss_scaler"], log_writer=None, args=state["args"])


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
