"""Hugging Face fine-tuning as people run it, second set: the Trainer's memory options on
transformers' run_clm.py (scripts/hf_ex_run_clm.py, run unmodified with the flags people pass),
more examples/pytorch scripts and peft set-ups.

As in test_library_jobs_hf.py: offline, on a tiny config / word-level tokenizer / local files
written to tmp_path, through the real CLI, with parameter and optimizer bytes worked out by hand
from the configs (expected.py) and the optimizers' own state rules.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import random
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_GPT2_CONFIG,
    TINY_T5_CONFIG,
    TINY_VIT_CONFIG,
    bert_shapes,
    sentences,
    t5_shapes,
    vit_classifier_shapes,
    write_checkpoint,
    write_config,
    write_image_folder,
    write_tokenizer,
)

GPT2_SHAPES = ex.gpt2_shapes(**ex.TINY_GPT2)
GPT2_PARAMS = ex.device_bytes(GPT2_SHAPES, ex.FP32)
FUSED_ADAMW_STATE = 2 * GPT2_PARAMS + fused_steps(GPT2_SHAPES)
"""The Trainer's default optimizer (adamw_torch_fused): two moments and a 0-d device `step`
per parameter."""

BATCH, BLOCK_SIZE, EMBD, LAYERS = 4, 32, 64, 2


def write_clm_files(tmp_path: Path) -> dict[str, Path]:
    """test_library_jobs_hf.py's: the tiny GPT-2 config and tokenizer, train / validation text."""
    model = write_tokenizer(write_config(tmp_path / "gpt2", TINY_GPT2_CONFIG))
    train = tmp_path / "train.txt"
    train.write_text("\n".join(sentences(200)) + "\n")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(sentences(20, seed=1)) + "\n")
    return {"model": model, "train": train, "valid": valid, "out": tmp_path / "out"}


@pytest.fixture
def clm_files(tmp_path) -> dict[str, Path]:
    return write_clm_files(tmp_path)


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory):
    """`run_clm(files, *flags)` made once per set of flags in this module: the Trainer options
    whose assertions do not interfere share one run (FP16_WITH_EVAL, BF16_WITH_COMPILE)."""
    runs: dict[tuple[str, ...], object] = {}

    def run(*flags: str):
        if flags not in runs:
            runs[flags] = run_clm(write_clm_files(tmp_path_factory.mktemp("clm")), *flags)
        return runs[flags]

    return run


def run_clm(files: dict[str, Path], *flags: str, env_flags: tuple[str, ...] = (),
            in_child: bool = False):
    """`run_clm.py` with the Trainer, three optimizer steps then an evaluation; in this process
    (`estimate_here`) unless `in_child` or `env_flags` (CLI flags) are given."""
    run = estimate if in_child or env_flags else estimate_here
    return run(
        "hf_ex_run_clm.py",
        "--config_name", str(files["model"]), "--tokenizer_name", str(files["model"]),
        "--train_file", str(files["train"]), "--validation_file", str(files["valid"]),
        "--block_size", str(BLOCK_SIZE), "--per_device_train_batch_size", str(BATCH),
        "--per_device_eval_batch_size", str(BATCH), "--max_steps", "3", "--do_train", "--do_eval",
        "--report_to", "none", "--seed", "0", "--output_dir", str(files["out"]), *flags,
        **({"flags": env_flags} if env_flags else {}),
    )


# Trainer: precision and gradient checkpointing ------------------------------------------------

