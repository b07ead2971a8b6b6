"""DeepSpeed ZeRO-3 (and ZeRO-2 with ZeRO-Offload) jobs run unmodified through the real CLI under
the `deepspeed` launcher, 1 and 2 ranks: the device bytes of each rank are worked out by hand from
DeepSpeed's partitioning, not read from peakmem.

What stays on the GPU of each rank (fp16/bf16 training, Adam):
- ZeRO-3 splits every parameter into world-size pieces of ceil(numel / world) elements
  (partition_parameters.py `_aligned_size`, `_padding_size`). The optimizer keeps its partitions
  in flat buffers: the 16-bit parameters (N elements a rank), their 16-bit gradients (N), the fp32
  master (4N bytes) and Adam's two fp32 moments (8N). `offload_optimizer: cpu` moves the master
  and the moments to (pinned) host memory, which is not GPU memory; `offload_param: cpu` moves
  the 16-bit partitions too. The gradient reduce bucket (`reduce_bucket_size` 16-bit elements)
  stays on the GPU; full parameters are gathered per layer for forward and backward (freed after,
  unless `stage3_max_reuse_distance` keeps them) and the small ones below
  `stage3_param_persistence_threshold` stay whole.
- ZeRO-2 with `offload_optimizer: cpu` keeps the flat 16-bit weights and two gradient buckets
  (`overlap_comm`: double-buffered) on the GPU, and nothing of the optimizer.

Sources re-created (scripts/): DeepSpeedExamples training/cifar/cifar10_deepspeed.py with the
ZeRO-3 / offload configs of the DeepSpeed docs (docs/_pages/config-json.md,
docs/code-docs/source/zero3.rst), the zero3.rst `deepspeed.zero.Init()` construction
(ds3_zero_init.py), and transformers' examples/pytorch/language-modeling/run_clm.py with
`--deepspeed ds_config_zero3.json` (the transformers DeepSpeed docs' ZeRO-3 config, "auto" values).
"""

from __future__ import annotations

import json
from math import ceil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate
from tests.library_jobs.shared_estimate import shared_estimate
from tests.library_jobs.test_library_jobs import needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_GPT2_CONFIG,
    sentences,
    write_config,
    write_tokenizer,
)

pytestmark = [pytest.mark.slow, needs("deepspeed")]

FP16 = 2
CIFAR_NET = (ex.conv(6, 3, 5) + ex.conv(16, 6, 5) + ex.linear(120, 400) + ex.linear(84, 120)
             + ex.linear(10, 84))
"""cifar10_deepspeed.py's Net: 62,006 parameters."""

FC1_WEIGHT = 400 * 120
"""Elements of the Net's largest parameter (fc1.weight)."""

BUCKET = 50_000
"""reduce_bucket_size / stage3_prefetch_bucket_size of the cifar ZeRO-3 configs (elements)."""


def _partition(shapes: list, world: int) -> int:
    """Elements of one rank's ZeRO-3 partition: each parameter padded to a multiple of world."""
    return sum(ceil(ex.count([shape]) / world) for shape in shapes)


def _cifar_config(stage: int, offload_optimizer: bool = False, offload_param: bool = False) -> dict:
    """The example's ds_config.json (fp16, Adam) with the docs' ZeRO-3 / ZeRO-Offload settings."""
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": BUCKET}
    if stage == 3:
        zero.update({"stage3_prefetch_bucket_size": BUCKET, "stage3_param_persistence_threshold": 100,
                     "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9})
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_batch_size": 16, "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                 "weight_decay": 3e-7}},
        "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 15},
        "zero_optimization": zero,
    }


