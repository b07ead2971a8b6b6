"""Round 19a: Hugging Face / Lightning ecosystem training scripts not covered before, re-created
in their upstream structure (scripts/r19a_*.py; each docstring names the upstream file and
version) and run unmodified on tiny local models and data (no network). Parameter, gradient and
optimizer bytes are worked out by hand from the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import (
    SCRIPTS,
    estimate,
    estimate_here,
    write_llama_checkpoint,
    write_mnist,
)
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_GPT2_CONFIG,
    TINY_T5_CONFIG,
    VOCAB,
    bert_shapes,
    sentences,
    t5_shapes,
    write_checkpoint,
    write_tokenizer,
)
from tests.library_jobs.test_library_jobs_r4 import BERT_MRPC_SHAPES, write_mrpc_dir

pytestmark = pytest.mark.slow

GPT2_SHAPES = ex.gpt2_shapes(**ex.TINY_GPT2)
GPT2_PARAMS = ex.device_bytes(GPT2_SHAPES, ex.FP32)
FUSED_ADAMW = 2 * GPT2_PARAMS + fused_steps(GPT2_SHAPES)
"""The Trainer's default optimizer (adamw_torch_fused): two moments and a 0-d `step` each."""
BERT_SHAPES = bert_shapes(**TINY_BERT)


@pytest.fixture
def own_datasets_cache(tmp_path, monkeypatch) -> Path:
    """A datasets cache of the test's own. The scripts load local folders by Hub-style names
    ("sentence-transformers/stsb" in the working directory): datasets caches them under that
    name with a fingerprint of the relative file patterns, not of their contents, so a shared
    cache would hand one test another's rows (other counts, other splits). For this process
    (`estimate_here`) and the job's children (`estimate` passes the environment on)."""
    import datasets

    cache = tmp_path / "datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    return cache


def _notes(est) -> str:
    return "\n".join(est.data.get("notes", []))


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# TRL: trl/scripts/kto.py, trl/scripts/rloo.py ------------------------------------------------------

