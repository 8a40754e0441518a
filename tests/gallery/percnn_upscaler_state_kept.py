"""PeRCNN on the 2D Gray-Scott equations: the initial state kept on the model, and a retain_graph=True nothing needs.

Source: isds-neu/PeRCNN, DataDrivenModeling/2d_gs_rd/train_2drd.py (commit 096287d6d3be240e7f1f59acca680451620c70e0),
and its issue #3 (https://github.com/isds-neu/PeRCNN/issues/3, "training RNN using retain_graph=True": "Why do you use
retain_graph=True to train the RCNN? Will this cause GPU memory explosion and training process slowing down?").
As published: `upscaler` (ConvTranspose2d 2->8 stride 2, Sigmoid, ConvTranspose2d 8->8 stride 2, Conv2d 8->2),
RCNNCell (trainable CA, CB through a sigmoid, a fixed 5x5 Laplace Conv2d, the cubic 1x1-conv terms Wh1..Wh4 for u
and v, periodic padding, forward Euler `u_prev + u_res * self.dt`), RCNN whose forward sets
`self.init_state = self.UpconvBlock(self.init_state_low)` on the module and unrolls `step` cells, the
Conv2dDerivative / Conv1dDerivative / loss_generator physics loss (computed for monitoring, not trained on),
get_ic_loss, loss_gen, and train(): per epoch optimizer.zero_grad(), `output, second_last_state = model()`,
the data loss on the strided prediction with a 90/10 train/validation split, `loss = 40*loss_data + 0.25*loss_ic`,
`loss.backward(retain_graph=True)`, the `.item()` logging, optimizer.step(), scheduler.step(). Each epoch
recomputes the whole rollout from `init_state_low`, so nothing a backward needs is built before it; what the
retain keeps alive is the last epoch's graph, held into the next epoch by `model.init_state`. Retyped at CPU size:
a 16x16 grid from a 4x4 low-resolution initial state (published 100x100 from 25x25, so `F.interpolate(...,
(100, 100))` is `(16, 16)`), 4 time steps (published 400), the time stride of the data loss 1 (published 20, which
leaves nothing to train on at 4 steps), made-up fields in [0, 1] with the published add_noise (10%) in place of
the .mat file; `.cuda()` dropped; the published main continues from a checkpoint (`cont=True`), here the
`cont=False` branch's fresh Adam and StepLR, with pretrain_upscaler, checkpointing, printing and plots left out.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

ITERATIONS = 3
GRID = 16

TRUTH = {
    "error": None,
    "retains": {"@backward": {"verdict": "can go", "runs": 3, "needed_runs": 0}},
    "carried": [],
    "notes": [{"variable": "model.init_state", "line": "@init_state"}],
    "modifies_in_place": [],
}

lap_2d_op = [[[[    0,   0, -1/12,   0,     0],
               [    0,   0,   4/3,   0,     0],
               [-1/12, 4/3,   - 5, 4/3, -1/12],
               [    0,   0,   4/3,   0,     0],
               [    0,   0, -1/12,   0,     0]]]]


class upscaler(nn.Module):
    ''' Upscaler to convert low-res to high-res initial state '''

    def __init__(self):
        super(upscaler, self).__init__()
        self.layers = []
        self.layers.append(
            nn.ConvTranspose2d(2, 8, kernel_size=5, padding=5 // 2, stride=2, output_padding=1, bias=True))
        self.layers.append(torch.nn.Sigmoid())
        self.layers.append(
            nn.ConvTranspose2d(8, 8, kernel_size=5, padding=5 // 2, stride=2, output_padding=1, bias=True))
        self.layers.append(nn.Conv2d(8, 2, 1, 1, padding=0, bias=True))
        self.convnet = torch.nn.Sequential(*self.layers)

    def forward(self, h):
        return self.convnet(h)


class RCNNCell(nn.Module):
    ''' Recurrent convolutional neural network Cell '''

    def __init__(self, input_channels, hidden_channels, input_kernel_size):

        super(RCNNCell, self).__init__()

        # the initial parameters
        self.input_channels = input_channels  # no use, always 2
        self.hidden_channels = hidden_channels
        self.input_kernel_size = 5
        self.input_stride = 1

        self.dx = 0.01
        self.dt = 0.5
        self.mu_up = 3.99e-5  # upper bound for the diffusion coefficient
        # Design the laplace_u term # [-1, 1]
        np.random.seed(1234)
        self.CA = torch.nn.Parameter(torch.tensor((np.random.rand()-0.5)*2, dtype=torch.float32), requires_grad=True)
        self.CB = torch.nn.Parameter(torch.tensor((np.random.rand()-0.5)*2, dtype=torch.float32), requires_grad=True)

        # padding_mode='replicate' not working for the test
        self.W_laplace = nn.Conv2d(1, 1, self.input_kernel_size, self.input_stride, padding=0, bias=False)
        self.W_laplace.weight.data = 1/self.dx**2*torch.tensor(lap_2d_op, dtype=torch.float32)
        self.W_laplace.weight.requires_grad = False

        # Nonlinear term for u (up to 3rd order)
        self.Wh1_u = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh2_u = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh3_u = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh4_u = nn.Conv2d(in_channels=hidden_channels, out_channels=1, kernel_size=1,
                               stride=1, padding=0, bias=True)
        # Nonlinear term for v (up to 3rd order)
        self.Wh1_v = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh2_v = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh3_v = nn.Conv2d(in_channels=2, out_channels=hidden_channels, kernel_size=1,
                               stride=self.input_stride, padding=0, bias=True, )
        self.Wh4_v = nn.Conv2d(in_channels=hidden_channels, out_channels=1, kernel_size=1,
                               stride=1, padding=0, bias=True)

        # initialize filter's wweight and bias
        self.filter_list = [self.Wh1_u, self.Wh2_u, self.Wh3_u, self.Wh4_u, self.Wh1_v, self.Wh2_v, self.Wh3_v, self.Wh4_v]
        self.init_filter(self.filter_list, c=0.02)

    def init_filter(self, filter_list, c):
        '''
        :param filter_list: list of filter for initialization
        :param c: constant multiplied on Xavier initialization
        '''
        for filter in filter_list:
            # Xavier initialization and then scale
            torch.nn.init.xavier_uniform_(filter.weight)
            filter.weight.data = c*filter.weight.data
            if filter.bias is not None:
                filter.bias.data.fill_(0.0)

    def forward(self, h):

        # periodic padding, can also be achieved using 'circular' padding
        h_pad = torch.cat((    h[:, :, :, -2:],     h,     h[:, :, :, 0:2]), dim=3)
        h_pad = torch.cat((h_pad[:, :, -2:, :], h_pad, h_pad[:, :, 0:2, :]), dim=2)
        u_pad = h_pad[:, 0:1, ...]  # 104x104
        v_pad = h_pad[:, 1:2, ...]
        u_prev = h[:, 0:1, ...]     # 100x100
        v_prev = h[:, 1:2, ...]

        u_res = self.mu_up*torch.sigmoid(self.CA)*self.W_laplace(u_pad) + self.Wh4_u( self.Wh1_u(h)*self.Wh2_u(h)*self.Wh3_u(h) )
        v_res = self.mu_up*torch.sigmoid(self.CB)*self.W_laplace(v_pad) + self.Wh4_v( self.Wh1_v(h)*self.Wh2_v(h)*self.Wh3_v(h) )
        u_next = u_prev + u_res * self.dt
        v_next = v_prev + v_res * self.dt
        ch = torch.cat((u_next, v_next), dim=1)

        return ch, ch


class RCNN(nn.Module):

    ''' Recurrent convolutional neural network layer '''

    def __init__(self, input_channels, hidden_channels, init_state_low, input_kernel_size,
                       step=1, effective_step=[1]):  # noqa: B006 (as published)

        super(RCNN, self).__init__()

        # input channels of layer includes input_channels and hidden_channels of cells
        self.input_channels = input_channels
        self.hidden_channels = hidden_channels
        self.output_channels = 1  # no use, always 1
        self.input_kernel_size = input_kernel_size
        self.step = step
        self.effective_step = effective_step
        self._all_layers = []
        self.init_state_low = init_state_low
        self.init_state = []

        # Upconv as initial state generator
        self.UpconvBlock = upscaler()

        name = 'crnn_cell'
        cell = RCNNCell(
            input_channels = self.input_channels,
            hidden_channels = self.hidden_channels,
            input_kernel_size = self.input_kernel_size)

        setattr(self, name, cell)
        self._all_layers.append(cell)

    def forward(self):

        self.init_state = self.UpconvBlock(self.init_state_low)  # @init_state
        internal_state = []
        outputs = [self.init_state]
        second_last_state = []

        for step in range(self.step):
            name = 'crnn_cell'
            # all cells are initialized in the first step
            if step == 0:
                h = self.init_state
                internal_state = h

            # forward
            h = internal_state
            # hidden state + output
            h, o = getattr(self, name)(h)
            internal_state = h

            if step == (self.step - 2):
                #  last output is a dummy for central FD
                second_last_state = internal_state.clone()

            # after many layers output the result save at time step t
            if step in self.effective_step:
                outputs.append(o)

        return outputs, second_last_state


class Conv2dDerivative(nn.Module):
    def __init__(self, DerFilter, deno, kernel_size=5, name=''):
        super(Conv2dDerivative, self).__init__()
        self.deno = deno  # constant in the finite difference
        self.name = name
        self.input_channels = 1
        self.output_channels = 1
        self.kernel_size = kernel_size

        self.padding = int((kernel_size - 1) / 2)
        self.filter = nn.Conv2d(self.input_channels, self.output_channels, self.kernel_size,
            1, padding=0, bias=False)
        # Fixed gradient operator
        self.filter.weight = nn.Parameter(torch.tensor(DerFilter, dtype=torch.float32), requires_grad=False)

    def forward(self, input):
        derivative = self.filter(input)
        return derivative / self.deno


class Conv1dDerivative(nn.Module):
    def __init__(self, DerFilter, deno, kernel_size=3, name=''):
        super(Conv1dDerivative, self).__init__()

        self.deno = deno  # $\delta$*constant in the finite difference
        self.name = name
        self.input_channels = 1
        self.output_channels = 1
        self.kernel_size = kernel_size

        self.padding = int((kernel_size - 1) / 2)
        self.filter = nn.Conv1d(self.input_channels, self.output_channels, self.kernel_size,
            1, padding=0, bias=False)

        # Fixed gradient operator
        self.filter.weight = nn.Parameter(torch.tensor(DerFilter, dtype=torch.float32), requires_grad=False)

    def forward(self, input):
        derivative = self.filter(input)
        return derivative / self.deno


class loss_generator(nn.Module):
    ''' Loss generator for physics loss '''

    def __init__(self, dt = (1.0/2), dx = (1.0/100)):

        self.dt = dt
        self.dx = dx

        super(loss_generator, self).__init__()

        # spatial derivative operator
        self.laplace = Conv2dDerivative(
            DerFilter = lap_2d_op,
            deno = (dx**2),
            kernel_size = 5,
            name = 'laplace_operator')

        # temporal derivative operator
        self.dt = Conv1dDerivative(
            DerFilter = [[[-1, 1, 0]]],
            deno = (dt*1),
            kernel_size = 3,
            name = 'partial_t')

    def get_phy_Loss(self, output):  # Staggered version

        # spatial derivatives
        laplace_u = self.laplace(output[0:-2, 0:1, :, :])  # 201x1x128x128
        laplace_v = self.laplace(output[0:-2, 1:2, :, :])  # 201x1x128x128

        # temporal derivatives - u
        u = output[:, 0:1, 2:-2, 2:-2]
        lent = u.shape[0]
        lenx = u.shape[3]
        leny = u.shape[2]
        u_conv1d = u.permute(2, 3, 1, 0)  # [height(Y), width(X), c, step]
        u_conv1d = u_conv1d.reshape(lenx*leny, 1, lent)
        u_t = self.dt(u_conv1d)  # lent-2 due to no-padding
        u_t = u_t.reshape(leny, lenx, 1, lent-2)
        u_t = u_t.permute(3, 2, 0, 1)  # [step-2, c, height(Y), width(X)]

        # temporal derivatives - v
        v = output[:, 1:2, 2:-2, 2:-2]
        v_conv1d = v.permute(2, 3, 1, 0)  # [height(Y), width(X), c, step]
        v_conv1d = v_conv1d.reshape(lenx*leny, 1, lent)
        v_t = self.dt(v_conv1d)  # lent-2 due to no-padding
        v_t = v_t.reshape(leny, lenx, 1, lent-2)
        v_t = v_t.permute(3, 2, 0, 1)  # [step-2, c, height(Y), width(X)]

        u = output[0:-2, 0:1, 2:-2, 2:-2]  # [step, c, height(Y), width(X)]
        v = output[0:-2, 1:2, 2:-2, 2:-2]  # [step, c, height(Y), width(X)]

        # make sure the dimensions consistent
        assert laplace_u.shape == u_t.shape
        assert u_t.shape == v_t.shape
        assert laplace_u.shape == u.shape
        assert laplace_v.shape == v.shape

        # gray scott eqn
        Du = 2e-5
        Dv = Du/4
        f = 1/25
        k = 3/50

        f_u = (Du*laplace_u - u*(v**2) + f*(1-u) - u_t)/1
        f_v = (Dv*laplace_v + u*(v**2) - (f+k)*v - v_t)/1

        return f_u, f_v


def get_ic_loss(model):
    Upconv = model.UpconvBlock
    init_state_low = model.init_state_low
    init_state_bicubic = F.interpolate(init_state_low, (GRID, GRID), mode='bicubic')
    mse_loss = nn.MSELoss()
    init_state_pred = Upconv(init_state_low)
    loss_ic = mse_loss(init_state_pred, init_state_bicubic)
    return loss_ic


def loss_gen(output, loss_func):
    '''calculate the phycis loss'''

    # Padding x axis due to periodic boundary condition
    # shape: [27, 2, 131, 131]
    output = torch.cat((output[:, :, :, -2:], output, output[:, :, :, 0:3]), dim=3)
    output = torch.cat((output[:, :, -2:, :], output, output[:, :, 0:3, :]), dim=2)

    # get physics loss
    mse_loss = nn.MSELoss()
    f_u, f_v = loss_func.get_phy_Loss(output)
    loss = mse_loss(f_u, torch.zeros_like(f_u)) + \
           mse_loss(f_v, torch.zeros_like(f_v))
    return loss


def add_noise(truth, pec=0.05):  # BxCx101x101
    from torch.distributions import normal
    assert truth.shape[1]==2
    torch.manual_seed(66)
    uv = [truth[:,0:1,:,:], truth[:,1:2,:,:]]
    uv_noi = []
    for truth in uv:
        n_distr = normal.Normal(0.0, 1.0)
        R = n_distr.sample(truth.shape)
        std_R = torch.std(R)          # std of samples
        std_T = torch.std(truth)
        noise = R*std_T/std_R*pec
        uv_noi.append(truth+noise)
    return torch.cat(uv_noi, dim=1)


def build() -> dict:
    torch.manual_seed(66)
    np.random.seed(66)
    time_steps = 4
    dt = 0.5
    dx = 1.0/100
    UV = torch.rand(time_steps + 1, 2, GRID, GRID)
    UV = add_noise(UV, pec=0.1)
    IC = UV[0:1, :, :, :]
    truth = UV[:time_steps+1]

    time_batch_size = time_steps
    steps = time_batch_size + 1
    effective_step = list(range(0, steps))  # noqa: PIE808 (as published)
    learning_rate = 1e-3

    U0_low = IC[0, 0, ::4, ::4]
    V0_low = IC[0, 1, ::4, ::4]
    h0 = torch.cat((U0_low[None, None, ...], V0_low[None, None, ...]), dim=1)
    init_state_low = h0

    model = RCNN(
        input_channels = 2,
        hidden_channels = 8,
        init_state_low = init_state_low,
        input_kernel_size = 5,
        step = steps,
        effective_step = effective_step)

    optimizer = optim.Adam(model.parameters(), lr = learning_rate)
    scheduler = StepLR(optimizer, step_size=200, gamma=0.985)
    loss_func = loss_generator(dt, dx)
    return {"model": model, "truth": truth, "optimizer": optimizer, "scheduler": scheduler, "loss_func": loss_func,
            "train_loss_list": []}


def iteration(state: dict) -> None:
    model, truth, optimizer, scheduler, loss_func = (
        state["model"], state["truth"], state["optimizer"], state["scheduler"], state["loss_func"])
    # input: [time,. batch, channel, height, width]
    optimizer.zero_grad()
    num_time_batch = 1
    batch_loss, phy_loss, ic_loss, data_loss, val_loss = [0]*5
    # One single batch
    output, second_last_state = model()  # output is a list
    output = torch.cat(tuple(output), dim=0)
    mse_loss = nn.MSELoss()
    # 21x2x50x50
    pred, gt = output[0:-1:1, :, ::4, ::4], truth[::1, :, ::4, ::4]
    idx = int(pred.shape[0]*0.9)
    pred_tra, pred_val = pred[:idx], pred[idx:]     # prediction
    gt_tra,   gt_val   =   gt[:idx],   gt[idx:]     # ground truth
    loss_data  = mse_loss(pred_tra, gt_tra)         # data loss
    loss_valid = mse_loss(pred_val, gt_val)
    loss_ic   = get_ic_loss(model)
    # get physics loss (for validation, not used for training)
    loss_phy = loss_gen(output, loss_func)
    loss = 40*loss_data + 0.25*loss_ic
    loss.backward(retain_graph=True)  # @backward
    batch_loss += loss.item()
    phy_loss, ic_loss, data_loss, val_loss  = loss_phy.item(), loss_ic.item(), loss_data.item(), loss_valid.item()
    optimizer.step()
    scheduler.step()
    state["train_loss_list"].append(batch_loss)


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for epoch in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
