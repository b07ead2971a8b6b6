"""Round 16b: well-known non-Hugging-Face training scripts, re-created in their repositories'
structure and run unmodified through the capture; device bytes worked out by hand (not read
from peakmem):

- karpathy/makemore makemore.py (scripts/r16b_makemore.py): a names file, `--device cuda`
  as a string, `--type transformer|gru|...`, an `InfiniteDataLoader` over
  `RandomSampler(replacement=True, num_samples=int(1e10))` read with `next()` and a
  StopIteration reset, a `while True` loop ended by `--max-steps`, AdamW. Found: the capture
  hung skipping that epoch's 312,500,000 batches index by index (capture/dataloader.py
  MAX_SKIPPED_SAMPLES; tests/capture/test_stopping.py). minGPT's Trainer builds the same
  sampler (scripts/mingpt_trainer.py past its step limit hung as well).
- yunjey/pytorch-tutorial tutorials/02-intermediate/language_model (scripts/
  r16b_yunjey_language_model/main.py + data_utils.py): module constants, an LSTM language model
  with truncated BPTT (states detached and carried), `clip_grad_norm_`, a loop over tensor
  slices (no DataLoader), 1000 words sampled after training. Worked as it is.
- yunjey/pytorch-tutorial tutorials/03-advanced/variational_autoencoder/main.py
  (scripts/r16b_yunjey_vae.py): the legacy `F.binary_cross_entropy(..., size_average=False)`,
  15 epochs each followed by no_grad sampling and a reconstruction of the epoch's last batch.
  Worked as it is.
- vwxyzjn/cleanrl cleanrl/pqn.py (scripts/r16b_cleanrl_pqn.py): RAdam, LayerNorm, rollout
  storage made on the device up front, `torch.where` epsilon-greedy on the device, Q(lambda)
  returns under no_grad, numpy minibatch indices, a device loss handed to `add_scalar`. Worked
  as it is.
"""

from __future__ import annotations

import random

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import assert_training, needs

pytestmark = pytest.mark.slow


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# karpathy/makemore makemore.py ---------------------------------------------------------------------

NAMES, LONGEST = 400, 15


