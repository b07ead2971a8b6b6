"""Round 6: sharded training as people launch it, run unmodified through the real CLI, each rank's
device bytes worked out by hand (not read from peakmem):

- Lightning `Trainer(strategy=...)` on 2 devices (scripts/r6_lightning_sharded.py, after
  Lightning's docs model_parallel/fsdp.rst and deepspeed.rst): FSDP with an auto-wrap and an
  activation-checkpointing policy under bf16-mixed, `"deepspeed_stage_2"`, `"deepspeed_stage_3"`
  and `DeepSpeedStrategy(stage=2, offload_optimizer=True)`; a ModelCheckpoint saves the best and
  the last checkpoint (FSDP's full optimizer state dict gathers every rank's keys: capture/
  peer_objects.py).

- accelerate + DeepSpeed with accelerate's examples/by_feature/checkpointing.py (nlp_example's
  loop, the tiny BERT on MRPC of test_library_jobs_r4.py): `accelerate launch --use_deepspeed
  --zero_stage 2` and an `accelerate config` DeepSpeed file (ZeRO-3, zero3_init_flag); accelerate
  FSDP2 (`fsdp_version: 2` in the config file).

- pytorch/examples distributed/FSDP2 (scripts/r6_fsdp2_example.py) under `torchrun
  --nproc_per_node 2`: meta-device init, `fully_shard` per block and root, optional
  MixedPrecisionPolicy, Adam, and the example's full state dict save.

Lightning starts the other rank itself; rank 0 is traced with a fake group of world size 2.
"""

from __future__ import annotations

from math import ceil

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs import test_library_jobs_r4 as r4
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import needs
from tests.library_jobs.test_library_jobs_r4 import BERT_MRPC_SHAPES, fsdp1_rank_state

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


# accelerate + DeepSpeed: examples/by_feature/checkpointing.py (nlp_example's loop) ---------------

ACCELERATE_ZERO3_CONFIG = """compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 1
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
"""A DeepSpeed ZeRO-3 config as `accelerate config` writes it."""

ACCELERATE_DS_BUCKET = int(5e8)
"""DeepSpeed's default reduce_bucket_size (accelerate's generated config leaves it unset)."""


@pytest.fixture(scope="module")
def mrpc_dir(tmp_path_factory):
    """test_library_jobs_r4.py's working directory: `bert-base-cased` (tiny) and `glue/mrpc`,
    written once for this module's accelerate jobs (each writes its own config file there; none
    resumes from another's checkpoint)."""
    return r4.mrpc_dir.__wrapped__(tmp_path_factory.mktemp("mrpc"))


def _accelerate_bert(mrpc_dir, launcher: tuple[str, ...]):
    """The tiny BERT on MRPC, `--mixed_precision bf16` (the script's own flag: its default "no"
    would override the launcher's)."""
    est = estimate("r4_hand_metric.py", "r4_accelerate_checkpointing.py", "--mixed_precision",
                   "bf16", cwd=mrpc_dir, launcher=launcher, timeout=240)
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake" and est.data["estimate_kind"] == "training"
    assert est.data["world_size"] == WORLD and est.data["launcher"] == "accelerate"
    assert est.data["phases_ran"][:2] == ["training", "eval"]
    return est


@needs("transformers", "accelerate", "datasets", "deepspeed")
def test_accelerate_launch_use_deepspeed_zero_stage_2(mrpc_dir):
    est = _accelerate_bert(mrpc_dir, ("accelerate", "launch", "--use_deepspeed", "--zero_stage",
                                      "2", "--num_processes", str(WORLD)))
    numel = ex.count(BERT_MRPC_SHAPES)
    master = ex.rounded(ceil(numel / WORLD) * ex.FP32)
    # ZeRO-2: the bf16 weights whole (one flat buffer), the rank's fp32 master half
    assert est.breakdown["parameter"] == ex.rounded(numel * ex.BF16) + master
    # AdamW's moments of the partition (and its device `step` where DeepSpeed made one)
    assert est.breakdown["optimizer_state"] in (2 * master, 2 * master + ex.BLOCK)
    # overlap_comm is off by default below ZeRO-3: one reduce bucket of bf16 elements
    assert est.breakdown["gradient"] == ex.rounded(ACCELERATE_DS_BUCKET * ex.BF16)


