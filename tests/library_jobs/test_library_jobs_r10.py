"""The Hugging Face Trainer's feature matrix (round 10): TrainingArguments people pass to an
unmodified Trainer script, each checked against the bytes worked out by hand.

Most cases run transformers' run_clm.py (scripts/hf_ex_run_clm.py, test_library_jobs_hf2.py's
tiny GPT-2 and local text); options whose assertions do not interfere share one estimate (module
fixtures), so the file stays within its time budget. Also: a `Trainer` subclass overriding
`compute_loss` (transformers' docs) in a course-style classification script, and a LoRA
`PeftModel` trained by the Trainer with gradient checkpointing and SGD.

Optimizer states checked by hand: adamw_torch (two moments, host `step`), adagrad (its sum and a
device `step`), sgd (none), torchao's adamw_torch_8bit (uint8 codes, block scales, qmaps).

Covered before (not repeated): --fp16 / --bf16, --torch_compile, --eval_strategy steps,
--optim adafactor / adamw_bnb_8bit / paged_adamw_8bit (QLoRA), --deepspeed,
--auto_find_batch_size (a batch that fits), Seq2SeqTrainer --predict_with_generate with greedy
decoding (test_library_jobs_hf2.py, test_library_jobs_r4.py); here with beam search.

Arguments transformers 5.24 no longer has: `--group_by_length` is
`--train_sampling_strategy group_by_length`; `--half_precision_backend` is gone (autocast
only); `--gradient_checkpointing[_kwargs]` are deprecated aliases of
`--activation_checkpointing[_kwargs]`, whose default is `use_reentrant=False`.
"""

from __future__ import annotations

import csv
import hashlib
import json
from math import prod
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs import test_library_jobs_hf2 as hf2
from tests.library_jobs.harness import estimate_here
from tests.library_jobs.shared_estimate import shared_estimate
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_T5_CONFIG,
    bert_shapes,
    sentences,
    t5_shapes,
    write_config,
    write_tokenizer,
)

GPT2_SHAPES = hf2.GPT2_SHAPES
GPT2_PARAMS = hf2.GPT2_PARAMS
BATCH, BLOCK_SIZE, EMBD, LAYERS = hf2.BATCH, hf2.BLOCK_SIZE, hf2.EMBD, hf2.LAYERS
VOCAB = ex.TINY_GPT2["vocab"]


def _notes(est) -> str:
    return " | ".join(est.data.get("notes", []))


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory):
    """`run_clm.py` once per set of flags in this session (pytest-xdist's workers included);
    each run keeps its files (`out`)."""
    runs: dict[tuple[str, ...], tuple[object, dict[str, Path]]] = {}

    def run(*flags: str):
        if flags not in runs:
            key = "clm-" + hashlib.sha1("\0".join(flags).encode()).hexdigest()[:12]
            est, workdir = shared_estimate(
                tmp_path_factory, key, lambda root: hf2.run_clm(hf2.write_clm_files(root), *flags))
            runs[flags] = (est, {"out": workdir / "out"})  # the run's output_dir
        return runs[flags]

    return run


# adamw_torch + weight decay, accumulation, checkpoints every step, evaluation losses only -----

ADAMW_ACCUMULATE_SAVE_EVAL = (
    "--optim", "adamw_torch", "--weight_decay", "0.01", "--gradient_accumulation_steps", "2",
    "--save_strategy", "steps", "--save_steps", "1", "--torch_empty_cache_steps", "1",
    "--eval_strategy", "steps", "--eval_steps", "2", "--eval_accumulation_steps", "1",
    "--prediction_loss_only",
)


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_adamw_torch_weight_decay_with_accumulation(clm_run):
    est, _ = clm_run(*ADAMW_ACCUMULATE_SAVE_EVAL)
    # torch.optim.AdamW (foreach, not fused): two fp32 moments per parameter, `step` on the host;
    # weight decay keeps no state. With accumulation the gradients stay live between
    # micro-batches: the peak holds parameters, gradients and moments
    assert_training(est, params=GPT2_PARAMS, optimizer_state=2 * GPT2_PARAMS)
    assert est.breakdown.get("gradient") == GPT2_PARAMS, est.breakdown
    assert "accumulation window 2" in _notes(est)


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_saves_checkpoints_every_step_and_evaluates_losses_only(clm_run):
    est, files = clm_run(*ADAMW_ACCUMULATE_SAVE_EVAL)
    assert est.returncode == 0, est.failure()
    # checkpoint-1..3: model.safetensors and optimizer.pt (fake device data, to peakmem's
    # scratch directory), then the final save_model: 7 files; the host files where the job said
    assert "the job saved 7 file(s) of fake device data" in _notes(est)
    for step in (1, 2, 3):
        assert (files["out"] / f"checkpoint-{step}" / "trainer_state.json").is_file()
    # evaluation at step 2 (losses only: no logits kept), then run_clm's evaluate()
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"], est.data["phases_ran"]


