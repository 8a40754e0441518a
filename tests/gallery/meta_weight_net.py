"""Meta-Weight-Net (Shu et al. 2019): a small net maps each example's loss to its weight, learned by a
hypergradient through one virtual SGD step of a copy of the classifier (`torch.autograd.grad(..., create_graph=True)`
and `update_params`), then the classifier takes its real step with the weights under `torch.no_grad()`.

Source: xjtushujun/meta-weight-net, MW-Net.py (commit e85c3a2476dda4937539e3fa5b91f76537816433): train() per batch:
`meta_model = build_model()`, `meta_model.load_state_dict(model.state_dict())`, `cost = F.cross_entropy(outputs,
targets, reduce=False)`, `v_lambda = vnet(cost_v.data)`, `l_f_meta = torch.sum(cost_v * v_lambda)/len(cost_v)`,
`meta_model.zero_grad()`, `grads = torch.autograd.grad(l_f_meta, (meta_model.params()), create_graph=True)`,
`meta_model.update_params(lr_inner=meta_lr, source_params=grads)`, `del grads`, the meta batch from
`train_meta_loader_iter`, `l_g_meta = F.cross_entropy(y_g_hat, targets_val)`, `optimizer_vnet.zero_grad()`,
`l_g_meta.backward()`, `optimizer_vnet.step()`, then the classifier's `outputs = model(inputs)`, `with
torch.no_grad(): w_new = vnet(cost_v)`, `loss = torch.sum(cost_v * w_new)/len(cost_v)`,
`optimizer_model.zero_grad()`, `loss.backward()`, `optimizer_model.step()`, the running losses and `accuracy`;
resnet.py (commit 1959353f5cd5fc5134ae207755e1e6417e53a06a): MetaModule (named_params, update_params, set_param,
its weights registered as buffers that require grad), MetaLinear, VNet and `_weights_init`. Retyped at CPU size: the
classifier is a 2-layer MLP of resnet.py's MetaLinear (published ResNet32 of MetaConv2d and MetaBatchNorm2d) on
16 made-up features and 4 classes, VNet(1, 8, 1) (published VNet(1, 100, 1)), batches of 8 (100) from lists of 3
batches in place of the corrupted CIFAR loaders, epoch 0 of train(); `.cuda()` calls dropped, argparse, printing
and testing left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
from torch.autograd import Variable

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def to_var(x, requires_grad=True):
    if torch.cuda.is_available():
        x = x.cuda()
    return Variable(x, requires_grad=requires_grad)


class MetaModule(nn.Module):
    # adopted from: Adrien Ecoffet https://github.com/AdrienLE
    def params(self):
        for name, param in self.named_params(self):
            yield param

    def named_leaves(self):
        return []

    def named_submodules(self):
        return []

    def named_params(self, curr_module=None, memo=None, prefix=''):
        if memo is None:
            memo = set()

        if hasattr(curr_module, 'named_leaves'):
            for name, p in curr_module.named_leaves():
                if p is not None and p not in memo:
                    memo.add(p)
                    yield prefix + ('.' if prefix else '') + name, p
        else:
            for name, p in curr_module._parameters.items():
                if p is not None and p not in memo:
                    memo.add(p)
                    yield prefix + ('.' if prefix else '') + name, p

        for mname, module in curr_module.named_children():
            submodule_prefix = prefix + ('.' if prefix else '') + mname
            for name, p in self.named_params(module, memo, submodule_prefix):
                yield name, p

    def update_params(self, lr_inner, first_order=False, source_params=None, detach=False):
        if source_params is not None:
            for tgt, src in zip(self.named_params(self), source_params):
                name_t, param_t = tgt
                grad = src
                if first_order:
                    grad = to_var(grad.detach().data)
                tmp = param_t - lr_inner * grad  # @virtual_step
                self.set_param(self, name_t, tmp)
        else:

            for name, param in self.named_params(self):
                if not detach:
                    grad = param.grad
                    if first_order:
                        grad = to_var(grad.detach().data)
                    tmp = param - lr_inner * grad
                    self.set_param(self, name, tmp)
                else:
                    param = param.detach_()  # https://blog.csdn.net/qq_39709535/article/details/81866686
                    self.set_param(self, name, param)

    def set_param(self, curr_mod, name, param):
        if '.' in name:
            n = name.split('.')
            module_name = n[0]
            rest = '.'.join(n[1:])
            for name, mod in curr_mod.named_children():
                if module_name == name:
                    self.set_param(mod, rest, param)
                    break
        else:
            setattr(curr_mod, name, param)


class MetaLinear(MetaModule):
    def __init__(self, *args, **kwargs):
        super().__init__()
        ignore = nn.Linear(*args, **kwargs)

        self.register_buffer('weight', to_var(ignore.weight.data, requires_grad=True))
        self.register_buffer('bias', to_var(ignore.bias.data, requires_grad=True))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def named_leaves(self):
        return [('weight', self.weight), ('bias', self.bias)]


def _weights_init(m):
    classname = m.__class__.__name__
    if isinstance(m, MetaLinear):
        init.kaiming_normal(m.weight)


class MetaMLP(MetaModule):
    """In place of resnet.py's ResNet32: the same MetaModule plumbing, two MetaLinear layers."""

    def __init__(self, num_classes):
        super(MetaMLP, self).__init__()
        self.linear1 = MetaLinear(16, 12)
        self.linear = MetaLinear(12, num_classes)

        self.apply(_weights_init)

    def forward(self, x):
        out = F.relu(self.linear1(x))
        out = self.linear(out)
        return out


