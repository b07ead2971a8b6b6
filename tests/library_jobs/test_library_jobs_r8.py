"""Round 8: well-known training scripts and the libraries' known gaps (timm's Kron optimizer,
torchmetrics' R2Score, ...), each in a tiny script written the way the public source it cites
writes it, run unmodified through the real CLI (`python -m peakmem estimate --json -- python
SCRIPT ARGS`, scripts/r8_*.py). Parameter and optimizer bytes are worked out by hand
(expected.py), not read from peakmem."""

from __future__ import annotations

from math import prod

import pytest
import torch

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import (
    WORKSPACE_SLACK,
    MiB,
    assert_training,
    fused_steps,
    needs,
)


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# timm's Kron (PSGD) + torchmetrics' R2Score ------------------------------------------------------

def kron_factor_shapes(shape: ex.Shape, max_size: int = 2048, min_ndim: int = 2) -> list[ex.Shape]:
    """timm.optim.Kron's preconditioner factors of one parameter (`_init_Q_exprs`, default
    memory_save_mode None): a diagonal (a vector) for a dimension of size 1, one over
    `max_size_triangular` or a parameter of fewer than `min_ndim_triangular` dimensions, else a
    triangular (a full square matrix, `scale * torch.eye(size)`)."""
    return [(size,) if size == 1 or size > max_size or len(shape) < min_ndim else (size, size)
            for size in shape]


@needs("timm", "torchmetrics")
@pytest.mark.parametrize("opt", ["kron", "kronw"])
def test_timm_kron_optimizer_and_torchmetrics_r2score(opt):
    shapes = ex.linear(48, 24) + ex.linear(1, 48)
    params = ex.device_bytes(shapes, ex.FP32)
    factors = [factor for shape in shapes for factor in kron_factor_shapes(shape)]
    # momentum_buffer (like the parameter) + the factors Q, a list in each parameter's state
    state = params + ex.device_bytes(factors, ex.FP32)
    est = estimate_here("r8_timm_kron_r2score.py", "--opt", opt)
    assert_training(est, params=params, optimizer_state=state)
    # Kron's spectral-norm bound picks a row with `A[j]` (a 0-d device index) and R2Score's
    # compute writes `raw_scores[cond]` (a 0-d bool mask): both ran on fake tensors
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "epoch 1 loss" in est.stderr and "'r2':" in est.stderr
    assert "_precond_grad" in _notes(est)  # its torch.compile'd functions ran eagerly




def muon_suitable(shape: ex.Shape, min_dim_size: int = 4, max_aspect_ratio: float = 128.0) -> bool:
    """timm.optim.Muon's `_is_suitable_for_muon`: two non-unit dimensions, none leading, both
    (out, in x spatial) at least `min_dim_size`, an aspect ratio up to `max_aspect_ratio`;
    otherwise the parameter takes the AdamW fallback."""
    if len(shape) < 2 or sum(size > 1 for size in shape) < 2 or 1 in shape[:2]:
        return False
    rows, cols = shape[0], prod(shape[1:])
    return min(rows, cols) >= min_dim_size and max(rows, cols) / min(rows, cols) <= max_aspect_ratio


@needs("timm", "torchmetrics")
def test_timm_muon_optimizer_with_adamw_fallback():
    shapes = ex.linear(48, 24) + ex.linear(1, 48)
    params = ex.device_bytes(shapes, ex.FP32)
    # Muon: a momentum buffer for the 48 x 24 weight; AdamW (exp_avg, exp_avg_sq) for the
    # biases and the 1 x 48 head (a leading unit dimension); `step` stays on the host
    state = sum(ex.device_bytes([shape], ex.FP32) * (1 if muon_suitable(shape) else 2)
                for shape in shapes)
    assert [muon_suitable(shape) for shape in shapes] == [True, False, False, False]
    est = estimate_here("r8_timm_kron_r2score.py", "--opt", "muon")
    assert_training(est, params=params, optimizer_state=state)
    assert est.data["mode"] == "fake", est.data["mode_reason"]

