"""Round 11: training scripts from well-known repositories not covered before, each re-created
in a tiny script the way the public source it cites writes it and run unmodified
(scripts/r11_*.py). Parameter, gradient and optimizer bytes are worked out by hand
(expected.py), not read from peakmem. Jobs that need torch alone run in this process
(`estimate_here`): the child-process path is covered by the earlier rounds' tests."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import MiB, assert_training, needs

KNOWN_VALUES = importlib.util.find_spec("peakmem.capture.known_values") is not None
"""Whether fake mode carries small known host values through device ops (`labels.max()` of
labels copied from the host): branch k1 re-lands it (capture/known_values.py)."""


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# pytorch/examples gat/main.py: dense multi-head graph attention on Cora ---------------------------

GAT_NODES, GAT_FEATURES, GAT_CLASSES, GAT_EDGES = 1700, 24, 7, 3000
"""The synthetic Cora: more than 1600 nodes (the script's split is idx[:1200], idx[1200:1600],
idx[1600:]), binary word features, seven classes named like Cora's."""


def write_cora(root: Path) -> None:
    """./cora/cora.content (`<paper id> <features...> <class>`) and ./cora/cora.cites (`<cited>
    <citing>`), the tab- and space-separated files of linqs' cora.tgz, in `root`: with both
    present the script downloads nothing."""
    rng = random.Random(0)
    cora = root / "cora"
    cora.mkdir()
    ids = rng.sample(range(10, 10**6), GAT_NODES)
    rows = [" ".join([str(paper)] + [str(rng.randint(0, 1)) for _ in range(GAT_FEATURES)]
                     + [f"Class_{index % GAT_CLASSES}"]) for index, paper in enumerate(ids)]
    (cora / "cora.content").write_text("\n".join(rows) + "\n")
    cites = [f"{rng.choice(ids)}\t{rng.choice(ids)}" for _ in range(GAT_EDGES)]
    (cora / "cora.cites").write_text("\n".join(cites) + "\n")


def gat_shapes(features: int, hidden: int, heads: int, classes: int) -> list[ex.Shape]:
    """GAT: two GraphAttentionLayers (heads averaged: n_hidden = out_features), each a bare
    W (in, n_hidden * heads) and a (heads, 2 * n_hidden, 1); the second has one head."""
    return [(features, hidden * heads), (heads, 2 * hidden, 1), (hidden, classes), (1, 2 * classes, 1)]


@pytest.mark.xfail(not KNOWN_VALUES, strict=True,
                   reason="`num_classes=labels.max().item() + 1` reads 0 without known values: "
                          "fake mode builds a 1-class head (capture/known_values.py, branch k1)")
def test_gat_dense_attention_over_all_node_pairs(tmp_path):
    hidden, heads, epochs = 64, 8, 3
    write_cora(tmp_path)
    params = ex.device_bytes(gat_shapes(GAT_FEATURES, hidden, heads, GAT_CLASSES), ex.FP32)
    est = estimate_here("r11_examples_gat.py", "--epochs", str(epochs), "--val-every", "1",
                        "--hidden-dim", str(hidden), "--num-heads", str(heads), cwd=tmp_path)
    scores = heads * GAT_NODES**2 * ex.FP32  # one (heads, V, V) fp32 attention tensor
    # the first layer keeps for backward its scores (LeakyReLU's input), the softmax output,
    # the dropout mask (bool) and the dropped attention (matmul's input): 13 bytes a score
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam, weight decay
                    extra_lower=3 * scores + scores // 4, extra_upper=8 * scores)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["activation"] >= 3 * scores + scores // 4, est.breakdown
    # the adjacency: `torch.eye(V) + sparse COO` is a dense (V, V) fp32 matrix moved to the device
    assert est.breakdown["input"] >= ex.rounded(GAT_NODES**2 * ex.FP32), est.breakdown
    # each step is followed by test() on the train and validation masks, under no_grad; the
    # epoch loop (no DataLoader) is ended at the limit, 3 steps, which is its own end here:
    # the last epoch's evaluation and the final test after the loop ran (capture/loop_ends.py)
    assert est.data["phases_ran"] == ["training", "eval"] * epochs
    assert est.data["steps"] == epochs and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in _notes(est)
    assert "Dataset already downloaded..." in est.stderr


