from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from peakmem.datasets.gpumemnet_jobs import CNNJob, MLPJob, TransformerJob
from peakmem.datasets.loaders import (
    DATA_DIR_ENV,
    DATASETS,
    DatasetFormatError,
    DatasetUnavailable,
    default_data_dir,
    load_groundtruth,
    load_rows,
    spread_subset,
)
from peakmem.datasets.rows import GPU_TOTAL_BYTES, MiB

GROUNDTRUTH = Path(__file__).resolve().parents[1] / "data" / "groundtruth"


def test_fixture_mlp_rows_have_the_common_shape(fixture_data):
    rows = load_rows("gpumemnet-mlp1", fixture_data)
    assert len(rows) == 12  # the output:1 row (crashed at the loss) is skipped
    row = rows[0]
    assert isinstance(row.job, MLPJob) and row.job.input_size == 300
    assert row.measured_peak_bytes == 1449 * MiB and row.status == "ok"
    assert row.gpu == "a100-40gb" and row.torch_version == "2.4.1"
    assert row.gpu_total_bytes == GPU_TOTAL_BYTES["a100-40gb"]
    assert row.family == "mlp-pyramid" and row.id == "00000"
    assert "Activations-Params" not in row.features and row.features["Batch Size"] == "32"


def test_missing_files_and_unknown_names_are_one_line_errors(tmp_path):
    with pytest.raises(DatasetUnavailable, match="missing dataset file"):
        load_rows("gpumemnet-cnn", tmp_path)
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        load_rows("gpumemnet-cnn", tmp_path / "nope")
    with pytest.raises(KeyError, match="known: gpumemnet-mlp1"):
        load_rows("imagenet")


def test_groundtruth_rows_and_empty_dir(tmp_path):
    rows = list(load_groundtruth(None, GROUNDTRUTH))
    assert [r.status for r in rows] == ["ok", "oom"]  # the 'error' row is skipped
    assert rows[0].measured_peak_bytes == 1073741824 and rows[0].family == "mlp"
    assert rows[0].job == {"job": "examples/mlp.py", "args": "--batch 32"}
    assert rows[0].gpu_total_bytes == GPU_TOTAL_BYTES["h100-80gb"]
    with pytest.raises(DatasetUnavailable, match="no ground truth yet"):
        list(load_groundtruth(None, tmp_path))


def test_spread_subset_keeps_order_and_spreads():
    rows = list(range(10))
    assert spread_subset(rows, 5) == [0, 2, 4, 6, 8]  # type: ignore[arg-type]
    assert spread_subset(rows, None) == rows  # type: ignore[arg-type]
    assert spread_subset(rows, 50) == rows  # type: ignore[arg-type]


def test_every_shared_dataset_loads(shared_data):
    sizes = {}
    for name in DATASETS:
        if name == "groundtruth":
            continue
        rows = load_rows(name, shared_data)
        assert len({r.id for r in rows}) == len(rows)
        sizes[name] = len(rows)
    assert sizes["gpumemnet-mlp1"] == 2978
    assert sizes["gpumemnet-transformer"] == 952  # gpumemnet/README.md: 869 ran, 83 OOM_CRASH
    assert sizes["gpumemnet-transformer17"] == 17
    assert sizes["xmem"] == 131  # xmem/README.md: 131 runs


def test_shared_cnn_and_transformer_jobs(shared_data):
    cnn = load_rows("gpumemnet-cnn", shared_data)
    assert all(isinstance(r.job, CNNJob) for r in cnn)
    assert all(r.measured_peak_bytes > 0 for r in cnn)  # memory-0 failed runs skipped
    assert Counter(r.status for r in cnn)["oom"] > 300
    dense = [r for r in cnn if r.job.arch == "dense"]
    assert sum(r.job.dense_transitions is not None for r in dense) >= 0.8 * len(dense)
    tr = load_rows("gpumemnet-transformer", shared_data)
    assert all(isinstance(r.job, TransformerJob) for r in tr)
    assert Counter(r.status for r in tr) == {"ok": 869, "oom": 83}
    old = load_rows("gpumemnet-transformer17", shared_data)
    by_name = {r.features["Filename"]: r for r in tr}
    for row in old:  # the earlier sample is a subset of the new one, same measurement
        assert by_name[row.features["Filename"]].measured_peak_bytes == row.measured_peak_bytes
    xmem = load_rows("xmem", shared_data)
    assert {r.gpu for r in xmem} == {"rtx3060-12gb", "rtx4060-8gb", "a100-40gb"}


