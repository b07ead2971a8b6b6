"""Fit the H100 cuDNN 9 workspace classes of the torch-2.11 stack on the declared groundtruth
calibration split, and nothing else.

    PYTHONPATH=src python benchmarks/calibrate_groundtruth_cnn.py [--cache DIR] [--score-held-out]

The split is peakmem.bench.calibration's groundtruth split (sha1('groundtruth:' + job + ' ' +
args) % 100 < 20: 13 of the 65 H100 runs, 8 of them with cuDNN convolutions); score_groundtruth
never scores it. Each run with convolutions is captured ONCE with its workspaces as placeholders
(benchmarks/calibrate_cnn.py), then replayed through the allocator for each candidate model and
compared with the run's torch.cuda.max_memory_reserved(): a transient workspace only changes the
reserved peak, and only a replay tells by how much.

The model (cuda_rules/convolution.py `classed_bytes`): factor x the bytes the direction reads,
per class of convolution. The plain (3x3 and larger) factors are the ones the allocator snapshot
tests/data/snapshots/cnn.pickle measured (forward 1.0, backward-data 1.5, backward-weight 3.5;
tests/cuda_rules/test_conv_workspace_h100.py) and are held; the stem (<= 4 input channels) and
pointwise (1x1) factors are fitted by coordinate descent over VALUES, minimising median + p90 of
|relative error|. `--score-held-out` also prints the held-out runs' errors (never used to fit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_cnn import SENTINEL, captured_rows  # noqa: E402

DEFAULT_CACHE = Path("/tmp/peakmem-groundtruth-cnn-calibration-v1")
CONVOLUTION_JOBS = ("vision.py", "xmem_cnn.py", "unet.py", "detection.py")
SNAPSHOT_FACTORS = {"forward": 1.0, "backward_data": 1.5, "backward_weight": 3.5}
FITTED = tuple(f"{cls}_{d}" for cls in ("stem", "pointwise")
               for d in ("forward", "backward_data", "backward_weight"))
VALUES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


def reserved_error(item: tuple, model: dict[str, float], measured_reserved: int) -> float:
    """(simulated - measured) / measured reserved peak of one captured run under `model`."""
    from peakmem.allocator.simulate import simulate
    from peakmem.cuda_rules.convolution import classed_bytes

    _id, _measured, _status, trace, features, _libs = item
    placeholders = list(trace.sizes)
    for index, size in enumerate(placeholders):
        if size >= SENTINEL:
            trace.sizes[index] = classed_bytes(model, features[size - SENTINEL])
    try:
        result = simulate(trace, torch_version="2.11")
    finally:
        trace.sizes[:] = placeholders
    return (result.peak_reserved_bytes - measured_reserved) / measured_reserved


def score(items: list[tuple], reserved: dict[str, int], model: dict[str, float]):
    errors = [reserved_error(item, model, reserved[item[0]]) for item in items]
    magnitudes = sorted(abs(e) for e in errors)
    return statistics.median(magnitudes), magnitudes[int(0.9 * len(magnitudes))], errors


def main() -> None:
    from peakmem.bench.calibration import in_calibration_split
    from peakmem.datasets.loaders import load_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--score-held-out", action="store_true")
    args = parser.parse_args()

    rows = [r for r in load_rows("groundtruth") if r.status == "ok"
            and Path(r.job["job"]).name.endswith(CONVOLUTION_JOBS)]
    split = [r for r in rows if in_calibration_split(r)]
    reserved = {r.id: int(r.features["max_reserved_bytes"]) for r in rows}
    items = captured_rows(split, args.cache, args.jobs)
    print(f"groundtruth: {len(rows)} runs with convolutions, {len(items)} in the split fitted",
          flush=True)
    model = dict(SNAPSHOT_FACTORS, **dict.fromkeys(FITTED, 0.0))
    median, p90, _errors = score(items, reserved, model)
    best = median + p90
    for _round in range(3):
        changed = False
        for key in FITTED:
            for value in VALUES:
                trial = dict(model, **{key: value})
                if trial == model:
                    continue
                median, p90, _errors = score(items, reserved, trial)
                if median + p90 < best - 1e-9:
                    best, model, changed = median + p90, trial, True
        if not changed:
            break
    median, p90, errors = score(items, reserved, model)
    print(json.dumps({"model": model, "split_median": round(median, 4), "split_p90": round(p90, 4),
                      "split_errors": {i[0]: round(e, 4) for i, e in zip(items, errors, strict=True)}}))
    if args.score_held_out:
        held = captured_rows([r for r in rows if not in_calibration_split(r)], args.cache, args.jobs)
        median, p90, errors = score(held, reserved, model)
        print(f"held-out reserved: {len(held)} runs, median |error| {median:.2%}, p90 {p90:.2%}")


if __name__ == "__main__":
    main()
