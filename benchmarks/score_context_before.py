"""The memory outside the allocator that a checkout's stack profiles state for each measured
H200 / H100 run (context_for + library_bytes_for of the libraries the run's capture loaded),
against the run's own context_bytes: the "before" of benchmarks/score_context.py, for a checkout
without the first-use model. Uses only what every checkout since the H100 stack has, and the
classes' captures cached by score_context.py (benchmarks/results/context_ops.json).

    PYTHONPATH=<checkout>/src python benchmarks/score_context_before.py
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd

from peakmem.bench.calibration import GROUNDTRUTH_BUCKETS, GROUNDTRUTH_TAKEN
from peakmem.profiles import load_gpu, load_stack

MiB = 1 << 20
GROUNDTRUTH = Path("benchmarks/groundtruth")


def main() -> None:
    cache = json.loads(Path("benchmarks/results/context_ops.json").read_text())
    misses: dict[tuple[str, str, bool], list[int]] = defaultdict(list)
    for gpu_name in ("h200", "h100-80gb"):
        runs = pd.read_csv(GROUNDTRUTH / f"{gpu_name}.csv").fillna({"args": ""})
        for run in runs[runs["status"] == "ok"].itertuples():
            args = " ".join(re.sub(r"--batch-size \d+", "", run.args).split())
            seen = cache[f"{Path(run.job).name} {args}".strip()]
            if "error" in seen:
                continue
            stack, gpu = load_stack(run.torch), load_gpu(gpu_name)
            stated = int(stack.context_for(gpu).value) + sum(
                int(stack.library_bytes_for(gpu, name).value) for name in seen["libraries"]
            )
            key = f"groundtruth:{run.job} {run.args}".encode()
            split = int(hashlib.sha1(key).hexdigest(), 16) % GROUNDTRUTH_BUCKETS < GROUNDTRUTH_TAKEN
            if "cudnn_convolution" in seen["libraries"]:
                kind = "convolutions"
            elif "transformers_lm" in run.job:
                kind = "transformers bf16" if "bf16" in run.args else "transformers fp32"
            else:
                kind = "other (MLP, DLRM, GPUMemNet)"
            misses[(gpu_name, kind, split)].append(stated - int(run.context_bytes))
    for gpu_name in ("h200", "h100-80gb"):
        every = [m for (g, _k, split), ms in misses.items() if g == gpu_name and not split for m in ms]
        misses[(gpu_name, "all", False)] = every
    for (gpu_name, kind, split), found in sorted(misses.items()):
        print(f"{gpu_name} {kind} {'split' if split else 'held-out'}: {len(found)} runs, exact "
              f"{sum(m == 0 for m in found)}, within 2 MiB {sum(abs(m) <= 2 * MiB for m in found)},"
              f" largest miss {max(found, key=abs) / MiB:+.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
