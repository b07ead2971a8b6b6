"""timm train.py's data path: `create_dataset("", root=..., split="train")` over an ImageFolder
tree, `create_loader(..., is_training=True, use_prefetcher=True, re_prob=0.25, ...)` (timm's
PrefetchLoader: a side CUDA stream, `.cuda(non_blocking=True)`, normalisation and
RandomErasing on the device), `resolve_data_config(vars(args), model=model)`, then a step
per batch with `create_optimizer_v2` and `NativeScaler`."""

import argparse

import timm
import torch
from timm.data import create_dataset, create_loader, resolve_data_config
from timm.optim import create_optimizer_v2
from timm.utils import NativeScaler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--num-classes", type=int, default=3)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("-b", "--batch-size", type=int, default=2)
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--reprob", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = timm.create_model(args.model, num_classes=args.num_classes)
    model.to(device)
    data_config = resolve_data_config({"input_size": (3, args.img_size, args.img_size)}, model=model)
    dataset_train = create_dataset("", root=args.data_dir, split="train", is_training=True)
    loader_train = create_loader(
        dataset_train, input_size=data_config["input_size"], batch_size=args.batch_size,
        is_training=True, use_prefetcher=True, re_prob=args.reprob, re_mode="pixel",
        mean=data_config["mean"], std=data_config["std"], num_workers=args.workers,
        device=device,
    )
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    loss_scaler = NativeScaler()
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        model.train()
        batches = 0
        for input, target in loader_train:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(input), target)
            optimizer.zero_grad()
            loss_scaler(loss, optimizer)
            batches += 1
        torch.cuda.synchronize()
        print(f"epoch {epoch}: {batches} batches, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
