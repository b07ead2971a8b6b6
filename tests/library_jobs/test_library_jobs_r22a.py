"""Round 22a: fine-tuning recipes not covered before: TRL 1.x's on-policy distillation script as
installed (`python -m trl.scripts.distillation`, unmodified), TRL's online DPO and GKD examples
re-created in their trl 1.x structure, and two peft task guides (LoHa / LoKr on a ViT with the
Trainer; prefix tuning of T5 in a hand loop), on tiny local models and data (no network).
Parameter, gradient and optimizer bytes are worked out by hand from the configs (expected.py),
not read from peakmem.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs
from tests.library_jobs.test_library_jobs_hf import (
    TINY_GPT2_CONFIG,
    TINY_T5_CONFIG,
    TINY_VIT_CONFIG,
    sentences,
    t5_shapes,
    vit_classifier_shapes,
    write_checkpoint,
    write_image_folder,
)
from tests.library_jobs.test_library_jobs_r19a import (  # noqa: F401 - own_datasets_cache: a fixture
    PHRASEBANK_README,
    _jsonl,
    _notes,
    own_datasets_cache,
)

pytestmark = pytest.mark.slow

GPT2_SHAPES = ex.gpt2_shapes(**ex.TINY_GPT2)
GPT2 = ex.device_bytes(GPT2_SHAPES, ex.FP32)
FUSED_ADAMW = 2 * GPT2 + fused_steps(GPT2_SHAPES)
"""The Trainer's default on CUDA, adamw_torch_fused: two fp32 moments and a 0-d device `step`
per tensor."""
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + ' </s> ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def trl_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny GPT-2 as GPT2LMHeadModel with its word-level tokenizer (and a chat template, as
    instruct checkpoints have), the same weights as a 1-label GPT2ForSequenceClassification
    reward model (pad token 0, which GPT-2's classifier needs to find each row's last token),
    prompt-only rows (standard), and conversational rows (prompt + messages) for GKD."""
    root = tmp_path_factory.mktemp("trl22")
    model = write_checkpoint(root / "gpt2", TINY_GPT2_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]  # saved as the base GPT2Model
    (model / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "chat_template": CHAT_TEMPLATE}))
    reward = shutil.copytree(model, root / "rm")
    (reward / "config.json").write_text(json.dumps({
        **config, "architectures": ["GPT2ForSequenceClassification"], "num_labels": 1, "pad_token_id": 0}))
    prompts = sentences(16, 5)
    _jsonl(root / "prompts" / "train.jsonl", [{"prompt": p[:30]} for p in prompts])
    chats = []
    for prompt, answer in zip(prompts, sentences(16, 6), strict=True):
        user = [{"role": "user", "content": prompt[:30]}]
        chats.append({"prompt": user, "messages": [*user, {"role": "assistant", "content": answer[:40]}]})
    _jsonl(root / "chat" / "train.jsonl", chats)
    return {"root": root, "model": model, "reward": reward, "prompts": root / "prompts", "chat": root / "chat"}


# TRL: trl/scripts/distillation.py (installed with trl 1.16, run as it is) --------------------------

DISTILLATION_LORA_RANK = 32
DISTILLATION_COMMANDS = {
    # the script docstring's two commands: full training, and LoRA (r 32, alpha 16)
    "full": (),
    "lora": ("--use_peft", "--lora_r", str(DISTILLATION_LORA_RANK), "--lora_alpha", "16"),
}


