"""Score peakmem on chosen GPUMemNet Transformer rows: measured, estimated, signed error (MiB).

    python benchmarks/score_transformer_rows.py --spread 16 --out before.json [--data DIR]
    python benchmarks/score_transformer_rows.py --rows 00000,00043 --breakdown

`--split` scores the rows of the declared calibration split instead (all of them, or `--spread N`).
`--spread N` takes N held-out (outside the declared calibration split) successful rows evenly
spaced over the set. One process: each row is one `peakmem estimate` of `gpumemnet.py`.
`--compare A.json B.json` prints a before/after table of two result files (`--check-margin M`: how
many of B's rows stay under at +M); `--fit-margin SPLIT.json` prints the margin fitted on them,
for each number of reserved largest-gradient segments (estimate/margin_reserve.py).
`--sample K` takes every K-th held-out row instead of a spread (all of them: `--sample 1`).

The rows of DECLARED_OUTLIERS are scored and printed like the others, and every summary line is
given twice: over all rows, and without them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from peakmem.bench.calibration import evaluation_rows, in_calibration_split
from peakmem.datasets.loaders import load_rows, spread_subset
from peakmem.datasets.rows import MiB

DATASET = "gpumemnet-transformer"

# Rows whose measured peak no allocation sequence of the job reaches: the miss is larger than
# the job's whole simulated peak reserve (`exceeds_own_reserve`), i.e. the device held more
# than twice what the job reserves, while every allocation the job makes is at most its
# largest gradient (the embedding's) and these misses are 10-34x that. nvidia-smi is
# device-wide: something besides the job held memory on the GPU. Checked on the 128 held-out
# rows of `--spread 128` (docs/BENCHMARKS.md; no row of the 160 of the calibration split passes
# the test): only these two do. 00084 (E=128 L=8 B=64 S=256): 8743 MiB measured, 3489
# estimated, 2060 reserved, miss 5254 = 34 x its 156 MiB embedding-gradient segment; 00329
# (E=128 L=4 B=8 S=256): 4583 measured, 2561 estimated, 1132 reserved, miss 2022 = 10 x 202
# MiB. Measured on an H100 (benchmarks/groundtruth/h100-80gb.csv, torch 2.11), the same jobs use
# 2836 and 1920 MiB, context included; 00084 still 2836 after 648 steps (22 epochs).
# Scored and printed, every figure given with and without them, never silently dropped;
# `summary` names any other row that passes the test.
DECLARED_OUTLIERS: tuple[str, ...] = ("00084", "00329")


def _largest_gradient_segment(estimate) -> int:
    from peakmem.estimate.margin_reserve import largest_gradient_bytes, segment_bytes

    if estimate.capture is None:
        return 0
    size = largest_gradient_bytes(estimate.capture.trace)
    return segment_bytes(size, estimate.alloc_conf, estimate.torch_version)


def exceeds_own_reserve(r: dict) -> bool:
    """The row misses by more than the job's whole simulated peak reserve (the device held
    more than twice what the job reserved): more than any missing allocation (each at most the
    job's largest) or any fragmentation of the job's own segments explains."""
    reserve = r.get("peak_reserved_mib")
    return reserve is not None and "error_mib" in r and -r["error_mib"] > reserve


def describe(row) -> str:
    j = row.job
    return (f"V={j.vocab_size} E={j.embedding_size} L={j.num_layers} H={j.num_heads} "
            f"FF={j.ff_hidden_size} S={j.seq_length} B={j.batch_size} K={j.num_classes}")


def score(rows, breakdown: bool, out: Path | None = None) -> dict[str, dict]:
    """Estimate each row; `out` (JSON) is rewritten after every row."""
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator, compared_bytes

    results: dict[str, dict] = {}
    for row in rows:
        start = time.perf_counter()
        try:
            estimate = PeakmemEstimator().run(row)
        except Exception as exc:  # reported per row, the others still run
            results[row.id] = {"error": f"{type(exc).__name__}: {exc}"}
            print(row.id, "error", exc, flush=True)
            continue
        estimated = compared_bytes(row, estimate)
        error_mib = (estimated - row.measured_peak_bytes) / MiB
        results[row.id] = {
            "config": describe(row),
            "measured_mib": row.measured_mib,
            "estimated_mib": estimated / MiB,
            "error_mib": error_mib,
            "error": error_mib / row.measured_mib,
            "margin": estimate.safety_margin,
            "margin_reserve_mib": estimate.margin_reserve_bytes / MiB,
            "largest_gradient_segment_mib": _largest_gradient_segment(estimate) / MiB,
            "peak_reserved_mib": estimate.peak_reserved_bytes / MiB,
        }
        print(f"{row.id} {describe(row)} measured {row.measured_mib:.0f} estimated "
              f"{estimated / MiB:.1f} error {error_mib:+.1f} MiB ({error_mib / row.measured_mib:+.2%}) "
              f"[{time.perf_counter() - start:.0f} s]", flush=True)
        if out is not None:
            out.write_text(json.dumps(results, indent=1))
        if breakdown:
            for category, size in sorted(estimate.breakdown.by_category.items()):
                print(f"    {category}: {size / MiB:.1f} MiB")
    return results


def _stated_mib(r: dict, margin: float | None = None, segments: int | None = None) -> float:
    """The row's estimate with its stated margin (or `margin` + `segments` reserved segments)."""
    m = r.get("margin", 0.0) if margin is None else margin
    reserve = (r.get("margin_reserve_mib", 0.0) if segments is None
               else segments * r.get("largest_gradient_segment_mib", 0.0))
    return r["estimated_mib"] * (1 + m) + reserve


def _summary_line(results: dict[str, dict]) -> str:
    scored = [r for r in results.values() if "error_mib" in r]
    if not scored:
        return "no rows"
    errors = [r["error"] for r in scored]
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    within = sum(abs(r["error_mib"]) <= 2 for r in scored)
    under = sum(e < 0 for e in errors)
    text = (f"{len(errors)} rows: median |error| {statistics.median(absolute):.2%}, p90 {p90:.2%}, "
            f"within 2 MiB {within}/{len(errors)}, under {under}/{len(errors)}")
    if all("margin" in r for r in scored):
        failing = sum(_stated_mib(r) < r["measured_mib"] for r in scored)
        overhead = statistics.median(_stated_mib(r) / r["measured_mib"] - 1 for r in scored)
        text += (f", under at the stated margin {failing}/{len(errors)}"
                 f" (median stated margin over measured {overhead:+.1%})")
    return text


def summary(results: dict[str, dict]) -> str:
    """One line over all rows; a second without DECLARED_OUTLIERS where any of them is scored."""
    line = _summary_line(results)
    undeclared = sorted(k for k, r in results.items()
                        if exceeds_own_reserve(r) and k not in DECLARED_OUTLIERS)
    if undeclared:
        line += f"\n  miss larger than the job's own reserve, not declared: {', '.join(undeclared)}"
    kept = {k: r for k, r in results.items() if k not in DECLARED_OUTLIERS}
    if len(kept) < len(results):
        line += f"\n  without the declared outliers {DECLARED_OUTLIERS}: {_summary_line(kept)}"
    return line


def fitted_fraction(results: dict[str, dict], segments: int, failures: float = 0.01) -> float:
    """The smallest fraction m (rounded up to 0.5%) for which `estimate x (1 + m) + segments x
    segment(largest gradient)` falls below the measurement on at most `failures` of the rows:
    the rule of bench/calibration.py `safety_margin`, with the reserve."""
    scored = [r for r in results.values() if "error_mib" in r and r["estimated_mib"] > 0]
    needed = sorted(
        max(0.0, (r["measured_mib"] - segments * r.get("largest_gradient_segment_mib", 0.0))
            / r["estimated_mib"] - 1)
        for r in scored
    )
    if not needed:
        return 0.0
    allowed = int(failures * len(needed))
    return math.ceil(round(needed[len(needed) - 1 - allowed] * 200, 9)) / 200  # 0.5% steps


def fit_margin(results: dict[str, dict], max_segments: int = 3) -> None:
    """For 0..max_segments reserved segments: the fitted fraction and what it states over the
    measurements (median and mean of stated / measured - 1)."""
    scored = [r for r in results.values() if "error_mib" in r]
    for segments in range(max_segments + 1):
        margin = fitted_fraction(results, segments)
        stated = [_stated_mib(r, margin, segments) / r["measured_mib"] - 1 for r in scored]
        failing = sum(s < 0 for s in stated)
        print(f"{segments} segment(s): margin {margin:.3f}, under {failing}/{len(scored)}, "
              f"stated over measured: median {statistics.median(stated):+.1%}, "
              f"mean {statistics.fmean(stated):+.1%}")


def compare(before: dict[str, dict], after: dict[str, dict]) -> None:
    print("| row | config | measured MiB | before MiB | after MiB |")
    print("|---|---|---|---|---|")
    for key in sorted(before):
        b, a = before[key], after.get(key, {})
        print(f"| {key} | {b.get('config', '')} | {b.get('measured_mib', 0):.0f} | "
              f"{b.get('error_mib', float('nan')):+.1f} | {a.get('error_mib', float('nan')):+.1f} |")
    print(f"before: {summary(before)}\nafter: {summary(after)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--rows", default=None, help="comma-separated row ids")
    parser.add_argument("--spread", type=int, default=None)
    parser.add_argument("--sample", type=int, default=None, metavar="K",
                        help="every K-th held-out row (1: all of them) instead of a spread")
    parser.add_argument("--split", action="store_true",
                        help="score the declared calibration split's rows instead of held-out ones")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="a result file of the same code: its rows are taken, not rerun")
    parser.add_argument("--compare", nargs=2, type=Path, default=None)
    parser.add_argument("--fit-margin", type=Path, default=None, metavar="SPLIT.json",
                        help="print the smallest margin under which <= 1%% of these rows fail")
    parser.add_argument("--check-margin", type=float, default=None, metavar="M",
                        help="with --compare A B: the share of B's rows under even at +M")
    args = parser.parse_args()
    if args.fit_margin:
        results = json.loads(args.fit_margin.read_text())
        print(summary(results))
        fit_margin(results)
        return
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        compare(before, after)
        if args.check_margin is not None:
            errors = [r["error"] for r in after.values() if "error_mib" in r]
            failing = sum((1 + e) * (1 + args.check_margin) < 1 for e in errors)
            print(f"at +{args.check_margin:.1%}: {failing} of {len(errors)} rows still under")
        return
    rows = [r for r in load_rows(DATASET, args.data) if r.status == "ok"]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.id in wanted]
    elif args.split:
        rows = spread_subset([r for r in rows if in_calibration_split(r)], args.spread)
    elif args.sample:
        rows = evaluation_rows(rows)[::args.sample]
    else:
        rows = spread_subset(evaluation_rows(rows), args.spread or 16)
    reused = json.loads(args.reuse.read_text()) if args.reuse else {}
    results = {r.id: reused[r.id] for r in rows if r.id in reused}
    results |= score([r for r in rows if r.id not in reused], args.breakdown, args.out)
    print(summary(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
