"""Record real allocator snapshots on a GPU, to check `peakmem replay` against them.

    python benchmarks/snapshots/record.py OUT_DIR [--jobs cnn,transformer,transformer_expandable]

Each job runs in its own process (the allocator config must be set before CUDA starts), trains
a few steps with `torch.cuda.memory._record_memory_history(context=None)` on from the start (no
stack frames: small files), and writes OUT_DIR/<job>.pickle plus OUT_DIR/<job>.json with the
torch/CUDA versions, the GPU, the allocator config and torch's own max_memory_reserved/allocated.
Only torch is needed (no torchvision). Exits with a one-line message where no GPU is present.

tests/allocator/test_real_snapshots.py replays every committed pickle in
tests/data/snapshots/ and asserts the simulated peak reserved equals the recorded one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

JOBS = {
    # name: (alloc conf, model kind)
    "cnn": ("", "cnn"),
    "transformer": ("", "transformer"),
    "transformer_expandable": ("expandable_segments:True", "transformer"),
    "cnn_max_split": ("max_split_size_mb:64", "cnn"),
}


def run_job(kind: str, out: Path, name: str, steps: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "cnn":
        layers: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128, 256):
            layers += [
                nn.Conv2d(channels, width, 3, padding=1),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            channels = width
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
        make_batch = lambda: (torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,)))  # noqa: E731
        optimizer_cls = torch.optim.SGD
        opt_kwargs = {"lr": 0.01, "momentum": 0.9}
    else:
        layer = nn.TransformerEncoderLayer(256, 4, 1024, 0.1, batch_first=True)
        model = nn.Sequential(nn.Embedding(1000, 256), nn.TransformerEncoder(layer, 4))
        head = nn.Linear(256, 1000)
        model = nn.Sequential(model, head)
        make_batch = lambda: (torch.randint(0, 1000, (16, 128)), torch.randint(0, 1000, (16, 128)))  # noqa: E731
        optimizer_cls = torch.optim.AdamW
        opt_kwargs = {"lr": 1e-4}

    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=1_000_000
    )
    model = model.cuda()
    optimizer = optimizer_cls(model.parameters(), **opt_kwargs)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = make_batch()
        x, y = x.cuda(), y.cuda()
        optimizer.zero_grad()
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        loss.item()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(out / f"{name}.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    facts = {
        "job": name,
        "kind": kind,
        "steps": steps,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
    }
    (out / f"{name}.json").write_text(json.dumps(facts, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        run_job(JOBS[args.child][1], args.out, args.child, args.steps)
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("record.py: no CUDA GPU here; run it on a machine with one")
    for name in args.jobs.split(","):
        if name not in JOBS:
            sys.exit(f"record.py: unknown job {name!r}; known: {', '.join(JOBS)}")
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=JOBS[name][0])
        cmd = [sys.executable, __file__, str(args.out), "--child", name, "--steps", str(args.steps)]
        print(f"recording {name} ...", flush=True)
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
