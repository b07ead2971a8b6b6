# ruff: noqa: UP031, UP032, B007, SIM102  (kept as the original script writes it)
"""pytorch/examples mnist_hogwild/main.py + train.py style: model.share_memory(), one
torch.multiprocessing Process per worker running its own train loop on the same model."""

import argparse
import os

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch MNIST Hogwild Example")
parser.add_argument("--batch-size", type=int, default=64, metavar="N")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
parser.add_argument("--epochs", type=int, default=1, metavar="N")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M")
parser.add_argument("--seed", type=int, default=1, metavar="S")
parser.add_argument("--log-interval", type=int, default=10, metavar="N")
parser.add_argument("--num-processes", type=int, default=2, metavar="N")
parser.add_argument("--cuda", action="store_true", default=False)
parser.add_argument("--dry-run", action="store_true", default=False)
parser.add_argument("--samples", type=int, default=256)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def dataset(n):
    return TensorDataset(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)))


def train(rank, args, model, device, dataset, dataloader_kwargs):
    torch.manual_seed(args.seed + rank)
    train_loader = DataLoader(dataset, **dataloader_kwargs)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch, args, model, device, train_loader, optimizer)


def train_epoch(epoch, args, model, device, data_loader, optimizer):
    model.train()
    pid = os.getpid()
    for batch_idx, (data, target) in enumerate(data_loader):
        optimizer.zero_grad()
        output = model(data.to(device))
        loss = F.nll_loss(output, target.to(device))
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print("{}\tTrain Epoch: {} [{}/{}]\tLoss: {:.6f}".format(
                pid, epoch, batch_idx * len(data), len(data_loader.dataset), loss.item()))
            if args.dry_run:
                break


def test(args, model, device, dataset, dataloader_kwargs):
    torch.manual_seed(args.seed)
    test_loader = DataLoader(dataset, **dataloader_kwargs)
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data.to(device))
            test_loss += F.nll_loss(output, target.to(device), reduction="sum").item()
            pred = output.max(1)[1]
            correct += pred.eq(target.to(device)).sum().item()
    test_loss /= len(test_loader.dataset)
    print("Test set: Average loss: {:.4f}, Accuracy: {}/{}".format(test_loss, correct, len(test_loader.dataset)))


if __name__ == "__main__":
    args = parser.parse_args()
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    train_set = dataset(args.samples)
    test_set = dataset(args.samples // 4)
    kwargs = {"batch_size": args.batch_size, "shuffle": True}
    if use_cuda:
        kwargs.update({"num_workers": 1, "pin_memory": True})

    torch.manual_seed(args.seed)
    mp.set_start_method("spawn", force=True)

    model = Net().to(device)
    model.share_memory()  # gradients are allocated lazily, so they are not shared here

    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(target=train, args=(rank, args, model, device, train_set, kwargs))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()

    test(args, model, device, test_set, kwargs)