FP16_WITH_EVAL = ("--fp16", "--eval_strategy", "steps", "--eval_steps", "1")
BF16_WITH_COMPILE = ("--bf16", "--torch_compile")
"""Each precision shares its run with an option checked on its own below (evaluations
interleaved with training; torch.compile's note): one capture, both tests' assertions."""


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
@pytest.mark.parametrize("flags", [BF16_WITH_COMPILE, FP16_WITH_EVAL], ids=["bf16", "fp16"])
def test_trainer_mixed_precision_keeps_fp32_weights(clm_run, flags):
    est = clm_run(*flags)
    # autocast: the weights, their gradients and the moments stay fp32
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW_STATE)


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_gradient_checkpointing_keeps_only_layer_inputs(clm_files):
    est = run_clm(clm_files, "--gradient_checkpointing")
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW_STATE)
    # what the forward keeps for backward: each block's input (batch x block x embd fp32) and
    # what is outside the checkpointed blocks (embeddings, the last norm, the logits' loss);
    # without checkpointing the attention and MLP intermediates of both blocks (2.0 MiB here)
    hidden = BATCH * BLOCK_SIZE * EMBD * ex.FP32
    logits = BATCH * BLOCK_SIZE * ex.TINY_GPT2["vocab"] * ex.FP32
    assert est.breakdown.get("activation", 0) <= (LAYERS + 2) * hidden + logits, est.breakdown


# Trainer: optimizers ------------------------------------------------------------------------------

def adafactor_state(shapes: list[ex.Shape]) -> int:
    """transformers' Adafactor (`optim="adafactor"`: no first moment): a matrix keeps row and
    column second moments, a vector its full second moment; every parameter's update keeps
    its RMS, a 0-d device tensor (`state["RMS"] = self._rms(p)`)."""
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            total += ex.rounded(shape[0] * ex.FP32) + ex.rounded(shape[-1] * ex.FP32)
        else:
            total += ex.rounded(shape[0] * ex.FP32)
        total += ex.BLOCK  # RMS
    return total


def bnb_adamw8bit_state(shapes: list[ex.Shape], embeddings: int) -> int:
    """bitsandbytes' AdamW8bit (`optim="adamw_bnb_8bit"`): two uint8 moments and two fp32
    absmax per 256-element block for a parameter of 4096 elements or more, two fp32 moments for
    a smaller one; the Trainer keeps the embeddings' (the first `embeddings` shapes) in 32 bits
    (`register_module_override(..., {"optim_bits": 32})`). The two 256-entry fp32 quantization
    maps (`qmap1` / `qmap2`, shared by every 8-bit parameter) are moved to the device once."""
    total = 2 * ex.rounded(256 * ex.FP32)
    for i, shape in enumerate(shapes):
        numel = ex.count([shape])
        if i < embeddings or numel < 4096:
            total += 2 * ex.rounded(numel * ex.FP32)
        else:
            total += 2 * ex.rounded(numel) + 2 * ex.rounded(-(-numel // 256) * ex.FP32)
    return total


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_adafactor_factored_state(clm_files):
    est = run_clm(clm_files, "--optim", "adafactor")
    # before the fix in capture/phases.py the factored moments (made on the host, then moved:
    # `torch.zeros(shape[:-1]).to(grad)`) were counted as input, not optimizer state
    assert_training(est, params=GPT2_PARAMS, optimizer_state=adafactor_state(GPT2_SHAPES))


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "bitsandbytes")
def test_trainer_adamw_bnb_8bit_state(clm_files):
    est = run_clm(clm_files, "--optim", "adamw_bnb_8bit")
    state = bnb_adamw8bit_state(GPT2_SHAPES, embeddings=2)  # wte, wpe
    assert_training(est, params=GPT2_PARAMS, optimizer_state=state)


# Trainer: evaluation during training, torch.compile ----------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_eval_strategy_steps_interleaves_evaluations(clm_run):
    est = clm_run(*FP16_WITH_EVAL)
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW_STATE)
    assert est.data["phases_ran"][:4] == ["training", "eval", "training", "eval"], est.data["phases_ran"]


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_trainer_torch_compile_runs_eagerly_with_a_note(clm_run):
    est = clm_run(*BF16_WITH_COMPILE)
    assert_training(est, params=GPT2_PARAMS, optimizer_state=FUSED_ADAMW_STATE)
    notes = est.data["notes"]
    assert any(note.startswith("torch.compile was not applied: GPT2LMHeadModel ran eagerly")
               for note in notes), notes


# Trainer: DeepSpeed ZeRO-2 in one process ------------------------------------------------------

