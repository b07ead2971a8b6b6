"""The torch-2.6 stack's stated margins on the consumer GPUs: fitted per kind on the declared
xMem calibration split (benchmarks/fit_xmem_margins.py), and applied per kind by the estimate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from peakmem.bench.calibration import XMEM_SPLIT_DESCRIPTION
from peakmem.capture import capture_callable
from peakmem.estimate.api import estimate_capture
from peakmem.profiles import load_gpu, load_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fit_xmem_margins import KINDS, fit, needed_margin, stated_kind  # noqa: E402

CONSUMER_GPUS = ("rtx3060-12gb", "rtx4060-8gb")


@pytest.mark.parametrize("gpu", CONSUMER_GPUS)
@pytest.mark.parametrize("kind", KINDS)
def test_consumer_margins_are_the_xmem_split_fit(gpu, kind):
    margin = load_stack("2.6.0").safety_margin_for(load_gpu(gpu), kind)
    assert margin.source.startswith("fitted on the declared xMem calibration split")
    assert XMEM_SPLIT_DESCRIPTION in margin.source
    assert "python benchmarks/fit_xmem_margins.py --write" in margin.source
    assert 0 < margin.value < 0.37  # below the A100 CNN margin once carried over


def encoder_job():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).cuda()
    optimizer = torch.optim.Adam(layer.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        layer(torch.randn(2, 8, 32, device="cuda")).sum().backward()
        optimizer.step()


def mlp_job():
    torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda")).sum().backward()


@pytest.mark.parametrize("job", [encoder_job, mlp_job])
def test_an_estimate_states_its_kinds_fitted_margin(job):
    gpu, stack = load_gpu("rtx3060-12gb"), load_stack("2.6.0")
    estimate = estimate_capture(capture_callable(job, gpu=gpu, stack=stack), gpu, stack,
                                torch_version="2.6.0")
    fitted = stack.safety_margin_for(gpu, estimate.margin_kind)
    assert XMEM_SPLIT_DESCRIPTION in fitted.source
    assert estimate.safety_margin == fitted.value
    added = estimate.peak_bytes_with_margin - estimate.peak_bytes
    # the fit script reads the kind and reserve back from what the margin added
    now = {kind: float(stack.safety_margin_for(gpu, kind).value) for kind in KINDS}
    assert stated_kind(estimate.peak_bytes, added, [now]) == (
        estimate.margin_kind, estimate.margin_reserve_bytes)


def test_the_encoder_and_the_mlp_state_different_kinds():
    gpu, stack = load_gpu("rtx3060-12gb"), load_stack("2.6.0")
    kinds = {estimate_capture(capture_callable(job, gpu=gpu, stack=stack), gpu, stack,
                              torch_version="2.6.0").margin_kind for job in (encoder_job, mlp_job)}
    assert kinds == {"attention", "default"}


def run(status="ok", measured=1000, compared=900, peak=1000, reserve=0, total=2000):
    return {"status": status, "measured_bytes": measured, "compared_bytes": compared,
            "peak_bytes": peak, "reserve_bytes": reserve, "gpu_total_bytes": total}


def test_needed_margin_judges_runs_as_the_bench_does():
    assert needed_margin(run()) == pytest.approx(0.1)  # (1000 - 900) / peak 1000
    assert needed_margin(run(reserve=50)) == pytest.approx(0.05)
    # an OOM run needs more than the GPU's total, whatever it measured
    assert needed_margin(run(status="oom", measured=10)) == pytest.approx(1101 / 1000)


def test_fit_is_the_largest_need_plus_the_allowance_rounded_up():
    assert fit([0.031, -0.2, 0.0]) == 0.045  # 0.031 -> 0.035, + 0.01
    assert fit([-0.5, -0.1]) == 0.01  # no run needs a margin: the allowance alone


def test_stated_kind_prefers_an_exact_margin_in_any_set_over_a_reserve():
    carried = {"cudnn_convolution": 0.37, "attention": 0.03, "default": 0.015}
    now = {"cudnn_convolution": 0.175, "attention": 0.01, "default": 0.055}
    peak = 5000 * 2**20
    cnn_then = int(peak * 1.37) - peak  # a cache made before the fit: the carried 0.37
    assert stated_kind(peak, cnn_then, [now, carried]) == ("cudnn_convolution", 0)
    reserve = 2 * 148 * 2**20
    attention_now = int(peak * 1.01) - peak + reserve
    assert stated_kind(peak, attention_now, [now, carried]) == ("attention", reserve)
    assert stated_kind(peak, 12345, [now, carried]) is None
