"""Hugging Face's official example scripts (transformers examples/pytorch), run unmodified.

Each scripts/hf_ex_*.py re-creates one of transformers' example scripts (argparse, logging,
`set_seed`, `datasets.map` tokenization, `group_texts`, collators, `get_scheduler`, accelerate
loops with `accelerator.accumulate`, checkpointing, evaluation). They run offline on what the
tests write to tmp_path: a tiny model config (config.json), a word-level tokenizer
(tokenizer.json) and local train / validation files, through the real CLI. Parameter and
optimizer bytes are worked out from the configs (expected.py).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here, run_script_here
from tests.library_jobs.test_library_jobs import assert_training, needs

WORDS = [f"w{i}" for i in range(120)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "</s>"]
VOCAB = 256
"""Every model config's vocab_size: the tokenizer's vocabulary (126 entries) fits in it, so no
script resizes its embeddings."""


def write_tokenizer(out: Path, model_max_length: int = 64) -> Path:
    """A word-level fast tokenizer (tokenizer.json + tokenizer_config.json), no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
        "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "mask_token": "[MASK]", "eos_token": "</s>", "bos_token": "[CLS]",
    }))
    return out


def write_config(out: Path, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    return out


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 20))) for _ in range(n)]


TINY_GPT2_CONFIG = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64,
    "n_head": 4, "vocab_size": VOCAB, "n_positions": 64, "bos_token_id": 2, "eos_token_id": 5,
}
"""ex.TINY_GPT2."""


TINY_BERT_CONFIG = {
    "model_type": "bert", "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64,
    "type_vocab_size": 2, "pad_token_id": 0,
}


def bert_shapes(vocab: int, hidden: int, intermediate: int, layers: int, positions: int,
                types: int = 2) -> list[ex.Shape]:
    """BertModel: embeddings (word, position, token type, LayerNorm), per layer q / k / v /
    attention output, its LayerNorm, intermediate and output dense, their LayerNorm."""
    shapes: list[ex.Shape] = [(vocab, hidden), (positions, hidden), (types, hidden), *ex.norm(hidden)]
    for _ in range(layers):
        shapes += 4 * ex.linear(hidden, hidden) + ex.norm(hidden)
        shapes += ex.linear(intermediate, hidden) + ex.linear(hidden, intermediate) + ex.norm(hidden)
    return shapes


TINY_BERT = dict(vocab=VOCAB, hidden=64, intermediate=128, layers=2, positions=64)


_CHECKPOINTS: dict[str, Path] = {}
"""The checkpoint written for each config in this process (a pytest worker): the next test
asking for the same config gets a copy of it instead of another python + transformers run."""


def write_checkpoint(out: Path, config: dict) -> Path:
    """A tiny base model saved with save_pretrained, plus the tokenizer (hf_ex_make_checkpoint.py)."""
    key = json.dumps(config, sort_keys=True)
    shared = _CHECKPOINTS.get(key)
    if shared is not None and (shared / "model.safetensors").is_file():
        shutil.copytree(shared, out, dirs_exist_ok=True)
        return write_tokenizer(out)
    config_file = write_config(out.with_name(out.name + "-config"), config) / "config.json"
    run_script_here("hf_ex_make_checkpoint.py", str(out), str(config_file))
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    # a copy no test changes (r7's trl_files rewrites its config.json), beside the first test's
    _CHECKPOINTS[key] = shutil.copytree(out, out.with_name(out.name + "-shared"))
    return write_tokenizer(out)


@pytest.fixture
def clm_files(tmp_path) -> dict[str, Path]:
    model = write_tokenizer(write_config(tmp_path / "gpt2", TINY_GPT2_CONFIG))
    train = tmp_path / "train.txt"
    train.write_text("\n".join(sentences(200)) + "\n")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(sentences(20, seed=1)) + "\n")
    return {"model": model, "train": train, "valid": valid, "out": tmp_path / "out"}


# run_clm_no_trainer.py ---------------------------------------------------------------------------

@needs("transformers", "accelerate", "datasets")
def test_run_clm_no_trainer_accumulates_and_evaluates(clm_files):
    params = ex.device_bytes(ex.gpt2_shapes(**ex.TINY_GPT2), ex.FP32)
    est = estimate_here(
        "hf_ex_run_clm_no_trainer.py",
        "--config_name", str(clm_files["model"]), "--tokenizer_name", str(clm_files["model"]),
        "--train_file", str(clm_files["train"]), "--validation_file", str(clm_files["valid"]),
        "--block_size", "32", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--seed", "0",
        "--checkpointing_steps", "epoch", "--output_dir", str(clm_files["out"]),
    )
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes


# run_clm.py (Trainer) ----------------------------------------------------------------------------

