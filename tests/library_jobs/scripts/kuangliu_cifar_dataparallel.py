"""kuangliu/pytorch-cifar `main.py`'s structure (a small VGG-style net in place of ResNet18,
random CIFAR-shaped tensors in place of the download): `device = 'cuda' if
torch.cuda.is_available() else 'cpu'`, `net.to(device)`, `nn.DataParallel` when the job sees more
than one GPU, `cudnn.benchmark = True`, SGD momentum + weight decay, CosineAnnealingLR,
`train(epoch)` / `test(epoch)` with `loss.item()` / `outputs.max(1)` accuracy, a checkpoint of
`net.state_dict()` when the accuracy improves."""

import argparse
import os

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch CIFAR10 Training")
parser.add_argument("--lr", default=0.1, type=float, help="learning rate")
parser.add_argument("--batch-size", default=10, type=int)
parser.add_argument("--epochs", default=1, type=int)
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
best_acc = 0


class VGGSmall(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, 10)

    def forward(self, x):
        out = self.features(x)
        return self.classifier(out.view(out.size(0), -1))


print("==> Preparing data..")
trainset = TensorDataset(torch.randn(40, 3, 32, 32), torch.randint(0, 10, (40,)))
trainloader = DataLoader(trainset, batch_size=args.batch_size, shuffle=True)
testset = TensorDataset(torch.randn(20, 3, 32, 32), torch.randint(0, 10, (20,)))
testloader = DataLoader(testset, batch_size=args.batch_size, shuffle=False)

print("==> Building model..")
net = VGGSmall()
net = net.to(device)
if device == "cuda" and torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    net = torch.nn.DataParallel(net)
    cudnn.benchmark = True

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200)


def train(epoch):
    print(f"\nEpoch: {epoch}")
    net.train()
    train_loss = correct = total = 0
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        _, predicted = outputs.max(1)
        total += targets.size(0)
        correct += predicted.eq(targets).sum().item()
        print(batch_idx, len(trainloader), f"Loss: {train_loss / (batch_idx + 1):.3f}")


def test(epoch):
    global best_acc
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for inputs, targets in testloader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = net(inputs)
            _, predicted = outputs.max(1)
            total += targets.size(0)
            correct += predicted.eq(targets).sum().item()
    acc = 100.0 * correct / total
    if acc >= best_acc:
        print("Saving..")
        state = {"net": net.state_dict(), "acc": acc, "epoch": epoch}
        os.makedirs("checkpoint", exist_ok=True)
        torch.save(state, "./checkpoint/ckpt.pth")
        best_acc = acc


for epoch in range(args.epochs):
    train(epoch)
    test(epoch)
    scheduler.step()
