"""Round 19b: research repositories' and tutorials' training scripts not covered before,
re-created in their upstream structure (read through the code search, written here; each
docstring names the upstream file and version) and run unmodified through the capture on tiny
local data; device bytes worked out by hand (not read from peakmem):

- karpathy/ng-video-lecture gpt.py (scripts/r19b_ng_video_lecture_gpt.py): module constants,
  `get_batch` by `torch.randint` windows, `estimate_loss()` over 2 x 200 no-grad batches at
  step 0, one Linear per head with a `tril` buffer each. Worked as it is.
- lucidrains/x-transformers examples/toy_tasks/enc_dec_copy.py
  (scripts/r19b_x_transformers_enc_dec_copy.py): device batches from a `cycle()` generator,
  `XTransformer(tie_token_emb=True, return_tgt_loss=True)`. Worked as it is.
- yunjey/pytorch-tutorial bidirectional_recurrent_neural_network and generative_adversarial_network
  (scripts/r19b_yunjey_birnn.py, r19b_yunjey_gan.py). Worked as they are.
- yunjey/pytorch-tutorial neural_style_transfer (scripts/r19b_yunjey_neural_style.py): Adam over
  the target image alone, VGG19 features from the torch.hub cache whose parameters keep
  `requires_grad`. Worked (upstream's `Image.ANTIALIAS` is gone from Pillow 10: LANCZOS).
- pytorch/tutorials intermediate_source/mixed_precision_tutorial.py
  (scripts/r19b_mixed_precision_tutorial.py): five sequential training sections over 128 device
  batches kept in lists, `torch.cuda.max_memory_allocated()` printed. Worked; by default only
  the first section is traced (a loop without a DataLoader), which misses the later peak.
- pytorch/tutorials intermediate_source/FSDP_tutorial.rst's FSDP_mnist.py
  (scripts/r19b_fsdp_mnist.py): `mp.spawn` over `torch.cuda.device_count()` ranks, FSDP1 around
  the whole MNIST Net, Adadelta on the shard, CUDA events, rank 0 saving `model.state_dict()`.
  Worked as it is, one process or two (`--nproc-per-node 2`).
- pyg-team/pytorch_geometric examples/link_pred.py (scripts/r19b_pyg_link_pred.py, copied to
  examples/link_pred.py): Planetoid Cora from local raw files, `ToDevice` + `RandomLinkSplit`
  in the dataset transform, `negative_sampling` each epoch, scikit-learn AUCs. Worked as it is.
- fastai nbs/examples/train_imagenette.py (scripts/r19b_fastai_train_imagenette.py): `ranger`
  (Lookahead over RAdam), `to_fp16()`, MixUp, `fit_flat_cos`. Found: Lookahead's slow weights
  were `other`, then `ema` (capture/fastai_optimizers.py; tests/capture/test_fastai_optimizers.py).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import SCRIPTS, JobEstimate, estimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import MiB, assert_training, needs
from tests.library_jobs.test_library_jobs_r14 import _hub_weights

pytestmark = pytest.mark.slow


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# karpathy/ng-video-lecture gpt.py ---------------------------------------------------------------

def write_shakespeare(path: Path) -> str:
    """A small input.txt of words from a fixed list (30 distinct characters): the script's
    90/10 split leaves more than block_size + 1 characters in each part."""
    rng = random.Random(0)
    words = ["thou", "art", "the", "king", "and", "queen", "of", "all", "that", "is", "Romeo",
             "JULIET:", "my", "lord,", "good", "night!"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
                     for _ in range(400)) + "\n"
    path.write_text(text)
    return text


def ng_gpt_shapes(vocab: int, embd: int = 384, heads: int = 6, layers: int = 6,
                  block: int = 256) -> list[ex.Shape]:
    """GPTLanguageModel: token and position tables, per Block `heads` Heads of three bias-free
    Linears (embd -> embd / heads), the projection, the 4x feed-forward and two LayerNorms;
    ln_f and lm_head (with bias)."""
    head = embd // heads
    block_shapes = (heads * 3 * ex.linear(head, embd, bias=False) + ex.linear(embd, embd)
                    + ex.linear(4 * embd, embd) + ex.linear(embd, 4 * embd)
                    + ex.norm(embd) + ex.norm(embd))
    return ([(vocab, embd), (block, embd)] + layers * block_shapes + ex.norm(embd)
            + ex.linear(vocab, embd))


def test_ng_video_lecture_gpt_module_constants_and_estimate_loss(tmp_path):
    text = write_shakespeare(tmp_path / "input.txt")
    vocab = len(set(text))
    params = ex.device_bytes(ng_gpt_shapes(vocab), ex.FP32)
    # 400 no-grad forwards in estimate_loss() at step 0 (no flag shortens them) and the 500
    # of the generation after the loop: ~90 s here before the generation ran
    est = estimate_here("r19b_ng_video_lecture_gpt.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path, timeout=900)
    assert_training(est, params=params, optimizer_state=2 * params,  # AdamW: two moments
                    extra_upper=4096 * MiB)  # the (64, 256, 256) attention maps, 36 heads
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # one (256, 256) fp32 `tril` buffer per head: 6 layers x 6 heads
    assert est.breakdown["buffer"] == 36 * ex.rounded(256 * 256 * ex.FP32)
    # the training batch: x and y, (64, 256) int64 each
    assert est.breakdown["input"] == 2 * ex.rounded(64 * 256 * 8)
    # per head the (64, 256, 256) fp32 scores, their softmax and dropout (and its mask) are
    # saved for the backward: more than 36 x 3 x 16 MiB of activations at the peak
    assert est.breakdown["activation"] >= 36 * 3 * 16 * MiB
    # the loop is `for iter in range(max_iters)` over get_batch: ended after 3 steps
    # (capture/loop_ends.py), so the 500-character generation after it ran (its batch-1
    # forwards stay below training's peak)
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in "\n".join(est.data["notes"])
    assert "step 0: train loss" in est.stderr
    assert f"{sum(ex.count([s]) for s in ng_gpt_shapes(vocab)) / 1e6}" in est.stderr


# lucidrains/x-transformers examples/toy_tasks/enc_dec_copy.py ---------------------------------

@needs("x_transformers", "tqdm")
def test_x_transformers_enc_dec_copy_generator_batches(tmp_path):
    import torch
    from x_transformers import XTransformer

    # the script's own model, built on the meta device for its parameters' shapes (the decoder's
    # logits are tied to its token embedding: one tensor)
    with torch.device("meta"):
        model = XTransformer(dim=512, tie_token_emb=True, return_tgt_loss=True,
                             enc_num_tokens=18, enc_depth=3, enc_heads=8, enc_max_seq_len=32,
                             dec_num_tokens=18, dec_depth=3, dec_heads=8, dec_max_seq_len=65)
    params = ex.device_bytes([tuple(p.shape) for p in model.parameters()], ex.FP32)
    est = estimate_here("r19b_x_transformers_enc_dec_copy.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam: two moments
                    extra_upper=est.breakdown["activation"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # `next(cycle())` copies each batch to the device (`.long().cuda()`): src (32, 32) int64
    # and the mask (32, 32) bool are `input`; tgt, a `torch.cat` of prefix, src, src made on
    # the device, (32, 65) int64, is `other`
    assert est.breakdown["input"] == ex.rounded(32 * 32 * 8) + ex.rounded(32 * 32)
    assert est.breakdown["other"] == ex.rounded(32 * 65 * 8)
    # 3 steps, then stopped (no DataLoader): the generation every 100 batches never came
    assert est.data["steps"] == 3 and est.data["stopped"]
    assert "2: 0.0" in est.stderr and "incorrects" not in est.stderr


# yunjey/pytorch-tutorial bidirectional_recurrent_neural_network/main.py -------------------------

@needs("torchvision")
def test_yunjey_bidirectional_lstm_host_made_initial_states(tmp_path):
    # 400 training images: 4 batches of 100; 50 test images
    write_mnist(tmp_path / "tutorials" / "data" / "MNIST" / "raw", train=400, test=50)
    folder = tmp_path / "tutorials" / "02-intermediate" / "bidirectional_recurrent_neural_network"
    folder.mkdir(parents=True)
    # a 2-layer bidirectional LSTM (the second layer reads both directions: 256 inputs)
    lstm = [(512, 28), (512, 128), (512,), (512,)] * 2 + [(512, 256), (512, 128), (512,), (512,)] * 2
    params = ex.device_bytes(lstm + ex.linear(10, 256), ex.FP32)
    est = estimate_here("r19b_yunjey_birnn.py", flags=("--gpu", "h100-80gb"), cwd=folder)
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam: two moments
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # a batch (100, 28, 28) fp32 and its labels, and the forward's h0 / c0: (4, 100, 128)
    # zeros made on the host and moved with `.to(device)`
    assert est.breakdown["input"] == (ex.rounded(100 * 28 * 28 * ex.FP32) + ex.rounded(100 * 8)
                                      + 2 * ex.rounded(4 * 100 * 128 * ex.FP32))
    # the first epoch (4 steps), the loop ended 2 steps into the second, its last batch: 7;
    # then the no_grad test pass and the checkpoint save
    assert est.data["steps"] == 7 and not est.data["stopped"]
    assert "an evaluation phase (forward passes without gradients) ran" in _notes(est)
    assert "Test Accuracy of the model on the 10000 test images" in est.stderr
    assert "instead of model.ckpt" in _notes(est)


# yunjey/pytorch-tutorial generative_adversarial_network/main.py ---------------------------------

@needs("torchvision")
def test_yunjey_gan_two_sequentials_and_reset_grad(tmp_path):
    write_mnist(tmp_path / "tutorials" / "data" / "MNIST" / "raw", train=400, test=10)
    folder = tmp_path / "tutorials" / "03-advanced" / "generative_adversarial_network"
    folder.mkdir(parents=True)
    d = ex.linear(256, 784) + ex.linear(256, 256) + ex.linear(1, 256)
    g = ex.linear(256, 64) + ex.linear(256, 256) + ex.linear(784, 256)
    params = ex.device_bytes(d + g, ex.FP32)
    est = estimate_here("r19b_yunjey_gan.py", flags=("--gpu", "h100-80gb"), cwd=folder)
    # two Adams, two moments each; the generator's backward runs through D and makes D's
    # gradients too (reset_grad() clears both only before the next backward): at the peak
    # both networks' gradients are live
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=est.breakdown["workspace"])
    assert est.breakdown["gradient"] == params
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # a batch (100, 784), the host-made BCE targets (100, 1) x 2 and one `z` (100, 64)
    assert est.breakdown["input"] == (ex.rounded(100 * 784 * ex.FP32) + 2 * ex.rounded(100 * 4)
                                      + ex.rounded(100 * 64 * ex.FP32))
    # 4 batches an epoch, 2 optimizer steps a batch: the loop was ended at step 6, the first
    # epoch ran its last batch (8 steps); the later epochs, separated only by save_image, are
    # bare repeats of their last batch, so the job was stopped (at step 11 on 8577fa8) before
    # its final state-dict saves
    assert est.data["steps"] > 8 and est.data["stopped"]
    assert "stopped after" in _notes(est) and "kept training after peakmem ended" in _notes(est)
    assert (folder / "samples" / "real_images.png").exists()
    assert (folder / "samples" / "fake_images-1.png").exists()
    assert not (folder / "G.ckpt").exists()


# pytorch/tutorials intermediate_source/mixed_precision_tutorial.py ------------------------------

MAX_MEMORY = re.compile(r"Max memory used by tensors = (\d+) bytes")


def test_mixed_precision_tutorial_sections_and_max_memory_allocated(tmp_path):
    layer = ex.device_bytes(ex.linear(4096, 4096), ex.FP32)
    params = 6 * layer
    data = 2 * 128 * 256 * 4096 * ex.FP32  # the data and targets lists: 1 GiB, made on the device
    est = estimate_here("r19b_mixed_precision_tutorial.py", flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path)
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the peak is the "All together" section's first forward (below, as in the full run): two
    # nets' weights, the data lists (`other`: made on the device), no gradient, plain SGD's
    # nothing, the new net's fp16 weight copies saved for the backward (five or six of them)
    assert est.breakdown["parameter"] == 2 * params and est.breakdown["other"] == data
    assert "gradient" not in est.breakdown and "optimizer_state" not in est.breakdown
    fp16_weight = ex.rounded(4096 * 4096 * 2)
    assert 5 * fp16_weight <= est.breakdown["activation"] <= 6 * fp16_weight
    # `for input, target in zip(data, targets)` is no DataLoader: each section's loops (the
    # epoch loop around it too) are ended after 3 steps (capture/loop_ends.py), so all five
    # sections run, both timers print; the fifth, the script's last statement, is stopped
    ended = [n for n in est.data["notes"] if n.startswith("ended 4 training loop(s)")]
    assert len(ended) == 1 and "r19b_mixed_precision_tutorial.py:60" in ended[0]
    assert est.data["stopped"] and "nothing after it was missed" in _notes(est)
    assert "With default precision:" in est.stderr and "With mixed precision:" in est.stderr
    default_printed = [int(n) for n in MAX_MEMORY.findall(est.stderr)]
    default_peak = est.data["peak_allocated_bytes"]
    # the first section's peak, in the first layer's backward: weights, their gradients, the
    # data, cuBLAS's workspace, two (256, 4096) fp32 blocks (a saved activation and the
    # gradient flowing back) and two 0-d blocks (the loss and its gradient)
    assert default_printed[0] == (params + params + data + est.breakdown["workspace"]
                                  + 2 * ex.rounded(256 * 4096 * ex.FP32) + 2 * ex.BLOCK)
    assert default_printed[1] == default_peak

    # all five sections (1152 steps: ~70 s here). The fake runtime's
    # reset_max_memory_allocated / max_memory_allocated give the simulated figures the
    # tutorial prints; its first section's is the default run's peak
    full = estimate_here("r19b_mixed_precision_tutorial.py",
                         flags=("--gpu", "h100-80gb", "--steps", "all"), cwd=tmp_path, timeout=600)
    assert full.returncode == 0, full.failure()
    assert not full.data["stopped"]
    printed = [int(n) for n in MAX_MEMORY.findall(full.stderr)]
    # both sections' figures, and the job's peak, are the default run's
    assert printed == default_printed
    assert full.data["peak_allocated_bytes"] == default_peak
    # the full run's peak is in the "All together" section: its first autocast forward runs
    # while the last section's `output` / `loss` still hold the old net's graph, whose
    # AccumulateGrad nodes keep the old weights alive (on a GPU as well): two nets, the data,
    # and the new net's fp16 weight copies saved for the backward, made layer by layer as the
    # forward reaches them (five of the six at the peak) with the fp16 layer outputs
    assert printed[1] == full.data["peak_allocated_bytes"]
    assert full.breakdown["parameter"] == 2 * params and full.breakdown["other"] == data
    assert "gradient" not in full.breakdown
    assert 5 * fp16_weight <= full.breakdown["activation"] <= 6 * fp16_weight
    # what a run stopped in the first section missed (before loop_ends: 1.956 GB)
    assert full.data["peak_allocated_bytes"] - default_printed[0] >= 200 * MiB


# fastai nbs/examples/train_imagenette.py ---------------------------------------------------------

def xresnet18_shapes(n_out: int) -> tuple[list[ex.Shape], list[int]]:
    """fastai's xresnet18: a 3-conv stem (3 -> 32 -> 32 -> 64), four stages of two ResBlocks
    (64, 128, 256, 512; each two 3x3 ConvLayers, a 1x1 id conv where the width changes), every
    conv bias-free with a BatchNorm; the Linear head. Also each BatchNorm's channels."""
    shapes: list[ex.Shape] = []
    channels: list[int] = []

    def conv_layer(c_out: int, c_in: int, k: int) -> None:
        shapes.extend(ex.conv(c_out, c_in, k, bias=False) + ex.norm(c_out))
        channels.append(c_out)

    for c_in, c_out in ((3, 32), (32, 32), (32, 64)):
        conv_layer(c_out, c_in, 3)
    sizes = [64, 64, 128, 256, 512]
    for stage in range(4):
        for block in range(2):
            c_in, c_out = (sizes[stage] if block == 0 else sizes[stage + 1]), sizes[stage + 1]
            conv_layer(c_out, c_in, 3)
            conv_layer(c_out, c_out, 3)
            if c_in != c_out:
                conv_layer(c_out, c_in, 1)
    return shapes + ex.linear(n_out, 512), channels


