"""Accuracy guard for speed work: ~20 jobs of every kind, their estimates to the byte.

    python benchmarks/speed_regression.py --write benchmarks/data/speed_regression.json
    python benchmarks/speed_regression.py --check benchmarks/data/speed_regression.json

Each job is estimated (in this process, as the bench does; `--isolated` through the supervised
child, as `peakmem estimate` does) and its peak_bytes / peak_reserved / peak_allocated and a
digest of the captured trace (every event and its tag) are recorded. `--check` compares with a
recorded file and exits 1 on any difference: a speed change must not move an estimate by a byte.
`--utilization-out FILE` also writes, per job, a digest of its utilization record (the trace's
per-op costs) and of the estimate's utilization figures, to compare two source trees (run the
script once with each tree's `src` on PYTHONPATH and diff the files): `--check` covers the trace
and the peaks only. `--only SUBSTRING` runs the matching jobs only. `--warm` (implies `--isolated`) starts a warm job
process (`peakmem warm`, in a private runtime directory of its own) first, so every job's child
is forked from it, and checks that each job did run warm.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "benchmarks" / "zoo"
DATA = ROOT.parent / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")

# (name, dataset, row index) rows of the bench sets: MLP, CNN (each architecture), transformer, xMem
BENCH_ROWS = [
    ("mlp1-a", "gpumemnet-mlp1", 0),
    ("mlp1-b", "gpumemnet-mlp1", 1500),
    ("mlp1-c", "gpumemnet-mlp1", 2900),
    ("mlp2-a", "gpumemnet-mlp2", 7),
    ("mlp2-b", "gpumemnet-mlp2", 2222),
    ("cnn-a", "gpumemnet-cnn", 0),
    ("cnn-b", "gpumemnet-cnn", 400),
    ("cnn-c", "gpumemnet-cnn", 800),
    ("cnn-d", "gpumemnet-cnn", 1200),
    ("cnn-e", "gpumemnet-cnn", 1600),
    ("cnn-f", "gpumemnet-cnn", 2000),
    ("transformer-a", "gpumemnet-transformer", 0),
    ("transformer-b", "gpumemnet-transformer", 9),
    ("xmem-a", "xmem", 0),
    ("xmem-b", "xmem", 40),
]

# (name, argv, estimate kwargs) of zoo and example scripts
SCRIPTS = [
    ("zoo-mlp", ["python", str(ZOO / "mlp.py"), "--hidden-size", "512", "--depth", "3",
                 "--batch-size", "32"], {}),
    ("zoo-gpt2-tiny", ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2",
                       "--num-layers", "2", "--hidden-size", "128", "--num-heads", "4",
                       "--batch-size", "2", "--seq-len", "64", "--optimizer", "adamw"], {}),
    ("zoo-gpt2-tiny-expandable", ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2",
                                  "--num-layers", "2", "--hidden-size", "128", "--num-heads",
                                  "4", "--batch-size", "2", "--seq-len", "64"],
     {"alloc_conf": "expandable_segments:True"}),
    ("zoo-resnet18", ["python", str(ZOO / "vision.py"), "--model", "resnet18", "--batch-size",
                      "4", "--image-size", "64"], {}),
    ("zoo-unet", ["python", str(ZOO / "unet.py"), "--image-size", "64", "--base-channels", "8",
                  "--batch-size", "2"], {}),
    ("zoo-dlrm", ["python", str(ZOO / "dlrm.py"), "--rows", "1000", "--tables", "4",
                  "--batch-size", "64"], {}),
    ("example-mlp", ["python", "-m", "peakmem.examples.mlp_train"], {}),
]


def trace_digest(trace) -> str:
    digest = hashlib.sha1()
    for column in (trace.kinds, trace.ids, trace.sizes, trace.streams):
        digest.update(json.dumps(column).encode())
    digest.update(json.dumps([None if t is None else t.to_json()
                              for t in map(trace.tag_of, range(len(trace)))]).encode())
    return digest.hexdigest()[:16]


def utilization_digest(estimate) -> str:
    """A digest of the capture's utilization record and the estimate's utilization figures."""
    capture = estimate.capture
    record = capture.trace.meta.get("utilization") if capture is not None else None
    figures = estimate.utilization.to_json() if estimate.utilization is not None else None
    text = json.dumps([record, figures], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _figures(estimate) -> dict:
    capture = estimate.capture
    return {
        "peak_bytes": estimate.peak_bytes,
        "peak_reserved_bytes": estimate.peak_reserved_bytes,
        "peak_allocated_bytes": estimate.peak_allocated_bytes,
        "steps": estimate.steps,
        "events": len(capture.trace) if capture is not None else None,
        "trace": trace_digest(capture.trace) if capture is not None else None,
    }


def jobs() -> list[tuple[str, list[str], dict]]:
    from peakmem.baselines.peakmem_estimator import job_command
    from peakmem.datasets.loaders import load_rows

    out = []
    cache: dict = {}
    for name, dataset, index in BENCH_ROWS:
        rows = cache.setdefault(dataset, load_rows(dataset, DATA))
        row = rows[min(index, len(rows) - 1)]
        out.append((name, job_command(row), {"gpu": row.gpu, "torch_version": row.torch_version}))
    out.extend(SCRIPTS)
    return out


@contextlib.contextmanager
def warm_process():
    """A warm job process in a private runtime directory for the duration."""
    import os
    import tempfile

    from peakmem.jobs import zygote_client

    with tempfile.TemporaryDirectory(prefix="peakmem-regression-") as directory:
        os.environ["PEAKMEM_RUNTIME_DIR"] = directory
        os.environ.pop("PEAKMEM_WARM", None)
        zygote_client.start(idle_seconds=600)
        try:
            yield
        finally:
            zygote_client.stop()
            del os.environ["PEAKMEM_RUNTIME_DIR"]


def run_one(argv: list[str], kwargs: dict, isolate: bool, utilization: bool = False) -> dict:
    from peakmem.estimate import EstimateError, estimate_command

    sink = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            estimate = estimate_command(argv, isolate=isolate, **kwargs)
    except EstimateError as exc:
        capture = exc.capture
        figures = {"error": exc.kind, "events": len(capture.trace) if capture else None,
                   "trace": trace_digest(capture.trace) if capture else None}
    else:
        figures = _figures(estimate)
        if utilization:
            figures["utilization"] = utilization_digest(estimate)
        if isolate and any("warm job process (peakmem warm)" in n for n in estimate.notes):
            figures["warm"] = True
    figures["seconds"] = round(time.perf_counter() - start, 2)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path)
    parser.add_argument("--check", type=Path)
    parser.add_argument("--only", default=None)
    parser.add_argument("--utilization-out", type=Path, default=None,
                        help="write each job's utilization digest here (JSON)")
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--warm", action="store_true",
                        help="through a warm job process (peakmem warm); implies --isolated")
    args = parser.parse_args()
    with warm_process() if args.warm else contextlib.nullcontext():
        return _run(args, isolated=args.isolated or args.warm, warm=args.warm)


def _run(args: argparse.Namespace, isolated: bool, warm: bool) -> int:
    expected = json.loads(args.check.read_text()) if args.check else {}
    results: dict = {}
    utilization: dict = {}
    differ = []
    for name, argv, kwargs in jobs():
        if args.only and args.only not in name:
            continue
        figures = run_one(argv, kwargs, isolated, args.utilization_out is not None)
        if "utilization" in figures:
            utilization[name] = figures.pop("utilization")
        ran_warm = figures.pop("warm", False)
        if warm and not ran_warm and "error" not in figures:
            differ.append(f"{name} (not warm)")
        results[name] = figures
        want = expected.get(name)
        same = None
        if want is not None:
            same = {k: v for k, v in want.items() if k != "seconds"} == {
                k: v for k, v in figures.items() if k != "seconds"}
            if not same:
                differ.append(name)
        mark = "" if same is None else (" same" if same else f" DIFFERS (was {want})")
        print(f"{name}: {json.dumps(figures)}{mark}", flush=True)
    if args.write:
        args.write.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.utilization_out:
        args.utilization_out.write_text(json.dumps(utilization, indent=1, sort_keys=True) + "\n")
    total = sum(f["seconds"] for f in results.values())
    print(f"total {total:.1f} s; {len(differ)} differ: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
