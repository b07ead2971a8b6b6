"""Score peakmem on chosen GPUMemNet Transformer rows: measured, estimated, signed error (MiB).

    python benchmarks/score_transformer_rows.py --spread 16 --out before.json [--data DIR]
    python benchmarks/score_transformer_rows.py --rows 00000,00043 --breakdown

`--split` scores the rows of the declared calibration split instead (all of them, or `--spread N`).
`--spread N` takes N held-out (outside the declared calibration split) successful rows evenly
spaced over the set. One process: each row is one `peakmem estimate` of `gpumemnet.py`.
`--compare A.json B.json` prints a before/after table of two result files (`--check-margin M`: how
many of B's rows stay under at +M); `--fit-margin SPLIT.json` prints the margin fitted on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from peakmem.bench.calibration import evaluation_rows, in_calibration_split, safety_margin
from peakmem.datasets.loaders import load_rows, spread_subset
from peakmem.datasets.rows import MiB

DATASET = "gpumemnet-transformer"


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


def summary(results: dict[str, dict]) -> str:
    errors = [r["error"] for r in results.values() if "error_mib" in r]
    if not errors:
        return "no rows"
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    within = sum(abs(r["error_mib"]) <= 2 for r in results.values() if "error_mib" in r)
    under = sum(e < 0 for e in errors)
    return (f"{len(errors)} rows: median |error| {statistics.median(absolute):.2%}, p90 {p90:.2%}, "
            f"within 2 MiB {within}/{len(errors)}, under {under}/{len(errors)}")


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
        errors = [r["error"] for r in results.values() if "error_mib" in r]
        print(f"{summary(results)}; margin for <= 1% failures: {safety_margin(errors):.3f}")
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
