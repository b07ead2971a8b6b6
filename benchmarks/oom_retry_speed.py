"""CPU microseconds per `capture.oom_retry.retry_loop_on_stack` call, ~50 frames deep, with no
retry loop's file loaded and with one loaded (then the whole stack is walked).

    python benchmarks/oom_retry_speed.py [--depth 50] [--calls 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types

from peakmem.capture import oom_retry


def _nest(depth: int, call):
    return _nest(depth - 1, call) if depth else call()


def _per_call_us(calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            oom_retry.retry_loop_on_stack()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    loaded = any(
        isinstance(getattr(m, "__file__", None), str)
        and m.__file__.endswith(tuple(oom_retry.RETRY_LOOPS))
        for m in list(sys.modules.values())
    )
    out = {"stack_depth": _nest(args.depth, _stack_depth)}
    if not loaded:
        out["no_retry_loop_file_us"] = round(_nest(args.depth, lambda: _per_call_us(args.calls)), 3)
    fake = types.ModuleType("oom_retry_speed_fake_accelerate_memory")
    fake.__file__ = "/site/" + next(iter(oom_retry.RETRY_LOOPS))
    sys.modules[fake.__name__] = fake
    out["retry_loop_file_loaded_us"] = round(_nest(args.depth, lambda: _per_call_us(args.calls)), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
