"""The bundled multi-GPU example (peakmem.examples.fsdp_train) under `peakmem estimate
--nproc-per-node N`, as the README shows it."""

from __future__ import annotations

import json

from tests.distributed.test_cli_distributed import cli

SMALL = ["--width", "256", "--depth", "2", "--seq", "64", "--steps", "2"]


def test_the_bundled_fsdp_example_is_estimated_per_rank(tmp_path):
    result = cli(tmp_path, "--json", "--mode", "fake", "--gpu", "h100-80gb", "--nproc-per-node",
                 "2", "--", "python", "-m", "peakmem.examples.fsdp_train", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["world_size"] == 2 and data["traced_ranks"] == [0]
    assert data["libraries"]["nccl"] > 0 and data["fits"] is True
    assert "step 1: loss" in result.stderr
