"""Round 19c (short): pytorch/examples' and pytorch/tutorials' DDP and DataParallel scripts not
covered before, re-created in their upstream structure (read through the code search, written
here; each docstring names the upstream file and version) and run unmodified through the
capture; device bytes worked out by hand (not read from peakmem):

- pytorch/examples distributed/ddp/example.py (scripts/r19c_examples_ddp_example.py):
  `torchrun --nnodes=1 --nproc_per_node=8`, the backend from
  `torch.distributed.get_default_backend_for_device(torch.accelerator.current_accelerator())`,
  `torch.accelerator.set_device_index(rank)`, a host input handed to DDP. Worked as it is.
- pytorch/examples distributed/ddp/main.py, the DDP tutorial's code
  (scripts/r19c_examples_ddp_main.py): three `mp.spawn` demos one after another over gloo
  groups, rank 0's checkpoint in the temp directory loaded with a `{"cuda:0": "cuda:R"}`
  map_location then `os.remove`d, a model split over two GPUs. Found: FileNotFoundError at the
  `os.remove` of the diverted save (capture/side_effects.py), 1.5 GiB of NCCL memory for three
  destroyed gloo groups (capture/fake_distributed.py), and a step count of 1 or 2 by chance
  (optimizers keyed by a reusable id: capture/phases.py).
- pytorch/examples distributed/ddp-tutorial-series/multinode.py
  (scripts/r19c_ddp_series_multinode.py): node 0 of `torchrun --nnodes=2 --nproc_per_node=2
  --node_rank=0 --rdzv_backend=c10d ...`, `torch.accelerator.is_available()` /
  `current_accelerator()` / `device_index(rank)`, LOCAL_RANK for the device and RANK for the
  snapshot. Worked as it is.
- pytorch/tutorials beginner_source/blitz/data_parallel_tutorial.py
  (scripts/r19c_data_parallel_tutorial.py): forward-only over a random host dataset,
  `nn.DataParallel` only with more than one GPU. Worked on one GPU; over two GPUs peakmem said
  it did not support nn.DataParallel over several GPUs; now each GPU is estimated on its own
  (capture/data_parallel.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training
from tests.library_jobs.test_library_jobs_r12 import nccl_communicator_bytes

pytestmark = pytest.mark.slow

TOY_MODEL = ex.linear(10, 10) + ex.linear(5, 10)
"""ToyModel: net1 = Linear(10, 10), net2 = Linear(10, 5): four tensors, a 512-byte block each."""
X, LABELS = ex.rounded(20 * 10 * ex.FP32), ex.rounded(20 * 5 * ex.FP32)
"""`torch.randn(20, 10)` (moved to the device by DDP) and `torch.randn(20, 5).to(rank)`."""


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# pytorch/examples distributed/ddp/example.py ----------------------------------------------------

def test_ddp_example_torchrun_accelerator_api(tmp_path):
    est = estimate("r19c_examples_ddp_example.py", flags=("--gpu", "h100-80gb"),
                   launcher=("torchrun", "--nnodes=1", "--nproc_per_node=8"), cwd=tmp_path)
    params = ex.device_bytes(TOY_MODEL, ex.FP32)
    # plain SGD (no momentum): no state; cuBLAS's workspace is the rest
    assert_training(est, params=params, optimizer_state=0,
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["world_size"] == 8 and est.data["traced_ranks"] == [0]
    # the backend the accelerator API picks for cuda: nccl, one communicator (the world's)
    assert "backend=nccl" in est.stderr
    assert est.data["libraries"]["nccl"] == nccl_communicator_bytes(est)
    # the host input DDP scattered to the device and the labels moved with `.to(rank)`
    assert est.breakdown["input"] == X + LABELS
    assert est.data["steps"] == 1 and est.data["phases_ran"] == ["training"]


# pytorch/examples distributed/ddp/main.py (the DDP tutorial) --------------------------------------

def test_ddp_tutorial_main_three_spawned_demos(tmp_path):
    leftover = Path(tempfile.gettempdir()) / "model.checkpoint"
    existed = leftover.exists()
    # `if n_gpus < 8: print(...)`: --nproc-per-node 8 gives the job its 8 GPUs
    est = estimate("r19c_examples_ddp_main.py", flags=("--gpu", "h100-80gb",
                                                       "--nproc-per-node", "8"), cwd=tmp_path)
    params = ex.device_bytes(TOY_MODEL, ex.FP32)
    assert_training(est, params=params, optimizer_state=0,
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    for demo in ("basic DDP example", "DDP checkpoint example", "DDP with model parallel example"):
        assert f"Running {demo} on rank 0." in est.stderr
    notes = _notes(est)
    assert "torch.multiprocessing spawn of 8 processes" in notes
    assert "torch.multiprocessing spawn of 4 processes" in notes
    # rank 0's checkpoint went to the scratch directory; the job's os.remove removed that copy
    # (FileNotFoundError on the real path before) and nothing is left in the temp directory
    assert f"instead of {leftover}" in notes
    assert leftover.exists() == existed
    # gloo groups make no NCCL communicator (1.5 GiB, three 512 MiB communicators, before)
    assert "nccl" not in est.data["libraries"]
    # three optimizers of one step each, one after another (1 or 2 by chance before)
    assert est.data["steps"] == 1
    # ToyMpModel's net1 on cuda:0 and net2 on cuda:1, counted together (noted)
    assert "besides its current device cuda:0" in notes


# pytorch/examples distributed/ddp-tutorial-series/multinode.py ----------------------------------

def test_ddp_series_multinode_node_zero(tmp_path):
    # `from datautils import MyTrainDataset`: scripts/datautils.py, next to the script
    launcher = ("torchrun", "--nnodes=2", "--nproc_per_node=2", "--node_rank=0", "--rdzv_id=456",
                "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29603")
    est = estimate("r19c_ddp_series_multinode.py", "2", "1", flags=("--gpu", "h100-80gb"),
                   launcher=launcher, cwd=tmp_path)
    # nn.Linear(20, 1) and plain SGD
    assert_training(est, params=ex.device_bytes(ex.linear(1, 20), ex.FP32), optimizer_state=0,
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert (est.data["nnodes"], est.data["nproc_per_node"], est.data["world_size"]) == (2, 2, 4)
    assert "Running on rank 0 on device cuda:0" in est.stderr
    # the DistributedSampler's quarter of 2048 samples: 16 batches of 32 an epoch
    assert "DataLoader epoch of 16 batches" in _notes(est)
    # a (32, 20) fp32 source and (32, 1) targets moved to LOCAL_RANK
    assert est.breakdown["input"] == ex.rounded(32 * 20 * ex.FP32) + ex.rounded(32 * ex.FP32)
    assert est.data["libraries"]["nccl"] == nccl_communicator_bytes(est)
    # global rank 0 saved a snapshot each epoch (save_every 1): diverted, none in the folder
    assert "saved 2 file(s) of fake device data" in _notes(est)
    assert not (tmp_path / "snapshot.pt").exists()


# pytorch/tutorials beginner_source/blitz/data_parallel_tutorial.py ------------------------------

def test_data_parallel_tutorial_one_gpu_forward_only(tmp_path):
    est = estimate_here("r19c_data_parallel_tutorial.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "forward" and est.data["steps"] == 0
    # Linear(5, 2): weight and bias, a 512-byte block each; no gradient, no optimizer
    assert est.breakdown["parameter"] == ex.device_bytes(ex.linear(2, 5), ex.FP32)
    assert "gradient" not in est.breakdown and "optimizer_state" not in est.breakdown
    # a (30, 5) fp32 batch is 600 bytes (one 1024-byte block): the next batch is moved while
    # the previous one is still bound to `input`
    assert est.breakdown["input"] == 2 * ex.rounded(30 * 5 * ex.FP32)
    # one GPU: no DataParallel; the 100 rows in batches of 30 all ran (30, 30, 30, 10)
    assert "Let's use" not in est.stderr
    assert est.stderr.count("Outside: input size") == 4
    assert "torch.Size([10, 5])" in est.stderr

    over_two = estimate("r19c_data_parallel_tutorial.py",
                        flags=("--gpu", "h100-80gb", "--nproc-per-node", "2"), cwd=tmp_path)
    assert over_two.returncode == 0, over_two.failure()
    # each rank sees its node's two GPUs and wraps the model over both: a batch of 30 rows is
    # split 15 + 15 (scatter's chunk(2)), the last batch of 10 rows 5 + 5
    assert "Let's use 2 GPUs!" in over_two.stderr
    assert over_two.stderr.count("In Model: input size torch.Size([15, 5])") == 6
    assert over_two.stderr.count("In Model: input size torch.Size([5, 5])") == 2
    devices = over_two.data["devices"]
    assert [report["device"] for report in devices] == [0, 1]
    # cuda:1 holds the replica's weight and bias in one broadcast block (12 floats), and its
    # 15-row chunks (the previous one still in the graph of `output`, as on cuda:0)
    assert devices[0]["breakdown"]["parameter"] == ex.device_bytes(ex.linear(2, 5), ex.FP32)
    assert devices[1]["breakdown"]["parameter"] == ex.rounded((2 * 5 + 2) * ex.FP32)
    assert devices[1]["breakdown"]["input"] == 2 * ex.rounded(15 * 5 * ex.FP32)
    assert over_two.data["peak_bytes"] == max(report["peak_bytes"] for report in devices)
