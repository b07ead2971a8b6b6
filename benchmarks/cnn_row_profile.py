"""Where a held-out GPUMemNet CNN row's CPU time goes, in one process as a bench worker runs it
(issue 14).

    python benchmarks/cnn_row_profile.py [--rows 15] [--top 25]            # sampled, CPU time
    python benchmarks/cnn_row_profile.py --rows 30 --cumulative 80          # + cumulative shares
    python benchmarks/cnn_row_profile.py --rows 5 --cprofile [--top 25]    # cProfile, self time
    python benchmarks/cnn_row_profile.py --rows 8 --cprofile --dump FILE   # + pstats file
    python benchmarks/cnn_row_profile.py --rows 15 --plain                  # CPU s, no profiler
    python benchmarks/cnn_row_profile.py --rows 30 --gc                     # + garbage collections

The rows are `--rows` of the held-out CNN set spread over it (`spread_subset` of rows + 1, the
first a warm-up), estimated with `PeakmemEstimator` after the bench worker's own initializer
(`_init_worker`: one intra-op thread, start-up objects frozen) and through the worker's own
per-row call (`_work`: the objects alive frozen again after the worker's 1st, 2nd, 4th, ...
row), so each row sees what it sees in `peakmem bench` (a warm meta cache from the rows before
it).

Default: a CPU-time sampler (`ITIMER_PROF` every 0.5 ms; the kernel delivers at its own tick,
~4 ms here) records each sample's Python stack; printed are the share of samples inside each of
the row's parts (cumulative) and the `--top` functions by samples at the top of the stack. A
sample taken while C code runs lands on the next Python frame to run, so "self" shares of
functions that call into torch's C++ (the torch-function modes, `find_torch_dispatch_rule`) hold
that C++ time; the parts' cumulative shares are sound. cProfile (`--cprofile`) counts every
call instead: it slows the rows ~6x and inflates the functions called most often (builtins,
small helpers), so its self times rank the per-call Python, not the share of a row. `--plain`
runs the rows with no profiler and prints their CPU seconds and a digest of their results
(estimate bytes, stated margins, errors): run it with each source tree's `src` on PYTHONPATH,
alternately, to compare two trees (the same digest: the same estimates). `--gc` is `--plain`
plus, per generation, the collections the rows ran and their CPU seconds (`gc.callbacks`).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import hashlib
import io
import json
import os
import pstats
import signal
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")

PARTS = [
    ("training loop (`train`)", "zoo/_common.py:train"),
    ("  forward + loss", "gpumemnet.py:loss_fn"),
    ("  backward", "torch/_tensor.py:backward"),
    ("  optimizer step", "torch/optim/adam.py:step"),
    ("  next batch (DataLoader)", "capture/dataloader.py:__next__"),
    ("model build (`build_model`)", "datasets/gpumemnet_models.py:build_model"),
    ("model `.to(device)`", "torch/nn/modules/module.py:to"),
    ("estimate from the capture (`estimate_capture`)", "estimate/api.py:estimate_capture"),
    ("  allocator replay (`simulate`)", "allocator/simulate.py:simulate"),
    ("`side_effects` install (per capture)", "capture/side_effects.py:install"),
    ("recorder dispatch (`__torch_dispatch__`)", "capture/recorder.py:__torch_dispatch__"),
    ("  meta cache (`MetaCache.call_entry`)", "capture/meta_cache.py:call_entry"),
    ("  utilization observer", "utilization/observer.py:observe"),
    ("  session storage tracking", "capture/session.py:track"),
    ("capture mode (`CaptureModes.__torch_function__`)",
     "capture/capture_modes.py:__torch_function__"),
    ("host deferral mode (`HostDeferral.__torch_function__`)",
     "capture/host_deferred.py:__torch_function__"),
    ("device map mode (`CudaAsMeta.__torch_function__`)", "capture/device_map.py:__torch_function__"),
]


def _name(code) -> str:
    path = code.co_filename.replace("\\", "/")
    for marker in ("site-packages/", "/src/peakmem/", "/benchmarks/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_name}"


def _rows(count: int):
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.datasets.loaders import load_rows, spread_subset

    return spread_subset(evaluation_rows(load_rows("gpumemnet-cnn", DATA)), count + 1)


def _watch_collections() -> dict[int, list]:
    """generation -> [collections, CPU seconds], filled from now on by a `gc.callbacks` entry."""
    import gc

    by_generation: dict[int, list] = collections.defaultdict(lambda: [0, 0.0])
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            entry = by_generation[info["generation"]]
            entry[0] += 1
            entry[1] += time.process_time() - started[0]

    gc.callbacks.append(callback)
    return by_generation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cumulative", type=int, default=0, metavar="N",
                        help="also the N functions with the most samples anywhere on the stack")
    parser.add_argument("--cprofile", action="store_true", help="cProfile's self times instead")
    parser.add_argument("--dump", metavar="FILE",
                        help="with --cprofile: also write the profile's stats to FILE (pstats)")
    parser.add_argument("--plain", action="store_true",
                        help="no profiler: the rows' CPU seconds and a digest of their results")
    parser.add_argument("--gc", action="store_true",
                        help="--plain, and the garbage collections of the rows per generation")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.bench.runner import _init_worker, _work

    rows = _rows(args.rows)
    estimator = PeakmemEstimator()
    _init_worker({"peakmem": estimator})
    _work("peakmem", rows[0])  # warm-up: imports, first calls

    if args.plain or args.gc:
        collections_by_generation = _watch_collections() if args.gc else None
        start = time.process_time()
        results = [_work("peakmem", row)[1] for row in rows[1:]]
        cpu = time.process_time() - start
        fields = [[r.estimate_bytes, r.stated_margin, r.error] for r in results]
        digest = hashlib.sha256(json.dumps(fields, default=str).encode()).hexdigest()[:12]
        print(f"{len(results)} rows, {cpu:.2f} CPU s, results {digest}")
        if collections_by_generation is not None:
            for generation, (count, seconds) in sorted(collections_by_generation.items()):
                print(f"gen{generation}: {count} collections, {seconds:.3f} CPU s "
                      f"({100 * seconds / cpu:.1f}% of the rows)")
        return 0

    if args.cprofile:
        profile = cProfile.Profile(time.process_time)
        start = time.process_time()
        profile.enable()
        results = [_work("peakmem", row)[1] for row in rows[1:]]
        profile.disable()
        print(f"{len(results)} rows, {time.process_time() - start:.2f} CPU s under cProfile")
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
        if args.dump:
            profile.dump_stats(args.dump)
        print(out.getvalue())
        return 0

    stacks: list[list[str]] = []

    def sample(_signum, frame) -> None:
        stack = []
        while frame is not None:
            stack.append(_name(frame.f_code))
            frame = frame.f_back
        stacks.append(stack)

    signal.signal(signal.SIGPROF, sample)
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)
    try:
        results = [_work("peakmem", row)[1] for row in rows[1:]]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    cpu = time.process_time() - start
    total = max(len(stacks), 1)
    errors = sum(1 for r in results if r.error)
    print(f"{len(results)} rows ({errors} errors), {cpu:.2f} CPU s, {len(stacks)} samples")
    print("\npart | share of the rows' samples (cumulative)")
    for label, key in PARTS:
        inside = sum(1 for stack in stacks if any(name.endswith(key) for name in stack))
        print(f"{label} | {100 * inside / total:.1f}%")
    print(f"\ntop {args.top} functions by samples at the top of the stack")
    tops = collections.Counter(stack[0] for stack in stacks if stack)
    for name, count in tops.most_common(args.top):
        print(f"{100 * count / total:5.1f}% {name}")
    if args.cumulative:
        print(f"\ntop {args.cumulative} functions by samples anywhere on the stack (cumulative)")
        anywhere = collections.Counter(name for stack in stacks for name in set(stack))
        for name, count in anywhere.most_common(args.cumulative):
            print(f"{100 * count / total:5.1f}% {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
