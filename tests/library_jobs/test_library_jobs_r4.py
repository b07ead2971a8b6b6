"""Round 4: accelerate's and Lightning's own examples as people run them (scripts/r4_*.py),
unmodified, through the real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`).

Scripts that name a hub model or dataset ("bert-base-cased", `load_dataset("glue", "mrpc")`)
run in a directory holding a tiny local copy under that name (transformers and datasets read a
local directory of the name first). Parameter and optimizer bytes are worked out by hand from
the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import csv
from math import prod
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
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
