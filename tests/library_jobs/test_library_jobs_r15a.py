"""Round 15a: huggingface/accelerate's by_feature examples (scripts/r15a_*.py), re-created from
their own source and run unmodified through the real CLI (`python -m peakmem estimate --json
--gpu h100-80gb -- python SCRIPT ARGS`), in a directory holding a tiny `bert-base-cased` and a
local `glue` dataset whose `mrpc` configuration is two CSV files (test_library_jobs_r4.py's
`mrpc_dir`); `evaluate.load("glue", "mrpc")` is answered by r4_hand_metric.py. Parameter and
optimizer bytes are worked out by hand from the tiny BERT's config (expected.py):

- examples/by_feature/local_sgd.py (scripts/r15a_accelerate_local_sgd.py): `LocalSGD` around
  each epoch, `Accelerator(gradient_accumulation_steps=2)` with `accelerator.accumulate(model)`.
- examples/by_feature/early_stopping.py (scripts/r15a_accelerate_early_stopping.py): a callback
  fed `loss.item()` each step, `accelerator.set_trigger()` / `check_trigger()`.
- examples/by_feature/profiler.py (scripts/r15a_accelerate_profiler.py): each epoch's loop in
  `accelerator.profile()` (ProfileKwargs: profile_memory, record_shapes, a trace directory), the
  profile's table printed after it.
- examples/by_feature/gradient_accumulation_for_autoregressive_models.py (scripts/
  r15a_accelerate_grad_accum_autoregressive.py): a causal LM, `iter(train_dataloader)` read by
  `next()` a whole update step's batches at a time, `num_items_in_batch` gathered and read by
  `.item()`, `clip_grad_norm_`.
- examples/by_feature/cross_validation.py (scripts/r15a_accelerate_cross_validation.py): three
  StratifiedKFold folds, each a new model and AdamW, `accelerator.free_memory()` after each. The
  capture kept every optimizer that had stepped (capture/phases.py), so the last fold's peak held
  all three folds' weights and moments (tests/capture/test_stepped_optimizer_is_freed.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate
from tests.library_jobs.test_library_jobs import assert_training, needs
from tests.library_jobs.test_library_jobs_hf import TINY_GPT2_CONFIG, sentences, write_checkpoint
from tests.library_jobs.test_library_jobs_r4 import BERT_MRPC_SHAPES, write_mrpc_dir

pytestmark = [pytest.mark.slow, needs("transformers", "accelerate", "datasets")]

PARAMS = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
"""The tiny BertForSequenceClassification's fp32 weights on the device."""


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data["notes"])


def _run(workdir: Path, script: str, *args: str) -> JobEstimate:
    return estimate("r4_hand_metric.py", script, *args, cwd=workdir, flags=("--gpu", "h100-80gb"),
                    timeout=300)


def test_local_sgd_with_gradient_accumulation(tmp_path):
    est = _run(write_mrpc_dir(tmp_path), "r15a_accelerate_local_sgd.py",
               "--gradient_accumulation_steps", "2", "--local_sgd_steps", "2")
    # plain AdamW (not capturable): two moments per parameter, its `step` counters on the host
    assert_training(est, params=PARAMS, optimizer_state=2 * PARAMS)
    # accumulation: the second micro-batch's forward and backward run with the first one's
    # gradients held, so the peak holds every parameter's gradient
    assert est.breakdown["gradient"] == PARAMS
    # 40 rows in batches of 16: three epochs of training, each with its evaluation
    assert est.data["phases_ran"] == ["training", "eval"] * 3
    assert [line for line in est.stderr.splitlines() if line.startswith("epoch ")] == [
        f"epoch {epoch}: {{'accuracy': 0.0}}" for epoch in range(3)]
    assert "training loop ended early" in _notes(est)


def test_local_sgd_without_accumulation_frees_gradients_each_step(tmp_path):
    est = _run(write_mrpc_dir(tmp_path), "r15a_accelerate_local_sgd.py")
    assert_training(est, params=PARAMS, optimizer_state=2 * PARAMS)
    # `optimizer.zero_grad()` (set_to_none) after every step: the peak, in a backward, holds the
    # gradients made so far only
    assert 0 < est.breakdown["gradient"] < PARAMS


