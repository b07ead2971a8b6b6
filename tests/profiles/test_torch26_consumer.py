"""The torch-2.6 consumer-GPU stack (RTX 3060 12GB, RTX 4060 8GB; issue 13): profiles, the cuBLAS
workspace per architecture worked from torch 2.6's CublasHandlePool.cpp, and the cuDNN model
fitted on the declared xMem calibration split."""

from __future__ import annotations

import pytest

from peakmem.profiles import load_gpu, load_stack

MiB = 2**20
CONSUMER = ("rtx3060-12gb", "rtx4060-8gb")


@pytest.mark.parametrize(("gpu", "capability"), [("rtx3060-12gb", (8, 6)), ("rtx4060-8gb", (8, 9))])
def test_profiles_exist_with_their_architecture(gpu, capability):
    profile = load_gpu(gpu)
    assert profile.capability == capability
    assert profile.total_memory_bytes < (12 if gpu.startswith("rtx3060") else 8) * 1024 * MiB


def test_rtx4060_total_is_what_torch_reported_in_xmems_runs():
    """get_device_properties total_memory = 7932.9 MiB in xMem's records (nvidia-smi: 8188)."""
    assert load_gpu("rtx4060-8gb").total_memory_bytes / MiB == pytest.approx(7932.9, abs=0.05)


@pytest.mark.parametrize("gpu", CONSUMER)
def test_cublas_workspace_is_the_default_config_below_sm90(gpu):
    """CublasHandlePool.cpp (torch 2.6) parseChosenWorkspaceSize: sm_90 gets 4096 * 8 * 1024
    (32 MiB); every other CUDA arch the default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" =
    4096 KiB x 2 + 16 KiB x 8."""
    stack = load_stack("2.6.0")
    assert int(stack.cublas_workspace_for(load_gpu(gpu).capability).value) == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert int(stack.cublas_workspace_for((9, 0)).value) == 32 * MiB


@pytest.mark.parametrize("gpu", CONSUMER)
def test_cudnn_model_is_fitted_on_the_xmem_split_not_carried_from_the_a100(gpu):
    stack, profile = load_stack("2.6.0"), load_gpu(gpu)
    model = stack.conv_workspace_for(profile)
    assert "xMem calibration split" in model.source
    assert model.value != stack.conv_workspace_for(load_gpu("a100-40gb")).value
    for family in ("cudnn_convolution", "cudnn_batch_norm"):
        assert "xMem calibration split" in stack.library_bytes_for(profile, family).source


def test_a100_torch24_stack_is_untouched():
    """The MLP/CNN A100 figures rest on these; the consumer fit must not move them."""
    stack, a100 = load_stack("2.4.1"), load_gpu("a100-40gb")
    assert stack.conv_workspace_for(a100).value == {
        "forward": 0.5, "backward_data": 1.5, "backward_weight": 2.5,
        "backward_data_per_weight": 0.0, "backward_weight_per_weight": 0.0,
    }
    assert int(stack.library_bytes_for(a100, "cudnn_convolution").value) == 250 * MiB
    assert int(stack.library_bytes_for(a100, "cudnn_batch_norm").value) == 40 * MiB
