"""VQ-VAE-2 with EMA codebooks: Quantize updates its buffers through `.data` in training mode, a straight-through output.

Source: rosinality/vq-vae-2-pytorch, vqvae.py (commit 29e36e7a4b3cf477135578149813ee911ebf7c57): Quantize (the
`embed`, `cluster_size` and `embed_avg` buffers; `dist`, `embed_ind` from `(-dist).max(1)`, `embed_code`; in
training `self.cluster_size.data.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)`, the same for
embed_avg, `self.embed.data.copy_(embed_normalized)`; `diff = (quantize.detach() - input).pow(2).mean()`, `quantize =
input + (quantize - input).detach()`), ResBlock (`out += input`), Encoder, Decoder and VQVAE (encode, decode) as
published; train_vqvae.py (commit 3c61d64ca8596b058b545737442285c00a38bba0) train(): model.zero_grad(), `out,
latent_loss = model(img)`, MSELoss, `loss = recon_loss + latent_loss_weight * latent_loss`, loss.backward(),
optimizer.step() (scheduler None, as without --sched), the running mse as floats, and at `i % 100 == 0` the
model.eval() / torch.no_grad() sample forward / model.train(). Retyped at CPU size: channel 8 (published 128),
n_res_block 1 (2), n_res_channel 4 (32), embed_dim 4 (64), n_embed 8 (512), images 3x16x16 (published 256x256), a
loader of 2 made-up batches of 2 images with labels in place of ImageFolder; `distributed.all_reduce` is its
one-process branch (returns the tensor); `.to(device)`, tqdm's description and torchvision's save_image (and the
checkpoint save) are left out; one epoch is an iteration.
"""

from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import nn, optim
from torch.nn import functional as F

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def all_reduce(tensor, op=None):
    """distributed.py's all_reduce with a world size of 1."""
    return tensor


dist_fn = SimpleNamespace(all_reduce=all_reduce)


class Quantize(nn.Module):
    def __init__(self, dim, n_embed, decay=0.99, eps=1e-5):
        super().__init__()

        self.dim = dim
        self.n_embed = n_embed
        self.decay = decay
        self.eps = eps

        embed = torch.randn(dim, n_embed)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.ones(n_embed))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, input):
        flatten = input.reshape(-1, self.dim)
        dist = flatten.pow(2).sum(1, keepdim=True) - 2 * flatten @ self.embed + self.embed.pow(2).sum(0, keepdim=True)
        _, embed_ind = (-dist).max(1)
        embed_onehot = F.one_hot(embed_ind, self.n_embed).type(flatten.dtype)
        embed_ind = embed_ind.view(*input.shape[:-1])
        quantize = self.embed_code(embed_ind)

        if self.training:
            embed_onehot_sum = embed_onehot.sum(0)
            embed_sum = flatten.transpose(0, 1) @ embed_onehot

            dist_fn.all_reduce(embed_onehot_sum)
            dist_fn.all_reduce(embed_sum)

            self.cluster_size.data.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)
            self.embed_avg.data.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
            n = self.cluster_size.sum()
            cluster_size = (self.cluster_size + self.eps) / (n + self.n_embed * self.eps) * n
            embed_normalized = self.embed_avg / cluster_size.unsqueeze(0)
            self.embed.data.copy_(embed_normalized)

        diff = (quantize.detach() - input).pow(2).mean()
        quantize = input + (quantize - input).detach()

        return quantize, diff, embed_ind

    def embed_code(self, embed_id):
        return F.embedding(embed_id, self.embed.transpose(0, 1))


class ResBlock(nn.Module):
    def __init__(self, in_channel, channel):
        super().__init__()

        self.conv = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(in_channel, channel, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, in_channel, 1),
        )

    def forward(self, input):
        out = self.conv(input)
        out += input

        return out


class Encoder(nn.Module):
    def __init__(self, in_channel, channel, n_res_block, n_res_channel, stride):
        super().__init__()

        if stride == 4:
            blocks = [
                nn.Conv2d(in_channel, channel // 2, 4, stride=2, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(channel // 2, channel, 4, stride=2, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(channel, channel, 3, padding=1),
            ]

        elif stride == 2:
            blocks = [
                nn.Conv2d(in_channel, channel // 2, 4, stride=2, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(channel // 2, channel, 3, padding=1),
            ]

        for i in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))

        blocks.append(nn.ReLU(inplace=True))

        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


