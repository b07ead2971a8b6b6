"""Round 21a: peft's sequence-classification notebooks not covered before (VeRA, IA3), re-created
as scripts in their upstream structure (scripts/r21a_*.py; each docstring names the upstream
file and what had to change for transformers 5 / peft 0.2x) and run unmodified on the tiny BERT
and a local GLUE MRPC, and peft's LoRA+ recipe (create_loraplus_optimizer handed to a Trainer)
on the tiny GPT-2 (no network). Parameter, gradient and optimizer bytes are worked out by
hand from the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate_here
from tests.library_jobs.test_library_jobs import assert_training, needs
from tests.library_jobs.test_library_jobs_hf import TINY_GPT2_CONFIG, sentences, write_checkpoint
from tests.library_jobs.test_library_jobs_r4 import BERT_MRPC_SHAPES, write_mrpc_dir
from tests.library_jobs.test_library_jobs_r19a import (  # noqa: F401 - own_datasets_cache: a fixture
    _notes,
    own_datasets_cache,
)

pytestmark = pytest.mark.slow

BERT_MRPC = ex.device_bytes(BERT_MRPC_SHAPES, ex.FP32)
HIDDEN, INTERMEDIATE, LAYERS = 64, 128, 2  # the tiny BERT (test_library_jobs_hf.TINY_BERT)
CLASSIFIER = ex.device_bytes(ex.linear(2, HIDDEN), ex.FP32)
"""modules_to_save: peft trains a copy of the 2-class head next to the frozen original."""
BERT_BUFFERS = ex.device_bytes([(1, 64), (1, 64)], 8)  # int64
"""BertEmbeddings' `position_ids` and `token_type_ids` buffers (max_position_embeddings 64)."""


def mrpc_dir_as(tmp_path: Path, name: str) -> Path:
    """The MRPC folder with the tiny BERT also under the checkpoint name the notebook hardcodes."""
    root = write_mrpc_dir(tmp_path)
    shutil.copytree(root / "bert-base-cased", root / name)
    return root


# peft: examples/sequence_classification/VeRA.ipynb ------------------------------------------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_vera_shared_projections_are_buffers_lambdas_train(tmp_path):
    est = estimate_here("r4_hand_metric.py", "r21a_peft_vera_seq_cls.py",
                        cwd=mrpc_dir_as(tmp_path, "roberta-base"), timeout=300)
    rank = 8
    # each targeted Linear (query 64 -> 64, value 64 -> 64, intermediate.dense 64 -> 128) trains
    # vera_lambda_b (out_features) and vera_lambda_d (r)
    lambdas = LAYERS * [(HIDDEN,), (rank,), (HIDDEN,), (rank,), (INTERMEDIATE,), (rank,)]
    trainable = ex.device_bytes(lambdas, ex.FP32) + CLASSIFIER
    # the shared frozen projections, sized by the largest in / out features among the targets:
    # vera_A r x 64, vera_B 128 x r; buffers (save_projection=True saves them with the adapter)
    projections = ex.device_bytes([(rank, HIDDEN), (INTERMEDIATE, rank)], ex.FP32)
    assert est.breakdown.get("buffer") == BERT_BUFFERS + projections, est.breakdown
    # AdamW over two name-picked groups (lambdas, classifier): two moments each, `step` on the host
    assert_training(est, params=BERT_MRPC + trainable, grads=trainable, optimizer_state=2 * trainable)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 40 rows in one batch of 128 a epoch: the notebook's 5 epochs, each with its evaluation
    assert est.data["steps"] == 5 and est.data["phases_ran"] == 5 * ["training", "eval"]
    assert "epoch 4: {'accuracy'" in est.stderr


# peft: examples/sequence_classification/IA3.ipynb -------------------------------------------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_ia3_scaling_vectors_train_with_adamw_over_all_parameters(tmp_path):
    est = estimate_here("r4_hand_metric.py", "r21a_peft_ia3_seq_cls.py",
                        cwd=mrpc_dir_as(tmp_path, "roberta-large"), timeout=300)
    # peft's BERT targets: key, value (ia3_l 64 x 1, scales the output) and "output.dense", a
    # feed-forward name that matches attention.output.dense (1 x 64) and output.dense (1 x 128):
    # those scale the input
    vectors = LAYERS * [(HIDDEN, 1), (HIDDEN, 1), (1, HIDDEN), (1, INTERMEDIATE)]
    trainable = ex.device_bytes(vectors, ex.FP32) + CLASSIFIER
    assert "trainable params: 770 " in est.stderr  # 2 x (3 x 64 + 128) + 2 x 64 + 2
    assert est.breakdown.get("buffer") == BERT_BUFFERS, est.breakdown
    # AdamW(model.parameters()): state only where a gradient came, `step` on the host
    assert_training(est, params=BERT_MRPC + trainable, grads=trainable, optimizer_state=2 * trainable)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 40 rows in batches of 8: 5 a epoch; the loop is cut short and each of the 20 epochs
    # still evaluates
    assert "DataLoader epoch of 5 batches" in _notes(est)
    assert est.data["phases_ran"] == 20 * ["training", "eval"]
    assert "epoch 19: {'accuracy'" in est.stderr


