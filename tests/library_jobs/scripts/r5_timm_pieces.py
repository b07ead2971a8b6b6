"""timm train.py's training pieces around a small model: `create_model`,
`resolve_data_config` + `create_transform` applied to local image files, `Mixup` with
`SoftTargetCrossEntropy`, `create_optimizer_v2` (lamb, adamp, lookahead_adamw, ...),
`create_scheduler_v2` stepped per epoch with `step_update` per batch, `NativeScaler`
(float16 autocast) and `ModelEmaV3` (on the host with `--model-ema-force-cpu`)."""

import argparse
from pathlib import Path

import timm
import torch
from PIL import Image
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, NativeScaler
from torch.utils.data import DataLoader, Dataset


class ImageFolderFlat(Dataset):
    def __init__(self, root, transform, num_classes):
        self.files = sorted(Path(root).glob("*.png"))
        self.transform = transform
        self.num_classes = num_classes

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        return self.transform(img), i % self.num_classes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--opt", default="lamb")
    parser.add_argument("--sched", default="cosine")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=4)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--model-ema-force-cpu", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda")
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes)
    data_config = resolve_data_config({"input_size": (3, args.img_size, args.img_size)}, model=model)
    transform = create_transform(**data_config, is_training=True)
    loader = DataLoader(ImageFolderFlat(args.data_dir, transform, args.num_classes),
                        batch_size=args.batch_size, shuffle=True, drop_last=True)
    model.to(device)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=1e-3, weight_decay=0.05)
    scheduler, num_epochs = create_scheduler_v2(optimizer, sched=args.sched, num_epochs=args.epochs,
                                                warmup_epochs=1, updates_per_epoch=len(loader))
    loss_scaler = NativeScaler()
    model_ema = ModelEmaV3(model, decay=0.999, device="cpu" if args.model_ema_force_cpu else None)
    mixup_fn = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1,
                     num_classes=args.num_classes)
    train_loss_fn = SoftTargetCrossEntropy().to(device)

    num_updates = 0
    for epoch in range(num_epochs):
        model.train()
        for input, target in loader:
            input, target = input.to(device), target.to(device)
            input, target = mixup_fn(input, target)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = train_loss_fn(model(input), target)
            optimizer.zero_grad()
            loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
            model_ema.update(model, step=num_updates)
            num_updates += 1
            scheduler.step_update(num_updates=num_updates)
        scheduler.step(epoch + 1)
        print(f"epoch {epoch} loss {loss.item():.3f} lr {optimizer.param_groups[0]['lr']:.2e}")


if __name__ == "__main__":
    main()
