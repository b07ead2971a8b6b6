"""The bench's GPUMemNet CNN rows run `--steps 10` with step repetition
(`row_capture_options`): the same figures as the default step policy, on a row of every
architecture, and the same events up to the last step."""

import contextlib
import io
import os
from pathlib import Path

import pytest

from peakmem.baselines.peakmem_estimator import (
    GPUMEMNET_CNN_STEPS,
    PeakmemEstimator,
    compared_bytes,
    job_command,
    row_capture_options,
    stated_fraction,
)
from peakmem.bench.calibration import evaluation_rows
from peakmem.capture.step_repeat import ENV_FLAG
from peakmem.datasets.loaders import load_rows
from peakmem.trace.events import EventKind

DATA = Path("/work/shared/datasets")
if not (DATA / "gpumemnet").is_dir():
    DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"

pytestmark = pytest.mark.skipif(not (DATA / "gpumemnet").is_dir(), reason="no datasets")


def one_row_per_architecture():
    rows, seen = [], set()
    for row in evaluation_rows(load_rows("gpumemnet-cnn", DATA)):
        if row.family not in seen and row.job.batch_size <= 64:
            seen.add(row.family)
            rows.append(row)
    return rows


def steps_only(trace):
    """The events up to the last step mark, marks left out: (kind, id, size, stream, tag)."""
    kinds = trace.kinds
    last = max(i for i, kind in enumerate(kinds) if kind == EventKind.MARK
               and (trace.tag_of(i).op or "").startswith("step "))
    return [(kinds[i], trace.ids[i], trace.sizes[i], trace.streams[i], trace.tag_of(i))
            for i in range(last) if kinds[i] != EventKind.MARK]


def figures(row, estimate):
    compared = compared_bytes(row, estimate)
    return (estimate.peak_bytes, estimate.peak_reserved_bytes, estimate.peak_allocated_bytes,
            estimate.peak_bytes_with_margin, compared, stated_fraction(estimate, compared),
            estimate.steps)


def test_cnn_rows_are_estimated_as_under_the_default_policy(monkeypatch):
    from peakmem.estimate import estimate_command

    monkeypatch.delenv(ENV_FLAG, raising=False)
    rows = one_row_per_architecture()
    assert len(rows) == 7
    for row in rows:
        options = row_capture_options(row)
        assert options == {"steps": GPUMEMNET_CNN_STEPS, "repeat_steady": True}
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            default = estimate_command(job_command(row), gpu=row.gpu,
                                       torch_version=row.torch_version, isolate=False)
            bench = PeakmemEstimator().run(row)
        assert figures(row, bench) == figures(row, default), row.family
        assert steps_only(bench.capture.trace) == steps_only(default.capture.trace), row.family
        # 4 steps run (step 1's batch is tagged in the phase torchsummary's forward left)
        assert [n.split(" (")[0] for n in bench.notes if "repeated from step" in n] == [
            "steps 5-10 repeated from step 4"], row.family
        assert ENV_FLAG not in os.environ  # the bench's flag does not leak


def test_other_rows_keep_their_options():
    mlp = evaluation_rows(load_rows("gpumemnet-mlp1", DATA))[0]
    assert row_capture_options(mlp) == {}
