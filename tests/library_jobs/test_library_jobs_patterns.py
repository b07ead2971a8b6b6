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
from tests.library_jobs.shared_estimate import shared_estimate
from tests.library_jobs.test_library_jobs import MiB, assert_training, needs

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
def sized_a100_free(tmp_path_factory):
    return shared_estimate(tmp_path_factory, "sized-a100-free", lambda _: estimate(
        "p_batch_from_memory.py", "--size-from", "mem_get_info",
        flags=("--gpu", "a100-40gb", "--steps", "all")))[0]


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


# p_prefetch_profile.py: apex's data_prefetcher, DataLoader workers, profiler, NVTX, AMP -------

PREFETCH_WIDTH, PREFETCH_BATCH, PREFETCH_SIZE = 32, 32, 64
PREFETCH_SHAPES = [
    (PREFETCH_WIDTH, 3, 3, 3), (PREFETCH_WIDTH,), (PREFETCH_WIDTH,),  # conv1 (no bias), bn1
    (PREFETCH_WIDTH, PREFETCH_WIDTH, 3, 3), (PREFETCH_WIDTH,), (PREFETCH_WIDTH,),  # conv2, bn2
    *ex.linear(10, PREFETCH_WIDTH),
]


@pytest.fixture(scope="module")
def prefetch_run(tmp_path_factory):
    return shared_estimate(tmp_path_factory, "prefetch",
                           lambda workdir: estimate("p_prefetch_profile.py", cwd=workdir))


@pytest.fixture(scope="module")
def prefetch(prefetch_run):
    return prefetch_run[0]


def test_prefetcher_workers_profiler_and_deprecated_amp(prefetch):
    params = ex.device_bytes(PREFETCH_SHAPES, ex.FP32)
    # fp16 conv outputs under autocast and their batch-norm outputs, kept for backward
    feature_map = PREFETCH_BATCH * PREFETCH_WIDTH * PREFETCH_SIZE**2 * ex.BF16
    # above the model state: the activations, backward's gradients of them and cuDNN's per-call
    # convolution workspaces (a factor of the bytes a convolution reads: cuda_rules/convolution)
    assert_training(prefetch, params=params, optimizer_state=params,  # SGD momentum
                    extra_upper=8 * feature_map)
    assert 2 * feature_map <= prefetch.breakdown["activation"] <= 6 * feature_map
    assert prefetch.data["mode"] == "fake", prefetch.data["mode_reason"]
    notes = _notes(prefetch)
    assert "torch profiler ran without its CUDA activity" in notes
    assert "num_workers=2 loaded its batches in the main process" in notes
    # the prefetcher's loop (`while input is not None`) ended by the DataLoader: both epochs ran
    assert prefetch.stderr.count("done: 4 steps per epoch") == 1
    assert "epoch 1" in prefetch.stderr


def test_prefetch_job_logged_to_its_file(prefetch_run):
    est, workdir = prefetch_run
    assert est.returncode == 0, est.failure()
    text = (workdir / "runs" / "prefetch" / "train.log").read_text()
    assert "epoch 1 done, max allocated" in text and "step 0 loss" in text


# p_notebook_resume.py: a notebook export resumed from a real checkpoint, SIGUSR1 checkpointing -

RESUME_VOCAB, RESUME_DIM, RESUME_CONTEXT, RESUME_LAYERS = 128, 64, 32, 2


def resume_shapes() -> list[ex.Shape]:
    d = RESUME_DIM
    layer = [(3 * d, d), (3 * d,), (d, d), (d,),  # self-attention in / out projections
             *ex.linear(4 * d, d), *ex.linear(d, 4 * d),  # feed-forward
             (d,), (d,), (d,), (d,)]  # norm1, norm2
    return [(RESUME_VOCAB, d), (RESUME_CONTEXT, d), *layer * RESUME_LAYERS, (RESUME_VOCAB, d)]


