"""Where one estimate's time goes: CPU per aten op, or cProfile grouped by file.

    python benchmarks/profile_estimate.py transformer-a [--per-op] [--cold] [--top 25]

JOB is a name from benchmarks/speed_regression.py (mlp1-a, cnn-c, transformer-a, xmem-a,
zoo-gpt2-tiny, ...). The job is estimated in this process (as the bench does), once to warm up
(imports, the meta cache) unless `--cold`, then once measured. `--per-op`: CPU seconds spent in
the recorder's dispatch per aten op (kernel, rules and bookkeeping); otherwise cProfile's own
time grouped by package / peakmem module, then the top functions.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _estimate(argv: list[str], kwargs: dict):
    from peakmem.estimate import estimate_command

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        return estimate_command(argv, isolate=False, **kwargs)


def per_op(argv: list[str], kwargs: dict, top: int) -> None:
    from peakmem.capture import recorder

    cost: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    original = recorder.AllocationRecorder._dispatch
    depth = [0]

    def timed(self, func, args, kw):
        depth[0] += 1
        start = time.process_time()
        try:
            return original(self, func, args, kw)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                cost[str(func)] += time.process_time() - start
                count[str(func)] += 1

    recorder.AllocationRecorder._dispatch = timed
    try:
        start = time.process_time()
        _estimate(argv, kwargs)
        total = time.process_time() - start
    finally:
        recorder.AllocationRecorder._dispatch = original
    print(f"CPU {total:.3f} s, in the recorder's dispatch {sum(cost.values()):.3f} s, "
          f"{sum(count.values())} ops")
    for name, seconds in cost.most_common(top):
        print(f"{seconds:8.3f} s {count[name]:7d} calls {1e6 * seconds / count[name]:9.1f} us  {name}")


def _group(filename: str, function: str) -> str:
    if "/peakmem/" in filename:
        return "peakmem/" + filename.split("/peakmem/", 1)[1]
    if "site-packages/" in filename:
        parts = filename.split("site-packages/", 1)[1].split("/")
        return "/".join(parts[:2])
    if filename == "~":
        return "builtin " + function
    return filename.rsplit("/", 1)[-1]


def profiled(argv: list[str], kwargs: dict, top: int) -> None:
    profile = cProfile.Profile()
    start = time.process_time()
    profile.enable()
    estimate = _estimate(argv, kwargs)
    profile.disable()
    print(f"CPU {time.process_time() - start:.3f} s (under cProfile), "
          f"{len(estimate.capture.trace)} events")
    stats = pstats.Stats(profile)
    groups: collections.Counter = collections.Counter()
    for (filename, _line, function), (_cc, _nc, own, _cum, _callers) in stats.stats.items():
        groups[_group(filename, function)] += own
    total = sum(groups.values()) or 1.0
    for name, seconds in groups.most_common(top):
        print(f"{seconds:8.3f} s {100 * seconds / total:5.1f}%  {name}")
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    from speed_regression import jobs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job")
    parser.add_argument("--per-op", action="store_true")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    known = {name: (argv, kwargs) for name, argv, kwargs in jobs()}
    if args.job not in known:
        parser.error(f"unknown job {args.job!r}; known: {', '.join(known)}")
    argv, kwargs = known[args.job]
    if not args.cold:
        _estimate(argv, kwargs)
    (per_op if args.per_op else profiled)(argv, kwargs, args.top)


if __name__ == "__main__":
    main()
