"""The PyTorch tutorial "What is torch.nn really?" style: no torch.optim, the update written by
hand under torch.no_grad() (`p -= p.grad * lr`), then model.zero_grad()."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Mnist_Logistic(nn.Module):
    def __init__(self, hidden=256):
        super().__init__()
        self.lin1 = nn.Linear(784, hidden)
        self.lin2 = nn.Linear(hidden, 10)

    def forward(self, xb):
        return self.lin2(F.relu(self.lin1(xb)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--n", type=int, default=320)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    x_train = torch.randn(args.n, 784)
    y_train = torch.randint(0, 10, (args.n,))
    model = Mnist_Logistic().to(dev)
    loss_func = F.cross_entropy

    for _epoch in range(args.epochs):
        for i in range((args.n - 1) // args.bs + 1):
            start_i = i * args.bs
            xb = x_train[start_i : start_i + args.bs].to(dev)
            yb = y_train[start_i : start_i + args.bs].to(dev)
            loss = loss_func(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= p.grad * args.lr
                model.zero_grad()
    print(loss_func(model(xb), yb).item())


if __name__ == "__main__":
    main()