@pytest.mark.slow
@needs("timm", "torchvision", "PIL")
def test_timm_train_pieces_opt_kron_on_resnet18_without_opt_einsum(tmp_path):
    import numpy as np
    from PIL import Image

    (tmp_path / "img").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
            tmp_path / "img" / f"{i}.png")
    shapes, _ = ex.resnet18_shapes(classes=10)
    params = ex.device_bytes(shapes, ex.FP32)
    factors = ex.device_bytes([f for shape in shapes for f in kron_factor_shapes(shape)], ex.FP32)
    est = estimate("r5_timm_pieces.py", "--data-dir", str(tmp_path / "img"), "--opt", "kron",
                   "-b", "2", "--epochs", "1")
    assert est.returncode == 0, est.failure()
    assert est.data["steps"] == 2, est.data["steps"]  # 4 images in batches of 2
    assert est.data["mode"] == "fake", est.data["mode_reason"]  # it timed out in eager mode
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == params + factors
    if not torch.backends.opt_einsum.is_available():
        # torch.einsum's left-to-right contraction of a conv weight's four factors: the
        # estimate is as large as torch makes it here, and says why
        assert "torch.einsum contracted" in _notes(est)
        assert not est.data["fits"]

# karpathy/nanoGPT train.py: init_from='resume', compile=False, gradient accumulation ------------

NANOGPT_RESUME = dict(vocab=512, positions=32, embd=64, layers=2)
"""r8_nanogpt_resume.py's defaults (block_size 32, bias=True, tied wte / lm_head)."""


def _nanogpt_data(folder) -> None:
    import numpy as np

    (folder / "data").mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 512, 4000).astype(np.uint16).tofile(folder / "data" / "train.bin")
    rng.integers(0, 512, 1000).astype(np.uint16).tofile(folder / "data" / "val.bin")


def _nanogpt_checkpoint(folder) -> None:
    """out/ckpt.pt as train.py writes it after a step of a compiled model (`_orig_mod.` keys),
    made on the host with the script's own model and AdamW."""
    import sys

    import torch

    from tests.library_jobs.harness import SCRIPTS

    sys.path.insert(0, str(SCRIPTS))
    try:
        from nanogpt_train import GPT, GPTConfig
    finally:
        sys.path.remove(str(SCRIPTS))
    model_args = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, bias=True, vocab_size=512,
                      dropout=0.0)
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    idx = torch.randint(0, 512, (2, 32))
    model(idx, idx)[1].backward()
    optimizer.step()
    (folder / "out").mkdir()
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict(), "model_args": model_args, "iter_num": 1,
                "best_val_loss": torch.tensor(6.2), "config": {}},
               folder / "out" / "ckpt.pt")


def test_nanogpt_resume_from_checkpoint_with_gradient_accumulation(tmp_path):
    shapes = ex.gpt2_shapes(**NANOGPT_RESUME)
    params = ex.device_bytes(shapes, ex.FP32)
    _nanogpt_data(tmp_path)
    _nanogpt_checkpoint(tmp_path)
    est = estimate_here("r8_nanogpt_resume.py", "--init_from=resume", "--max_iters=3", cwd=tmp_path)
    # fused AdamW (device_type "cuda"): exp_avg, exp_avg_sq and a device `step` per parameter,
    # loaded from the checkpoint (`torch.load(map_location=device)`)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes),
                    extra_lower=params)
    # `checkpoint = None` frees the dict, but the module-level `state_dict` still holds the
    # loaded model tensors on the device for the whole run
    assert est.breakdown["input"] >= params, est.breakdown
    assert "Resuming training from out" in est.stderr
    assert est.data["steps"] == 3 and "iter 1: loss" in est.stderr  # iter_num 1 from ckpt.pt
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# pytorch/tutorials amp_recipe: autocast + GradScaler, checkpointing, TorchScript ----------------

def _amp_recipe_shapes(in_size: int = 1024, out_size: int = 256, num_layers: int = 6) -> list:
    return [s for _ in range(num_layers - 1) for s in ex.linear(in_size, in_size)] + ex.linear(
        out_size, in_size)


