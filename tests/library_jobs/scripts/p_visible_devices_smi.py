"""A lab script that pins itself to one GPU of a shared node and watches it: it sets
CUDA_VISIBLE_DEVICES before importing torch and then uses `cuda:0`, takes its rank from
`--local_rank` or LOCAL_RANK (`torch.cuda.set_device`), picks the device "cuda" / "mps" / "cpu",
sizes the batch from `nvidia-smi --query-gpu=memory.free` run in a subprocess, logs NVML's
memory reading when pynvml is installed, times steps with CUDA events after
`torch.cuda.synchronize()` and empties the cache every few steps."""

import argparse
import os
import subprocess

parser = argparse.ArgumentParser()
parser.add_argument("--gpu-ids", default="1")
parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--mib-per-sample", type=int, default=64)
parser.add_argument("--empty-cache-every", type=int, default=2)
args = parser.parse_args()
os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu_ids

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def free_mib_from_smi(index):
    out = subprocess.run(
        ["nvidia-smi", f"--id={index}", "--query-gpu=memory.free,memory.total,name",
         "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    free, total, name = [field.strip() for field in out.split(",")]
    print(f"nvidia-smi: {name}, {free} MiB free of {total} MiB", flush=True)
    return int(free)


def nvml_used_mib(index):
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
    pynvml.nvmlShutdown()
    return used


def main():
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device = torch.device(f"cuda:{args.local_rank}")
    elif torch.backends.mps.is_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    print(f"visible {os.environ['CUDA_VISIBLE_DEVICES']} -> {device} "
          f"({torch.cuda.device_count()} device(s))", flush=True)

    batch_size = free_mib_from_smi(args.local_rank) // args.mib_per_sample
    print(f"batch size {batch_size}", flush=True)

    model = nn.Sequential(nn.Linear(128, 256), nn.Tanh(), nn.Linear(256, 128)).to(device)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in range(args.steps):
        x = torch.randn(batch_size, 128, device=device)
        torch.cuda.synchronize()
        start.record()
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        end.record()
        torch.cuda.synchronize()
        if (step + 1) % args.empty_cache_every == 0:
            torch.cuda.empty_cache()
        nvml = nvml_used_mib(args.local_rank)
        print(f"step {step} {start.elapsed_time(end):.2f} ms, reserved "
              f"{torch.cuda.memory_reserved(device) / 2**20:.1f} MiB"
              + (f", nvml used {nvml} MiB" if nvml is not None else ""), flush=True)


if __name__ == "__main__":
    main()