def test_timm_rows_whose_naive_lower_bound_exceeds_the_gpu_are_oom(tmp_path):
    folder = tmp_path / "gpumemnet"
    folder.mkdir()
    (folder / "timm_measured.csv").write_text(
        "model,batch_size,measured_mib,faketensor_mib\n"
        "resnet50,32,9000,5000.5\n"
        "eva_giant_patch14_560,8,17615,50383.3\n"  # cannot fit 40 GiB: stopped at 17.6 GB
        "fastvit_mci2,8,2517,2676.6\n"  # below its bound but the bound fits: left as ok
    )
    rows = load_rows("timm", tmp_path)
    assert [r.status for r in rows] == ["ok", "oom", "ok"]
    assert rows[1].measured_peak_bytes == 17615 * MiB and rows[1].family == "eva"


TRANSFORMER_HEADER = "Filename,Max GPU Memory (MiB),Status\n"
TRANSFORMER_NAME = (
    "num_classes:{k}_embedding_size:64_num_layers:2_num_heads:4_ff_hidden_size:128_dropout_rate:0.1"
    "_seq_length:32_input_size:1000_num_samples:100_batch_size:8.out"
)


def test_transformer_sets_read_their_own_files(tmp_path):
    folder = tmp_path / "gpumemnet"
    folder.mkdir()
    (folder / "transformer_data_sample.csv").write_text(
        TRANSFORMER_HEADER
        + f"{TRANSFORMER_NAME.format(k=3)},1500,SUCCESSFUL\n"
        + f"{TRANSFORMER_NAME.format(k=4)},39000,OOM_CRASH\n"
        + f"{TRANSFORMER_NAME.format(k=5)},1600,SUCCESSFUL\n"
    )
    (folder / "transformer_data_sample17.csv").write_text(
        TRANSFORMER_HEADER + f"{TRANSFORMER_NAME.format(k=5)},1600,SUCCESSFUL\n"
    )
    new = load_rows("gpumemnet-transformer", tmp_path)
    assert [r.job.num_classes for r in new] == [3, 4, 5]
    assert [r.status for r in new] == ["ok", "oom", "ok"]
    assert {r.dataset for r in new} == {"gpumemnet-transformer"}
    old = load_rows("gpumemnet-transformer17", tmp_path)
    assert [(r.dataset, r.job.num_classes, r.measured_mib) for r in old] == [
        ("gpumemnet-transformer17", 5, 1600)
    ]


def test_transformer_set_bad_status_is_a_format_error(tmp_path):
    folder = tmp_path / "gpumemnet"
    folder.mkdir()
    (folder / "transformer_data_sample.csv").write_text(
        TRANSFORMER_HEADER + f"{TRANSFORMER_NAME.format(k=3)},1500,MAYBE\n"
    )
    with pytest.raises(DatasetFormatError, match="transformer_data_sample.csv:2"):
        load_rows("gpumemnet-transformer", tmp_path)


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "absent"))
    assert default_data_dir() is None


def test_groundtruth_skips_probe_outputs_beside_the_runs(tmp_path):
    (tmp_path / "h100-80gb.csv").write_text((GROUNDTRUTH / "sample.csv").read_text())
    (tmp_path / "h200_first_use.csv").write_text("sequence,family,bytes\nLAZY,addmm,1\n")
    rows = list(load_groundtruth(None, tmp_path))
    assert [r.id for r in rows] == ["h100-80gb:00000", "h100-80gb:00001"]
    (tmp_path / "h200.csv").write_text("sequence,family\nLAZY,addmm\n")
    with pytest.raises(DatasetFormatError, match="missing columns"):
        list(load_groundtruth(None, tmp_path))
