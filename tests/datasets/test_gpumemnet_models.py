from __future__ import annotations

import csv
import itertools

import pytest
import torch

from peakmem.datasets.gpumemnet_jobs import (
    CNNJob,
    MLPJob,
    TransformerJob,
    parse_cnn,
    parse_layer_list,
    parse_mlp,
)
from peakmem.datasets.gpumemnet_models import (
    CannotBuildJob,
    build_model,
    cnn_plain_channels,
    mlp_widths,
    per_sample_layer_outputs,
    residual_plan,
    train_steps,
    training_loop,
)


def _mlp(arch, i=100, o=10, d=3, **kw):
    return MLPJob(i, o, d, arch, 8, **kw)


def test_mlp_widths_by_hand():
    assert mlp_widths(_mlp("pyramid")) == [50, 25, 12]
    assert mlp_widths(_mlp("pyramid", o=30)) == [50, 30, 30]
    assert mlp_widths(_mlp("bottleneck")) == [50, 25, 12, 10]
    assert mlp_widths(_mlp("uniform")) == [100, 100, 100]
    assert mlp_widths(_mlp("gradual")) == [70, 40, 10]  # dec = (100-10)//3 = 30


def test_mlp_step2_layers_in_order():
    job = _mlp(
        "pyramid",
        d=1,
        activation="mish",
        dropout=True,
        dropout_p=0.2,
        batchnorm=True,
        softmax_head=True,
    )
    kinds = [type(m).__name__ for m in build_model(job)]
    assert kinds == ["Linear", "BatchNorm1d", "Mish", "Dropout", "Linear", "Softmax"]


def test_cnn_channels_by_hand():
    job = CNNJob(3, 10, 4, "pyramid", 128, 2, 8, "relu", 0.0, False, False)
    # g = (2048/128)**(1/4) = 2
    assert cnn_plain_channels(job) == [128, 256, 512, 1024]
    assert cnn_plain_channels(
        CNNJob(3, 10, 2, "bottleneck", 64, 2, 8, "relu", 0, False, False)
    ) == [128, 64]
    hourglass = CNNJob(3, 10, 4, "hourglass", 128, 2, 8, "relu", 0, False, False)
    # c = 2: 128, 128*16**(1/2)=512; e = 2: i=2 -> 128*16**0.5 = 512, i=3 -> 128
    assert cnn_plain_channels(hourglass) == [128, 512, 512, 128]


def test_residual_plan_stops_on_launcher_size_bookkeeping():
    job = CNNJob(3, 10, 40, "residual", 16, 2, 30, "relu", 0, False, False)
    strides = [s for _, s in residual_plan(job)]
    # sizes (size // 2 on odd blocks): 30, 15, 15, 7 -> stop after block 3
    assert strides == [1, 2, 1, 2]


def test_dense_without_layer_list_cannot_be_built():
    job = CNNJob(3, 10, 8, "dense", 16, 2, 8, "relu", 0, False, False)
    with pytest.raises(CannotBuildJob):
        build_model(job)
    built = build_model(CNNJob(3, 10, 8, "dense", 16, 2, 8, "relu", 0, False, True, (0,)))
    assert built.fc.in_features == (3 + 128) // 2 + 128


def test_transformer_params_by_hand():
    job = TransformerJob(5, 16, 2, 4, 32, 0.1, 6, 100, 10, 4)
    model = build_model(job)
    per_layer = (3 * 16 * 16 + 3 * 16) + (16 * 16 + 16) + (16 * 32 + 32) + (32 * 16 + 16) + 4 * 16
    expected = 100 * 16 + 6 * 16 + 2 * per_layer + (16 * 5 + 5)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_training_loop_last_batch_is_smaller():
    loop = training_loop(MLPJob(10, 2, 1, "uniform", 1000))
    assert loop.batch_sizes == (1000,) * 4 + (96,)
    assert loop.warmup_batches == (2,)


def test_cnn_loop_starts_with_torchsummarys_batch_2_pass():
    loop = training_loop(CNNJob(3, 10, 4, "pyramid", 128, 16, 8, "relu", 0.0, False, False))
    assert loop.warmup_batches == (2,) and loop.warmup_grad
    assert loop.batch_sizes == (16,)


def test_train_steps_runs_the_real_loop_on_cpu():
    job = MLPJob(12, 3, 2, "pyramid", 16, num_samples=40)
    model = build_model(job, "cpu")
    losses = list(train_steps(job, model, 3, "cpu"))
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


_KEEP = {
    "conv2d": "Conv2d",
    "linear": "Linear",
    "batchnorm2d": "BatchNorm2d",
    "batch_normalization": "BatchNorm1d",
}


def _same_layers(job, text):
    want = [(_KEEP[k], n, p) for k, n, p in parse_layer_list(text) if k in _KEEP]
    got = [x for x in per_sample_layer_outputs(job) if x[0] in _KEEP.values()]
    return want == got


def test_fixture_mlp_rows_match_their_layer_lists(fixture_data):
    with (fixture_data / "gpumemnet" / "mlp_data_step1.csv").open() as fh:
        for raw in csv.DictReader(fh):
            assert _same_layers(parse_mlp(raw["Filename"]), raw["Activations-Params"])


@pytest.mark.parametrize("name", ["mlp_data_step1.csv", "mlp_data_step2.csv"])
def test_shared_mlp_rows_rebuild_exactly(shared_data, name):
    with (shared_data / "gpumemnet" / name).open() as fh:
        rows = list(itertools.islice(csv.DictReader(fh), 0, 3000, 60))
    for raw in rows:
        assert _same_layers(parse_mlp(raw["Filename"]), raw["Activations-Params"]), raw["Filename"]


def test_shared_cnn_rows_rebuild_exactly_every_arch(shared_data):
    """Every 20th CNN row with a layer list (all 7 archs, dense transitions recovered)."""
    seen = set()
    with (shared_data / "gpumemnet" / "cnn_data_step1_prefix.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["Activations-Params"] not in ("", "[]")][::20]
    for raw in rows:
        job = parse_cnn(raw["Filename"], raw["Activations-Params"])
        seen.add(job.arch)
        assert _same_layers(job, raw["Activations-Params"]), raw["Filename"]
    assert len(seen) == 7


@pytest.mark.parametrize(
    "arch", ["pyramid", "gradual", "uniform", "bottleneck", "hourglass", "residual", "dense"]
)
def test_every_cnn_arch_trains_for_real_on_cpu(arch):
    transitions = (0,) if arch == "dense" else None
    job = CNNJob(2, 3, 8, arch, 4, 2, 12, "swish", 0.1, True, True, transitions)
    model = build_model(job, "cpu")
    losses = list(train_steps(job, model, 2, "cpu"))
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_transformer_trains_for_real_on_cpu():
    job = TransformerJob(4, 16, 2, 2, 32, 0.1, 6, 50, 10, 4)
    losses = list(train_steps(job, build_model(job, "cpu"), 2, "cpu"))
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
