# ruff: noqa: B007  (kept as the original script writes it)
"""torchvision references/classification/train.py (with its utils.py / presets.py /
transforms.py ideas inlined): `get_args_parser`, `load_data` (ImageFolder, or FakeData with
--data-path fake), ClassificationPresetTrain / Eval, a mixup / cutmix collate
(transforms.v2.MixUp / CutMix in RandomChoice), `set_weight_decay` param groups (norm layers
without decay), SGD, label-smoothing CrossEntropyLoss, a warm-up LinearLR chained to a
CosineAnnealingLR by SequentialLR, `--amp` GradScaler, `--clip-grad-norm`, the model EMA
(`ExponentialMovingAverage(AveragedModel)` updated every --model-ema-steps), MetricLogger-style
logging, `evaluate` of the model and its EMA, `utils.save_on_master` checkpoints."""

import argparse
import datetime
import os
import time

import torch
import torch.utils.data
import torchvision
from torch import nn
from torch.utils.data.dataloader import default_collate
from torchvision.transforms import v2


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def set_weight_decay(model, weight_decay, norm_weight_decay=None):
    norm_classes = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
                    nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)
    params = {"other": [], "norm": []}
    params_weight_decay = {"other": weight_decay, "norm": norm_weight_decay}

    def _add_params(module, prefix=""):
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if norm_weight_decay is not None and isinstance(module, norm_classes):
                params["norm"].append(p)
            else:
                params["other"].append(p)
        for child_name, child_module in module.named_children():
            child_prefix = f"{prefix}.{child_name}" if prefix != "" else child_name
            _add_params(child_module, prefix=child_prefix)

    _add_params(model)
    param_groups = []
    for key in params:
        if len(params[key]) > 0:
            param_groups.append({"params": params[key], "weight_decay": params_weight_decay[key]})
    return param_groups


class ClassificationPresetTrain:
    def __init__(self, crop_size, hflip_prob=0.5):
        self.transforms = v2.Compose([
            v2.PILToTensor(), v2.RandomResizedCrop(crop_size, antialias=True),
            v2.RandomHorizontalFlip(hflip_prob), v2.ToDtype(torch.float, scale=True),
            v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), v2.ToPureTensor(),
        ])

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(self, crop_size, resize_size):
        self.transforms = v2.Compose([
            v2.PILToTensor(), v2.Resize(resize_size, antialias=True), v2.CenterCrop(crop_size),
            v2.ToDtype(torch.float, scale=True),
            v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), v2.ToPureTensor(),
        ])

    def __call__(self, img):
        return self.transforms(img)


def load_data(traindir, valdir, args):
    if args.data_path == "fake":
        size = (3, args.val_resize_size, args.val_resize_size)
        dataset = torchvision.datasets.FakeData(args.fake_size, size, args.num_classes,
                                                transform=ClassificationPresetTrain(args.train_crop_size))
        dataset_test = torchvision.datasets.FakeData(args.fake_size // 2, size, args.num_classes,
                                                     transform=ClassificationPresetEval(args.val_crop_size, args.val_resize_size))
    else:
        dataset = torchvision.datasets.ImageFolder(traindir, ClassificationPresetTrain(args.train_crop_size))
        dataset_test = torchvision.datasets.ImageFolder(valdir, ClassificationPresetEval(args.val_crop_size, args.val_resize_size))
    train_sampler = torch.utils.data.RandomSampler(dataset)
    test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    return dataset, dataset_test, train_sampler, test_sampler


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, model_ema=None, scaler=None):
    model.train()
    start_time = time.time()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        with torch.amp.autocast("cuda", enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            if args.clip_grad_norm is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if args.clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()
        if model_ema and i % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch < args.lr_warmup_epochs:
                model_ema.n_averaged.fill_(0)  # Reset ema buffer to keep copying weights during warmup period
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}] [{i}/{len(data_loader)}] loss: {loss.item():.4f} "
                  f"lr: {optimizer.param_groups[0]['lr']:.5f} img/s: {image.shape[0] / (time.time() - start_time):.1f}")
            start_time = time.time()


def evaluate(model, criterion, data_loader, device, log_suffix=""):
    model.eval()
    num_processed_samples = 0
    correct = 0
    with torch.inference_mode():
        for image, target in data_loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            criterion(output, target)
            correct += (output.argmax(1) == target).sum().item()
            num_processed_samples += image.shape[0]
    acc1 = 100.0 * correct / max(num_processed_samples, 1)
    print(f"{log_suffix} Acc@1 {acc1:.3f}")
    return acc1


