"""The GPUMemNet zoo script rebuilds the public rows' models: parameter counts match the
published `Total Parameters` (up to the summary tool's known blind spots)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "gpumemnet"
sys.path.insert(0, str(ZOO))
import gpumemnet as g  # noqa: E402

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/datasets/gpumemnet")


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _rows(name: str, limit: int) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as handle:
        return [row for _, row in zip(range(limit), csv.DictReader(handle), strict=False)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("input:5_output:2_depth:1_arch:uniform_batch:3.out",
         [("input", "5"), ("output", "2"), ("depth", "1"), ("arch", "uniform"), ("batch", "3")]),
        ("input:5_output:2_depth:1_arch:gradual_batch:3_act:leaky_relu_dropout:0.5_dropout:False"
         "_batchnorm:True",
         [("input", "5"), ("output", "2"), ("depth", "1"), ("arch", "gradual"), ("batch", "3"),
          ("act", "leaky_relu"), ("dropout", "0.5"), ("dropout", "False"),
          ("batchnorm", "True")]),
    ],
)  # fmt: skip
def test_parse_config(text, expected):
    assert g.parse_config(text) == expected


def test_parse_config_rejects_garbage():
    with pytest.raises(ValueError):
        g.parse_config("resnet50")
    with pytest.raises(ValueError):
        g.parse_config("input:5_bogus:3")


def test_mlp_widths_match_readme():
    assert g.mlp_widths("pyramid", 1259, 79, 8) == [629, 314, 157, 79, 79, 79, 79, 79]
    assert g.mlp_widths("gradual", 100, 10, 3) == [70, 40, 10]
    assert g.mlp_widths("bottleneck", 64, 4, 2) == [32, 16, 8]


@needs_data
@pytest.mark.parametrize("name", ["mlp_data_step1.csv", "mlp_data_step2.csv"])
def test_mlp_parameter_counts(name):
    checked = 0
    for row in _rows(name, 150):
        values, p, drop, bn = g._options(g.parse_config(row["Filename"]))
        if values.get("act") == "prelu":  # the published count leaves PReLU weights out
            continue
        with torch.device("meta"):
            model = g.build_mlp(values, p, drop, bn)[0]
        assert _params(model) == int(row["Total Parameters"])
        checked += 1
    assert checked > 100


@needs_data
def test_cnn_parameter_counts():
    checked = 0
    for row in _rows("cnn_data_step1_prefix.csv", 400):
        values, p, drop, bn = g._options(g.parse_config(row["Filename"]))
        if values["arch"] == "dense" or values.get("act") == "prelu" or not row[
                "Activations-Params"].strip("[]"):  # fmt: skip
            continue
        with torch.device("meta"):
            model = g.build_cnn(values, p, drop, bn)[0]
        assert _params(model) == int(row["Total Parameters"]), row["Filename"]
        checked += 1
    assert checked > 200


@needs_data
def test_transformer_parameter_counts():
    for row in _rows("transformer_data_sample17.csv", 17):
        if int(row["Total Parameters"]) == 0:  # no summary recorded
            continue
        values = g._options(g.parse_config(row["Filename"]))[0]
        with torch.device("meta"):
            model = g.build_transformer(values)[0]
        e, layers, s = (int(values[k]) for k in ("embedding_size", "num_layers", "seq_length"))
        # the published count misses the positional parameter and MultiheadAttention's weights
        assert _params(model) - s * e - layers * (4 * e * e + 4 * e) == int(
            row["Total Parameters"])  # fmt: skip
