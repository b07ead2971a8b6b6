"""Fit the torch-2.6 consumer-GPU constants (RTX 3060 / RTX 4060) on the declared xMem
calibration split, and nothing else.

    python benchmarks/calibrate_xmem.py [--data DIR] [--jobs 2] [--cache DIR] [--write]

The split is peakmem.bench.calibration's: sha1('xmem:' + run_dir) % 100 < 18 of xMem's runs
(26 of 131, 19.8%; issue 13 allows 20%); `peakmem bench xmem` never scores those runs. Only the
split's runs that did not OOM on the two consumer GPUs are fitted. Each is captured ONCE with its
cuDNN workspaces left as placeholders (benchmarks/calibrate_cnn.py), then replayed:

xMem's measurement = the caching allocator's reserved peak + the kernel images CUDA's lazy
loading brings in after its baseline sample (torch's and cuBLAS's kernels on first launch; every
run) + cuDNN's library memory (the CNN runs) (peakmem.baselines.peakmem_estimator
`after_context_creation_bytes`). Three parameters are fitted jointly over every fitted run on a
grid, minimising median + p90 of |relative error|:
1. the lazily loaded kernel bytes (0-400 MiB, step 10);
2. cuDNN's library memory (0-400 MiB, step 10, split 250:40 between convolution and batch norm
   as the A100 fit split it);
3. one scale s (0-1, step 0.1) on the A100 / torch-2.4 workspace factors (forward 0.5,
   backward-data 1.5, backward-weight 2.5): three parameters, because the split has only 15
   such runs (6 Hugging Face, 9 CNN).
Every candidate is replayed at the capacity the estimate would give it: GPU total - context -
libraries, the context being what was unavailable at xMem's first NVML sample (bounded by the
split's OOM runs: peakmem.bench.calibration `unavailable_at_baseline`) plus the candidate's
lazily loaded kernels (`CapacityReplays`). `--write` stores the fit in stacks/torch-2.6.toml for
both consumer GPUs, the context (`[context_bytes.<gpu>]`) included, with the split and this
command as its source.

`--model h100-scale` (issue 13, cuDNN 9): the scale multiplies the torch-2.11
stack's per-class H100 factors (cuda_rules/convolution.py CONV_CLASSES: the shape cuDNN 9's
heuristics gave the H100 snapshot and the groundtruth split) instead of the A100 / torch 2.4 ones
(`--model scale`, the default: the fit the stack holds). `--model classes`: instead of one scale, the workspace factors of the
classes of cuda_rules/convolution.py (plain 3x3-and-larger, `stem_` <= 4 input channels,
`pointwise_` 1x1), each direction, by coordinate descent over CLASS_VALUES from the scale fit's
factors, with the lazy-kernel and library grid re-fitted for every candidate (the H100 snapshot,
tests/cuda_rules/test_conv_workspace_h100.py, shows cuDNN 9's workspaces differ by class).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_cnn import SENTINEL, captured_rows, families  # noqa: E402

MiB = 2**20
STACK = Path(__file__).resolve().parents[1] / "src" / "peakmem" / "profiles" / "data" / "stacks" / "torch-2.6.toml"
DEFAULT_CACHE = Path("/tmp/peakmem-xmem-calibration-v1")
CONSUMER_GPUS = ("rtx3060-12gb", "rtx4060-8gb")
A100_FACTORS = {"forward": 0.5, "backward_data": 1.5, "backward_weight": 2.5}
"""The torch-2.4 a100-40gb fit (benchmarks/calibrate_cnn.py) whose scale is fitted here."""
SCALES = tuple(round(0.1 * i, 1) for i in range(0, 16))
LIBRARY_MIB = tuple(range(0, 401, 10))
LAZY_MIB = tuple(range(0, 401, 10))
BATCH_NORM_SHARE = 40 / 290
CLASS_KEYS = tuple(f"{prefix}{d}" for prefix in ("", "stem_", "pointwise_")
                   for d in ("forward", "backward_data", "backward_weight"))
CLASS_VALUES = (0.0, 0.125, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)


def h100_factors() -> dict[str, float]:
    """The per-class cuDNN 9 factors the torch-2.11 stack holds for the H100 (snapshot + the
    groundtruth split): the shape of the model whose scale `--model h100-scale` fits."""
    from peakmem.profiles import load_gpu, load_stack

    return dict(load_stack("2.11.0").conv_workspace_for(load_gpu("h100-80gb")).value)


def replay_classed(captured: tuple, model: dict[str, float], capacity: int, torch_version: str):
    """Simulated peak reserved bytes with workspaces from the classed `model` (None on OOM)."""
    from peakmem.allocator.simulate import simulate
    from peakmem.cuda_rules.convolution import classed_bytes

    _id, _measured, _status, trace, features, _libs = captured
    placeholders = list(trace.sizes)
    for index, size in enumerate(placeholders):
        if size >= SENTINEL:
            trace.sizes[index] = classed_bytes(model, features[size - SENTINEL])
    try:
        result = simulate(trace, torch_version=torch_version, capacity_bytes=capacity)
    finally:
        trace.sizes[:] = placeholders
    return None if result.oom else result.peak_reserved_bytes
"""cuDNN batch norm's share of the library memory, as the A100 fit split it (40 of 250 + 40)."""