AMP_BATCH = 1024 * (1024 + 256) * ex.FP32
AMP_DATA = 4 * AMP_BATCH
"""The recipe's lists of 4 input and target batches, made on the device up front."""


@pytest.mark.slow
def test_amp_recipe_non_reentrant_checkpointing_keeps_fewer_activations():
    params = ex.device_bytes(_amp_recipe_shapes(), ex.FP32)
    runs = {mode: estimate_here("r8_amp_recipe_checkpoint_jit.py", "--dtype", "bfloat16",
                                "--checkpoint", mode) for mode in ("none", "non-reentrant")}
    for est in runs.values():
        # SGD without momentum: no state; bfloat16 autocast: the scaler disabled
        assert_training(est, params=params, optimizer_state=0, extra_lower=AMP_DATA)
        assert est.data["mode"] == "fake", est.data["mode_reason"]
    plain, checkpointed = runs["none"], runs["non-reentrant"]
    # 5 checkpointed layers keep their input only; the others keep each Linear's bf16 input
    # and ReLU output (1024 x 1024 x 2 bytes each) until backward
    assert checkpointed.breakdown["activation"] * 4 < plain.breakdown["activation"]
    assert checkpointed.data["peak_allocated_bytes"] < plain.data["peak_allocated_bytes"]


@pytest.mark.parametrize("flags", [("--dtype", "float16", "--checkpoint", "reentrant",
                                    "--num-batches", "2"),
                                   ("--dtype", "bfloat16", "--jit")],
                         ids=["fp16-scaler-reentrant-checkpoint", "bf16-torchscript"])
def test_amp_recipe_reentrant_checkpoint_and_torchscript(flags):
    shapes = _amp_recipe_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r8_amp_recipe_checkpoint_jit.py", *flags)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    if "--jit" in flags:
        assert_training(est, params=params, optimizer_state=0, extra_lower=AMP_DATA)
        return
    # use_reentrant=True with inputs that do not require grad: as on a GPU, the checkpointed
    # layers get no gradients (torch warns), only the last Linear does
    out_layer = ex.device_bytes(shapes[-2:], ex.FP32)
    assert "None of the inputs have requires_grad=True" in est.stderr
    assert_training(est, params=params, optimizer_state=0, grads=out_layer,
                    extra_lower=2 * AMP_BATCH)
    # GradScaler's default init_scale; no inf found in fake mode's zeros, no growth in 2 steps
    assert "epoch 0 loss" in est.stderr and "scale 65536.0" in est.stderr


# facebookresearch/DiT train.py under torchrun ---------------------------------------------------

def dit_shapes(hidden: int = 64, depth: int = 2, patch: int = 2, in_channels: int = 4,
               classes: int = 10, mlp_ratio: int = 4) -> list:
    """DiT's trainable parameters (learn_sigma: 2 x in_channels out; a CFG null class)."""
    shapes = [(hidden, in_channels, patch, patch), (hidden,)]  # x_embedder.proj
    shapes += ex.linear(hidden, 256) + ex.linear(hidden, hidden)  # t_embedder.mlp
    shapes += [(classes + 1, hidden)]  # y_embedder.embedding_table
    for _ in range(depth):  # qkv, proj, fc1, fc2, adaLN_modulation (LayerNorms without affine)
        shapes += ex.linear(3 * hidden, hidden) + ex.linear(hidden, hidden)
        shapes += ex.linear(mlp_ratio * hidden, hidden) + ex.linear(hidden, mlp_ratio * hidden)
        shapes += ex.linear(6 * hidden, hidden)
    shapes += ex.linear(patch * patch * 2 * in_channels, hidden) + ex.linear(2 * hidden, hidden)
    return shapes


