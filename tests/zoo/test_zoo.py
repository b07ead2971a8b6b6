"""Every zoo script trains for one step at a tiny size on the CPU, through the same in-process
runner and stop mechanism `peakmem measure` uses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from peakmem.capture.vision_ops import compiled_library_loads
from peakmem.jobs.runner import JobSpec, JobStatus, run_job

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"
# run for real on the CPU: torchvision's compiled ops must load (not so for a CUDA wheel next to a
# CPU-only torch; peakmem's capture copes with that, a plain run does not)
HAS_TV = importlib.util.find_spec("torchvision") is not None and compiled_library_loads()
HAS_HF = importlib.util.find_spec("transformers") is not None
needs_tv = pytest.mark.skipif(not HAS_TV, reason="needs torchvision")
needs_hf = pytest.mark.skipif(not HAS_HF, reason="needs transformers")

TINY_LM = ["--seq-len", "16", "--num-layers", "1", "--hidden-size", "32", "--num-heads", "2",
           "--intermediate-size", "64", "--vocab-size", "200"]  # fmt: skip

CASES = [
    pytest.param(
        "mlp.py",
        [
            "--input-size",
            "16",
            "--hidden-size",
            "32",
            "--depth",
            "2",
            "--num-classes",
            "5",
            "--grad-checkpointing",
        ],
        id="mlp",
    ),  # fmt: skip
    pytest.param(
        "mlp.py",
        [
            "--input-size",
            "8",
            "--hidden-size",
            "8",
            "--num-classes",
            "3",
            "--precision",
            "fp16",
            "--optimizer",
            "sgd",
        ],
        id="mlp-fp16",
    ),  # fmt: skip
    pytest.param(
        "unet.py",
        [
            "--image-size",
            "16",
            "--base-channels",
            "4",
            "--levels",
            "2",
            "--grad-checkpointing",
            "--precision",
            "bf16",
        ],
        id="unet",
    ),  # fmt: skip
    pytest.param(
        "dlrm.py",
        ["--rows", "50", "--tables", "3", "--embedding-dim", "8", "--bottom", "16", "--top", "16"],
        id="dlrm",
    ),  # fmt: skip
    pytest.param(
        "gpumemnet.py",
        [
            "--config",
            "input:40_output:7_depth:3_arch:bottleneck_batch:8"
            "_act:mish_dropout:0.2_dropout:True_batchnorm:True",
        ],
        id="gpumemnet-mlp",
    ),  # fmt: skip
    pytest.param(
        "gpumemnet.py",
        [
            "--num-workers",
            "0",
            "--config",
            "input_channels:3_num_classes:5_depth:4_arch:residual"
            "_base_filters:4_batch:2_input_size:16_act:relu_dropout:0.1"
            "_dropout:True_batchnorm:True",
        ],
        id="gpumemnet-cnn",
    ),  # fmt: skip
    pytest.param(
        "gpumemnet.py",
        [
            "--num-workers",
            "0",
            "--config",
            "num_classes:5_embedding_size:16_num_layers:1_num_heads:2"
            "_ff_hidden_size:32_dropout_rate:0.1_seq_length:8"
            "_input_size:100_num_samples:20_batch_size:4",
        ],
        id="gpumemnet-transformer",
    ),  # fmt: skip
    pytest.param(
        "transformers_lm.py",
        ["--model", "gpt2", *TINY_LM, "--grad-checkpointing"],
        id="gpt2",
        marks=needs_hf,
    ),  # fmt: skip
    pytest.param(
        "transformers_lm.py", ["--model", "t5-small", *TINY_LM], id="t5", marks=needs_hf
    ),  # fmt: skip
    pytest.param(
        "transformers_lm.py",
        ["--model", "llama-1b", *TINY_LM, "--precision", "bf16"],
        id="llama",
        marks=needs_hf,
    ),  # fmt: skip
    pytest.param(
        "transformers_lm.py",
        ["--model", "bert-base", *TINY_LM, "--attn", "eager"],
        id="bert",
        marks=needs_hf,
    ),  # fmt: skip
    pytest.param(
        "vision.py",
        ["--model", "resnet18", "--image-size", "32", "--grad-checkpointing"],
        id="resnet18",
        marks=needs_tv,
    ),  # fmt: skip
    pytest.param(
        "vision.py", ["--model", "vit_b_16", "--image-size", "32"], id="vit", marks=needs_tv
    ),  # fmt: skip
    pytest.param(
        "detection.py", ["--image-size", "64", "--boxes", "2"], id="maskrcnn", marks=needs_tv
    ),  # fmt: skip
]


@pytest.mark.parametrize(("script", "args"), CASES)
def test_zoo_script_one_step_on_cpu(script, args, capsys):
    spec = JobSpec(script=str(ZOO / script), args=("--device", "cpu", "--batch-size", "2", *args))
    outcome = run_job(spec, steps=1, timeout=120)
    assert outcome.status is JobStatus.STOPPED, outcome.traceback_text
    assert outcome.steps == 1


def test_script_runs_to_its_own_end(capsys):
    spec = JobSpec(script=str(ZOO / "mlp.py"),
                   args=("--device", "cpu", "--steps", "2", "--input-size", "4",
                         "--hidden-size", "4", "--num-classes", "2", "--batch-size", "2"))  # fmt: skip
    outcome = run_job(spec, steps=10)
    assert outcome.status is JobStatus.FINISHED and outcome.steps == 2
    assert "mlp: final loss" in capsys.readouterr().out


def test_bad_knob_is_a_usage_error(capsys):
    outcome = run_job(JobSpec(script=str(ZOO / "mlp.py"), args=("--optimizer", "lion")))
    assert outcome.status is JobStatus.ERROR and outcome.exit_code == 2
    assert "invalid choice" in capsys.readouterr().err
