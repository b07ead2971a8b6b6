"""Where xMem's measurement falls between the replay's allocated and reserved peaks, on the
declared calibration split only.

    PYTHONPATH=src python benchmarks/xmem_split_gap.py [--cache DIR] [--data DIR]

Reads the split captures that `benchmarks/calibrate_xmem.py --cache DIR` wrote (this
repository's own cache; run that first), replays each with the stack's stored consumer fit
(cuDNN workspace factors, lazily loaded kernels, capacity = total - context - libraries) and
prints, per split run that did not OOM: measured, allocated peak + lazily loaded kernels,
reserved peak + lazily loaded kernels, and the gap fraction

    (measured - allocated - lazy) / (reserved - allocated)

the share of the replay's reserved - allocated gap (its cached, unused segments) that the real
run's NVML figure shows: 1 when the replay's segments are all real, 0 when the real run held
none beyond its allocated peak, below 0 when the replay's allocated peak alone is above the
measurement. The split's runs are the only ones read; the held-out runs are never opened.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_cnn import SENTINEL, families  # noqa: E402
from calibrate_xmem import CONSUMER_GPUS, DEFAULT_CACHE  # noqa: E402

MiB = 2**20


def gap_fraction(measured: int, allocated: int, reserved: int) -> float | None:
    """(measured - allocated) / (reserved - allocated): where the measurement falls in the
    replay's reserved - allocated gap (None when the replay has no gap)."""
    gap = reserved - allocated
    return None if gap <= 0 else (measured - allocated) / gap


def main() -> None:
    from peakmem.allocator.simulate import simulate
    from peakmem.bench.calibration import in_calibration_split
    from peakmem.cuda_rules.convolution import model_bytes
    from peakmem.datasets.loaders import load_rows
    from peakmem.profiles import load_gpu, load_stack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    rows = {r.id: r for r in load_rows("xmem", args.data) if in_calibration_split(r)}
    print("| run | GPU | kind | model | batch | optimizer | measured MiB | allocated + lazy | "
          "reserved + lazy | gap fraction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    fractions: dict[tuple[str, str], list[float]] = {}
    for path in sorted(args.cache.glob("*.pkl")):
        if path.stem not in rows:
            continue  # only the split's runs
        # the cache is this repository's own (calibrate_xmem.py wrote it), never given data
        item = pickle.loads(path.read_bytes())
        run_id, measured, status, trace, features, libraries = item
        row = rows[run_id]
        if status != "ok" or row.gpu not in CONSUMER_GPUS:
            continue
        gpu, stack = load_gpu(row.gpu), load_stack(row.torch_version)
        factors = dict(stack.conv_workspace_for(gpu).value)
        placeholders = list(trace.sizes)
        for index, size in enumerate(placeholders):
            if size >= SENTINEL:
                call = features[size - SENTINEL]
                trace.sizes[index] = model_bytes(factors, call, call.direction,
                                                 f"{call.direction}_per_weight")
        lazy = int(stack.lazy_loaded_for(gpu).value)
        library = sum(int(stack.library_bytes_for(gpu, family).value) for family in families(item))
        capacity = gpu.total_memory_bytes - int(stack.context_for(gpu).value) - library
        try:
            result = simulate(trace, torch_version=row.torch_version, capacity_bytes=capacity)
        finally:
            trace.sizes[:] = placeholders
        allocated = result.peak_allocated_bytes + lazy + library
        reserved = result.peak_reserved_bytes + lazy + library
        fraction = gap_fraction(measured, allocated, reserved)
        kind = "cnn" if families(item) else "hf"
        if fraction is not None:
            fractions.setdefault((row.gpu, kind), []).append(fraction)
        shown = "-" if fraction is None else f"{fraction:+.2f}"
        print(f"| {run_id} | {row.gpu} | {kind} | {row.family} | {row.job['batch_size']} | "
              f"{row.job['optimizer']} | {measured / MiB:.0f} | {allocated / MiB:.0f} | "
              f"{reserved / MiB:.0f} | {shown} |")
    print()
    for (gpu, kind), values in sorted(fractions.items()):
        print(f"{gpu} {kind}: {len(values)} split runs, gap fraction median "
              f"{statistics.median(values):+.2f} (min {min(values):+.2f}, max {max(values):+.2f})")


if __name__ == "__main__":
    main()
