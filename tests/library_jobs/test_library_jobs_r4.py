"""Round 4: accelerate's and Lightning's own examples as people run them (scripts/r4_*.py),
unmodified, through the real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`).

Scripts that name a hub model or dataset ("bert-base-cased", `load_dataset("glue", "mrpc")`)
run in a directory holding a tiny local copy under that name (transformers and datasets read a
local directory of the name first). Parameter and optimizer bytes are worked out by hand from
the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import csv
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