# reentrant activation checkpointing, Adagrad, and the Trainer's loss / embedding / sampler options

CHECKPOINTING_ADAGRAD_AND_OPTIONS = (
    "--gradient_checkpointing", "--gradient_checkpointing_kwargs", '{"use_reentrant": true}',
    "--optim", "adagrad", "--max_grad_norm", "0", "--label_smoothing_factor", "0.1",
    "--neftune_noise_alpha", "5", "--train_sampling_strategy", "group_by_length",
    "--include_num_input_tokens_seen", "true",
)
"""One estimate: reentrant checkpointing (transformers 5's default is non-reentrant,
test_library_jobs_hf2.py); Adagrad; no gradient clipping; the LabelSmoother (the Trainer pops
the labels and smooths the shifted logits' log-softmax); NEFTune's noise on the embeddings'
output (a forward hook); the LengthGroupedSampler; the token count gathered each step."""


def checkpointed_activation_bound() -> int:
    """What the forward keeps for backward with every block checkpointed: each block's input
    (batch x block x embd fp32), the embeddings' and last norm's, and the logits; without
    checkpointing the blocks' attention and MLP intermediates (2.0 MiB here) are kept too."""
    hidden = BATCH * BLOCK_SIZE * EMBD * ex.FP32
    logits = BATCH * BLOCK_SIZE * VOCAB * ex.FP32
    return (LAYERS + 2) * hidden + logits


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_reentrant_checkpointing_with_adagrad(clm_run):
    est, _ = clm_run(*CHECKPOINTING_ADAGRAD_AND_OPTIONS)
    # Adagrad: its `sum` (fp32, one per parameter) and `step`, made on the host by the
    # optimizer, then moved to the device with the rest of its state by accelerate's
    # AcceleratedOptimizer (`move_to_device(state_dict)` + `load_state_dict`, which keeps a
    # non-fused `step` where it is given): a 0-d fp32 device tensor per parameter
    assert_training(est, params=GPT2_PARAMS, optimizer_state=GPT2_PARAMS + fused_steps(GPT2_SHAPES))
    assert est.breakdown.get("activation", 0) <= checkpointed_activation_bound(), est.breakdown


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_label_smoothing_neftune_and_token_count_run_through(clm_run):
    est, files = clm_run(*CHECKPOINTING_ADAGRAD_AND_OPTIONS)
    assert est.returncode == 0, est.failure()
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # the Trainer gathered a device count each step and logged it (`.item()` of a fake tensor:
    # fake mode has no values, so the count reads 0; no memory depends on it)
    state = json.loads((files["out"] / "trainer_state.json").read_text())
    assert "num_input_tokens_seen" in state["log_history"][-1], state["log_history"]


# course-style classification with a custom compute_loss, torchao's 8-bit AdamW ----------------

CLASSIFIER_SHAPES = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(3, 64)
"""BertForSequenceClassification, three labels: the pooler and a Linear(64, 3) head."""


