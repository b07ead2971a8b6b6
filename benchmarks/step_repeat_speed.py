"""Steady-state step repetition (capture.step_repeat, issue 14): the same estimate, faster.

    python benchmarks/step_repeat_speed.py [--steps 30] [--repeats 2] [--only NAME]
    python benchmarks/step_repeat_speed.py --cnn-rows 60

`--cnn-rows N`: N held-out GPUMemNet CNN rows spread over the set, each estimated under the
default step policy and as the bench now runs them (`row_capture_options`: `--steps 10` with
repetition); prints how many have the same bench figures (peak, reserved, allocated, with margin,
compared bytes, stated margin, steps) and the CPU seconds of each way.

Each job is estimated in this process with an explicit step limit (`--steps`), with repetition
off and on (PEAKMEM_REPEAT_STEADY), alternately, after one untimed warm-up run; it prints, per
job, the median CPU seconds of each and whether the two estimates are identical (peak, reserved,
allocated, steps, and a digest of every trace event and tag, as speed_regression.py compares).
Exits 1 if any job's estimates differ.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from speed_regression import DATA, ZOO, trace_digest  # noqa: E402

from peakmem.capture.step_repeat import ENV_FLAG  # noqa: E402

SCRIPTS = [
    ("zoo-mlp", ["python", str(ZOO / "mlp.py"), "--hidden-size", "512", "--depth", "3",
                 "--batch-size", "32", "--steps", "1000"], {}),
    ("zoo-gpt2-tiny", ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2",
                       "--num-layers", "2", "--hidden-size", "128", "--num-heads", "4",
                       "--batch-size", "2", "--seq-len", "64", "--optimizer", "adamw",
                       "--steps", "1000"], {}),
    ("zoo-resnet18", ["python", str(ZOO / "vision.py"), "--model", "resnet18", "--batch-size",
                      "4", "--image-size", "64", "--steps", "1000"], {}),
]
BENCH_ROWS = [("gpumemnet-cnn-d", "gpumemnet-cnn", 1200), ("gpumemnet-mlp1-b", "gpumemnet-mlp1", 1500)]


def jobs() -> list[tuple[str, list[str], dict]]:
    from peakmem.baselines.peakmem_estimator import job_command
    from peakmem.datasets.loaders import load_rows

    out = list(SCRIPTS)
    for name, dataset, index in BENCH_ROWS:
        rows = load_rows(dataset, DATA)
        row = rows[min(index, len(rows) - 1)]
        out.append((name, job_command(row), {"gpu": row.gpu, "torch_version": row.torch_version}))
    return out


def run_once(argv: list[str], kwargs: dict, steps: int, repeat: bool) -> tuple[float, dict]:
    from peakmem.estimate import estimate_command

    os.environ[ENV_FLAG] = "1" if repeat else "0"
    sink = io.StringIO()
    start = time.process_time()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        estimate = estimate_command(argv, isolate=False, steps=steps, **kwargs)
    seconds = time.process_time() - start
    capture = estimate.capture
    figures = {
        "peak_bytes": estimate.peak_bytes,
        "peak_reserved_bytes": estimate.peak_reserved_bytes,
        "peak_allocated_bytes": estimate.peak_allocated_bytes,
        "steps": estimate.steps,
        "events": len(capture.trace),
        "trace": trace_digest(capture.trace),
        "repeated": any("repeated from step" in note for note in estimate.notes),
    }
    return seconds, figures


def cnn_rows(count: int) -> int:
    from peakmem.baselines.peakmem_estimator import (
        PeakmemEstimator,
        compared_bytes,
        job_command,
        stated_fraction,
    )
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.datasets.loaders import load_rows, spread_subset
    from peakmem.estimate import estimate_command

    def figures(row, estimate) -> tuple:
        compared = compared_bytes(row, estimate)
        return (estimate.peak_bytes, estimate.peak_reserved_bytes, estimate.peak_allocated_bytes,
                estimate.peak_bytes_with_margin, compared, stated_fraction(estimate, compared),
                estimate.steps)

    os.environ.pop(ENV_FLAG, None)
    rows = spread_subset(evaluation_rows(load_rows("gpumemnet-cnn", DATA)), count)
    cpu = {"default": 0.0, "bench": 0.0}
    differ, failed = [], []
    for number, row in enumerate(rows):
        got = {}
        # alternate which way runs first: the second reuses the first's cached op layouts
        for way in ("default", "bench") if number % 2 == 0 else ("bench", "default"):
            sink = io.StringIO()
            start = time.process_time()
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    if way == "bench":
                        estimate = PeakmemEstimator().run(row)
                    else:
                        estimate = estimate_command(job_command(row), gpu=row.gpu,
                                                    torch_version=row.torch_version,
                                                    isolate=False)
                got[way] = figures(row, estimate)
            except Exception as exc:  # noqa: BLE001 - a row the bench cannot estimate
                got[way] = ("error", type(exc).__name__)
            cpu[way] += time.process_time() - start
        if "error" in got["default"]:
            failed.append(row.id)
        if got["default"] != got["bench"]:
            differ.append(row.id)
    print(json.dumps({"cnn_rows": len(rows), "same": len(rows) - len(differ), "differ": differ,
                      "failed_both_ways": failed, "cpu_s_default": round(cpu["default"], 1),
                      "cpu_s_bench": round(cpu["bench"], 1)}))
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default=None)
    parser.add_argument("--cnn-rows", type=int, default=None)
    args = parser.parse_args()
    if args.cnn_rows:
        return cnn_rows(args.cnn_rows)
    differ = []
    for name, argv, kwargs in jobs():
        if args.only and args.only not in name:
            continue
        run_once(argv, kwargs, args.steps, repeat=False)  # warm-up: imports, the meta cache
        times: dict[bool, list[float]] = {False: [], True: []}
        figures: dict[bool, dict] = {}
        for _ in range(args.repeats):
            for repeat in (False, True):
                seconds, figures[repeat] = run_once(argv, kwargs, args.steps, repeat)
                times[repeat].append(seconds)
        off, on = dict(figures[False]), dict(figures[True])
        repeated = on.pop("repeated")
        off.pop("repeated")
        same = off == on
        if not same:
            differ.append(name)
        full, fast = statistics.median(times[False]), statistics.median(times[True])
        print(json.dumps({"job": name, "steps": args.steps, "cpu_s_full": round(full, 3),
                          "cpu_s_repeated": round(fast, 3), "speedup": round(full / fast, 2),
                          "repeated": repeated, "identical": same,
                          **({} if same else {"full": off, "fast": on})}), flush=True)
    os.environ.pop(ENV_FLAG, None)
    print(f"{len(differ)} differ: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