@pytest.fixture(scope="module")
def trl_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny GPT-2 saved as GPT2LMHeadModel with its word-level tokenizer; an unpaired
    preference set (prompt, completion, label: KTO's format) and a prompt-only set (RLOO's)."""
    root = tmp_path_factory.mktemp("trl19")
    model = write_checkpoint(root / "gpt2", TINY_GPT2_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    rows = zip(sentences(40, 1), sentences(40, 2), strict=True)
    _jsonl(root / "kto" / "train.jsonl",
           [{"prompt": p[:30], "completion": c[:40], "label": i % 3 != 0} for i, (p, c) in enumerate(rows)])
    _jsonl(root / "prompts" / "train.jsonl", [{"prompt": s[:30]} for s in sentences(8, 5)])
    _jsonl(root / "sft" / "train.jsonl", [{"text": s} for s in sentences(40)])
    return {"root": root, "model": model, "kto": root / "kto", "prompts": root / "prompts",
            "sft": root / "sft"}


@needs("trl", "peft", "datasets")
def test_trl_kto_policy_and_reference_copy(trl_files):
    out = trl_files["root"] / "out" / "kto"
    est = estimate_here("r19a_trl_kto.py", "--model_name_or_path", str(trl_files["model"]),
                        "--dataset_name", str(trl_files["kto"]), "--max_steps", "3",
                        "--per_device_train_batch_size", "4", "--max_length", "48",
                        "--report_to", "none", "--output_dir", str(out), cwd=trl_files["root"])
    # KTOTrainer loads the path twice: the policy and a frozen reference (no adapter), both
    # fp32 on the device; gradients and AdamW's moments for the policy only
    assert_training(est, params=2 * GPT2_PARAMS, grads=GPT2_PARAMS, optimizer_state=FUSED_ADAMW)
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # 40 rows in batches of 4 (each batch's KL pairs are its own completions shifted by one)
    assert "DataLoader epoch of 10 batches" in _notes(est)
    assert "Training completed" in est.stderr and "checkpoint-3/optimizer.pt" in _notes(est)


@needs("trl", "peft", "datasets")
def test_trl_sft_use_peft_gradient_checkpointing_on_and_off(trl_files):
    """`trl/scripts/sft.py --use_peft` (round 7's r7_trl_sft.py): TRL 1.x configs default to
    `gradient_checkpointing=True` (non-reentrant), so the README's LoRA command runs with it;
    `--gradient_checkpointing False` keeps every block's activations for the backward."""
    runs = {}
    for checkpointing in ("True", "False"):
        out = trl_files["root"] / "out" / f"sft-lora-{checkpointing}"
        runs[checkpointing] = estimate_here(
            "r7_trl_sft.py", "--model_name_or_path", str(trl_files["model"]), "--dataset_name",
            str(trl_files["sft"]), "--max_steps", "3", "--per_device_train_batch_size", "8",
            "--max_length", "64", "--use_peft", "--lora_r", "8", "--lora_alpha", "16",
            "--gradient_checkpointing", checkpointing, "--report_to", "none",
            "--output_dir", str(out), cwd=trl_files["root"])
    # peft's default target for GPT-2 is c_attn (Conv1D 64 -> 192): A is r x 64, B is 192 x r
    embd, layers = ex.TINY_GPT2["embd"], ex.TINY_GPT2["layers"]
    lora = layers * [(8, embd), (3 * embd, 8)]
    lora_bytes = ex.device_bytes(lora, ex.FP32)
    for est in runs.values():
        assert_training(est, params=GPT2_PARAMS + lora_bytes, grads=lora_bytes,
                        optimizer_state=2 * lora_bytes + fused_steps(lora))
        assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # the activations live at the peak: each block's inputs only with checkpointing (its
    # forward is recomputed in the backward), every block's saved tensors without (8 x 64
    # tokens: 1.8 MB against 0.2 MB here)
    kept, dropped = runs["False"].breakdown["activation"], runs["True"].breakdown["activation"]
    assert 4 * dropped < kept, (dropped, kept)
    assert runs["True"].data["peak_allocated_bytes"] <= runs["False"].data["peak_allocated_bytes"]


@pytest.fixture(scope="module")
def reward_model(trl_files) -> Path:
    """The same tiny GPT-2 saved as a one-label sequence classifier (a reward model)."""
    path = trl_files["root"] / "reward-model"
    path.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((trl_files["model"] / name).read_bytes())
    config = json.loads((trl_files["model"] / "config.json").read_text())
    config.update(architectures=["GPT2ForSequenceClassification"], num_labels=1, pad_token_id=0)
    (path / "config.json").write_text(json.dumps(config))
    return path


@needs("trl", "peft", "datasets")
def test_trl_rloo_policy_reference_and_reward_model(trl_files, reward_model):
    out = trl_files["root"] / "out" / "rloo"
    est = estimate_here("r19a_trl_rloo.py", "--model_name_or_path", str(trl_files["model"]),
                        "--dataset_name", str(trl_files["prompts"]), "--reward_model_name_or_path",
                        str(reward_model), "--reward_funcs", "get_soft_overlong_punishment",
                        "--max_steps", "2", "--per_device_train_batch_size", "4",
                        "--num_generations", "2", "--max_completion_length", "4",
                        "--report_to", "none", "--output_dir", str(out), cwd=trl_files["root"])
    reward_params = ex.device_bytes([*GPT2_SHAPES, (1, ex.TINY_GPT2["embd"])], ex.FP32)
    # beta defaults to 0.05: a reference copy of the policy next to it, and the reward model;
    # gradients and AdamW's moments for the policy only
    assert_training(est, params=2 * GPT2_PARAMS + reward_params, grads=GPT2_PARAMS,
                    optimizer_state=FUSED_ADAMW)
    # 8 prompts, 4 a batch: 2 prompts x num_generations 2 completions of 4 sampled tokens each
    assert est.data["steps"] == 2 and est.data["mode"] == "fake", est.data["mode_reason"]
    assert "'completions/mean_length': '4'" in est.stderr and "Training completed" in est.stderr


# sentence-transformers: examples/cross_encoder/training/sts/training_stsbenchmark.py (v4+) --------

@needs("sentence_transformers", "datasets")
def test_cross_encoder_trainer_stsb_bce_with_correlation_evaluator(tmp_path, own_datasets_cache):
    import random

    # the names the script loads, as folders in its working directory
    write_checkpoint(tmp_path / "distilroberta-base", TINY_BERT_CONFIG)
    rng = random.Random(0)
    for split, count, seed in (("train", 96, 21), ("validation", 16, 22), ("test", 16, 23)):
        _jsonl(tmp_path / "sentence-transformers" / "stsb" / f"{split}.jsonl",
               [{"sentence1": a[:40], "sentence2": b[:40], "score": round(rng.random(), 2)}
                for a, b in zip(sentences(count, seed), sentences(count, seed + 10), strict=True)])
    est = estimate_here("r19a_st_cross_encoder_stsb.py", cwd=tmp_path)
    # AutoModelForSequenceClassification(num_labels=1): BertModel with its pooler (the
    # classifier reads the pooled [CLS]) and a 1 x 64 head with its bias; all train
    shapes = BERT_SHAPES + ex.linear(TINY_BERT["hidden"], TINY_BERT["hidden"]) + ex.linear(1, TINY_BERT["hidden"])
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    # 96 pairs in batches of 64 (2 a epoch) x 4 epochs: shortened after 4 steps, then each later
    # epoch's last batch; the test split's evaluator after training
    assert est.data["steps"] == 6 and est.data["phases_ran"] == ["training", "eval"]
    assert "training loop ended early after 4 optimizer steps" in _notes(est)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the final save_pretrained, and push_to_hub failing offline (caught by the script)
    assert "distilroberta-base" in _notes(est) and "final/model.safetensors" in _notes(est)
    assert "could not reach huggingface.co" in _notes(est)


# peft: examples/dora_finetuning/dora_finetuning.py ------------------------------------------------

@needs("peft", "datasets")
def test_peft_dora_finetuning_trains_adapters_and_magnitudes(tmp_path):
    model = write_tokenizer(write_llama_checkpoint(tmp_path / "llama"))
    for split, count, seed in (("train", 20, 31), ("test", 4, 32)):
        _jsonl(tmp_path / "guanaco" / f"{split}.jsonl", [{"text": s} for s in sentences(count, seed)])
    rank = 4
    est = estimate_here("r19a_peft_dora_finetuning.py", "--base_model", str(model), "--data_path",
                        str(tmp_path / "guanaco"), "--output_dir", str(tmp_path / "out"), "--use_dora",
                        "--lora_r", str(rank), "--cutoff_len", "32", cwd=tmp_path)
    # LoraConfig(use_dora=True) on the seven projections of each layer: A (r x in), B (out x r)
    # and DoRA's magnitude vector (out,), all fp32 (fp16=True is autocast over fp32 weights)
    hidden, inter = ex.TINY_LLAMA["hidden"], ex.TINY_LLAMA["intermediate"]
    kv_out = ex.TINY_LLAMA["kv_heads"] * hidden // ex.TINY_LLAMA["heads"]
    projections = [(hidden, hidden), (hidden, kv_out), (hidden, kv_out), (hidden, hidden),
                   (hidden, inter), (hidden, inter), (inter, hidden)]  # (in, out): q k v o gate up down
    dora = ex.TINY_LLAMA["layers"] * [s for d_in, d_out in projections
                                      for s in ((rank, d_in), (d_out, rank), (d_out,))]
    adapters = ex.device_bytes(dora, ex.FP32)
    base = ex.device_bytes(ex.llama_shapes(**ex.TINY_LLAMA), ex.FP32)
    # the Trainer's adamw_torch_fused over the 42 adapter tensors: moments and a device `step`
    assert_training(est, params=base + adapters, grads=adapters,
                    optimizer_state=2 * adapters + fused_steps(dora))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 20 batches of one, gradient_accumulation_steps=16: a step after batch 16, then one at the
    # epoch's end for the last 4
    assert est.data["steps"] == 2 and "traced 2 optimizer steps over 20 batches" in _notes(est)
    assert "Using device: cuda:0" in est.stderr
    assert "out/adapter_model.safetensors" in _notes(est)


# accelerate: examples/by_feature/automatic_gradient_accumulation.py --------------------------------

@needs("transformers", "accelerate", "datasets")
def test_accelerate_automatic_gradient_accumulation_default_observed_batch(tmp_path, own_datasets_cache):
    est = estimate("r4_hand_metric.py", "r19a_accelerate_automatic_gradient_accumulation.py",
                   cwd=write_mrpc_dir(tmp_path), timeout=300)
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    # torch.optim.AdamW (not fused): two moments per parameter, `step` counters on the host
    assert_training(est, params=params, optimizer_state=2 * params)
    # the default observed batch, 256, fits at once on the H100: no out-of-memory error to
    # retry on, one accumulation step, so every batch steps; the 40 rows are one batch an epoch
    # and the gradients are freed by each step's zero_grad before the next forward
    assert "out-of-memory" not in _notes(est)
    assert est.data["steps"] == 3 and 0 < est.breakdown["gradient"] < params
    assert est.data["phases_ran"] == ["training", "eval"] * 3
    assert [line for line in est.stderr.splitlines() if line.startswith("epoch ")] == [
        f"epoch {epoch}: {{'accuracy': 0.0}}" for epoch in range(3)]
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# Lightning: examples/fabric/image_classifier/train_fabric.py under `fabric run` --------------------

@needs("lightning", "torchvision", "torchmetrics")
def test_fabric_image_classifier_under_fabric_run_two_devices(tmp_path):
    """As its README runs it: `fabric run --accelerator cuda --devices 2 --precision bf16-mixed
    train_fabric.py`. The script sits where upstream has it (MNIST is read from `Datasets` three
    levels above it); `fabric run` is torchrun with Lightning's LT_* variables, which `Fabric()`
    reads: two DDP ranks in bf16-mixed."""
    script = tmp_path / "examples" / "fabric" / "image_classifier" / "train_fabric.py"
    script.parent.mkdir(parents=True)
    shutil.copy(SCRIPTS / "r19a_fabric_image_classifier.py", script)
    write_mnist(tmp_path / "Datasets" / "MNIST" / "raw", 200, 100)
    est = estimate(str(script), "--epochs", "2", cwd=tmp_path, timeout=300,
                   launcher=("fabric", "run", "--accelerator", "cuda", "--devices", "2",
                             "--precision", "bf16-mixed"))
    # the pytorch/examples MNIST CNN in fp32 (bf16-mixed is autocast); Adadelta keeps
    # square_avg and acc_delta per parameter (its `step` on the host)
    shapes = ex.conv(32, 1, 3) + ex.conv(64, 32, 3) + ex.linear(128, 9216) + ex.linear(10, 128)
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=ex.device_bytes(shapes, ex.FP32))  # DDP's gradient buckets
    assert est.data["launcher"] == "fabric" and est.data["world_size"] == 2
    # DDP (Fabric's strategy for 2 CUDA devices): the gradient buckets
    assert est.breakdown.get("communication", 0) > 0, est.breakdown
    # 200 images over two ranks, batches of 64: 2 a rank's epoch; each epoch's test loop
    assert est.data["phases_ran"] == ["training", "eval"] * 2
    assert est.stderr.count("Test set: Average loss") == 2
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# peft: examples/conditional_generation/peft_adalora_seq2seq.py ------------------------------------

