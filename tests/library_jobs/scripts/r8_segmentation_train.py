"""pytorch/vision references/segmentation/train.py (with its transforms.py, presets.py and
utils.py ideas inlined), on a local folder of images and PNG masks instead of COCO / VOC:
`torchvision.models.get_model(args.model, weights=None, weights_backbone=None,
num_classes=..., aux_loss=args.aux_loss)` (fcn_resnet50: a dilated ResNet-50 backbone through
IntermediateLayerGetter, an FCNHead and an auxiliary head), paired (image, mask) transforms
(RandomResize, RandomHorizontalFlip, RandomCrop padding masks with 255, PILToTensor, ToDtype,
Normalize), `criterion` (cross_entropy with ignore_index=255, out + 0.5 * aux), SGD over the
backbone / classifier / aux_classifier parameter groups (the aux group at 10x lr), a
PolynomialLR, `--amp` GradScaler, and `evaluate()` under inference_mode with
`ConfusionMatrix` (a masked `bincount` of the predictions) after each epoch."""

import argparse
import random
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
import torchvision
from PIL import Image
from torch import nn
from torchvision.transforms import functional as F


# transforms.py -----------------------------------------------------------------------------------
def pad_if_smaller(img, size, fill=0):
    min_size = min(img.size)
    if min_size < size:
        ow, oh = img.size
        padh = size - oh if oh < size else 0
        padw = size - ow if ow < size else 0
        img = F.pad(img, (0, 0, padw, padh), fill=fill)
    return img


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for t in self.transforms:
            image, target = t(image, target)
        return image, target


class RandomResize:
    def __init__(self, min_size, max_size=None):
        self.min_size = min_size
        self.max_size = max_size if max_size is not None else min_size

    def __call__(self, image, target):
        size = random.randint(self.min_size, self.max_size)
        image = F.resize(image, size, antialias=True)
        target = F.resize(target, size, interpolation=F.InterpolationMode.NEAREST)
        return image, target


class RandomHorizontalFlip:
    def __init__(self, flip_prob):
        self.flip_prob = flip_prob

    def __call__(self, image, target):
        if random.random() < self.flip_prob:
            image, target = F.hflip(image), F.hflip(target)
        return image, target


class RandomCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image, target):
        image = pad_if_smaller(image, self.size)
        target = pad_if_smaller(target, self.size, fill=255)
        crop_params = torchvision.transforms.RandomCrop.get_params(image, (self.size,
                                                                           self.size))
        return F.crop(image, *crop_params), F.crop(target, *crop_params)


class PILToTensor:
    def __call__(self, image, target):
        image = F.pil_to_tensor(image)
        target = torch.as_tensor(np.array(target), dtype=torch.int64)
        return image, target


class ToDtype:
    def __init__(self, dtype, scale=False):
        self.dtype, self.scale = dtype, scale

    def __call__(self, image, target):
        if not self.scale:
            return image.to(dtype=self.dtype), target
        return F.convert_image_dtype(image, self.dtype), target


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, image, target):
        return F.normalize(image, mean=self.mean, std=self.std), target


# presets.py --------------------------------------------------------------------------------------
def get_transform(is_train, base_size, crop_size):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    if is_train:
        trans = [RandomResize(int(0.5 * base_size), int(2.0 * base_size)),
                 RandomHorizontalFlip(0.5), RandomCrop(crop_size)]
    else:
        trans = [RandomResize(base_size, base_size)]
    trans += [PILToTensor(), ToDtype(torch.float, scale=True), Normalize(mean=mean, std=std)]
    return Compose(trans)


class SegmentationFolder(torch.utils.data.Dataset):
    """images/NAME.png with masks/NAME.png (class ids, 255 = ignore)."""

    def __init__(self, root, transforms):
        self.images = sorted((Path(root) / "images").glob("*.png"))
        self.masks = [Path(root) / "masks" / p.name for p in self.images]
        self.transforms = transforms

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = Image.open(self.images[i]).convert("RGB")
        return self.transforms(image, Image.open(self.masks[i]))


def collate_fn(batch):
    images, targets = list(zip(*batch, strict=True))
    return cat_list(images, fill_value=0), cat_list(targets, fill_value=255)


def cat_list(images, fill_value=0):
    max_size = tuple(max(s) for s in zip(*[img.shape for img in images], strict=True))
    batch_shape = (len(images),) + max_size
    batched_imgs = images[0].new(*batch_shape).fill_(fill_value)
    for img, pad_img in zip(images, batched_imgs, strict=True):
        pad_img[..., : img.shape[-2], : img.shape[-1]].copy_(img)
    return batched_imgs


