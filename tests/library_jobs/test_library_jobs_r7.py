"""Round 7: the Hugging Face ecosystem's trainers as people run them (TRL, sentence-transformers,
diffusers), each script re-created from the library's own example and run unmodified through the
real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r7_*.py), offline on
a tiny model and local data written to tmp_path. Parameter and optimizer bytes are worked out by
hand from the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here, run_script_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_GPT2_CONFIG,
    bert_shapes,
    sentences,
    write_checkpoint,
)

GPT2_SHAPES = ex.gpt2_shapes(**ex.TINY_GPT2)
GPT2_PARAMS = ex.device_bytes(GPT2_SHAPES, ex.FP32)


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# TRL: trl/scripts/{sft,dpo,reward}.py (examples/scripts) ---------------------------------------

@pytest.fixture(scope="module")
def trl_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny GPT-2 saved as GPT2LMHeadModel (TRL loads the class `config.architectures`
    names: the base model saved by hf_ex_make_checkpoint.py has no `generation_config`), its
    word-level tokenizer, and two local data sets as folders `load_dataset(NAME)` reads: plain
    text for SFT, prompt / chosen / rejected for DPO and reward modelling (40 rows each)."""
    root = tmp_path_factory.mktemp("trl")
    model = write_checkpoint(root / "gpt2", TINY_GPT2_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    _jsonl(root / "sft" / "train.jsonl", [{"text": s} for s in sentences(40)])
    rows = zip(sentences(40, 1), sentences(40, 2), sentences(40, 3), strict=True)
    _jsonl(root / "pref" / "train.jsonl",
           [{"prompt": p[:30], "chosen": c[:40], "rejected": r[:40]} for p, c, r in rows])
    return {"root": root, "model": model, "sft": root / "sft", "pref": root / "pref"}


def run_trl(script: str, files: dict[str, Path], dataset: str, *flags: str):
    """One of TRL's example scripts, three optimizer steps of four rows, in this process (the
    child path: `test_trl_sft_under_accelerate_launch_two_processes`)."""
    out = files["root"] / "out" / script
    return estimate_here(f"r7_trl_{script}.py", "--model_name_or_path", str(files["model"]),
                    "--dataset_name", str(files[dataset]), "--max_steps", "3",
                    "--per_device_train_batch_size", "4", "--max_length", "48",
                    "--report_to", "none", "--output_dir", str(out), *flags,
                    cwd=files["root"])


FUSED_ADAMW = 2 * GPT2_PARAMS + fused_steps(GPT2_SHAPES)
"""The Trainer's default optimizer (adamw_torch_fused): two moments and a 0-d `step` each."""


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_sft_full_fine_tune(trl_files):
    est = run_trl("sft", trl_files, "sft")
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW)
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training"]
    # 40 rows in batches of 4: SFTTrainer tokenized and collated them on the host
    assert "DataLoader epoch of 10 batches" in _notes(est)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "Training completed" in est.stderr


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_sft_use_peft_lora_trains_the_adapters_only(trl_files):
    rank = 8
    est = run_trl("sft", trl_files, "sft", "--use_peft", "--lora_r", str(rank), "--lora_alpha", "16")
    # peft's default target for GPT-2 is c_attn (Conv1D 64 -> 192): A is r x 64, B is 192 x r
    embd, layers = ex.TINY_GPT2["embd"], ex.TINY_GPT2["layers"]
    lora = layers * [(rank, embd), (3 * embd, rank)]
    lora_bytes = ex.device_bytes(lora, ex.FP32)
    assert_training(est, params=GPT2_PARAMS + lora_bytes, grads=lora_bytes,
                    optimizer_state=2 * lora_bytes + fused_steps(lora))
    assert "adapter_model.safetensors" in _notes(est)


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_sft_under_accelerate_launch_two_processes(trl_files):
    out = trl_files["root"] / "out" / "sft-ddp"
    est = estimate("r7_trl_sft.py", "--model_name_or_path", str(trl_files["model"]),
                   "--dataset_name", str(trl_files["sft"]), "--max_steps", "3",
                   "--per_device_train_batch_size", "4", "--max_length", "48",
                   "--report_to", "none", "--output_dir", str(out), cwd=trl_files["root"],
                   launcher=("accelerate", "launch", "--num_processes", "2",
                             "--mixed_precision", "bf16"))
    # DDP: every rank holds the whole model state
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW)
    assert est.data["world_size"] == 2 and est.data["launcher"] == "accelerate"
    # the DistributedSampler gives each rank 20 of the 40 rows: 5 batches of 4
    assert "DataLoader epoch of 5 batches" in _notes(est)


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_dpo_policy_and_reference_model(trl_files):
    est = run_trl("dpo", trl_files, "pref")
    # DPOTrainer loads a second copy of the model as the frozen reference, on the device:
    # two sets of weights, gradients and AdamW's moments for the policy only
    assert_training(est, params=2 * GPT2_PARAMS, grads=GPT2_PARAMS, optimizer_state=FUSED_ADAMW)
    assert est.data["steps"] == 3
    assert est.data["mode"] == "fake", est.data["mode_reason"]


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_dpo_with_peft_has_no_reference_copy(trl_files):
    rank = 8
    est = run_trl("dpo", trl_files, "pref", "--use_peft", "--lora_r", str(rank))
    # with an adapter the reference is the base model with the adapter disabled: one copy
    embd, layers = ex.TINY_GPT2["embd"], ex.TINY_GPT2["layers"]
    lora = layers * [(rank, embd), (3 * embd, rank)]
    lora_bytes = ex.device_bytes(lora, ex.FP32)
    assert_training(est, params=GPT2_PARAMS + lora_bytes, grads=lora_bytes,
                    optimizer_state=2 * lora_bytes + fused_steps(lora))


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_reward_modeling_sequence_classifier(trl_files):
    est = run_trl("reward", trl_files, "pref")
    # AutoModelForSequenceClassification(num_labels=1): GPT2Model and a bias-free score head
    # (1 x 64) in place of the tied lm_head
    shapes = [*GPT2_SHAPES, (1, ex.TINY_GPT2["embd"])]
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["steps"] == 3


