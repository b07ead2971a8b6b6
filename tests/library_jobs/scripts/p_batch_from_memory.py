"""A script that sizes itself from the GPU it finds, the way many research scripts do:
`--local_rank` / LOCAL_RANK and `torch.cuda.set_device`, the batch size from
`get_device_properties(0).total_memory` (or `mem_get_info()`), a try/except
`torch.cuda.OutOfMemoryError` loop that halves the batch, cudnn flags and deterministic
algorithms with CUBLAS_WORKSPACE_CONFIG, `reset_peak_memory_stats()` with
`max_memory_allocated()` / `memory_summary()` each epoch and `empty_cache()` every N steps."""

import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

GiB = 2**30
FEATURES, HIDDEN, CLASSES = 256, 512, 10


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", "--local-rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--samples-per-gib", type=int, default=64,
                        help="batch size = this x the GPU's memory in GiB")
    parser.add_argument("--size-from", choices=["properties", "mem_get_info"], default="properties")
    parser.add_argument("--empty-cache-every", type=int, default=2)
    return parser.parse_args()


def batch_size_for_gpu(args) -> int:
    if args.size_from == "properties":
        total = torch.cuda.get_device_properties(0).total_memory
    else:
        free, total = torch.cuda.mem_get_info()
        total = free
    return args.samples_per_gib * int(total // GiB)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def train_step(model, optimizer, batch_size, device):
    x = torch.randn(batch_size, FEATURES, device=device)
    y = torch.randint(0, CLASSES, (batch_size,), device=device)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def main():
    args = parse_args()
    torch.cuda.set_device(args.local_rank)
    device = torch.device("cuda", args.local_rank)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    props = torch.cuda.get_device_properties(0)
    batch_size = batch_size_for_gpu(args)
    print(f"rank {args.local_rank}: {props.name} {props.total_memory / GiB:.1f} GiB "
          f"-> batch size {batch_size}", flush=True)

    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # probe the batch size: halve it until a step fits
    while batch_size >= 1:
        try:
            train_step(model, optimizer, batch_size, device)
            break
        except torch.cuda.OutOfMemoryError:
            print(f"OOM at batch size {batch_size}, halving", flush=True)
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            batch_size //= 2
    print(f"training with batch size {batch_size}", flush=True)

    step = 0
    for epoch in range(args.epochs):
        torch.cuda.reset_peak_memory_stats()
        for _ in range(args.steps_per_epoch):
            loss = train_step(model, optimizer, batch_size, device)
            step += 1
            if step % args.empty_cache_every == 0:
                torch.cuda.empty_cache()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device)
        print(f"epoch {epoch} loss {loss.item():.4f} peak {peak / 2**20:.1f} MiB", flush=True)
        print(torch.cuda.memory_summary(device, abbreviated=True).splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
