"""Round 17b: diffusers example scripts not covered before, re-created in their upstream
structure (scripts/r17b_diffusers_*.py; each docstring names the upstream version it follows)
and run unmodified on a tiny Stable-Diffusion-layout pipeline (scripts/r7_make_sd_checkpoint.py
with a 4-block VAE: SD's downsampling by 8) and tiny local image data (no network). Parameter,
gradient and optimizer bytes are worked out from the models' shapes (shapes.json, written by
the maker from the models it builds) and the scripts' rules, not read from peakmem.

- textual_inversion/textual_inversion.py: placeholder tokens added to the tokenizer, the text
  encoder's embedding resized; only the token embedding trains (dense gradient and AdamW
  moments of the whole matrix), a device copy of the original embedding restores the other rows
  after each step; the frozen UNet and VAE in fp16. Under `accelerate launch --mixed_precision
  fp16` as the README runs it, the script's own `--mixed_precision` default "no" wins: all fp32.
- controlnet/train_controlnet.py: `ControlNetModel.from_unet` trains in fp32 under fp16
  autocast; the UNet, VAE and text encoder frozen in fp16; the ControlNet's residuals added
  into the frozen UNet; `clip_grad_norm_`, `zero_grad(set_to_none=True)`, a `save_state` hook.
- dreambooth/train_dreambooth.py (full fine-tuning): class images generated first by the base
  pipeline (50 denoising steps on the device) for prior preservation, then the UNet and the text
  encoder both trained in fp32 under fp16 autocast (one AdamW over both), instance and class
  examples in one batch, the pipeline saved with the trained models.
- instruct_pix2pix/train_instruct_pix2pix.py: the UNet's conv_in swapped for an 8-channel one
  under no_grad, an EMA of the new UNet, a CUDA `torch.Generator` for the conditioning-dropout
  masks, an imagefolder with two image columns (`*_file_name` in metadata.jsonl).
- custom_diffusion/train_custom_diffusion.py: a modifier token's embedding and trainable fp32
  copies of the cross-attentions' to_k / to_v (CustomDiffusionAttnProcessor2_0, AttnProcsLayers)
  are all that trains; every other embedding row's gradient zeroed in place after backward; the
  end-of-run `unet.to(torch.float32)` before `save_attn_procs` is the peak.
- transformers question-answering/run_seq2seq_qa.py with its trainer_seq2seq_qa.py (one folder,
  as upstream: the script imports the trainer module beside it): a T5 trained on "question: Q
  context: C" inputs, overflowing validation features mapped back to their examples after
  `generate`, scored in `evaluate` and `predict`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, estimate_here, run_script_here
from tests.library_jobs.test_library_jobs import assert_training, needs

pytestmark = pytest.mark.slow

BYTE_VOCAB = 2 * 256 + 2
"""r7_make_sd_checkpoint's CLIP tokenizer: 256 byte symbols, each also as a word end, and the
start / end tokens."""
TEXT_HIDDEN = 32


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


def _images(count: int, size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> list:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    shape = (*size, 3) if mode == "RGB" else size
    return [Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)) for _ in range(count)]


@pytest.fixture(scope="module")
def sd8(tmp_path_factory) -> dict:
    """The tiny pipeline with a 4-block VAE (64 x 64 images to 8 x 8 latents, as ControlNet's
    conditioning embedding makes of its 64 x 64 conditioning image), and each component's
    parameter shapes."""
    root = tmp_path_factory.mktemp("sd8")
    run_script_here("r7_make_sd_checkpoint.py", str(root / "sd"), "4")
    shapes = json.loads((root / "sd" / "shapes.json").read_text())
    return {"root": root, "model": root / "sd",
            "shapes": {name: [tuple(s) for s in value] for name, value in shapes.items()}}


# textual_inversion/textual_inversion.py -----------------------------------------------------------

@needs("diffusers", "transformers", "accelerate", "torchvision", "PIL")
def test_textual_inversion_trains_the_resized_token_embedding_only(sd8, tmp_path):
    data = _textual_inversion_data(tmp_path)
    vectors = 5
    est = estimate_here(
        "r17b_diffusers_textual_inversion.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--train_data_dir", str(data), "--placeholder_token", "<cat-toy>", "--initializer_token", "a",
        "--num_vectors", str(vectors), "--resolution", "32", "--train_batch_size", "2", "--repeats", "2",
        "--max_train_steps", "3", "--mixed_precision", "fp16", "--lr_warmup_steps", "0",
        "--save_steps", "2", "--checkpointing_steps", "2", "--report_to", "none",
        "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    shapes = sd8["shapes"]
    # the embedding resized to the tokenizer with the 5 placeholder tokens (519 x 32 fp32:
    # 66,432 bytes, one 512-byte block more than the 514 rows it had)
    assert shapes["text_encoder"][0] == (BYTE_VOCAB, TEXT_HIDDEN)
    embedding = ex.device_bytes([(BYTE_VOCAB + vectors, TEXT_HIDDEN)], ex.FP32)
    assert embedding > ex.device_bytes([shapes["text_encoder"][0]], ex.FP32)
    # the text encoder goes through accelerate.prepare in fp32; the UNet and VAE are cast to fp16
    text_encoder = embedding + ex.device_bytes(shapes["text_encoder"][1:], ex.FP32)
    frozen = ex.device_bytes(shapes["unet"], 2) + ex.device_bytes(shapes["vae"], 2)
    # torch.optim.AdamW over get_input_embeddings().parameters(): two moments of the whole
    # matrix (host `step`s), and its dense gradient
    assert_training(est, params=text_encoder + frozen, grads=embedding, optimizer_state=2 * embedding,
                    extra_lower=embedding)  # orig_embeds_params: a device clone of the embedding
    # the clone is neither a parameter nor optimizer state: a copy of the weights made between
    # steps (capture/model_copies.py; it was `other`)
    assert est.breakdown.get("model_copy", 0) == embedding, est.breakdown
    assert est.data["steps"] == 3 and "trained 3 steps" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    notes = _notes(est)
    assert "learned_embeds-steps-2.safetensors" in notes and "checkpoint-2/optimizer.bin" in notes


def _textual_inversion_data(tmp_path: Path) -> Path:
    data = tmp_path / "cat"
    data.mkdir()
    for i, image in enumerate(_images(3, (40, 48))):
        image.save(data / f"{i}.png")
    return data


@needs("diffusers", "transformers", "accelerate", "torchvision", "PIL")
def test_textual_inversion_under_accelerate_launch_fp16_keeps_its_own_no(sd8, tmp_path):
    """As the README runs it: `accelerate launch --mixed_precision fp16 textual_inversion.py`
    without the script's own flag. Its `--mixed_precision` defaults to "no" and is passed to
    Accelerator(...), which takes it over the launcher's ACCELERATE_MIXED_PRECISION: no
    autocast, and the UNet and VAE stay fp32 on the device (on a GPU too)."""
    data = _textual_inversion_data(tmp_path)
    est = estimate(
        "r17b_diffusers_textual_inversion.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--train_data_dir", str(data), "--placeholder_token", "<cat-toy>", "--initializer_token", "a",
        "--resolution", "32", "--train_batch_size", "2", "--repeats", "2", "--max_train_steps", "3",
        "--lr_warmup_steps", "0", "--report_to", "none", "--output_dir", str(tmp_path / "out"),
        cwd=tmp_path, launcher=("accelerate", "launch", "--mixed_precision", "fp16"))
    shapes = sd8["shapes"]
    embedding = ex.device_bytes([(BYTE_VOCAB + 1, TEXT_HIDDEN)], ex.FP32)
    every_model = ex.device_bytes(shapes["text_encoder"][1:] + shapes["unet"] + shapes["vae"], ex.FP32)
    assert_training(est, params=embedding + every_model, grads=embedding, optimizer_state=2 * embedding,
                    extra_lower=embedding)
    assert est.data["launcher"] == "accelerate" and est.data["world_size"] == 1
    assert est.data["steps"] == 3


# controlnet/train_controlnet.py -------------------------------------------------------------------

def controlnet_own_shapes() -> list[ex.Shape]:
    """What ControlNetModel.from_unet adds to the copied UNet encoder (diffusers'
    controlnet.py): the conditioning embedding (conv_in 3 -> 16, then 16 -> 16, 16 -> 32 (stride
    2), 32 -> 32, 32 -> 96 (stride 2), 96 -> 96, 96 -> 256 (stride 2), conv_out 256 -> the UNet's
    first width), and a zero 1 x 1 convolution per down-block residual (the UNet's conv_in, the
    first block's resnet and downsampler, the second block's resnet) and for the mid block."""
    widths = (16, 32, 96, 256)
    shapes = ex.conv(widths[0], 3, 3)
    for c_in, c_out in zip(widths[:-1], widths[1:], strict=True):
        shapes += ex.conv(c_in, c_in, 3) + ex.conv(c_out, c_in, 3)
    shapes += ex.conv(32, widths[-1], 3)
    for channels in (32, 32, 32, 64, 64):
        shapes += ex.conv(channels, channels, 1)
    return shapes


@needs("diffusers", "transformers", "accelerate", "datasets", "torchvision", "PIL")
def test_train_controlnet_from_unet_fp32_under_fp16_frozen_unet(sd8, tmp_path):
    from datasets import Dataset, Features, Image, Value

    count = 6
    Dataset.from_dict(
        {"image": _images(count, (72, 80)), "text": [f"a photo of thing {i}" for i in range(count)],
         "conditioning_image": _images(count, (72, 80), mode="L", seed=1)},
        features=Features({"image": Image(), "text": Value("string"), "conditioning_image": Image()}),
    ).to_parquet(str(tmp_path / "fill" / "data" / "train.parquet"))
    est = estimate_here(
        "r17b_diffusers_train_controlnet.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--train_data_dir", str(tmp_path / "fill"), "--resolution", "64", "--train_batch_size", "2",
        "--max_train_steps", "3", "--mixed_precision", "fp16", "--lr_warmup_steps", "0",
        "--checkpointing_steps", "2", "--set_grads_to_none", "--report_to", "none",
        "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    shapes = sd8["shapes"]
    # the ControlNet: the UNet's encoder and mid block copied, plus its own layers
    own = Counter(controlnet_own_shapes())
    copied = Counter(shapes["controlnet"]) - own
    assert sum(Counter(shapes["controlnet"]).values()) - sum(copied.values()) == sum(own.values())
    assert not copied - Counter(shapes["unet"]), copied - Counter(shapes["unet"])
    controlnet = ex.device_bytes(shapes["controlnet"], ex.FP32)
    frozen = sum(ex.device_bytes(shapes[name], 2) for name in ("unet", "vae", "text_encoder"))
    # AdamW over the ControlNet only (torch.optim.AdamW: host `step`s)
    assert_training(est, params=controlnet + frozen, grads=controlnet, optimizer_state=2 * controlnet)
    assert est.data["steps"] == 3 and "trained 3 steps" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the save_state pre-hook writes the ControlNet as a diffusers folder; the final save too
    notes = _notes(est)
    assert "checkpoint-2/controlnet/diffusion_pytorch_model.safetensors" in notes, notes
    assert "checkpoint-2/optimizer.bin" in notes
    # the batch: two 3 x 64 x 64 fp32 images, two conditioning images and the (2, 16) ids
    assert est.breakdown["input"] >= 2 * ex.rounded(2 * 3 * 64 * 64 * 4) + ex.rounded(2 * 16 * 8), est.breakdown


# dreambooth/train_dreambooth.py -------------------------------------------------------------------

@needs("diffusers", "transformers", "accelerate", "torchvision", "PIL")
def test_train_dreambooth_full_text_encoder_and_prior_preservation(sd8, tmp_path):
    instance = tmp_path / "instance"
    instance.mkdir()
    for i, image in enumerate(_images(3, (40, 48))):
        image.save(instance / f"{i}.png")
    class_dir = tmp_path / "class-images"
    est = estimate_here(
        "r17b_diffusers_train_dreambooth.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--instance_data_dir", str(instance), "--instance_prompt", "a photo of sks dog",
        "--with_prior_preservation", "--class_data_dir", str(class_dir), "--class_prompt", "a photo of dog",
        "--num_class_images", "2", "--sample_batch_size", "2", "--train_text_encoder", "--resolution", "32",
        "--train_batch_size", "2", "--max_train_steps", "3", "--mixed_precision", "fp16",
        "--lr_warmup_steps", "0", "--checkpointing_steps", "2", "--set_grads_to_none",
        "--report_to", "none", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    shapes = sd8["shapes"]
    # the UNet and the text encoder train in fp32 (accelerate.prepare, autocast); the VAE is
    # cast to fp16; the generation pipeline's fp16 copy was deleted before training
    trained = ex.device_bytes(shapes["unet"], ex.FP32) + ex.device_bytes(shapes["text_encoder"], ex.FP32)
    vae = ex.device_bytes(shapes["vae"], 2)
    # torch.optim.AdamW over itertools.chain(unet, text_encoder): host `step`s
    assert_training(est, params=trained + vae, grads=trained, optimizer_state=2 * trained)
    assert "generated 2 class images" in est.stderr and "trained 3 steps" in est.stderr
    assert sorted(path.name[:2] for path in class_dir.iterdir()) == ["0-", "1-"]
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # collate_fn concatenates 2 instance and 2 class examples: four 3 x 32 x 32 fp32 images
    assert est.breakdown["input"] >= ex.rounded(4 * 3 * 32 * 32 * 4), est.breakdown
    notes = _notes(est)
    assert "checkpoint-2/unet/diffusion_pytorch_model.safetensors" in notes, notes
    assert "checkpoint-2/text_encoder/model.safetensors" in notes, notes


# instruct_pix2pix/train_instruct_pix2pix.py ---------------------------------------------------------

@needs("diffusers", "transformers", "accelerate", "datasets", "torchvision", "PIL")
def test_train_instruct_pix2pix_eight_channel_conv_in_ema_and_device_generator(sd8, tmp_path):
    data = tmp_path / "edits"
    data.mkdir()
    originals, edited = _images(6, (40, 48)), _images(6, (40, 48), seed=1)
    rows = []
    for i in range(6):
        originals[i].save(data / f"in{i}.png")
        edited[i].save(data / f"out{i}.png")
        rows.append({"input_image_file_name": f"in{i}.png", "edit_prompt": f"make it thing {i}",
                     "edited_image_file_name": f"out{i}.png"})
    (data / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    est = estimate_here(
        "r17b_diffusers_train_instruct_pix2pix.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--train_data_dir", str(data), "--resolution", "32", "--random_flip", "--train_batch_size", "2",
        "--max_train_steps", "3", "--conditioning_dropout_prob", "0.05", "--use_ema",
        "--mixed_precision", "fp16", "--lr_warmup_steps", "0", "--checkpointing_steps", "2", "--seed", "0",
        "--report_to", "none", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    shapes = sd8["shapes"]
    # conv_in 4 -> 32 becomes 8 -> 32 (the replaced conv is freed); the UNet trains in fp32
    assert shapes["unet"][0] == (32, 4, 3, 3)
    unet_shapes = [(32, 8, 3, 3), *shapes["unet"][1:]]
    unet = ex.device_bytes(unet_shapes, ex.FP32)
    assert unet > ex.device_bytes(shapes["unet"], ex.FP32)
    frozen = ex.device_bytes(shapes["vae"], 2) + ex.device_bytes(shapes["text_encoder"], 2)
    assert_training(est, params=unet + frozen, grads=unet, optimizer_state=2 * unet, extra_lower=unet)
    # the EMA's shadow copy is of the 8-channel UNet, on the device
    assert est.breakdown.get("ema") == unet, est.breakdown
    assert est.data["steps"] == 3 and "trained 3 steps" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "checkpoint-2/unet_ema/diffusion_pytorch_model.safetensors" in _notes(est)


# question-answering/run_seq2seq_qa.py + trainer_seq2seq_qa.py ---------------------------------------

@needs("transformers", "accelerate", "datasets")
def test_run_seq2seq_qa_t5_question_answering_seq2seq_trainer(tmp_path):
    from tests.library_jobs.test_library_jobs_hf import (
        TINY_T5_CONFIG,
        sentences,
        t5_shapes,
        write_config,
        write_tokenizer,
    )

    model = write_tokenizer(write_config(tmp_path / "t5", TINY_T5_CONFIG))
    files = {}
    for split, n, seed in (("train", 24, 1), ("validation", 6, 2), ("test", 4, 3)):
        rows = []
        for i, context in enumerate(sentences(n, seed)):
            answer = context.split()[1]
            rows.append({"id": f"{split}-{i}", "question": " ".join(context.split()[:3]), "context": context,
                         "answers": {"text": [answer], "answer_start": [context.index(answer)]}})
        files[split] = tmp_path / f"{split}.json"
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    est = estimate_here(
        "r17b_hf_ex_seq2seq_qa/run_seq2seq_qa.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--test_file", str(files["test"]), "--max_seq_length", "32", "--max_answer_length", "8",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--report_to", "none",
        "--seed", "0", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    shapes = t5_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    # the Trainer's fused AdamW: two moments and a 0-d device `step` per parameter
    assert_training(est, params=params, optimizer_state=2 * params + ex.BLOCK * len(shapes))
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # evaluate() and predict() generate after training
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    # the post-processed predictions were scored: one answer per example (predict() prefixes "test_")
    eval_results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert {"eval_exact_match", "eval_f1", "eval_samples"} <= set(eval_results), eval_results
    assert eval_results["eval_samples"] == 6
    assert "test_f1" in json.loads((tmp_path / "out" / "predict_results.json").read_text())


# custom_diffusion/train_custom_diffusion.py -----------------------------------------------------------

@needs("diffusers", "transformers", "accelerate", "torchvision", "PIL")
def test_train_custom_diffusion_modifier_token_and_cross_attention_kv(sd8, tmp_path):
    instance = _textual_inversion_data(tmp_path)
    est = estimate_here(
        "r17b_diffusers_train_custom_diffusion.py", "--pretrained_model_name_or_path", str(sd8["model"]),
        "--instance_data_dir", str(instance), "--instance_prompt", "photo of a <new1> cat",
        "--modifier_token", "<new1>", "--initializer_token", "a", "--resolution", "32",
        "--train_batch_size", "2", "--max_train_steps", "3", "--mixed_precision", "fp16",
        "--lr_warmup_steps", "0", "--checkpointing_steps", "2", "--dataloader_num_workers", "0",
        "--report_to", "none", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    assert est.returncode == 0, est.failure()
    shapes = sd8["shapes"]
    # trainable: the resized token embedding (514 rows + <new1>) and, for each of the four
    # cross-attentions (three 32 wide, one 64 wide), to_k / to_v copies reading the 32-wide
    # text states, no bias (--freeze_model crossattn_kv), all fp32
    embedding = ex.device_bytes([(BYTE_VOCAB + 1, TEXT_HIDDEN)], ex.FP32)
    processors = ex.device_bytes(3 * [(32, TEXT_HIDDEN), (32, TEXT_HIDDEN)] + 2 * [(64, TEXT_HIDDEN)], ex.FP32)
    trained = embedding + processors
    assert est.breakdown.get("gradient") == trained, est.breakdown
    # torch.optim.AdamW over chain(embedding, processors): two moments, host `step`s
    assert est.breakdown.get("optimizer_state") == 2 * trained, est.breakdown
    # the peak is the end-of-run `unet.to(torch.float32)` (module._apply: each fp32 copy is
    # made before its fp16 original is freed): the whole UNet in fp32, part of it still in fp16
    # too, beside the fp32 text encoder (prepared), the fp16 VAE and the processors
    text_encoder = embedding + ex.device_bytes(shapes["text_encoder"][1:], ex.FP32)
    others = text_encoder + ex.device_bytes(shapes["vae"], 2) + processors
    unet_fp32, unet_fp16 = ex.device_bytes(shapes["unet"], ex.FP32), ex.device_bytes(shapes["unet"], 2)
    assert others + unet_fp32 <= est.breakdown["parameter"] < others + unet_fp32 + unet_fp16, est.breakdown
    assert est.data["peak_allocated_bytes"] >= est.breakdown["parameter"] + 3 * trained
    assert est.data["steps"] == 3 and "trained 3 steps" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]
