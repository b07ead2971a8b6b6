"""An image classifier trained the NVIDIA apex / DALI-examples way: a `data_prefetcher` that
copies the next batch on a side `torch.cuda.Stream` (`wait_stream`, `record_stream`), a
DataLoader with worker processes (`num_workers=2`, `persistent_workers`, `pin_memory`,
`prefetch_factor`, `worker_init_fn`, start method "spawn"), the deprecated
`torch.cuda.amp.autocast()` / `GradScaler()`, CUDA events for timing, `torch.profiler` with a
schedule around the steps, NVTX ranges, tqdm and logging to a file."""

import argparse
import logging
import multiprocessing
import os
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

MEAN = torch.tensor([0.485 * 255, 0.456 * 255, 0.406 * 255]).view(1, 3, 1, 1)
STD = torch.tensor([0.229 * 255, 0.224 * 255, 0.225 * 255]).view(1, 3, 1, 1)


class RandomImages(Dataset):
    """uint8 HWC images as a JPEG decoder gives them, and labels."""

    def __init__(self, n, size, classes):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        image = rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8)
        return torch.from_numpy(image).permute(2, 0, 1).contiguous(), int(i % self.classes)


def seed_worker(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


class data_prefetcher:  # noqa: N801 (apex's name)
    def __init__(self, loader):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()
        self.mean = MEAN.cuda()
        self.std = STD.cuda()
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            self.next_input = self.next_input.cuda(non_blocking=True)
            self.next_target = self.next_target.cuda(non_blocking=True)
            self.next_input = self.next_input.float()
            self.next_input = self.next_input.sub_(self.mean).div_(self.std)

    def next(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        input, target = self.next_input, self.next_target
        if input is not None:
            input.record_stream(torch.cuda.current_stream())
        if target is not None:
            target.record_stream(torch.cuda.current_stream())
        self.preload()
        return input, target


def make_model(width, classes):
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--log-dir", default="runs/prefetch")
    args = parser.parse_args()

    os.makedirs(args.log_dir, exist_ok=True)
    logging.basicConfig(filename=os.path.join(args.log_dir, "train.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("train")
    torch.backends.cudnn.benchmark = True

    classes = 10
    loader = DataLoader(RandomImages(args.samples, args.image_size, classes),
                        batch_size=args.batch_size, shuffle=True, num_workers=2,
                        pin_memory=True, persistent_workers=True, prefetch_factor=2,
                        worker_init_fn=seed_worker, drop_last=True)
    model = make_model(args.width, classes).cuda().to(memory_format=torch.channels_last)
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    scaler = torch.cuda.amp.GradScaler()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    trace_dir = os.path.join(args.log_dir, "profile")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        schedule=schedule,
        on_trace_ready=torch.profiler.tensorboard_trace_handler(trace_dir),
        record_shapes=True, profile_memory=True,
    ) as prof:
        for epoch in range(args.epochs):
            model.train()
            prefetcher = data_prefetcher(loader)
            images, target = prefetcher.next()
            step = 0
            bar = tqdm(total=len(loader), desc=f"epoch {epoch}")
            while images is not None:
                torch.cuda.nvtx.range_push(f"step {step}")
                start.record()
                with torch.cuda.amp.autocast():
                    output = model(images.contiguous(memory_format=torch.channels_last))
                    loss = criterion(output, target)
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                end.record()
                torch.cuda.nvtx.range_pop()
                prof.step()
                torch.cuda.synchronize()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}", ms=f"{start.elapsed_time(end):.1f}")
                log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
                images, target = prefetcher.next()
                step += 1
            bar.close()
            log.info("epoch %d done, max allocated %.1f MiB", epoch,
                     torch.cuda.max_memory_allocated() / 2**20)
    print(f"done: {step} steps per epoch", flush=True)


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)
    main()