def main(args):
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    print(args)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    traindir = os.path.join(args.data_path, "train")
    valdir = os.path.join(args.data_path, "val")
    dataset, dataset_test, train_sampler, test_sampler = load_data(traindir, valdir, args)

    num_classes = args.num_classes
    mixup_cutmix = []
    if args.mixup_alpha > 0:
        mixup_cutmix.append(v2.MixUp(alpha=args.mixup_alpha, num_classes=num_classes))
    if args.cutmix_alpha > 0:
        mixup_cutmix.append(v2.CutMix(alpha=args.cutmix_alpha, num_classes=num_classes))
    if mixup_cutmix:
        mixup_cutmix = v2.RandomChoice(mixup_cutmix)

        def collate_fn(batch):
            return mixup_cutmix(*default_collate(batch))
    else:
        collate_fn = default_collate

    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler,
                                              num_workers=args.workers, pin_memory=True, collate_fn=collate_fn)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler,
                                                   num_workers=args.workers, pin_memory=True)
    print("Creating model")
    model = torchvision.models.get_model(args.model, weights=args.weights, num_classes=num_classes)
    model.to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    parameters = set_weight_decay(model, args.weight_decay, norm_weight_decay=args.norm_weight_decay)
    optimizer = torch.optim.SGD(parameters, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                                nesterov="nesterov" in args.opt)
    scaler = torch.amp.GradScaler("cuda") if args.amp else None
    main_lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs - args.lr_warmup_epochs, eta_min=args.lr_min)
    if args.lr_warmup_epochs > 0:
        warmup_lr_scheduler = torch.optim.lr_scheduler.LinearLR(
            optimizer, start_factor=args.lr_warmup_decay, total_iters=args.lr_warmup_epochs)
        lr_scheduler = torch.optim.lr_scheduler.SequentialLR(
            optimizer, schedulers=[warmup_lr_scheduler, main_lr_scheduler], milestones=[args.lr_warmup_epochs])
    else:
        lr_scheduler = main_lr_scheduler
    model_without_ddp = model
    model_ema = None
    if args.model_ema:
        adjust = args.batch_size * args.model_ema_steps / args.epochs
        alpha = 1.0 - args.model_ema_decay
        alpha = min(1.0, alpha * adjust)
        model_ema = ExponentialMovingAverage(model_without_ddp, device=device, decay=1.0 - alpha)

    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, model_ema, scaler)
        lr_scheduler.step()
        evaluate(model, criterion, data_loader_test, device=device)
        if model_ema:
            evaluate(model_ema, criterion, data_loader_test, device=device, log_suffix="EMA")
        if args.output_dir:
            checkpoint = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                          "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch, "args": args}
            if model_ema:
                checkpoint["model_ema"] = model_ema.state_dict()
            if scaler:
                checkpoint["scaler"] = scaler.state_dict()
            torch.save(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            torch.save(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))
    total_time = time.time() - start_time
    print(f"Training time {datetime.timedelta(seconds=int(total_time))}")


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="PyTorch Classification Training", add_help=add_help)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str)
    parser.add_argument("--model", default="resnet18", type=str)
    parser.add_argument("--device", default="cuda", type=str)
    parser.add_argument("-b", "--batch-size", default=32, type=int)
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("-j", "--workers", default=16, type=int)
    parser.add_argument("--opt", default="sgd", type=str)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--norm-weight-decay", default=None, type=float)
    parser.add_argument("--label-smoothing", default=0.0, type=float)
    parser.add_argument("--mixup-alpha", default=0.0, type=float)
    parser.add_argument("--cutmix-alpha", default=0.0, type=float)
    parser.add_argument("--lr-warmup-epochs", default=0, type=int)
    parser.add_argument("--lr-warmup-decay", default=0.01, type=float)
    parser.add_argument("--lr-min", default=0.0, type=float)
    parser.add_argument("--print-freq", default=10, type=int)
    parser.add_argument("--output-dir", default=".", type=str)
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("--model-ema", action="store_true")
    parser.add_argument("--model-ema-steps", type=int, default=32)
    parser.add_argument("--model-ema-decay", type=float, default=0.99998)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--clip-grad-norm", default=None, type=float)
    parser.add_argument("--val-resize-size", default=256, type=int)
    parser.add_argument("--val-crop-size", default=224, type=int)
    parser.add_argument("--train-crop-size", default=224, type=int)
    parser.add_argument("--weights", default=None, type=str)
    parser.add_argument("--num-classes", default=1000, type=int)
    parser.add_argument("--fake-size", default=96, type=int)
    return parser


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