def tiny_vae_shapes(ch: int = 16, latent: int = 4, blocks: int = 4) -> list:
    """diffusers AutoencoderKL(layers_per_block=1, block_out_channels=(ch,) * blocks,
    latent_channels=latent): encoder (one resnet per block, a down-sampling conv but in the
    last), mid block (resnet, attention with q / k / v / out, resnet), quant convs, decoder
    (two resnets per block, an up-sampling conv but in the last)."""
    def conv(out_ch, in_ch, k):
        return [(out_ch, in_ch, k, k), (out_ch,)]

    norm = [(ch,), (ch,)]
    resnet = norm + conv(ch, ch, 3) + norm + conv(ch, ch, 3)
    mid = resnet + norm + [s for _ in range(4) for s in ex.linear(ch, ch)] + resnet
    encoder = conv(ch, 3, 3)
    decoder = conv(ch, latent, 3) + mid
    for b in range(blocks):
        sampler = conv(ch, ch, 3) if b < blocks - 1 else []
        encoder += resnet + sampler
        decoder += 2 * resnet + sampler
    encoder += mid + norm + conv(2 * latent, ch, 3)
    decoder += norm + conv(3, ch, 3)
    return encoder + conv(2 * latent, 2 * latent, 1) + conv(latent, latent, 1) + decoder


@needs("diffusers", "timm", "torchvision", "PIL")
def test_dit_train_torchrun_ema_vae_diffusion(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / "imgs" / f"c{c}").mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                tmp_path / "imgs" / f"c{c}" / f"{i}.png")
    trainable = ex.device_bytes(dit_shapes(), ex.FP32)
    dit = trainable + ex.device_bytes([(1, 4, 64)], ex.FP32)  # + the frozen sin-cos pos_embed
    vae = ex.device_bytes(tiny_vae_shapes(), ex.FP32)
    est = estimate("r8_dit_train.py", "--data-path", "imgs", cwd=tmp_path,
                   launcher=("torchrun", "--nproc_per_node", "2"))
    assert est.returncode == 0, est.failure()
    data, breakdown = est.data, est.breakdown
    assert data["estimate_kind"] == "training" and data["mode"] == "fake", data["mode_reason"]
    assert data["world_size"] == 2 and data["launcher"] == "torchrun"
    # 16 images, global batch 4 over 2 ranks: 4 steps of 2 per rank
    assert data["steps"] == 4 and "Dataset contains 16 images" in est.stderr
    assert "DiT Parameters: 182,432" in est.stderr  # numel of dit_shapes() + pos_embed
    # pos_embed has no gradient and so no AdamW state
    assert breakdown["gradient"] == trainable
    assert breakdown["optimizer_state"] == 2 * trainable
    # the model, its EMA copy and the VAE on the device (the EMA copy is labelled "ema" once
    # update_ema is seen syncing it with the model; the frozen pos_embed it copies is not)
    assert dit <= breakdown.get("ema", 0) + ex.device_bytes([(1, 4, 64)], ex.FP32), breakdown
    weights = sum(breakdown.get(k, 0) for k in ("parameter", "ema", "model_copy", "input", "other"))
    assert 2 * dit + vae <= weights <= 2 * dit + vae + MiB, breakdown
    model_state = 2 * dit + vae + 3 * trainable
    assert model_state <= data["peak_allocated_bytes"] <= 2 * model_state + WORKSPACE_SLACK
    assert "Saved checkpoint to results/checkpoints/0000003.pt" in est.stderr


# Liuhong99/Sophia: SophiaG with the sampled-label Hessian estimate every hess_interval --------

def test_sophia_g_with_hessian_updates_between_steps(tmp_path):
    import numpy as np

    data = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 512, 5000).astype(np.uint16).tofile(data)
    params = ex.device_bytes(ex.gpt2_shapes(vocab=512, positions=64, embd=64, layers=2),
                             ex.FP32)
    est = estimate_here("r8_sophia_nanogpt.py", "--data", str(data))
    # exp_avg and hessian per parameter (SophiaG keeps `step` on the host unless capturable)
    assert_training(est, params=params, optimizer_state=2 * params)
    # the Hessian pass after step 2: Categorical(logits).sample(), a backward, update_hessian
    assert "iter 1: hessian updated" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# facebookresearch/dino main_dino.py: multi-crop, teacher EMA ---------------------------------

