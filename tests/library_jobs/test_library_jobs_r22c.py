"""Round 22c (a short round): scripts from the books and courses learners copy and run
unmodified, re-created in their upstream structure (read through the code search, written here;
each docstring names the upstream file and version) and run through the capture on tiny local
data; device bytes worked out by hand from the shapes (not read from peakmem):

- rasbt/LLMs-from-scratch ch05/01_main-chapter-code/gpt_train.py + previous_chapters.py
  (scripts/r22c_llms_ch05/): no command line, the 124M GPT in `__main__`, a greedy
  50-token sample after each epoch, the loss plot, `torch.save` + `torch.load`. Worked as it
  is; slow by default (the samples' forwards, each of a new length, are never replayed).
- rasbt/LLMs-from-scratch ch05/10_llm-training-speed/01_opt_single_gpu.py
  (scripts/r22c_llms_training_speed/): `torch.compile`, `.to(torch.bfloat16)` weights, fused
  AdamW, SDPA, CUDA-event timing, `memory_allocated` / `memory_reserved` prints. Worked as it
  is.

Found on the way: a job whose time limit expired while Python ran a weakref callback (the
capture's storage watches) lost the limit ("Exception ignored in": the one-shot alarm's
JobTimeout was printed and dropped) and ran on to its end. Fixed in general: the alarm repeats
until the job has ended (jobs/runner.py `time_limit`; tests/measure/test_runner.py). And the
Gutenberg job, run in this process after the main chapter's, imported that job's cached
`previous_chapters` (ImportError): fixed in general, a script job's modules from its own
directory leave sys.modules when it ends (jobs/runner.py `_forget_script_modules`).

The scripts read tiktoken's "gpt2" encoding, which tiktoken downloads on first use: with no
network here, the tests put a byte-level encoding under that name in tiktoken's registry (the
job's token ids are then bytes, below the models' vocabularies).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import SCRIPTS, JobEstimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs

pytestmark = pytest.mark.slow

BF16 = 2


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


@pytest.fixture
def byte_level_gpt2(monkeypatch):
    """tiktoken's registry holding a byte-level "gpt2" encoding (256 byte ranks and
    <|endoftext|>): `tiktoken.get_encoding("gpt2")` returns it without a download."""
    pytest.importorskip("tiktoken")
    import tiktoken
    import tiktoken.registry

    encoding = tiktoken.Encoding(
        "gpt2", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+""",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={"<|endoftext|>": 256})
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "gpt2", encoding)
    return encoding


