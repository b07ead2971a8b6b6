"""Allocator simulation speed: replay a 1-million-event trace and time it.

    python benchmarks/allocator_speed.py [--events 1000000] [--repeat 3]

The trace is synthetic but shaped like training: per step, parameter-sized gradients that live
for the step, activations freed in reverse order in the backward pass, short-lived temporaries
between them, and a side stream for a few buffers. Prints one JSON line per allocator config (device capacity 80 GiB).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

from peakmem.allocator import simulate
from peakmem.trace import Trace

MiB = 1024 * 1024


def training_like_trace(n_events: int, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    trace = Trace()
    layer_sizes = [
        rng.choice([rng.randint(1, MiB), rng.randint(MiB, 64 * MiB)]) for _ in range(200)
    ]
    params = [trace.alloc(s) for s in layer_sizes]
    del params
    while len(trace) < n_events:
        saved = []
        for size in layer_sizes:  # forward: saved activations and temporaries
            saved.append(trace.alloc(size * 2))
            tmp = trace.alloc(size)
            trace.free(tmp)
        grads = []
        for size in reversed(layer_sizes):  # backward
            grads.append(trace.alloc(size))
            tmp = trace.alloc(size * 3)
            if rng.random() < 0.05:
                side = trace.alloc(size, stream=1)
                trace.free(side)
            trace.free(tmp)
            trace.free(saved.pop())
        for g in grads:  # optimizer
            trace.free(g)
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    t0 = time.perf_counter()
    trace = training_like_trace(args.events)
    build = time.perf_counter() - t0
    for conf in ("", "expandable_segments:True", "max_split_size_mb:128"):
        times, cpu_times = [], []
        for _ in range(args.repeat):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = simulate(trace, conf, capacity_bytes=80 * 1024 * MiB)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        print(
            json.dumps(
                {
                    "events": len(trace),
                    "alloc_conf": conf,
                    "best_seconds": round(min(times), 3),
                    "best_cpu_seconds": round(min(cpu_times), 3),  # wall on a shared machine: CPU
                    "build_seconds": round(build, 3),
                    "peak_reserved_bytes": result.peak_reserved_bytes,
                    "num_alloc_retries": result.num_alloc_retries,
                    "oom": result.oom,
                    "python": platform.python_version(),
                    "machine": platform.machine(),
                }
            )
        )


if __name__ == "__main__":
    main()
