"""Which convolutions of a job the measured cuDNN workspace table answers exactly, and which from
its nearest neighbours (issue 6): the shapes a probe call should measure next.

    PYTHONPATH=src python benchmarks/conv_table_coverage.py [--gpu h200] [--torch 2.11.0]
        [--steps 1] [--out MISSING.csv] -- python benchmarks/zoo/vision.py --model resnet50 ...

The job is estimated in this process (as `peakmem bench` runs a row) with
`WorkspaceTable.lookup` observed: every 2-D convolution call the workspace rule answers from the
GPU's table (`[cudnn_workspace_table.<gpu>]`, docs/cnn.md) is recorded with its shape, setting
(dtype mode, layout), direction and how it was answered ("exact": the grid measured that shape;
"nearest": the neighbours' fallback). Printed: per distinct shape and setting, the directions
answered by neighbours and the bytes they were given, and a summary line. `--out` appends the
shapes answered by neighbours (the table's shape and setting columns, `directions`, `job`) to a
CSV, so that the missing shapes of several jobs add up to one list for the next grid.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

from peakmem.profiles.conv_workspace_table import SHAPE_COLUMNS, ConvShape, WorkspaceTable

OUT_COLUMNS = (*SHAPE_COLUMNS, "dtype_mode", "layout", "directions", "job")


@dataclass
class Coverage:
    """The table's answers for one job: shape -> direction -> (how, bytes)."""

    answers: dict[ConvShape, dict[str, tuple[str, int]]] = field(default_factory=dict)

    def record(self, shape: ConvShape, direction: str, how: str, size: int) -> None:
        self.answers.setdefault(shape, {})[direction] = (how, size)

    def missing(self) -> dict[ConvShape, dict[str, int]]:
        """The shapes with a direction answered by neighbours: direction -> bytes given."""
        out: dict[ConvShape, dict[str, int]] = {}
        for shape, directions in self.answers.items():
            nearest = {d: size for d, (how, size) in directions.items() if how != "exact"}
            if nearest:
                out[shape] = nearest
        return out

    def summary(self) -> str:
        calls = [how for directions in self.answers.values() for how, _ in directions.values()]
        exact = sum(how == "exact" for how in calls)
        shapes = len(self.answers)
        whole = sum(all(how == "exact" for how, _ in d.values()) for d in self.answers.values())
        return (f"{shapes} convolution shapes, {whole} measured in every direction; "
                f"{exact}/{len(calls)} (shape, direction) answers exact")


@contextlib.contextmanager
def observed_lookups(coverage: Coverage) -> Iterator[None]:
    """Record every `WorkspaceTable.lookup` answer in `coverage` while the block runs."""
    original = WorkspaceTable.lookup

    def lookup(self, shape, direction):
        answer = original(self, shape, direction)
        coverage.record(shape, direction, answer.how, answer.bytes)
        return answer

    WorkspaceTable.lookup = lookup  # type: ignore[method-assign]
    try:
        yield
    finally:
        WorkspaceTable.lookup = original  # type: ignore[method-assign]


def job_coverage(argv: list[str], gpu: str, torch_version: str, steps: int) -> Coverage:
    """The table's answers for the convolutions of `argv` (a `python script.py ...` command)."""
    from peakmem.estimate import estimate_command

    coverage = Coverage()
    sink = io.StringIO()
    with observed_lookups(coverage), redirect_stdout(sink), redirect_stderr(sink):
        estimate_command(argv, gpu=gpu, torch_version=torch_version, steps=steps, isolate=False)
    return coverage


def write_missing(path: Path, coverage: Coverage, job: str) -> int:
    """Append the shapes answered by neighbours to the CSV at `path`; the number written."""
    new = not path.exists()
    missing = coverage.missing()
    with path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(OUT_COLUMNS)
        for shape, directions in sorted(missing.items(), key=lambda item: item[0].key):
            writer.writerow([*shape.key, " ".join(sorted(directions)), job])
    return len(missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--torch", default="2.11.0", help="the stack whose table is read")
    parser.add_argument("--steps", type=int, default=1,
                        help="optimizer steps traced (every shape runs in the first)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no job command after --")
    coverage = job_coverage(command, args.gpu, args.torch, args.steps)
    for shape, directions in sorted(coverage.missing().items(), key=lambda item: item[0].key):
        given = ", ".join(f"{d} {size / 2**20:.1f} MiB" for d, size in sorted(directions.items()))
        print(" ".join(f"{c}={getattr(shape, c)}" for c in SHAPE_COLUMNS),
              shape.dtype_mode, shape.layout, "| nearest:", given)
    print(coverage.summary())
    if args.out is not None:
        count = write_missing(args.out, coverage, " ".join(command))
        print(f"{count} shapes appended to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
