"""benchmarks/conv_table_coverage.py: a job's convolutions, answered exactly where the H200 grid
measured the shape and by neighbours elsewhere, and the missing shapes written for the next grid."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "conv_table_coverage.py"

JOB = """
import torch
conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
for n in (32, 24):
    x = torch.randn(n, 64, 56, 56, device="cuda", requires_grad=True)
    conv(x).sum().backward()
"""


@pytest.fixture(scope="module")
def coverage_module():
    spec = importlib.util.spec_from_file_location("conv_table_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_grid_shapes_are_exact_and_others_are_listed_as_missing(coverage_module, tmp_path):
    job = tmp_path / "two_convs.py"
    job.write_text(JOB)
    coverage = coverage_module.job_coverage([sys.executable, str(job)], "h200", "2.11.0", 1)
    by_batch = {shape.n: directions for shape, directions in coverage.answers.items()}
    assert set(by_batch) == {32, 24}
    # the grid's row 32,64,56,56,64,3,1,1,1,1,tf32,nchw (fp32 with TF32 on: the default)
    assert by_batch[32] == {"forward": ("exact", 25837584),
                            "backward_data": ("exact", 51527696),
                            "backward_weight": ("exact", 53592743)}
    assert {how for how, _ in by_batch[24].values()} == {"nearest"}
    missing = coverage.missing()
    assert [shape.n for shape in missing] == [24]
    (shape,) = missing
    assert (shape.cin, shape.h, shape.cout, shape.kernel, shape.dtype_mode, shape.layout) == (
        64, 56, 64, 3, "tf32", "nchw")

    out = tmp_path / "missing.csv"
    assert coverage_module.write_missing(out, coverage, "python two_convs.py") == 1
    assert coverage_module.write_missing(out, coverage, "python again.py") == 1  # appends
    rows = list(csv.DictReader(out.open()))
    assert [r["job"] for r in rows] == ["python two_convs.py", "python again.py"]
    assert rows[0]["n"] == "24" and rows[0]["directions"] == "backward_data backward_weight forward"
    assert "1 measured in every direction; 3/6" in coverage.summary()
