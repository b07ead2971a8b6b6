"""Round 4: accelerate's and Lightning's own examples as people run them (scripts/r4_*.py),
unmodified, through the real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`).

Scripts that name a hub model or dataset ("bert-base-cased", `load_dataset("glue", "mrpc")`)
run in a directory holding a tiny local copy under that name (transformers and datasets read a
local directory of the name first). Parameter and optimizer bytes are worked out by hand from
the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import csv
import shutil
import struct
from math import prod
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs import test_library_jobs_hf2 as hf2
from tests.library_jobs.harness import SCRIPTS, estimate
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    bert_shapes,
    sentences,
    write_checkpoint,
)

MRPC_README = """---
configs:
- config_name: mrpc
  data_files:
  - split: train
    path: mrpc/train.csv
  - split: validation
    path: mrpc/validation.csv
---
"""
"""A local `glue` dataset directory whose `mrpc` configuration is two CSV files."""

BERT_MRPC_SHAPES = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(2, 64)
"""BertForSequenceClassification on MRPC: the tiny BERT, its pooler, a 2-class head."""


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


@pytest.fixture
def mrpc_dir(tmp_path) -> Path:
    """A working directory with `bert-base-cased` (tiny BERT + word-level tokenizer) and
    `glue` (MRPC's columns: sentence1, sentence2, label, idx; 40 train, 12 validation rows)."""
    return write_mrpc_dir(tmp_path)


def write_mrpc_dir(tmp_path: Path) -> Path:
    """`mrpc_dir`'s files under `tmp_path`."""
    write_checkpoint(tmp_path / "bert-base-cased", TINY_BERT_CONFIG)
    (tmp_path / "glue" / "mrpc").mkdir(parents=True)
    (tmp_path / "glue" / "README.md").write_text(MRPC_README)
    for split, n in (("train", 40), ("validation", 12)):
        rows = zip(sentences(n, seed=4), sentences(n, seed=5), [i % 2 for i in range(n)], range(n),
                   strict=True)
        with (tmp_path / "glue" / "mrpc" / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence1", "sentence2", "label", "idx"])
            writer.writerows(rows)
    return tmp_path


# accelerate examples/by_feature/memory.py: find_executable_batch_size ------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_accelerate_memory_find_executable_batch_size(mrpc_dir):
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    est = estimate("r4_hand_metric.py", "r4_accelerate_memory.py", cwd=mrpc_dir)
    # AdamW(capturable=True): two moments and a 0-d device `step` per parameter
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(BERT_MRPC_SHAPES))
    # batch 16 fits: no out-of-memory error, the first batch size is kept; 40 rows in batches
    # of 16 (3 a DataLoader epoch), evaluation after the training loop
    assert "out-of-memory" not in _notes(est)
    assert est.data["phases_ran"][:2] == ["training", "eval"]  # each epoch's evaluation
    assert "evaluation phase" in _notes(est)



# accelerate examples/by_feature/checkpointing.py: save_state each epoch -----------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_accelerate_checkpointing_save_state_each_epoch(mrpc_dir):
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    est = estimate("r4_hand_metric.py", "r4_accelerate_checkpointing.py", "--checkpointing_steps",
                   "epoch", "--output_dir", "ckpts", cwd=mrpc_dir)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(BERT_MRPC_SHAPES))
    # three epochs (the later ones shortened to their last batch), a save_state after each: the
    # weights and optimizer (fake device data) went to peakmem's scratch directory, the
    # scheduler and the RNG states (host data) where the script said
    assert "saved 6 file(s) of fake device data" in _notes(est)
    for epoch in range(3):
        saved = {path.name for path in (mrpc_dir / "ckpts" / f"epoch_{epoch}").iterdir()}
        assert saved == {"scheduler.bin", "random_states_0.pkl"}, saved
    assert est.data["phases_ran"] == ["training", "eval"] * 3

# accelerate examples/by_feature/fsdp_with_peak_mem_tracking.py under `accelerate launch` ------

FSDP_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: false
"""
"""accelerate's FSDP config as `accelerate config` writes it: FSDP1, one unit per BertLayer."""


