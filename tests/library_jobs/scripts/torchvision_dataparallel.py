"""torchvision resnet18 wrapped in nn.DataParallel (on one GPU, as many old scripts still do)."""

import argparse

import torch
import torch.nn as nn
import torchvision


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--img-size", type=int, default=32)
    args = parser.parse_args()

    model = torchvision.models.resnet18(num_classes=10)
    model = nn.DataParallel(model).cuda()
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    for i in range(args.steps):
        images = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
        target = torch.randint(0, 10, (args.batch_size,))
        images = images.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(i, loss.item())


if __name__ == "__main__":
    main()