@pytest.mark.slow
@needs("trl", "peft", "datasets")
def test_trl_grpo_generates_with_the_policy_and_scores_with_a_reward_model(trl_files):
    root = trl_files["root"]
    # the reward model: the same tiny GPT-2 saved as a one-label sequence classifier
    reward_model = root / "reward-model"
    if not reward_model.exists():
        reward_model.mkdir()
        for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (reward_model / name).write_bytes((trl_files["model"] / name).read_bytes())
        config = json.loads((trl_files["model"] / "config.json").read_text())
        config.update(architectures=["GPT2ForSequenceClassification"], num_labels=1, pad_token_id=0)
        (reward_model / "config.json").write_text(json.dumps(config))
    prompts = _jsonl(root / "prompts" / "train.jsonl", [{"prompt": s[:30]} for s in sentences(4, 5)])
    out = root / "out" / "grpo"
    est = estimate_here("r7_trl_grpo.py", "--model_name_or_path", str(trl_files["model"]),
                        "--dataset_name", str(prompts.parent), "--reward_model_name_or_path",
                        str(reward_model), "--reward_funcs", "get_soft_overlong_punishment",
                        "--max_steps", "1", "--per_device_train_batch_size", "2",
                        "--num_generations", "2", "--max_completion_length", "4",
                        "--report_to", "none", "--output_dir", str(out), cwd=root)
    # the policy and the reward model on the device (beta = 0: no reference model); gradients
    # and AdamW's moments for the policy only
    reward_shapes = [*GPT2_SHAPES, (1, ex.TINY_GPT2["embd"])]
    reward_params = ex.device_bytes(reward_shapes, ex.FP32)
    assert_training(est, params=GPT2_PARAMS + reward_params, grads=GPT2_PARAMS,
                    optimizer_state=FUSED_ADAMW)
    assert "Training completed" in est.stderr
    # GRPOTrainer cuts each completion after its first EOS with a mask it reads on the host
    # (`c[m].tolist()`): fake mode reads a boolean mask as all True (every token kept, as it
    # sizes device-side selections), not zeros (empty completions, then `ids[-1]` failed and
    # auto mode reran the job eagerly on the CPU). generate reads the left-padded prompt mask
    # (known values: both copies of the one prompt have one length) as all ones and drops it,
    # as on a GPU; GPT-2 then checks `pad_token_id in input_ids[:, [-1, 0]]`, Python code whose
    # `.item()` runs below the capture's mode (read on the host as a whole: device_map)
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# sentence-transformers: training/nli/training_nli_v2.py, v3+ trainer and legacy model.fit ------

