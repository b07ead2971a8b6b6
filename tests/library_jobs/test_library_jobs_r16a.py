"""Round 16a: Hugging Face example scripts not covered before, re-created in their upstream
structure (scripts/r16a_hf_ex_*.py; each docstring names the upstream commit it follows) and
run unmodified on tiny local data and configs written here (no network). Parameter and
optimizer bytes are worked out from the configs (expected.py), not read from peakmem.

- text-classification/run_classification.py (Trainer): two text columns joined, a renamed
  string label column, label maps from every split, `do_predict` written to a file.
- language-modeling/run_fim_no_trainer.py (accelerate): FIM tokens added to the tokenizer and
  `resize_token_embeddings(len(tokenizer))` (it shrinks a larger embedding), PSM / SPM
  transformations by `datasets.map`, accumulation.
- image-pretraining/run_mim.py (Trainer): SimMIM on ViT from `--model_type vit` and
  `--config_overrides`, a numpy mask generator, `bool_masked_pos` batches.
- image-pretraining/run_mim_no_trainer.py (accelerate): the same SimMIM pipeline in an
  accelerate loop, from a saved ViT (`--model_type` from scratch fails on transformers 5 without
  peakmem too: upstream passes `token=` to `from_config`, which the model's __init__ rejects).
- contrastive-image-text/run_clip.py (Trainer): a saved VisionTextDualEncoder (ViT + BERT),
  a `torch.jit.script`ed torchvision transform, images read by `torchvision.io.read_image`
  (failed before: torchvision's image extension cannot load with a CPU-only torch;
  capture/vision_image_ops.py decodes through Pillow, tests/capture/test_vision_image_ops.py).
- multiple-choice/run_swag.py (Trainer): four (context, ending) pairs per example flattened,
  tokenized and regrouped, `DataCollatorForMultipleChoice` padding each batch to its longest.
- token-classification/run_ner.py (Trainer): word lists tokenized with `is_split_into_words`,
  labels aligned by `word_ids()` (`--label_all_tokens`), `DataCollatorForTokenClassification`,
  `predict()` written to predictions.txt.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate_here, run_script_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_GPT2_CONFIG,
    WORDS,
    bert_shapes,
    sentences,
    write_checkpoint,
    write_config,
    write_image_folder,
    write_tokenizer,
)

pytestmark = pytest.mark.slow

TOKENIZER_SIZE = 6 + len(WORDS)
"""test_library_jobs_hf's word-level tokenizer: its special tokens and words (126 entries)."""


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# text-classification/run_classification.py -------------------------------------------------------

TOPICS = ["arts", "politics", "science", "sports"]


@needs("transformers", "accelerate", "datasets")
def test_run_classification_joined_columns_string_labels_and_predict(tmp_path):
    model = write_checkpoint(tmp_path / "bert", TINY_BERT_CONFIG)
    # "science" appears only in the validation split: the script adds it to the label list
    for split, n, seed, topics in (("train", 24, 2, TOPICS[:2] + TOPICS[3:]), ("validation", 8, 3, TOPICS),
                                   ("test", 6, 4, TOPICS)):
        rng = random.Random(seed)
        rows = [{"title": s[:30], "body": s, "topic": topics[i % len(topics)] if i < len(topics) else rng.choice(topics)}
                for i, s in enumerate(sentences(n, seed))]
        (tmp_path / f"{split}.json").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    est = estimate_here(
        "r16a_hf_ex_run_classification.py", "--model_name_or_path", str(model),
        "--train_file", "train.json", "--validation_file", "validation.json", "--test_file", "test.json",
        "--text_column_names", "title,body", "--label_column_name", "topic", "--max_seq_length", "32",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--do_train", "--do_eval", "--do_predict", "--report_to", "none", "--seed", "0",
        "--output_dir", "out", cwd=tmp_path)
    # BertForSequenceClassification: the pooler and a Linear head over the 4 labels
    shapes = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(len(TOPICS), 64)
    params = ex.device_bytes(shapes, ex.FP32)
    # the Trainer's fused AdamW: two moments and a 0-d fp32 device `step` per parameter
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3
    # evaluate() and predict() run after training: forward passes without gradients
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # the padded batch: input_ids, token_type_ids, attention_mask (4, 32) int64 and the labels
    assert est.breakdown["input"] >= 3 * ex.rounded(4 * 32 * 8), est.breakdown
    predictions = (tmp_path / "out" / "predict_results.txt").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == 1 + 6
    assert {line.split("\t")[1] for line in predictions[1:]} <= set(TOPICS)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["id2label"] == {
        str(i): topic for i, topic in enumerate(TOPICS)}


