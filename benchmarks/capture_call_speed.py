"""CPU microseconds per torch call inside a capture (issue 14: the torch-function modes' cost).

    python benchmarks/capture_call_speed.py [--calls 3000]

Inside one capture (`estimate` of an in-process job), times attribute reads of a parameter
(`p.grad`, `p.layout`), `x.dim()`, `x.device`, `x + x`, `y.item()`, `torch.relu(x)` and
`F.relu(x)` on fake device tensors: each `--calls` times after a warm-up, the best of 3 rounds,
CPU microseconds per call. "plain": no host-deferred tensor alive (the capture's storage kinds
empty); "marked": a host-deferred weight alive (every call then checks its arguments' storages).
Prints one line of `name=us` pairs. Run it with another source tree first on PYTHONPATH to
compare (the same process layout, the same machine minutes).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

from peakmem.estimate import estimate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    calls = parser.parse_args().calls
    timings: dict[str, float] = {}

    def timed(name: str, call: Callable[[], object]) -> None:
        for _ in range(200):
            call()
        rounds = []
        for _ in range(3):
            start = time.process_time()
            for _ in range(calls):
                call()
            rounds.append((time.process_time() - start) / calls * 1e6)
        timings[name] = min(rounds)

    def job() -> None:
        p = nn.Linear(64, 64).cuda().weight
        x = torch.randn(8, 64, device="cuda")
        y = torch.zeros((), device="cuda")
        for marked in (False, True):
            kept = nn.Linear(256, 256) if marked else None  # its weight stays host-deferred
            tag = "marked" if marked else "plain"
            timed(f"{tag} p.grad", lambda: p.grad)
            timed(f"{tag} p.layout", lambda: p.layout)
            timed(f"{tag} x.dim()", lambda: x.dim())
            timed(f"{tag} x.device", lambda: x.device)
            timed(f"{tag} x + x", lambda: x + x)
            timed(f"{tag} y.item()", lambda: y.item())
            timed(f"{tag} torch.relu(x)", lambda: torch.relu(x))
            timed(f"{tag} F.relu(x)", lambda: nn.functional.relu(x))
            del kept

    estimate(job, gpu="a100-40gb", steps="all")
    print(" ".join(f"{name}={us:.2f}" for name, us in timings.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
