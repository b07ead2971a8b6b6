"""Fit the torch-2.6 stack's stated safety margins (per GPU and margin kind) on the declared
xMem calibration split, and report the held-out failure rate per kind.

    python benchmarks/fit_xmem_margins.py [--jobs 2] [--cache /tmp/peakmem-xmem-margins-v1.jsonl]
        [--heldout CACHE.jsonl] [--per-gpu] [--write]

The split is peakmem.bench.calibration's (sha1('xmem:' + run_dir) % 100 < 18: 26 of 131 runs);
every split run is estimated here (the bench never scores them) and judged as the bench judges
it (bench/metrics.py): a run that ran needs estimate-with-margin >= measured, a run that ran out
of memory needs it > the GPU's total. `peak_bytes_with_margin` is peak x (1 + m) + the kind's
reserve (estimate/margin_reserve.py) and xMem's measurement leaves the context at creation out
(baselines/peakmem_estimator.py `compared_bytes`), so the margin a run needs is

    m = (needed - compared - reserve) / peak        (needed: measured, or total + 1 byte on OOM)

Per GPU and kind the fit is the largest m a split run of the GPU's pool (`POOLS`: the RTX 3060
and 4060 together) needs (bench/calibration.py `safety_margin`: with fewer than 100 runs it
leaves none above; needs below 0 count as 0), rounded up to 0.5%, plus ALLOWANCE for the runs
so few split runs do not show. A kind without a split run that ran in the pool keeps the
stack's carried-over margin (`safety_margin.default.<kind>`). `--heldout` reads the cache of `peakmem bench xmem
--estimators peakmem --report DIR` (held-out runs) and prints the failure rate per kind at the
carried-over margins and at the fitted ones: the cache keeps compared bytes and the stated
fraction, from which the peak (compared + the GPU's context at creation), the kind and the
reserve of each run follow (`recover_heldout`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from peakmem.estimate.margin_reserve import ATTENTION_RESERVE_SEGMENTS

STACK = Path(__file__).resolve().parents[1] / "src" / "peakmem" / "profiles" / "data" / "stacks" / "torch-2.6.toml"
DEFAULT_CACHE = Path("/tmp/peakmem-xmem-margins-v1.jsonl")
ALLOWANCE = 0.01
"""Added to the largest margin a split run needs: the split has 1-10 runs per GPU and kind, so
its largest miss is not the held-out tail's; 1 point of the peak, stated, not fitted."""
KINDS = ("cudnn_convolution", "attention", "default")
RESERVE_NOTE = (f", on top of the reserve every attention job states ({ATTENTION_RESERVE_SEGMENTS} "
                "segments of the largest gradient, or the layout probe's excess where larger: "
                "estimate/margin_reserve.py), which the need already counts")


def estimate_split_run(row_id: str) -> dict:
    """One split run's estimate, as the figures the margin fit needs."""
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator, compared_bytes
    from peakmem.datasets.loaders import load_rows

    row = next(r for r in load_rows("xmem") if r.id == row_id)
    estimate = PeakmemEstimator().run(row)
    return {"row_id": row.id, "gpu": row.gpu, "status": row.status,
            "measured_bytes": row.measured_peak_bytes, "gpu_total_bytes": row.gpu_total_bytes,
            "peak_bytes": estimate.peak_bytes, "compared_bytes": compared_bytes(row, estimate),
            "kind": estimate.margin_kind, "reserve_bytes": estimate.margin_reserve_bytes}


def needed_margin(run: dict) -> float:
    """The smallest m with compared + peak x m + reserve accurate as the bench judges it."""
    needed = run["gpu_total_bytes"] + 1 if run["status"] == "oom" else run["measured_bytes"]
    return (needed - run["compared_bytes"] - run["reserve_bytes"]) / run["peak_bytes"]


def fit(needs: list[float]) -> float:
    """The largest need (none left above with < 100 runs) + ALLOWANCE, up to 0.5%, >= 0."""
    from peakmem.bench.calibration import safety_margin

    worst = safety_margin(needs_as_errors(needs))  # the largest need, rounded up to 0.5%
    return math.ceil(round((worst + ALLOWANCE) * 200, 6)) / 200


def needs_as_errors(needs: list[float]) -> list[float]:
    """Needs as the relative errors `safety_margin` takes: a need m is an error 1/(1+m) - 1."""
    return [1 / (1 + m) - 1 for m in needs if m > -1]


def split_runs(jobs: int, cache: Path) -> list[dict]:
    from peakmem.bench.calibration import in_calibration_split
    from peakmem.datasets.loaders import load_rows

    ids = [r.id for r in load_rows("xmem") if in_calibration_split(r)]
    done = {}
    if cache.exists():
        done = {e["row_id"]: e for e in map(json.loads, cache.read_text().splitlines())}
    todo = [i for i in ids if i not in done]
    with ProcessPoolExecutor(max_workers=jobs) as pool, cache.open("a") as out:
        for found in pool.map(estimate_split_run, todo):
            print(f"{found['row_id']} {found['gpu']} {found['kind']}", file=sys.stderr, flush=True)
            out.write(json.dumps(found) + "\n")
            out.flush()
            done[found["row_id"]] = found
    return [done[i] for i in ids]


