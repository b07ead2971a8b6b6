"""What the safe-pickle probe (trace/safe_pickle.py `_probe_in_child`) costs per file: the
median wall time of probing a small and a 7 MB snapshot-shaped pickle, in this process fresh or
holding 1.5 GB of touched heap (`--hold`), optionally next to another version of the module
(`--compare FILE`, e.g. the fork-based probe of bdb3e9f:
`git show bdb3e9f:src/peakmem/trace/safe_pickle.py > /tmp/safe_pickle_fork.py`).

    PYTHONPATH=src python benchmarks/pickle_probe_cost.py [--hold] [--compare /tmp/safe_pickle_fork.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import statistics
import time

import peakmem.trace.safe_pickle as current


def _module_from(path: str):
    spec = importlib.util.spec_from_file_location("compared_safe_pickle", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snapshot(entries: int) -> bytes:
    trace = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "frames": []}
             for i in range(entries)]
    return pickle.dumps({"device_traces": [trace]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", action="store_true", help="hold 1.5 GB of touched heap first")
    parser.add_argument("--compare", help="another safe_pickle.py to time next to this one")
    args = parser.parse_args()
    held = []
    if args.hold:
        held = [bytearray(b"\1" * 2**20) for _ in range(1500)]
    modules = [("this", current)]
    if args.compare:
        modules.insert(0, ("compared", _module_from(args.compare)))
    for name, data, runs in (("small", _snapshot(300), 7), ("7MB", _snapshot(250_000), 3)):
        for label, module in modules:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                module._probe_in_child(data)
                times.append(time.perf_counter() - start)
            print(f"{'held 1.5 GB' if held else 'fresh':11} {name:5} {len(data):>9} B  "
                  f"{label:8} median of {runs}: {statistics.median(times) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