@needs("transformers", "accelerate", "datasets")
def test_run_clm_trainer_hf_argument_parser(clm_files):
    shapes = ex.gpt2_shapes(**ex.TINY_GPT2)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here(
        "hf_ex_run_clm.py",
        "--config_name", str(clm_files["model"]), "--tokenizer_name", str(clm_files["model"]),
        "--train_file", str(clm_files["train"]), "--validation_file", str(clm_files["valid"]),
        "--block_size", "32", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--max_steps", "3", "--do_train", "--do_eval",
        "--report_to", "none", "--logging_steps", "1", "--seed", "0",
        "--output_dir", str(clm_files["out"]),
    )
    # Trainer's default optimizer: fused AdamW, a 0-d fp32 `step` per parameter. Before the
    # fix in capture/device_map.py, the evaluation after training failed in fake mode
    # (accelerate's pad_across_processes read its sizes tensor back as zeros) and auto mode's
    # eager rerun then resumed from the fake pass's half-written checkpoint-3 and failed.
    assert_training(est, params=params, optimizer_state=(2 * params + ex.BLOCK * len(shapes), 2 * params))
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes


# run_mlm_no_trainer.py ---------------------------------------------------------------------------

@needs("transformers", "accelerate", "datasets")
@pytest.mark.parametrize("line_by_line", [False, True])
def test_run_mlm_no_trainer_masking_collator(tmp_path, line_by_line):
    model = write_tokenizer(write_config(tmp_path / "bert", TINY_BERT_CONFIG))
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("\n".join(sentences(120)) + "\n")
    valid.write_text("\n".join(sentences(16, seed=1)) + "\n")
    # BertForMaskedLM: no pooler; the head's transform (dense + LayerNorm) and its decoder bias;
    # the decoder weight is the word embedding (tied)
    shapes = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.norm(64) + [(VOCAB,)]
    params = ex.device_bytes(shapes, ex.FP32)
    args = ["--config_name", str(model), "--tokenizer_name", str(model), "--train_file", str(train),
            "--validation_file", str(valid), "--max_seq_length", "32",
            "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
            "--num_train_epochs", "1", "--seed", "0", "--output_dir", str(tmp_path / "out")]
    if line_by_line:
        args += ["--line_by_line", "True", "--pad_to_max_length"]
    est = estimate_here("hf_ex_run_mlm_no_trainer.py", *args)
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes


# run_glue_no_trainer.py --------------------------------------------------------------------------

@pytest.fixture
def glue_files(tmp_path) -> dict[str, Path]:
    model = write_checkpoint(tmp_path / "bert", TINY_BERT_CONFIG)
    files = {"model": model, "out": tmp_path / "out"}
    for split, n in (("train", 40), ("validation", 12)):
        path = tmp_path / f"{split}.csv"
        rows = zip(sentences(n, seed=2), sentences(n, seed=3), [i % 3 for i in range(n)], strict=True)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(rows)
        files[split] = path
    return files


def glue_args(files: dict[str, Path]) -> list[str]:
    return ["--model_name_or_path", str(files["model"]), "--train_file", str(files["train"]),
            "--validation_file", str(files["validation"]), "--max_length", "48",
            "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
            "--num_train_epochs", "1", "--seed", "0", "--output_dir", str(files["out"])]


@needs("transformers", "accelerate", "datasets")
@pytest.mark.skipif(importlib.util.find_spec("evaluate") is not None, reason="evaluate is installed")
def test_run_glue_no_trainer_without_evaluate_fails_in_one_line(glue_files):
    est = estimate_here("hf_ex_run_glue_no_trainer.py", *glue_args(glue_files))
    assert est.returncode != 0
    assert est.data["error"]["kind"] == "job_failed", est.data
    message = est.data["error"]["message"]
    assert "\n" not in message and "No module named 'evaluate'" in message, message


@needs("transformers", "accelerate", "datasets")
def test_run_glue_no_trainer_sequence_classification_metric_by_hand(glue_files):
    classes = 3  # the labels the CSV holds: the script reads num_labels from the data
    shapes = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(classes, 64)  # pooler, head
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("hf_ex_run_glue_no_trainer_hand_metric.py", *glue_args(glue_files))
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("evaluation phase" in note for note in notes), notes


# run_image_classification_no_trainer.py ------------------------------------------------------------

TINY_VIT_CONFIG = {
    "model_type": "vit", "image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
}


def vit_classifier_shapes(hidden: int = 64, intermediate: int = 128, layers: int = 2,
                          patches: int = 16, patch: int = 8, classes: int = 2) -> list[ex.Shape]:
    """ViTForImageClassification (no pooler): CLS token, position embeddings (patches + 1),
    the patch projection (a conv), pre-norm encoder layers, the final LayerNorm, the head."""
    shapes: list[ex.Shape] = [(1, 1, hidden), (1, patches + 1, hidden), *ex.conv(hidden, 3, patch)]
    for _ in range(layers):
        shapes += ex.norm(hidden) + 4 * ex.linear(hidden, hidden) + ex.norm(hidden)
        shapes += ex.linear(intermediate, hidden) + ex.linear(hidden, intermediate)
    return shapes + ex.norm(hidden) + ex.linear(classes, hidden)


def write_image_folder(root: Path, per_class: int, seed: int) -> Path:
    from PIL import Image

    rng = random.Random(seed)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = bytes(rng.randrange(256) for _ in range(40 * 40 * 3))
            Image.frombytes("RGB", (40, 40), pixels).save(root / label / f"{i}.png")
    return root