def _cifar(tmp_path: Path, world: int, config: dict):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    est = estimate("r3_deepspeed_cifar10.py", "--deepspeed", "--deepspeed_config", str(path),
                   "--train-size", "64", "--test-size", "16", cwd=tmp_path, timeout=240,
                   launcher=("deepspeed", "--num_gpus", str(world)))
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training" and est.data["world_size"] == world
    # fake mode ran the whole job: no eager rerun on the CPU (ZeRO-3's offload_param failed
    # in fake mode before capture/host_deferred.py kept its mode in backward)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval"]
    return est


@pytest.mark.parametrize("world", [1, 2])
def test_cifar_zero3_partitions_master_and_adam_state_by_world_size(tmp_path, world):
    est = _cifar(tmp_path, world, _cifar_config(3))
    assert "optimizer=DeepSpeedZeroOptimizer_Stage3" in est.stderr
    rank = _partition(CIFAR_NET, world)
    master = ex.rounded(rank * ex.FP32)
    # the fp32 master partition is the parameter the optimizer steps; Adam's two moments
    assert est.breakdown["optimizer_state"] == 2 * master
    # the 16-bit partition (flat, copied to the device when the engine is built) is a
    # parameter too (capture/zero_partitions.py), not an input
    partition = ex.rounded(rank * FP16)
    assert est.breakdown["parameter"] >= master + partition
    # the reduce bucket and the 16-bit gradient partition (contiguous_gradients)
    assert est.breakdown["gradient"] == ex.rounded(BUCKET * FP16) + partition
    model_state = master * 3 + partition * 2
    assert model_state <= est.data["peak_allocated_bytes"] - est.breakdown["workspace"]
    if world > 1:
        # stage3_max_reuse_distance 1e9: gathered layers stay; fc1's full 16-bit weight is live
        assert est.breakdown["parameter"] >= master + partition + ex.rounded(FC1_WEIGHT * FP16)


def test_cifar_zero3_no_live_gathered_parameters(tmp_path):
    """stage3_max_live_parameters / max_reuse_distance / prefetch_bucket_size 0: each gathered
    layer is released after use, so the peak holds no full fc1 weight beside the master."""
    config = _cifar_config(3)
    config["zero_optimization"].update({"stage3_max_live_parameters": 0,
                                        "stage3_max_reuse_distance": 0,
                                        "stage3_prefetch_bucket_size": 0})
    est = _cifar(tmp_path, 2, config)
    master = ex.rounded(_partition(CIFAR_NET, 2) * ex.FP32)
    model = master + ex.rounded(_partition(CIFAR_NET, 2) * FP16)  # master + 16-bit partition
    assert est.breakdown["optimizer_state"] == 2 * master
    # at most one layer gathered at a time: the peak may fall inside fc1's own forward or
    # backward (fc1 and its bias live beside the partitions), never with the whole 16-bit model
    # gathered as stage 3's defaults would keep it
    assert model <= est.breakdown["parameter"] < model + ex.rounded(62_006 * FP16)  # the Net, 16-bit


def test_cifar_zero3_offload_optimizer_keeps_master_and_state_on_host(tmp_path):
    world = 2
    est = _cifar(tmp_path, world, _cifar_config(3, offload_optimizer=True))
    rank = _partition(CIFAR_NET, world)
    # DeepSpeedCPUAdam (capture/deepspeed_ops.py's stand-in) steps the host master partition:
    # neither it nor the moments are device memory; the pinned host buffers are not either
    assert "optimizer_state" not in est.breakdown
    # the 16-bit partition stays (a parameter), beside at most every layer gathered whole
    partition = ex.rounded(rank * FP16)
    assert partition <= est.breakdown["parameter"] < partition + ex.device_bytes(CIFAR_NET, FP16)
    assert est.breakdown.get("input", 0) < partition  # the batch only
    assert est.breakdown["gradient"] == ex.rounded(BUCKET * FP16)  # gradient partitions: host


