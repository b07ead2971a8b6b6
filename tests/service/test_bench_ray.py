"""`peakmem bench --ray`: the same rows and metrics as without Ray."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from peakmem.cli.main import main


@pytest.mark.slow
def test_bench_on_ray_matches_serial(fixture_data):
    ray = pytest.importorskip("ray")
    base = ["bench", "gpumemnet-mlp1", "--data", str(fixture_data), "--estimators",
            "horus,deepspeed", "--json", "--no-cache"]
    serial = json.loads(CliRunner().invoke(main, [*base, "--jobs", "1"],
                                           catch_exceptions=False).stdout)
    try:
        on_ray = CliRunner().invoke(main, [*base, "--jobs", "1", "--ray"], catch_exceptions=False)
    finally:
        ray.shutdown()
    assert on_ray.exit_code == 0, on_ray.output
    result = json.loads(on_ray.stdout)
    assert result["rows"] == serial["rows"]
    for name in ("horus", "deepspeed"):
        assert (result["estimators"][name]["median_rel_error"]
                == serial["estimators"][name]["median_rel_error"])
