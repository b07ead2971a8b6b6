"""Train a small MLP classifier on random data: a plain PyTorch training loop.

Run it for real with `python -m peakmem.examples.mlp_train`, or estimate its peak GPU memory
without a GPU with `peakmem estimate --gpu h100-80gb -- python -m peakmem.examples.mlp_train`.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build_model(in_features: int, hidden: int, depth: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(0.1)]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--in-features", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.in_features, args.hidden, args.depth, args.classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = TensorDataset(
        torch.randn(args.samples, args.in_features),
        torch.randint(0, args.classes, (args.samples,)),
    )
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, pin_memory=True)

    for epoch in range(args.epochs):
        for step, (inputs, targets) in enumerate(loader):
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    if device.type == "cuda":
        print(f"max memory allocated: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
