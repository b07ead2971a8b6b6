"""The ground-truth rows are estimated with the transformers release their GPU ran
(baselines/peakmem_estimator.py `row_environment`, capture/hf_release.py)."""

from peakmem.baselines.peakmem_estimator import job_command, row_environment
from peakmem.capture.hf_release import RELEASE_VARIABLE
from peakmem.datasets.loaders import load_rows


def test_groundtruth_rows_name_the_release_the_device_image_held():
    rows = [r for r in load_rows("groundtruth") if "t5-small" in r.job.get("args", "")]
    assert {r.gpu for r in rows} == {"h100-80gb", "h200"}
    for row in rows:
        assert row_environment(row) == {RELEASE_VARIABLE: "5.17.0"}
        assert job_command(row)[0] == "python"  # the measured command itself, unprefixed


def test_other_datasets_run_the_installed_release(fixture_data):
    row = load_rows("gpumemnet-mlp1", fixture_data)[0]
    assert row_environment(row) == {}