# transformers examples/pytorch/language-modeling/run_plm.py: XLNet permutation LM, Trainer -------

XLNET = dict(vocab=256, d_model=64, layers=2, heads=4, d_inner=128)
"""`--config_overrides` on the script's `XLNetConfig()` (whose defaults are XLNet-large's).
`update_from_string` sets only the keys given: d_head must be given too (d_model // n_head), or
the checkpoint's `config.save_pretrained` fails its validation, on a GPU as here."""
PLM_SEQ, PLM_BATCH = 32, 4


def xlnet_lm_shapes(vocab: int, d_model: int, layers: int, heads: int, d_inner: int
                    ) -> tuple[list[ex.Shape], list[ex.Shape]]:
    """XLNetLMHeadModel: (all parameters, those no gradient reaches). The word embedding and
    mask_emb (1, 1, d); per layer the relative attention's q / k / v / o / r projections
    (d, heads, d_head) each, its r_r / r_s / r_w biases (heads, d_head) and seg_embed
    (2, heads, d_head), its LayerNorm, the feed-forward LayerNorm, layer_1 and layer_2; lm_loss
    is tied to the word embedding (only its bias is a tensor of its own). Without
    token_type_ids, seg_embed and r_s_bias take no part in the loss: no gradient, so no
    AdamW state either."""
    d_head = d_model // heads
    shapes: list[ex.Shape] = [(vocab, d_model), (1, 1, d_model)]
    unused: list[ex.Shape] = []
    for _ in range(layers):
        shapes += 5 * [(d_model, heads, d_head)] + 3 * [(heads, d_head)] + [(2, heads, d_head)]
        shapes += ex.norm(d_model) + ex.norm(d_model) + ex.linear(d_inner, d_model) + ex.linear(d_model, d_inner)
        unused += [(heads, d_head), (2, heads, d_head)]  # r_s_bias, seg_embed
    return shapes + [(vocab,)], unused