def _resume_after_a_real_run(workdir):
    import os
    import shutil
    import subprocess
    import sys

    from tests.library_jobs.harness import SCRIPTS, SRC

    env = dict(os.environ, PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, str(SCRIPTS / "p_notebook_resume.py"), "--steps", "2"],
                   cwd=workdir, env=env, check=True, capture_output=True, timeout=120)
    shutil.copyfile(workdir / "checkpoints" / "last.pt", workdir / "before.pt")
    return estimate("p_notebook_resume.py", "--preempt-at", "5", flags=("--steps", "all"),
                    cwd=workdir)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A checkpoint written by a real (CPU) run of 2 steps, then the estimate that resumes it."""
    est, workdir = shared_estimate(tmp_path_factory, "resume", _resume_after_a_real_run)
    before = (workdir / "before.pt").read_bytes()
    return est, before, (workdir / "checkpoints" / "last.pt").read_bytes()


def test_resume_with_map_location_cuda_keeps_the_loaded_dict(resumed):
    est, _, _ = resumed
    shapes = resume_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    # AdamW's moments; the checkpoint's CPU `step` tensors were moved to the GPU by
    # map_location and load_state_dict keeps them there (non-capturable: as loaded)
    state = 2 * params + ex.BLOCK * len(shapes)
    assert_training(est, params=params, optimizer_state=state)
    # the loaded dict stays referenced: its model tensors (copied into the parameters) and the
    # CPU RNG state (moved to the GPU too) are device memory the fresh run does not have
    rng_state = ex.rounded(torch_rng_state_bytes())
    assert est.breakdown["input"] == params + rng_state
    assert "device: cuda" in est.stderr and "resumed from step 2" in est.stderr
    # the RNG states read back with .cpu() are the file's (an all-zero state is refused)
    assert est.data["mode"] == "fake", est.data["mode_reason"]


def test_sigusr1_handler_checkpoints_without_touching_the_real_checkpoint(resumed):
    est, before, after = resumed
    assert est.returncode == 0, est.failure()
    assert "signal 10 at step 5: checkpointed" in est.stderr  # SIGUSR1 from the job itself
    assert "saved step 4" in est.stderr
    assert after == before  # the fake weights went to a scratch file, noted
    assert "the job saved 2 file(s) of fake device data" in _notes(est)


def torch_rng_state_bytes() -> int:
    import torch

    return torch.get_rng_state().numel()


# p_visible_devices_smi.py: CUDA_VISIBLE_DEVICES + cuda:0, --local_rank, nvidia-smi in a subprocess

@pytest.fixture(scope="module")
def smi_l4(tmp_path_factory):
    return shared_estimate(tmp_path_factory, "smi-l4", lambda _: estimate(
        "p_visible_devices_smi.py", "--local_rank", "0", flags=("--gpu", "l4")))[0]


def test_batch_from_nvidia_smi_follows_the_gpu_and_its_cublas_default(smi_l4):
    est = smi_l4
    shapes = ex.linear(256, 128) + ex.linear(128, 256)
    params = ex.device_bytes(shapes, ex.FP32)
    l4_mib = load_gpu("l4").total_memory_bytes // MiB
    batch = l4_mib // 64  # nvidia-smi answers for an idle L4: all of it free
    # RMSprop: square_avg only; the batch's activations (input, hidden x2, output) in the slack
    assert_training(est, params=params, optimizer_state=params,
                    extra_upper=4 * batch * (128 + 2 * 256 + 128))
    assert f"nvidia-smi: NVIDIA L4, {l4_mib} MiB free of {l4_mib} MiB" in est.stderr
    assert f"batch size {batch}" in est.stderr
    # CUDA_VISIBLE_DEVICES=1 set by the script: the one GPU it sees is cuda:0
    assert "visible 1 -> cuda:0 (1 device(s))" in est.stderr
    assert "besides its current device" not in _notes(est)
    # an Ada GPU's default cuBLAS workspace (:4096:2:16:8) per handle, and cuBLASLt's 1 MiB
    assert est.breakdown["workspace"] == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8) + LT_WORKSPACE


@needs("pynvml")
def test_nvml_used_memory_is_the_context_and_the_reserved_bytes(smi_l4):
    est = smi_l4
    assert est.returncode == 0, est.failure()
    lines = re.findall(r"reserved ([\d.]+) MiB, nvml used (\d+) MiB", est.stderr)
    assert lines, est.stderr[-500:]
    outside = est.data["context_bytes"] + est.data["library_bytes"]
    for reserved_mib, used_mib in lines:
        assert int(used_mib) == (outside + int(float(reserved_mib) * MiB)) // MiB
    assert "(pynvml.nvmlDeviceGetMemoryInfo)" in _notes(est)