@needs("trl", "peft", "datasets")
@pytest.mark.parametrize("command", sorted(DISTILLATION_COMMANDS))
def test_trl_distillation_script_chunked_divergence_buffers(trl_files, command):
    """`python -m trl.scripts.distillation`: the student generates its completions (on-policy),
    the teacher scores them, and the generalized JSD runs through trl's ChunkedDivergenceFunction."""
    est = estimate_here("-m", "trl.scripts.distillation", "--model_name_or_path", str(trl_files["model"]),
                        "--teacher_model_name_or_path", str(trl_files["model"]),
                        "--dataset_name", str(trl_files["prompts"]), "--per_device_train_batch_size", "4",
                        "--max_completion_length", "8", "--max_steps", "3", "--report_to", "none",
                        *DISTILLATION_COMMANDS[command],
                        "--output_dir", str(trl_files["root"] / "out" / f"distillation-{command}"),
                        cwd=trl_files["root"], timeout=300)
    # student and teacher, both fp32 (DistillationTrainer loads a path as float32 unless told)
    if command == "full":
        # the student trains whole
        assert_training(est, params=2 * GPT2, grads=GPT2, optimizer_state=FUSED_ADAMW)
        saved = "distillation-full/model.safetensors"
    else:
        # peft's default target for GPT-2 is c_attn (Conv1D 64 -> 192): A is r x 64, B 192 x r
        embd, rank = ex.TINY_GPT2["embd"], DISTILLATION_LORA_RANK
        lora_shapes = ex.TINY_GPT2["layers"] * [(rank, embd), (3 * embd, rank)]
        lora = ex.device_bytes(lora_shapes, ex.FP32)
        assert_training(est, params=2 * GPT2 + lora, grads=lora,
                        optimizer_state=2 * lora + fused_steps(lora_shapes))
        saved = "distillation-lora/adapter_model.safetensors"
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training"]
    # fake values never sample eos: every completion runs to max_completion_length
    assert "'completions/mean_length': '8'" in est.stderr
    # the chunked loss projects each token tile into two fp32 buffers of rows x VOCAB_CHUNK_SIZE
    # (32768 columns whatever the vocabulary: 256 here), rows = the 4 x 8 completion tokens;
    # both are live in its backward, where the peak is
    chunk_buffers = 2 * ex.rounded(4 * 8 * 32768 * ex.FP32)
    assert est.breakdown["temporary"] >= chunk_buffers, est.breakdown
    assert saved in _notes(est)


# TRL: examples/scripts/dpo_online.py (trl.experimental.online_dpo in 1.x) ---------------------------

@needs("trl", "peft", "datasets")
def test_trl_online_dpo_policy_reference_copy_and_reward_model(trl_files):
    est = estimate_here("r22a_trl_dpo_online.py", "--model_name_or_path", str(trl_files["model"]),
                        "--reward_model_path", str(trl_files["reward"]),
                        "--dataset_name", str(trl_files["prompts"]), "--per_device_train_batch_size", "4",
                        "--max_new_tokens", "16", "--max_length", "48", "--max_steps", "3",
                        "--report_to", "none", "--output_dir", str(trl_files["root"] / "out" / "online_dpo"),
                        cwd=trl_files["root"], timeout=300)
    # the policy, the trainer's frozen reference copy of it (no ref_model passed, no peft) and
    # the reward model: GPT2Model (the LM head is tied: no tensor of its own) plus its 1 x 64
    # `score` head without bias
    reward_model = GPT2 + ex.device_bytes([(1, ex.TINY_GPT2["embd"])], ex.FP32)
    assert_training(est, params=2 * GPT2 + reward_model, grads=GPT2, optimizer_state=FUSED_ADAMW)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training"]
    assert "online_dpo/model.safetensors" in _notes(est)


# TRL: examples/scripts/gkd.py (trl.experimental.gkd in 1.x) -----------------------------------------

@needs("trl", "peft", "datasets")
def test_trl_gkd_student_and_teacher_from_paths(trl_files):
    est = estimate_here("r22a_trl_gkd.py", "--model_name_or_path", str(trl_files["model"]),
                        "--teacher_model_name_or_path", str(trl_files["model"]),
                        "--dataset_name", str(trl_files["chat"]), "--per_device_train_batch_size", "4",
                        "--max_new_tokens", "16", "--max_length", "48", "--max_steps", "3",
                        "--gradient_checkpointing", "--report_to", "none",
                        "--output_dir", str(trl_files["root"] / "out" / "gkd"),
                        cwd=trl_files["root"], timeout=300)
    # the student (trained) and the teacher (frozen), both built by the trainer from the paths
    # with the script's model_init_kwargs (dtype None: fp32)
    assert_training(est, params=2 * GPT2, grads=GPT2, optimizer_state=FUSED_ADAMW)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training"]
    assert "gkd/model.safetensors" in _notes(est)


# peft: docs/source/task_guides/lora_based_methods.md (LoHa, LoKr tabs) --------------------------------

HIDDEN, LAYERS, RANK = 64, 2, 16
# each targeted projection (q_proj, v_proj: 64 -> 64) of both layers
ADAPTERS = {
    # LoHa: hada_w1_a, hada_w2_a (out x r) and hada_w1_b, hada_w2_b (r x in)
    "loha": LAYERS * 2 * [(HIDDEN, RANK), (RANK, HIDDEN), (HIDDEN, RANK), (RANK, HIDDEN)],
    # LoKr: 64 factorizes as 8 x 8 on both sides; w1 is always a full 8 x 8 (decompose_both
    # False), and w2 is full too since r = 16 is not below max(8, 8) / 2
    "lokr": LAYERS * 2 * [(8, 8), (8, 8)],
}
TRAINABLE = {"loha": "trainable params: 16,514 ", "lokr": "trainable params: 642 "}


