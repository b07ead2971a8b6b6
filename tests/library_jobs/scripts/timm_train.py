"""timm train.py style: create_model, channels_last, AMP (float16 autocast + GradScaler),
grad checkpointing, an EMA of the weights (ModelEmaV3), evaluation of model and EMA at the end."""

import argparse
from contextlib import suppress
from functools import partial

import timm
import timm.utils
import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--amp", action="store_true", default=True)
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    parser.add_argument("--channels-last", action="store_true", default=True)
    parser.add_argument("--grad-checkpointing", action="store_true", default=True)
    parser.add_argument("--model-ema", action="store_true", default=True)
    parser.add_argument("--no-model-ema", dest="model_ema", action="store_false")
    parser.add_argument("--model-ema-decay", type=float, default=0.9998)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(enable=True)
    model.to(device=device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    amp_autocast = suppress
    loss_scaler = None
    if args.amp:
        amp_autocast = partial(torch.autocast, device_type=device.type, dtype=torch.float16)
        loss_scaler = torch.amp.GradScaler("cuda")
    model_ema = None
    if args.model_ema:
        model_ema = timm.utils.ModelEmaV3(model, decay=args.model_ema_decay)

    train_loss_fn = nn.CrossEntropyLoss().to(device=device)
    model.train()
    for step in range(args.steps):
        input = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
        target = torch.randint(0, args.num_classes, (args.batch_size,))
        input, target = input.to(device), target.to(device)
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            output = model(input)
            loss = train_loss_fn(output, target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler.scale(loss).backward()
            loss_scaler.step(optimizer)
            loss_scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if model_ema is not None:
            model_ema.update(model, step=step)
        torch.cuda.synchronize()
        print(f"step {step} loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad(), amp_autocast():
        input = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
        for m in (model, model_ema.module if model_ema is not None else None):
            if m is not None:
                m(input.contiguous(memory_format=torch.channels_last))


if __name__ == "__main__":
    main()
