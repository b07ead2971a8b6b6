"""Replay one rebuilt xMem CNN job at several capacities and cuDNN workspace scales.

    PYTHONPATH=src python benchmarks/xmem_capacity_probe.py --model VGG16 --batch-size 560 \\
        --optimizer AdamW --gpu rtx3060-12gb [--contexts 400,242] [--workspace-scales 1,0.5,0]

Estimates `benchmarks/zoo/xmem_cnn.py` once, then replays its trace (no dataset rows are read):
- with no capacity, and with capacity = GPU total - context - the job's library memory for each
  `--contexts` figure (MiB): peak reserved / allocated, cudaMalloc retries (the allocator freed
  its cache and retried, torch's `release_cached_blocks`) and whether it ran out of memory;
- with no capacity and every cuDNN workspace of the trace scaled by each `--workspace-scales`
  factor: how much of the reserved - allocated gap the workspaces make.
"""

from __future__ import annotations

import argparse
from pathlib import Path

MiB = 2**20
JOB = Path(__file__).resolve().parent / "zoo" / "xmem_cnn.py"


def scaled_workspaces(trace, factor: float):
    """A copy of `trace` whose cuDNN convolution workspaces are `factor` x their size."""
    from peakmem.trace.events import ALLOC_KINDS, Trace

    copy = Trace(meta=dict(trace.meta))
    copy.kinds, copy.ids, copy.streams = list(trace.kinds), list(trace.ids), list(trace.streams)
    copy.tag_ids, copy.tags = list(trace.tag_ids), trace.tags
    copy.sizes = list(trace.sizes)
    for index, kind in enumerate(trace.kinds):
        tag = trace.tag_of(index)
        if kind in ALLOC_KINDS and tag is not None and (tag.op or "").startswith("cudnn_conv_workspace"):
            copy.sizes[index] = int(trace.sizes[index] * factor)
    return copy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--optimizer", default="AdamW")
    p.add_argument("--zero-grad-mode", type=int, default=1)
    p.add_argument("--gpu", default="rtx3060-12gb")
    p.add_argument("--torch", default="2.6.0")
    p.add_argument("--contexts", default="400", help="context figures to replay at, MiB")
    p.add_argument("--workspace-scales", default="", help="e.g. 1,0.5,0")
    args = p.parse_args()

    from peakmem.allocator.simulate import simulate
    from peakmem.estimate import estimate_command
    from peakmem.profiles import load_gpu

    argv = ["python", str(JOB), "--model", args.model, "--batch-size", str(args.batch_size),
            "--optimizer", args.optimizer, "--zero-grad-mode", str(args.zero_grad_mode)]
    estimate = estimate_command(argv, gpu=args.gpu, torch_version=args.torch)
    trace, libraries = estimate.capture.trace, estimate.library_bytes
    total = load_gpu(args.gpu).total_memory_bytes
    print(f"{' '.join(argv[2:])} on {args.gpu} / torch {args.torch}: context "
          f"{estimate.context_bytes / MiB:.0f} MiB, libraries {libraries / MiB:.0f} MiB")
    limits = [("none", None)] + [(f"context {c} MiB", total - int(float(c) * MiB) - libraries)
                                 for c in args.contexts.split(",") if c]
    for label, capacity in limits:
        r = simulate(trace, torch_version=args.torch, capacity_bytes=capacity)
        cap = "-" if capacity is None else f"{capacity / MiB:.0f}"
        print(f"  capacity {label} ({cap} MiB): reserved {r.peak_reserved_bytes / MiB:.0f}, "
              f"allocated {r.peak_allocated_bytes / MiB:.0f} MiB, retries {r.num_alloc_retries}, "
              f"oom {r.oom}")
    for factor in (float(f) for f in args.workspace_scales.split(",") if f):
        r = simulate(scaled_workspaces(trace, factor), torch_version=args.torch)
        print(f"  workspaces x {factor:g}: reserved {r.peak_reserved_bytes / MiB:.0f}, allocated "
              f"{r.peak_allocated_bytes / MiB:.0f}, gap "
              f"{(r.peak_reserved_bytes - r.peak_allocated_bytes) / MiB:.0f} MiB")


if __name__ == "__main__":
    main()
