"""Round 20b: research repositories' and tutorials' training scripts not covered before,
re-created in their upstream structure (read through the code search, written here; each
docstring names the upstream file and version) and run unmodified through the capture on tiny
local data; device bytes worked out by hand (not read from peakmem):

- pytorch/tutorials advanced_source/neural_style_tutorial.py
  (scripts/r20b_neural_style_tutorial.py): `optim.LBFGS([input_img])` stepped with a closure.
  Found: LBFGS was a fake-mode limit (auto mode reran VGG19 at 512 px eagerly on the CPU:
  minutes). Fixed in general: without a line search an LBFGS step runs in fake mode at its
  memory bound (capture/value_steered.py; tests/capture/test_value_steered.py).
- the closure of `optimizer.step(closure)` runs inside the step: its forward's saved tensors
  were `temporary` (the optimizer phase), not `activation`. Fixed in general
  (capture/phases.py; tests/capture/test_closure_phases.py).
- karpathy/llama2.c train.py + model.py + tinystories.py + export.py + configurator.py
  (scripts/r20b_llama2c/): config globals overridden by `exec(open("configurator.py").read())`,
  an IterableDataset of uint16 shards, tied embeddings, fused AdamW, `model_export`. Worked as
  it is.
- karpathy/minGPT projects/chargpt/chargpt.py + the mingpt package (scripts/r20b_mingpt/):
  CfgNode `--trainer.batch_size=16` overrides, the package's Trainer and callbacks. Found: its
  first callback's 500-character `generate` (a sliding window `idx[:, -block_size:]`) was never
  replayed, minutes of fake ops. Fixed in general (capture/repeated_forwards.py's key;
  tests/capture/test_repeated_forwards.py).
- vwxyzjn/cleanrl cleanrl/ddpg_continuous_action.py (scripts/r20b_cleanrl_ddpg_continuous.py):
  one Q network, both targets Polyak-updated. Worked as it is.
- pyg-team/pytorch_geometric examples/gat.py (scripts/r20b_pyg_gat.py): `test_acc` bound only
  when the validation accuracy improves; fake reads are 0, so it raised NameError and auto mode
  reran it eagerly, as designed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import SCRIPTS, JobEstimate, estimate, estimate_here
from tests.library_jobs.test_library_jobs import MiB, assert_training, needs
from tests.library_jobs.test_library_jobs_r14 import _hub_weights
from tests.library_jobs.test_library_jobs_r19b import vgg19_feature_convs

pytestmark = pytest.mark.slow


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# pytorch/tutorials advanced_source/neural_style_tutorial.py -------------------------------------

@needs("torchvision", "matplotlib")
def test_neural_style_tutorial_lbfgs_over_the_input_image(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    for name in ("picasso", "dancing"):  # `transforms.Resize(512)`: both become 512 x 512
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
            tmp_path / "images" / f"{name}.jpg")
    # `vgg19(weights=VGG19_Weights.DEFAULT)` reads the torch.hub cache: zeros of its shapes
    _hub_weights(tmp_path / "torch", "vgg19", "vgg19-dcbb9e9d.pth")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    est = estimate_here("r20b_neural_style_tutorial.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path, timeout=600)
    shutil.rmtree(tmp_path / "torch")  # the 575 MB weights file
    assert est.returncode == 0, est.failure()
    # before: "fake mode could not run the job (torch.optim.LBFGS decides its iterations ...)"
    # and auto mode's eager rerun of VGG19 at 512 px on the CPU
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "LBFGS: in fake mode each step ran at its memory bound" in _notes(est)
    # `imsize = 512 if torch.cuda.is_available()`: the job sees a GPU. One (1, 3, 512, 512)
    # fp32 image: 3 MiB
    image = ex.rounded(3 * 512 * 512 * ex.FP32)
    convs = vgg19_feature_convs()
    used = ex.device_bytes([shape for conv in convs[:5] for shape in conv], ex.FP32)
    vgg = ex.device_bytes([shape for conv in convs for shape in conv], ex.FP32)
    # the optimized image and the trimmed model's conv_1 .. conv_5 (frozen by
    # `model.requires_grad_(False)`, run by every closure) are parameters; conv_6 .. conv_16,
    # built on the device by `set_default_device` and never run, are `other`. The four
    # 3-float mean / std tensors (the globals and Normalization's `torch.tensor(mean)` copies,
    # all made on the default device) are one block each: two `other`, two `input`
    assert est.breakdown["parameter"] == image + used
    assert est.breakdown["other"] == vgg - used + 2 * ex.BLOCK
    # the style and content images
    assert est.breakdown["input"] == 2 * image + 2 * ex.BLOCK
    # `while run[0] <= 300` over `optimizer.step(closure)` (no DataLoader). Each step runs
    # max_iter = 20 iterations, each storing a (y, s) pair of the image's size with its 0-d
    # `ro` (the first iteration none): 59 pairs after the 3 steps of the limit, then each step
    # still raises the peak (capture/step_growth.py) until the history is full (history_size
    # 100: 99 pairs after step 5, 100 in step 6, which step 7 shows to be the last rise)
    pairs = 2 * 100 * image
    assert est.data["steps"] == 7, _notes(est)
    assert "kept training 4 optimizer steps past the step limit" in _notes(est)
    assert pairs <= est.breakdown["optimizer_state"] <= pairs + 2 * image + 3 * 100 * ex.BLOCK
    # at the peak, besides the weights, images and history: the closure's forward through
    # conv_1 .. conv_5 at 512 px (conv_1 / relu_1 / conv_2 / relu_2 outputs are (1, 64, 512,
    # 512) fp32, 64 MiB each), saved for its backward: activations (they were `temporary`
    # before round 20b: the closure runs inside the step, capture/phases.py)
    assert est.breakdown["activation"] >= 4 * 64 * MiB
    assert est.data["peak_allocated_bytes"] >= vgg + 3 * image + pairs + 4 * 64 * MiB


# karpathy/llama2.c train.py ---------------------------------------------------------------------

LLAMA2C = dict(vocab=512, dim=64, layers=2, heads=4, kv_heads=2, multiple_of=32, seq=64, batch=8)
LLAMA2C_FLAGS = ("--vocab_source=custom", "--vocab_size=512", "--dim=64", "--n_layers=2",
                 "--n_heads=4", "--n_kv_heads=2", "--batch_size=8", "--max_seq_len=64",
                 "--eval_iters=2", "--eval_interval=2", "--max_iters=4",
                 "--gradient_accumulation_steps=2", "--always_save_checkpoint=True")


def llama2c_shapes(vocab: int, dim: int, layers: int, heads: int, kv_heads: int,
                   multiple_of: int, **_) -> list[ex.Shape]:
    """llama2.c's Transformer: per layer bias-free wq / wk / wv / wo (grouped-query: wk and wv
    have kv_heads * head_dim rows), SwiGLU w1 / w2 / w3 of hidden = multiple_of-rounded
    int(2 * 4 * dim / 3), two RMSNorm weights; the final norm; the tied embedding once."""
    head = dim // heads
    hidden = int(2 * 4 * dim / 3)
    hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    layer = [(dim, dim), (kv_heads * head, dim), (kv_heads * head, dim), (dim, dim),
             (hidden, dim), (dim, hidden), (hidden, dim), (dim,), (dim,)]
    return layers * layer + [(dim,), (vocab, dim)]


def _llama2c_workdir(tmp_path: Path) -> Path:
    """The repository's files in a working directory (train.py reads configurator.py from
    it), with data/tok512/ holding three pretokenized uint16 shards (shard 0 is the val
    split)."""
    import numpy as np

    work = tmp_path / "llama2.c"
    shutil.copytree(SCRIPTS / "r20b_llama2c", work)
    (work / "data" / "tok512").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for shard in range(3):
        rng.integers(0, 512, size=5000).astype(np.uint16).tofile(
            work / "data" / "tok512" / f"data{shard:02d}.bin")
    return work


def test_llama2c_configurator_iterable_shards_and_model_export(tmp_path):
    work = _llama2c_workdir(tmp_path)
    shapes = llama2c_shapes(**LLAMA2C)
    params = ex.device_bytes(shapes, ex.FP32)
    # a child process: the job imports top-level modules named `model` and `export`
    est = estimate(str(work / "train.py"), *LLAMA2C_FLAGS, "--compile=False",
                   flags=("--gpu", "h100-80gb"), cwd=work)
    # `configure_optimizers`: fused AdamW because device_type == "cuda" (a `step` per tensor)
    assert_training(est, params=params, optimizer_state=2 * params + ex.BLOCK * len(shapes),
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert "using fused AdamW: True" in est.stderr
    # the RoPE tables: freqs_cos and freqs_sin, (max_seq_len, head_dim / 2) fp32 each
    head = LLAMA2C["dim"] // LLAMA2C["heads"]
    assert est.breakdown["buffer"] == 2 * ex.rounded(LLAMA2C["seq"] * head // 2 * ex.FP32)
    # X, Y (8, 64) int64 of the micro-step and the next ones, fetched before its backward
    # while the graph still holds the first (embedding indices, cross-entropy targets)
    assert est.breakdown["input"] == 4 * ex.rounded(LLAMA2C["batch"] * LLAMA2C["seq"] * 8)
    assert est.breakdown["gradient"] == params
    # `while True` over an endless IterableDataset: 3 optimizer steps of 2 micro-batches,
    # then the DataLoader ended and the next `next()` raised StopIteration
    assert est.data["steps"] == 3 and est.data["stopped"]
    assert "accumulation window 2" in _notes(est)
    assert "raised StopIteration after peakmem shortened its DataLoader" in _notes(est)
    # the eval at iter 2 saved: the checkpoint of fake device data diverted, model.bin written
    # from `.cpu().numpy()` reads: the 7-int header, then every fp32 weight (tied once) and
    # both RoPE tables
    assert "instead of out/ckpt.pt" in _notes(est)
    floats = sum(ex.count([shape]) for shape in shapes) + 2 * LLAMA2C["seq"] * head // 2
    assert (work / "out" / "model.bin").stat().st_size == 7 * 4 + 4 * floats


def test_llama2c_compiled_float16_grad_scaler(tmp_path):
    work = _llama2c_workdir(tmp_path)
    shapes = llama2c_shapes(**LLAMA2C)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate(str(work / "train.py"), *LLAMA2C_FLAGS, "--dtype=float16",
                   flags=("--gpu", "h100-80gb"), cwd=work)
    assert_training(est, params=params, optimizer_state=2 * params + ex.BLOCK * len(shapes),
                    extra_upper=est.breakdown["workspace"])
    # `torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))`: its scale and growth tracker
    assert est.breakdown["other"] == 2 * ex.BLOCK
    assert "torch.compile was not applied: Transformer ran eagerly" in _notes(est)
    assert est.data["steps"] == 3


# karpathy/minGPT projects/chargpt/chargpt.py ----------------------------------------------------

def mingpt_shapes(vocab: int, block: int, layers: int, embd: int) -> list[ex.Shape]:
    """minGPT's GPT: wte and wpe, per Block ln_1, c_attn (3 x embd), c_proj, ln_2 and the MLP's
    c_fc / c_proj (4 x embd), all with biases; ln_f; lm_head without a bias (not tied)."""
    block_shapes = (ex.norm(embd) + ex.linear(3 * embd, embd) + ex.linear(embd, embd)
                    + ex.norm(embd) + ex.linear(4 * embd, embd) + ex.linear(embd, 4 * embd))
    return ([(vocab, embd), (block, embd)] + layers * block_shapes + ex.norm(embd)
            + ex.linear(vocab, embd, bias=False))


def test_mingpt_chargpt_cfgnode_overrides_and_package_trainer(tmp_path, monkeypatch):
    import random

    repo = tmp_path / "minGPT"
    shutil.copytree(SCRIPTS / "r20b_mingpt", repo)
    rng = random.Random(0)
    words = ["O", "God,", "thou", "art", "the", "king!", "my", "lord", "good", "night"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
                     for _ in range(300)) + "\n"
    (repo / "input.txt").write_text(text)
    monkeypatch.syspath_prepend(str(repo))  # `mingpt` importable, as from the repository root
    vocab, block, batch = len(set(text)), 64, 16
    shapes = mingpt_shapes(vocab, block, layers=3, embd=48)  # gpt-nano
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here(str(repo / "projects" / "chargpt" / "chargpt.py"),
                        f"--trainer.batch_size={batch}", f"--data.block_size={block}",
                        "--trainer.num_workers=2", "--model.model_type=gpt-nano",
                        flags=("--gpu", "h100-80gb"), cwd=repo)
    assert_training(est, params=params, optimizer_state=2 * params,  # AdamW: two moments
                    extra_upper=est.breakdown["workspace"] + est.breakdown["activation"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # each Block's causal mask: a (1, 1, 64, 64) fp32 `tril` buffer
    assert est.breakdown["buffer"] == 3 * ex.rounded(block * block * ex.FP32)
    # a batch of x and y, (16, 64) int64 each, moved by `[t.to(self.device) for t in batch]`
    assert est.breakdown["input"] == 2 * ex.rounded(batch * block * 8)
    assert "command line overwriting config attribute trainer.batch_size with 16" in est.stderr
    assert "running on device cuda" in est.stderr
    assert '"model_type": "gpt-nano"' in (repo / "out" / "chargpt" / "config.json").read_text()
    # the callback after the first step: 500 characters generated one no-grad forward at a
    # time on `idx[:, -64:]` of the growing sequence (replayed once the window is full: before
    # round 20b every call was its own replay key, minutes of fake ops), then the state dict
    # saved (fake device data: diverted)
    assert "saving model" in est.stderr
    assert "no-grad forward call(s) replayed" in _notes(est)
    assert "instead of ./out/chargpt/model.pt" in _notes(est)
    # the endless sampler re-iterated after the loop was ended: stopped at 7 steps
    assert est.data["steps"] == 7 and est.data["stopped"]


# vwxyzjn/cleanrl cleanrl/ddpg_continuous_action.py -----------------------------------------------

@needs("gymnasium", "tyro", "tensorboard", "stable_baselines3")
def test_cleanrl_ddpg_continuous_one_q_network_and_its_target(tmp_path):
    from tests.library_jobs.test_library_jobs_r15b import (
        PENDULUM,
        POLYAK_TEMPS,
        RL_ARGS,
        actor_shapes,
        q_network_shapes,
    )

    actor = ex.device_bytes(actor_shapes(**PENDULUM, heads=1), ex.FP32)
    q_net = ex.device_bytes(q_network_shapes(**PENDULUM), ex.FP32)
    trained = actor + q_net
    est = estimate_here("r20b_cleanrl_ddpg_continuous.py", *RL_ARGS, "--total-timesteps", "110",
                        "--save-model", flags=("--gpu", "h100-80gb", "--steps", "all"),
                        cwd=tmp_path)
    assert_training(est, params=trained, optimizer_state=2 * trained,  # two Adams, 2 moments
                    extra_lower=trained + POLYAK_TEMPS)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # target_actor and qf1_target: `load_state_dict` copies moved by the Polyak updates
    assert est.breakdown["ema"] == trained
    assert est.breakdown["gradient"] == trained
    # action_scale and action_bias of the actor and its target: (1, 1) fp32 each (upstream
    # takes them from the vector env's batched `action_space`)
    assert est.breakdown["buffer"] == 4 * ex.BLOCK
    assert est.breakdown["other"] == POLYAK_TEMPS
    # the critic stepped at global steps 101..109, the actor at the even ones
    assert est.data["steps"] == 9
    assert "model saved to runs/Pendulum-v1__r20b_cleanrl_ddpg_continuous__1__" in est.stderr
    assert "r20b_cleanrl_ddpg_continuous.cleanrl_model" in _notes(est)


# pyg-team/pytorch_geometric examples/gat.py -------------------------------------------------------

@needs("torch_geometric", "scipy")
def test_pyg_gat_best_val_branch_reruns_eagerly(tmp_path):
    import pickle

    from tests.library_jobs.test_library_jobs_r19b import (
        CORA_CLASSES,
        CORA_FEATURES,
        write_planetoid_cora,
    )

    raw = tmp_path / "data" / "Planetoid" / "Cora" / "raw"
    nodes = write_planetoid_cora(raw)
    graph = pickle.loads((raw / "ind.cora.graph").read_bytes())
    edges = sum(len(set(neighbours)) for neighbours in graph.values())  # coalesced, directed
    (tmp_path / "examples").mkdir()
    shutil.copy(SCRIPTS / "r20b_pyg_gat.py", tmp_path / "examples" / "gat.py")
    # GATConv(64, 8, heads=8): a bias-free lin (64 -> 8 x 8), att_src / att_dst (1, 8, 8), bias
    # (64,); GATConv(64, 7, heads=1, concat=False): lin (64 -> 7), att_src / att_dst (1, 1, 7),
    # bias (7,)
    shapes = [(64, CORA_FEATURES), (1, 8, 8), (1, 8, 8), (64,),
              (CORA_CLASSES, 64), (1, 1, CORA_CLASSES), (1, 1, CORA_CLASSES), (CORA_CLASSES,)]
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here(str(tmp_path / "examples" / "gat.py"), "--epochs", "5",
                        flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam: two moments
                    extra_upper=est.breakdown["workspace"])
    # upstream starts with `best_val_acc = final_test_acc = 0` and binds `test_acc` only when
    # `val_acc > best_val_acc`: fake mode's accuracies read 0 (`int(...)` of device sums), the
    # branch never ran and `log(..., Test=test_acc)` raised NameError; auto mode reran the job
    # with real values (eager), as a GPU run goes
    assert est.data["mode"] == "eager"
    assert "NameError: name 'test_acc' is not defined" in est.data["mode_reason"]
    # the graph moved by `dataset[0].to(device)`: x (800, 64) fp32, y int64, the three bool
    # masks and the coalesced edge_index (2, E) int64
    assert est.breakdown["input"] == (ex.rounded(nodes * CORA_FEATURES * ex.FP32)
                                      + ex.rounded(nodes * 8) + 3 * ex.rounded(nodes)
                                      + ex.rounded(2 * edges * 8))
    # the epoch loop (no DataLoader) ended at its head after 3 steps, the code after it ran
    # (capture/loop_ends.py): not stopped
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert any(note.startswith("ended 1 training loop(s) without a DataLoader")
               for note in est.data["notes"]), est.data["notes"]
    assert "Epoch: 002, Loss:" in est.stderr