@needs("transformers", "accelerate", "datasets", "deepspeed")
def test_accelerate_deepspeed_config_file_zero3_init(mrpc_dir):
    config = mrpc_dir / "ds_zero3.yaml"
    config.write_text(ACCELERATE_ZERO3_CONFIG)
    est = _accelerate_bert(mrpc_dir, ("accelerate", "launch", "--config_file", str(config)))
    rank = sum(ceil(ex.count([shape]) / WORLD) for shape in BERT_MRPC_SHAPES)
    master, partition = ex.rounded(rank * ex.FP32), ex.rounded(rank * ex.BF16)
    assert est.breakdown["optimizer_state"] in (2 * master, 2 * master + ex.BLOCK)
    # beside them the gathered layers (at most every parameter whole, each its own block)
    gathered = ex.device_bytes(BERT_MRPC_SHAPES, ex.BF16)
    assert master + partition <= est.breakdown["parameter"] <= master + partition + gathered
    assert est.breakdown["gradient"] == ex.rounded(ACCELERATE_DS_BUCKET * ex.BF16) + partition


# pytorch/examples distributed/FSDP2 under torchrun -------------------------------------------

FSDP2_DIM, FSDP2_VOCAB, FSDP2_SEQ, FSDP2_LAYERS = 16, 1024, 64, 10
FSDP2_LAYER = ([(FSDP2_DIM,)] * 2 + [(FSDP2_DIM, FSDP2_DIM)] * 4 + [(FSDP2_DIM,)] * 2
               + [(4 * FSDP2_DIM, FSDP2_DIM), (4 * FSDP2_DIM,), (FSDP2_DIM, 4 * FSDP2_DIM), (FSDP2_DIM,)])
FSDP2_SHAPES = ([(FSDP2_VOCAB, FSDP2_DIM), (FSDP2_SEQ, FSDP2_DIM)] + FSDP2_LAYERS * FSDP2_LAYER
                + [(FSDP2_DIM,), (FSDP2_DIM,), (FSDP2_VOCAB, FSDP2_DIM)])
"""model.py's Transformer(ModelArgs(n_layers=10, dim 16, vocab 1024, 64 positions)): the
embeddings, per block two LayerNorms, wq / wk / wv / wo (no bias), the MLP; the final norm and
the output projection (no bias)."""


def fsdp2_rank_bytes(shapes: list, world: int) -> int:
    """fully_shard: each parameter's dim 0 padded to a multiple of the world size and split; rank
    0 keeps one chunk of each, a tensor of its own (fp32)."""
    return sum(ex.rounded(ceil(shape[0] / world) * ex.count([shape[1:]]) * ex.FP32)
               for shape in shapes)


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_params_saved"])
def test_fsdp2_example_torchrun_two_ranks(tmp_path, mixed):
    args = ("--mixed-precision",) if mixed else ()
    flags = ("--steps", "all") if mixed else ()  # all 10 steps, then the checkpoint save
    est = estimate("r6_fsdp2_example.py", *args, cwd=tmp_path, flags=flags, timeout=240,
                   launcher=("torchrun", "--nproc_per_node", str(WORLD)))
    assert est.returncode == 0, est.failure()
    # the meta-device init (to_empty + reset_parameters on sharded DTensors) runs on fake tensors
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["world_size"] == WORLD and est.data["launcher"] == "torchrun"
    shard = fsdp2_rank_bytes(FSDP2_SHAPES, WORLD)
    # MixedPrecisionPolicy(param_dtype=bf16) casts the gathered copies: the shards stay fp32
    assert est.breakdown["parameter"] == shard
    assert est.breakdown["optimizer_state"] == 2 * shard  # Adam's moments (host `step`s)
    if mixed:
        assert est.data["steps"] == 10
        assert "saved 125 tensors and the state of 125 parameters" in est.stderr
        assert "saved 2 file(s) of fake device data" in "\n".join(est.data["notes"])


# accelerate FSDP2 (`fsdp_version: 2`) on nlp_example's loop ------------------------------------

ACCELERATE_FSDP2_CONFIG = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
"""accelerate's FSDP2 config (docs: usage_guides/fsdp, "FSDP2"): one unit per BertLayer."""


@needs("transformers", "accelerate", "datasets")
def test_accelerate_fsdp2_config_file(mrpc_dir):
    config = mrpc_dir / "fsdp2.yaml"
    config.write_text(ACCELERATE_FSDP2_CONFIG)
    est = _accelerate_bert(mrpc_dir, ("accelerate", "launch", "--config_file", str(config)))
    # fully_shard (FSDP2, not FSDP1's flat parameters: the config's fsdp_version reached
    # accelerate): each parameter's rank-0 chunk, fp32 (bf16 is the gathered copies' dtype)
    shard = fsdp2_rank_bytes(BERT_MRPC_SHAPES, WORLD)
    assert est.breakdown["parameter"] == shard
    # AdamW's moments of each chunk; the 0-d `step`s sit on the device beside DTensor parameters
    steps = ex.BLOCK * len(BERT_MRPC_SHAPES)
    assert est.breakdown["optimizer_state"] in (2 * shard, 2 * shard + steps)