TINY_BART_CONFIG = {
    "model_type": "bart", "vocab_size": VOCAB, "d_model": 64, "encoder_layers": 1,
    "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 128,
    "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 5, "decoder_start_token_id": 5,
    "forced_eos_token_id": 5,
}

PHRASEBANK_README = """---
configs:
- config_name: sentences_allagree
  data_files:
  - split: train
    path: sentences_allagree/train.parquet
---
"""


@needs("peft", "datasets")
def test_peft_adalora_seq2seq_hand_loop_with_rank_allocation(tmp_path, own_datasets_cache):
    from datasets import ClassLabel, Dataset, Features, Value

    write_checkpoint(tmp_path / "facebook" / "bart-base", TINY_BART_CONFIG)
    # financial_phrasebank's columns (a ClassLabel `label`), as a local parquet configuration;
    # 1,300 rows so that the script's 8 epochs of batch 8 outlast AdaLoRA's tfinal of 1,000 steps
    # (with fewer, its final phase would start at step 0 with no rank pattern: a TypeError
    # with or without peakmem)
    rows = sentences(1300, 41)
    features = Features({"sentence": Value("string"),
                         "label": ClassLabel(names=["negative", "neutral", "positive"])})
    data = tmp_path / "financial_phrasebank"
    (data / "sentences_allagree").mkdir(parents=True)
    (data / "README.md").write_text(PHRASEBANK_README)
    Dataset.from_dict({"sentence": rows, "label": [i % 3 for i in range(len(rows))]},
                      features=features).to_parquet(data / "sentences_allagree" / "train.parquet")
    # --mode fake: auto mode gets the same estimate, after an eager run that fails the same
    # way first (the job read device values before it failed), ~30 s more here
    est = estimate_here("r19a_peft_adalora_seq2seq.py", cwd=tmp_path, timeout=300,
                        flags=("--mode", "fake"))
    # the script sizes AdaLoRA's schedule from len(train_dataloader): with the shortened
    # length (4 batches: 32 steps, below tfinal) its update_and_allocate entered the final
    # phase at step 0 with no rank pattern (AttributeError); rerun with the loader's own
    # length (147 batches) and stopped after 3 steps (tests/capture/test_unshortened_rerun.py)
    assert est.data["steps"] == 3 and est.data["stopped"], est.failure()
    assert "it was rerun with its epochs as they are" in _notes(est)
    # AdaLoRA's default targets for BART: q / k / v / out_proj of the three attentions and
    # fc1 / fc2 of both layers; each gets A (r x in), B (out x r), E (r x 1), trainable, and
    # a frozen `ranknum` (1,), at init_r = 12
    rank, d, ffn = 12, 64, 128
    targets = 12 * [(d, d)] + 2 * [(d, ffn)] + 2 * [(ffn, d)]  # (in, out)
    trainable = [s for d_in, d_out in targets for s in ((rank, d_in), (d_out, rank), (rank, 1))]
    adapters = ex.device_bytes(trainable, ex.FP32)
    ranknums = ex.device_bytes(len(targets) * [(1,)], ex.FP32)
    # torch.optim.AdamW (foreach): two moments of every adapter tensor, `step`s on the host
    assert_training(est, params=bart_bytes() + adapters + ranknums, grads=adapters,
                    optimizer_state=2 * adapters, extra_lower=3 * adapters)
    # update_and_allocate's importance scores: ipt, exp_avg_ipt and exp_avg_unc, one of each
    # per adapter tensor, kept on the device by the rank allocator (neither parameters nor
    # optimizer state)
    assert est.breakdown["other"] == 3 * adapters, est.breakdown
    assert est.breakdown["buffer"] == ex.device_bytes([(1, VOCAB)], ex.FP32)  # final_logits_bias
    assert est.data["mode"] == "fake" and "rerun unshortened" in est.data["mode_reason"]


