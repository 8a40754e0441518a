"""Fast neural style: a TransformerNet trained through a frozen VGG, against Gram matrices computed before the loop.

Source: pytorch/examples, fast_neural_style/neural_style/neural_style.py (commit
bec1ed03b2abc9d8144b2b76a5b773c51313edb5) train(), with transformer_net.py (commit
502e45deeaa93edcc3ebfca0fba5567ec88c0ec3), vgg.py (commit dc10cd8b13e6594ebf5a7a7f99016ee252d04e2e) and utils.py
(commit 8cb3ba10e8c4a3bfdd7cc2a383fb73d18a66f6b6): TransformerNet (ConvLayer with reflection padding, InstanceNorm2d,
ResidualBlock, UpsampleConvLayer), Vgg16(requires_grad=False) cut into four slices returning a VggOutputs
namedtuple, gram_matrix, normalize_batch (which divides its batch by 255 in place), Adam on the transformer, MSELoss,
`features_style = vgg(utils.normalize_batch(style))` and `gram_style = [...]` before the loop, and per batch:
zero_grad, `y = transformer(x)`, both batches normalized, `features_y = vgg(y)`, `features_x = vgg(x)`, the content
loss on relu2_2, `style_loss = 0.` grown with `+=` over the four Gram matrices and scaled with `*=`, `total_loss =
content_loss + style_loss`, backward, step, the `.item()` aggregates. Retyped at CPU size: 16x16 images in batches
of 2 (published 256x256, batch 4), made up (uniform in [0, 255], a fresh batch per iteration, as the DataLoader
gives) in place of ImageFolder and the style image; channels 32/64/128 of TransformerNet are 4/8/8 and its five
residual blocks two; VGG16's features (same layers and in-place ReLUs, slices at 4, 9, 16, 23) with channels 64/128/
256/512 cut to 4/8/8/8, randomly initialized (torchvision's pretrained weights are not downloaded); logging and
checkpoints left out. One iteration is one batch.
"""

from collections import namedtuple
from collections.abc import Callable

import torch
from torch.optim import Adam

ITERATIONS = 3
SIZE = 16
BATCH = 2

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


# ---------------------------------------------------------------- transformer_net.py

class TransformerNet(torch.nn.Module):
    def __init__(self):
        super(TransformerNet, self).__init__()
        # Initial convolution layers
        self.conv1 = ConvLayer(3, 4, kernel_size=9, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(4, affine=True)
        self.conv2 = ConvLayer(4, 8, kernel_size=3, stride=2)
        self.in2 = torch.nn.InstanceNorm2d(8, affine=True)
        self.conv3 = ConvLayer(8, 8, kernel_size=3, stride=2)
        self.in3 = torch.nn.InstanceNorm2d(8, affine=True)
        # Residual layers
        self.res1 = ResidualBlock(8)
        self.res2 = ResidualBlock(8)
        # Upsampling Layers
        self.deconv1 = UpsampleConvLayer(8, 8, kernel_size=3, stride=1, upsample=2)
        self.in4 = torch.nn.InstanceNorm2d(8, affine=True)
        self.deconv2 = UpsampleConvLayer(8, 4, kernel_size=3, stride=1, upsample=2)
        self.in5 = torch.nn.InstanceNorm2d(4, affine=True)
        self.deconv3 = ConvLayer(4, 3, kernel_size=9, stride=1)
        # Non-linearities
        self.relu = torch.nn.ReLU()

    def forward(self, X):
        y = self.relu(self.in1(self.conv1(X)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.relu(self.in3(self.conv3(y)))
        y = self.res1(y)
        y = self.res2(y)
        y = self.relu(self.in4(self.deconv1(y)))
        y = self.relu(self.in5(self.deconv2(y)))
        y = self.deconv3(y)
        return y


class ConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super(ConvLayer, self).__init__()
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        out = self.reflection_pad(x)
        out = self.conv2d(out)
        return out


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels):
        super(ResidualBlock, self).__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        out = out + residual
        return out


class UpsampleConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, upsample=None):
        super(UpsampleConvLayer, self).__init__()
        self.upsample = upsample
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        x_in = x
        if self.upsample:
            x_in = torch.nn.functional.interpolate(x_in, mode='nearest', scale_factor=self.upsample)
        out = self.reflection_pad(x_in)
        out = self.conv2d(out)
        return out


# ---------------------------------------------------------------- vgg.py (torchvision's vgg16().features, retyped)

def vgg16_features():
    def conv(i, o):
        return [torch.nn.Conv2d(i, o, kernel_size=3, padding=1), torch.nn.ReLU(inplace=True)]
    pool = [torch.nn.MaxPool2d(kernel_size=2, stride=2)]
    return torch.nn.Sequential(*(conv(3, 4) + conv(4, 4) + pool + conv(4, 8) + conv(8, 8) + pool
                                 + conv(8, 8) + conv(8, 8) + conv(8, 8) + pool + conv(8, 8) + conv(8, 8) + conv(8, 8)))


class Vgg16(torch.nn.Module):
    def __init__(self, requires_grad=False):
        super(Vgg16, self).__init__()
        vgg_pretrained_features = vgg16_features()
        self.slice1 = torch.nn.Sequential()
        self.slice2 = torch.nn.Sequential()
        self.slice3 = torch.nn.Sequential()
        self.slice4 = torch.nn.Sequential()
        for x in range(4):
            self.slice1.add_module(str(x), vgg_pretrained_features[x])
        for x in range(4, 9):
            self.slice2.add_module(str(x), vgg_pretrained_features[x])
        for x in range(9, 16):
            self.slice3.add_module(str(x), vgg_pretrained_features[x])
        for x in range(16, 23):
            self.slice4.add_module(str(x), vgg_pretrained_features[x])
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, X):
        h = self.slice1(X)
        h_relu1_2 = h
        h = self.slice2(h)
        h_relu2_2 = h
        h = self.slice3(h)
        h_relu3_3 = h
        h = self.slice4(h)
        h_relu4_3 = h
        vgg_outputs = namedtuple("VggOutputs", ['relu1_2', 'relu2_2', 'relu3_3', 'relu4_3'])
        out = vgg_outputs(h_relu1_2, h_relu2_2, h_relu3_3, h_relu4_3)
        return out