@pytest.fixture(scope="module")
def st_files(tmp_path_factory) -> dict[str, Path]:
    """A tiny BertModel checkpoint with its tokenizer, 48 AllNLI-style triplets and 12 STS-B
    style scored pairs (JSON lines)."""
    import random

    root = tmp_path_factory.mktemp("st")
    model = write_checkpoint(root / "bert", TINY_BERT_CONFIG)
    rows = zip(sentences(48, 11), sentences(48, 12), sentences(48, 13), strict=True)
    nli = _jsonl(root / "nli.jsonl", [{"anchor": a[:40], "positive": p[:40], "negative": n[:40]}
                                      for a, p, n in rows])
    rng = random.Random(0)
    sts = _jsonl(root / "sts.jsonl", [{"sentence1": a[:40], "sentence2": b[:40],
                                       "score": rng.uniform(0, 5)}
                                      for a, b in zip(sentences(12, 14), sentences(12, 15), strict=True)])
    return {"root": root, "model": model, "nli": nli, "sts": sts}


BERT_SHAPES = bert_shapes(**TINY_BERT)
POOLER = ex.linear(TINY_BERT["hidden"], TINY_BERT["hidden"])
ST_PARAMS = ex.device_bytes(BERT_SHAPES + POOLER, ex.FP32)
"""AutoModel loads BertModel with its pooler, which mean pooling never uses: it gets no
gradient, so AdamW keeps no state for it."""
ST_MOMENTS = 2 * ex.device_bytes(BERT_SHAPES, ex.FP32)


@pytest.mark.slow
@needs("sentence_transformers", "datasets")
def test_sentence_transformers_trainer_mnrl_nli_with_sts_evaluator(st_files):
    # in this process; the legacy fit below keeps sentence-transformers' child path
    est = estimate_here("r7_st_nli_v2.py", str(st_files["model"]), "--train-file",
                        str(st_files["nli"]), "--dev-file", str(st_files["nli"]), "--sts-file",
                        str(st_files["sts"]), "--batch-size", "8", "--max-steps", "2",
                        "--eval-steps", "1", "--max-seq-length", "32", cwd=st_files["root"])
    # fp16 autocast keeps fp32 weights; the Trainer's fused AdamW: moments and a device `step`
    # for each of the 37 parameters that get a gradient
    assert_training(est, params=ST_PARAMS, grads=ex.device_bytes(BERT_SHAPES, ex.FP32),
                    optimizer_state=ST_MOMENTS + fused_steps(BERT_SHAPES))
    # 48 triplets in NO_DUPLICATES batches of 8; the loss's evaluation after each step
    assert "DataLoader epoch of 6 batches" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "sts-test:" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]


@pytest.mark.slow
@needs("sentence_transformers", "datasets")
def test_sentence_transformers_legacy_fit_no_duplicates_loader(st_files):
    est = estimate("r7_st_legacy_fit.py", str(st_files["model"]), "--train-file", str(st_files["nli"]),
                   "--sts-file", str(st_files["sts"]), "--train-batch-size", "8",
                   "--max-seq-length", "32", cwd=st_files["root"])
    # model.fit's default optimizer_class is torch.optim.AdamW (not fused: host `step`s)
    assert_training(est, params=ST_PARAMS, grads=ex.device_bytes(BERT_SHAPES, ex.FP32),
                    optimizer_state=ST_MOMENTS)
    assert "DataLoader epoch of 6 batches" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval"]
    assert "sts-dev after training:" in est.stderr


