"""Score peakmem on chosen GPUMemNet Transformer rows: measured, estimated, signed error (MiB).

    python benchmarks/score_transformer_rows.py --spread 16 --out before.json [--data DIR]
    python benchmarks/score_transformer_rows.py --rows 00000,00043 --breakdown

`--split` scores the rows of the declared calibration split instead (all of them, or `--spread N`).
`--spread N` takes N held-out (outside the declared calibration split) successful rows evenly
spaced over the set. One process: each row is one `peakmem estimate` of `gpumemnet.py`.
`--compare A.json B.json` prints a before/after table of two result files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from peakmem.bench.calibration import evaluation_rows, in_calibration_split
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
    parser.add_argument("--compare", nargs=2, type=Path, default=None)
    args = parser.parse_args()
    if args.compare:
        compare(*(json.loads(p.read_text()) for p in args.compare))
        return
    rows = [r for r in load_rows(DATASET, args.data) if r.status == "ok"]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.id in wanted]
    elif args.split:
        rows = spread_subset([r for r in rows if in_calibration_split(r)], args.spread)
    else:
        rows = spread_subset(evaluation_rows(rows), args.spread or 16)
    results = score(rows, args.breakdown, args.out)
    print(summary(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
