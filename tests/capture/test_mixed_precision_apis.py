"""A job (or its libraries: the HF Trainer with bf16 + torch.compile) may set torch's float32
precision through both the legacy API (`set_float32_matmul_precision`, `allow_tf32`) and the
new one (`fp32_precision`) with values that disagree. torch then raises "a mix of the legacy and
new APIs" on a bare read of `cuda.matmul.allow_tf32` / `cudnn.allow_tf32`, which CUDA's own
kernels never make (they ask per operator). peakmem's own reads must not raise into the job."""

import pytest
import torch
from torch import nn

from peakmem.capture.process_state import precision_objects
from peakmem.cuda_rules.convolution import cudnn_conv_tf32
from peakmem.estimate import estimate
from tests.capture.test_repeated_forwards import assert_same, gpt_job

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}


@pytest.fixture
def precision_restored():
    legacy = torch.get_float32_matmul_precision()
    values = [(obj, obj.fp32_precision) for obj in precision_objects()]
    yield
    torch.set_float32_matmul_precision(legacy)
    for obj, value in values:
        obj.fp32_precision = value


def disagree(conv: str = "ieee") -> None:
    """The legacy API says TF32 ("high"), the new one says IEEE for matmul and `conv` for
    cuDNN convolutions, RNNs IEEE."""
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = conv
    torch.backends.cudnn.rnn.fp32_precision = "ieee"


def test_the_bare_reads_raise_in_this_state(precision_restored):
    """The state the tests below put the job in: torch's own bare reads raise (if a torch
    version stops raising, these tests still check the estimates)."""
    disagree()
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018
    with pytest.raises(RuntimeError):
        torch.backends.cudnn.allow_tf32  # noqa: B018


@pytest.mark.parametrize("conv", ["ieee", "tf32"])
def test_convolution_reads_its_own_operator_setting(precision_restored, conv):
    disagree(conv)
    assert cudnn_conv_tf32() is (conv == "tf32")


def test_eval_forwards_replayed_after_the_apis_disagree(monkeypatch, precision_restored):
    job = gpt_job()

    def mixed_job():
        disagree()
        job()

    assert assert_same(monkeypatch, mixed_job) > 0


def conv_job(mixed: bool):
    def train():
        if mixed:
            disagree(conv="ieee")
        else:
            torch.backends.cudnn.allow_tf32 = False
        model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = model(torch.randn(8, 3, 32, 32, device="cuda")).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return train


def test_convolutions_under_disagreeing_apis_as_under_tf32_off(precision_restored):
    """cuDNN convolutions with `conv.fp32_precision = "ieee"` are those of
    `cudnn.allow_tf32 = False`: the same estimate, and the job runs (it raised before)."""
    mixed = estimate(conv_job(mixed=True), steps=3, **GPU)
    torch.backends.cudnn.allow_tf32 = True
    plain = estimate(conv_job(mixed=False), steps=3, **GPU)
    assert mixed.capture.error is None and plain.capture.error is None
    assert mixed.peak_reserved_bytes == plain.peak_reserved_bytes
    assert mixed.peak_allocated_bytes == plain.peak_allocated_bytes
    assert mixed.capture.trace.sizes == plain.capture.trace.sizes