ZERO2_CONFIG = {
    # transformers' docs (DeepSpeed, ZeRO-2 example), "auto" filled in by the Trainer
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

NOTEBOOK_WORLD = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                  "MASTER_PORT": "29511"}
"""What transformers' docs have a single-process run (a notebook, no launcher) set before the
Trainer with `deepspeed=`."""


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "deepspeed")
def test_trainer_deepspeed_zero2_single_process(clm_files, tmp_path, monkeypatch):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(ZERO2_CONFIG))
    for name, value in NOTEBOOK_WORLD.items():
        monkeypatch.setenv(name, value)
    est = run_clm(clm_files, "--deepspeed", str(config), in_child=True)  # DeepSpeed's world from the env
    # ZeRO-2 flattens the fp32 weights into one buffer (the model's parameters become views of
    # it) and keeps the optimizer's fp32 partition beside it (one rank: all of it); DeepSpeed's
    # FusedAdam keeps two moments of that partition; the gradients are reduced into a flat
    # partition too. Before capture/deepspeed_ops.py FusedAdam's CUDA op had to be compiled
    # (CUDA_HOME is not set), and before the all-gather fix in capture/fake_distributed.py the
    # evaluation's pad_across_processes padded to size 0.
    flat = ex.rounded(ex.count(GPT2_SHAPES) * ex.FP32)
    assert_training(est, params=2 * flat, optimizer_state=2 * flat, grads=flat)
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
    notes = est.data["notes"]
    # DeepSpeed compiles its Muon update at import; nothing ran it
    assert not any(note.startswith("torch.compile was not applied") for note in notes), notes


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "deepspeed")
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is not None, reason="mpi4py is installed")
def test_trainer_deepspeed_without_a_launcher_fails_in_one_line(clm_files, tmp_path, monkeypatch):
    """No RANK / WORLD_SIZE and no launcher: DeepSpeed discovers its world through MPI, as it
    would on the GPU machine; without mpi4py the job fails there, and here with one line."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(ZERO2_CONFIG))
    for name in (*NOTEBOOK_WORLD, "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    est = run_clm(clm_files, "--deepspeed", str(config), in_child=True)  # DeepSpeed's world from the env
    assert est.returncode != 0
    message = est.data["error"]["message"]
    assert "\n" not in message and "No module named 'mpi4py'" in message, message


# peft with the Trainer: QLoRA, LoRA, prompt tuning, IA3 -------------------------------------------

LLAMA_SHAPES = ex.llama_shapes(**ex.TINY_LLAMA)
LLAMA_PARAMS = ex.device_bytes(LLAMA_SHAPES, ex.FP32)
LORA_ADAPTERS = ex.device_bytes(ex.lora_shapes(8, **ex.TINY_LLAMA), ex.FP32)
"""r=8 on q_proj and v_proj (hf_peft_qlora_trainer.py's defaults)."""


def run_peft(checkpoint: Path, train: Path, out: Path, method: str, *flags: str):
    write_tokenizer(checkpoint)  # the fixture's tiny Llama, with the word-level tokenizer
    return estimate_here(
        "hf_peft_qlora_trainer.py", "--model_name_or_path", str(checkpoint), "--train_file", str(train),
        "--method", method, "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--max_steps", "3", "--max_train_samples", "40", "--report_to", "none", "--seed", "0",
        "--output_dir", str(out), *flags,
    )


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "peft", "bitsandbytes")
def test_qlora_4bit_base_with_paged_8bit_adamw(llama_checkpoint, clm_files, tmp_path):
    est = run_peft(llama_checkpoint, clm_files["train"], tmp_path / "out", "qlora", "--fp16",
                   "--optim", "paged_adamw_8bit")
    # the Linear layers' weights are NF4, two values a byte (bitsandbytes' Params4bit); the
    # embeddings, norms and lm_head are cast to fp32 by prepare_model_for_kbit_training; only
    # the adapters train, and each is under bitsandbytes' 4096-value minimum for 8-bit state
    # (two fp32 moments)
    hidden, inter, kv = ex.TINY_LLAMA["hidden"], ex.TINY_LLAMA["intermediate"], 32
    packed = ex.TINY_LLAMA["layers"] * (2 * hidden * hidden + 2 * kv * hidden + 3 * inter * hidden) // 2
    quantized = {(hidden, hidden), (kv, hidden), (inter, hidden), (hidden, inter)}
    kept = ex.device_bytes([s for s in LLAMA_SHAPES if s not in quantized], ex.FP32)
    assert_training(est, params=est.breakdown.get("parameter", 0), grads=LORA_ADAPTERS,
                    optimizer_state=2 * LORA_ADAPTERS)
    params = est.breakdown["parameter"]
    assert kept + LORA_ADAPTERS + packed <= params <= kept + LORA_ADAPTERS + 2 * packed, est.breakdown
    assert params < LLAMA_PARAMS  # the 4-bit weights are counted at their packed size
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "peft")
@pytest.mark.parametrize(("method", "trained"), [
    ("lora", ex.lora_shapes(8, **ex.TINY_LLAMA)),
    ("prompt_tuning", [(8, ex.TINY_LLAMA["hidden"])]),  # 8 virtual tokens x hidden
    # IA3: a (out, 1) scale on k_proj and v_proj, a (1, in) scale on the feed-forward down_proj
    ("ia3", [(32, 1), (32, 1), (1, ex.TINY_LLAMA["intermediate"])] * ex.TINY_LLAMA["layers"]),
])
def test_peft_methods_with_the_trainer_train_only_their_weights(llama_checkpoint, clm_files, tmp_path,
                                                               method, trained):
    est = run_peft(llama_checkpoint, clm_files["train"], tmp_path / "out", method)
    adapters = ex.device_bytes(trained, ex.FP32)
    assert_training(est, params=LLAMA_PARAMS + adapters, grads=adapters,
                    optimizer_state=2 * adapters + fused_steps(trained))