def test_run_plm_xlnet_permutation_masks_with_the_trainer(tmp_path):
    pytest.importorskip("datasets")
    from tests.library_jobs.test_library_jobs_hf import sentences, write_tokenizer

    tokenizer = write_tokenizer(tmp_path / "tokenizer")  # 126 words: no resize of the 256 rows
    (tmp_path / "train.txt").write_text("\n".join(sentences(200)) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(sentences(20, seed=1)) + "\n")
    overrides = ("d_model={d_model},n_layer={layers},n_head={heads},d_head={d_head},"
                 "d_inner={d_inner},vocab_size={vocab}")
    est = estimate_here(
        "r11_hf_ex_run_plm.py", "--config_overrides", overrides.format(**XLNET, d_head=XLNET["d_model"] // XLNET["heads"]),
        "--tokenizer_name", str(tokenizer), "--train_file", "train.txt",
        "--validation_file", "valid.txt", "--max_seq_length", str(PLM_SEQ),
        "--per_device_train_batch_size", str(PLM_BATCH), "--per_device_eval_batch_size", str(PLM_BATCH),
        "--max_steps", "3", "--do_train", "--do_eval", "--report_to", "none", "--seed", "0",
        "--output_dir", "out", cwd=tmp_path)
    shapes, unused = xlnet_lm_shapes(**XLNET)
    params = ex.device_bytes(shapes, ex.FP32)
    trained = params - ex.device_bytes(unused, ex.FP32)
    # the Trainer's fused AdamW: two moments and a device `step` (0-d fp32, one block) for each
    # parameter that got a gradient; none for seg_embed / r_s_bias
    state = 2 * trained + ex.BLOCK * (len(shapes) - len(unused))
    assert_training(est, params=params, grads=trained, optimizer_state=state)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval"]
    # the collator's batch: input_ids and labels (batch, seq) int64, perm_mask and
    # target_mapping (batch, seq, seq) fp32
    batch = 2 * ex.rounded(PLM_BATCH * PLM_SEQ * 8) + 2 * ex.rounded(PLM_BATCH * PLM_SEQ**2 * ex.FP32)
    assert est.breakdown["input"] >= batch, est.breakdown
    assert "perplexity" in est.stderr and (tmp_path / "out" / "eval_results.json").is_file()


# lucidrains/denoising-diffusion-pytorch: the README's Unet + GaussianDiffusion + Trainer ---------

def lucidrains_unet_shapes(dim: int, dim_mults: tuple[int, ...], channels: int = 3, heads: int = 4,
                           dim_head: int = 32, mem_kv: int = 4) -> list[ex.Shape]:
    """denoising_diffusion_pytorch's `Unet` (no self-conditioning, fixed sinusoidal time
    embedding): init_conv 7x7; time_mlp Linear(dim, 4 dim), Linear(4 dim, 4 dim); per stage two
    ResnetBlocks (a Linear(time, 2 out) scale-shift, two 3x3 Blocks each with an RMSNorm gain
    (1, c, 1, 1), a 1x1 res_conv when the widths differ), LinearAttention (RMSNorm, mem_kv
    (2, heads, dim_head, mem), a bias-free 1x1 to_qkv, to_out 1x1 + RMSNorm) or, on the last
    stage, full Attention (mem_kv (2, heads, mem, dim_head), no norm after to_out), then a
    Downsample (pixel-unshuffle + 1x1 of 4x the channels) or, last, a 3x3; the middle
    ResnetBlock / Attention / ResnetBlock; the up path mirrored on the skip-concatenated widths
    with Upsample (nearest + 3x3) or a 3x3; a final ResnetBlock on 2 dim and a 1x1 out conv."""
    time_dim, hidden = 4 * dim, heads * dim_head

    def gain(d: int) -> list[ex.Shape]:
        return [(1, d, 1, 1)]

    def resnet(d_in: int, d_out: int) -> list[ex.Shape]:
        shapes = ex.linear(2 * d_out, time_dim) + ex.conv(d_out, d_in, 3) + gain(d_out)
        shapes += ex.conv(d_out, d_out, 3) + gain(d_out)
        return shapes + (ex.conv(d_out, d_in, 1) if d_in != d_out else [])

    def attention(d: int, full: bool) -> list[ex.Shape]:
        memory = (2, heads, mem_kv, dim_head) if full else (2, heads, dim_head, mem_kv)
        shapes = gain(d) + [memory, (3 * hidden, d, 1, 1)] + ex.conv(d, hidden, 1)
        return shapes if full else shapes + gain(d)

    dims = [dim, *(dim * m for m in dim_mults)]
    in_out = list(zip(dims[:-1], dims[1:], strict=True))
    shapes = ex.conv(dim, channels, 7) + ex.linear(time_dim, dim) + ex.linear(time_dim, time_dim)
    for index, (d_in, d_out) in enumerate(in_out):
        last = index == len(in_out) - 1
        shapes += resnet(d_in, d_in) + resnet(d_in, d_in) + attention(d_in, full=last)
        shapes += ex.conv(d_out, d_in, 3) if last else ex.conv(d_out, 4 * d_in, 1)
    shapes += resnet(dims[-1], dims[-1]) + attention(dims[-1], full=True) + resnet(dims[-1], dims[-1])
    for index, (d_in, d_out) in enumerate(reversed(in_out)):
        first = index == 0
        shapes += resnet(d_out + d_in, d_out) + resnet(d_out + d_in, d_out) + attention(d_out, full=first)
        shapes += ex.conv(d_in, d_out, 3)  # Upsample's conv, or the last stage's 3x3
    return shapes + resnet(2 * dim, dim) + ex.conv(channels, dim, 1)


DDPM_TIMESTEPS = 100
DDPM_SCHEDULE_BUFFERS = 13
"""GaussianDiffusion's fp32 (timesteps,) buffers: betas, alphas_cumprod(_prev), the six
sqrt / log terms, the posterior variance, its clipped log and two mean coefficients, and
loss_weight."""


@needs("denoising_diffusion_pytorch", "ema_pytorch", "PIL")
def test_lucidrains_ddpm_trainer_ema_copy_amp_and_ddim_samples(tmp_path):
    from PIL import Image

    rng = random.Random(0)
    (tmp_path / "images").mkdir()
    for index in range(100):  # the Trainer asserts at least 100 images
        colour = tuple(rng.randrange(256) for _ in range(3))
        Image.new("RGB", (40, 40), colour).save(tmp_path / "images" / f"{index:03d}.png")
    est = estimate("r11_lucidrains_ddpm_trainer.py", "images", "--dim", "16", "--dim-mults", "1", "2",
                   "--image-size", "32", "--timesteps", str(DDPM_TIMESTEPS), "--sampling-timesteps", "10",
                   "--batch-size", "8", "--accumulate", "2", "--steps", "4", "--save-every", "2",
                   "--num-samples", "4", "--no-fid", cwd=tmp_path)
    params = ex.device_bytes(lucidrains_unet_shapes(16, (1, 2)), ex.FP32)
    # Adam (not fused): exp_avg and exp_avg_sq, `step` on the host; fp16 autocast keeps the
    # fp32 weights; the activations of a batch of 8 at 32 x 32 (~70 MB) go above twice the
    # model state
    assert_training(est, params=params, optimizer_state=2 * params, extra_upper=64 * MiB)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # ema-pytorch's deepcopy of the diffusion model, moved with `ema.to(device)` and synced with
    # `_foreach_lerp_` after each step
    assert est.breakdown["ema"] == params, est.breakdown
    # the schedule's buffers twice (the model and its EMA copy) and the EMA wrapper's 0-d
    # `initted` and `step`; the copy's were `input` before (its own forward never runs:
    # sampling calls the Unet's): capture/module_apply.py moved_module_buffers
    schedule = ex.device_bytes(DDPM_SCHEDULE_BUFFERS * [(DDPM_TIMESTEPS,)], ex.FP32)
    assert est.breakdown["buffer"] == 2 * schedule + 2 * ex.BLOCK, est.breakdown
    assert est.breakdown["input"] == ex.rounded(8 * 3 * 32 * 32 * ex.FP32)  # one batch, no buffers
    # `save_and_sample_every=2`: DDIM samples from the EMA model under inference_mode after
    # steps 2 and 4, each followed by a `torch.save` of the state (diverted: fake device data)
    assert est.data["steps"] == 4
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"], est.data["phases_ran"]
    notes = _notes(est)
    assert "accumulation window 2" in notes
    assert "results/model-1.pt" in notes and "results/model-2.pt" in notes
    assert (tmp_path / "results" / "sample-2.png").is_file()
    assert "training complete" in est.stderr


# Project-MONAI/tutorials 2d_segmentation/torch/unet_training_dict.py ---------------------------

def monai_unet_shapes(in_channels: int, out_channels: int, channels: tuple[int, ...]) -> list[ex.Shape]:
    """monai.networks.nets.UNet(spatial_dims=2, strides 2, num_res_units=2), built as its
    `_create_block` recursion builds it: each level's down path a ResidualUnit of two 3x3
    Convolutions (conv + bias, InstanceNorm without affine weights, a one-weight PReLU) and a
    3x3 strided residual conv; the bottom a stride-1 ResidualUnit with a 1x1 residual; each
    up path a transposed 3x3 Convolution (weight (in, out, 3, 3), PReLU) and a one-unit
    ResidualUnit (identity residual) whose conv, on the top level, is conv-only (no PReLU)."""
    prelu: list[ex.Shape] = [(1,)]
    shapes: list[ex.Shape] = []

    def unit(c_in: int, c_out: int, act: bool = True) -> list[ex.Shape]:
        return ex.conv(c_out, c_in, 3) + (prelu if act else [])

    def residual_unit(c_in: int, c_out: int, stride: int) -> list[ex.Shape]:
        return unit(c_in, c_out) + unit(c_out, c_out) + ex.conv(c_out, c_in, 3 if stride != 1 else 1)

    def level(c_in: int, c_out: int, widths: tuple[int, ...], top: bool) -> None:
        width = widths[0]
        if len(widths) > 2:
            level(width, width, widths[1:], False)
            up_in = 2 * width
        else:
            shapes.extend(residual_unit(width, widths[1], 1))  # the bottom layer
            up_in = width + widths[1]
        shapes.extend(residual_unit(c_in, width, 2))
        shapes.extend([(up_in, c_out, 3, 3), (c_out,), *prelu, *unit(c_out, c_out, act=not top)])

    level(in_channels, out_channels, channels, True)
    return shapes


@pytest.mark.slow
@needs("monai", "tensorboard", "PIL")
def test_monai_unet_dict_transforms_sliding_window_validation(tmp_path):
    # the tutorial as written: 40 synthetic 128 x 128 pairs, ten epochs, a validation every two
    est = estimate("r11_monai_unet_training_dict.py", cwd=tmp_path)
    params = ex.device_bytes(monai_unet_shapes(1, 1, (16, 32, 64, 128, 256)), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam, host `step`s
                    extra_upper=32 * MiB)  # activations of 8 crops at 96 x 96
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval"] * 5, est.data["phases_ran"]
    # RandCropByPosNegLabeld(num_samples=4) on batches of 2 images: 8 crops of image and mask;
    # `val_images` / `val_labels` (1, 1, 128, 128) stay alive after each validation (the
    # tutorial keeps them for plot_2d_or_3d_image) and the peak comes in a later epoch
    crops = ex.rounded(8 * 96 * 96 * ex.FP32)
    val_image = ex.rounded(128 * 128 * ex.FP32)
    assert est.breakdown["input"] == 2 * crops + 2 * val_image, est.breakdown
    assert "best_metric_model_segmentation2d_dict.pth" in _notes(est)  # diverted: fake device data
    assert list((tmp_path / "runs").glob("*/events.out.tfevents.*"))
    assert "train completed" in est.stderr


# transformers examples/pytorch/image-pretraining/run_mae.py: ViTMAE pre-training, Trainer -------

VIT_MAE = dict(hidden=64, layers=2, heads=4, intermediate=128, image=32, patch=8,
               decoder_hidden=32, decoder_layers=1, decoder_heads=4, decoder_intermediate=64)
MAE_OVERRIDES = ("hidden_size={hidden},num_hidden_layers={layers},num_attention_heads={heads},"
                 "intermediate_size={intermediate},image_size={image},patch_size={patch},"
                 "decoder_hidden_size={decoder_hidden},decoder_num_hidden_layers={decoder_layers},"
                 "decoder_num_attention_heads={decoder_heads},"
                 "decoder_intermediate_size={decoder_intermediate}").format(**VIT_MAE)


def vit_mae_shapes(hidden: int, layers: int, intermediate: int, image: int, patch: int,
                   decoder_hidden: int, decoder_layers: int, decoder_intermediate: int, **_: int
                   ) -> tuple[list[ex.Shape], list[ex.Shape]]:
    """ViTMAEForPreTraining: (trained parameters, frozen ones). The encoder's CLS token, patch
    projection (a conv with bias), pre-norm layers (LayerNorm, q / k / v / output Linear,
    LayerNorm, intermediate and output Linear) and final LayerNorm; the decoder's embed Linear,
    mask token, layers, norm and pixel prediction Linear (patch^2 x 3 outputs). The two
    position embeddings (patches + 1 rows) are fixed sin-cos tables: Parameters with
    requires_grad=False (no gradient, no AdamW state)."""
    def layer(h: int, i: int) -> list[ex.Shape]:
        return ex.norm(h) + 4 * ex.linear(h, h) + ex.norm(h) + ex.linear(i, h) + ex.linear(h, i)

    patches = (image // patch) ** 2
    trained = [(1, 1, hidden), *ex.conv(hidden, 3, patch)] + layers * layer(hidden, intermediate)
    trained += ex.norm(hidden) + ex.linear(decoder_hidden, hidden) + [(1, 1, decoder_hidden)]
    trained += decoder_layers * layer(decoder_hidden, decoder_intermediate) + ex.norm(decoder_hidden)
    trained += ex.linear(patch * patch * 3, decoder_hidden)
    return trained, [(1, patches + 1, hidden), (1, patches + 1, decoder_hidden)]


@needs("datasets", "PIL", "torchvision")
def test_run_mae_vit_mae_pretraining_with_frozen_position_tables(tmp_path):
    import json

    from tests.library_jobs.test_library_jobs_hf import write_image_folder

    write_image_folder(tmp_path / "images", 12, seed=0)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    }))
    # the README's flags: the Trainer must keep the `image` column for set_transform, and the
    # "labels" are the pixel values
    est = estimate_here(
        "r11_hf_ex_run_mae.py", "--dataset_name", "imagefolder", "--train_dir", "images/**",
        "--image_processor_name", "proc", "--config_overrides", MAE_OVERRIDES,
        "--remove_unused_columns", "False", "--label_names", "pixel_values",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--max_steps", "3",
        "--do_train", "--do_eval", "--report_to", "none", "--seed", "0", "--output_dir", "out",
        cwd=tmp_path)
    trained, frozen = vit_mae_shapes(**VIT_MAE)
    params = ex.device_bytes(trained + frozen, ex.FP32)
    grads = ex.device_bytes(trained, ex.FP32)
    # the Trainer's fused AdamW: moments and a device `step` for the trained parameters only
    assert_training(est, params=params, grads=grads,
                    optimizer_state=2 * grads + ex.BLOCK * len(trained))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval"]
    # 24 images, 15% split off for validation: 20 train images, 5 batches of 4
    assert "DataLoader epoch of 5 batches" in _notes(est)
    assert (tmp_path / "out" / "eval_results.json").is_file()


