"""Dataset condensation by gradient matching (DC, Zhao, Mopuri & Bilen 2021): synthetic images are learned so that
a fresh network's gradient on them, `torch.autograd.grad(loss_syn, net_parameters, create_graph=True)`, matches its
gradient on real images; between image updates the network trains on the synthetic set.

Source: VICO-UoE/DatasetCondensation, main.py (commit 306245d074cca5524694a8a83ca0797a6e85dfc8): the `for it in
range(args.Iteration+1)` loop's "Train synthetic data" part: `net = get_network(...)`, `optimizer_net`, then per
outer loop `loss = torch.tensor(0.0)`, per class `gw_real = torch.autograd.grad(loss_real, net_parameters)`,
`gw_real = list((_.detach().clone() for _ in gw_real))`, `gw_syn = torch.autograd.grad(loss_syn, net_parameters,
create_graph=True)`, `loss += match_loss(gw_syn, gw_real, args)`, then `optimizer_img.zero_grad()`,
`loss.backward()`, `optimizer_img.step()`, the `break` after the last outer loop, and the network's update by
`epoch('train', trainloader, ...)` on a deep copy of the synthetic images; utils.py (same commit): TensorDataset,
get_network (ConvNet, default setting: relu, instancenorm, avgpooling), distance_wb, match_loss ('ours'),
get_loops and epoch; networks.py (same commit): ConvNet. Retyped at CPU size: 3 classes of 20 made-up 3x8x8 real
images (published CIFAR10's 50000), 10 images per class (ipc 10) with get_loops(10) giving outer_loop 2 and
inner_loop 1 (published 10 and 50), ConvNet width 4 and depth 2 (128 and 3), batch_real 8 (256), batch_train 16
(256), 3 iterations (1001); get_network's `torch.random.manual_seed(int(time.time() * 1000) % 100000)` made
`torch.random.manual_seed(0)` so the run repeats; the evaluation of the synthetic set at `eval_it_pool`, DSA (the
method is DC), the image saving and the result file left out; the print every 10 iterations is kept as a string in the state.
"""

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": ["image_syn"],
}


''' ConvNet '''
class ConvNet(nn.Module):
    def __init__(self, channel, num_classes, net_width, net_depth, net_act, net_norm, net_pooling, im_size=(32, 32)):
        super(ConvNet, self).__init__()

        self.features, shape_feat = self._make_layers(channel, net_width, net_depth, net_norm, net_act, net_pooling, im_size)
        num_feat = shape_feat[0]*shape_feat[1]*shape_feat[2]
        self.classifier = nn.Linear(num_feat, num_classes)

    def forward(self, x):
        out = self.features(x)
        out = out.view(out.size(0), -1)
        out = self.classifier(out)
        return out

    def _get_activation(self, net_act):
        if net_act == 'relu':
            return nn.ReLU(inplace=True)
        else:
            exit('unknown activation function: %s' % net_act)

    def _get_pooling(self, net_pooling):
        if net_pooling == 'avgpooling':
            return nn.AvgPool2d(kernel_size=2, stride=2)
        elif net_pooling == 'none':
            return None
        else:
            exit('unknown net_pooling: %s' % net_pooling)

    def _get_normlayer(self, net_norm, shape_feat):
        # shape_feat = (c*h*w)
        if net_norm == 'instancenorm':
            return nn.GroupNorm(shape_feat[0], shape_feat[0], affine=True)
        elif net_norm == 'none':
            return None
        else:
            exit('unknown net_norm: %s' % net_norm)

    def _make_layers(self, channel, net_width, net_depth, net_norm, net_act, net_pooling, im_size):
        layers = []
        in_channels = channel
        if im_size[0] == 28:
            im_size = (32, 32)
        shape_feat = [in_channels, im_size[0], im_size[1]]
        for d in range(net_depth):
            layers += [nn.Conv2d(in_channels, net_width, kernel_size=3, padding=3 if channel == 1 and d == 0 else 1)]
            shape_feat[0] = net_width
            if net_norm != 'none':
                layers += [self._get_normlayer(net_norm, shape_feat)]
            layers += [self._get_activation(net_act)]
            in_channels = net_width
            if net_pooling != 'none':
                layers += [self._get_pooling(net_pooling)]
                shape_feat[1] //= 2
                shape_feat[2] //= 2

        return nn.Sequential(*layers), shape_feat


