"""Lightning Fabric: launch, setup(model, optimizer), setup_dataloaders, fabric.backward."""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--precision", default="bf16-mixed")
    args = parser.parse_args()

    fabric = L.Fabric(accelerator="cuda", devices=1, precision=args.precision)
    fabric.launch()
    fabric.seed_everything(0)

    model = nn.Sequential(
        nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    data = TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=args.batch_size))

    model.train()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        fabric.print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
