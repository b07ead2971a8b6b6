"""pytorch/examples imagenet/main.py style, with the torch.cuda calls such scripts make:
set_device, cudnn.benchmark, manual_seed_all, device properties, CUDA events for timing,
torch.cuda.amp.autocast, a side stream for prefetching, memory statistics and empty_cache."""

import argparse
import time

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


def make_model(width=32, classes=10):
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
    torch.cuda.set_device(args.gpu)
    props = torch.cuda.get_device_properties(args.gpu)
    print(f"Use GPU: {args.gpu} ({props.name}, {props.total_memory / 2**30:.0f} GiB, "
          f"sm_{props.major}{props.minor}, {torch.cuda.current_device()})")
    cudnn.benchmark = True

    model = make_model().cuda(args.gpu)
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler()
    side = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    losses = AverageMeter()

    model.train()
    t0 = time.time()
    for i in range(args.steps):
        images = torch.randn(args.batch_size, 3, 32, 32).pin_memory()
        target = torch.randint(0, 10, (args.batch_size,)).pin_memory()
        with torch.cuda.stream(side):
            images = images.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        start.record()
        with torch.cuda.amp.autocast():
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        end.record()
        torch.cuda.synchronize()
        losses.update(loss.item(), images.size(0))
        print(f"[{i}] loss {losses.sum / losses.count:.3f} step {start.elapsed_time(end):.1f} ms "
              f"mem {torch.cuda.memory_allocated() / 2**20:.1f} MiB "
              f"(reserved {torch.cuda.memory_reserved() / 2**20:.1f} MiB)")
    print(f"{time.time() - t0:.1f}s, peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
    print(torch.cuda.memory_summary(abbreviated=True)[:200])
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