class TensorDataset(Dataset):
    def __init__(self, images, labels):  # images: n x c x h x w tensor
        self.images = images.detach().float()
        self.labels = labels.detach()

    def __getitem__(self, index):
        return self.images[index], self.labels[index]

    def __len__(self):
        return self.images.shape[0]


def get_default_convnet_setting():
    net_width, net_depth, net_act, net_norm, net_pooling = 4, 2, 'relu', 'instancenorm', 'avgpooling'
    return net_width, net_depth, net_act, net_norm, net_pooling


def get_network(model, channel, num_classes, im_size=(32, 32)):
    torch.random.manual_seed(0)
    net_width, net_depth, net_act, net_norm, net_pooling = get_default_convnet_setting()

    if model == 'ConvNet':
        net = ConvNet(channel=channel, num_classes=num_classes, net_width=net_width, net_depth=net_depth, net_act=net_act, net_norm=net_norm, net_pooling=net_pooling, im_size=im_size)
    else:
        net = None
        exit('unknown model: %s' % model)

    device = 'cpu'
    net = net.to(device)

    return net


def distance_wb(gwr, gws):
    shape = gwr.shape
    if len(shape) == 4:  # conv, out*in*h*w
        gwr = gwr.reshape(shape[0], shape[1] * shape[2] * shape[3])
        gws = gws.reshape(shape[0], shape[1] * shape[2] * shape[3])
    elif len(shape) == 3:  # layernorm, C*h*w
        gwr = gwr.reshape(shape[0], shape[1] * shape[2])
        gws = gws.reshape(shape[0], shape[1] * shape[2])
    elif len(shape) == 2:  # linear, out*in
        tmp = 'do nothing'
    elif len(shape) == 1:  # batchnorm/instancenorm, C; groupnorm x, bias
        gwr = gwr.reshape(1, shape[0])
        gws = gws.reshape(1, shape[0])
        return torch.tensor(0, dtype=torch.float, device=gwr.device)

    dis_weight = torch.sum(1 - torch.sum(gwr * gws, dim=-1) / (torch.norm(gwr, dim=-1) * torch.norm(gws, dim=-1) + 0.000001))
    dis = dis_weight
    return dis


def match_loss(gw_syn, gw_real, args):
    dis = torch.tensor(0.0).to(args.device)

    if args.dis_metric == 'ours':
        for ig in range(len(gw_real)):
            gwr = gw_real[ig]
            gws = gw_syn[ig]
            dis += distance_wb(gwr, gws)
    else:
        exit('unknown distance function: %s' % args.dis_metric)

    return dis


def get_loops(ipc):
    # Get the two hyper-parameters of outer-loop and inner-loop.
    # The following values are empirically good.
    if ipc == 1:
        outer_loop, inner_loop = 1, 1
    elif ipc == 10:
        outer_loop, inner_loop = 2, 1
    else:
        outer_loop, inner_loop = 0, 0
        exit('loop hyper-parameters are not defined for %d ipc' % ipc)
    return outer_loop, inner_loop


def epoch(mode, dataloader, net, optimizer, criterion, args, aug):
    loss_avg, acc_avg, num_exp = 0, 0, 0
    net = net.to(args.device)
    criterion = criterion.to(args.device)

    if mode == 'train':
        net.train()
    else:
        net.eval()

    for i_batch, datum in enumerate(dataloader):
        img = datum[0].float().to(args.device)
        lab = datum[1].long().to(args.device)
        n_b = lab.shape[0]

        output = net(img)
        loss = criterion(output, lab)
        acc = np.sum(np.equal(np.argmax(output.cpu().data.numpy(), axis=-1), lab.cpu().data.numpy()))

        loss_avg += loss.item()*n_b
        acc_avg += acc
        num_exp += n_b

        if mode == 'train':
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    loss_avg /= num_exp
    acc_avg /= num_exp

    return loss_avg, acc_avg


class Args:
    method = 'DC'
    dataset = 'made-up'
    model = 'ConvNet'
    ipc = 10
    Iteration = ITERATIONS - 1
    lr_img = 0.1
    lr_net = 0.01
    batch_real = 8
    batch_train = 16
    init = 'noise'
    dis_metric = 'ours'