def fsdp1_rank_state(units: list[list[ex.Shape]], world: int, rank: int,
                     align: int = 4) -> tuple[int, int]:
    """FSDP1 FULL_SHARD with use_orig_params, fp32: (parameter bytes, AdamW moment bytes) of
    one rank. Each unit's parameters are laid end to end in one flat parameter (each starting
    at a multiple of 16 bytes), padded to a multiple of the world size and split evenly: the
    rank keeps its slice (one allocation); its original parameters are views of the slice, and
    AdamW keeps two moments of each one's local part (none where the part is empty)."""
    params = moments = 0
    for shapes in units:
        offset, spans = 0, []
        for shape in shapes:
            offset += -offset % align
            spans.append((offset, offset + prod(shape)))
            offset += prod(shape)
        shard = -(-offset // world)
        low, high = rank * shard, (rank + 1) * shard
        params += ex.rounded(shard * ex.FP32)
        for start, end in spans:
            local = max(0, min(end, high) - max(start, low))
            if local:
                moments += 2 * ex.rounded(local * ex.FP32)
    return params, moments


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "psutil")
def test_accelerate_fsdp_with_peak_mem_tracking_two_processes(mrpc_dir):
    config = mrpc_dir / "fsdp_config.yaml"
    config.write_text(FSDP_CONFIG)
    est = estimate("r4_hand_metric.py", "r4_accelerate_fsdp_peak_mem.py",
                   "--model_name_or_path", "bert-base-cased", cwd=mrpc_dir,
                   launcher=("accelerate", "launch", "--config_file", str(config)))
    # units: the root (embeddings, pooler, classifier) and each BertLayer
    embeddings = bert_shapes(**{**TINY_BERT, "layers": 0})
    layer = bert_shapes(**{**TINY_BERT, "layers": 1})[len(embeddings):]
    root = embeddings + ex.linear(64, 64) + ex.linear(2, 64)
    params, moments = fsdp1_rank_state([root, layer, layer], world=2, rank=0)
    full = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    assert params < full // 2 + 3 * ex.BLOCK
    # AdamW (not fused, not capturable): host `step`s; gradients are the flat shards'
    assert_training(est, params=params, optimizer_state=moments, grads=params)
    assert est.data["world_size"] == 2 and est.data["launcher"] == "accelerate"
    # the script's own readings (TorchTracemalloc) came from the simulated allocator
    assert "Peak Memory consumed during the train (max-begin):" in est.stderr
    assert "DistributedType.FSDP" in est.stderr
    assert est.data["phases_ran"][:2] == ["training", "eval"]


# Lightning examples/pytorch/basics/backbone_image_classifier.py: LightningCLI, fit, test, predict

def write_mnist_raw(raw: Path, train: int, test: int) -> None:
    """torchvision's MNIST files as a download leaves them (raw/*-ubyte, idx format: big-endian
    magic, counts, then one byte per pixel / label)."""
    raw.mkdir(parents=True)
    for prefix, count in (("train", train), ("t10k", test)):
        pixels = bytes(i * 7 % 256 for i in range(28 * 28)) * count
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, count, 28, 28) + pixels)
        labels = bytes(i % 10 for i in range(count))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, count) + labels)


@pytest.fixture
def lightning_examples(tmp_path) -> Path:
    """Lightning's examples tree: the script in examples/pytorch/basics, MNIST where it looks
    (`examples/Datasets`, two levels above the script; `./data`, where Lightning's MNIST helper
    first asks torchvision for it). The split is 55000 / 5000 of exactly 60000 images."""
    basics = tmp_path / "examples" / "pytorch" / "basics"
    basics.mkdir(parents=True)
    write_mnist_raw(tmp_path / "examples" / "Datasets" / "MNIST" / "raw", train=60000, test=100)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "MNIST").symlink_to(tmp_path / "examples" / "Datasets" / "MNIST")
    return basics


@pytest.mark.slow
@needs("lightning", "jsonargparse", "PIL")
def test_lightning_backbone_image_classifier_cli_fit_test_predict_best_checkpoint(lightning_examples):
    script = lightning_examples / "backbone_image_classifier.py"
    shutil.copy(SCRIPTS / "r4_lightning_backbone_image_classifier.py", script)
    est = estimate(str(script), "--trainer.max_epochs=1", "--trainer.limit_train_batches=5",
                   "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
                   "--trainer.limit_predict_batches=2", cwd=lightning_examples.parents[2])
    shapes = ex.linear(128, 28 * 28) + ex.linear(10, 128)
    params = ex.device_bytes(shapes, ex.FP32)
    # torch.optim.Adam (foreach, host `step`s)
    assert_training(est, params=params, optimizer_state=2 * params)
    # fit saved the best checkpoint (diverted: fake weights), and test / predict loaded it back
    assert "saved 1 file(s) of fake device data" in _notes(est)
    assert est.stderr.count("Loaded model weights from the checkpoint at") == 2
    assert "tensor([[" in est.stderr  # `print(predictions[0])`
    assert not list((lightning_examples.parents[2] / "lightning_logs").rglob("*.ckpt"))
    assert est.data["phases_ran"][0] == "training" and "eval" in est.data["phases_ran"]


# Lightning's batch size finder (Tuner.scale_batch_size): it must see CUDA's OOM ----------------

MiB = 2**20
A100_40GB_ALLOCATOR = 41823502336
"""What an A100-40GB leaves the caching allocator under the installed torch's stack profile (the
GPU's memory less the CUDA context and library workspaces; profile data, not measured here)."""