# fastai nbs/examples/migrating_fastai.py: torchvision MNIST loaders in a fastai Learner ---------


@needs("fastai", "torchvision")
def test_fastai_learner_fit_one_cycle_with_its_own_adam_and_dataloader(tmp_path):
    write_mnist(tmp_path / "data" / "MNIST" / "raw", train=2560, test=512)
    (tmp_path / "work").mkdir()  # the example reads '../data'
    # the example's `DataLoader` is fastai's own (`from fastai.vision.all import *`), not
    # torch's: `--steps all` runs its 10 training batches, then the validation whose batch of
    # 512 sets the peak
    est = estimate("r11_fastai_migrating.py", flags=("--steps", "all"), cwd=tmp_path / "work")
    params = ex.device_bytes(ex.mnist_cnn_shapes(), ex.FP32)
    # validation at batch 512: conv1's (512, 32, 26, 26) and conv2's (512, 64, 24, 24) outputs
    evaluation = 512 * (32 * 26 * 26 + 64 * 24 * 24) * ex.FP32
    # fastai's Adam (fastai.optimizer, not torch.optim): grad_avg and sqr_avg per parameter,
    # `other` before capture/fastai_optimizers.py; its zero_grad zeroes the gradients in place
    assert_training(est, params=params, optimizer_state=2 * params, extra_lower=evaluation,
                    extra_upper=256 * MiB)  # cuDNN workspaces for the batch of 512
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 10  # 2560 images, batch 256, one epoch
    assert est.data["phases_ran"] == ["training", "eval"]
    assert "the peak was set by the evaluation after training" in _notes(est)
    # the validation batch (512 images and labels) is what is live at the peak
    assert est.breakdown["input"] == ex.rounded(512 * 28 * 28 * ex.FP32) + ex.rounded(512 * 8)
    # by default (capture/fastai_dataloader.py) fastai's epoch is shortened as torch's is: 3
    # full batches and the last, then the validation: the same peak as `--steps all`
    default = estimate("r11_fastai_migrating.py", cwd=tmp_path / "work")
    assert default.data["steps"] == 4 and default.data["phases_ran"] == ["training", "eval"]
    assert abs(default.data["peak_bytes"] - est.data["peak_bytes"]) <= 2 * MiB
    assert default.breakdown == est.breakdown
    assert "DataLoader epoch of 10 batches: traced 3 full batches, then its last" in _notes(default)
    assert "the peak was set by the evaluation after training" in _notes(default)