def bart_bytes() -> int:
    """The tiny BartForConditionalGeneration's fp32 parameters: the shared embedding (tied to
    both embed_tokens and lm_head), learned positions (max_position_embeddings + 2 rows each),
    the embedding LayerNorms, one encoder layer (self-attention, fc1 / fc2, two LayerNorms)
    and one decoder layer (self- and cross-attention, fc1 / fc2, three LayerNorms)."""
    d, ffn, positions = 64, 128, 128 + 2
    attention = 4 * ex.linear(d, d)
    shapes = [(VOCAB, d), (positions, d), (positions, d), *ex.norm(d), *ex.norm(d)]
    shapes += attention + ex.norm(d) + ex.linear(ffn, d) + ex.linear(d, ffn) + ex.norm(d)
    shapes += 2 * attention + 2 * ex.norm(d) + ex.linear(ffn, d) + ex.linear(d, ffn) + ex.norm(d)
    return ex.device_bytes(shapes, ex.FP32)


# transformers: examples/pytorch/translation/run_translation.py (Seq2SeqTrainer) ------------------

@needs("transformers", "accelerate", "datasets")
def test_run_translation_seq2seq_trainer_train_eval_predict_with_beams(tmp_path):
    model = write_checkpoint(tmp_path / "t5", TINY_T5_CONFIG)
    files = {}
    for split, n, seed in (("train", 32, 51), ("validation", 8, 52), ("test", 8, 53)):
        pairs = zip(sentences(n, seed), sentences(n, seed + 10), strict=True)
        files[split] = _jsonl(tmp_path / f"{split}.json",
                              [{"translation": {"en": en, "ro": ro[:40]}} for en, ro in pairs])
    out = tmp_path / "out"
    est = estimate_here(
        "r19a_hf_ex_run_translation.py", "--model_name_or_path", str(model), "--do_train", "--do_eval",
        "--do_predict", "--source_lang", "en", "--target_lang", "ro", "--source_prefix",
        "translate English to Romanian: ", "--train_file", str(files["train"]), "--validation_file",
        str(files["validation"]), "--test_file", str(files["test"]), "--max_source_length", "32",
        "--max_target_length", "16", "--val_max_target_length", "8", "--num_beams", "2",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--predict_with_generate", "--report_to", "none", "--output_dir", str(out), cwd=tmp_path)
    # T5ForConditionalGeneration (tied), fp32; the Trainer's fused AdamW
    shapes = t5_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # evaluate() and predict() both generate with 2 beams after training (one eval phase);
    # the predictions file is written on the host (fake ids decode to empty lines)
    assert est.data["phases_ran"] == ["training", "eval"]
    assert "the peak was set during training" in _notes(est)
    assert (out / "generated_predictions.txt").is_file()
    assert "out/model.safetensors" in _notes(est)


# accelerate: examples/by_feature/multi_process_metrics.py under two processes ---------------------

@needs("transformers", "accelerate", "datasets")
def test_accelerate_multi_process_metrics_two_processes(tmp_path, own_datasets_cache):
    est = estimate("r4_hand_metric.py", "r19a_accelerate_multi_process_metrics.py",
                   cwd=write_mrpc_dir(tmp_path), timeout=300,
                   launcher=("accelerate", "launch", "--num_processes", "2"))
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    # AdamW(capturable=True): two moments and a 0-d device `step` per parameter
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(BERT_MRPC_SHAPES),
                    extra_upper=params)  # DDP's gradient buckets
    assert est.data["launcher"] == "accelerate" and est.data["world_size"] == 2
    assert est.breakdown.get("communication", 0) > 0, est.breakdown
    # 40 rows over two ranks in batches of 16: 2 a rank's epoch (16 and 4), one step each;
    # every epoch's gathered evaluation (its one batch is the last: cut to the dataset's rows)
    assert est.data["steps"] == 5 and est.data["phases_ran"] == ["training", "eval"] * 3
    assert [line for line in est.stderr.splitlines() if line.startswith("epoch ")] == [
        f"epoch {epoch}: {{'accuracy': 0.0}}" for epoch in range(3)]
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# sentence-transformers: examples/sentence_transformer/training/matryoshka/matryoshka_nli.py --------

