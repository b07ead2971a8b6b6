"""Round 20a: Hugging Face / Lightning ecosystem training scripts not covered before, re-created
in their upstream structure (scripts/r20a_*.py; each docstring names the upstream file and
version) and run unmodified on tiny local models and data (no network). Parameter, gradient and
optimizer bytes are worked out by hand from the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, estimate_here, job_env
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_BERT,
    TINY_BERT_CONFIG,
    TINY_GPT2_CONFIG,
    VOCAB,
    bert_shapes,
    sentences,
    write_checkpoint,
)
from tests.library_jobs.test_library_jobs_r4 import BERT_MRPC_SHAPES, write_mrpc_dir
from tests.library_jobs.test_library_jobs_r19a import (  # noqa: F401 - own_datasets_cache: a fixture
    _jsonl,
    _notes,
    own_datasets_cache,
)

pytestmark = pytest.mark.slow

GPT2_SHAPES = ex.gpt2_shapes(**ex.TINY_GPT2)
GPT2_PARAMS = ex.device_bytes(GPT2_SHAPES, ex.FP32)


# TRL: examples/scripts/cpo.py, examples/scripts/orpo.py (trl.experimental in 1.x) ---------------

@pytest.fixture(scope="module")
def preference_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny GPT-2 as GPT2LMHeadModel with its word-level tokenizer, a paired preference set
    in the standard (string) format (prompt, chosen, rejected), and a text set for SFT."""
    root = tmp_path_factory.mktemp("trl20")
    model = write_checkpoint(root / "gpt2", TINY_GPT2_CONFIG)
    # saved as the base GPT2Model: TRL's trainers given the path build what config.json names
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    rows = zip(sentences(24, 1), sentences(24, 2), sentences(24, 3), strict=True)
    _jsonl(root / "pairs" / "train.jsonl",
           [{"prompt": p[:30], "chosen": c[:40], "rejected": r[:40]} for p, c, r in rows])
    _jsonl(root / "sft" / "train.jsonl", [{"text": s} for s in sentences(40, 9)])
    return {"root": root, "model": model, "pairs": root / "pairs", "sft": root / "sft"}


@needs("trl", "peft", "datasets")
def test_trl_cpo_reference_free_full_model(preference_files):
    out = preference_files["root"] / "out" / "cpo"
    est = estimate_here("r20a_trl_cpo.py", "--dataset_name", str(preference_files["pairs"]),
                        "--model_name_or_path", str(preference_files["model"]),
                        "--per_device_train_batch_size", "4", "--max_steps", "3",
                        "--max_length", "48", "--logging_first_step", "--report_to", "none",
                        "--no_remove_unused_columns", "--output_dir", str(out),
                        cwd=preference_files["root"])
    # CPO is reference-free: one fp32 GPT-2 (no frozen copy, unlike DPO / KTO), its gradients
    # and the Trainer's fused AdamW (two moments and a device `step` per tensor)
    assert_training(est, params=GPT2_PARAMS, optimizer_state=2 * GPT2_PARAMS + fused_steps(GPT2_SHAPES))
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    # 24 pairs in batches of 4; each batch runs chosen and rejected through the one model
    assert "DataLoader epoch of 6 batches" in _notes(est)
    assert "checkpoint-3/optimizer.pt" in _notes(est) and "cpo/model.safetensors" in _notes(est)


@needs("trl", "peft", "datasets")
def test_trl_orpo_peft_rmsprop_readme_command(preference_files):
    """The README's peft command: `--use_peft --lora_r 16 --lora_alpha 16 --optim rmsprop`."""
    out = preference_files["root"] / "out" / "orpo"
    est = estimate_here("r20a_trl_orpo.py", "--dataset_name", str(preference_files["pairs"]),
                        "--model_name_or_path", str(preference_files["model"]),
                        "--per_device_train_batch_size", "4", "--max_steps", "3",
                        "--learning_rate", "8e-5", "--max_length", "48", "--optim", "rmsprop",
                        "--logging_first_step", "--report_to", "none", "--no_remove_unused_columns",
                        "--use_peft", "--lora_r", "16", "--lora_alpha", "16",
                        "--output_dir", str(out), cwd=preference_files["root"])
    # peft's default target for GPT-2 is c_attn (Conv1D 64 -> 192): A is r x 64, B is 192 x r
    embd, layers, rank = ex.TINY_GPT2["embd"], ex.TINY_GPT2["layers"], 16
    lora = ex.device_bytes(layers * [(rank, embd), (3 * embd, rank)], ex.FP32)
    # torch.optim.RMSprop: one `square_avg` per adapter tensor (its `step` on the host)
    assert_training(est, params=GPT2_PARAMS + lora, grads=lora, optimizer_state=lora)
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    assert "DataLoader epoch of 6 batches" in _notes(est)
    assert "orpo/adapter_model.safetensors" in _notes(est)


# peft: examples/sequence_classification/peft_no_lora_accelerate.py --------------------------------