def test_early_stopping_trigger_read_each_step(tmp_path):
    est = _run(write_mrpc_dir(tmp_path), "r15a_accelerate_early_stopping.py")
    assert_training(est, params=PARAMS, optimizer_state=2 * PARAMS)
    # `loss.item()` reads zero on fake tensors: the callback never fires (a zero loss is never
    # worse than the lowest), `check_trigger()` all-reduces its flag and every epoch runs
    assert est.data["phases_ran"] == ["training", "eval"] * 3
    assert "host read(s) of device values" in "\n".join(est.data["assumptions"])
    assert est.stderr.count("epoch 2:") == 1


def test_cross_validation_frees_each_folds_model_and_optimizer(tmp_path):
    est = _run(write_mrpc_dir(tmp_path), "r15a_accelerate_cross_validation.py")
    # one fold's model and AdamW moments at the peak: each earlier fold's were freed (the
    # capture held them before: three models' weights and moments)
    assert_training(est, params=PARAMS, optimizer_state=2 * PARAMS)
    # three folds of three epochs, each epoch evaluated; the test-set predictions of all folds
    # averaged and scored once at the end
    assert est.data["phases_ran"].count("training") == 9
    assert est.stderr.count("epoch 2:") == 3
    assert "Average test metrics from all folds:" in est.stderr


def test_profiler_each_epoch_in_accelerator_profile(tmp_path):
    est = _run(write_mrpc_dir(tmp_path), "r15a_accelerate_profiler.py", "--profile_memory",
               "--record_shapes", "--output_trace_dir", "traces")
    assert_training(est, params=PARAMS, optimizer_state=2 * PARAMS)
    # three profiled epochs: a key_averages table printed after each, the chrome trace written
    # where the script said (one file a process, rewritten each epoch)
    assert est.stderr.count("Self CPU %") == 3
    assert est.data["phases_ran"] == ["training", "eval"] * 3
    assert [path.name for path in (tmp_path / "traces").iterdir()] == ["profile_0.json"]


WIKITEXT_README = """---
configs:
- config_name: wikitext-2-v1
  data_files:
  - split: train
    path: wikitext-2-v1/train.jsonl
  - split: validation
    path: wikitext-2-v1/validation.jsonl
---
"""
"""A local `Salesforce/wikitext` dataset directory whose `wikitext-2-v1` configuration is two
JSON-lines files of one `text` column."""


def write_wikitext_dir(workdir: Path) -> Path:
    """`HuggingFaceTB/SmolLM-360M` (the tiny GPT-2 and the word-level tokenizer) and
    `Salesforce/wikitext` (wikitext-2-v1: 500 training rows, every third one empty as in
    wikitext, and 8 validation rows) under `workdir`."""
    import json

    write_checkpoint(workdir / "HuggingFaceTB" / "SmolLM-360M", TINY_GPT2_CONFIG)
    root = workdir / "Salesforce" / "wikitext"
    (root / "wikitext-2-v1").mkdir(parents=True)
    (root / "README.md").write_text(WIKITEXT_README)
    for split, n in (("train", 500), ("validation", 8)):
        texts = ["" if i % 3 == 0 else text for i, text in enumerate(sentences(n, seed=7))]
        (root / "wikitext-2-v1" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": text}) + "\n" for text in texts))
    return workdir


def test_grad_accumulation_autoregressive_preloaded_batches(tmp_path):
    est = _run(write_wikitext_dir(tmp_path), "r15a_accelerate_grad_accum_autoregressive.py",
               "--gradient_accumulation_steps", "4")
    params = ex.device_bytes(ex.gpt2_shapes(**ex.TINY_GPT2), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    # four micro-batches' backwards into the same gradients before each step: the peak holds all
    # of them
    assert est.breakdown["gradient"] == params
    # 500 rows, a third empty and filtered out: 333 in batches of 2 (167 a DataLoader epoch);
    # the capture shortened each epoch to 4 batches, one update step's worth, and every epoch's
    # evaluation ran after it
    assert "DataLoader epoch of 167 batches" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval"] * 3
    for epoch in range(3):
        assert f"epoch {epoch} - update step 0::" in est.stderr
        assert f"epoch {epoch}:: eval perplexity" in est.stderr
