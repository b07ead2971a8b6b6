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


# -- a hostile <gpu>_versions.json (p1) ---------------------------------------------------------

import pytest  # noqa: E402

BAD_VERSIONS = {
    "not json": (b"{", "not a readable versions file"),
    "non-utf8": (b'{"transformers": "\xff"}', "not a readable versions file"),
    "nested": (b"[" * 100_000, "not a readable versions file"),
    "not an object": (b'["5.17.0"]', "not a JSON object"),
    "huge": (b'{"transformers": "5.17.0", "pad": "' + b"x" * (2 << 20) + b'"}',
             "more than a versions file"),
    "release a number": (b'{"transformers": 5}', "transformers '5' is not a release number"),
    "release not numeric": (b'{"transformers": "zzz"}', "transformers 'zzz' is not a release"),
}


@pytest.mark.parametrize("label", list(BAD_VERSIONS))
def test_a_hostile_versions_file_is_one_error_naming_it_never_the_assumption(
        tmp_path, monkeypatch, label):
    """A versions file that was not JSON, or not UTF-8, gave every ground-truth row of the
    bench `JSONDecodeError: Expecting value...` without saying which file; `"transformers": 5`
    was passed on as release "5" (and "zzz" failed each row later); a huge file was read whole
    for every row. Decided: the bench stops (one line naming the file, next test) rather than
    estimate the rows with the documented assumption, a release the file contradicts."""
    import peakmem.baselines.peakmem_estimator as estimator

    body, words = BAD_VERSIONS[label]
    (tmp_path / "h200_versions.json").write_bytes(body)
    monkeypatch.setattr(estimator, "GROUNDTRUTH_DIR", tmp_path)
    with pytest.raises(ValueError) as caught:
        estimator.groundtruth_transformers_release("h200")
    message = str(caught.value)
    assert words in message and str(tmp_path / "h200_versions.json") in message, message
    assert "\n" not in message and len(message) < 400


def test_no_versions_file_or_no_transformers_keeps_the_documented_assumption(tmp_path, monkeypatch):
    import peakmem.baselines.peakmem_estimator as estimator

    monkeypatch.setattr(estimator, "GROUNDTRUTH_DIR", tmp_path)
    assert estimator.groundtruth_transformers_release("h200") == "5.17.0"
    (tmp_path / "h200_versions.json").write_text('{"transformers": null}')
    assert estimator.groundtruth_transformers_release("h200") == "5.17.0"
    (tmp_path / "h200_versions.json").write_text('{"transformers": "5.24.0.dev0"}')
    assert estimator.groundtruth_transformers_release("h200") == "5.24.0.dev0"


def test_the_bench_stops_in_one_line_on_a_bad_versions_file(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import peakmem.baselines.peakmem_estimator as estimator
    from peakmem.cli.main import main

    (tmp_path / "h200_versions.json").write_bytes(b"\x00not json")
    monkeypatch.setattr(estimator, "GROUNDTRUTH_DIR", tmp_path)
    done = CliRunner().invoke(main, ["bench", "groundtruth", "--estimators", "peakmem",
                                     "--limit", "1", "--no-cache", "--json"])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("peakmem: error: ") and "h200_versions.json" in lines[-1], lines
    assert not any("held out" not in line and line != lines[-1] for line in lines), lines