class CapacityReplays:
    """Replays of the split's runs with the capacity each candidate gives them.

    The capacity is total - context - libraries (estimate/api.py), so the lazily loaded
    kernels and the library memory of a candidate move it. A run is replayed once per scale at
    the largest capacity (nothing outside the allocator besides the context as created); that
    replay stands for every candidate whose capacity its peak fits under (the replay never
    reached the smaller limit, so nothing changes). The others, runs near the limit, are
    replayed at the candidate's capacity, ascending in the bytes outside the allocator, and
    once one runs out of memory every larger figure counts as out of memory too."""

    def __init__(self, runs: list, capacity, torch_version: str) -> None:
        self.runs, self.capacity, self.version = runs, capacity, torch_version
        self.free: dict[tuple[int, float], int | None] = {}
        self.limited: dict[tuple[int, float, int], int | None] = {}
        self.oom_from: dict[tuple[int, float], int] = {}

    def reserved(self, index: int, scale: float, factors: dict, outside: int) -> int | None:
        row, item = self.runs[index]
        key = (index, scale)
        if key not in self.free:
            self.free[key] = replay_classed(item, factors, self.capacity(row, 0), self.version)
        base = self.free[key]
        limit = self.capacity(row, outside)
        if base is not None and base <= limit:
            return base
        if outside >= self.oom_from.get(key, 1 << 62):
            return None
        if (index, scale, outside) not in self.limited:
            found = replay_classed(item, factors, limit, self.version)
            self.limited[(index, scale, outside)] = found
            if found is None:
                self.oom_from[key] = min(outside, self.oom_from.get(key, outside))
        return self.limited[(index, scale, outside)]