def carried_margins() -> dict[str, float]:
    """The stack's `safety_margin.default.<kind>`: the a100 / torch-2.4 fits carried over."""
    from peakmem.profiles import load_stack

    table = load_stack("2.6.0").safety_margin["default"]
    return {kind: float(table[kind].value) for kind in KINDS}


POOLS = {"rtx3060-12gb": "consumer", "rtx4060-8gb": "consumer"}
"""GPUs fitted together: the RTX 3060 and 4060 run the same torch 2.6 / CUDA 12.4 wheels (one
fit of the consumer stack, benchmarks/calibrate_xmem.py), and the split holds 2 runs on the
RTX 4060 that did not run out of memory; `--per-gpu` fits each GPU alone."""


def fit_margins(runs: list[dict], pools: dict[str, str] | None = None
                ) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(gpu, kind) -> (fitted margin, largest need, split runs) over the split's runs of the
    GPU's pool (`POOLS`; a GPU not in it is its own pool). A pool and kind is fitted only when
    one of its split runs ran: an OOM run whose estimate is past the GPU's total says nothing
    of how far under the runs that ran are; such a kind keeps the carried-over margin."""
    pools = POOLS if pools is None else pools
    needs: dict[tuple[str, str], list[float]] = defaultdict(list)
    ran: set[tuple[str, str]] = set()
    for run in runs:
        key = (pools.get(run["gpu"], run["gpu"]), run["kind"])
        needs[key].append(needed_margin(run))
        if run["status"] == "ok":
            ran.add(key)
    fitted = {}
    for gpu in sorted({run["gpu"] for run in runs}):
        for kind in KINDS:
            key = (pools.get(gpu, gpu), kind)
            if key in ran:
                fitted[(gpu, kind)] = (fit(needs[key]), max(needs[key]), len(needs[key]))
    return fitted


def context_at_creation(gpu: str) -> int:
    """What `compared_bytes` leaves out of xMem runs' peaks on `gpu`: the stack's context less
    its lazily loaded kernels (baselines/peakmem_estimator.py `context_at_creation_bytes`)."""
    from peakmem.profiles import load_gpu, load_stack

    stack, profile = load_stack("2.6.0"), load_gpu(gpu)
    return max(0, int(stack.context_for(profile).value) - int(stack.lazy_loaded_for(profile).value))


def stated_kind(peak: int, added: int, margin_sets: list[dict[str, float]]) -> tuple[str, int] | None:
    """(kind, reserve) of an estimate that added `added` bytes to `peak` for its margin:
    cudnn_convolution or default where `added` is int(peak x (1 + m)) - peak for the kind's m in
    one of the margin sets (kind -> fraction), else attention where it is that plus a reserve
    of whole 4 MiB (two segments of a 2 MiB-rounded size, or the layout reserve, rounded up to
    whole 4 MiB: estimate/margin_reserve.py); None when nothing fits."""
    for margins in margin_sets:  # an exact fit in any set first: a reserve can fit by chance
        for kind in ("cudnn_convolution", "default"):
            if abs(added - (int(peak * (1 + margins[kind])) - peak)) <= 2:
                return kind, 0
    for margins in margin_sets:
        reserve = added - (int(peak * (1 + margins["attention"])) - peak)
        if reserve > 0 and abs(reserve - round(reserve / (4 << 20)) * (4 << 20)) <= 2:
            return "attention", round(reserve / (4 << 20)) * (4 << 20)
    return None


def margin_sets(gpu: str, carried: dict[str, float]) -> list[dict[str, float]]:
    """The margins the stack states on `gpu` now, then the carried-over ones (a cache made
    before the fit)."""
    from peakmem.profiles import load_gpu, load_stack

    stack, profile = load_stack("2.6.0"), load_gpu(gpu)
    now = {kind: float(stack.safety_margin_for(profile, kind).value) for kind in KINDS}
    return [now, carried]


def recover_heldout(cache: Path, carried: dict[str, float]) -> list[dict]:
    """The held-out runs of a bench cache as the figures `needed_margin` takes: peak = compared
    + the GPU's context at creation (`context_at_creation`); the stated fraction x compared is
    what the margin added, from which `stated_kind` gives the kind and the reserve."""
    from peakmem.datasets.loaders import load_rows

    rows = {r.id: r for r in load_rows("xmem")}
    runs = []
    for entry in map(json.loads, cache.read_text().splitlines()):
        result = entry["result"]
        if "|xmem|peakmem" not in entry["key"] or result["estimate_bytes"] is None:
            continue
        row = rows[result["row_id"]]
        compared = result["estimate_bytes"]
        peak = compared + context_at_creation(row.gpu)
        found = stated_kind(peak, round(result["stated_margin"] * compared),
                            margin_sets(row.gpu, carried))
        if found is None:
            raise ValueError(f"run {row.id}: its stated margin fits no margin this stack states")
        runs.append({"row_id": row.id, "gpu": row.gpu, "status": row.status,
                     "measured_bytes": row.measured_peak_bytes,
                     "gpu_total_bytes": row.gpu_total_bytes, "peak_bytes": peak,
                     "compared_bytes": compared, "kind": found[0], "reserve_bytes": found[1]})
    return runs


def stated_over(run: dict, margin: float) -> float:
    """(estimate with `margin` - measured) / measured of a run that ran."""
    stated = run["compared_bytes"] + run["peak_bytes"] * margin + run["reserve_bytes"]
    return (stated - run["measured_bytes"]) / run["measured_bytes"]


def failure_table(runs: list[dict], margin_of) -> list[str]:
    """Markdown rows per kind (and per GPU and kind, and all): held-out runs, failures at
    `margin_of(gpu, kind)`, and the median over-estimate at it of the runs that ran."""
    fails: dict[str, list[bool]] = defaultdict(list)
    over: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        margin = margin_of(run["gpu"], run["kind"])
        for key in (run["kind"], f"{run['gpu']} {run['kind']}", "all"):
            fails[key].append(needed_margin(run) > margin)
            if run["status"] == "ok":
                over[key].append(stated_over(run, margin))
    return [f"| {key} | {len(found)} | {sum(found)} | {sum(found) / len(found):.1%} | "
            + (f"{100 * statistics.median(over[key]):+.1f}% |" if over[key] else "- |")
            for key, found in sorted(fails.items())]


def write_margins(fitted: dict, split: str) -> None:
    text = STACK.read_text()
    for gpu, kind in fitted:
        pattern = re.compile(rf"\n\[{re.escape(f'safety_margin.{gpu}.{kind}')}\]\n(?:[^\[\n].*\n?)*")
        text = pattern.sub("", text)
    text = text.rstrip("\n") + "\n"
    for (gpu, kind), (margin, worst, count) in fitted.items():
        text += (f"\n[safety_margin.{gpu}.{kind}]\nvalue = {margin}\n"
                 f"source = \"fitted on the declared xMem calibration split ({split}; never "
                 f"scored): the largest margin its {count} {kind} run(s) on "
                 f"{'the RTX 3060 and 4060 (one stack, fitted together)' if gpu in POOLS else 'this GPU'} need "
                 f"({worst:+.4f} of the peak, judged as the bench judges: an OOM run needs more "
                 f"than the GPU's total), rounded up to 0.5%, + a stated allowance of "
                 f"{ALLOWANCE} for the tail so few runs do not show"
                 f"{RESERVE_NOTE if kind == 'attention' else ''}; python "
                 f"benchmarks/fit_xmem_margins.py --write\"\n")
    STACK.write_text(text)
    print(f"wrote {len(fitted)} margins to {STACK}")


def main() -> None:
    from peakmem.bench.calibration import XMEM_SPLIT_DESCRIPTION

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--heldout", type=Path, default=None,
                        help="a `peakmem bench xmem --estimators peakmem` cache.jsonl")
    parser.add_argument("--write", action="store_true", help="store the fit in torch-2.6.toml")
    parser.add_argument("--per-gpu", action="store_true",
                        help="fit each GPU alone (no pooling of the consumer GPUs)")
    args = parser.parse_args()
    carried = carried_margins()
    runs = split_runs(args.jobs, args.cache)
    fitted = fit_margins(runs, {} if args.per_gpu else POOLS)
    print("| GPU | kind | split runs (pool) | largest need | fitted margin |\n| --- | --- | --- | --- | --- |")
    for (gpu, kind), (margin, worst, count) in fitted.items():
        print(f"| {gpu} | {kind} | {count} | {worst:+.4f} | {margin} |")
    if args.heldout:
        heldout = recover_heldout(args.heldout, carried)
        for title, margin_of in (
            ("carried-over margins", lambda gpu, kind: carried[kind]),
            ("fitted margins", lambda gpu, kind: fitted.get((gpu, kind), (carried[kind],))[0]),
        ):
            print(f"\nheld-out failures at the {title}\n\n| kind | runs | failures | rate | median over (ran) |\n"
                  "| --- | --- | --- | --- | --- |")
            print("\n".join(failure_table(heldout, margin_of)))
    if args.write:
        write_margins(fitted, XMEM_SPLIT_DESCRIPTION)


if __name__ == "__main__":
    main()
