"""xMem's Hugging Face job (benchmarks/zoo/xmem_hf.py): each hard-coded config builds the public
model, the bench maps xMem rows onto the job, and a tiny job estimates end to end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.baselines.base import CannotEstimate
from peakmem.baselines.peakmem_estimator import (
    XMEM_CNN_JOB,
    XMEM_JOB,
    compared_bytes,
    job_command,
)
from peakmem.datasets.rows import BenchRow

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers"
)

# Public parameter counts (model cards / `sum(p.numel())` of the Hub checkpoints).
PUBLIC_PARAMETERS = {
    "openai-community/gpt2": 124_439_808,  # "124M"
    "distilbert/distilgpt2": 81_912_576,  # "82M"
    "cerebras/Cerebras-GPT-111M": 111_050_496,  # "111M"
    "EleutherAI/gpt-neo-125M": 125_198_592,  # "125M"
    "facebook/opt-125m": 125_239_296,  # "125M"
    "facebook/opt-350m": 331_196_416,  # "331M"
    "T5-small": 60_506_624,  # "60M"
    "t5-base": 222_903_552,  # "220M"
    "Qwen/Qwen3-4B": 4_022_468_096,  # "4.0B"
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,  # "3.21B"
    "google/gemma-2-2b-it": 2_614_341_888,  # "2.61B"
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1_777_088_000,  # "1.78B"
}


@pytest.fixture(scope="module")
def zoo():
    # transformers imports torchvision when it is installed; under a CPU-only torch that import
    # works only with peakmem's declared schemas (as in every capture), whatever ran before
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()
    sys.path.insert(0, str(ZOO))
    try:
        import hf_configs
        import xmem_hf

        yield hf_configs, xmem_hf
    finally:
        sys.path.remove(str(ZOO))


@pytest.mark.parametrize("name", sorted(PUBLIC_PARAMETERS))
def test_config_builds_public_model(zoo, name):
    import torch

    hf_configs, xmem_hf = zoo
    spec = hf_configs.lookup(name)
    assert spec is not None and spec.parameters == PUBLIC_PARAMETERS[name]
    with torch.device("meta"):
        model = xmem_hf.build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == PUBLIC_PARAMETERS[name]
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == spec.attn


def test_every_config_is_tested(zoo):
    assert set(zoo[0].MODELS) == set(PUBLIC_PARAMETERS)


def _row(model: str, **features: str) -> BenchRow:
    return BenchRow(
        id="00000", dataset="xmem", family=model,
        job={"library": "torchvision/transformers", "model": model, "batch_size": 13,
             "optimizer": "AdamW"},
        measured_peak_bytes=1, status="ok", gpu="rtx3060-12gb", torch_version="2.6.0",
        gpu_total_bytes=1, features=dict(features), measured_includes_context=False,
    )


def test_job_command_maps_xmem_rows():
    assert job_command(_row("EleutherAI/gpt-neo-125M")) == [
        "python", str(XMEM_JOB), "--model", "EleutherAI/gpt-neo-125M", "--batch-size", "13",
        "--optimizer", "AdamW",
    ]
    command = job_command(_row("t5-small", zero_grad_mode_recorded="1"))  # Hub ids: any case
    assert command[-2:] == ["--zero-grad-mode", "1"]
    with pytest.raises(CannotEstimate, match="no config"):
        job_command(_row("microsoft/deberta-base"))


def test_xmem_dataset_rows_map(shared_data):
    from peakmem.datasets.loaders import load_rows

    rows = load_rows("xmem", shared_data)
    assert rows and not any(r.measured_includes_context for r in rows)
    for row in rows:
        try:
            command = job_command(row)
        except CannotEstimate as exc:
            assert "needs the optional `torchvision` package" in str(exc), row.job
        else:
            assert command[1] in (str(XMEM_JOB), str(XMEM_CNN_JOB)), command


def test_tiny_job_estimates_end_to_end():
    """distilgpt2 (82M), one sequence of 16 tokens, one AdamW step: weights, gradients and the
    two AdamW moments in float32; the xMem comparison leaves out the CUDA context as created."""
    from peakmem.estimate.api import estimate_command

    argv = ["python", str(XMEM_JOB), "--model", "distilgpt2", "--batch-size", "1",
            "--seq-len", "16", "--steps", "1"]
    est = estimate_command(argv, gpu="rtx3060-12gb", torch_version="2.6.0")
    assert est.trained
    params = 81_912_576 * 4
    assert est.breakdown.by_category["parameter"] == pytest.approx(params, rel=0.01)
    assert est.breakdown.by_category["optimizer_state"] == pytest.approx(2 * params, rel=0.01)
    assert est.peak_allocated_bytes >= 3 * params
    # xMem's baseline follows context creation: the context less what lazy loading adds later
    lazy = int(est.stack.lazy_loaded_for(est.gpu).value)
    assert 0 < lazy < est.context_bytes
    assert compared_bytes(_row("distilgpt2"), est) == est.peak_bytes - est.context_bytes + lazy
