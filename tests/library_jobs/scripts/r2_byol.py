"""BYOL (lucidrains/byol-pytorch style) with a SimCLR-style two-view augmentation: an online
network (encoder + projector MLP) and predictor, a target network made by `copy.deepcopy` with
`set_requires_grad(False)`, updated after each step by `EMA.update_moving_average`
(`ma_params.data = old * beta + (1 - beta) * new`), the symmetric normalised-MSE loss, Adam over
`learner.parameters()` (the target's frozen weights get no gradient), `torch.save` of the encoder."""

import argparse
import copy
from functools import wraps

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def default(val, def_val):
    return def_val if val is None else val


def singleton(cache_key):
    def inner_fn(fn):
        @wraps(fn)
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None:
                return instance
            instance = fn(self, *args, **kwargs)
            setattr(self, cache_key, instance)
            return instance
        return wrapper
    return inner_fn


def set_requires_grad(model, val):
    for p in model.parameters():
        p.requires_grad = val


def loss_fn(x, y):
    x = F.normalize(x, dim=-1, p=2)
    y = F.normalize(y, dim=-1, p=2)
    return 2 - 2 * (x * y).sum(dim=-1)


class EMA:
    def __init__(self, beta):
        self.beta = beta

    def update_average(self, old, new):
        if old is None:
            return new
        return old * self.beta + (1 - self.beta) * new


def update_moving_average(ema_updater, ma_model, current_model):
    for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters(), strict=True):
        old_weight, up_weight = ma_params.data, current_params.data
        ma_params.data = ema_updater.update_average(old_weight, up_weight)


def MLP(dim, projection_size, hidden_size=4096):
    return nn.Sequential(nn.Linear(dim, hidden_size), nn.BatchNorm1d(hidden_size), nn.ReLU(inplace=True),
                         nn.Linear(hidden_size, projection_size))


class NetWrapper(nn.Module):
    def __init__(self, net, projection_size, projection_hidden_size):
        super().__init__()
        self.net = net
        self.projection_size = projection_size
        self.projection_hidden_size = projection_hidden_size
        self.projector = None

    @singleton("projector")
    def _get_projector(self, hidden):
        _, dim = hidden.shape
        return MLP(dim, self.projection_size, self.projection_hidden_size).to(hidden)

    def forward(self, x):
        representation = self.net(x)
        projector = self._get_projector(representation)
        return projector(representation), representation


class BYOL(nn.Module):
    def __init__(self, net, image_size, projection_size=256, projection_hidden_size=4096,
                 moving_average_decay=0.99, use_momentum=True):
        super().__init__()
        self.net = net
        self.augment1 = self.augment2 = lambda x: (x.flip(-1) if torch.rand(()) < 0.5 else x) + 0.1 * torch.randn_like(x)
        self.online_encoder = NetWrapper(net, projection_size, projection_hidden_size)
        self.use_momentum = use_momentum
        self.target_encoder = None
        self.target_ema_updater = EMA(moving_average_decay)
        self.online_predictor = MLP(projection_size, projection_size, projection_hidden_size)
        device = next(net.parameters()).device
        self.to(device)
        self.forward(torch.randn(2, 3, image_size, image_size, device=device))  # builds the projector

    @singleton("target_encoder")
    def _get_target_encoder(self):
        target_encoder = copy.deepcopy(self.online_encoder)
        set_requires_grad(target_encoder, False)
        return target_encoder

    def update_moving_average(self):
        assert self.use_momentum
        assert self.target_encoder is not None, "target encoder has not been created yet"
        update_moving_average(self.target_ema_updater, self.target_encoder, self.online_encoder)

    def forward(self, x):
        image_one, image_two = self.augment1(x), self.augment2(x)
        images = torch.cat((image_one, image_two), dim=0)
        online_projections, _ = self.online_encoder(images)
        online_predictions = self.online_predictor(online_projections)
        online_pred_one, online_pred_two = online_predictions.chunk(2, dim=0)
        with torch.no_grad():
            target_encoder = self._get_target_encoder() if self.use_momentum else self.online_encoder
            target_projections, _ = target_encoder(images)
            target_projections = target_projections.detach()
            target_proj_one, target_proj_two = target_projections.chunk(2, dim=0)
        loss_one = loss_fn(online_pred_one, target_proj_two.detach())
        loss_two = loss_fn(online_pred_two, target_proj_one.detach())
        return (loss_one + loss_two).mean()


def encoder(width):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=32)
parser.add_argument("--image_size", type=int, default=32)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--save", default="")
args = parser.parse_args()

resnet = encoder(args.width).cuda()
learner = BYOL(resnet, image_size=args.image_size, projection_size=64, projection_hidden_size=256)
opt = torch.optim.Adam(learner.parameters(), lr=3e-4)
loader = DataLoader(TensorDataset(torch.rand(128, 3, args.image_size, args.image_size)),
                    batch_size=args.batch_size, shuffle=True, drop_last=True)
for epoch in range(args.epochs):
    for (images,) in loader:
        loss = learner(images.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        learner.update_moving_average()
    print(f"epoch {epoch} loss {loss.item():.4f}")
if args.save:
    torch.save(resnet.state_dict(), args.save)