# language-modeling/run_fim_no_trainer.py -----------------------------------------------------------

@needs("transformers", "accelerate", "datasets")
def test_run_fim_no_trainer_resizes_to_the_tokenizer_with_fim_tokens(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "gpt2", TINY_GPT2_CONFIG))
    (tmp_path / "train.txt").write_text("\n".join(sentences(200)) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(sentences(20, seed=1)) + "\n")
    est = estimate_here(
        "r16a_hf_ex_run_fim_no_trainer.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", "train.txt", "--validation_file", "valid.txt", "--block_size", "32",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--num_train_epochs", "1", "--seed", "0", "--output_dir", "out", cwd=tmp_path)
    # the config's 256 rows become the tokenizer's size with the four FIM tokens: 130 (the
    # tied LM head with them)
    vocab = TOKENIZER_SIZE + 4
    params = ex.device_bytes(ex.gpt2_shapes(**{**ex.TINY_GPT2, "vocab": vocab}), ex.FP32)
    assert params < ex.device_bytes(ex.gpt2_shapes(**ex.TINY_GPT2), ex.FP32)
    # torch.optim.AdamW (not fused: host `step` counters)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "accumulation window 2" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["vocab_size"] == vocab
    assert "perplexity" in json.loads((tmp_path / "out" / "all_results.json").read_text())


# image-pretraining/run_mim.py ---------------------------------------------------------------------------

MIM_OVERRIDES = "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=128"


def vit_simmim_shapes(hidden: int = 64, intermediate: int = 128, layers: int = 2, image: int = 32,
                      patch: int = 4, stride: int = 4) -> list[ex.Shape]:
    """ViTForMaskedImageModeling: ViTModel without a pooler, with a mask token (CLS token, mask
    token, position embeddings (patches + 1), the patch conv, pre-norm layers, the final
    LayerNorm), then the SimMIM decoder: a 1x1 conv to stride^2 x 3 channels (PixelShuffle has
    no weights)."""
    patches = (image // patch) ** 2
    shapes: list[ex.Shape] = [(1, 1, hidden), (1, 1, hidden), (1, patches + 1, hidden), *ex.conv(hidden, 3, patch)]
    for _ in range(layers):
        shapes += ex.norm(hidden) + 4 * ex.linear(hidden, hidden) + ex.norm(hidden)
        shapes += ex.linear(intermediate, hidden) + ex.linear(hidden, intermediate)
    return shapes + ex.norm(hidden) + ex.conv(stride * stride * 3, hidden, 1)


def _write_mim_processor(root: Path) -> None:
    (root / "proc").mkdir()
    (root / "proc" / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))


@needs("transformers", "accelerate", "datasets", "PIL", "torchvision")
def test_run_mim_simmim_vit_from_model_type_and_overrides(tmp_path):
    write_image_folder(tmp_path / "images", 12, seed=0)
    # upstream builds the processor as `IMAGE_PROCESSOR_MAPPING[...][-1]()` when none is named:
    # transformers 5's mapping values are not tuples (KeyError: -1, without peakmem too), so the
    # test names one through the script's own flag
    _write_mim_processor(tmp_path)
    est = estimate_here(
        "r16a_hf_ex_run_mim.py", "--model_type", "vit", "--dataset_name", "imagefolder",
        "--train_dir", "images/**", "--image_processor_name", "proc", "--config_overrides", MIM_OVERRIDES,
        "--image_size", "32", "--patch_size", "4", "--encoder_stride", "4", "--mask_patch_size", "8",
        "--remove_unused_columns", "False", "--label_names", "bool_masked_pos",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--do_train", "--do_eval", "--report_to", "none", "--seed", "0", "--output_dir", "out", cwd=tmp_path)
    shapes = vit_simmim_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # each batch: pixel_values (4, 3, 32, 32) fp32 and bool_masked_pos (4, 64) int64
    assert est.breakdown["input"] >= ex.rounded(4 * 3 * 32 * 32 * 4) + ex.rounded(4 * 64 * 8), est.breakdown
    assert json.loads((tmp_path / "out" / "config.json").read_text())["encoder_stride"] == 4


@needs("transformers", "accelerate", "datasets", "PIL", "torchvision")
def test_run_mim_no_trainer_accelerate_loop_from_a_saved_vit(tmp_path):
    write_image_folder(tmp_path / "images", 12, seed=0)
    _write_mim_processor(tmp_path)
    write_checkpoint(tmp_path / "vit", {
        "model_type": "vit", "image_size": 32, "patch_size": 4, "encoder_stride": 4, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128})
    est = estimate_here(
        "r16a_hf_ex_run_mim_no_trainer.py", "--model_name_or_path", "vit", "--dataset_name", "imagefolder",
        "--train_dir", "images/**", "--image_processor_name", "proc", "--mask_patch_size", "8",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--checkpointing_steps", "epoch",
        "--seed", "0", "--output_dir", "out", cwd=tmp_path)
    # the saved ViTModel's weights plus the newly initialised mask token and SimMIM decoder (the
    # saved pooler is not used); torch.optim.AdamW: host `step` counters
    params = ex.device_bytes(vit_simmim_shapes(), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 2 and "accumulation window 2" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    assert "out/epoch_0/optimizer.bin" in _notes(est)  # accelerator.save_state, diverted
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()


# contrastive-image-text/run_clip.py -------------------------------------------------------------------

CLIP_VIT_CONFIG = {
    "model_type": "vit", "image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128,
}
PROJECTION = 32
"""r16a_make_dual_encoder_checkpoint.py's `projection_dim`."""


def dual_encoder_shapes() -> list[ex.Shape]:
    """VisionTextDualEncoderModel: ViTModel (CLS token, position embeddings, patch conv, the
    layers, final LayerNorm and a pooler, whose output is the image embedding), BertModel with
    its pooler (the text embedding), two bias-free projections and the scalar logit_scale."""
    vit = [(1, 1, 64), (1, 17, 64), *ex.conv(64, 3, 8)]
    for _ in range(2):
        vit += ex.norm(64) + 4 * ex.linear(64, 64) + ex.norm(64) + ex.linear(128, 64) + ex.linear(64, 128)
    vit += ex.norm(64) + ex.linear(64, 64)
    text = bert_shapes(**TINY_BERT) + ex.linear(64, 64)
    return vit + text + ex.linear(PROJECTION, 64, bias=False) + ex.linear(PROJECTION, 64, bias=False) + [()]


def write_clip_files(root: Path) -> None:
    """The dual encoder (with a tokenizer and a preprocessor_config.json) and JSON files of image
    paths and captions; one path in train.json is not an image (the script's filter drops it)."""
    from PIL import Image

    (root / "vit.json").write_text(json.dumps(CLIP_VIT_CONFIG))
    (root / "bert.json").write_text(json.dumps(TINY_BERT_CONFIG))
    run_script_here("r16a_make_dual_encoder_checkpoint.py", str(root / "dual"), str(root / "vit.json"),
                    str(root / "bert.json"))
    write_tokenizer(root / "dual")
    (root / "dual" / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.48, 0.45, 0.40], "image_std": [0.26, 0.26, 0.27]}))
    rng = random.Random(0)
    (root / "images").mkdir()
    (root / "images" / "broken.jpg").write_text("not an image")
    for split, n, seed in (("train", 16, 0), ("validation", 4, 1)):
        rows = []
        for i, caption in enumerate(sentences(n, seed)):
            path = root / "images" / f"{split}{i}.jpg"
            Image.new("RGB", (48, 40), tuple(rng.randrange(256) for _ in range(3))).save(path)
            rows.append({"image_path": str(path), "caption": caption})
        if split == "train":
            rows.append({"image_path": str(root / "images" / "broken.jpg"), "caption": "w1 w2"})
        (root / f"{split}.json").write_text("\n".join(json.dumps(row) for row in rows) + "\n")