def dino_vit_shapes(dim: int = 64, depth: int = 2, patch: int = 8, patches: int = 16) -> list:
    """vision_transformer.py's ViT (qkv_bias, no classifier head) at r8_dino_main.py's size."""
    shapes = [(dim, 3, patch, patch), (dim,), (1, 1, dim), (1, patches + 1, dim)]
    for _ in range(depth):
        shapes += [(dim,), (dim,), *ex.linear(3 * dim, dim), *ex.linear(dim, dim)]
        shapes += [(dim,), (dim,), *ex.linear(4 * dim, dim), *ex.linear(dim, 4 * dim)]
    return shapes + [(dim,), (dim,)]


@needs("torchvision", "PIL")
def test_dino_multicrop_student_teacher_weight_norm_head(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / "imgs" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                tmp_path / "imgs" / f"c{c}" / f"{i}.png")
    mlp = ex.linear(128, 64) + ex.linear(128, 128) + ex.linear(32, 128)
    weight_g, weight_v = [(256, 1)], [(256, 32)]  # the head's weight-normed last layer
    student = ex.device_bytes(dino_vit_shapes() + mlp + weight_g + weight_v, ex.FP32)
    trainable = student - ex.device_bytes(weight_g, ex.FP32)  # norm_last_layer: g frozen
    est = estimate("r8_dino_main.py", "--data_path", "imgs", cwd=tmp_path)
    # the teacher is a second full copy kept in sync from the student's trained weights: `ema`
    # (its copy of the frozen weight_g, synced from a weight no backward trains, stays a
    # parameter); from epoch 1 on the last layer has gradients (cancelled in epoch 0,
    # --freeze_last_layer 1) and AdamW state
    g = ex.device_bytes(weight_g, ex.FP32)
    assert_training(est, params=student + g, grads=trainable, optimizer_state=2 * trainable,
                    extra_lower=trainable)
    assert est.breakdown.get("ema") == trainable, est.breakdown
    assert "Will run the code on one GPU." in est.stderr
    # 8 images in batches of 4 (drop_last): 2 batches an epoch, both epochs
    assert "Epoch: [0] it 1" in est.stderr and "Epoch: [1] it 3" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# pytorch/tutorials transformer_tutorial.py (nn.TransformerEncoder language model) ------------

TUTORIAL_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "a",
                  "cat", "sat", "on", "mat", "while", "birds", "sing", "songs", "of", "spring"]


@pytest.mark.parametrize("flags", [(), ("--batch-first",)], ids=["seq-first", "batch-first"])
def test_transformer_tutorial_train_evaluate_best_checkpoint(tmp_path, flags):
    import random

    rng = random.Random(0)
    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(" ".join(rng.choice(TUTORIAL_WORDS) for _ in range(12)) + "."
                              for _ in range(40)))
    ntokens, d_model, d_hid = len(TUTORIAL_WORDS) + 2, 64, 128  # + "." and <unk>
    layer = [(3 * d_model, d_model), (3 * d_model,), *ex.linear(d_model, d_model),
             *ex.linear(d_hid, d_model), *ex.linear(d_model, d_hid), *[(d_model,)] * 4]
    shapes = [(ntokens, d_model), *layer, *layer, *ex.linear(ntokens, d_model)]
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r8_transformer_tutorial.py", "--data", str(text), *flags,
                        flags=("--steps", "all"))
    # SGD without momentum: no optimizer state
    assert_training(est, params=params, optimizer_state=0)
    assert est.breakdown["buffer"] == ex.device_bytes([(5000, 1, d_model)], ex.FP32)  # pe
    # evaluate() after each epoch (in eval mode, batch_first layers take the fused fast path),
    # then the best checkpoint loaded back
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "| end of epoch   2 |" in est.stderr and f"vocab {ntokens} " in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# pytorch/tutorials ZeroRedundancyOptimizer recipe (mp.spawn, gloo, DDP) -------------------------