# ---------------------------------------------------------------- utils.py

def gram_matrix(y):
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram


def normalize_batch(batch):
    # normalize using imagenet mean and std
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    batch = batch.div_(255.0)
    return (batch - mean) / std


# ---------------------------------------------------------------- neural_style.py train()

content_weight = 1e5
style_weight = 1e10


def build() -> dict:
    torch.manual_seed(42)
    images = torch.Generator().manual_seed(0)
    transformer = TransformerNet()
    optimizer = Adam(transformer.parameters(), 1e-3)
    mse_loss = torch.nn.MSELoss()

    vgg = Vgg16(requires_grad=False)
    style = torch.rand(3, SIZE, SIZE, generator=images).mul(255)
    style = style.repeat(BATCH, 1, 1, 1)

    features_style = vgg(normalize_batch(style))
    gram_style = [gram_matrix(y) for y in features_style]
    return {"transformer": transformer, "optimizer": optimizer, "mse_loss": mse_loss, "vgg": vgg,
            "gram_style": gram_style, "images": images, "agg_content_loss": 0., "agg_style_loss": 0., "count": 0}


def iteration(state: dict) -> None:
    transformer, optimizer, mse_loss, vgg, gram_style = (
        state["transformer"], state["optimizer"], state["mse_loss"], state["vgg"], state["gram_style"])
    x = torch.rand(BATCH, 3, SIZE, SIZE, generator=state["images"]).mul(255)
    n_batch = len(x)
    state["count"] += n_batch
    optimizer.zero_grad()

    y = transformer(x)

    y = normalize_batch(y)
    x = normalize_batch(x)

    features_y = vgg(y)
    features_x = vgg(x)

    content_loss = content_weight * mse_loss(features_y.relu2_2, features_x.relu2_2)

    style_loss = 0.
    for ft_y, gm_s in zip(features_y, gram_style):
        gm_y = gram_matrix(ft_y)
        style_loss += mse_loss(gm_y, gm_s[:n_batch, :, :])
    style_loss *= style_weight

    total_loss = content_loss + style_loss
    total_loss.backward()  # @backward
    optimizer.step()

    state["agg_content_loss"] += content_loss.item()
    state["agg_style_loss"] += style_loss.item()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    transformer = state["transformer"]
    transformer.train()
    for batch_id in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