@pytest.mark.slow
@needs("lightning")
def test_lightning_batch_size_finder_stops_at_the_simulated_oom(tmp_path):
    est = estimate("r4_lightning_batch_size_finder.py", flags=("--gpu", "a100-40gb"), cwd=tmp_path)
    assert est.returncode == 0, est.failure()
    found = int(est.stderr.split("batch size finder: ")[1].split()[0])
    # power mode: 2, 4, 8, ... until the first out-of-memory error, then half of that batch
    assert found & (found - 1) == 0 and 2 <= found < 8192  # not its 8192 limit: an OOM stopped it
    assert f"Batch size {2 * found} failed, trying batch size {found}" in est.stderr
    assert f"trained with batch size {found}" in est.stderr
    # each sample keeps two 256 x 64 x 64 fp32 ReLU outputs (4 MiB each) for backward: those of
    # the batch found fit, those of the failed one with their gradients of the same size do not
    per_sample = 2 * 256 * 64 * 64 * 4
    assert found * per_sample <= A100_40GB_ALLOCATOR < 2 * (2 * found) * per_sample
    notes = _notes(est)
    assert "caught 1 CUDA out-of-memory error(s) in a retry loop" in notes
    assert "runs out of memory on this GPU" not in notes  # the run it settled on fits
    assert est.data["peak_reserved_bytes"] <= A100_40GB_ALLOCATOR


# Lightning: ddp on 2 devices, bf16-mixed, accumulation, callbacks, validate / test / predict ----

@pytest.mark.slow
@needs("lightning")
def test_lightning_ddp_bf16_accumulation_callbacks_and_best_checkpoint_stages(tmp_path):
    est = estimate("r4_lightning_ddp_callbacks.py", cwd=tmp_path)
    shapes = ex.linear(256, 64) + ex.linear(256, 256) + ex.linear(4, 256)
    params = ex.device_bytes(shapes, ex.FP32)
    # bf16-mixed autocasts: fp32 weights, gradients and AdamW moments (foreach: host `step`s)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["world_size"] == 2 and est.data["launcher"] == "lightning"
    notes = _notes(est)
    assert "accumulation window 2" in notes
    # the best checkpoint fit saved (fake weights, diverted) is what validate / test / predict load
    assert est.stderr.count("Loaded model weights from the checkpoint at") == 3
    assert "predicted 32 rows" in est.stderr  # 64 validation rows, half on rank 0
    assert not list(tmp_path.rglob("*.ckpt"))
    assert (tmp_path / "runs" / "lightning_logs" / "version_0" / "metrics.csv").is_file()
    assert est.data["phases_ran"][:2] == ["training", "eval"]


# transformers run_clm.py with the Trainer's --auto_find_batch_size ----------------------------

@pytest.fixture
def clm_files(tmp_path) -> dict[str, Path]:
    """test_library_jobs_hf2.py's run_clm files (tiny GPT-2 config, tokenizer, text)."""
    return hf2.clm_files.__wrapped__(tmp_path)


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_clm_auto_find_batch_size_keeps_a_batch_that_fits(clm_files):
    """The Trainer runs its training loop under accelerate's `find_executable_batch_size`
    (capture.oom_retry's loop on the stack): batch 4 of the tiny GPT-2 fits, no error is raised
    in the job, and the run is the plain one."""
    est = hf2.run_clm(clm_files, "--auto_find_batch_size")
    assert_training(est, params=hf2.GPT2_PARAMS, optimizer_state=hf2.FUSED_ADAMW_STATE)
    assert "out-of-memory" not in _notes(est)
    assert est.data["phases_ran"][-1] == "eval"


@pytest.mark.slow
@needs("lightning", "jsonargparse", "PIL")
def test_lightning_autoencoder_cli_with_image_sampler_callback(lightning_examples):
    script = lightning_examples / "autoencoder.py"
    shutil.copy(SCRIPTS / "r4_lightning_autoencoder.py", script)
    root = lightning_examples.parents[2]
    est = estimate(str(script), "--trainer.max_epochs=2", "--trainer.limit_train_batches=4",
                   "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
                   "--trainer.limit_predict_batches=2", cwd=root)
    shapes = ex.linear(64, 28 * 28) + ex.linear(3, 64) + ex.linear(64, 3) + ex.linear(28 * 28, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)  # Adam, host `step`s
    # ImageSampler wrote its grids at each epoch's end (the generated images read back from the
    # device: placeholder values, real PNG files where the job said)
    assert {p.name for p in root.glob("*.png")} == {"grid_ori_0.png", "grid_generated_0.png",
                                                    "grid_generated_1.png"}
    assert est.stderr.count("Loaded model weights from the checkpoint at") == 2
    assert est.data["phases_ran"][:2] == ["training", "eval"]
