"""Deep Image Prior denoising: a net fitted to one noisy image from a noise input perturbed in place at every step.

Source: DmitryUlyanov/deep-image-prior, denoising.py (commit 32be6e00dcda4a507726551161c6b8bcec5af7a7) with
utils/common_utils.py (commit 661c4f45f2416604b3afb43afc5003213e9865e7: get_noise, get_params, optimize): INPUT
'noise', OPT_OVER 'net,input' (so `net_input_saved = net_input`, and get_params sets `net_input.requires_grad =
True` and optimizes it), reg_noise_std 1/30, LR 0.01, OPTIMIZER 'adam', exp_weight 0.99, `noise =
net_input.detach().clone()`; closure() as published for INPUT 'noise' (`global i, out_avg, psrn_noisy_last,
last_net, net_input, psnr_gt_list`, `net_input = net_input_saved + (noise.normal_() * reg_noise_std)`, the
exponential average `out_avg`, `total_loss = mse(out, img_noisy_torch)`, `total_loss.backward()`, the PSNRs, the
backtracking to `last_net` when the noisy PSNR drops by 5, `i += 1`); optimize()'s 'adam' branch: `optimizer =
torch.optim.Adam(parameters, lr=LR)` then `for j in range(num_iter)`: zero_grad(), closure(), step(). Retyped at
CPU size: the F16 image becomes a made-up 3x16x16 image with its noisy copy from get_noisy_image's recipe (clip of
img + sigma_ * normal), input_depth 4 (published 32), get_net's 'skip' network becomes two reflection-padded 3x3
convolutions with BatchNorm and LeakyReLU and a Sigmoid; dtype torch.FloatTensor (published
torch.cuda.FloatTensor) and `.cuda()` dropped; skimage's peak_signal_noise_ratio written in numpy (data range 1);
wandb, printing and plotting left out; num_iter is the probes' iteration count, one pass of optimize()'s loop an
iteration (the optimizer is made in build(), where optimize() would make it).
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [{"variable": "net_input", "line": "@net_input"}],
    "modifies_in_place": ["net_input_saved"],
}

dtype = torch.FloatTensor
imsize = -1
PLOT = True
sigma = 25
sigma_ = sigma / 255.
INPUT = 'noise'
pad = 'reflection'
OPT_OVER = 'net,input'  # 'net'
train_input = True if ',' in OPT_OVER else False
reg_noise_std = 1. / 30.  # set to 1./20. for sigma=50
LR = 0.01
OPTIMIZER = 'adam'  # 'LBFGS'
show_every = 100
exp_weight = 0.99
input_depth = 4

# set by build(), read by closure() as the published script's globals
net = net_input = net_input_saved = noise = mse = img_noisy_torch = img_np = img_noisy_np = None
out_avg = None
last_net = None
psrn_noisy_last = 0
psnr_gt_list = []
i = 0


def compare_psnr(image_true, image_test):
    """skimage.metrics.peak_signal_noise_ratio for images in [0, 1]."""
    err = np.mean((image_true.astype(np.float64) - image_test.astype(np.float64)) ** 2)
    return 10 * np.log10(1.0 / err)


def get_noisy_image(img_np, sigma):
    img_noisy_np = np.clip(img_np + np.random.normal(scale=sigma, size=img_np.shape), 0, 1).astype(np.float32)
    return None, img_noisy_np


def np_to_torch(img_np):
    return torch.from_numpy(img_np)[None, :]


def fill_noise(x, noise_type):
    """Fills tensor `x` with noise of type `noise_type`."""
    if noise_type == 'u':
        x.uniform_()
    elif noise_type == 'n':
        x.normal_()
    else:
        assert False  # noqa: B011


def get_noise(input_depth, method, spatial_size, noise_type='u', var=1. / 10):
    if isinstance(spatial_size, int):
        spatial_size = (spatial_size, spatial_size)
    if method == 'noise':
        shape = [1, input_depth, spatial_size[0], spatial_size[1]]
        net_input = torch.zeros(shape)

        fill_noise(net_input, noise_type)
        net_input *= var
    else:
        assert False  # noqa: B011

    return net_input


def get_params(opt_over, net, net_input, downsampler=None):
    opt_over_list = opt_over.split(',')
    params = []

    for opt in opt_over_list:

        if opt == 'net':
            params += [x for x in net.parameters()]
        elif opt == 'down':
            assert downsampler is not None
            params = [x for x in downsampler.parameters()]
        elif opt == 'input':
            net_input.requires_grad = True
            params += [net_input]
        else:
            assert False, 'what is it?'  # noqa: B011

    return params


def get_net(input_depth, pad, n_channels=3):
    """A CPU-size stand-in for the 'skip' network: conv, BN, LeakyReLU, conv, Sigmoid, reflection padding."""
    return nn.Sequential(
        nn.ReflectionPad2d(1), nn.Conv2d(input_depth, 8, 3), nn.BatchNorm2d(8), nn.LeakyReLU(0.2, inplace=True),
        nn.ReflectionPad2d(1), nn.Conv2d(8, n_channels, 3), nn.Sigmoid(),
    )


def closure():
    global i, out_avg, psrn_noisy_last, last_net, net_input, psnr_gt_list

    if INPUT == 'noise':
        if reg_noise_std > 0:
            net_input = net_input_saved + (noise.normal_() * reg_noise_std)  # @net_input
        else:
            net_input = net_input_saved
    else:
        net_input = net_input_saved

    out = net(net_input)

    # Smoothing
    if out_avg is None:
        out_avg = out.detach()
    else:
        out_avg = out_avg * exp_weight + out.detach() * (1 - exp_weight)

    total_loss = mse(out, img_noisy_torch)
    total_loss.backward()  # @backward

    psrn_noisy = compare_psnr(img_noisy_np, out.detach().cpu().numpy()[0])
    psrn_gt = compare_psnr(img_np, out.detach().cpu().numpy()[0])
    psrn_gt_sm = compare_psnr(img_np, out_avg.detach().cpu().numpy()[0])

    if PLOT and i % show_every == 0:
        psnr_gt_list.append(psrn_gt)

    # Backtracking
    if i % show_every:
        if psrn_noisy - psrn_noisy_last < -5:
            print('Falling back to previous checkpoint.')

            for new_param, net_param in zip(last_net, net.parameters()):
                net_param.data.copy_(new_param)

            return total_loss * 0
        else:
            last_net = [x.detach().cpu() for x in net.parameters()]
            psrn_noisy_last = psrn_noisy

    i += 1

    return total_loss


def build() -> dict:
    global net, net_input, net_input_saved, noise, mse, img_noisy_torch, img_np, img_noisy_np
    global out_avg, last_net, psrn_noisy_last, psnr_gt_list, i
    # Fix seeds
    seed = 0
    np.random.seed(seed)
    torch.random.manual_seed(seed)

    img_np = np.random.rand(3, 16, 16).astype(np.float32)  # stands in for the cropped F16 image
    img_noisy_pil, img_noisy_np = get_noisy_image(img_np, sigma_)

    net = get_net(input_depth, pad).type(dtype)
    net_input = get_noise(input_depth, INPUT, (16, 16)).type(dtype)

    # Loss
    mse = torch.nn.MSELoss().type(dtype)

    img_noisy_torch = np_to_torch(img_noisy_np).type(dtype)
    if train_input:
        net_input_saved = net_input
    else:
        net_input_saved = net_input.detach().clone()

    noise = net_input.detach().clone()
    out_avg = None
    last_net = None
    psrn_noisy_last = 0
    psnr_gt_list = []
    i = 0

    p = get_params(OPT_OVER, net, net_input)
    # optimize(OPTIMIZER, p, closure, LR, num_iter), 'adam' branch: its optimizer
    optimizer = torch.optim.Adam(p, lr=LR)
    return {"net": net, "optimizer": optimizer, "net_input_saved": net_input_saved, "noise": noise}


def iteration(state: dict) -> None:
    optimizer = state["optimizer"]
    optimizer.zero_grad()
    closure()
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    # optimize()'s 'adam' loop
    optimizer = state["optimizer"]
    for j in range(iterations):
        optimizer.zero_grad()
        closure()
        optimizer.step()


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