# peft: docs/source/developer_guides/lora.md, "LoRA+ optimized LoRA", with the Trainer ------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_loraplus_optimizer_handed_to_the_trainer(tmp_path):
    model = write_checkpoint(tmp_path / "gpt2", TINY_GPT2_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]  # saved as the base GPT2Model
    (model / "config.json").write_text(json.dumps(config))
    (tmp_path / "train.txt").write_text("\n".join(sentences(60)) + "\n")
    est = estimate_here("r21a_peft_loraplus_trainer.py", "--model_name_or_path", "gpt2",
                        "--train_file", "train.txt", "--output_dir", "out", "--max_steps", "3",
                        "--lora_r", "16", "--loraplus_lr_ratio", "16", cwd=tmp_path)
    # peft's default target for GPT-2 is c_attn (Conv1D 64 -> 192): A is r x 64, B is 192 x r
    embd, rank = ex.TINY_GPT2["embd"], 16
    lora = ex.device_bytes(ex.TINY_GPT2["layers"] * [(rank, embd), (3 * embd, rank)], ex.FP32)
    gpt2 = ex.device_bytes(ex.gpt2_shapes(**ex.TINY_GPT2), ex.FP32)
    # the Trainer keeps the optimizer it is given: torch.optim.AdamW (not fused, `step` on the
    # host), two moments per adapter tensor across LoRA+'s groups
    assert_training(est, params=gpt2 + lora, grads=lora, optimizer_state=2 * lora)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3 and est.data["phases_ran"] == ["training"]
    # the job's own print of the groups: lora_A at lr, no embedding adapters, lora_B at 16 x lr
    assert "LoRA+ groups: [(2, 5e-05), (0, 1e-06), (2, 0.0008), (0, 0.0008)]" in est.stderr
    assert "out/adapter_model.safetensors" in _notes(est)


# peft: examples/sequence_classification/RoAD.py (kept as upstream has it) ---------------------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_road_example_fails_as_the_job_on_transformers_5(tmp_path):
    """RoAD.py passes `max_length=None` to from_pretrained; transformers 5 hands it to the model's
    __init__. The estimate says so in one line, as the job's own error, after the data was
    prepared (the failure is the script's, not a capture gap)."""
    est = estimate_here("r4_hand_metric.py", "r21a_peft_road_seq_cls.py",
                        cwd=mrpc_dir_as(tmp_path, "roberta-large"), timeout=300)
    assert est.returncode != 0
    assert est.data["error"]["kind"] == "job_failed", est.data
    message = est.data["error"]["message"]
    assert "\n" not in message, message
    assert "TypeError" in message and "unexpected keyword argument 'max_length'" in message, message
    assert "r21a_peft_road_seq_cls.py" in est.data["error"]["traceback"]


# peft: examples/sequence_classification/FourierFT.ipynb ---------------------------------------------

@needs("peft", "datasets")
@pytest.mark.usefixtures("own_datasets_cache")
def test_peft_fourierft_spectra_train_and_the_delta_weight_is_built_each_forward(tmp_path):
    est = estimate_here("r4_hand_metric.py", "r21a_peft_fourierft_seq_cls.py",
                        cwd=mrpc_dir_as(tmp_path, "roberta-base"), timeout=300)
    assert est.returncode == 0, est.failure()
    # query and value of both layers train 1000 spectral coefficients each (fp32); the fixed
    # frequency `indices` are plain host tensors peft moves to the device in each forward
    spectra = ex.device_bytes(LAYERS * 2 * [(1000,)], ex.FP32)
    trainable = spectra + CLASSIFIER
    assert "trainable params: 4,130 " in est.stderr  # 4 x 1000 + 2 x 64 + 2
    assert est.breakdown.get("parameter") == BERT_MRPC + trainable, est.breakdown
    assert est.breakdown.get("buffer") == BERT_BUFFERS, est.breakdown
    # every trainable tensor's gradient and AdamW's two moments are live together at each step
    # after the first, so the peak is at least the model state
    model_state = BERT_MRPC + trainable + trainable + 2 * trainable
    assert model_state <= est.data["peak_allocated_bytes"] <= est.data["peak_reserved_bytes"]
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 40 rows in batches of 32 (32 + 8 a epoch): the notebook's 5 epochs, each evaluated
    assert est.data["phases_ran"] == 5 * ["training", "eval"]
    assert "epoch 4: {'accuracy'" in est.stderr
