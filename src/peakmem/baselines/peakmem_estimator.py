"""peakmem's own estimate as a bench row: the row's job script through `peakmem estimate`.

GPUMemNet rows run `benchmarks/zoo/gpumemnet.py --config <Filename>` (the rebuilt job, unchanged
from what a user would run) on the row's GPU profile and torch version, exactly as
`peakmem estimate --gpu a100-40gb --torch 2.4.1 -- python benchmarks/zoo/gpumemnet.py ...` does.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from peakmem.baselines.base import CannotEstimate, Estimator
from peakmem.bench.rows import BenchRow

REPO = Path(__file__).resolve().parents[3]
GPUMEMNET_JOB = REPO / "benchmarks" / "zoo" / "gpumemnet.py"


def job_command(row: BenchRow) -> list[str]:
    """The command line whose estimate this row's measurement is compared with."""
    if not row.dataset.startswith("gpumemnet"):
        raise CannotEstimate(f"no job script for dataset {row.dataset!r} yet")
    if not GPUMEMNET_JOB.exists():
        raise CannotEstimate(f"missing {GPUMEMNET_JOB} (run from a source checkout)")
    # DataLoader workers only move host data: no device memory, so none are started here.
    command = ["python", str(GPUMEMNET_JOB), "--config", row.features["Filename"],
               "--num-workers", "0"]
    transitions = getattr(row.job, "dense_transitions", None)
    if transitions is not None:
        command += ["--dense-transitions", ",".join(str(i) for i in transitions)]
    return command


class PeakmemEstimator(Estimator):
    name = "peakmem"

    def estimate_bytes(self, row: BenchRow) -> int:
        return self.run(row).peak_bytes

    def run(self, row: BenchRow):  # -> peakmem.estimate.Estimate
        from peakmem.estimate import EstimateError, estimate_capture, estimate_command
        from peakmem.profiles import load_gpu, load_stack

        argv = job_command(row)
        sink = io.StringIO()
        try:
            with redirect_stdout(sink), redirect_stderr(sink):
                return estimate_command(argv, gpu=row.gpu, torch_version=row.torch_version)
        except EstimateError as exc:
            capture = exc.capture
            if capture is None or not capture.trained or capture.exit_code == 124:
                raise CannotEstimate(str(exc).strip().splitlines()[-1]) from None
        # The job trained, then raised (e.g. BatchNorm on a last batch of 1, as the real job
        # did): what the GPU held up to the failure is what nvidia-smi recorded.
        gpu = load_gpu(row.gpu)
        return estimate_capture(capture, gpu, load_stack(row.torch_version),
                                torch_version=row.torch_version)