@needs("transformers", "accelerate", "datasets", "PIL", "torchvision")
def test_run_image_classification_no_trainer_vit_image_folder(tmp_path):
    model = write_checkpoint(tmp_path / "vit", TINY_VIT_CONFIG)
    (model / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    }))
    train = write_image_folder(tmp_path / "train", 12, seed=0)
    valid = write_image_folder(tmp_path / "valid", 4, seed=1)
    params = ex.device_bytes(vit_classifier_shapes(), ex.FP32)
    est = estimate_here(
        "hf_ex_run_image_classification_no_trainer.py", "--model_name_or_path", str(model),
        "--train_dir", str(train), "--validation_dir", str(valid), "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    # torchvision's transforms are parameterless nn.Modules run on host images: before the fix
    # in capture/phases.py they started a forward phase and hid the evaluation after training
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_summarization_no_trainer.py -----------------------------------------------------------------

TINY_T5_CONFIG = {
    "model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": VOCAB,
    "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2,
    "num_heads": 4, "relative_attention_num_buckets": 32, "feed_forward_proj": "relu",
    "tie_word_embeddings": True, "pad_token_id": 0, "eos_token_id": 5, "decoder_start_token_id": 0,
}


def t5_shapes(vocab: int = VOCAB, d: int = 64, inner: int = 64, d_ff: int = 128, layers: int = 2,
              heads: int = 4, buckets: int = 32) -> list[ex.Shape]:
    """T5ForConditionalGeneration, tied: the shared embedding (also the lm_head), attention
    q / k / v / o without biases, the relative position bias in each stack's first block,
    weight-only layer norms, relu feed-forward wi / wo."""
    attention = [(inner, d), (inner, d), (inner, d), (d, inner), (d,)]  # + its layer norm
    feed_forward = [(d_ff, d), (d, d_ff), (d,)]
    shapes: list[ex.Shape] = [(vocab, d)]
    for stack_has_cross in (False, True):
        shapes.append((buckets, heads))  # block 0's relative_attention_bias
        for _ in range(layers):
            shapes += attention + (attention if stack_has_cross else []) + feed_forward
        shapes.append((d,))  # final_layer_norm
    return shapes


@pytest.fixture
def summarization_files(tmp_path) -> dict[str, Path]:
    model = write_tokenizer(write_config(tmp_path / "t5", TINY_T5_CONFIG))
    files = {"model": model, "out": tmp_path / "out"}
    for split, n, seed in (("train", 32, 4), ("validation", 8, 5)):
        path = tmp_path / f"{split}.json"
        texts, summaries = sentences(n, seed), sentences(n, seed + 10)
        path.write_text("\n".join(json.dumps({"text": t, "summary": s[:40]})
                                  for t, s in zip(texts, summaries, strict=True)) + "\n")
        files[split] = path
    return files


def summarization_args(files: dict[str, Path]) -> list[str]:
    return ["--config_name", str(files["model"]), "--tokenizer_name", str(files["model"]),
            "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
            "--source_prefix", "summarize: ", "--max_source_length", "32", "--max_target_length", "16",
            "--val_max_target_length", "8", "--num_beams", "1", "--per_device_train_batch_size", "4",
            "--per_device_eval_batch_size", "4", "--gradient_accumulation_steps", "2",
            "--num_train_epochs", "1", "--seed", "0", "--output_dir", str(files["out"])]


@needs("transformers", "accelerate", "datasets")
@pytest.mark.skipif(importlib.util.find_spec("evaluate") is not None, reason="evaluate is installed")
def test_run_summarization_no_trainer_without_evaluate_fails_in_one_line(summarization_files):
    est = estimate_here("hf_ex_run_summarization_no_trainer.py",
                        *summarization_args(summarization_files))
    assert est.returncode != 0
    assert est.data["error"]["kind"] == "job_failed", est.data
    message = est.data["error"]["message"]
    assert "\n" not in message and "No module named 'evaluate'" in message, message


@needs("transformers", "accelerate", "datasets")
@pytest.mark.skipif(importlib.util.find_spec("nltk") is not None, reason="nltk is installed")
def test_run_summarization_no_trainer_without_nltk_fails_in_one_line(summarization_files, monkeypatch):
    monkeypatch.setenv("HF_EX_SHIMS", "evaluate")  # evaluate stood in for: the import of nltk fails
    est = estimate("hf_ex_run_summarization_no_trainer_shims.py", *summarization_args(summarization_files))
    assert est.returncode != 0
    message = est.data["error"]["message"]
    assert "\n" not in message and "No module named 'nltk'" in message, message


@needs("transformers", "accelerate", "datasets")
def test_run_summarization_no_trainer_t5_generates_in_evaluation(summarization_files):
    params = ex.device_bytes(t5_shapes(), ex.FP32)
    # the evaluation generates (max length 8): before capture/hf_generation.py the decoding loop
    # never ended in fake mode (its "all finished" flag is a device value) and the job timed out
    est = estimate("hf_ex_run_summarization_no_trainer_shims.py", *summarization_args(summarization_files))
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