def test_cifar_zero3_offload_param_keeps_16bit_partitions_on_host(tmp_path):
    world = 2
    est = _cifar(tmp_path, world, _cifar_config(3, offload_optimizer=True, offload_param=True))
    rank = _partition(CIFAR_NET, world)
    assert "optimizer_state" not in est.breakdown
    # the 16-bit partitions live on the host: what stays of the parameters on the device is
    # less than one rank's 16-bit partition (gathered layers and the persistent small ones)
    on_device = est.breakdown.get("input", 0) + est.breakdown.get("parameter", 0)
    assert on_device < ex.rounded(rank * FP16)
    assert est.breakdown["gradient"] == ex.rounded(BUCKET * FP16)


def test_cifar_zero2_offload_optimizer_double_buffered_buckets(tmp_path):
    est = _cifar(tmp_path, 1, _cifar_config(2, offload_optimizer=True))
    assert "optimizer=DeepSpeedZeroOptimizer " in est.stderr or "DeepSpeedZeroOptimizer\n" in est.stderr
    flat = ex.count(CIFAR_NET)
    assert "optimizer_state" not in est.breakdown
    assert est.breakdown["parameter"] >= ex.rounded(flat * FP16)  # the flat 16-bit weights
    assert est.breakdown["parameter"] < ex.rounded(flat * ex.FP32)  # no fp32 master on device
    # overlap_comm: two reduce buckets of reduce_bucket_size 16-bit elements
    buckets = est.breakdown["gradient"] + est.breakdown.get("temporary", 0)
    assert buckets >= 2 * ex.rounded(BUCKET * FP16)


# deepspeed.zero.Init() (zero3.rst "Constructing Massive Models") ---------------------------------

ZERO_INIT_MLP = ex.linear(256, 64) + 3 * ex.linear(256, 256) + ex.linear(10, 256)
"""ds3_zero_init.py's MyLargeModel(width 256, depth 3): 216,586 parameters."""


def _zero_init_config(offload: bool) -> dict:
    zero: dict = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": 100_000, "stage3_prefetch_bucket_size": 100_000,
                  "stage3_param_persistence_threshold": 1000, "stage3_max_live_parameters": 1e9,
                  "stage3_max_reuse_distance": 1e9}
    if offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "bf16": {"enabled": True},
            "zero_optimization": zero}


def zero_init_two_ranks(tmp_path_factory: pytest.TempPathFactory, offload: bool) -> JobEstimate:
    """ds3_zero_init.py under `deepspeed --num_gpus 2`, estimated once per session for each
    config (this file's test and test_library_jobs_gaps.py's on-GPU one assert on it)."""

    def run(workdir: Path) -> JobEstimate:
        path = workdir / "ds_config.json"
        path.write_text(json.dumps(_zero_init_config(offload)))
        return estimate("ds3_zero_init.py", "--deepspeed_config", str(path), cwd=workdir,
                        timeout=240, launcher=("deepspeed", "--num_gpus", "2"))

    return shared_estimate(tmp_path_factory, f"ds3-zero-init-{offload}", run)[0]


ZERO_INIT_GROUP = pytest.mark.xdist_group("ds3-zero-init")
"""One xdist worker for the tests sharing `zero_init_two_ranks`: the other would wait on its lock."""


