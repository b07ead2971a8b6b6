"""Before/after per GPU and CNN family from two `score_groundtruth.py --out` result files.

    PYTHONPATH=src python benchmarks/groundtruth_before_after.py BEFORE.json AFTER.json [--gpu h200]

Prints, per GPU (the row id's prefix) and model (`--model` in the row's args), the median
|error| of each figure (nvidia-smi peak, reserved, allocated) before -> after, then each GPU's
rows together (median and p90), with and without the models whose capture is known to be wrong
(`--exclude`, default regnet: docs/capture.md "Known gaps").
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

FIGURES = ("peak", "reserved", "allocated")


def _model(args: str) -> str:
    found = re.search(r"--model (\S+)", args)
    precision = re.search(r"--precision (\S+)", args)
    return (found.group(1) if found else "?") + (f" {precision.group(1)}" if precision else "")


def _rel(result: dict, figure: str) -> float:
    cell = result[figure]
    return abs(cell["estimated"] - cell["measured"]) / cell["measured"]


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _line(label: str, before: list[dict], after: list[dict]) -> str:
    cells = []
    for figure in FIGURES:
        b = [_rel(r, figure) for r in before]
        a = [_rel(r, figure) for r in after]
        cells.append(f"{figure} {100 * statistics.median(b):.1f}% -> {100 * statistics.median(a):.1f}%"
                     f" (p90 {100 * _p90(b):.1f}% -> {100 * _p90(a):.1f}%)")
    return f"{label:32s} n={len(after):3d}  " + "; ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--gpu", default="", help="only rows of this GPU")
    parser.add_argument("--exclude", default="regnet", help="models left out of the second total")
    args = parser.parse_args()
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row_id, result in after.items():
        gpu = row_id.split(":")[0]
        if "error" in result or "error" in before.get(row_id, {"error": 1}):
            continue
        if args.gpu and gpu != args.gpu:
            continue
        groups[(gpu, _model(result["args"]))].append(row_id)
    for gpu in sorted({g for g, _m in groups}):
        print(f"== {gpu}: median |error| before -> after")
        ids_all = []
        for (g, model), ids in sorted(groups.items()):
            if g == gpu:
                ids_all += ids
                print(_line(model, [before[i] for i in ids], [after[i] for i in ids]))
        print(_line(f"all {gpu}", [before[i] for i in ids_all], [after[i] for i in ids_all]))
        kept = [i for i in ids_all if args.exclude not in after[i]["args"]] if args.exclude else ids_all
        print(_line(f"all {gpu} without {args.exclude}", [before[i] for i in kept],
                    [after[i] for i in kept]))


if __name__ == "__main__":
    main()