# diffusers: examples/unconditional_image_generation/train_unconditional.py ------------------------

def unet2d_shapes(in_channels: int, out_channels: int, channels: tuple[int, ...], layers: int,
                  attn_down: tuple[bool, ...], attn_up: tuple[bool, ...]) -> list[ex.Shape]:
    """diffusers' UNet2DModel from its block definitions (unet_2d.py, unet_2d_blocks.py,
    resnet.py, attention_processor.py): conv_in, the time embedding MLP (4 x the first width),
    down blocks of ResnetBlock2D (+ an Attention each in Attn* blocks) and a strided-conv
    Downsample2D but the last, the mid block (resnet, attention, resnet), up blocks of
    layers + 1 resnets fed the skip connections (+ attentions) and an Upsample2D conv but the
    last, then GroupNorm and conv_out."""
    temb = 4 * channels[0]

    def resnet(c_in: int, c_out: int) -> list[ex.Shape]:
        shapes = ex.norm(c_in) + ex.conv(c_out, c_in, 3) + ex.linear(c_out, temb)
        shapes += ex.norm(c_out) + ex.conv(c_out, c_out, 3)
        return shapes + (ex.conv(c_out, c_in, 1) if c_in != c_out else [])

    def attention(c: int) -> list[ex.Shape]:
        return ex.norm(c) + 4 * ex.linear(c, c)  # group_norm, to_q / to_k / to_v / to_out.0

    shapes = ex.conv(channels[0], in_channels, 3) + ex.linear(temb, channels[0]) + ex.linear(temb, temb)
    prev = channels[0]
    for i, c in enumerate(channels):
        for j in range(layers):
            shapes += resnet(prev if j == 0 else c, c) + (attention(c) if attn_down[i] else [])
        shapes += ex.conv(c, c, 3) if i < len(channels) - 1 else []
        prev = c
    shapes += resnet(prev, prev) + attention(prev) + resnet(prev, prev)
    widths = list(reversed(channels))
    for i, c in enumerate(widths):
        skip_last = widths[min(i + 1, len(widths) - 1)]
        for j in range(layers + 1):
            skip = skip_last if j == layers else c
            shapes += resnet((prev if j == 0 else c) + skip, c) + (attention(c) if attn_up[i] else [])
        shapes += ex.conv(c, c, 3) if i < len(widths) - 1 else []
        prev = c
    return shapes + ex.norm(channels[0]) + ex.conv(out_channels, channels[0], 3)


TINY_UNET2D = {
    "_class_name": "UNet2DModel", "sample_size": 16, "in_channels": 3, "out_channels": 3,
    "layers_per_block": 1, "block_out_channels": [32, 64], "norm_num_groups": 8,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
    "up_block_types": ["AttnUpBlock2D", "UpBlock2D"],
}
UNET2D_SHAPES = unet2d_shapes(3, 3, (32, 64), 1, (False, True), (True, False))


def _png_folder(folder: Path, count: int, size: tuple[int, int] = (20, 24)) -> Path:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