def main() -> None:
    from peakmem.bench.calibration import (
        XMEM_SPLIT_DESCRIPTION,
        in_calibration_split,
        unavailable_at_baseline,
    )
    from peakmem.datasets.loaders import load_rows
    from peakmem.profiles import load_gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--write", action="store_true", help="store the fit in the stack profile")
    parser.add_argument("--model", choices=("scale", "h100-scale", "classes"), default="scale",
                        help="one scale on the A100 factors, one scale on the H100 cuDNN 9 "
                             "per-class factors, or free per-class factors")
    args = parser.parse_args()

    rows = load_rows("xmem", args.data)
    in_split = [r for r in rows if in_calibration_split(r)]
    split = [r for r in in_split if r.status == "ok" and r.gpu in CONSUMER_GPUS]
    print(f"xmem: {len(rows)} runs, calibration split {len(in_split)} ({len(in_split) / len(rows):.1%}); "
          f"{len(split)} consumer-GPU runs that did not OOM fitted", flush=True)
    captured = {item[0]: item for item in captured_rows(split, args.cache, args.jobs)}
    by_id = {r.id: r for r in split}
    version = split[0].torch_version

    # What was unavailable at xMem's first NVML sample (the context as created, and anything
    # else resident), bounded by the split's OOM runs (`unavailable_at_baseline`); the context
    # figure is that plus the lazily loaded kernels, so the capacity a replay gets is the
    # estimate's own: total - context - libraries (estimate/api.py `estimate_capture`).
    unavailable = unavailable_at_baseline(
        in_split, {gpu: load_gpu(gpu).total_memory_bytes for gpu in CONSUMER_GPUS})
    print("unavailable at the first NVML sample (split OOM runs' bound): "
          + ", ".join(f"{gpu} {value / MiB:.1f} MiB" for gpu, value in sorted(unavailable.items())),
          flush=True)

    def capacity(row, outside: int) -> int:
        """The reserved bytes `row`'s GPU can hold with `outside` bytes of lazily loaded kernels
        and library memory next to the context as created."""
        return load_gpu(row.gpu).total_memory_bytes - unavailable[row.gpu] - outside

    def library_bytes(item, library_mib: int) -> int:
        total = 0
        for family in families(item):
            share = BATCH_NORM_SHARE if family == "cudnn_batch_norm" else 1 - BATCH_NORM_SHARE
            total += int(library_mib * share * MiB)
        return total

    runs = [(by_id[i], item) for i, item in sorted(captured.items())]
    base = h100_factors() if args.model == "h100-scale" else A100_FACTORS
    replays_at = CapacityReplays(runs, capacity, version)

    def errors(lazy_mib: int, library_mib: int, scale: float) -> list[float]:
        factors = {k: v * scale for k, v in base.items()}
        out = []
        for index, (_row, item) in enumerate(runs):
            outside = lazy_mib * MiB + library_bytes(item, library_mib)
            reserved = replays_at.reserved(index, scale, factors, outside)
            if reserved is None:  # the real job ran: an OOM here is a gross overestimate
                out.append(1.0)
                continue
            total = outside + reserved
            out.append((total - item[1]) / item[1])
        return out

    # 1 + 2 jointly over every fitted run: lazily loaded kernels (all runs), cuDNN library
    # memory and the workspace scale (the CNN runs), minimising median + p90 of |error|.
    best = None
    for scale in SCALES:
        for lazy_mib in LAZY_MIB:
            for library_mib in LIBRARY_MIB:
                errs = errors(lazy_mib, library_mib, scale)
                mags = sorted(abs(e) for e in errs)
                key = (statistics.median(mags) + mags[int(0.9 * (len(mags) - 1))],
                       statistics.median(mags))
                if best is None or key < best[0]:
                    best = (key, scale, lazy_mib, library_mib, errs)
    (_key, scale, lazy_mib, library_mib, errs) = best
    factors = {k: round(v * scale, 4) for k, v in base.items()}
    if args.model == "classes":
        def grid(reserved: list[int | None]):
            """The best (key, lazy, library, errors) over the additive grid for these replays."""
            found = None
            for lazy_mib in LAZY_MIB:
                for library_mib in LIBRARY_MIB:
                    errs = []
                    for (_row, item), value in zip(runs, reserved, strict=True):
                        if value is None:
                            errs.append(1.0)
                            continue
                        total = lazy_mib * MiB + library_bytes(item, library_mib) + value
                        errs.append((total - item[1]) / item[1])
                    mags = sorted(abs(e) for e in errs)
                    key = (statistics.median(mags) + mags[int(0.9 * (len(mags) - 1))],
                           statistics.median(mags))
                    if found is None or key < found[0]:
                        found = (key, lazy_mib, library_mib, errs)
            return found

        def replays(model):
            return [replay_classed(item, model, capacity(row, library_bytes(item, 290)), version)
                    for row, item in runs]  # placeholder capacity: 290 MiB of libraries

        model = dict.fromkeys(CLASS_KEYS, 0.0) | factors
        current = grid(replays(model))
        for _round in range(2):
            changed = False
            for key in CLASS_KEYS:
                for value in CLASS_VALUES:
                    trial = dict(model, **{key: value})
                    if trial == model:
                        continue
                    found = grid(replays(trial))
                    if found[0] < current[0]:
                        model, current, changed = trial, found, True
                        print(json.dumps(model), f"median+p90 {found[0][0]:.4f}", flush=True)
            if not changed:
                break
        _key, lazy_mib, library_mib, errs = current
        factors = dict(model)  # a class's zero keys matter: they replace the plain factors
        scale = None
    lazy = lazy_mib * MiB
    residuals = [r for r, item in runs if not families(item)]
    cnn = [r for r, item in runs if families(item)]
    conv = int(round(library_mib * (1 - BATCH_NORM_SHARE))) * MiB
    norm = int(round(library_mib * BATCH_NORM_SHARE)) * MiB
    report = {
        "lazy_loaded_mib": lazy / MiB,
        "context_mib": {gpu: round((value + lazy) / MiB, 1) for gpu, value in sorted(unavailable.items())}, "hf_runs": len(residuals), "cnn_runs": len(cnn),
        "scale": scale, "factors": factors, "library_mib": library_mib,
        "cudnn_convolution_mib": conv / MiB, "cudnn_batch_norm_mib": norm / MiB,
        "split_errors": {r.id: round(e, 4) for (r, _i), e in zip(runs, errs, strict=True)},
    }
    print(json.dumps(report))
    if args.write:
        how = {"scale": "the a100-40gb factors x one scale",
               "h100-scale": f"the torch-2.11 stack's h100-80gb per-class cuDNN 9 factors x one "
                             f"scale ({scale})",
               "classes": "per-class factors (plain, stem_, pointwise_), coordinate descent, "
                          "--model classes"}[args.model]
        write_profile(lazy, factors, conv, norm, len(residuals), len(cnn), XMEM_SPLIT_DESCRIPTION,
                      how, unavailable)


