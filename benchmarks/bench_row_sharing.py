"""How many captures a bench dataset's evaluation rows need (issue 14): rows that run the same
job need one capture between them.

    python benchmarks/bench_row_sharing.py [--dataset gpumemnet-cnn ...]

Per dataset, one JSON line: its evaluation rows (outside the calibration split), the distinct
estimates they need — keyed on all a row's estimate is made from: the job's command line
(`job_command`), the GPU, the torch version, the capture options (`row_capture_options`: steps,
step repetition, allocator configuration) and the job's environment (`row_environment`) — and
the same key without the GPU (what sharing across GPUs would need: the capture reads the GPU's
profile, e.g. cuDNN workspace sizes, so it is not dropped from the key). For the GPUMemNet CNN
set also the distinct models with the batch size left out of the job (rows that could share a
capture rescaled to another batch: none can if every model is distinct). A row whose command
cannot be made here (a missing optional package) counts as its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")


def estimate_key(row, with_gpu: bool = True) -> tuple:
    from peakmem.baselines.base import CannotEstimate
    from peakmem.baselines.peakmem_estimator import (
        job_command,
        row_capture_options,
        row_environment,
    )

    try:
        command = tuple(job_command(row))
    except CannotEstimate:
        command = ("cannot estimate", row.id)
    return (command, row.gpu if with_gpu else None, row.torch_version,
            tuple(sorted(row_capture_options(row).items())),
            tuple(sorted(row_environment(row).items())))


def model_without_batch(row) -> tuple | None:
    if not dataclasses.is_dataclass(row.job):
        return None
    fields = dataclasses.asdict(row.job)
    fields.pop("batch_size", None)
    return (row.gpu, row.torch_version, tuple(sorted(fields.items())))


def main() -> int:
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.datasets.loaders import load_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", action="append", default=None,
                        help="dataset name (repeatable; default: gpumemnet-cnn)")
    args = parser.parse_args()
    for name in args.dataset or ["gpumemnet-cnn"]:
        rows = evaluation_rows(load_rows(name, DATA))
        figure = {
            "dataset": name,
            "evaluation_rows": len(rows),
            "distinct_estimates": len({estimate_key(row) for row in rows}),
            "distinct_ignoring_gpu": len({estimate_key(row, False) for row in rows}),
        }
        models = [model_without_batch(row) for row in rows]
        if all(model is not None for model in models):
            figure["distinct_models_without_batch"] = len(set(models))
        print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
