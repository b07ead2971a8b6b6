from __future__ import annotations

import json

from click.testing import CliRunner

from peakmem.cli.main import main

FAST = "horus,accelerate,deepspeed"


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_json_output_contract(fixture_data, tmp_path):
    result = _bench(
        "gpumemnet-mlp1",
        "--data",
        str(fixture_data),
        "--estimators",
        FAST,
        "--json",
        "--jobs",
        "1",
        "--cache",
        str(tmp_path / "c.jsonl"),
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"dataset", "rows", "estimators"}
    # 12 fixture rows, one of them in the declared calibration split (never scored)
    assert payload["dataset"] == "gpumemnet-mlp1" and payload["rows"] == 11
    assert list(payload["estimators"]) == ["horus", "accelerate", "deepspeed"]
    for metrics in payload["estimators"].values():
        for key in (
            "median_rel_error",
            "p90_rel_error",
            "under_rate",
            "failure_prob",
            "median_seconds",
            "p99_rel_error",
            "margin_for_1pct_failures",
            "families",
        ):
            assert key in metrics
    # model-state formulas ignore activations and the CUDA context: they always underestimate
    assert payload["estimators"]["accelerate"]["under_rate"] == 1.0


def test_resumes_from_the_cache(fixture_data, tmp_path):
    cache = tmp_path / "c.jsonl"
    args = [
        "gpumemnet-mlp1",
        "--data",
        str(fixture_data),
        "--estimators",
        "horus",
        "--json",
        "--jobs",
        "1",
        "--cache",
        str(cache),
        "--limit",
        "4",
    ]
    first = _bench(*args)
    lines = cache.read_text().splitlines()
    assert len(lines) == 4
    second = _bench(*args)
    assert cache.read_text().splitlines() == lines  # nothing recomputed
    one = json.loads(first.stdout)["estimators"]["horus"]
    two = json.loads(second.stdout)["estimators"]["horus"]
    assert one["median_rel_error"] == two["median_rel_error"]


def test_parallel_matches_serial(fixture_data):
    base = [
        "gpumemnet-mlp1",
        "--data",
        str(fixture_data),
        "--estimators",
        "horus,deepspeed",
        "--json",
        "--no-cache",
    ]
    serial = json.loads(_bench(*base, "--jobs", "1").stdout)
    parallel = json.loads(_bench(*base, "--jobs", "2").stdout)
    for name in ("horus", "deepspeed"):
        assert (
            serial["estimators"][name]["median_rel_error"]
            == parallel["estimators"][name]["median_rel_error"]
        )


def test_unknown_names_list_known_ones_and_fail(fixture_data):
    bad_dataset = _bench("imagenet")
    assert bad_dataset.exit_code != 0
    assert "gpumemnet-mlp1" in bad_dataset.stderr and "groundtruth" in bad_dataset.stderr
    bad_estimator = _bench("gpumemnet-mlp1", "--data", str(fixture_data), "--estimators", "magic")
    assert bad_estimator.exit_code != 0 and "horus" in bad_estimator.stderr
    missing = _bench("gpumemnet-cnn", "--data", str(fixture_data))
    assert missing.exit_code != 0 and "missing dataset file" in missing.stderr


def test_report_writes_markdown_and_plots(fixture_data, tmp_path):
    out = tmp_path / "report"
    result = _bench(
        "gpumemnet-mlp1",
        "--data",
        str(fixture_data),
        "--estimators",
        FAST,
        "--jobs",
        "1",
        "--report",
        str(out),
    )
    assert result.exit_code == 0, result.output
    page = (out / "report.md").read_text()
    assert "| horus |" in page and "## Collocation" in page and "oracle" in page
    for png in ("scatter.png", "error_cdf.png", "family_errors.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert (out / "cache.jsonl").is_file()


def test_cache_keys_carry_the_estimator_version_and_skip_missing_packages(tmp_path):
    from peakmem.baselines.base import Estimator, MissingPackage
    from peakmem.bench.runner import ResultCache, run_estimators
    from peakmem.datasets.rows import BenchRow

    class Versioned(Estimator):
        name = "v"
        version = "abc"

        def estimate_bytes(self, row):
            if row.id == "1":
                raise MissingPackage("needs the optional `timm` package")
            return 42

    rows = [BenchRow(id=i, dataset="d", family="f", job=None, measured_peak_bytes=40,
                     status="ok", gpu="a100-40gb", torch_version="2.4.1", gpu_total_bytes=80)
            for i in ("0", "1")]
    cache = ResultCache(tmp_path / "cache.jsonl")
    results = run_estimators({"v": Versioned()}, rows, dataset="d", cache=cache)
    assert [r.estimate_bytes for r in results["v"]] == [42, None]
    assert results["v"][1].error.startswith("unavailable here: ")
    lines = (tmp_path / "cache.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"v1|d|v@2#abc|0"' in lines[0]  # row 1 is not cached