PROMPT_ENCODERS = {
    # PromptEncoderConfig (reparameterization "MLP"): the virtual tokens' embedding (10 x 64)
    # and a 64 -> 128 -> 128 -> 64 MLP (encoder_hidden_size 128)
    "p_tuning": [(10, 64), *ex.linear(128, 64), *ex.linear(128, 128), *ex.linear(64, 128)],
    # PromptTuningConfig: the virtual tokens' embedding alone (--peft_type prefix_tuning fails
    # on BERT with transformers 5, with or without peakmem: "Model does not support past key
    # values which are required for prefix tuning")
    "prompt_tuning": [(10, 64)],
}


@needs("peft", "accelerate", "datasets")
@pytest.mark.parametrize("peft_type", sorted(PROMPT_ENCODERS))
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_no_lora_accelerate_prompt_methods(tmp_path, peft_type):
    est = estimate_here("r4_hand_metric.py", "r20a_peft_no_lora_accelerate.py", "--model_name_or_path",
                        "bert-base-cased", "--peft_type", peft_type, "--num_virtual_tokens", "10",
                        "--num_train_epochs", "1", "--output_dir", "out", cwd=write_mrpc_dir(tmp_path),
                        timeout=300)
    # task_type SEQ_CLS: peft keeps the classifier trainable as a copy next to the frozen
    # original (modules_to_save); the base BERT is frozen
    trainable = PROMPT_ENCODERS[peft_type] + ex.linear(2, 64)
    adapters = ex.device_bytes(trainable, ex.FP32)
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32) + adapters
    # torch.optim.AdamW over model.parameters(): moments only where a gradient came (the frozen
    # tensors have none), `step` on the host
    assert_training(est, params=params, grads=adapters, optimizer_state=2 * adapters)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 40 MRPC rows in batches of 8: 5 a epoch, traced 3 and the last; one gathered evaluation
    assert est.data["steps"] == 4 and est.data["phases_ran"] == ["training", "eval"]
    assert "DataLoader epoch of 5 batches" in _notes(est)
    assert "epoch 0: {'accuracy'" in est.stderr and "out/adapter_model.safetensors" in _notes(est)


# Lightning: examples/fabric/reinforcement_learning/train_fabric.py (+ rl/) -------------------------

@needs("lightning", "gymnasium", "torchmetrics", "tensorboard")
def test_fabric_ppo_cartpole_rollouts_on_the_device(tmp_path):
    """`python train_fabric.py` (Fabric's "auto" accelerator: the one CUDA device), a short run:
    2 updates of 16 steps x 2 CartPole envs, 2 PPO epochs of 2 minibatches each. The loop has
    no DataLoader: `--steps all` runs it to its end, the greedy test episode included."""
    est = estimate_here("r20a_fabric_rl/train_fabric.py", "--num-steps", "16", "--total-timesteps", "64",
                        "--update-epochs", "2", "--per-rank-batch-size", "16", cwd=tmp_path,
                        flags=("--steps", "all"))
    # actor and critic: 4 -> 64 -> 64 -> {2 actions, 1 value}, fp32; Adam (not fused, `step` on
    # the host): two moments per tensor
    shapes = 2 * (ex.linear(64, 4) + ex.linear(64, 64)) + ex.linear(2, 64) + ex.linear(1, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params)
    # 64 timesteps / (16 steps x 2 envs) = 2 updates x 2 epochs x 32 samples / 16 a minibatch
    assert est.data["steps"] == 8 and not est.data["stopped"]
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the five MeanMetric members' states (mean_value and weight, fp64 in torchmetrics 1.x,
    # one block each) and the six rollout buffers stay on the device
    assert est.breakdown["other"] >= 10 * ex.BLOCK, est.breakdown
    assert list(tmp_path.glob("logs/fabric_logs/*/CartPole-v1_default_42_*/version_0/events.out.tfevents.*"))


# sentence-transformers: examples/sparse_encoder/training/nli/train_splade_nli.py -------------------

ALL_NLI_PAIR_SCORE_README = """---
configs:
- config_name: pair-score
  data_files:
  - split: train
    path: pair-score/train.jsonl
  - split: dev
    path: pair-score/dev.jsonl
---
"""


