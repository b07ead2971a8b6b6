"""peakmem against this repo's own H100 measurements (benchmarks/groundtruth/h100-80gb.csv,
torch 2.11): the bench runs each row's measured command, and the jobs without cuDNN
convolutions that the rules cover are estimated to the byte."""

import pytest

from peakmem.baselines.peakmem_estimator import PeakmemEstimator, job_command, row_steps
from peakmem.datasets.loaders import load_rows


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in load_rows("groundtruth")}


def test_rows_run_the_measured_command_for_its_steps(rows):
    example = next(r for r in rows.values() if r.job["job"] == "-m peakmem.examples.mlp_train")
    assert job_command(example) == ["python", "-m", "peakmem.examples.mlp_train"]
    assert row_steps(example) == 3
    transformer = next(r for r in rows.values()
                       if r.features["sweep"] == "gpu_session:gpumemnet-transformer")
    command = job_command(transformer)
    assert command[1].endswith("benchmarks/zoo/gpumemnet.py") and command[2] == "--config"
    assert row_steps(transformer) == 6
    assert {r.gpu for r in rows.values()} == {"h100-80gb", "h200"}


@pytest.mark.parametrize("job", ["-m peakmem.examples.mlp_train", "benchmarks/zoo/mlp.py"])
def test_measured_mlp_jobs_are_estimated_to_the_byte(rows, job):
    estimator = PeakmemEstimator()
    for row in (r for r in rows.values() if r.job["job"] == job):
        estimate = estimator.run(row)
        assert estimate.peak_bytes == int(row.features["measured_peak_bytes"])
        assert estimate.peak_reserved_bytes == int(row.features["max_reserved_bytes"])
        assert estimate.peak_allocated_bytes == int(row.features["max_allocated_bytes"])