class Decoder(nn.Module):
    def __init__(self, in_channel, out_channel, channel, n_res_block, n_res_channel, stride):
        super().__init__()

        blocks = [nn.Conv2d(in_channel, channel, 3, padding=1)]

        for i in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))

        blocks.append(nn.ReLU(inplace=True))

        if stride == 4:
            blocks.extend(
                [
                    nn.ConvTranspose2d(channel, channel // 2, 4, stride=2, padding=1),
                    nn.ReLU(inplace=True),
                    nn.ConvTranspose2d(channel // 2, out_channel, 4, stride=2, padding=1),
                ]
            )

        elif stride == 2:
            blocks.append(nn.ConvTranspose2d(channel, out_channel, 4, stride=2, padding=1))

        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


class VQVAE(nn.Module):
    def __init__(
        self,
        in_channel=3,
        channel=8,
        n_res_block=1,
        n_res_channel=4,
        embed_dim=4,
        n_embed=8,
        decay=0.99,
    ):
        super().__init__()

        self.enc_b = Encoder(in_channel, channel, n_res_block, n_res_channel, stride=4)
        self.enc_t = Encoder(channel, channel, n_res_block, n_res_channel, stride=2)
        self.quantize_conv_t = nn.Conv2d(channel, embed_dim, 1)
        self.quantize_t = Quantize(embed_dim, n_embed)
        self.dec_t = Decoder(embed_dim, embed_dim, channel, n_res_block, n_res_channel, stride=2)
        self.quantize_conv_b = nn.Conv2d(embed_dim + channel, embed_dim, 1)
        self.quantize_b = Quantize(embed_dim, n_embed)
        self.upsample_t = nn.ConvTranspose2d(embed_dim, embed_dim, 4, stride=2, padding=1)
        self.dec = Decoder(
            embed_dim + embed_dim,
            in_channel,
            channel,
            n_res_block,
            n_res_channel,
            stride=4,
        )

    def forward(self, input):
        quant_t, quant_b, diff, _, _ = self.encode(input)
        dec = self.decode(quant_t, quant_b)

        return dec, diff

    def encode(self, input):
        enc_b = self.enc_b(input)
        enc_t = self.enc_t(enc_b)

        quant_t = self.quantize_conv_t(enc_t).permute(0, 2, 3, 1)
        quant_t, diff_t, id_t = self.quantize_t(quant_t)
        quant_t = quant_t.permute(0, 3, 1, 2)
        diff_t = diff_t.unsqueeze(0)

        dec_t = self.dec_t(quant_t)
        enc_b = torch.cat([dec_t, enc_b], 1)

        quant_b = self.quantize_conv_b(enc_b).permute(0, 2, 3, 1)
        quant_b, diff_b, id_b = self.quantize_b(quant_b)
        quant_b = quant_b.permute(0, 3, 1, 2)
        diff_b = diff_b.unsqueeze(0)

        return quant_t, quant_b, diff_t + diff_b, id_t, id_b

    def decode(self, quant_t, quant_b):
        upsample_t = self.upsample_t(quant_t)
        quant = torch.cat([upsample_t, quant_b], 1)
        dec = self.dec(quant)

        return dec


def train(epoch, loader, model, optimizer, scheduler, device):
    criterion = nn.MSELoss()

    latent_loss_weight = 0.25
    sample_size = 25

    mse_sum = 0
    mse_n = 0

    for i, (img, label) in enumerate(loader):
        model.zero_grad()

        out, latent_loss = model(img)
        recon_loss = criterion(out, img)
        latent_loss = latent_loss.mean()
        loss = recon_loss + latent_loss_weight * latent_loss
        loss.backward()  # @backward

        if scheduler is not None:
            scheduler.step()
        optimizer.step()

        mse_sum += recon_loss.item() * img.shape[0]
        mse_n += img.shape[0]

        lr = optimizer.param_groups[0]["lr"]

        if i % 100 == 0:
            model.eval()

            sample = img[:sample_size]

            with torch.no_grad():
                out, _ = model(sample)

            model.train()


def build() -> dict:
    torch.manual_seed(0)
    args = SimpleNamespace(size=16, epoch=560, lr=3e-4, sched=None)
    loader = [(torch.rand(2, 3, args.size, args.size) * 2 - 1, torch.zeros(2, dtype=torch.long)) for _ in range(2)]
    model = VQVAE()
    optimizer = optim.Adam(model.parameters(), lr=args.lr)
    scheduler = None
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader, "epoch": 0}


def iteration(state: dict) -> None:
    train(state["epoch"], state["loader"], state["model"], state["optimizer"], state["scheduler"], "cpu")
    state["epoch"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for i in range(iterations):
        train(i, state["loader"], state["model"], state["optimizer"], state["scheduler"], "cpu")


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