@needs("sentence_transformers", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_sentence_transformers_sparse_encoder_splade_nli(tmp_path):
    import random

    # "naver/splade-cocondenser-ensembledistil" as a local folder: the tiny BERT saved with a
    # ForMaskedLM architecture, which SparseEncoder loads as MLMTransformer + SpladePooling
    model = write_checkpoint(tmp_path / "naver" / "splade-cocondenser-ensembledistil", TINY_BERT_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (model / "config.json").write_text(json.dumps(config))
    rng = random.Random(0)
    nli = tmp_path / "sentence-transformers" / "all-nli"
    # the script selects the first 10,000 train and 1,000 dev rows
    for split, count, seed in (("train", 10000, 71), ("dev", 1000, 72)):
        rows = zip(sentences(count, seed), sentences(count, seed + 10), strict=True)
        _jsonl(nli / "pair-score" / f"{split}.jsonl",
               [{"sentence1": a[:40], "sentence2": b[:40], "score": rng.choice([0.0, 0.5, 1.0])} for a, b in rows])
    (nli / "README.md").write_text(ALL_NLI_PAIR_SCORE_README)
    for split, count, seed in (("validation", 16, 73), ("test", 16, 74)):
        _jsonl(tmp_path / "sentence-transformers" / "stsb" / f"{split}.jsonl",
               [{"sentence1": a[:40], "sentence2": b[:40], "score": round(rng.random(), 2)}
                for a, b in zip(sentences(count, seed), sentences(count, seed + 10), strict=True)])
    est = estimate_here("r20a_st_train_splade_nli.py", cwd=tmp_path, timeout=300)
    # BertForMaskedLM (no pooler): the MLM head's transform (dense + LayerNorm) and its output
    # bias; the decoder weight is the tied word embedding. fp32 weights under bf16 autocast,
    # the Trainer's fused AdamW
    shapes = bert_shapes(**TINY_BERT) + ex.linear(64, 64) + ex.norm(64) + [(VOCAB,)]
    params = ex.device_bytes(shapes, ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the STSb evaluator encodes with `embeddings.to_sparse()` on the device, then `.cpu()`:
    # a COO tensor of every value (the bound; cuda_rules/sparse.py) read back on the host.
    # 10,000 pairs in batches of 16: shortened after a few steps, the evaluators after training
    assert est.data["steps"] >= 3 and est.data["phases_ran"] == ["training", "eval"]
    assert any(line.startswith("data-dependent sizes (aten::to_sparse x")
               for line in est.data["assumptions"]), est.data["assumptions"]
    assert "final/model.safetensors" in _notes(est), _notes(est)


# TRL's CLI: `trl sft ARGS` (trl/cli: accelerate launch of trl/scripts/sft.py) -------------------

@needs("trl", "peft", "datasets")
def test_trl_sft_cli_two_processes(preference_files):
    """`trl sft --num_processes 2 ...` as TRL's docs run it, spelled `python -m trl.cli.main`
    (the console script's module: no PATH lookup): peakmem reads it as `accelerate launch
    --num_processes 2 trl/scripts/sft.py ...` (jobs/launchers.py `trl`)."""
    root = preference_files["root"]
    command = [sys.executable, "-m", "peakmem", "estimate", "--json", "--timeout", "300", "--",
               sys.executable, "-m", "trl.cli.main", "sft", "--model_name_or_path",
               str(preference_files["model"]), "--dataset_name", str(preference_files["sft"]),
               "--max_steps", "3", "--per_device_train_batch_size", "8", "--max_length", "64",
               "--num_processes", "2", "--report_to", "none", "--output_dir", str(root / "out" / "sft")]
    done = subprocess.run(command, capture_output=True, text=True, env=job_env(), timeout=420,
                          cwd=root)
    est = JobEstimate(done.returncode, json.loads(done.stdout or "{}"), done.stderr, 0)
    # the full GPT-2 (no --use_peft), fused AdamW; DDP's gradient buckets as communication
    assert_training(est, params=GPT2_PARAMS, optimizer_state=2 * GPT2_PARAMS + fused_steps(GPT2_SHAPES),
                    extra_upper=GPT2_PARAMS)
    assert est.data["launcher"] == "trl" and est.data["world_size"] == 2
    assert est.breakdown.get("communication", 0) > 0, est.breakdown
    assert est.data["steps"] == 3 and est.data["mode"] == "fake", est.data["mode_reason"]
    assert "trl/scripts/sft.py under accelerate launch" in _notes(est)
    assert "Training completed" in est.stderr


# accelerate: examples/by_feature/ddp_comm_hook.py under two processes -----------------------------

@needs("transformers", "accelerate", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_accelerate_ddp_comm_hook_power_sgd_two_processes(tmp_path):
    """`accelerate launch --num_processes 2 ddp_comm_hook.py --mixed_precision fp16
    --ddp_comm_hook power_sgd`: c10d's Reducer calls the registered hook with each bucket
    (PowerSGDState, an all-reduce future and its `.then`) over the fake process group."""
    est = estimate("r4_hand_metric.py", "r20a_accelerate_ddp_comm_hook.py", "--mixed_precision", "fp16",
                   "--ddp_comm_hook", "power_sgd", cwd=write_mrpc_dir(tmp_path), timeout=300,
                   launcher=("accelerate", "launch", "--num_processes", "2"))
    params = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
    # torch.optim.AdamW (foreach): two moments per parameter, `step`s on the host. PowerSGD
    # compresses only from its start_powerSGD_iter (1,000 by default, accelerate passes no
    # state options): until then each bucket is all-reduced as it is, so no low-rank P / Q
    # or error-feedback tensors in these steps, as on a GPU
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=params)  # DDP's gradient buckets
    assert est.data["launcher"] == "accelerate" and est.data["world_size"] == 2
    assert 0 < est.breakdown.get("communication", 0) <= params, est.breakdown
    # 40 rows over two ranks in batches of 16: 2 a rank's epoch; each epoch's evaluation
    assert est.data["steps"] == 5 and est.data["phases_ran"] == ["training", "eval"] * 3
    assert est.data["libraries"].get("nccl", 0) > 0 and "grad_scaler" in est.data["libraries"]
    assert est.data["mode"] == "fake", est.data["mode_reason"]