@needs("transformers", "accelerate", "datasets", "PIL", "torchvision")
def test_run_clip_dual_encoder_scripted_transform_read_image(tmp_path):
    write_clip_files(tmp_path)
    est = estimate_here(
        "r16a_hf_ex_run_clip.py", "--model_name_or_path", "dual", "--train_file", "train.json",
        "--validation_file", "validation.json", "--image_column", "image_path", "--caption_column", "caption",
        "--max_seq_length", "16", "--remove_unused_columns", "False", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_steps", "3", "--do_train", "--do_eval",
        "--report_to", "none", "--seed", "0", "--output_dir", "out", cwd=tmp_path)
    shapes = dual_encoder_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    assert "decoded the job's read_image" in _notes(est)
    # each batch: pixel_values (4, 3, 32, 32) fp32 from the scripted transform, input_ids and
    # attention_mask (4, 16) int64
    assert est.breakdown["input"] >= ex.rounded(4 * 3 * 32 * 32 * 4) + 2 * ex.rounded(4 * 16 * 8), est.breakdown
    # the broken image was filtered out (decoding it raises, as torchvision's decoder does)
    from peakmem.capture import vision_image_ops

    with pytest.raises(Exception):  # noqa: B017, PT011 - Pillow's UnidentifiedImageError
        vision_image_ops.decode(vision_image_ops.read_file(str(tmp_path / "images" / "broken.jpg")), 3)
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()


