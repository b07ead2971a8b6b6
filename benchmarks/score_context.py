"""Check the first-use model of the memory outside the allocator (estimate/first_use.py, the
stack's `[first_use_bytes.<gpu>]` and `library_bytes.<gpu>.cudnn_convolution`) against every
measured run's own `context_bytes` (NVML process used - memory_reserved at the end of the run)
in benchmarks/groundtruth/<gpu>.csv.

    PYTHONPATH=src python benchmarks/score_context.py [--gpu h200,h100-80gb]
        [--ops benchmarks/results/context_ops.json] [--classes-only]

The kernel families a job runs do not depend on its batch size: per class of job (the zoo
script and its arguments less --batch-size) the smallest-batch run is captured once (fake mode,
as `peakmem bench groundtruth` does) and its aten ops and libraries are cached in --ops; every
run of the class is then predicted as base + the families' bytes + the libraries' bytes.
Prints per class: runs, predicted, measured range, exact, within 2 MiB, largest miss; then per
kind of job (CNN / Transformer fp32 / bf16 / other) and for the declared calibration split
(peakmem.bench.calibration) and the held-out runs apart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from peakmem.bench.calibration import in_calibration_split
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import MiB
from peakmem.estimate.first_use import families_run, first_use_bytes, job_ops
from peakmem.profiles import load_gpu, load_stack

DEFAULT_OPS = Path("benchmarks/results/context_ops.json")


def class_key(row) -> str:
    args = re.sub(r"--batch-size \d+", "", row.job["args"] or "")
    return f"{Path(row.job['job']).name} {' '.join(args.split())}".strip()


def kind_of(key: str, libraries: list[str]) -> str:
    if "cudnn_convolution" in libraries:
        return "convolutions"
    if "transformers_lm" in key:
        return "transformers bf16" if "bf16" in key else "transformers fp32"
    return "other (MLP, DLRM, GPUMemNet)"


def batch_of(row) -> int:
    found = re.search(r"--batch-size (\d+)", row.job["args"] or "")
    return int(found.group(1)) if found else 0


def capture_ops(row) -> dict:
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator

    estimate = PeakmemEstimator().run(row)
    return {"ops": sorted(job_ops(estimate.capture)), "libraries": sorted(estimate.capture.libraries)}


def predicted(row, seen: dict, chosen: dict[str, int] | None = None) -> int:
    """base + libraries + first-use families; `chosen` overrides (or adds) family figures."""
    gpu = load_gpu(row.gpu)
    stack = load_stack(row.torch_version)
    libraries = {name: int(stack.library_bytes_for(gpu, name).value) for name in seen["libraries"]}
    libraries.update(first_use_bytes(stack, gpu, seen["ops"]))
    if chosen:
        ran = set(families_run(seen["ops"]))
        libraries.update({name: value for name, value in chosen.items() if name in ran})
    return int(stack.context_for(gpu).value) + sum(libraries.values())


def choose(rows, cache: dict, families: list[str], *, top: int = 64) -> dict[str, int]:
    """The family figures (0..top MiB in 2 MiB steps, NVML's granularity) that minimise the
    largest miss, then the summed miss, over the given runs (the declared calibration split)."""
    grid = range(0, top + 1, 2)
    best: tuple[int, int] | None = None
    chosen: dict[str, int] = {}
    for values in itertools.product(grid, repeat=len(families)):
        trial = {name: mib * MiB for name, mib in zip(families, values, strict=True)}
        misses = [abs(predicted(r, cache[class_key(r)], trial) - int(r.features["context_bytes"]))
                  for r in rows if "error" not in cache[class_key(r)]]  # fmt: skip
        score = (max(misses), sum(misses))
        if best is None or score < best:
            best, chosen = score, trial
    return chosen


def summarise(label: str, misses: list[int]) -> str:
    if not misses:
        return f"{label}: no runs"
    exact = sum(m == 0 for m in misses)
    near = sum(abs(m) <= 2 * MiB for m in misses)
    worst = max(misses, key=abs)
    return (f"{label}: {len(misses)} runs, exact {exact}, within 2 MiB {near}, "
            f"largest miss {worst / MiB:+.0f} MiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200,h100-80gb")
    parser.add_argument("--ops", type=Path, default=DEFAULT_OPS)
    parser.add_argument("--classes-only", action="store_true", help="capture, do not score")
    parser.add_argument("--choose", default="", help="families whose figures to choose on the "
                        "calibration split of the first --gpu (comma-separated), then stop")
    args = parser.parse_args()
    gpus = args.gpu.split(",")
    rows = [r for r in load_rows("groundtruth") if r.gpu in gpus and r.features.get("context_bytes")]
    cache: dict = json.loads(args.ops.read_text()) if args.ops.exists() else {}
    classes: dict[str, list] = defaultdict(list)
    for row in rows:
        classes[class_key(row)].append(row)
    for key, members in sorted(classes.items()):  # one capture per class, whatever the GPU
        if key not in cache:
            smallest = min(members, key=batch_of)
            print(f"capturing {smallest.id} {key}", file=sys.stderr, flush=True)
            try:
                cache[key] = capture_ops(smallest)
            except Exception as exc:  # noqa: BLE001 - a job that cannot be captured is reported
                cache[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            args.ops.parent.mkdir(parents=True, exist_ok=True)
            args.ops.write_text(json.dumps(cache, indent=1, sort_keys=True))
    if args.classes_only:
        return
    if args.choose:
        split = [r for r in rows if r.gpu == gpus[0] and in_calibration_split(r)]
        chosen = choose(split, cache, args.choose.split(","))
        print(f"chosen on the {len(split)} {gpus[0]} split runs:",
              {name: value for name, value in chosen.items()})  # fmt: skip
        for line in (summarise("split with them", [predicted(r, cache[class_key(r)], chosen)
                     - int(r.features["context_bytes"]) for r in split]),):  # fmt: skip
            print(line)
        return
    by_kind: dict[tuple[str, str, bool], list[int]] = defaultdict(list)
    per_gpu: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        per_gpu[(row.gpu, class_key(row))].append(row)
    for (_gpu, key), members in sorted(per_gpu.items()):
        seen = cache[key]
        if "error" in seen:
            print(f"{key}: not captured ({seen['error']})")
            continue
        misses, measured = [], []
        for row in members:
            measured.append(int(row.features["context_bytes"]))
            miss = predicted(row, seen) - measured[-1]
            misses.append(miss)
            by_kind[(row.gpu, kind_of(key, seen["libraries"]), in_calibration_split(row))].append(
                miss
            )
        guess = predicted(members[0], seen)
        print(f"{members[0].gpu} {key}: predicted {guess / MiB:.0f} MiB, measured "
              f"{min(measured) / MiB:.0f}-{max(measured) / MiB:.0f}; "
              + summarise("", misses).lstrip(": "))  # fmt: skip
    print("-- per kind of job (split = the declared calibration split; held-out = the rest):")
    for (gpu, kind, split), misses in sorted(by_kind.items()):
        print(summarise(f"{gpu} {kind} {'split' if split else 'held-out'}", misses))
    for gpu in gpus:
        every = [m for (g, _k, split), ms in by_kind.items() if g == gpu and not split for m in ms]
        print(summarise(f"{gpu} all held-out", every))


if __name__ == "__main__":
    main()