@needs("fastai", "torchvision")
def test_fastai_train_imagenette_ranger_fp16_mixup(tmp_path):
    import numpy as np
    from PIL import Image

    # imagenette2-320 as untar_data leaves it under $FASTAI_HOME/data: nothing downloaded
    rng = np.random.default_rng(0)
    root = tmp_path / "fastai" / "data" / "imagenette2-320"
    for split, count in (("train", 12), ("val", 4)):
        for label in ("n01440764", "n02102040"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(
                    root / split / label / f"{label}_{i}.JPEG")
    shapes, channels = xresnet18_shapes(10)
    params = ex.device_bytes(shapes, ex.FP32)
    env_before = os.environ.get("FASTAI_HOME")
    os.environ["FASTAI_HOME"] = str(tmp_path / "fastai")
    try:  # fastai patches torch when imported: in a child process, as round 11's test
        est = estimate("r19b_fastai_train_imagenette.py", "--size", "32", "--bs", "8",
                       "--epochs", "2", "--arch", "xresnet18", "--fp16", "1", "--mixup", "0.2",
                       flags=("--gpu", "h100-80gb"), cwd=tmp_path, timeout=300)
    finally:
        if env_before is None:
            os.environ.pop("FASTAI_HOME")
        else:
            os.environ["FASTAI_HOME"] = env_before
    # ranger = Lookahead(RAdam): grad_avg and sqr_avg per parameter and Lookahead's slow
    # weights (a copy of each, made at its first step): 3 x the parameters, all optimizer
    # state (the slow weights were `ema` before capture/fastai_optimizers.py read Lookahead's)
    assert_training(est, params=params, optimizer_state=3 * params,
                    extra_upper=est.breakdown["workspace"])
    assert "ema" not in est.breakdown
    # to_fp16() is autocast + GradScaler: fp32 weights and fp32 gradients
    assert est.breakdown["gradient"] == params
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # BatchNorm running mean / var and num_batches_tracked (int64)
    assert est.breakdown["buffer"] == sum(2 * ex.rounded(c * ex.FP32) + ex.BLOCK
                                          for c in channels)
    # 24 training images, batch 8: 3 a epoch; both epochs ran, each with its validation
    assert "training" in est.data["phases_ran"] and "eval" in est.data["phases_ran"]
    assert "Epoch 2/2" in est.stderr



# pytorch/tutorials intermediate_source/FSDP_tutorial.rst (FSDP_mnist.py) -------------------------

MNIST_NET = ex.conv(32, 1, 3) + ex.conv(64, 32, 3) + ex.linear(128, 9216) + ex.linear(10, 128)


@needs("torchvision")
def test_fsdp_tutorial_spawned_ranks_flat_parameter(tmp_path):
    write_mnist(tmp_path / "data" / "MNIST" / "raw", train=640, test=200)
    (tmp_path / "work").mkdir()  # the tutorial reads '../data'
    numel = ex.count(MNIST_NET)  # 1,199,882: FSDP(model) flattens them into one parameter
    args = ("--epochs", "2", "--save-model")
    # `mp.spawn(..., nprocs=torch.cuda.device_count())`: one process on one GPU, where FSDP
    # keeps the whole flat parameter (NO_SHARD)
    one = estimate("r19b_fsdp_mnist.py", *args, flags=("--gpu", "h100-80gb"),
                   cwd=tmp_path / "work")
    flat = ex.rounded(numel * ex.FP32)
    # Adadelta: square_avg and acc_delta
    assert_training(one, params=flat, optimizer_state=2 * flat,
                    extra_upper=one.breakdown["workspace"])
    assert one.data["mode"] == "fake", one.data["mode_reason"]
    assert "spawn of 1 process: it ran in the capture's process as rank 0" in _notes(one)
    # 640 images, batch 64: 10 a epoch, the loop ended in the second; each epoch's test()
    assert one.data["steps"] == 7
    assert one.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "Train Epoch: 2" in one.stderr and "Test set: Average loss" in one.stderr
    assert "CUDA event elapsed time" in one.stderr
    assert "instead of mnist_cnn.pt" in _notes(one)

    # two GPUs: device_count() answers 2, rank 0 is traced. Each rank keeps half the flat
    # parameter (1,199,882 is even: no padding) and Adadelta's state of that half; the
    # all-gathered full parameter is `communication` while the unit runs
    two = estimate("r19b_fsdp_mnist.py", *args, flags=("--gpu", "h100-80gb",
                                                       "--nproc-per-node", "2"),
                   cwd=tmp_path / "work")
    shard = ex.rounded(numel // 2 * ex.FP32)
    assert_training(two, params=shard, optimizer_state=2 * shard,
                    extra_upper=two.breakdown["workspace"] + flat)
    assert two.data["world_size"] == 2
    assert two.breakdown["communication"] == flat
    # the sampler's half of the data: 5 batches an epoch
    assert "DataLoader epoch of 5 batches" in _notes(two)
    assert two.data["peak_allocated_bytes"] < one.data["peak_allocated_bytes"]


# pyg-team/pytorch_geometric examples/link_pred.py -----------------------------------------------

CORA_FEATURES, CORA_CLASSES, CORA_ALL, CORA_TRAIN, CORA_TEST = 64, 7, 700, 140, 100


def write_planetoid_cora(raw: Path) -> int:
    """Planetoid's raw files for 'Cora' (`ind.cora.*`, pickled as the Planetoid repository
    ships them: scipy CSR features, one-hot numpy labels, an adjacency dict; the test indices
    as text) for 800 nodes: the first 140 labelled for training, PyG's 500 validation nodes
    after them, the 100 test nodes last. A ring plus one random neighbour per node. Returns
    the node count. With these in place nothing is downloaded."""
    import pickle
    from collections import defaultdict

    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(0)

    def features(rows: int):
        return sp.csr_matrix((rng.random((rows, CORA_FEATURES)) < 0.1).astype(np.float32))

    def one_hot(rows: int):
        out = np.zeros((rows, CORA_CLASSES), dtype=np.int64)
        out[np.arange(rows), rng.integers(0, CORA_CLASSES, rows)] = 1
        return out

    nodes = CORA_ALL + CORA_TEST
    graph: dict[int, list[int]] = defaultdict(list)
    for i in range(nodes):
        for j in {(i + 1) % nodes, int(rng.integers(0, nodes))} - {i}:
            graph[i].append(j)
            graph[j].append(i)
    files = {"x": features(CORA_TRAIN), "tx": features(CORA_TEST), "allx": features(CORA_ALL),
             "y": one_hot(CORA_TRAIN), "ty": one_hot(CORA_TEST), "ally": one_hot(CORA_ALL),
             "graph": graph}
    raw.mkdir(parents=True)
    for name, value in files.items():
        with open(raw / f"ind.cora.{name}", "wb") as out:
            pickle.dump(value, out)
    (raw / "ind.cora.test.index").write_text(
        "\n".join(str(CORA_ALL + i) for i in range(CORA_TEST)) + "\n")
    return nodes


@needs("torch_geometric", "sklearn", "scipy")
def test_pyg_link_pred_device_transform_and_negative_sampling(tmp_path):
    nodes = write_planetoid_cora(tmp_path / "data" / "Planetoid" / "Cora" / "raw")
    (tmp_path / "examples").mkdir()
    shutil.copy(SCRIPTS / "r19b_pyg_link_pred.py", tmp_path / "examples" / "link_pred.py")
    # GCNConv(64, 128) and GCNConv(128, 64): a bias-free Linear and a bias each
    shapes = [(128, CORA_FEATURES), (128,), (64, 128), (64,)]
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here(str(tmp_path / "examples" / "link_pred.py"),
                        flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam: two moments
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # `ToDevice` moved the graph at `dataset[0]`: x (800, 64) fp32, y int64 and the three
    # bool masks stay on the device (the splits share x); the full edge_index was replaced by
    # the splits' own edges
    assert est.breakdown["input"] == (ex.rounded(nodes * CORA_FEATURES * ex.FP32)
                                      + ex.rounded(nodes * 8) + 3 * ex.rounded(nodes))
    # 100 full-graph epochs, no DataLoader: the epoch loop was ended after 3 steps, each
    # followed by the two no-grad AUC passes (fake reads are zeros: one class, so scikit-learn
    # says nan); then the final print and `decode_all` ran (capture/loop_ends.py)
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "Epoch: 003, Loss:" in est.stderr and "Epoch: 004" not in est.stderr
    assert "Final Test:" in est.stderr
    assert "ended 1 training loop(s) without a DataLoader" in _notes(est)
    assert "an evaluation phase (forward passes without gradients) ran" in _notes(est)
    # the peak is decode_all's: `(z @ z.t() > 0).nonzero()` is data-dependent, every entry
    # taken as nonzero in fake mode (cuda_rules/data_dependent.py): the (800 x 800, 2) int64
    # indices, besides the (800, 800) fp32 product and its bool mask
    assert est.breakdown["temporary"] >= ex.rounded(nodes * nodes * 2 * 8)
    # the run to the end (100 epochs) reaches the same peak
    full = estimate_here(str(tmp_path / "examples" / "link_pred.py"),
                         flags=("--gpu", "h100-80gb", "--steps", "all"), cwd=tmp_path, timeout=600)
    assert full.returncode == 0, full.failure()
    assert full.data["steps"] == 100 and not full.data["stopped"]
    assert full.data["peak_allocated_bytes"] == est.data["peak_allocated_bytes"]
    assert full.breakdown == est.breakdown


# yunjey/pytorch-tutorial neural_style_transfer/main.py -----------------------------------------

VGG19_FEATURES = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
                  512, 512, 512, 512, "M"]


def vgg19_feature_convs() -> list[list[ex.Shape]]:
    """vgg19().features' sixteen 3x3 convolutions (weight and bias each), in order."""
    convs, channels = [], 3
    for width in VGG19_FEATURES:
        if width != "M":
            convs.append(ex.conv(width, channels, 3))
            channels = width
    return convs


@needs("torchvision")
def test_yunjey_neural_style_adam_over_the_image(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "png").mkdir()
    Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)).save(
        tmp_path / "png" / "content.png")
    Image.fromarray(rng.integers(0, 255, (90, 90, 3), dtype=np.uint8)).save(
        tmp_path / "png" / "style.png")
    # `models.vgg19(pretrained=True)` reads the torch.hub cache: zeros of its shapes (575 MB)
    _hub_weights(tmp_path / "torch", "vgg19", "vgg19-dcbb9e9d.pth")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    est = estimate_here("r19b_yunjey_neural_style.py", "--max_size", "64", "--total_step", "5",
                        "--log_step", "1", "--sample_step", "2",
                        flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    shutil.rmtree(tmp_path / "torch")  # the 575 MB weights file
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 160 x 120 scaled to 64 x 48: the content, the style resized to it, and the target image
    # (`content.clone().requires_grad_(True)`, the tensor Adam steps: a parameter)
    image = ex.rounded(3 * 48 * 64 * ex.FP32)
    convs = vgg19_feature_convs()
    vgg = ex.device_bytes([shape for conv in convs for shape in conv], ex.FP32)
    assert est.breakdown["parameter"] == vgg + image
    # Adam over the target alone: two moments of one image
    assert est.breakdown["optimizer_state"] == 2 * image
    # the VGG's parameters keep requires_grad and no optimizer clears them: their gradients,
    # made by the first backward, stay (accumulated) all run. Not conv5_2 to conv5_4: their
    # outputs, computed by the loop over every layer, feed no loss
    assert est.breakdown["gradient"] == ex.device_bytes(
        [shape for conv in convs[:13] for shape in conv], ex.FP32)
    assert 2 * image <= est.breakdown["input"] <= 2 * image + ex.BLOCK
    # 2000 steps in a plain loop: stopped after 3 (the image saved at step 2 was written)
    assert est.data["steps"] == 3 and est.data["stopped"]
    assert "Step [2/5], Content Loss:" in est.stderr
    assert (tmp_path / "output-2.png").exists()