# multiple-choice/run_swag.py --------------------------------------------------------------------------

SWAG_COLUMNS = ["sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"]


@needs("transformers", "accelerate", "datasets")
def test_run_swag_trainer_multiple_choice_dynamic_padding(tmp_path):
    model = write_checkpoint(tmp_path / "bert", TINY_BERT_CONFIG)
    for split, n, seed in (("train", 24, 2), ("validation", 8, 3)):
        columns = [sentences(n, seed + k) for k in range(6)]
        with (tmp_path / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(SWAG_COLUMNS)
            writer.writerows([column[i][:50] for column in columns] + [i % 4] for i in range(n))
    est = estimate_here(
        "r16a_hf_ex_run_swag.py", "--model_name_or_path", str(model), "--train_file", "train.csv",
        "--validation_file", "validation.csv", "--max_seq_length", "48", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_steps", "2",
        "--do_train", "--do_eval", "--report_to", "none", "--seed", "0", "--output_dir", "out", cwd=tmp_path)
    # BertForMultipleChoice: the pooler and a one-logit Linear head scoring each choice
    shapes = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(1, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 2 and "accumulation window 2" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # a batch is (4 examples, 4 choices, its longest pair <= 48) of input_ids, token_type_ids and
    # attention_mask, int64, and 4 labels; the Trainer fetches an accumulation window's two
    # batches before the first forward: above two 16-row sequences of 16 tokens, below 2 x 3 of 48
    batch_at_most = 3 * ex.rounded(16 * 48 * 8) + ex.BLOCK
    assert 2 * ex.rounded(16 * 16 * 8) <= est.breakdown["input"] <= 2 * batch_at_most, est.breakdown
    assert "eval_accuracy" in json.loads((tmp_path / "out" / "eval_results.json").read_text())


# token-classification/run_ner.py ------------------------------------------------------------------------

NER_TAGS = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
"""Sorted, as the script orders string tags read from the training file."""


@needs("transformers", "accelerate", "datasets")
def test_run_ner_trainer_word_ids_alignment_and_predict(tmp_path):
    model = write_checkpoint(tmp_path / "bert", TINY_BERT_CONFIG)
    for split, n, seed in (("train", 24, 2), ("validation", 8, 3), ("test", 4, 4)):
        rng = random.Random(seed)
        rows = [{"tokens": s.split(), "ner_tags": [rng.choice(NER_TAGS) for _ in s.split()]} for s in sentences(n, seed)]
        (tmp_path / f"{split}.json").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    est = estimate_here(
        "r16a_hf_ex_run_ner.py", "--model_name_or_path", str(model), "--train_file", "train.json",
        "--validation_file", "validation.json", "--test_file", "test.json", "--max_seq_length", "32",
        "--label_all_tokens", "True", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
        "--max_steps", "3", "--do_train", "--do_eval", "--do_predict", "--report_to", "none", "--seed", "0",
        "--output_dir", "out", cwd=tmp_path)
    # BertForTokenClassification: no pooler, a Linear head over the 5 tags read from the data
    shapes = bert_shapes(**TINY_BERT) + ex.linear(len(NER_TAGS), 64)
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # the collator pads labels with -100 to the batch's longest sentence: (4, <= 22) int64, with
    # input_ids, token_type_ids and attention_mask of the same shape
    assert 4 * ex.rounded(4 * 10 * 8) <= est.breakdown["input"] <= 4 * ex.rounded(4 * 32 * 8), est.breakdown
    predictions = (tmp_path / "out" / "predictions.txt").read_text().splitlines()
    assert len(predictions) == 4 and all(set(line.split()) <= set(NER_TAGS) for line in predictions)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["id2label"] == {str(i): tag for i, tag in enumerate(NER_TAGS)}
