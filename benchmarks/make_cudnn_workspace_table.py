"""Make the per-shape cuDNN workspace table the profiles ship, from a raw probe grid.

    PYTHONPATH=src python benchmarks/make_cudnn_workspace_table.py \
        [--grid benchmarks/groundtruth/h200_cudnn_grid.csv.gz] \
        [--out src/peakmem/profiles/data/cudnn_workspace/sm90_cudnn91900_torch-2.11.csv.gz] [--score]

One row per measured case (benchmark off, status ok): the shape, dtype mode, layout, the backend
torch chose and each direction's `workspace_bytes`, copied from the grid (a case measured with
and without a bias differs only in backward_bias: the bias-free row's sizes are kept, the biased
one adds backward_bias). `--score` prints the held-out accuracy of the table's nearest-neighbour
fallback: the shapes whose sha1 % 5 == 0 (peakmem.profiles.conv_workspace_table.shape_hash) are
left out of the table and answered from the rest; beside it, what the torch-2.11 stack's
`[cudnn_conv_workspace.h100-80gb]` factor model gives for the same cases.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import statistics
from pathlib import Path

from peakmem.measure.cudnn_tables import read_conv_grid
from peakmem.profiles.conv_workspace_table import (
    DIRECTIONS,
    ELEMENT_BYTES,
    SHAPE_COLUMNS,
    TABLE_COLUMNS,
    ConvShape,
    parse_table,
    shape_hash,
)

GRID = Path("benchmarks/groundtruth/h200_cudnn_grid.csv.gz")
OUT = Path("src/peakmem/profiles/data/cudnn_workspace/sm90_cudnn91900_torch-2.11.csv.gz")
HELD_OUT = 5  # shapes with shape_hash % HELD_OUT == 0 are held out by --score


def table_text(grid: Path) -> str:
    frame = read_conv_grid(grid)
    frame = frame[(frame["status"] == "ok") & (~frame["benchmark"].astype(bool))]
    frame = frame.sort_values(["bias", "case_id"], kind="stable")
    cases: dict[tuple, dict] = {}
    for row in frame.itertuples(index=False):
        key = (*(int(getattr(row, c)) for c in SHAPE_COLUMNS), row.dtype_mode, row.layout)
        case = cases.setdefault(key, {"backend": row.backend})
        if row.direction in DIRECTIONS and row.direction not in case:
            case[row.direction] = int(row.workspace_bytes)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TABLE_COLUMNS)
    for key in sorted(cases):
        case = cases[key]
        writer.writerow([*key, case["backend"], *(case.get(d, "") for d in DIRECTIONS)])
    return out.getvalue()


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {100 * statistics.median(ordered):.1f}%, p90 {100 * p90:.1f}% (n={len(ordered)})"


def factor_bytes(model: dict[str, float], shape: ConvShape, direction: str) -> int:
    """What a `[cudnn_conv_workspace.<gpu>]` factor model gives for the grid case."""
    import torch

    from peakmem.cuda_rules.convolution import ConvCall, classed_bytes

    element = ELEMENT_BYTES[shape.dtype_mode]
    oh, ow = shape.out_hw()
    call = ConvCall(
        direction=direction, input_bytes=shape.n * shape.cin * shape.h * shape.w * element,
        weight_bytes=shape.cout * (shape.cin // shape.groups) * shape.kernel ** 2 * element,
        output_bytes=shape.n * shape.cout * oh * ow * element,
        dtype=torch.float32 if element == 4 else torch.bfloat16, kernel=(shape.kernel,) * 2,
        stride=(shape.stride,) * 2, groups=shape.groups,
        input_shape=(shape.n, shape.cin, shape.h, shape.w),
        weight_shape=(shape.cout, shape.cin // shape.groups, shape.kernel, shape.kernel))
    return classed_bytes(model, call)


def score(text: str) -> list[str]:
    """Held-out accuracy of the fallback, per direction: |error| / measured workspace (cases
    with a workspace), and |error| / (x + y bytes) (the effect on the memory the call holds)."""
    table = parse_table(text)
    held = lambda case: shape_hash(case.shape) % HELD_OUT == 0  # noqa: E731
    trained = table.without(lambda case: not held(case))
    from peakmem.profiles import load_gpu, load_stack

    h100_factors = load_stack("2.11.0").conv_workspace_for(load_gpu("h100-80gb")).value
    lines = []
    for direction in DIRECTIONS[:3]:
        rel, effect, zero_right, zeros, factors = [], [], 0, 0, []
        for case in table.cases:
            if not held(case) or case.backend != "Cudnn" or direction not in case.bytes:
                continue
            truth = case.bytes[direction]
            guess = trained.nearest(case.shape, direction)
            effect.append(abs(guess - truth) / case.shape.tensor_bytes)
            factor = factor_bytes(h100_factors, case.shape, direction)
            factors.append(abs(factor - truth) / case.shape.tensor_bytes)
            if truth:
                rel.append(abs(guess - truth) / truth)
            else:
                zeros += 1
                zero_right += guess == 0
        lines.append(f"{direction:15s} workspace |error|: {_quantiles(rel)}; |error| / (x+y+w):"
                     f" {_quantiles(effect)}; zero-workspace cases answered 0: {zero_right}/{zeros};"
                     f" the h100-80gb factor model's |error| / (x+y+w): {_quantiles(factors)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, default=GRID)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--score", action="store_true", help="print the fallback's held-out score")
    args = parser.parse_args()
    text = table_text(args.grid)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"{args.out}: {text.count(chr(10)) - 1} cases")
    if args.score:
        for line in score(text):
            print(line)


if __name__ == "__main__":
    main()