ALL_NLI_README = """---
configs:
- config_name: triplet
  data_files:
  - split: train
    path: triplet/train.jsonl
  - split: dev
    path: triplet/dev.jsonl
---
"""


WIDE_BERT_CONFIG = {**TINY_BERT_CONFIG, "hidden_size": 768, "num_hidden_layers": 1,
                    "num_attention_heads": 12, "intermediate_size": 128}


@needs("sentence_transformers", "datasets")
def test_sentence_transformers_matryoshka_nli(tmp_path, own_datasets_cache):
    import random

    # the largest Matryoshka dim is 768, which MatryoshkaLoss checks against the embedding size:
    # a BERT 768 wide with one layer and a small feed-forward
    model = write_checkpoint(tmp_path / "bert768", WIDE_BERT_CONFIG)
    nli = tmp_path / "sentence-transformers" / "all-nli"
    for split, count, seed in (("train", 400, 61), ("dev", 16, 62)):
        rows = zip(sentences(count, seed), sentences(count, seed + 10), sentences(count, seed + 20),
                   strict=True)
        _jsonl(nli / "triplet" / f"{split}.jsonl",
               [{"anchor": a[:40], "positive": p[:40], "negative": n[:40]} for a, p, n in rows])
    (nli / "README.md").write_text(ALL_NLI_README)
    rng = random.Random(0)
    for split, count, seed in (("validation", 16, 63), ("test", 16, 64)):
        _jsonl(tmp_path / "sentence-transformers" / "stsb" / f"{split}.jsonl",
               [{"sentence1": a[:40], "sentence2": b[:40], "score": round(rng.random(), 2)}
                for a, b in zip(sentences(count, seed), sentences(count, seed + 10), strict=True)])
    est = estimate_here("r19a_st_matryoshka_nli.py", str(model), cwd=tmp_path)
    # AutoModel's BertModel with its pooler, which mean pooling never uses (no gradient, no
    # AdamW state); the Trainer's fused AdamW with fp16 autocast over fp32 weights
    bert = bert_shapes(vocab=VOCAB, hidden=768, intermediate=128, layers=1, positions=64)
    used = ex.device_bytes(bert, ex.FP32)
    # the activations of a batch of 3 x 128 texts (at most 16 tokens) dwarf this tiny model:
    # room for 16 fp32 tensors of its hidden states above the generic bound
    hidden_states = 3 * 128 * 16 * 768 * ex.FP32
    assert_training(est, params=used + ex.device_bytes(ex.linear(768, 768), ex.FP32), grads=used,
                    optimizer_state=2 * used + fused_steps(bert), extra_upper=16 * hidden_states)
    assert est.breakdown["activation"] > hidden_states
    # 400 triplets in NO_DUPLICATES batches of 128: 4 steps (the last of 16); MatryoshkaLoss
    # runs the ranking loss once per dim on truncations of the same embeddings
    assert est.data["steps"] == 4 and est.data["phases_ran"] == ["training", "eval"]
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "final/model.safetensors" in _notes(est) and "could not reach huggingface.co" in _notes(est)
