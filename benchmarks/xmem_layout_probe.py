"""Whether one of xMem's rebuilt Hugging Face jobs sits at an allocator-layout edge.

Estimates `benchmarks/zoo/xmem_hf.py` (the rebuilt xMem job) on the given GPU profile and torch
version, and prints its peak allocated and reserved bytes, the layout probe's moves
(estimate/layout_probe.py: one small persistent block first, or the cuBLAS workspaces at other
sizes, each replayed alone) and the margin reserve the estimate states (estimate/margin_reserve.py).
No dataset rows are read or printed.

    PYTHONPATH=src python benchmarks/xmem_layout_probe.py --model distilbert/distilgpt2 \\
        --batch-size 40 --optimizer AdamW --gpu rtx3060-12gb
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

MiB = 2**20
JOB = Path(__file__).resolve().parent / "zoo" / "xmem_hf.py"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--optimizer", default="AdamW")
    p.add_argument("--zero-grad-mode", type=int, default=0)
    p.add_argument("--gpu", default="rtx3060-12gb")
    p.add_argument("--torch", default="2.6.0")
    args = p.parse_args()

    from peakmem.estimate import estimate_command
    from peakmem.estimate.layout_probe import probe_layout

    argv = ["python", str(JOB), "--model", args.model, "--batch-size", str(args.batch_size),
            "--optimizer", args.optimizer, "--zero-grad-mode", str(args.zero_grad_mode)]
    estimate = estimate_command(argv, gpu=args.gpu, torch_version=args.torch)
    start = time.perf_counter()
    probe = probe_layout(estimate.capture.trace, estimate.alloc_conf, estimate.torch_version)
    seconds = time.perf_counter() - start
    print(f"{' '.join(argv[2:])} on {args.gpu} / torch {args.torch}")
    print(f"peak allocated {estimate.peak_allocated_bytes / MiB:.0f} MiB, peak reserved "
          f"{estimate.peak_reserved_bytes / MiB:.0f} MiB; margin kind {estimate.margin_kind}, "
          f"fraction {estimate.safety_margin:.3f}, reserve {estimate.margin_reserve_bytes / MiB:.0f} MiB")
    for name, move in probe.moves.items():
        print(f"  probe {name:<28} reserved {move / MiB:+7.0f} MiB "
              f"(allowance {probe.allowances[name] / MiB:.0f} MiB)")
    print(f"largest excess up {probe.max_excess_bytes / MiB:.0f} MiB, down "
          f"{probe.min_excess_bytes / MiB:.0f} MiB ({len(probe.moves)} replays, {seconds:.1f} s)")


if __name__ == "__main__":
    main()