def torchao_low_bit_state(shapes: list[ex.Shape], bits: int, block_size: int = 256) -> int:
    """torchao's AdamW8bit / AdamW4bit (`optim="adamw_torch_8bit"` / `"adamw_torch_4bit"`, the
    Trainer's block size 256): each moment of a parameter of 4096 values or more (a multiple of
    the block) is a tensor subclass holding uint8 codes (one value a byte, or two), an fp32 scale
    per block and its own fp32 quantization map (256 or 16 entries); a smaller parameter's are
    fp32. `step` and `lr` are host tensors."""
    total = 0
    for shape in shapes:
        numel = prod(shape)
        if numel >= 4096 and numel % block_size == 0:
            codes = numel if bits == 8 else numel // 2
            qmap = (256 if bits == 8 else 16) * ex.FP32
            total += 2 * (ex.rounded(codes) + ex.rounded(numel // block_size * ex.FP32) + ex.rounded(qmap))
        else:
            total += 2 * ex.rounded(numel * ex.FP32)
    return total


@pytest.fixture(scope="module")
def custom_loss_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("custom-loss")
    model = write_tokenizer(write_config(root / "bert", TINY_BERT_CONFIG))
    files = {}
    for split, n, seed in (("train", 40, 2), ("validation", 12, 3)):
        files[split] = root / f"{split}.csv"
        with files[split].open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([text, i % 3] for i, text in enumerate(sentences(n, seed)))
    return estimate_here(  # in this process: the Trainer's child path is covered elsewhere
        "r10_hf_custom_loss_trainer.py", "--model_name_or_path", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--optim", "adamw_torch_8bit", "--report_to", "none", "--seed", "0",
        "--output_dir", str(root / "out"),
    )


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "torchao")
def test_trainer_subclass_compute_loss_with_torchao_adamw_8bit(custom_loss_run):
    est = custom_loss_run
    params = ex.device_bytes(CLASSIFIER_SHAPES, ex.FP32)
    # torchao keeps each param group's lr as a tensor, and the LR scheduler its `initial_lr`
    # clone: 2 groups (decay / no decay) x 2 one-element tensors, one 512-byte block each, held
    # in the param groups: optimizer state since branch u3 (capture/phases.py `_step_post`)
    hyper = 2 * 2 * 512
    assert_training(est, params=params,
                    optimizer_state=torchao_low_bit_state(CLASSIFIER_SHAPES, 8) + hyper)
    # the override ran in training and in the evaluation after it (its class weights: a device
    # tensor made in each call), whose metrics the script printed
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    assert "'eval_accuracy'" in est.stderr
    # torchao compiles its per-parameter update; it ran eagerly, its temporaries dropped
    assert "torchao's low-bit optimizers" in _notes(est)


# peft LoRA with the Trainer's activation checkpointing ----------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "peft")
def test_peft_lora_trainer_gradient_checkpointing_with_sgd(llama_checkpoint, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("\n".join(sentences(60)) + "\n")
    est = hf2.run_peft(llama_checkpoint, train, tmp_path / "out", "lora", "--gradient_checkpointing",
                       "--optim", "sgd")
    # the Trainer enables checkpointing on the PeftModel's base model, which makes the
    # embeddings' output require grad (enable_input_require_grads) so that the adapters in the
    # checkpointed layers get gradients: only the adapters train. `optim="sgd"` is
    # torch.optim.SGD with momentum 0: no optimizer state at all
    adapters = hf2.LORA_ADAPTERS
    assert_training(est, params=hf2.LLAMA_PARAMS + adapters, grads=adapters, optimizer_state=0)
    assert "optimizer_state" not in est.breakdown, est.breakdown
    assert est.breakdown.get("gradient") == adapters, est.breakdown
    # what the checkpointed forward keeps: the layers' inputs (batch 2 x 32 x hidden fp32) and
    # the logits; without checkpointing 0.6 MiB of attention / MLP intermediates
    hidden = 2 * 32 * ex.TINY_LLAMA["hidden"] * ex.FP32
    logits = 2 * 32 * ex.TINY_LLAMA["vocab"] * ex.FP32
    bound = (ex.TINY_LLAMA["layers"] + 2) * hidden + logits
    assert est.breakdown.get("activation", 0) <= bound, est.breakdown


# Seq2SeqTrainer: beam search in the evaluation -------------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_seq2seq_trainer_beam_search_generation_stays_in_fake_mode(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "t5", TINY_T5_CONFIG))
    files = {}
    for split, n, seed in (("train", 32, 4), ("validation", 8, 5)):
        files[split] = tmp_path / f"{split}.json"
        texts, summaries = sentences(n, seed), sentences(n, seed + 10)
        files[split].write_text("\n".join(json.dumps({"text": t, "summary": s[:40]})
                                          for t, s in zip(texts, summaries, strict=True)) + "\n")
    est = estimate_here(
        "hf_ex_run_summarization.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--source_prefix", "summarize: ", "--max_source_length", "32", "--max_target_length", "16",
        "--val_max_target_length", "8", "--num_beams", "4", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_steps", "3", "--do_train", "--do_eval",
        "--predict_with_generate", "--report_to", "none", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    shapes = t5_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # beam search fills its running sequences with `pad_token_id or eos_token_id[0]`, device
    # tensors of the special tokens read as torch.full's fill value: before the fix in
    # capture/recorder.py fake mode stopped there and the estimate fell back to eager mode
    # (the whole job run again for real on the CPU)
    assert est.data["mode"] == "fake", (est.data["mode"], est.data.get("mode_reason"))
