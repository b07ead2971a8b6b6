"""Round 6: sharded training as people launch it, run unmodified through the real CLI, each rank's
device bytes worked out by hand (not read from peakmem):

- Lightning `Trainer(strategy=...)` on 2 devices (scripts/r6_lightning_sharded.py, after
  Lightning's docs model_parallel/fsdp.rst and deepspeed.rst): FSDP with an auto-wrap and an
  activation-checkpointing policy under bf16-mixed, `"deepspeed_stage_2"`, `"deepspeed_stage_3"`
  and `DeepSpeedStrategy(stage=2, offload_optimizer=True)`; a ModelCheckpoint saves the best and
  the last checkpoint (FSDP's full optimizer state dict gathers every rank's keys: capture/
  peer_objects.py).

Lightning starts the other rank itself; rank 0 is traced with a fake group of world size 2.
"""

from __future__ import annotations

from math import ceil

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import needs
from tests.library_jobs.test_library_jobs_r4 import fsdp1_rank_state

pytestmark = pytest.mark.slow

# r6_lightning_sharded.py's LitTransformer(vocab 256, dim 128, 4 heads, depth 2)
DIM, VOCAB = 128, 256
BLOCK = [(DIM,), (DIM,), (DIM,), (DIM,),  # norm1, norm2 (weight, bias)
         (3 * DIM, DIM), (3 * DIM,), (DIM, DIM), (DIM,),  # attention in / out projections
         (4 * DIM, DIM), (4 * DIM,), (DIM, 4 * DIM), (DIM,)]  # the MLP
ROOT = [(VOCAB, DIM), (VOCAB, DIM), (VOCAB,)]  # embedding, head weight and bias
SHAPES = ROOT[:1] + 2 * BLOCK + ROOT[1:]
NUMEL = ex.count(SHAPES)  # 462,336
WORLD = 2
DS_BUCKET = int(2e8)
"""Lightning's DeepSpeedStrategy default reduce_bucket_size (elements)."""


def _lightning(strategy: str, tmp_path):
    est = estimate("r6_lightning_sharded.py", "--strategy", strategy, cwd=tmp_path, timeout=240)
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training" and est.data["mode"] == "fake"
    assert est.data["world_size"] == WORLD and est.data["launcher"] == "lightning"
    notes = "\n".join(est.data["notes"])
    assert "saved" in notes and "last.ckpt" in notes  # ModelCheckpoint saved (diverted)
    assert est.data["phases_ran"][:2] == ["training", "eval"]
    return est


@needs("lightning")
def test_lightning_fsdp_bf16_mixed_activation_checkpointing_saves_full_checkpoint(tmp_path):
    est = _lightning("fsdp", tmp_path)
    # three FSDP units (the root: embedding and head; each Block), fp32 flat parameters split in
    # two: the rank keeps its half, AdamW keeps two moments of each parameter's local part
    params, moments = fsdp1_rank_state([ROOT, BLOCK, BLOCK], world=WORLD, rank=0)
    assert NUMEL * ex.FP32 // WORLD <= params < NUMEL * ex.FP32 // WORLD + 3 * ex.BLOCK  # padding
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == moments
    assert est.data["peak_allocated_bytes"] >= params + moments


@needs("lightning", "deepspeed")
def test_lightning_deepspeed_stage_2(tmp_path):
    est = _lightning("deepspeed_stage_2", tmp_path)
    # bf16 weights whole (ZeRO-2 does not partition them) and the rank's fp32 master half
    master = ex.rounded(NUMEL // WORLD * ex.FP32)
    assert est.breakdown["parameter"] == ex.rounded(NUMEL * ex.BF16) + master
    assert est.breakdown["optimizer_state"] == 2 * master  # AdamW's moments of the partition
    # overlap_comm: two reduce buckets of 2e8 bf16 elements
    assert est.breakdown["gradient"] + est.breakdown["temporary"] >= 2 * DS_BUCKET * ex.BF16


@needs("lightning", "deepspeed")
def test_lightning_deepspeed_stage_3(tmp_path):
    est = _lightning("deepspeed_stage_3", tmp_path)
    rank = sum(ceil(ex.count([shape]) / WORLD) for shape in SHAPES)
    master, partition = ex.rounded(rank * ex.FP32), ex.rounded(rank * ex.BF16)
    assert est.breakdown["optimizer_state"] == 2 * master
    # the fp32 master and the bf16 partition are parameters (capture/zero_partitions.py), beside
    # the gathered layers (every parameter here is under Lightning's persistence threshold 1e5)
    assert master + partition <= est.breakdown["parameter"] <= master + partition + NUMEL * ex.BF16
    assert est.breakdown.get("input", 0) < partition  # the batch only
    # the reduce bucket and the rank's bf16 gradient partition
    assert est.breakdown["gradient"] == ex.rounded(DS_BUCKET * ex.BF16) + partition


@needs("lightning", "deepspeed")
def test_lightning_deepspeed_stage_2_offload_optimizer(tmp_path):
    est = _lightning("deepspeed_stage_2_offload", tmp_path)
    # DeepSpeedCPUAdam steps the host fp32 master: no master, no moments on the device
    assert "optimizer_state" not in est.breakdown
    assert est.breakdown["parameter"] == ex.rounded(NUMEL * ex.BF16)
    assert est.breakdown["gradient"] + est.breakdown["temporary"] >= 2 * DS_BUCKET * ex.BF16
