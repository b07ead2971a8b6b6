"""Default vs `--steps all` (and the old stop at the limit) on the loop shapes that no line leads
out of (tests/capture/test_loop_ends_without_exit_line.py's jobs: a Linear(64, 64) trained N
steps, then 16 MiB allocated after the loop), with each estimate's seconds.

    PYTHONPATH=src python benchmarks/loop_end_shapes.py [--n 200] [--only SUBSTRING]

Columns: peak allocated bytes of the default run (the loop ended at its head), of `--steps all`,
and of `--steps 3` (the job stopped at the limit, as the default did before the loop could be
ended), and the seconds of the default and `--steps all` estimates.
"""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import sys
import tempfile
import time
from pathlib import Path

from peakmem.estimate import estimate

ROOT = Path(__file__).resolve().parents[1]
SHAPES_FILE = ROOT / "tests" / "capture" / "test_loop_ends_without_exit_line.py"


def _shapes():
    spec = importlib.util.spec_from_file_location("loop_end_shapes_jobs", SHAPES_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path: Path, steps):
    started = time.perf_counter()
    est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1", steps=steps)
    seconds = time.perf_counter() - started
    if est.capture is None or est.capture.error is not None:
        raise SystemExit(f"{path}: the capture failed")
    return est.peak_allocated_bytes, seconds, est.capture.stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="the loop's length (N)")
    parser.add_argument("--only", default="", help="run the shapes whose name contains this")
    args = parser.parse_args(argv)
    jobs = _shapes()
    print(f"{'shape':28} {'default':>10} {'all':>10} {'stop@3':>10} {'s default':>9} "
          f"{'s all':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.py"
        for name, (body, _held, _shown) in sorted(jobs.SHAPES.items()):
            if args.only not in name:
                continue
            path.write_text(jobs.job(body, args.n))
            default, default_s, stopped = _run(path, None)
            full, full_s, _ = _run(path, "all")
            old, _, _ = _run(path, 3)
            flag = " (stopped)" if stopped else ""
            print(f"{name:28} {default:>10} {full:>10} {old:>10} {default_s:>9.1f} "
                  f"{full_s:>7.1f}{flag}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
