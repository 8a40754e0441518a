"""NeRF (yenchenlin/nerf-pytorch): random ray batches, coarse and fine networks, their two MSE losses summed.

Source: yenchenlin/nerf-pytorch, run_nerf.py (commit 223fe62d87d641e2bb0fb5bdbbcb6dad5efb2af3), train(): with
no_batching off, `rays_rgb` (all rays of all training images with their colours) shuffled once before the loop,
then per step `batch = rays_rgb[i_batch:i_batch+N_rand]`, `batch = torch.transpose(batch, 0, 1)`, `batch_rays,
target_s = batch[:2], batch[2]`, `i_batch += N_rand` (a reshuffle with `torch.randperm` once spent), `rgb, disp,
acc, extras = render(H, W, K, chunk=args.chunk, rays=batch_rays, retraw=True, **render_kwargs_train)`,
`optimizer.zero_grad()`, `img_loss = img2mse(rgb, target_s)`, `trans = extras['raw'][...,-1]`, `loss = img_loss`,
`psnr = mse2psnr(img_loss)`, `if 'rgb0' in extras: img_loss0 = img2mse(extras['rgb0'], target_s); loss = loss +
img_loss0`, `loss.backward()`, `optimizer.step()`, then the lr decay written into `param_group['lr']`. render_rays
(stratified samples with perturb, the coarse network, raw2outputs, sample_pdf on the weights' mid-points,
`z_samples = z_samples.detach()`, the fine network on the sorted union), raw2outputs and batchify_rays as
published; run_nerf_helpers.py's Embedder (sin/cos frequency bands), NeRF (no view dirs) and sample_pdf. Retyped at
CPU size: the Blender scene becomes two made-up 4x4 images with poses from a fixed rotation (get_rays as
published), N_rand 8, N_samples 8, N_importance 8, netdepth 2, netwidth 16, multires 3, lrate 5e-4, lrate_decay
250 (published 500), chunk 1024, white_bkgd off, raw_noise_std 0; logging, the test renders and checkpoints are
left out.
Written from the published file's structure, not checked line by line against the commit named.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

img2mse = lambda x, y: torch.mean((x - y) ** 2)  # noqa: E731 (as published)
mse2psnr = lambda x: -10. * torch.log(x) / torch.log(torch.Tensor([10.]))  # noqa: E731 (as published)


class Embedder:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.create_embedding_fn()

    def create_embedding_fn(self):
        embed_fns = []
        d = self.kwargs['input_dims']
        out_dim = 0
        if self.kwargs['include_input']:
            embed_fns.append(lambda x: x)
            out_dim += d
        max_freq = self.kwargs['max_freq_log2']
        N_freqs = self.kwargs['num_freqs']
        freq_bands = 2.**torch.linspace(0., max_freq, steps=N_freqs)
        for freq in freq_bands:
            for p_fn in self.kwargs['periodic_fns']:
                embed_fns.append(lambda x, p_fn=p_fn, freq=freq: p_fn(x * freq))
                out_dim += d
        self.embed_fns = embed_fns
        self.out_dim = out_dim

    def embed(self, inputs):
        return torch.cat([fn(inputs) for fn in self.embed_fns], -1)


def get_embedder(multires):
    embed_kwargs = {'include_input': True, 'input_dims': 3, 'max_freq_log2': multires-1, 'num_freqs': multires,
                    'log_sampling': True, 'periodic_fns': [torch.sin, torch.cos]}
    embedder_obj = Embedder(**embed_kwargs)
    embed = lambda x, eo=embedder_obj: eo.embed(x)  # noqa: E731 (as published)
    return embed, embedder_obj.out_dim


class NeRF(nn.Module):
    def __init__(self, D=8, W=256, input_ch=3, output_ch=4, skips=[4]):  # noqa: B006 (as published)
        super(NeRF, self).__init__()
        self.D = D
        self.W = W
        self.input_ch = input_ch
        self.skips = skips
        self.pts_linears = nn.ModuleList(
            [nn.Linear(input_ch, W)] + [nn.Linear(W, W) if i not in self.skips else nn.Linear(W + input_ch, W)
                                        for i in range(D-1)])
        self.output_linear = nn.Linear(W, output_ch)

    def forward(self, x):
        input_pts = x
        h = input_pts
        for i, l in enumerate(self.pts_linears):
            h = self.pts_linears[i](h)
            h = F.relu(h)
            if i in self.skips:
                h = torch.cat([input_pts, h], -1)
        outputs = self.output_linear(h)
        return outputs


def run_network(inputs, fn, embed_fn, netchunk=1024*64):
    inputs_flat = torch.reshape(inputs, [-1, inputs.shape[-1]])
    embedded = embed_fn(inputs_flat)
    outputs_flat = torch.cat([fn(embedded[i:i+netchunk]) for i in range(0, embedded.shape[0], netchunk)], 0)
    outputs = torch.reshape(outputs_flat, list(inputs.shape[:-1]) + [outputs_flat.shape[-1]])
    return outputs


def get_rays(H, W, K, c2w):
    i, j = torch.meshgrid(torch.linspace(0, W-1, W), torch.linspace(0, H-1, H), indexing='ij')
    i = i.t()
    j = j.t()
    dirs = torch.stack([(i-K[0][2])/K[0][0], -(j-K[1][2])/K[1][1], -torch.ones_like(i)], -1)
    rays_d = torch.sum(dirs[..., np.newaxis, :] * c2w[:3, :3], -1)
    rays_o = c2w[:3, -1].expand(rays_d.shape)
    return rays_o, rays_d


def sample_pdf(bins, weights, N_samples, det=False):
    weights = weights + 1e-5
    pdf = weights / torch.sum(weights, -1, keepdim=True)
    cdf = torch.cumsum(pdf, -1)
    cdf = torch.cat([torch.zeros_like(cdf[..., :1]), cdf], -1)
    if det:
        u = torch.linspace(0., 1., steps=N_samples)
        u = u.expand(list(cdf.shape[:-1]) + [N_samples])
    else:
        u = torch.rand(list(cdf.shape[:-1]) + [N_samples])
    u = u.contiguous()
    inds = torch.searchsorted(cdf, u, right=True)
    below = torch.max(torch.zeros_like(inds-1), inds-1)
    above = torch.min((cdf.shape[-1]-1) * torch.ones_like(inds), inds)
    inds_g = torch.stack([below, above], -1)
    matched_shape = [inds_g.shape[0], inds_g.shape[1], cdf.shape[-1]]
    cdf_g = torch.gather(cdf.unsqueeze(1).expand(matched_shape), 2, inds_g)
    bins_g = torch.gather(bins.unsqueeze(1).expand(matched_shape), 2, inds_g)
    denom = (cdf_g[..., 1]-cdf_g[..., 0])
    denom = torch.where(denom < 1e-5, torch.ones_like(denom), denom)
    t = (u-cdf_g[..., 0])/denom
    samples = bins_g[..., 0] + t * (bins_g[..., 1]-bins_g[..., 0])
    return samples


def raw2outputs(raw, z_vals, rays_d, raw_noise_std=0, white_bkgd=False):
    raw2alpha = lambda raw, dists, act_fn=F.relu: 1.-torch.exp(-act_fn(raw)*dists)  # noqa: E731 (as published)
    dists = z_vals[..., 1:] - z_vals[..., :-1]
    dists = torch.cat([dists, torch.Tensor([1e10]).expand(dists[..., :1].shape)], -1)
    dists = dists * torch.norm(rays_d[..., None, :], dim=-1)
    rgb = torch.sigmoid(raw[..., :3])
    noise = 0.
    if raw_noise_std > 0.:
        noise = torch.randn(raw[..., 3].shape) * raw_noise_std
    alpha = raw2alpha(raw[..., 3] + noise, dists)
    weights = alpha * torch.cumprod(torch.cat([torch.ones((alpha.shape[0], 1)), 1.-alpha + 1e-10], -1), -1)[:, :-1]
    rgb_map = torch.sum(weights[..., None] * rgb, -2)
    depth_map = torch.sum(weights * z_vals, -1)
    disp_map = 1./torch.max(1e-10 * torch.ones_like(depth_map), depth_map / torch.sum(weights, -1))
    acc_map = torch.sum(weights, -1)
    if white_bkgd:
        rgb_map = rgb_map + (1.-acc_map[..., None])
    return rgb_map, disp_map, acc_map, weights, depth_map


def render_rays(ray_batch, network_fn, network_query_fn, N_samples, retraw=False, lindisp=False, perturb=0.,
                N_importance=0, network_fine=None, white_bkgd=False, raw_noise_std=0.):
    N_rays = ray_batch.shape[0]
    rays_o, rays_d = ray_batch[:, 0:3], ray_batch[:, 3:6]
    bounds = torch.reshape(ray_batch[..., 6:8], [-1, 1, 2])
    near, far = bounds[..., 0], bounds[..., 1]
    t_vals = torch.linspace(0., 1., steps=N_samples)
    if not lindisp:
        z_vals = near * (1.-t_vals) + far * (t_vals)
    else:
        z_vals = 1./(1./near * (1.-t_vals) + 1./far * (t_vals))
    z_vals = z_vals.expand([N_rays, N_samples])
    if perturb > 0.:
        mids = .5 * (z_vals[..., 1:] + z_vals[..., :-1])
        upper = torch.cat([mids, z_vals[..., -1:]], -1)
        lower = torch.cat([z_vals[..., :1], mids], -1)
        t_rand = torch.rand(z_vals.shape)
        z_vals = lower + (upper - lower) * t_rand
    pts = rays_o[..., None, :] + rays_d[..., None, :] * z_vals[..., :, None]
    raw = network_query_fn(pts, network_fn)
    rgb_map, disp_map, acc_map, weights, depth_map = raw2outputs(raw, z_vals, rays_d, raw_noise_std, white_bkgd)
    if N_importance > 0:
        rgb_map_0, disp_map_0, acc_map_0 = rgb_map, disp_map, acc_map
        z_vals_mid = .5 * (z_vals[..., 1:] + z_vals[..., :-1])
        z_samples = sample_pdf(z_vals_mid, weights[..., 1:-1], N_importance, det=(perturb == 0.))
        z_samples = z_samples.detach()
        z_vals, _ = torch.sort(torch.cat([z_vals, z_samples], -1), -1)
        pts = rays_o[..., None, :] + rays_d[..., None, :] * z_vals[..., :, None]
        run_fn = network_fn if network_fine is None else network_fine
        raw = network_query_fn(pts, run_fn)
        rgb_map, disp_map, acc_map, weights, depth_map = raw2outputs(raw, z_vals, rays_d, raw_noise_std, white_bkgd)
    ret = {'rgb_map': rgb_map, 'disp_map': disp_map, 'acc_map': acc_map}
    if retraw:
        ret['raw'] = raw
    if N_importance > 0:
        ret['rgb0'] = rgb_map_0
        ret['disp0'] = disp_map_0
        ret['acc0'] = acc_map_0
        ret['z_std'] = torch.std(z_samples, dim=-1, unbiased=False)
    return ret


def batchify_rays(rays_flat, chunk=1024*32, **kwargs):
    all_ret = {}
    for i in range(0, rays_flat.shape[0], chunk):
        ret = render_rays(rays_flat[i:i+chunk], **kwargs)
        for k in ret:
            if k not in all_ret:
                all_ret[k] = []
            all_ret[k].append(ret[k])
    all_ret = {k: torch.cat(all_ret[k], 0) for k in all_ret}
    return all_ret


def render(H, W, K, chunk=1024*32, rays=None, near=0., far=1., **kwargs):
    rays_o, rays_d = rays
    sh = rays_d.shape
    rays_o = torch.reshape(rays_o, [-1, 3]).float()
    rays_d = torch.reshape(rays_d, [-1, 3]).float()
    near, far = near * torch.ones_like(rays_d[..., :1]), far * torch.ones_like(rays_d[..., :1])
    rays = torch.cat([rays_o, rays_d, near, far], -1)
    all_ret = batchify_rays(rays, chunk, **kwargs)
    for k in all_ret:
        k_sh = list(sh[:-1]) + list(all_ret[k].shape[1:])
        all_ret[k] = torch.reshape(all_ret[k], k_sh)
    k_extract = ['rgb_map', 'disp_map', 'acc_map']
    ret_list = [all_ret[k] for k in k_extract]
    ret_dict = {k: all_ret[k] for k in all_ret if k not in k_extract}
    return ret_list + [ret_dict]


def build() -> dict:
    np.random.seed(0)
    torch.manual_seed(0)
    H, W, focal = 4, 4, 5.0
    K = np.array([[focal, 0, 0.5*W], [0, focal, 0.5*H], [0, 0, 1]])
    images = np.random.rand(2, H, W, 3).astype(np.float32)
    poses = []
    for angle in (0.0, 0.5):
        c, s = np.cos(angle), np.sin(angle)
        poses.append(np.array([[c, 0, s, 4*s], [0, 1, 0, 0], [-s, 0, c, 4*c]], dtype=np.float32))
    poses = np.stack(poses)
    embed_fn, input_ch = get_embedder(3)
    model = NeRF(D=2, W=16, input_ch=input_ch, output_ch=4, skips=[4])
    grad_vars = list(model.parameters())
    model_fine = NeRF(D=2, W=16, input_ch=input_ch, output_ch=4, skips=[4])
    grad_vars += list(model_fine.parameters())
    network_query_fn = lambda inputs, network_fn: run_network(inputs, network_fn, embed_fn=embed_fn, netchunk=1024)  # noqa: E731 (as published)
    lrate = 5e-4
    optimizer = torch.optim.Adam(params=grad_vars, lr=lrate, betas=(0.9, 0.999))
    render_kwargs_train = {'network_query_fn': network_query_fn, 'perturb': 1., 'N_importance': 8,
                           'network_fine': model_fine, 'N_samples': 8, 'network_fn': model,
                           'white_bkgd': False, 'raw_noise_std': 0., 'near': 2., 'far': 6.}
    # For random ray batching
    rays = np.stack([np.stack(get_rays(H, W, torch.Tensor(K), torch.Tensor(p))) for p in poses[:, :3, :4]], 0)
    rays_rgb = np.concatenate([rays, images[:, None]], 1)  # [N, ro+rd+rgb, H, W, 3]
    rays_rgb = np.transpose(rays_rgb, [0, 2, 3, 1, 4])
    rays_rgb = np.reshape(rays_rgb, [-1, 3, 3]).astype(np.float32)
    np.random.shuffle(rays_rgb)
    rays_rgb = torch.Tensor(rays_rgb)
    return {"model": model, "model_fine": model_fine, "optimizer": optimizer, "rays_rgb": rays_rgb, "i_batch": 0,
            "global_step": 0, "H": H, "W": W, "K": K, "render_kwargs_train": render_kwargs_train,
            "N_rand": 8, "lrate": lrate, "lrate_decay": 250, "chunk": 1024}


def iteration(state: dict) -> None:
    optimizer, N_rand, i_batch = state["optimizer"], state["N_rand"], state["i_batch"]
    H, W, K = state["H"], state["W"], state["K"]
    rays_rgb = state["rays_rgb"]
    # Random over all images
    batch = rays_rgb[i_batch:i_batch+N_rand]  # [B, 2+1, 3*?]
    batch = torch.transpose(batch, 0, 1)
    batch_rays, target_s = batch[:2], batch[2]

    i_batch += N_rand
    if i_batch >= rays_rgb.shape[0]:
        rand_idx = torch.randperm(rays_rgb.shape[0])
        state["rays_rgb"] = rays_rgb[rand_idx]
        i_batch = 0
    state["i_batch"] = i_batch

    #####  Core optimization loop  #####
    rgb, disp, acc, extras = render(H, W, K, chunk=state["chunk"], rays=batch_rays, retraw=True,
                                    **state["render_kwargs_train"])

    optimizer.zero_grad()
    img_loss = img2mse(rgb, target_s)
    trans = extras['raw'][..., -1]
    loss = img_loss
    psnr = mse2psnr(img_loss)

    if 'rgb0' in extras:
        img_loss0 = img2mse(extras['rgb0'], target_s)
        loss = loss + img_loss0
        psnr0 = mse2psnr(img_loss0)

    loss.backward()  # @backward
    optimizer.step()

    # NOTE: IMPORTANT!
    ###   update learning rate   ###
    decay_rate = 0.1
    decay_steps = state["lrate_decay"] * 1000
    new_lrate = state["lrate"] * (decay_rate ** (state["global_step"] / decay_steps))
    for param_group in optimizer.param_groups:
        param_group['lr'] = new_lrate
    state["global_step"] += 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