@ZERO_INIT_GROUP
@pytest.mark.parametrize("offload", [False, True], ids=["on_gpu", "offload"])
def test_zero_init_builds_partitioned_two_ranks(tmp_path_factory, offload):
    world = 2
    est = zero_init_two_ranks(tmp_path_factory, offload)
    # zero.Init's Tensor.__new__ wrapper made torch._dynamo's first import fail (capture/
    # deepspeed_ops.py imports it before)
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    rank = _partition(ZERO_INIT_MLP, world)
    assert f"partitioned: True local elements: {rank}" in est.stderr
    assert "optimizer: DeepSpeedZeroOptimizer_Stage3" in est.stderr
    assert est.data["steps"] == 3  # --steps 3 (its loop iterates no DataLoader)
    master = ex.rounded(rank * ex.FP32)
    bf16_partition = ex.rounded(rank * ex.BF16)
    if offload:
        assert "optimizer_state" not in est.breakdown
        on_device = est.breakdown.get("input", 0) + est.breakdown.get("parameter", 0)
        assert on_device < 2 * bf16_partition  # no partition; the gathered layers
        assert est.breakdown["gradient"] == ex.rounded(100_000 * ex.BF16)  # partitions: host
    else:
        assert est.breakdown["optimizer_state"] == 2 * master
        # the bf16 partition is a parameter beside the fp32 master (capture/zero_partitions.py)
        assert est.breakdown["parameter"] >= master + bf16_partition
        assert est.breakdown.get("input", 0) < bf16_partition
        # the reduce bucket and the bf16 gradient partition
        assert est.breakdown["gradient"] == ex.rounded(100_000 * ex.BF16) + bf16_partition


# transformers run_clm.py (Trainer) --deepspeed ds_config_zero3.json ---------------------------------

HF_ZERO3 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
        "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
"""The transformers DeepSpeed docs' ZeRO-3 config (CPU offload of parameters and optimizer)."""


@needs("transformers", "accelerate", "datasets")
@pytest.mark.parametrize("offload", [True, False], ids=["offload", "on_gpu"])
def test_run_clm_trainer_zero3_json_two_ranks(tmp_path, offload):
    world = 2
    model = write_tokenizer(write_config(tmp_path / "gpt2", TINY_GPT2_CONFIG))
    (tmp_path / "train.txt").write_text("\n".join(sentences(200)) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(sentences(20, seed=1)) + "\n")
    config = json.loads(json.dumps(HF_ZERO3))
    if not offload:
        del config["zero_optimization"]["offload_optimizer"], config["zero_optimization"]["offload_param"]
    (tmp_path / "ds_config_zero3.json").write_text(json.dumps(config))
    est = estimate(
        "hf_ex_run_clm.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "valid.txt"),
        "--block_size", "32", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
        "--max_steps", "3", "--do_train", "--do_eval", "--report_to", "none", "--seed", "0", "--fp16",
        "--output_dir", str(tmp_path / "out"), "--deepspeed", str(tmp_path / "ds_config_zero3.json"),
        cwd=tmp_path, timeout=300, launcher=("deepspeed", "--num_gpus", str(world)))
    # the Trainer builds the model inside zero.Init(): ZeRO-3 copied each partition into a host
    # buffer whose placeholder values came from zero.Init's torch.zeros wrapper, a device tensor
    # (capture/device_map.py now uses torch's own zeros)
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["estimate_kind"] == "training" and est.data["steps"] == 3
    assert est.data["phases_ran"][-1] == "eval"
    # run_clm resizes the embeddings when len(tokenizer) > weight.shape[0]: a ZeRO-3 parameter
    # built in zero.Init is partitioned, its `.shape` (0,), so the tied wte / lm_head is resized
    # to the tokenizer's size (126 here), as on a GPU
    vocab = len(json.loads((model / "tokenizer.json").read_text())["model"]["vocab"])
    shapes = ex.gpt2_shapes(**dict(ex.TINY_GPT2, vocab=vocab))
    assert f"Number of trainable parameters = {ex.count(shapes):,}" in est.stderr
    rank = _partition(shapes, world)
    full_fp16 = ex.device_bytes(shapes, FP16)
    if offload:
        assert "optimizer_state" not in est.breakdown
        # stage3_max_reuse_distance 1e9 keeps gathered layers: at most about the whole 16-bit
        # model is on the device at once, not its fp32 master
        assert est.breakdown["parameter"] < ex.rounded(ex.count(shapes) * ex.FP32)
    else:
        master = ex.rounded(rank * ex.FP32)
        assert est.breakdown["optimizer_state"] == 2 * master
        assert est.breakdown["parameter"] >= master
    assert est.breakdown["parameter"] >= full_fp16 // world