@pytest.fixture()
def food101_dir(tmp_path) -> Path:
    """The guide's names as local folders: "google/vit-base-patch16-224-in21k" (the tiny ViT,
    32 px) and "food101" (an image folder, two classes: 16 training and 8 validation images)."""
    model = write_checkpoint(tmp_path / "vit", TINY_VIT_CONFIG)
    (model / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    }))
    shutil.copytree(model, tmp_path / "google" / "vit-base-patch16-224-in21k")
    write_image_folder(tmp_path / "food101" / "train", 8, seed=0)
    write_image_folder(tmp_path / "food101" / "validation", 4, seed=1)
    return tmp_path


@needs("peft", "datasets", "PIL", "torchvision")
@pytest.mark.parametrize("method", sorted(ADAPTERS))
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_lora_based_methods_guide_vit_trainer(food101_dir, method):
    est = estimate_here("r22a_peft_lora_based_methods.py", method, cwd=food101_dir, timeout=300)
    # modules_to_save=["classifier"]: a trainable copy of the 2-class head beside the original
    trainable = ex.device_bytes(ADAPTERS[method] + ex.linear(2, HIDDEN), ex.FP32)
    assert TRAINABLE[method] in est.stderr
    tensors = len(ADAPTERS[method]) + 2
    # the Trainer's adamw_torch_fused over the adapters and the head copy (fp16 autocast)
    assert_training(est, params=ex.device_bytes(vit_classifier_shapes(), ex.FP32) + trainable,
                    grads=trainable, optimizer_state=2 * trainable + ex.BLOCK * tensors)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 16 images in one batch of 128 (4 accumulation steps: the epoch's end steps): one step an
    # epoch, each epoch evaluated and saved
    assert est.data["steps"] == 5 and est.data["phases_ran"] == 5 * ["training", "eval"]
    # 5 checkpoints (adapter and optimizer each), diverted: the note names the first three
    assert f"in21k-{method}/checkpoint-1/adapter_model.safetensors" in _notes(est)
    assert "(and 7 more)" in _notes(est)


# peft: docs/source/task_guides/seq2seq-prefix-tuning.md --------------------------------------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_prefix_tuning_t5_hand_loop_with_visible_devices_set(tmp_path):
    from datasets import ClassLabel, Dataset, Features, Value

    write_checkpoint(tmp_path / "t5-large", TINY_T5_CONFIG)
    features = Features({"sentence": Value("string"),
                         "label": ClassLabel(names=["negative", "neutral", "positive"])})
    data = tmp_path / "financial_phrasebank"
    (data / "sentences_allagree").mkdir(parents=True)
    (data / "README.md").write_text(PHRASEBANK_README)
    rows = sentences(40, 41)
    Dataset.from_dict({"sentence": rows, "label": [i % 3 for i in range(len(rows))]},
                      features=features).to_parquet(data / "sentences_allagree" / "train.parquet")
    est = estimate_here("r22a_peft_prefix_tuning_seq2seq.py", cwd=tmp_path, timeout=300)
    # PrefixEncoder without projection: one embedding of num_virtual_tokens x (num_layers x 2
    # (key, value) x d_model) = 20 x 256; T5 frozen
    prefix = ex.device_bytes([(20, 2 * 2 * 64)], ex.FP32)
    assert "trainable params: 5,120 " in est.stderr
    # torch.optim.AdamW(model.parameters()) (foreach): moments where a gradient came, `step`
    # on the host
    assert_training(est, params=ex.device_bytes(t5_shapes(), ex.FP32) + prefix, grads=prefix,
                    optimizer_state=2 * prefix)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # CUDA_VISIBLE_DEVICES="3" set by the script before its first CUDA call: the job's one
    # visible GPU is its cuda:0
    assert "device='cuda:0'" in est.stderr
    # 36 training rows in batches of 8: 5 a epoch; each of the 5 epochs evaluated
    assert "DataLoader epoch of 5 batches" in _notes(est)
    assert est.data["phases_ran"] == 5 * ["training", "eval"]
    assert "accuracy=" in est.stderr
