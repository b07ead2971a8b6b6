"""Score the cuDNN workspace table's fallback past its largest batch, on the grid's own batch
split (peakmem.profiles.conv_workspace_batch_split): today's rule against the candidates.

    PYTHONPATH=src python benchmarks/workspace_batch_split.py [--worst 20]     # ~10 s

Per candidate (quantile of the neighbours' ratios, batch exponent) and direction: |error| /
(x + y + w) median and p90, the share of answers under, and the GiB under / over summed, on the
choosing split (n <= 16 answers n = 32) and the evaluation split (n <= 32 answers n = 64).
`--worst K` also lists the K evaluation answers of today's rule furthest under.
"""

from __future__ import annotations

import argparse

from peakmem.profiles.conv_workspace_batch_split import (
    FIT_SPLIT,
    TEST_SPLIT,
    pair_exponents,
    score_split,
    worst_under,
)
from peakmem.profiles.conv_workspace_table import load_table

TABLE = "cudnn_workspace/sm90_cudnn91900_torch-2.11.csv.gz"
CANDIDATES = ((0.5, 0.0), (0.5, 0.1), (0.5, 0.2), (0.5, 0.5), (0.75, 0.0), (0.9, 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worst", type=int, default=0)
    args = parser.parse_args()
    table = load_table(TABLE)
    print("same-layer exponent of workspace / (x + y + w) in n (n <= 32):",
          {d: round(v, 3) for d, v in pair_exponents(table).items()})
    for quantile, exponent in CANDIDATES:
        for name, split in (("choose", FIT_SPLIT), ("evaluate", TEST_SPLIT)):
            scores = score_split(table, split, quantile, exponent)
            under = sum(s.under_bytes for s in scores) / 2**30
            over = sum(s.over_bytes for s in scores) / 2**30
            cells = "; ".join(f"{s.direction} {100 * s.median:.1f}/{100 * s.p90:.1f}%"
                              f" under {100 * s.share_under:.1f}%" for s in scores)
            print(f"q={quantile} exp={exponent} {name:8s} n<={split[0]}->{split[1]}: {cells};"
                  f" GiB under {under:.1f} over {over:.1f}")
    if args.worst:
        rows = worst_under(table, TEST_SPLIT, args.worst)
        print(f"today's {args.worst} answers furthest under on the evaluation split:"
              f" {100 * sum(row[-1] for row in rows):.0f}% of its bytes under")
        for under, direction, shape, truth, guess, _share in rows:
            print(f"  {under / 2**20:7.0f} MiB {direction:15s} {shape.key}: measured"
                  f" {truth:.2f} x (x + y + w), answered {guess:.2f}")


if __name__ == "__main__":
    main()