@pytest.mark.slow
@needs("diffusers", "datasets", "torchvision", "PIL")
def test_diffusers_train_unconditional_unet_ddpm_ema(tmp_path):
    images = _png_folder(tmp_path / "images", 12)
    config = tmp_path / "unet_config.json"
    config.write_text(json.dumps(TINY_UNET2D))
    est = estimate("r7_diffusers_train_unconditional.py", "--train_data_dir", str(images),
                   "--model_config_name_or_path", str(config), "--resolution", "16",
                   "--train_batch_size", "4", "--eval_batch_size", "2", "--num_epochs", "1",
                   "--use_ema", "--lr_warmup_steps", "1", "--ddpm_num_inference_steps", "3",
                   "--checkpointing_steps", "2", "--logger", "none",
                   "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    model = ex.device_bytes(UNET2D_SHAPES, ex.FP32)
    # plain torch.optim.AdamW (host `step`s); the EMA's shadow copy of every weight is on the
    # device too (EMAModel.to(accelerator.device)), beyond the model state
    assert_training(est, params=model, optimizer_state=2 * model, extra_lower=model)
    assert est.breakdown.get("ema", 0) >= model, est.breakdown
    # 12 images in batches of 4, then the DDPMPipeline's sampling with the EMA weights
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training", "eval"]
    assert "epoch 0: sampled images (2, 16, 16, 3)" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# diffusers: examples/text_to_image/train_text_to_image.py and train_text_to_image_lora.py ---------

@pytest.fixture(scope="module")
def sd_files(tmp_path_factory) -> dict[str, Path]:
    """A tiny Stable Diffusion pipeline folder (scripts/r7_make_sd_checkpoint.py: UNet2DCondition,
    AutoencoderKL, CLIP text encoder and tokenizer, DDPM scheduler) and an imagefolder of 8
    captioned 20 x 24 images (metadata.jsonl)."""
    root = tmp_path_factory.mktemp("sd")
    run_script_here("r7_make_sd_checkpoint.py", str(root / "sd"))
    images = _png_folder(root / "images", 8)
    _jsonl(images / "metadata.jsonl", [{"file_name": f"{i}.png", "text": f"a photo of thing {i}"}
                                       for i in range(8)])
    return {"root": root, "model": root / "sd", "images": images}


def _sd_shapes(sd_files: dict[str, Path]) -> dict[str, list[ex.Shape]]:
    """Each component's parameter shapes as the maker script's models hold them (shapes.json)."""
    shapes = json.loads((sd_files["model"] / "shapes.json").read_text())
    return {name: [tuple(shape) for shape in value] for name, value in shapes.items()}


def run_text_to_image(sd_files: dict[str, Path], *flags: str):
    """train_text_to_image.py in this process (diffusers' child path:
    `test_diffusers_train_unconditional_unet_ddpm_ema`)."""
    return estimate_here("r7_diffusers_train_text_to_image.py", "--pretrained_model_name_or_path",
                         str(sd_files["model"]), "--train_data_dir", str(sd_files["images"]),
                         "--resolution", "16", "--train_batch_size", "2", "--max_train_steps", "2",
                         "--mixed_precision", "fp16", "--report_to", "none",
                         "--lr_warmup_steps", "0", *flags, cwd=sd_files["root"])


@pytest.mark.slow
@needs("diffusers", "peft", "datasets", "torchvision", "PIL")
def test_diffusers_text_to_image_full_unet_ema_fp16_frozen_vae_text_encoder(sd_files):
    est = run_text_to_image(sd_files, "--use_ema", "--gradient_checkpointing",
                            "--checkpointing_steps", "1", "--output_dir",
                            str(sd_files["root"] / "full"))
    shapes = _sd_shapes(sd_files)
    unet = ex.device_bytes(shapes["unet"], ex.FP32)
    # the UNet trains in fp32 (autocast); the frozen VAE and text encoder were cast to fp16 on
    # the device: all of them are weights, the VAE's decoder too (never run: only vae.encode)
    frozen = ex.device_bytes(shapes["vae"], 2) + ex.device_bytes(shapes["text_encoder"], 2)
    assert_training(est, params=unet + frozen, grads=unet, optimizer_state=2 * unet,
                    extra_lower=unet)  # the EMA's shadow copy of the UNet, on the device
    assert est.data["steps"] == 2 and "trained 2 steps" in est.stderr
    assert "checkpoint-1/optimizer.bin" in _notes(est)
    assert est.data["mode"] == "fake", est.data["mode_reason"]


def _unet_lora_shapes(rank: int, transformers_at: dict[int, int], cross_dim: int) -> list[ex.Shape]:
    """peft LoRA (A: r x in, B: out x r) on to_q / to_k / to_v / to_out.0 of both attentions
    of every BasicTransformerBlock: self-attention (c -> c) and cross-attention (to_k / to_v
    read the text encoder's states, cross_dim wide)."""
    shapes: list[ex.Shape] = []
    for channels, count in transformers_at.items():
        per_block = 4 * [(rank, channels), (channels, rank)]  # attn1
        per_block += 2 * [(rank, channels), (channels, rank)]  # attn2 to_q, to_out.0
        per_block += 2 * [(rank, cross_dim), (channels, rank)]  # attn2 to_k, to_v
        shapes += count * per_block
    return shapes


@pytest.mark.slow
@needs("diffusers", "peft", "datasets", "torchvision", "PIL")
def test_diffusers_text_to_image_lora_trains_adapters_on_an_fp16_unet(sd_files):
    rank = 4
    est = run_text_to_image(sd_files, "--lora_rank", str(rank), "--output_dir",
                            str(sd_files["root"] / "lora"))
    shapes = _sd_shapes(sd_files)
    # one transformer in the 32-wide down block, two in the up block, one in the 64-wide mid
    lora = _unet_lora_shapes(rank, {32: 3, 64: 1}, cross_dim=32)
    lora_bytes = ex.device_bytes(lora, ex.FP32)  # cast_training_params: the adapters in fp32
    frozen = sum(ex.device_bytes(shapes[name], 2) for name in ("unet", "vae", "text_encoder"))
    assert_training(est, params=frozen + lora_bytes, grads=lora_bytes,
                    optimizer_state=2 * lora_bytes)
    assert "pytorch_lora_weights.safetensors" in _notes(est)


@pytest.mark.slow
@needs("diffusers", "peft", "datasets", "torchvision", "PIL")
def test_diffusers_dreambooth_lora_prior_preservation_generates_then_trains(sd_files):
    # 4 instance images; the 2 class images are generated first by the base pipeline (50
    # denoising steps on the device), which is then deleted
    instance = _png_folder(sd_files["root"] / "instance", 4)
    class_dir = sd_files["root"] / "class-images"
    est = estimate_here("r7_diffusers_train_dreambooth_lora.py", "--pretrained_model_name_or_path",
                        str(sd_files["model"]), "--instance_data_dir", str(instance),
                        "--instance_prompt", "a photo of sks dog", "--with_prior_preservation",
                        "--class_data_dir", str(class_dir), "--class_prompt", "a photo of dog",
                        "--num_class_images", "2", "--sample_batch_size", "2", "--resolution", "16",
                        "--train_batch_size", "2", "--max_train_steps", "2",
                        "--mixed_precision", "fp16", "--report_to", "none", "--lr_warmup_steps", "0",
                        "--output_dir", str(sd_files["root"] / "dreambooth"), cwd=sd_files["root"])
    shapes = _sd_shapes(sd_files)
    rank = 4
    lora = _unet_lora_shapes(rank, {32: 3, 64: 1}, cross_dim=32)  # no add_k_proj in SD's UNet
    lora_bytes = ex.device_bytes(lora, ex.FP32)
    frozen = sum(ex.device_bytes(shapes[name], 2) for name in ("unet", "vae", "text_encoder"))
    # only the training models' weights: the generation pipeline's copy was freed by `del`
    assert_training(est, params=frozen + lora_bytes, grads=lora_bytes,
                    optimizer_state=2 * lora_bytes)
    assert "generated 2 class images" in est.stderr and "trained 2 steps" in est.stderr
    # the DDPM sampling loop ran on fake tensors (DDPMScheduler indexes its timesteps with a
    # device scalar), and class images were written; their names hold the batch's device
    # `index` (PromptDataset's 0 and 1, collated on the host and moved by accelerate: known
    # values) and the image's hash (of unknown pixels, read as zeros: one hash). Two files, as
    # on a GPU, where both the indices and the hashes differ
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert sorted(path.name[:2] for path in class_dir.iterdir()) == ["0-", "1-"]
