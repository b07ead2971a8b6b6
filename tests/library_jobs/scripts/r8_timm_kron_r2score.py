"""A regression loop with timm's optimizer factory and torchmetrics' regression metrics:
`create_optimizer_v2(model, opt="kron")` (timm train.py `--opt kron`: PSGD with one Kronecker
factor per dimension of each weight, `state["Q"]`, whose spectral-norm bound indexes with a
device scalar, `A[j]`), a per-batch `step_update` scheduler, and `R2Score` +
`MeanSquaredError` updated per batch and computed after each epoch (R2Score's compute writes
`raw_scores[cond]` with `cond` a 0-d bool)."""

import argparse

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError, MetricCollection
from torchmetrics.regression import R2Score


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt", default="kron")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=48)
    args = parser.parse_args()

    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(128, 24)
    y = x[:, :3].sum(dim=1, keepdim=True) + 0.1 * torch.randn(128, 1)
    train = DataLoader(TensorDataset(x[:96], y[:96]), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[96:], y[96:]), batch_size=args.batch_size)

    model = nn.Sequential(nn.Linear(24, args.hidden), nn.GELU(), nn.Linear(args.hidden, 1))
    model.to(device)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=1e-3, weight_decay=0.01)
    scheduler, num_epochs = create_scheduler_v2(optimizer, sched="cosine", num_epochs=args.epochs,
                                                updates_per_epoch=len(train))
    metrics = MetricCollection({"r2": R2Score(), "mse": MeanSquaredError()}).to(device)

    num_updates = 0
    for epoch in range(num_epochs):
        model.train()
        for xb, yb in train:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            num_updates += 1
            scheduler.step_update(num_updates=num_updates)
        scheduler.step(epoch + 1)
        model.eval()
        with torch.no_grad():
            for xb, yb in val:
                xb, yb = xb.to(device), yb.to(device)
                metrics.update(model(xb).squeeze(-1), yb.squeeze(-1))
        scores = {name: round(value.item(), 3) for name, value in metrics.compute().items()}
        metrics.reset()
        print(f"epoch {epoch} loss {loss.item():.3f} val {scores}")


if __name__ == "__main__":
    main()
