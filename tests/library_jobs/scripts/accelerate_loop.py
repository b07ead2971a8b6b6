"""The accelerate README loop: Accelerator() + prepare(model, optimizer, dataloader) + backward."""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, d_in=128, hidden=512, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(args.samples, 128), torch.randint(0, 10, (args.samples,)))
    dataloader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)

    model.train()
    for _epoch in range(args.epochs):
        for inputs, targets in dataloader:
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = F.cross_entropy(outputs, targets)
            accelerator.backward(loss)
            optimizer.step()
    accelerator.print(f"device {accelerator.device} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
