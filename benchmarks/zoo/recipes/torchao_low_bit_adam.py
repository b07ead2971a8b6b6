"""torchao's low-bit optimizer benchmark (pytorch/ao benchmarks/benchmark_low_bit_adam.py),
rebuilt: fine-tune timm's ViT-H/14 (630M parameters, 45 classes: resisc45) with bf16 autocast,
GradScaler disabled, `optim(model.parameters(), lr, weight_decay)`, a cosine LR set each step,
and `torch.cuda.max_memory_allocated()` printed at the end (what its README's table reports).

    python benchmarks/zoo/recipes/torchao_low_bit_adam.py --optim AdamW8bitAo --batch-size 8

Synthetic 224x224 images stand in for resisc45 (the same shapes after its RandomResizedCrop);
the model is built without pretrained weights (the same shapes); the validation pass after each
epoch (no_grad, lower than training) is left out.
"""

from __future__ import annotations

import argparse
import math
from functools import partial

import torch
import torch.nn.functional as F


def optimizers() -> dict:
    import bitsandbytes as bnb

    try:  # torchao >= 0.11
        from torchao import optim as low_bit_optim
    except ImportError:  # older releases
        from torchao.prototype import low_bit_optim
    return {
        "AdamW": partial(torch.optim.AdamW, fused=True),  # the README's "PyTorch (fused)"
        "AdamWForeach": torch.optim.AdamW,  # the earlier tables' "PyTorch"
        "AdamW8bitBnb": bnb.optim.AdamW8bit,
        "AdamW8bitAo": low_bit_optim.AdamW8bit,
        "AdamWFp8Ao": low_bit_optim.AdamWFp8,
        "AdamW4bitAo": low_bit_optim.AdamW4bit,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="vit_huge_patch14_224")
    parser.add_argument("--optim", default="AdamW")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--cosine-lr-scheduler", action="store_true")
    cli = parser.parse_args()

    import timm

    images = torch.randn(cli.batches * cli.batch_size, 3, 224, 224)
    labels = torch.randint(0, 45, (cli.batches * cli.batch_size,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels),
                                         batch_size=cli.batch_size, shuffle=True,
                                         pin_memory=True, drop_last=True)
    model = timm.create_model(cli.model, pretrained=False, num_classes=45).cuda()
    optim = optimizers()[cli.optim](model.parameters(), lr=cli.lr, weight_decay=cli.weight_decay)
    grad_scaler = torch.amp.GradScaler("cuda", enabled=False)
    total = len(loader)
    model.train()
    for step, (image, label) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(image.cuda()), label.cuda())
        grad_scaler.scale(loss).backward()
        if cli.cosine_lr_scheduler:
            warmup = round(total * 0.05)
            lr = (cli.lr * step / warmup if step < warmup else
                  0.5 * cli.lr * (1 + math.cos((step - warmup) / (total - warmup) * math.pi)))
            for group in optim.param_groups:  # torchao keeps lr as a device tensor
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(lr)
                else:
                    group["lr"] = lr
        grad_scaler.step(optim)
        grad_scaler.update()
        optim.zero_grad()
    print(f"Max memory used: {torch.cuda.max_memory_allocated() / 1e9:.02f} GB")


if __name__ == "__main__":
    main()
