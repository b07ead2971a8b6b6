"""CPU microseconds of one torch call end to end inside a capture, and the Python frames on its
path (issue 14: the capture's per-op path).

    python benchmarks/per_op_path_speed.py [--calls 3000]            # us per call, best of 3
    python benchmarks/per_op_path_speed.py --frames relu [--calls 5000]  # cProfile of that op

Inside one capture (`estimate` of an in-process job, fake device tensors), each op below is
called `--calls` times after 200 warm-up calls (its meta-cache entry made): `add` (`x + x`, a
16 x 16 float tensor), `relu` (`torch.relu(x)`), `mul_` (`x.mul_(1.0)`), `conv2d`
(`F.conv2d`, 2 x 8 x 16 x 16 input, 8 x 8 x 3 x 3 weight) and `linear` (an `nn.Linear(16, 16)`
module call: the module hooks, `addmm`'s cuBLAS rule). Prints one line of `name=us` pairs (CPU
seconds: `time.process_time`). Run it with each source tree's `src` on PYTHONPATH, alternately,
to compare two trees. `--frames OP` runs that op's calls under cProfile instead and lists every
function on its path with its calls per op and its own (self) microseconds per op (cProfile's
clock: each frame costs more than without it; the list ranks the layers, the plain timing is
the figure).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from peakmem.estimate import estimate


def _ops() -> dict[str, Callable[[], object]]:
    x = torch.randn(16, 16, device="cuda")
    image = torch.randn(2, 8, 16, 16, device="cuda")
    conv = nn.Conv2d(8, 8, 3, padding=1).cuda()
    linear = nn.Linear(16, 16).cuda()
    return {
        "add": lambda: x + x,
        "relu": lambda: torch.relu(x),
        "mul_": lambda: x.mul_(1.0),
        "conv2d": lambda: F.conv2d(image, conv.weight, conv.bias, padding=1),
        "linear": lambda: linear(x),
    }


def _frames(profile: cProfile.Profile, calls: int) -> list[str]:
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    rows = sorted(stats.items(), key=lambda item: -item[1][2])
    lines = [f"{'calls/op':>8} {'self us/op':>10} {'cum us/op':>9}  function"]
    for (path, line, name), (_cc, count, own, cumulative, _callers) in rows:
        if count < calls or "per_op_path_speed" in path:
            continue  # not on every call's path (warm-up, set-up), or this script's loop
        where = f"{path.rsplit('site-packages/', 1)[-1].rsplit('src/', 1)[-1]}:{line}"
        lines.append(f"{count / calls:8.1f} {own / calls * 1e6:10.2f} "
                     f"{cumulative / calls * 1e6:9.2f}  {name} ({where})")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--frames", default=None, help="cProfile this op's calls")
    args = parser.parse_args()
    timings: dict[str, float] = {}
    report: list[str] = []

    def job() -> None:
        for name, call in _ops().items():
            if args.frames is not None and name != args.frames:
                continue
            for _ in range(200):
                call()
            if args.frames is not None:
                profile = cProfile.Profile(time.process_time)
                profile.enable()
                for _ in range(args.calls):
                    call()
                profile.disable()
                report.extend(_frames(profile, args.calls))
                continue
            rounds = []
            for _ in range(3):
                start = time.process_time()
                for _ in range(args.calls):
                    call()
                rounds.append((time.process_time() - start) / args.calls * 1e6)
            timings[name] = min(rounds)

    estimate(job, gpu="a100-40gb", steps="all")
    if args.frames is not None:
        print("\n".join(report))
    else:
        print(" ".join(f"{name}={us:.1f}" for name, us in timings.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
