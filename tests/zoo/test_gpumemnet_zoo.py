"""The GPUMemNet zoo script trains each family on the CPU, with the shared model builders
(peakmem.datasets.gpumemnet_models, whose layer-by-layer checks live in tests/bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo" / "gpumemnet.py"

CONFIGS = {
    "mlp1": "input:64_output:5_depth:2_arch:pyramid_batch:16",
    "mlp2": "input:64_output:5_depth:2_arch:gradual_batch:16_act:mish_dropout:0.2_dropout:True"
    "_batchnorm:True",
    "cnn": "input_channels:3_num_classes:4_depth:2_arch:residual_base_filters:8_batch:4"
    "_input_size:16_act:relu_dropout:0.0_dropout:False_batchnorm:True",
    "transformer": "num_classes:3_embedding_size:16_num_layers:1_num_heads:2_ff_hidden_size:32"
    "_dropout_rate:0.1_seq_length:8_input_size:50_num_samples:40_batch_size:8",
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_family_trains_on_the_cpu(name):
    cmd = [sys.executable, str(SCRIPT), "--config", CONFIGS[name], "--device", "cpu",
           "--steps", "2", "--num-workers", "0", "--samples", "32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "final loss" in done.stdout


def test_bad_config_is_a_usage_error():
    cmd = [sys.executable, str(SCRIPT), "--config", "nonsense", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "GPUMemNet" in done.stderr