def build() -> dict:
    args = Args()
    args.outer_loop, args.inner_loop = get_loops(args.ipc)
    args.device = 'cpu'
    args.dsa = True if args.method == 'DSA' else False
    np.random.seed(0)
    torch.manual_seed(0)
    channel, im_size, num_classes = 3, (8, 8), 3
    dst_train = [(torch.randn(channel, *im_size) + c, c) for c in range(num_classes) for _ in range(20)]

    ''' organize the real dataset '''
    images_all = []
    labels_all = []
    indices_class = [[] for c in range(num_classes)]

    images_all = [torch.unsqueeze(dst_train[i][0], dim=0) for i in range(len(dst_train))]
    labels_all = [dst_train[i][1] for i in range(len(dst_train))]
    for i, lab in enumerate(labels_all):
        indices_class[lab].append(i)
    images_all = torch.cat(images_all, dim=0).to(args.device)
    labels_all = torch.tensor(labels_all, dtype=torch.long, device=args.device)

    def get_images(c, n):  # get random n images from class c
        idx_shuffle = np.random.permutation(indices_class[c])[:n]
        return images_all[idx_shuffle]

    ''' initialize the synthetic data '''
    image_syn = torch.randn(size=(num_classes*args.ipc, channel, im_size[0], im_size[1]), dtype=torch.float, requires_grad=True, device=args.device)
    label_syn = torch.tensor([np.ones(args.ipc)*i for i in range(num_classes)], dtype=torch.long, requires_grad=False, device=args.device).view(-1)  # [0,0,0, 1,1,1, ..., 9,9,9]

    ''' training '''
    optimizer_img = torch.optim.SGD([image_syn, ], lr=args.lr_img, momentum=0.5)  # optimizer_img for synthetic data
    optimizer_img.zero_grad()
    criterion = nn.CrossEntropyLoss().to(args.device)
    return {"args": args, "channel": channel, "im_size": im_size, "num_classes": num_classes,
            "get_images": get_images, "image_syn": image_syn, "label_syn": label_syn,
            "optimizer_img": optimizer_img, "criterion": criterion, "it": 0}


def iteration(state: dict) -> None:
    args, channel, im_size, num_classes = state["args"], state["channel"], state["im_size"], state["num_classes"]
    get_images, image_syn, label_syn = state["get_images"], state["image_syn"], state["label_syn"]
    optimizer_img, criterion, it = state["optimizer_img"], state["criterion"], state["it"]

    ''' Train synthetic data '''
    net = get_network(args.model, channel, num_classes, im_size).to(args.device)  # get a random model
    net.train()
    net_parameters = list(net.parameters())
    optimizer_net = torch.optim.SGD(net.parameters(), lr=args.lr_net)  # optimizer_img for synthetic data
    optimizer_net.zero_grad()
    loss_avg = 0
    args.dc_aug_param = None  # Mute the DC augmentation when learning synthetic data (in inner-loop epoch function) in oder to be consistent with DC paper.

    for ol in range(args.outer_loop):

        ''' update synthetic data '''
        loss = torch.tensor(0.0).to(args.device)
        for c in range(num_classes):
            img_real = get_images(c, args.batch_real)
            lab_real = torch.ones((img_real.shape[0],), device=args.device, dtype=torch.long) * c
            img_syn = image_syn[c*args.ipc:(c+1)*args.ipc].reshape((args.ipc, channel, im_size[0], im_size[1]))
            lab_syn = torch.ones((args.ipc,), device=args.device, dtype=torch.long) * c

            output_real = net(img_real)
            loss_real = criterion(output_real, lab_real)
            gw_real = torch.autograd.grad(loss_real, net_parameters)  # @gw_real
            gw_real = list((_.detach().clone() for _ in gw_real))

            output_syn = net(img_syn)
            loss_syn = criterion(output_syn, lab_syn)
            gw_syn = torch.autograd.grad(loss_syn, net_parameters, create_graph=True)  # @gw_syn

            loss += match_loss(gw_syn, gw_real, args)

        optimizer_img.zero_grad()
        loss.backward()  # @img_backward
        optimizer_img.step()
        loss_avg += loss.item()

        if ol == args.outer_loop - 1:
            break

        ''' update network '''
        image_syn_train, label_syn_train = copy.deepcopy(image_syn.detach()), copy.deepcopy(label_syn.detach())  # avoid any unaware modification
        dst_syn_train = TensorDataset(image_syn_train, label_syn_train)
        trainloader = torch.utils.data.DataLoader(dst_syn_train, batch_size=args.batch_train, shuffle=True, num_workers=0)
        for il in range(args.inner_loop):
            epoch('train', trainloader, net, optimizer_net, criterion, args, aug=True if args.dsa else False)

    loss_avg /= (num_classes*args.outer_loop)

    if it % 10 == 0:
        state["log"] = 'iter = %04d, loss = %.4f' % (it, loss_avg)
    state["it"] = it + 1


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
