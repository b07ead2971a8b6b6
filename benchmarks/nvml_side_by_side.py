"""Check the NVML probe on a GPU: two `peakmem measure` processes side by side, each must read its
own peak from NVML's entry for its pid (`peak_source` nvml-process), not the device's.

    PYTHONPATH=src python benchmarks/nvml_side_by_side.py OUTDIR [--gib 1,8]

Each process runs this file's `--job GIB`: a GIB GiB buffer, a small Linear + SGD, three optimizer
steps 1.5 s apart (so the two runs overlap). Checked (`check_pair`): both `ok` and `nvml-process`;
each peak is at least its buffer and at most its buffer + 3 GiB (context and the model); the
difference of the two peaks is the difference of the buffers within 256 MiB (a reading that
counted the neighbour would be off by the neighbour's buffer). Writes OUTDIR/side_<i>.json (the
measure results) and OUTDIR/side_by_side.json (the verdict); exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GiB = 2**30
CONTEXT_ALLOWANCE = 3 * GiB
PAIR_TOLERANCE = 256 * 2**20


def job(gib: float) -> None:
    import torch

    buffer = torch.empty(int(gib * GiB), dtype=torch.uint8, device="cuda")
    model = torch.nn.Linear(1024, 1024, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 1024, device="cuda")
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(1.5)
    del buffer


def check_pair(results: list[dict[str, Any]], buffers: list[int]) -> list[str]:
    """The failed checks (empty: the probe read each process alone)."""
    failures = []
    for index, (result, buffer) in enumerate(zip(results, buffers, strict=True)):
        name = f"process {index} ({buffer / GiB:g} GiB)"
        if result.get("status") != "ok":
            failures.append(f"{name}: status {result.get('status')} {result.get('error', '')}")
        if result.get("peak_source") != "nvml-process":
            failures.append(f"{name}: peak_source {result.get('peak_source')!r} "
                            f"({result.get('peak_unknown', '')})")  # fmt: skip
        peak = int(result.get("peak_bytes") or 0)
        if not buffer <= peak <= buffer + CONTEXT_ALLOWANCE:
            failures.append(f"{name}: peak {peak / GiB:.2f} GiB outside [{buffer / GiB:g}, "
                            f"{(buffer + CONTEXT_ALLOWANCE) / GiB:g}] GiB")  # fmt: skip
    if len(results) == 2 and not failures:
        gap = (int(results[1]["peak_bytes"]) - int(results[0]["peak_bytes"])) - (
            buffers[1] - buffers[0])
        if abs(gap) > PAIR_TOLERANCE:
            failures.append(f"the peaks differ by {gap / 2**20:+.0f} MiB more than the buffers")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path, nargs="?")
    parser.add_argument("--gib", default="1,8", help="the two processes' buffers, GiB")
    parser.add_argument("--job", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job is not None:
        job(args.job)
        return 0
    if args.outdir is None:
        parser.error("OUTDIR is required")
    sizes = [float(g) for g in args.gib.split(",")]
    args.outdir.mkdir(parents=True, exist_ok=True)
    outs = [args.outdir / f"side_{i}.json" for i in range(len(sizes))]
    procs = [subprocess.Popen([sys.executable, "-m", "peakmem", "measure", "--json", "--steps",
                               "3", "--timeout", "120", "--out", str(out), "--", sys.executable,
                               __file__, "--job", str(gib)],
                              stdout=subprocess.DEVNULL)  # fmt: skip
             for gib, out in zip(sizes, outs, strict=True)]
    codes = [p.wait(timeout=180) for p in procs]
    results = [json.loads(o.read_text()) if o.exists() else {"status": "missing"} for o in outs]
    failures = check_pair(results, [int(g * GiB) for g in sizes])
    verdict = {"ok": not failures, "failures": failures, "exit_codes": codes,
               "peaks": [r.get("peak_bytes") for r in results],
               "sources": [r.get("peak_source") for r in results]}  # fmt: skip
    (args.outdir / "side_by_side.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(json.dumps(verdict))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