def write_names(path) -> None:
    """A names.txt of lowercase words, 3 to 15 letters, every letter used: vocab 27 (26 + the
    <STOP>/<START> token 0), block size 16 (<START> + the longest word)."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [letters[:LONGEST], letters[LONGEST:]]
    words += ["".join(rng.choice(letters) for _ in range(rng.randint(3, LONGEST)))
              for _ in range(NAMES - 2)]
    path.write_text("\n".join(words) + "\n")


VOCAB, BLOCK = 27, LONGEST + 1
MAKEMORE_ARGS = ("-i", "names.txt", "-o", "out", "--device", "cuda", "--num-workers", "0",
                 "--batch-size", "32", "--max-steps", "5")


def makemore_transformer_shapes(layers: int, embd: int) -> list[ex.Shape]:
    """makemore's Transformer: wte, wpe, per block ln_1, c_attn (3 x embd), c_proj, ln_2, the
    4x MLP, then ln_f and an lm_head without bias."""
    block = (ex.norm(embd) + ex.linear(3 * embd, embd) + ex.linear(embd, embd) + ex.norm(embd)
             + ex.linear(4 * embd, embd) + ex.linear(embd, 4 * embd))
    return ([(VOCAB, embd), (BLOCK, embd)] + layers * block + ex.norm(embd)
            + ex.linear(VOCAB, embd, bias=False))


def test_makemore_transformer_infinite_loader_ends_at_max_steps(tmp_path):
    write_names(tmp_path / "names.txt")
    layers, embd, batch = 2, 32, 32
    params = ex.device_bytes(makemore_transformer_shapes(layers, embd), ex.FP32)
    est = estimate_here("r16b_makemore.py", *MAKEMORE_ARGS, "--n-layer", str(layers),
                        "--n-embd", str(embd), "--n-head", "4", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params)  # AdamW: two moments
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "step 0 | loss" in est.stderr and f"vocab_size={VOCAB}, block_size={BLOCK}" in est.stderr
    # the causal mask: tril(ones(16, 16)) viewed (1, 1, 16, 16), fp32, one per block
    assert est.breakdown["buffer"] == layers * ex.rounded(BLOCK * BLOCK * ex.FP32)
    # X and Y: (32, 16) int64 each
    assert est.breakdown["input"] == 2 * ex.rounded(batch * BLOCK * 8)
    # the endless epoch (1e10 / 32 batches) is not skipped through; the loop is ended at step
    # 3, each re-iteration after it yields one batch, and --max-steps 5 ends the job itself
    assert f"a DataLoader epoch of {10**10 // batch} batches is too long" in _notes(est)
    assert est.data["steps"] == 5 and not est.data["stopped"]


def test_makemore_gru_cell_loop_keeps_every_hidden_state(tmp_path):
    write_names(tmp_path / "names.txt")
    embd, embd2, batch = 32, 64, 32
    cell = 3 * ex.linear(embd2, embd + embd2)  # xh_to_z, xh_to_r, xh_to_hbar
    params = ex.device_bytes([(1, embd2), (VOCAB, embd)] + cell + ex.linear(VOCAB, embd2),
                             ex.FP32)
    est = estimate_here("r16b_makemore.py", *MAKEMORE_ARGS, "--type", "gru", "--n-embd",
                        str(embd), "--n-embd2", str(embd2), flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    # the 16-step recurrence saves, per step and sample, the concatenations and gates the
    # backward needs: at least the 16 hidden states and their stack (2 x 32 x 16 x 64 fp32)
    hidden = ex.rounded(batch * embd2 * ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=est.breakdown["activation"])
    assert est.breakdown["activation"] >= 2 * BLOCK * hidden
    assert "buffer" not in est.breakdown or est.breakdown["buffer"] == 0
    assert est.data["steps"] == 5


def test_mingpt_trainer_past_the_step_limit_is_stopped_not_hung():
    """minGPT's Trainer draws from the same endless sampler (scripts/mingpt_trainer.py): with
    more iterations than the capture's step limit, the ended loop re-iterated into a skip of
    1e10 / 8 batches and hung (the older test stops at --max-iters 3, before any skip)."""
    params = ex.device_bytes(ex.gpt2_shapes(**ex.MINGPT, tied=False), ex.FP32)
    est = estimate_here("mingpt_trainer.py", "--max-iters", "200")
    assert_training(est, params=params, optimizer_state=2 * params)
    assert "is too long to skip through" in _notes(est)
    # ended at step 3; each re-iteration yields one batch; the 4th bare one in a row stops it
    assert est.data["steps"] == 7 and est.data["stopped"]


# yunjey/pytorch-tutorial language_model/main.py --------------------------------------------------

def test_yunjey_language_model_truncated_bptt_lstm(tmp_path):
    (tmp_path / "data").mkdir()
    vocab = [f"w{i}" for i in range(499)]  # + <eos>: 500 words
    rng = random.Random(0)
    lines = [" ".join(vocab[:250]), " ".join(vocab[250:])]
    lines += [" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 20))) for _ in range(298)]
    (tmp_path / "data" / "train.txt").write_text("\n".join(lines) + "\n")
    words, embed, hidden, batch, seq = 500, 128, 1024, 20, 30  # the script's constants
    decoder = ex.device_bytes(ex.linear(words, hidden), ex.FP32)
    params = ex.device_bytes([(words, embed), *ex.lstm_shapes(embed, hidden, 1)], ex.FP32) + decoder
    est = estimate_here("r16b_yunjey_language_model/main.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=est.breakdown["workspace"] + est.breakdown["temporary"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # inputs and targets: (20, 30) int64 slices moved to the device each batch
    assert est.breakdown["input"] == 2 * ex.rounded(batch * seq * 8)
    # the peak is inside the LSTM's backward: the decoder's gradients exist (zero_grad set
    # them to None), the LSTM's and the embedding's are not made yet
    assert est.breakdown["gradient"] == decoder
    # the loops over tensor slices (the `with` after them: no line leads out) are ended by
    # exhausting their iterators (capture/frame_moves.py): 3 steps, then the sampling runs
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in _notes(est), _notes(est)
    assert "Epoch [1/5], Step[0/7]" in est.stderr
    assert "Sampled [1000/1000] words" in est.stderr


# yunjey/pytorch-tutorial variational_autoencoder/main.py ------------------------------------------

@needs("torchvision")
def test_yunjey_vae_legacy_size_average_and_per_epoch_samples(tmp_path):
    # 700 images: batches of 128, the last of 60
    write_mnist(tmp_path / "tutorials" / "data" / "MNIST" / "raw", train=700, test=16)
    folder = tmp_path / "tutorials" / "03-advanced" / "variational_autoencoder"
    folder.mkdir(parents=True)
    shapes = (ex.linear(400, 784) + ex.linear(20, 400) + ex.linear(20, 400) + ex.linear(400, 20)
              + ex.linear(784, 400))
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r16b_yunjey_vae.py", flags=("--gpu", "h100-80gb"), cwd=folder)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the first epoch: 3 full batches and its last (4 steps); the loop is ended in the second
    # after 2 more steps (the first epoch plus 2), which then runs its last batch; each later
    # epoch its last batch only, each followed by its no_grad samples (an evaluation between
    # epochs keeps them running: all 15)
    assert est.data["steps"] == 4 + 3 + 13 and not est.data["stopped"]
    # the peak is in the second epoch: a full batch (128 x 784 fp32) and the global `z`
    # (128 x 20, `torch.randn(...).to(device)`) the first epoch's sampling left alive
    assert est.breakdown["input"] == (ex.rounded(128 * 784 * ex.FP32)
                                      + ex.rounded(128 * 20 * ex.FP32))
    assert "Epoch[1/15]" not in est.stderr  # printed every 10 batches: never reached
    assert (folder / "samples" / "sampled-15.png").exists()
    assert (folder / "samples" / "reconst-15.png").exists()


# cleanrl pqn.py ----------------------------------------------------------------------------------

@needs("gymnasium", "tyro", "tensorboard")
def test_cleanrl_pqn_device_rollout_storage_and_radam(tmp_path):
    shapes = (ex.linear(120, 4) + ex.norm(120) + ex.linear(84, 120) + ex.norm(84)
              + ex.linear(2, 84))  # CartPole-v1: 4 observations, 2 actions
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r16b_cleanrl_pqn.py", "--num-envs", "2", "--num-steps", "16",
                        "--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps",
                        "128", flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    # RAdam: exp_avg and exp_avg_sq per parameter (its `step` stays on the host)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # copied from the host and alive while it trains: the five (16, 2[, 4]) storage buffers
    # (`torch.zeros(...).to(device)`), next_obs, next_done and random_actions, 512 B or less
    # each (`returns` is made on the device by zeros_like)
    assert est.breakdown["input"] == 8 * ex.BLOCK
    # 2 minibatch steps per iteration: at the third (iteration 2) the minibatch, epoch and
    # iteration loops (no DataLoader) are ended at their heads (capture/loop_ends.py), after
    # iteration 1's `add_scalar("losses/td_loss", loss, ...)` read the device loss; the
    # iteration's logging after its update ran, then the job's end
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in "\n".join(est.data["notes"])
    assert "SPS:" in est.stderr
    assert list((tmp_path / "runs").glob("CartPole-v1__r16b_cleanrl_pqn__1__*/events.*"))
