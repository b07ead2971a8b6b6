"""The memory outside the caching allocator that a GPU's own runs measured, read from the declared
calibration split only (the figures the torch-2.11 stack's `context_bytes.<gpu>`,
`library_bytes.<gpu>.cudnn_convolution` and the GPU profile's `total_memory_bytes` hold).

    PYTHONPATH=src python benchmarks/groundtruth_context.py --gpu h200

Prints, for the split's runs of that GPU (peakmem.bench.calibration: sha1('groundtruth:' + job +
' ' + args) % 100 < 20), the `context_bytes` column (NVML process used - memory_reserved at the
end of the run) grouped by job script and precision, and the figures the stack takes from it:
the context = the smallest value of the runs without cuDNN convolutions (the fewest kernel
families loaded); cuDNN convolution library memory = the largest convolution run less that.
The held-out runs are never read.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from peakmem.bench.calibration import in_calibration_split
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import BenchRow, MiB

CONVOLUTION_JOBS = ("vision.py", "xmem_cnn.py", "unet.py", "detection.py")


@dataclass(frozen=True)
class SplitContext:
    runs: int
    context_bytes: int  # smallest outside-allocator figure without cuDNN convolutions
    convolution_library_bytes: int  # largest convolution run less `context_bytes`
    total_bytes: set[int]
    groups: dict[tuple[str, str], Counter]  # (script, precision) -> context_bytes -> runs


def precision_of(args: str) -> str:
    words = args.split()
    return words[words.index("--precision") + 1] if "--precision" in words[:-1] else "fp32"


def split_context(rows: Iterable[BenchRow], gpu: str) -> SplitContext:
    """The figures of the split's runs on `gpu` (raises when it has no run without convolutions)."""
    split = [r for r in rows if r.gpu == gpu and in_calibration_split(r)]
    groups: dict[tuple[str, str], Counter] = {}
    plain, convolution = [], []
    for row in split:
        script = Path(row.job["job"]).name
        outside = int(row.features["context_bytes"])
        groups.setdefault((script, precision_of(row.job["args"])), Counter())[outside] += 1
        (convolution if script.endswith(CONVOLUTION_JOBS) else plain).append(outside)
    if not plain:
        raise ValueError(f"the split has no {gpu} run without cuDNN convolutions")
    context = min(plain)
    return SplitContext(
        runs=len(split),
        context_bytes=context,
        convolution_library_bytes=max((c - context for c in convolution), default=0),
        total_bytes={int(r.features["total_bytes"]) for r in split},
        groups=groups,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200")
    args = parser.parse_args()
    rows = load_rows("groundtruth")
    found = split_context(rows, args.gpu)
    total = sum(r.gpu == args.gpu for r in rows)
    print(f"{args.gpu}: {found.runs} of {total} runs in the declared calibration split")
    for (script, precision), counts in sorted(found.groups.items()):
        values = ", ".join(f"{v} B ({v / MiB:.0f} MiB) x{n}" for v, n in sorted(counts.items()))
        print(f"  {script} {precision}: {values}")
    print(f"context_bytes = {found.context_bytes}")
    print(f"library_bytes.cudnn_convolution = {found.convolution_library_bytes}")
    print(f"total_bytes = {sorted(found.total_bytes)}")


if __name__ == "__main__":
    main()
