"""Script-level patterns around the training loop, as people write them (scripts/p_*.py), run
unmodified through the real CLI: batch sizes chosen from the GPU's memory, the scripts' own
out-of-memory halving loops, memory statistics each epoch, deterministic cuBLAS workspaces,
data prefetchers on side streams, profilers and timers, checkpoints and resumes, signal
handlers, notebook exports, DataLoader worker options. The expected bytes are worked out by hand
from each script's layers (expected.py), one estimate shared by the assertions on it."""

from __future__ import annotations

import re

import pytest

from peakmem.profiles import load_gpu
from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import MiB, assert_training

GiB = 2**30


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# p_batch_from_memory.py: the batch from the GPU's memory, an OOM-halving loop, cuBLAS config --

SIZED_SHAPES = ex.linear(512, 256) + ex.linear(512, 512) + ex.linear(10, 512)
SIZED_PARAMS = ex.device_bytes(SIZED_SHAPES, ex.FP32)
SIZED_SAVED_PER_SAMPLE = 4 * (256 + 4 * 512)
"""fp32 bytes a sample keeps for backward: the input, fc1's and fc2's outputs and their GELUs."""
CUBLAS_4096_8 = 4096 * 1024 * 8
LT_WORKSPACE = MiB


def sized_batch(gpu: str, per_gib: int = 64) -> int:
    return per_gib * int(load_gpu(gpu).total_memory_bytes // GiB)


def printed_batch(est) -> int:
    return int(re.findall(r"training with batch size (\d+)", est.stderr)[-1])


@pytest.fixture(scope="module")
def sized_h100():
    return estimate("p_batch_from_memory.py", flags=("--gpu", "h100-80gb"))


@pytest.fixture(scope="module")
def sized_a100_free():
    return estimate("p_batch_from_memory.py", "--size-from", "mem_get_info",
                    flags=("--gpu", "a100-40gb", "--steps", "all"))


@pytest.fixture(scope="module")
def sized_a100_oom():
    return estimate("p_batch_from_memory.py", "--samples-per-gib", "131072",
                    flags=("--gpu", "a100-40gb"))


def test_batch_from_total_memory_follows_the_gpu_asked(sized_h100, sized_a100_free):
    batch = sized_batch("h100-80gb")
    activations = batch * SIZED_SAVED_PER_SAMPLE
    assert_training(sized_h100, params=SIZED_PARAMS, optimizer_state=2 * SIZED_PARAMS,
                    extra_upper=3 * activations)
    assert printed_batch(sized_h100) == batch
    model_state = 4 * SIZED_PARAMS  # parameters, gradients, Adam's two moments
    beyond = sized_h100.data["peak_allocated_bytes"] - sized_h100.breakdown["workspace"]
    assert activations // 2 <= beyond - model_state <= 3 * activations, (beyond, activations)
    assert "read the GPU's memory size (torch.cuda.get_device_properties" in _notes(sized_h100)
    assert "h100-80gb" in _notes(sized_h100)
    # the same script on an A100 40GB: half the batch, fewer activation bytes
    a100_batch = printed_batch(sized_a100_free)
    assert 0 < a100_batch <= sized_batch("a100-40gb") < batch
    assert sized_a100_free.breakdown["activation"] < sized_h100.breakdown["activation"]
    assert "(torch.cuda.mem_get_info()): it was answered for the target GPU (a100-40gb" in \
        _notes(sized_a100_free)


def test_cublas_workspace_config_set_by_the_script_is_followed(sized_a100_free):
    # CUBLAS_WORKSPACE_CONFIG=:4096:8 (set by the script before torch): 32 MiB per cuBLAS handle
    # (forward and autograd threads) where the A100's default is :4096:2:16:8 (8.1 MiB)
    assert sized_a100_free.returncode == 0, sized_a100_free.failure()
    assert sized_a100_free.breakdown["workspace"] == 2 * CUBLAS_4096_8 + LT_WORKSPACE


def test_reset_peak_and_max_memory_allocated_each_epoch(sized_a100_free):
    est = sized_a100_free
    assert est.returncode == 0, est.failure()
    assert est.data["steps"] == 1 + 2 * 4  # the probe step, then 2 epochs of 4
    peaks = [float(mib) for mib in re.findall(r"epoch \d loss \S+ peak ([\d.]+) MiB", est.stderr)]
    assert len(peaks) == 2 and peaks[0] == peaks[1]
    # each epoch's max_memory_allocated is the simulated allocator's: the estimate's peak
    assert abs(peaks[0] * MiB - est.data["peak_allocated_bytes"]) <= 0.1 * MiB
    assert est.stderr.count("|=====") == 2  # memory_summary's first line, each epoch


def test_own_oom_halving_loop_goes_on_with_half_the_batch(sized_a100_oom):
    est = sized_a100_oom
    assert est.returncode == 0, est.failure()
    first = sized_batch("a100-40gb", 131072)
    assert f"OOM at batch size {first}, halving" in est.stderr
    assert printed_batch(est) == first // 2
    # on the GPU the failed first try filled it; the estimate fits it as the job then trains
    assert est.data["fits"] is True
    assert first // 2 * SIZED_SAVED_PER_SAMPLE <= est.data["peak_allocated_bytes"] \
        <= load_gpu("a100-40gb").total_memory_bytes
    assert "caught 1 CUDA out-of-memory error(s)" in _notes(est)
