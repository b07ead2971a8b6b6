"""A classifier loop as the torchmetrics README and common tutorials write it: metrics moved to
the device (`Accuracy(...).to(device)`, a MetricCollection), `update` per batch and
`compute()` / `reset()` per epoch; a tqdm bar around the DataLoader (`leave=False`,
`disable=rank != 0`, `tqdm.contrib.logging.logging_redirect_tqdm`); `random_split` and a
WeightedRandomSampler; the cuDNN / TF32 switches; CUDA-event timing and the job's own
`torch.cuda.max_memory_allocated()` print. Under torchrun: NCCL, DDP and a DistributedSampler,
and the metrics sync their states across ranks on `compute()` (`sync_on_compute`)."""

import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchmetrics
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger(__name__)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sync-on-compute", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    distributed = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    if distributed:
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    data = TensorDataset(torch.randn(160, 32), torch.randint(0, 4, (160,)))
    train_set, val_set = random_split(data, [128, 32], generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([int(data[i][1]) for i in train_set.indices])
    class_weight = 1.0 / torch.bincount(labels, minlength=4).clamp(min=1).float()
    if distributed:
        sampler = DistributedSampler(train_set, shuffle=True)
        val_sampler = DistributedSampler(val_set, shuffle=False)
    else:
        sampler = WeightedRandomSampler(class_weight[labels], num_samples=len(train_set),
                                        replacement=True)
        val_sampler = None
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    if distributed:
        model = DDP(model, device_ids=[device.index])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=4).to(device)
    val_metrics = MetricCollection({
        "acc": MulticlassAccuracy(num_classes=4, sync_on_compute=bool(args.sync_on_compute)),
        "f1": MulticlassF1Score(num_classes=4, average="macro"),
    }).to(device)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with logging_redirect_tqdm():
        for epoch in range(args.epochs):
            if distributed:
                sampler.set_epoch(epoch)
            model.train()
            start.record()
            bar = tqdm(train_loader, desc=f"epoch {epoch}", leave=False, disable=rank != 0)
            for x, y in bar:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                train_acc.update(logits, y)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            end.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(end)
            acc = train_acc.compute()
            train_acc.reset()
            model.eval()
            with torch.no_grad():
                for x, y in tqdm(val_loader, leave=False, disable=rank != 0):
                    val_metrics.update(model(x.to(device)), y.to(device))
            scores = {k: float(v) for k, v in val_metrics.compute().items()}
            val_metrics.reset()
            log.info("epoch %d: train acc %.3f val %s (%.1f ms)", epoch, float(acc), scores, elapsed)
    print(f"max memory allocated: {torch.cuda.max_memory_allocated() / 2**20:.2f} MiB")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