@pytest.mark.parametrize("mode, states", [("zero", 1), ("adam", 2)])
def test_zero_redundancy_optimizer_recipe_mp_spawn_gloo(mode, states):
    shapes = [s for _ in range(20) for s in ex.linear(2000, 2000)]
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r8_zero_tutorial.py", "--mode", mode)
    # ZeroRedundancyOptimizer on 2 ranks: rank 0 keeps Adam's two moments for half of the
    # parameters (10 weights and 10 biases: the greedy partition by size alternates ranks)
    assert_training(est, params=params, optimizer_state=states * params)
    # the recipe's own max_memory_allocated prints, answered by the simulated allocator: the
    # figures its page shows before the step (the 20 x 16 MB model, then DDP's buckets); after
    # the step they differ (its run predates foreach Adam's parameter-sized temporaries)
    assert "Max memory allocated after creating local model: 335.0MB" in est.stderr
    assert "Max memory allocated after creating DDP: 656.0MB" in est.stderr
    assert "spawn of 2 processes" in _notes(est)
    assert "a fake gloo process group of world size 2" in _notes(est)


# pytorch/vision references/segmentation/train.py (fcn_resnet50, aux loss, amp) ---------------

def fcn_resnet50_shapes(classes: int) -> tuple[list, list]:
    """(parameters, BatchNorm channel counts) of torchvision's fcn_resnet50 with aux_loss: a
    ResNet-50 without its fc (Bottleneck blocks [3, 4, 6, 3], width = planes, 4x expansion,
    a 1x1 downsample on each stage's first block), FCNHead(2048) and FCNHead(1024)."""
    shapes, norms = [(64, 3, 7, 7)], [64]
    inplanes = 64
    for planes, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True):
        for block in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes, planes, 3, 3),
                       (4 * planes, planes, 1, 1)]
            norms += [planes, planes, 4 * planes]
            if block == 0:
                shapes.append((4 * planes, inplanes, 1, 1))
                norms.append(4 * planes)
            inplanes = 4 * planes
    for in_ch in (2048, 1024):  # classifier, aux_classifier
        shapes += [(in_ch // 4, in_ch, 3, 3), *ex.linear(classes, in_ch // 4)]
        shapes[-2] = (classes, in_ch // 4, 1, 1)
        norms.append(in_ch // 4)
    return shapes + [(c,) for c in norms for _ in range(2)], norms


@pytest.mark.slow
@needs("torchvision", "PIL")
def test_torchvision_segmentation_reference_fcn_aux_amp_confusion_matrix(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
            tmp_path / "images" / f"{i}.png")
        mask = rng.integers(0, 4, (40, 48), dtype=np.uint8)
        mask[:2] = 255  # ignored pixels
        Image.fromarray(mask).save(tmp_path / "masks" / f"{i}.png")
    shapes, norms = fcn_resnet50_shapes(classes=4)
    params = ex.device_bytes(shapes, ex.FP32)
    # running_mean and running_var per BatchNorm, and its int64 num_batches_tracked
    buffers = ex.device_bytes([(c,) for c in norms for _ in range(2)], ex.FP32)
    buffers += ex.BLOCK * len(norms)
    # in the test's process: torch and torchvision alone, no DataLoader workers (-j 0), no
    # process group, its log by print (the reference's child-process runs: r2, r3)
    est = estimate_here("r8_segmentation_train.py", "--data-path", str(tmp_path), "--aux-loss",
                        "--amp", "--epochs", "1", flags=("--steps", "all"))
    # SGD with momentum: one buffer per parameter
    assert_training(est, params=params, optimizer_state=params, extra_upper=256 * MiB)
    assert est.breakdown["buffer"] == buffers
    # evaluate(): the ConfusionMatrix's masked bincount (`a[k]` with k a device mask) ran
    assert est.data["phases_ran"] == ["training", "eval"]
    assert "mean IoU:" in est.stderr and "Epoch: [0] [2/3]" in est.stderr
    assert est.data["mode"] == "fake", est.data["mode_reason"]