def _text(words: int) -> str:
    rng = random.Random(0)
    vocabulary = ["the", "verdict", "gisburn", "painted", "and", "I", "said", "to", "his", "wife"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def _workdir(tmp_path: Path, folder: str, data_file: str, words: int) -> Path:
    work = tmp_path / folder
    shutil.copytree(SCRIPTS / folder, work)
    (work / data_file).write_text(_text(words), encoding="utf-8")
    return work


def gpt_shapes(vocab: int, context: int, d: int, layers: int, separate_qkv: bool) -> list[ex.Shape]:
    """The book's GPTModel: token and position embeddings; per block bias-free query / key /
    value projections (three matrices in chapter 3's MultiHeadAttention, one fused `qkv` in
    the training-speed script), the output projection with a bias, the 4x feed-forward, two
    LayerNorms (scale / shift or weight / bias); the final LayerNorm; an untied bias-free
    out_head."""
    qkv = 3 * [(d, d)] if separate_qkv else [(3 * d, d)]
    block = (qkv + ex.linear(d, d) + ex.linear(4 * d, d) + ex.linear(d, 4 * d) + 4 * [(d,)])
    return [(vocab, d), (context, d)] + layers * block + 2 * [(d,)] + [(vocab, d)]


# rasbt/LLMs-from-scratch ch05/01_main-chapter-code/gpt_train.py ----------------------------------

@needs("tiktoken", "matplotlib")
def test_llms_from_scratch_gpt_train_124m(tmp_path, byte_level_gpt2):
    # about the-verdict.txt's size in tokens (5,145 GPT-2 tokens; here about 5,500 bytes):
    # 19 windows of 257 in the 90 % train split, 9 batches of 2 per epoch
    work = _workdir(tmp_path, "r22c_llms_ch05", "the-verdict.txt", 1100)
    shapes = gpt_shapes(50257, 256, 768, 12, separate_qkv=True)
    params = ex.device_bytes(shapes, ex.FP32)
    # the book's count for a 1024-token context (163,009,536) less 768 positions x 768
    assert ex.count(shapes) == 163_009_536 - 768 * 768
    # `--steps 2`: the script has no command line to shrink its 124M model, 10 epochs and
    # 50-token samples (the default run: see docs/capture.md round 22c)
    est = estimate_here(str(work / "gpt_train.py"), flags=("--gpu", "h100-80gb", "--steps", "2"),
                        cwd=work)
    assert_training(est, params=params, optimizer_state=2 * params)  # AdamW: two moments
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 2 and est.data["stopped"]
    # each block's causal `mask` buffer, (256, 256) fp32
    assert est.breakdown["buffer"] == 12 * ex.rounded(256 * 256 * ex.FP32)
    # the peak is AdamW's step (foreach on CUDA): `_foreach_sqrt(exp_avg_sqs)` makes a copy of
    # every parameter's size at once, live with the weights, gradients and moments
    assert est.breakdown["gradient"] == params
    assert est.breakdown["temporary"] >= params
    assert est.data["peak_allocated_bytes"] >= 5 * params
    # the evaluation at global step 0 (one train and one val batch, no grad) ran
    assert "Ep 1 (Step 000000): Train loss 0.000, Val loss 0.000" in est.stderr
    assert "an evaluation phase (forward passes without gradients) ran" in _notes(est)
    assert not (work / "model.pth").exists()  # stopped before the save


# rasbt/LLMs-from-scratch ch05/10_llm-training-speed/01_opt_single_gpu.py -------------------------

@needs("tiktoken", "matplotlib", "requests")
def test_llms_from_scratch_opt_single_gpu_compiled_bf16_fused_adamw(tmp_path, byte_level_gpt2):
    # about 80,000 bytes: 2 batches of 32 windows of 1025 tokens in the train split, so the
    # 2 steps end in epoch 1, before its sample
    work = _workdir(tmp_path, "r22c_llms_training_speed", "middlemarch.txt", 16000)
    shapes = gpt_shapes(50304, 1024, 768, 12, separate_qkv=False)
    params = ex.device_bytes(shapes, BF16)  # `.to(torch.bfloat16)` after `.to(device)`
    est = estimate_here(str(work / "01_opt_single_gpu.py"),
                        flags=("--gpu", "h100-80gb", "--steps", "2"), cwd=work)
    # fused AdamW: bf16 moments (2 x) and a `step` tensor per parameter
    logits = 32 * 1024 * 50304 * BF16
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes),
                    extra_upper=est.breakdown["activation"] + est.breakdown["temporary"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 2 and est.data["stopped"]
    # a (32, 1024) int64 batch of token ids on the device
    assert est.breakdown["input"] >= ex.rounded(32 * 1024 * 8)
    # the peak is in the backward of a step: the (32, 1024, 50304) bf16 logits' log-softmax,
    # kept for the cross entropy's backward, at least
    assert est.breakdown["activation"] >= logits
    assert "torch.compile was not applied: GPTModel ran eagerly" in _notes(est)
    assert "Uses tensor cores" in est.stderr  # capability (9, 0) of the H100: >= 7
    assert "Ep 1, Step 000000, Train: 0.000, Val: 0.000" in est.stderr


# rasbt/LLMs-from-scratch ch05/03_bonus_pretraining_on_gutenberg/pretraining_simple.py ----------

@needs("tiktoken", "matplotlib")
def test_llms_from_scratch_gutenberg_pretraining_debug_model(tmp_path, byte_level_gpt2):
    work = tmp_path / "03_bonus_pretraining_on_gutenberg"
    shutil.copytree(SCRIPTS / "r22c_llms_gutenberg", work)
    books = work / "gutenberg" / "data"
    books.mkdir(parents=True)
    for index in range(3):  # about 2,200 bytes each: 23 batches of 8 ten-token windows
        (books / f"PG{index}.txt").write_text(_text(400), encoding="utf-8")
    # `--debug True`: the 12-dim, 2-layer GPT with a 10-token context (the vocabulary stays
    # 50257: the two 50257 x 12 matrices are almost all of it)
    shapes = gpt_shapes(50257, 10, 12, 2, separate_qkv=True)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here(str(work / "pretraining_simple.py"), "--debug", "True",
                        "--batch_size", "8", "--eval_freq", "5",
                        flags=("--gpu", "h100-80gb"), cwd=work)
    logits = ex.rounded(8 * 10 * 50257 * ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params,  # AdamW: two moments
                    extra_upper=2 * logits)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["buffer"] == 2 * ex.rounded(10 * 10 * ex.FP32)  # the causal masks
    # at the peak (the backward) the (8, 10, 50257) fp32 logits at least are kept
    assert est.breakdown["activation"] >= logits
    # new DataLoaders per book: the first book's loop ended after 3 full batches and its last,
    # then each later book's last batch; the checkpoint after each book (`global_step %
    # save_ckpt_freq` is non-zero) and the final one diverted, losses.pdf written
    assert est.data["steps"] == 9 and not est.data["stopped"]
    assert "the job saved 4 file(s) of fake device data" in _notes(est)
    assert "Saved model_checkpoints/model_pg_3.pth" in est.stderr
    assert (work / "model_checkpoints" / "losses.pdf").is_file()
    # the sample at step 0 (50 greedy tokens over a 10-token window: replayed once the
    # window is full) and the job's own `max_memory_allocated()` read the estimate's peak
    assert "no-grad forward call(s) replayed" in _notes(est)
    peak = est.data["peak_allocated_bytes"]
    assert f"Maximum GPU memory allocated: {peak / 1e9:.2f} GB" in est.stderr


# rasbt/LLMs-from-scratch ch05/18_muon/gpt_train_muon.py -----------------------------------------

@needs("tiktoken", "matplotlib", "requests")
def test_llms_from_scratch_gpt_train_muon_and_adamw(tmp_path, byte_level_gpt2):
    import torch

    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon is not in this torch")
    work = _workdir(tmp_path, "r22c_llms_muon", "the-verdict.txt", 1100)
    shutil.copy(SCRIPTS / "r22c_llms_ch05" / "previous_chapters.py", work)
    d, vocab, layers = 768, 50257, 12
    shapes = gpt_shapes(vocab, 256, d, layers, separate_qkv=True)
    params = ex.device_bytes(shapes, ex.FP32)
    # Muon: the 2-D weights but the two embeddings (query / key / value / out_proj and the
    # two feed-forward matrices of each block, out_head), one momentum buffer each; AdamW:
    # the embeddings, biases and LayerNorm scales / shifts, two moments each
    muon = layers * (4 * [(d, d)] + [(4 * d, d), (d, 4 * d)]) + [(vocab, d)]
    adamw = ([(vocab, d), (256, d)] + layers * [(d,), (4 * d,), (d,)] + layers * 4 * [(d,)]
             + 2 * [(d,)])
    assert ex.count(muon) + ex.count(adamw) == ex.count(shapes)
    state = ex.device_bytes(muon, ex.FP32) + 2 * ex.device_bytes(adamw, ex.FP32)
    # `--train_steps 2` (its own early end: a `break` after the 2nd iteration, then the
    # 50-token sample) and peakmem's `--steps 2`, which stops first (the sample is slow: see
    # the gpt_train test)
    est = estimate_here(str(work / "gpt_train_muon.py"), "--train_steps", "2",
                        flags=("--gpu", "h100-80gb", "--steps", "2"), cwd=work)
    assert_training(est, params=params, optimizer_state=state)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # an iteration steps both optimizers: 2 steps are 2 iterations (the evaluation at global
    # step 0, after the first, ran)
    assert est.data["steps"] == 2 and est.data["stopped"]
    assert "Ep 1 (Step 000000): Train loss 0.000, Val loss 0.000" in est.stderr
    # Muon keeps one buffer where AdamW kept two: the peak is the backward's, not the
    # optimizer step's (gradients set to None by zero_grad, the (2, 256, 50257) fp32 logits
    # kept for the cross entropy), below AdamW-only gpt_train's 5 x params
    assert est.breakdown["activation"] >= ex.rounded(2 * 256 * vocab * ex.FP32)
    assert est.data["peak_allocated_bytes"] < 5 * params