# DPO by hand (TRL's loss, reference model under no_grad) ------------------------------------------

@pytest.mark.slow
@needs("transformers")
def test_dpo_hand_loop_policy_and_frozen_reference(llama_checkpoint, tmp_path):
    write_tokenizer(llama_checkpoint)
    rows = zip(sentences(16, 7), sentences(16, 8), sentences(16, 9), strict=True)
    train = tmp_path / "preferences.jsonl"
    train.write_text("\n".join(json.dumps({"prompt": p[:40], "chosen": c[:50], "rejected": r[:50]})
                               for p, c, r in rows) + "\n")
    est = estimate_here("hf_dpo_hand_loop.py", "--model_name_or_path", str(llama_checkpoint),
                        "--train_file", str(train), "--max_steps", "3")
    # two copies of the weights on the device (policy and reference), gradients and AdamW's two
    # moments for the policy only
    assert_training(est, params=2 * LLAMA_PARAMS, grads=LLAMA_PARAMS, optimizer_state=2 * LLAMA_PARAMS)
    assert est.data["steps"] == 3


# run_summarization.py: Seq2SeqTrainer with predict_with_generate ---------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_summarization_seq2seq_trainer_predict_with_generate(tmp_path):
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
        "--val_max_target_length", "8", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_steps", "3", "--do_train", "--do_eval",
        "--predict_with_generate", "--report_to", "none", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    shapes = t5_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    # the evaluation generates (Seq2SeqTrainer.prediction_step -> model.generate) after training
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_ner_no_trainer.py -------------------------------------------------------------------------------

NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_ner_no_trainer_token_classification(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "bert", TINY_BERT_CONFIG))
    files = {}
    for split, n, seed in (("train", 24, 2), ("validation", 8, 3)):
        rng = random.Random(seed)
        files[split] = tmp_path / f"{split}.json"
        files[split].write_text("\n".join(
            json.dumps({"tokens": s.split(), "ner_tags": [rng.choice(NER_TAGS) for _ in s.split()]})
            for s in sentences(n, seed)) + "\n")
    est = estimate_here(
        "hf_ex_run_ner_no_trainer.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--max_length", "32", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--num_train_epochs", "1", "--seed", "0", "--output_dir", str(tmp_path / "out"),
    )
    # BertForTokenClassification: no pooler, a Linear head over the 5 tags read from the data
    params = ex.device_bytes(bert_shapes(**TINY_BERT) + ex.linear(len(NER_TAGS), 64), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_swag_no_trainer.py ------------------------------------------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_swag_no_trainer_multiple_choice(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "bert", TINY_BERT_CONFIG))
    files = {}
    for split, n, seed in (("train", 24, 2), ("validation", 8, 3)):
        columns = [sentences(n, seed + k) for k in range(6)]
        files[split] = tmp_path / f"{split}.csv"
        with files[split].open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"])
            writer.writerows([column[i][:50] for column in columns] + [i % 4] for i in range(n))
    est = estimate_here(
        "hf_ex_run_swag_no_trainer.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--max_seq_length", "48", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    # BertForMultipleChoice: the pooler and a one-logit Linear head (4 choices per example)
    params = ex.device_bytes(bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.linear(1, 64), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_image_classification.py (Trainer) ------------------------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets", "PIL", "torchvision")
def test_run_image_classification_trainer_vit_image_folder(tmp_path):
    model = write_checkpoint(tmp_path / "vit", TINY_VIT_CONFIG)
    (model / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    }))
    train = write_image_folder(tmp_path / "train", 12, seed=0)
    valid = write_image_folder(tmp_path / "valid", 4, seed=1)
    est = estimate_here(
        "hf_ex_run_image_classification.py", "--model_name_or_path", str(model),
        "--train_dir", str(train), "--validation_dir", str(valid), "--do_train", "--do_eval",
        "--remove_unused_columns", "False", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_steps", "2",
        "--report_to", "none", "--seed", "0", "--output_dir", str(tmp_path / "out"),
    )
    shapes = vit_classifier_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_qa_no_trainer.py --------------------------------------------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_qa_no_trainer_extractive_question_answering(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "bert", TINY_BERT_CONFIG))
    files = {}
    for split, n, seed in (("train", 16, 2), ("validation", 6, 3)):
        rng, rows = random.Random(seed), []
        for i, (question, context) in enumerate(zip(sentences(n, seed), sentences(n, seed + 1), strict=True)):
            context = context + " " + " ".join(sentences(2, seed + i + 5))  # longer than a window
            answer = rng.choice(context.split())
            rows.append(json.dumps({"id": f"{split}{i}", "question": question[:30], "context": context,
                                    "answers": {"text": [answer], "answer_start": [context.index(answer)]}}))
        files[split] = tmp_path / f"{split}.json"
        files[split].write_text("\n".join(rows) + "\n")
    est = estimate_here(
        "hf_ex_run_qa_no_trainer.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--max_seq_length", "48", "--doc_stride", "16", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    # BertForQuestionAnswering: no pooler, a Linear(hidden, 2) span head (start / end logits)
    params = ex.device_bytes(bert_shapes(**TINY_BERT) + ex.linear(2, 64), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    # the evaluation pads its logits across processes and post-processes them on the host
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]


# run_translation_no_trainer.py -----------------------------------------------------------------------

@pytest.mark.slow
@needs("transformers", "accelerate", "datasets")
def test_run_translation_no_trainer_t5_generates_in_evaluation(tmp_path):
    model = write_tokenizer(write_config(tmp_path / "t5", TINY_T5_CONFIG))
    files = {}
    for split, n, seed in (("train", 32, 4), ("validation", 8, 5)):
        files[split] = tmp_path / f"{split}.json"
        pairs = zip(sentences(n, seed), sentences(n, seed + 10), strict=True)
        files[split].write_text("\n".join(json.dumps({"translation": {"en": en, "ro": ro[:60]}})
                                          for en, ro in pairs) + "\n")
    est = estimate_here(
        "hf_ex_run_translation_no_trainer.py", "--config_name", str(model), "--tokenizer_name", str(model),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--source_lang", "en", "--target_lang", "ro", "--source_prefix", "translate English to Romanian: ",
        "--max_source_length", "32", "--max_target_length", "16", "--val_max_target_length", "8",
        "--num_beams", "1", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--num_train_epochs", "1", "--seed", "0",
        "--output_dir", str(tmp_path / "out"),
    )
    params = ex.device_bytes(t5_shapes(), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    notes = est.data["notes"]
    assert any("accumulation window 2" in note for note in notes), notes
    assert est.data["phases_ran"] == ["training", "eval"], est.data["phases_ran"]
