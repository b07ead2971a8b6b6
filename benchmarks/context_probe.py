"""Measure the CUDA context and library memory of this GPU + driver + CUDA + torch: the device
memory a process uses outside PyTorch's caching allocator, after each first use of a library.

    PYTHONPATH=src python benchmarks/context_probe.py [--gpu h200] [--out FILE]

Writes benchmarks/groundtruth/<gpu>_context.json: one entry per stage (bare context after init,
after the first kernel, the first fp32/bf16 matmul, the first convolution forward and backward,
the first SDPA forward and backward, the first fused optimizer step), each with the process's
used memory (NVML), torch's reserved/allocated bytes and `outside_allocator_bytes` = used -
reserved. Each module-loading mode (lazy, eager) runs in its own fresh process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Stage = Callable[[Any, dict], None]  # (torch, scratch space kept alive between stages)
STAGES: dict[str, Stage] = {}


def stage(name: str) -> Callable[[Stage], Stage]:
    def register(fn: Stage) -> Stage:
        if name in STAGES:
            raise ValueError(f"stage {name!r} registered twice")
        STAGES[name] = fn
        return fn

    return register


@stage("context")
def _context(torch, keep):
    torch.cuda.init()
    torch.cuda.synchronize()  # creates the primary context, loads no kernel of torch's


@stage("first_kernel")
def _first_kernel(torch, keep):
    keep["x"] = torch.zeros(1, device="cuda")  # one allocation, one fill kernel


@stage("matmul_fp32")
def _matmul(torch, keep):
    a = torch.randn(1024, 1024, device="cuda")
    keep["mm"] = a @ a  # cuBLAS handle + workspace (through the allocator) + kernels


@stage("matmul_bf16")
def _matmul_bf16(torch, keep):
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    keep["mm16"] = torch.nn.functional.linear(a, a, a[0])  # cuBLASLt epilogue path


@stage("conv_forward")
def _conv(torch, keep):
    x = torch.randn(8, 64, 56, 56, device="cuda", requires_grad=True)
    w = torch.randn(64, 64, 3, 3, device="cuda", requires_grad=True)
    keep["conv"] = (x, w, torch.nn.functional.conv2d(x, w, padding=1))


@stage("conv_backward")
def _conv_backward(torch, keep):
    x, w, y = keep["conv"]
    y.sum().backward()


@stage("sdpa_forward")
def _sdpa(torch, keep):
    q = torch.randn(4, 8, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    keep["sdpa"] = (q, torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))


@stage("sdpa_backward")
def _sdpa_backward(torch, keep):
    q, out = keep["sdpa"]
    out.float().sum().backward()


@stage("adamw_step")
def _adamw(torch, keep):
    p = torch.nn.Parameter(torch.randn(1024, 1024, device="cuda"))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p])
    opt.step()
    keep["opt"] = (p, opt)


def run_stages(probe, torch, stages: dict[str, Stage]) -> list[dict[str, Any]]:
    """Run each stage, synchronize, and record memory after it."""
    keep: dict = {}
    records = []
    for name, fn in stages.items():
        fn(torch, keep)
        probe.synchronize()
        used = probe.sample_used()
        reserved = probe.reserved_bytes()
        records.append({
            "stage": name,
            "used_bytes": used.used_bytes,
            "reserved_bytes": reserved,
            "allocated_bytes": int(torch.cuda.memory_allocated()),
            "outside_allocator_bytes": used.used_bytes - reserved,
            "source": used.source,
        })  # fmt: skip
    return records


def probe_this_process() -> dict[str, Any]:
    import torch

    from peakmem.measure.cuda_probe import CudaProbe

    probe = CudaProbe(0)
    reason = probe.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"context_probe: no CUDA GPU: {reason}")
    probe.mark_baseline()
    records = run_stages(probe, torch, STAGES)
    info = probe.info()
    probe.close()
    return {
        "module_loading": os.environ.get("CUDA_MODULE_LOADING", "(torch default: LAZY)"),
        "gpu": info.gpu,
        "driver": info.driver,
        "cuda": info.cuda,
        "torch": info.torch,
        "cudnn": str(torch.backends.cudnn.version()),
        "total_bytes": info.total_bytes,
        "stages": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="profile name (default: from the GPU's name)")
    parser.add_argument("--out", type=Path, help="default: groundtruth/<gpu>_context.json")
    parser.add_argument("--modes", default="LAZY,EAGER", help="CUDA_MODULE_LOADING values")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(probe_this_process()))
        return
    from peakmem.measure.groundtruth import profile_name

    runs = []
    for mode in [m for m in args.modes.split(",") if m]:
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                          env.get("PYTHONPATH")]))  # fmt: skip
        done = subprocess.run([sys.executable, __file__, "--child"], env=env, text=True,
                              capture_output=True, check=False)  # fmt: skip
        if done.returncode != 0:
            sys.exit(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    gpu = args.gpu or profile_name(runs[0]["gpu"])
    out = args.out or REPO / "benchmarks" / "groundtruth" / f"{gpu}_context.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": gpu, "runs": runs}, indent=1) + "\n")
    for run in runs:
        print(f"{run['module_loading']}:")
        for rec in run["stages"]:
            print(f"  {rec['stage']:14s} used {rec['used_bytes'] / 2**20:9.1f} MiB  outside the "
                  f"allocator {rec['outside_allocator_bytes'] / 2**20:9.1f} MiB")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