class VNet(MetaModule):
    def __init__(self, input, hidden1, output):
        super(VNet, self).__init__()
        self.linear1 = MetaLinear(input, hidden1)
        self.relu1 = nn.ReLU(inplace=True)
        self.linear2 = MetaLinear(hidden1, output)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu1(x)
        out = self.linear2(x)
        return F.sigmoid(out)


class Args:
    dataset = 'cifar10'
    lr = 1e-1
    momentum = 0.9
    weight_decay = 5e-4
    batch_size = 8


args = Args()
device = torch.device("cpu")


def build_model():
    model = MetaMLP((args.dataset == 'cifar10' and 4) or 100)
    return model


def accuracy(output, target, topk=(1,)):
    """Computes the precision@k for the specified values of k"""
    maxk = max(topk)
    batch_size = target.size(0)

    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))

    res = []
    for k in topk:
        correct_k = correct[:k].view(-1).float().sum(0)
        res.append(correct_k.mul_(100.0 / batch_size))
    return res


def build() -> dict:
    torch.manual_seed(1)
    train_batches = [(torch.randn(args.batch_size, 16), torch.randint(0, 4, (args.batch_size,))) for _ in range(3)]
    meta_batches = [(torch.randn(args.batch_size, 16), torch.randint(0, 4, (args.batch_size,))) for _ in range(2)]
    model = build_model()
    vnet = VNet(1, 8, 1)
    optimizer_model = torch.optim.SGD(model.params(), args.lr,
                                      momentum=args.momentum, weight_decay=args.weight_decay)
    optimizer_vnet = torch.optim.Adam(vnet.params(), 1e-3,
                                      weight_decay=1e-4)
    return {"model": model, "vnet": vnet, "optimizer_model": optimizer_model, "optimizer_vnet": optimizer_vnet,
            "train_loader": iter(enumerate(train_batches)), "train_meta_loader": meta_batches,
            "train_meta_loader_iter": iter(meta_batches), "epoch": 0, "train_loss": 0, "meta_loss": 0}


def iteration(state: dict) -> None:
    model, vnet, optimizer_model, optimizer_vnet = (
        state["model"], state["vnet"], state["optimizer_model"], state["optimizer_vnet"])
    train_meta_loader, epoch = state["train_meta_loader"], state["epoch"]
    batch_idx, (inputs, targets) = next(state["train_loader"])

    model.train()
    inputs, targets = inputs.to(device), targets.to(device)
    meta_model = build_model()
    meta_model.load_state_dict(model.state_dict())
    outputs = meta_model(inputs)

    cost = F.cross_entropy(outputs, targets, reduce=False)
    cost_v = torch.reshape(cost, (len(cost), 1))
    v_lambda = vnet(cost_v.data)
    l_f_meta = torch.sum(cost_v * v_lambda)/len(cost_v)
    meta_model.zero_grad()
    grads = torch.autograd.grad(l_f_meta, (meta_model.params()), create_graph=True)  # @meta_grads
    meta_lr = args.lr * ((0.1 ** int(epoch >= 80)) * (0.1 ** int(epoch >= 100)))   # For ResNet32
    meta_model.update_params(lr_inner=meta_lr, source_params=grads)
    del grads

    try:
        inputs_val, targets_val = next(state["train_meta_loader_iter"])
    except StopIteration:
        state["train_meta_loader_iter"] = iter(train_meta_loader)
        inputs_val, targets_val = next(state["train_meta_loader_iter"])
    inputs_val, targets_val = inputs_val.to(device), targets_val.to(device)
    y_g_hat = meta_model(inputs_val)
    l_g_meta = F.cross_entropy(y_g_hat, targets_val)
    prec_meta = accuracy(y_g_hat.data, targets_val.data, topk=(1,))[0]

    optimizer_vnet.zero_grad()
    l_g_meta.backward()  # @meta_backward
    optimizer_vnet.step()

    outputs = model(inputs)
    cost_w = F.cross_entropy(outputs, targets, reduce=False)
    cost_v = torch.reshape(cost_w, (len(cost_w), 1))
    prec_train = accuracy(outputs.data, targets.data, topk=(1,))[0]

    with torch.no_grad():
        w_new = vnet(cost_v)

    loss = torch.sum(cost_v * w_new)/len(cost_v)

    optimizer_model.zero_grad()
    loss.backward()  # @model_backward
    optimizer_model.step()

    state["train_loss"] += loss.item()
    state["meta_loss"] += l_g_meta.item()
    state["prec"] = (prec_train, prec_meta)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
