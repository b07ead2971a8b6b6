# ruff: noqa: UP031, UP032, B905  (kept as the original script writes it)
"""MoCo v2 (facebookresearch/moco main_moco.py + moco/builder.py style): a query encoder and a
momentum key encoder (a copy, requires_grad=False, updated in `_momentum_update_key_encoder`),
a `register_buffer` queue of keys with its pointer, `concat_all_gather` (single process: no
all_gather), batch shuffle skipped without distributed, InfoNCE over l_pos / l_neg, SGD with
momentum and weight decay, `save_checkpoint` each epoch, two augmented views per image."""

import argparse
import math
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("-j", "--workers", default=0, type=int)
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("--lr", "--learning-rate", default=0.03, type=float, dest="lr")
parser.add_argument("--schedule", default=[120, 160], nargs="*", type=int)
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int)
parser.add_argument("--gpu", default=None, type=int)
parser.add_argument("--moco-dim", default=128, type=int)
parser.add_argument("--moco-k", default=4096, type=int)
parser.add_argument("--moco-m", default=0.999, type=float)
parser.add_argument("--moco-t", default=0.07, type=float)
parser.add_argument("--mlp", action="store_true")
parser.add_argument("--cos", action="store_true")
parser.add_argument("--width", default=32, type=int)
parser.add_argument("--image-size", default=32, type=int)
parser.add_argument("--samples", default=96, type=int)
parser.add_argument("--checkpoint-dir", default=".")


class Encoder(nn.Module):
    """A small ResNet-like backbone standing in for torchvision's resnet50(num_classes=dim)."""

    def __init__(self, num_classes, width):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False, width=32):
        super().__init__()
        self.K = K
        self.m = m
        self.T = T
        self.encoder_q = base_encoder(num_classes=dim, width=width)
        self.encoder_k = base_encoder(num_classes=dim, width=width)
        if mlp:
            dim_mlp = self.encoder_q.fc.weight.shape[1]
            self.encoder_q.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.encoder_q.fc)
            self.encoder_k.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.encoder_k.fc)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = concat_all_gather(keys)
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K
        self.queue_ptr[0] = ptr

    def forward(self, im_q, im_k):
        q = self.encoder_q(im_q)
        q = nn.functional.normalize(q, dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = self.encoder_k(im_k)
            k = nn.functional.normalize(k, dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1)
        logits /= self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long).cuda()
        self._dequeue_and_enqueue(k)
        return logits, labels


@torch.no_grad()
def concat_all_gather(tensor):
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    tensors_gather = [torch.ones_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(tensors_gather, tensor, async_op=False)
    return torch.cat(tensors_gather, dim=0)


class TwoCropsTransform:
    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        return [self.base_transform(x), self.base_transform(x)]


def augment(img):
    if torch.rand(1).item() < 0.5:
        img = img.flip(-1)
    return img + 0.1 * torch.randn_like(img)


class RandomImages(Dataset):
    def __init__(self, n, size, transform):
        self.images = torch.rand(n, 3, size, size)
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), 0


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def adjust_learning_rate(optimizer, epoch, args):
    lr = args.lr
    if args.cos:
        lr *= 0.5 * (1.0 + math.cos(math.pi * epoch / args.epochs))
    else:
        for milestone in args.schedule:
            lr *= 0.1 if epoch >= milestone else 1.0
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def train(train_loader, model, criterion, optimizer, epoch, args):
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, _) in enumerate(train_loader):
        if args.gpu is not None:
            images[0] = images[0].cuda(args.gpu, non_blocking=True)
            images[1] = images[1].cuda(args.gpu, non_blocking=True)
        output, target = model(im_q=images[0], im_k=images[1])
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images[0].size(0))
        top1.update(acc1[0], images[0].size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print("Epoch [%d][%d/%d] loss %.4f (%.3fs)" % (epoch, i, len(train_loader), losses.avg, time.time() - end))
        end = time.time()


def main():
    args = parser.parse_args()
    if args.gpu is None and torch.cuda.is_available():
        args.gpu = 0
    print("=> creating model")
    model = MoCo(Encoder, args.moco_dim, args.moco_k, args.moco_m, args.moco_t, args.mlp, args.width)
    torch.cuda.set_device(args.gpu)
    model = model.cuda(args.gpu)
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    train_dataset = RandomImages(args.samples, args.image_size, TwoCropsTransform(augment))
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True,
                              num_workers=args.workers, pin_memory=True, drop_last=True)
    for epoch in range(args.epochs):
        adjust_learning_rate(optimizer, epoch, args)
        train(train_loader, model, criterion, optimizer, epoch, args)
        save_checkpoint({"epoch": epoch + 1, "arch": "encoder", "state_dict": model.state_dict(),
                         "optimizer": optimizer.state_dict()}, is_best=False,
                        filename=os.path.join(args.checkpoint_dir, "checkpoint_{:04d}.pth.tar".format(epoch)))


if __name__ == "__main__":
    main()