def write_profile(lazy: int, factors: dict, conv: int, norm: int, hf: int, cnn: int, split: str,
                  how: str = "the a100-40gb factors x one scale",
                  unavailable: dict[str, int] | None = None) -> None:
    text = STACK.read_text()
    source = (f"fitted on the declared xMem calibration split ({split}; never scored): {hf} Hugging "
              f"Face and {cnn} CNN runs that did not OOM, all but two on the RTX 3060; "
              f"python benchmarks/calibrate_xmem.py --write")
    for gpu in CONSUMER_GPUS:
        for header in (f"context_bytes.{gpu}", f"lazy_loaded_bytes.{gpu}", f"cudnn_conv_workspace.{gpu}",
                       f"library_bytes.{gpu}.cudnn_convolution", f"library_bytes.{gpu}.cudnn_batch_norm"):
            pattern = re.compile(rf"\n\[{re.escape(header)}\]\n(?:[^\[\n].*\n?)*")
            text = pattern.sub("", text)
    text = text.rstrip("\n") + "\n"
    for gpu in CONSUMER_GPUS:
        note = "" if gpu == "rtx3060-12gb" else " (one fit for both: same torch 2.6 / CUDA 12.4 wheels, sm_86 vs sm_89)"
        if unavailable and gpu in unavailable:
            text += (f"\n[context_bytes.{gpu}]\nvalue = {unavailable[gpu] + lazy}\n"
                     f"source = \"{source}{note}: the lazily loaded kernels + {unavailable[gpu]} bytes "
                     f"unavailable at xMem's first NVML sample, the most the split's OOM runs on "
                     f"this GPU allow (total - the highest level one reached)\"\n")
        text += (f"\n[lazy_loaded_bytes.{gpu}]\nvalue = {lazy}\nsource = \"{source}{note}\"\n")
        text += (f"\n[cudnn_conv_workspace.{gpu}]\n"
                 + "".join(f"{k} = {v}\n" for k, v in factors.items())
                 + f"source = \"{source}{note}: {how}\"\n")
        text += (f"\n[library_bytes.{gpu}.cudnn_convolution]\nvalue = {conv}\nsource = \"{source}{note}\"\n")
        text += (f"\n[library_bytes.{gpu}.cudnn_batch_norm]\nvalue = {norm}\nsource = \"{source}{note}\"\n")
    STACK.write_text(text)
    print(f"wrote the consumer-GPU fit to {STACK}")


if __name__ == "__main__":
    main()
