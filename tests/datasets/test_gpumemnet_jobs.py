from __future__ import annotations

import pytest

from peakmem.datasets.gpumemnet_jobs import (
    JobParseError,
    dense_transitions_from_layers,
    parse_cnn,
    parse_job,
    parse_layer_list,
    parse_mlp,
    parse_transformer,
)


def test_parse_mlp_step1_defaults_to_relu_without_softmax():
    job = parse_mlp("input:1259_output:79_depth:8_arch:pyramid_batch:717.out")
    assert (job.input_size, job.output_size, job.depth, job.arch, job.batch_size) == (
        1259,
        79,
        8,
        "pyramid",
        717,
    )
    assert job.activation == "relu" and not job.softmax_head and not job.batchnorm


def test_parse_mlp_step2_reads_both_dropout_fields():
    job = parse_mlp(
        "input:2346_output:197_depth:2_arch:pyramid_batch:996_act:leaky_relu"
        "_dropout:0.33_dropout:True_batchnorm:False.out"
    )
    assert job.activation == "leaky_relu"
    assert job.dropout_p == pytest.approx(0.33) and job.dropout is True
    assert job.batchnorm is False and job.softmax_head is True


def test_parse_cnn_and_transformer():
    cnn = parse_cnn(
        "input_channels:3_num_classes:453_depth:22_arch:uniform_base_filters:98_batch:62"
        "_input_size:174_act:gelu_dropout:0.34_dropout:True_batchnorm:False.out"
    )
    assert (cnn.input_channels, cnn.num_classes, cnn.base_filters, cnn.input_size) == (
        3,
        453,
        98,
        174,
    )
    assert cnn.dense_transitions is None
    tr = parse_transformer(
        "num_classes:273_embedding_size:128_num_layers:8_num_heads:8_ff_hidden_size:332"
        "_dropout_rate:0.16_seq_length:512_input_size:553893_num_samples:1527_batch_size:64.out"
    )
    assert (tr.vocab_size, tr.seq_length, tr.batch_size, tr.num_samples) == (553893, 512, 64, 1527)


@pytest.mark.parametrize(
    "bad", ["", "input:3_output:2.out", "input:1_output:1_depth:1_arch:spiral_batch:2"]
)
def test_bad_filenames_raise_parse_error(bad):
    with pytest.raises(JobParseError):
        parse_mlp(bad)


def test_unknown_activation_is_rejected():
    with pytest.raises(JobParseError, match="activation"):
        parse_mlp(
            "input:4_output:2_depth:1_arch:uniform_batch:2_act:sparkle_dropout:0.1"
            "_dropout:False_batchnorm:False"
        )


def test_dense_transitions_recovered_from_hand_made_layer_list():
    # 3 input channels, depth 8 -> two dense blocks of 4; a transition after block 0.
    # dense conv params = cin*9*32 + 32; transition = cin*(cin//2) + cin//2
    layers = []
    c = 3
    for _ in range(4):
        layers.append(("conv2d", 32 * 100, c * 288 + 32))
        c += 32
    half = c // 2  # 131 -> 65
    layers.append(("conv2d", half * 100, c * half + half))
    c = half
    for _ in range(4):
        layers.append(("conv2d", 32 * 25, c * 288 + 32))
        c += 32
    assert dense_transitions_from_layers(layers, 3, 8) == (0,)
    with pytest.raises(JobParseError):
        dense_transitions_from_layers(layers[:3], 3, 8)


def test_parse_layer_list():
    assert parse_layer_list("[('linear', 5, 30), ('ReLU', 5, 0)]") == [
        ("linear", 5, 30),
        ("ReLU", 5, 0),
    ]
    with pytest.raises(JobParseError):
        parse_layer_list("[(")


def test_parse_job_dispatches_on_the_first_key():
    assert parse_job("input:4_output:2_depth:1_arch:uniform_batch:2.out").family == "mlp"
    cnn = (
        "input_channels:1_num_classes:2_depth:1_arch:uniform_base_filters:4_batch:2"
        "_input_size:8_act:relu_dropout:0.1_dropout:False_batchnorm:False.out"
    )
    assert parse_job(cnn).family == "cnn"
    with pytest.raises(JobParseError):
        parse_job("model:resnet50")