# utils.py ----------------------------------------------------------------------------------------
class ConfusionMatrix:
    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.mat = None

    def update(self, a, b):
        n = self.num_classes
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64, device=a.device)
        with torch.inference_mode():
            k = (a >= 0) & (a < n)
            inds = n * a[k].to(torch.int64) + b[k]
            self.mat += torch.bincount(inds, minlength=n**2).reshape(n, n)

    def compute(self):
        h = self.mat.float()
        acc_global = torch.diag(h).sum() / h.sum()
        acc = torch.diag(h) / h.sum(1)
        iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
        return acc_global, acc, iu

    def __str__(self):
        acc_global, acc, iu = self.compute()
        return (f"global correct: {acc_global.item() * 100:.1f}\n"
                f"average row correct: {[f'{i:.1f}' for i in (acc * 100).tolist()]}\n"
                f"mean IoU: {iu.mean().item() * 100:.1f}")


# train.py ----------------------------------------------------------------------------------------
def criterion(inputs, target):
    losses = {}
    for name, x in inputs.items():
        losses[name] = nn.functional.cross_entropy(x, target, ignore_index=255)
    if len(losses) == 1:
        return losses["out"]
    return losses["out"] + 0.5 * losses["aux"]


def evaluate(model, data_loader, device, num_classes):
    model.eval()
    confmat = ConfusionMatrix(num_classes)
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            output = model(image)["out"]
            confmat.update(target.flatten(), output.argmax(1).flatten())
    return confmat


def train_one_epoch(model, criterion, optimizer, data_loader, lr_scheduler, device, epoch,
                    print_freq, scaler=None):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        with torch.cuda.amp.autocast(enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        lr_scheduler.step()
        if i % print_freq == 0:
            print(f"Epoch: [{epoch}] [{i}/{len(data_loader)}] loss: {loss.item():.4f} "
                  f"lr: {optimizer.param_groups[0]['lr']:.6f}")


def main(args):
    device = torch.device(args.device)
    dataset = SegmentationFolder(args.data_path, get_transform(True, args.base_size,
                                                               args.crop_size))
    dataset_test = SegmentationFolder(args.data_path, get_transform(False, args.base_size,
                                                                    args.crop_size))
    data_loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, sampler=torch.utils.data.RandomSampler(dataset),
        num_workers=args.workers, collate_fn=collate_fn, drop_last=True)
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test, batch_size=1, sampler=torch.utils.data.SequentialSampler(dataset_test),
        num_workers=args.workers, collate_fn=collate_fn)

    model = torchvision.models.get_model(args.model, weights=None, weights_backbone=None,
                                         num_classes=args.num_classes, aux_loss=args.aux_loss)
    model.to(device)
    params_to_optimize = [
        {"params": [p for p in model.backbone.parameters() if p.requires_grad]},
        {"params": [p for p in model.classifier.parameters() if p.requires_grad]},
    ]
    if args.aux_loss:
        params = [p for p in model.aux_classifier.parameters() if p.requires_grad]
        params_to_optimize.append({"params": params, "lr": args.lr * 10})
    optimizer = torch.optim.SGD(params_to_optimize, lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    iters_per_epoch = len(data_loader)
    lr_scheduler = torch.optim.lr_scheduler.PolynomialLR(
        optimizer, total_iters=iters_per_epoch * args.epochs, power=0.9)

    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, lr_scheduler, device, epoch,
                        args.print_freq, scaler)
        confmat = evaluate(model, data_loader_test, device=device, num_classes=args.num_classes)
        print(confmat)


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Segmentation Training")
    parser.add_argument("--data-path", required=True, type=str)
    parser.add_argument("--model", default="fcn_resnet50", type=str)
    parser.add_argument("--aux-loss", action="store_true")
    parser.add_argument("--num-classes", default=4, type=int)
    parser.add_argument("--device", default="cuda", type=str)
    parser.add_argument("-b", "--batch-size", default=2, type=int)
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("-j", "--workers", default=0, type=int)
    parser.add_argument("--lr", default=0.01, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--print-freq", default=2, type=int)
    parser.add_argument("--base-size", default=40, type=int)
    parser.add_argument("--crop-size", default=32, type=int)
    parser.add_argument("--amp", action="store_true")
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
