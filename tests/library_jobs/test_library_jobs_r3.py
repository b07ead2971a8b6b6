"""Round 3 of well-known training scripts re-created and run unmodified through the real CLI
(`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r3_*.py): the parameter and
optimizer bytes are worked out by hand from each script's layers (expected.py's helpers), not
read from peakmem."""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training, fused_steps, needs

LLMC_D2 = dict(vocab=512, positions=64, embd=64, layers=2)
"""r3_llmc_train_gpt2.py's "d2" model (biases on, lm_head tied to wte)."""


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


def _llmc_shard(path: Path, tokens: int, vocab: int) -> Path:
    """An llm.c token shard: a 256 x int32 header (magic 20240520, version 1, count), uint16 ids."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, tokens)
    path.write_bytes(header.tobytes() + (np.arange(tokens) * 7 % vocab).astype(np.uint16).tobytes())
    return path


def _zero_shard(shapes: list, world_size: int, rank: int) -> list:
    """ZeroRedundancyOptimizer's partition: each group's tensors, largest first, to the rank
    holding the fewest elements so far (the lowest rank on a tie); the totals carry over groups."""
    sizes = [0] * world_size
    mine = []
    groups = ([s for s in shapes if len(s) >= 2], [s for s in shapes if len(s) < 2])
    for group in groups:
        for shape in sorted(group, key=prod, reverse=True):
            owner = sizes.index(min(sizes))
            sizes[owner] += prod(shape)
            if owner == rank:
                mine.append(shape)
    return mine


def test_llmc_train_gpt2_bf16_flash_accumulation_c_bridge(tmp_path):
    shapes = ex.gpt2_shapes(**LLMC_D2)
    params = ex.device_bytes(shapes, ex.FP32)
    train = _llmc_shard(tmp_path / "train.bin", 4000, LLMC_D2["vocab"])
    val = _llmc_shard(tmp_path / "val.bin", 2000, LLMC_D2["vocab"])
    # in this process (the torchrun run below is llm.c's child path)
    est = estimate_here("r3_llmc_train_gpt2.py", "--model", "d2", "--input_bin", str(train),
                        "--input_val_bin", str(val), "--val_loss_every", "2", "--val_max_steps",
                        "2", "--sample_every", "3", "--num_iterations", "3", "--batch_size", "2",
                        "--sequence_length", "32", "--total_batch_size", "256", "--dtype",
                        "bfloat16", "--tensorcores", "1", "--flash", "1", "--output_dir",
                        str(tmp_path / "log"), cwd=tmp_path)
    # device == "cuda": fused AdamW, a device `step` per tensor; lm_head is wte (counted once)
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert est.breakdown["buffer"] == 2 * ex.device_bytes([(1, 1, 64, 64)], ex.FP32)  # the masks
    assert est.data["steps"] == 3
    # the write_tensors pass (forward + backward before the optimizer exists), then the
    # val-loss passes at steps 0 and 2 around the training steps
    assert est.data["phases_ran"][:2] == ["eval", "training"] and "eval" in est.data["phases_ran"][2:]
    # the C bridge read every parameter back to the host: `.cpu().numpy().tobytes()` of fake
    # tensors wrote files of the real size (a 1 KiB header, then the weights)
    weights = ex.count(shapes)
    assert (tmp_path / "gpt2_d2.bin").stat().st_size == 1024 + 4 * weights
    assert (tmp_path / "gpt2_d2_bf16.bin").stat().st_size == 1024 + 2 * weights
    assert (tmp_path / "gpt2_d2_debug_state.bin").stat().st_size > 1024 + 4 * weights
    assert "gradient accumulation steps: 4" in est.stderr


def test_llmc_train_gpt2_torchrun_two_ranks_zero1_compile(tmp_path):
    shapes = ex.gpt2_shapes(**LLMC_D2)
    params = ex.device_bytes(shapes, ex.FP32)
    train = _llmc_shard(tmp_path / "train.bin", 4000, LLMC_D2["vocab"])
    est = estimate("r3_llmc_train_gpt2.py", "--model", "d2", "--input_bin", str(train),
                   "--num_iterations", "2", "--batch_size", "4", "--sequence_length", "32",
                   "--total_batch_size", "512", "--zero_stage", "1", "--compile", "1",
                   "--write_tensors", "0", launcher=("torchrun", "--standalone", "--nproc_per_node", "2"),
                   cwd=tmp_path)
    # ZeroRedundancyOptimizer keeps AdamW's moments for rank 0's share only; llm.c passes
    # device "cuda:0" as device_type under DDP, so AdamW is not fused (host `step`s)
    rank0 = _zero_shard(shapes, world_size=2, rank=0)
    assert 0 < len(rank0) < len(shapes)
    assert_training(est, params=params, optimizer_state=2 * ex.device_bytes(rank0, ex.FP32))
    assert est.data["world_size"] == 2 and est.data["launcher"] == "torchrun"
    assert "torch.compile" in _notes(est)


# pytorch/examples distributed/ddp-tutorial-series ---------------------------------------------

LINEAR_20_1 = ex.device_bytes(ex.linear(1, 20), ex.FP32)
"""The tutorial's model, nn.Linear(20, 1): two tensors, one 512-byte block each."""


def _ddp_tutorial(script: str, *args: str, flags=(), launcher=None, cwd=None):
    if launcher is None and not flags:  # one process, torch alone: in this process
        est = estimate_here(script, "2", "1", *args, cwd=cwd)
    else:
        est = estimate(script, "2", "1", *args, flags=flags, launcher=launcher, cwd=cwd)
    # plain SGD (no momentum): no optimizer state
    assert_training(est, params=LINEAR_20_1, optimizer_state=0)
    # 2048 samples in batches of 32 (per rank); the checkpoint of each epoch (save_every 1)
    # went to peakmem's save folder, not the working directory
    assert est.data["steps"] == 7, _notes(est)
    assert "saved 2 file(s) of fake device data" in _notes(est)
    return est


def test_ddp_tutorial_single_gpu_int_device(tmp_path):
    est = _ddp_tutorial("r3_ddp_single_gpu.py", cwd=tmp_path)
    assert "DataLoader epoch of 64 batches" in _notes(est)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_ddp_tutorial_multigpu_torchrun_two_ranks(tmp_path):
    est = _ddp_tutorial("r3_ddp_multigpu_torchrun.py", cwd=tmp_path,
                        launcher=("torchrun", "--nproc_per_node", "2"))
    assert est.data["world_size"] == 2
    assert "DataLoader epoch of 32 batches" in _notes(est)  # the DistributedSampler's half
    assert not (tmp_path / "snapshot.pt").exists()


def test_ddp_tutorial_multigpu_mp_spawn_per_device(tmp_path):
    # world_size = torch.cuda.device_count(): --nproc-per-node says how many GPUs the job sees
    est = _ddp_tutorial("r3_ddp_multigpu.py", flags=("--nproc-per-node", "2"), cwd=tmp_path)
    assert est.data["world_size"] == 2
    assert "torch.multiprocessing spawn of 2 processes" in _notes(est)
    assert "DataLoader epoch of 32 batches" in _notes(est)


# Keller Jordan's cifar10-airbench -------------------------------------------------------------

def _cifar10_tensors(root: Path, train: int, test: int) -> None:
    """cifar10/{train,test}.pt as airbench94 writes them after torchvision's download: uint8
    images (N, 32, 32, 3), int64 labels, the class names."""
    (root / "cifar10").mkdir()
    generator = torch.Generator().manual_seed(0)
    for name, count in (("train", train), ("test", test)):
        images = torch.randint(0, 256, (count, 32, 32, 3), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, 10, (count,), generator=generator)
        torch.save({"images": images, "labels": labels, "classes": [str(c) for c in range(10)]},
                   root / "cifar10" / f"{name}.pt")


def test_airbench94_muon_fused_sgd_half_channels_last_compiled(tmp_path):
    _cifar10_tensors(tmp_path, train=4000, test=2000)
    FP16 = 2
    convs = [(64, 24, 3, 3), (64, 64, 3, 3), (256, 64, 3, 3)] + 3 * [(256, 256, 3, 3)]
    norms = [(c,) for c in (64, 64, 256, 256, 256, 256)]
    # .half() on every module but the BatchNorms (fp32); the whitening conv's weight and the
    # BatchNorms' weights are frozen (requires_grad=False)
    params = (ex.device_bytes([(24, 3, 2, 2), (24,), *convs, (10, 256)], FP16)
              + ex.device_bytes(2 * norms, ex.FP32))
    trained = ex.device_bytes([(24,), *convs, (10, 256)], FP16) + ex.device_bytes(norms, ex.FP32)
    first_map = 2000 * 64 * 32 * 32 * FP16  # conv1's output for a batch of 2000
    # a100-40gb: its cuDNN factor model keeps the peak in a later step, where the momentum
    # buffers exist (with the sm_90 per-shape table of the default H100 the first step's
    # channels-last workspaces set the peak, before any optimizer state)
    est = estimate_here("r3_airbench94_muon.py", cwd=tmp_path, timeout=480,
                        flags=("--gpu", "a100-40gb"))  # torch alone
    # fused nesterov SGD (whitening bias, BatchNorm biases, head) and Muon (the convolutions)
    # each keep one momentum buffer per trained tensor. `SGD(fused=True)` has no meta kernel
    # in torch: fake mode stopped and auto mode computed the job for real on the CPU (minutes)
    assert_training(est, params=params, optimizer_state=trained, grads=trained,
                    extra_upper=12 * first_map)
    assert est.data["mode"] == "fake"
    running_stats = 2 * [(64,), (64,), ()] + 4 * [(256,), (256,), ()]  # mean, var, count
    assert est.breakdown["buffer"] == ex.device_bytes(running_stats, ex.FP32)
    assert est.breakdown["activation"] >= 4 * first_map
    assert "zeropower_via_newtonschulz5, CifarNet ran eagerly" in _notes(est)
    assert "|  warmup  |      0  |" in est.stderr  # the first epoch's evaluation ran


# DeepSpeedExamples training/cifar ---------------------------------------------------------------

DS_CIFAR_CONFIG = {
    "train_batch_size": 16, "steps_per_print": 2000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                             "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                 "warmup_num_steps": 1000}},
    "gradient_clipping": 1.0, "prescale_gradients": False,
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
             "min_loss_scale": 1, "initial_scale_power": 15},
    "zero_optimization": {"stage": 1, "allgather_partitions": True, "reduce_scatter": True,
                          "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                          "overlap_comm": True, "contiguous_gradients": True},
}
"""The example's ds_config.json with fp16 and ZeRO stage 1 turned on."""


def test_deepspeed_cifar10_fused_adam_fp16_zero1_two_ranks(tmp_path):
    import json

    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(DS_CIFAR_CONFIG))
    shapes = (ex.conv(6, 3, 5) + ex.conv(16, 6, 5) + ex.linear(120, 400) + ex.linear(84, 120)
              + ex.linear(10, 84))
    world = 2
    # ZeRO 1/2 flatten the fp16 weights into one buffer (padded to a multiple of 2 x world)
    # and keep rank 0's half of an fp32 master copy, whose two Adam moments are the state
    flat = -(-ex.count(shapes) // (2 * world)) * (2 * world)
    master = ex.rounded(flat // world * ex.FP32)
    params = ex.rounded(flat * 2) + master
    bucket = ex.rounded(50_000_000 * 2)  # contiguous_gradients: reduce_bucket_size fp16 elements
    est = estimate("r3_deepspeed_cifar10.py", "--deepspeed", "--deepspeed_config", str(config),
                   "--train-size", "512", "--test-size", "64", cwd=tmp_path,
                   launcher=("deepspeed", "--num_gpus", str(world)))
    # "type": "Adam" is DeepSpeed's FusedAdam, whose kernels are compiled by nvcc when not
    # prebuilt: the job stopped at "CUDA_HOME environment variable is not set"
    assert_training(est, params=params, optimizer_state=2 * master, grads=bucket)
    assert est.data["world_size"] == world and est.data["launcher"] == "deepspeed"
    assert "fp16=True bf16=False optimizer=DeepSpeedZeroOptimizer" in est.stderr
    # 512 samples / 2 ranks / 8 a rank (train_batch_size 16) = 32 batches an epoch: 3, the
    # last, then one of the second epoch; the test loop through the bare net after it
    assert est.data["steps"] == 7 and est.data["phases_ran"] == ["training", "eval"]


# pytorch/examples imagenet/main.py --------------------------------------------------------------

@needs("torchvision")
@pytest.mark.parametrize("placement", [("--gpu", "0"), ("-j", "2")], ids=["gpu0", "data_parallel"])
def test_imagenet_main_dummy_resnet18_sgd_steplr(tmp_path, placement):
    shapes, buffers = ex.resnet18_shapes(1000)
    params = ex.device_bytes(shapes, ex.FP32)
    # --gpu 0: torch.accelerator.set_device_index and the model on that device; without it the
    # script wraps the model in nn.DataParallel (one fake GPU: it runs the module directly)
    est = estimate("r3_imagenet_main.py", "--dummy", "-a", "resnet18", "-b", "16", "--epochs", "2",
                   "--dummy-train-size", "160", "--dummy-val-size", "64", "--image-size", "64",
                   "-p", "2", *placement, cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=params)  # SGD momentum
    assert est.breakdown["buffer"] == ex.device_bytes(buffers, ex.FP32)
    # FakeData of 160 images in batches of 16: each epoch's train() then validate()
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "DataLoader epoch of 10 batches" in _notes(est)
    # save_checkpoint's torch.save went to peakmem's folder (is_best, a device comparison that
    # reads as False, skipped the copy to model_best.pth.tar)
    assert "saved 2 file(s) of fake device data" in _notes(est)
    assert " *   Acc@1 0.000 Acc@5 0.000" in est.stderr


# lucidrains/vit-pytorch style ViT: AMP, checkpointing, EMA, compile ---------------------------

def _vit_pytorch_shapes(dim: int = 128, depth: int = 4, mlp: int = 256, patch_dim: int = 48,
                        patches: int = 64, classes: int = 10) -> list:
    shapes = ex.norm(patch_dim) + ex.linear(dim, patch_dim) + ex.norm(dim)
    shapes += [(1, patches + 1, dim), (1, 1, dim)]  # pos_embedding, cls_token
    for _ in range(depth):  # Attention (bias-free to_qkv) and FeedForward, each pre-norm
        shapes += ex.norm(dim) + [(3 * dim, dim)] + ex.linear(dim, dim)
        shapes += ex.norm(dim) + ex.linear(mlp, dim) + ex.linear(dim, mlp)
    return shapes + ex.norm(dim) + ex.linear(classes, dim)


@pytest.mark.parametrize("flags", [(), ("--grad-checkpointing", "--compile")],
                         ids=["eager", "checkpointing_compiled"])
def test_vit_pytorch_gradscaler_clip_ema_averaged_model(tmp_path, flags):
    model = ex.device_bytes(_vit_pytorch_shapes(), ex.FP32)
    est = estimate_here("r3_lucidrains_vit_amp_ema.py", *flags, "--save", str(tmp_path / "ck.pt"))
    # AveragedModel deep-copies the model on its device: a second set of weights (labelled
    # `ema`: kept in sync by update_parameters, even though its forward runs in the
    # evaluations); its n_averaged counter is made on the host (no device= given); AdamW
    # moments for the model; above the model state: the eager run's saved activations (4
    # layers at batch 32 with fp16 copies, ~40 MiB)
    assert_training(est, params=model, optimizer_state=2 * model, grads=model,
                    extra_lower=model, extra_upper=64 * 2**20)
    assert est.breakdown.get("ema") == model, est.breakdown
    assert "buffer" not in est.breakdown
    # 256 samples / 32 = 8 batches an epoch, an EMA evaluation after each
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "ck.pt" in _notes(est)
    if "--compile" in flags:
        assert "torch.compile was not applied: ViT ran eagerly" in _notes(est)
        # the peak is an EMA evaluation's forward, whose blocks are `activation` of its eval
        # phase (capture/phases.py; 21,270,016 B here, `temporary` before); checkpointed layers
        # keep only their inputs, so training leaves little at that peak: GradScaler's scale and
        # growth tracker (`other`), nothing `temporary`
        assert "the peak was set by the evaluation after training" in _notes(est)
        assert "temporary" not in est.breakdown, est.breakdown
        assert est.breakdown.get("other", 0) <= 2 * ex.BLOCK, est.breakdown


# torchtune-style full fine-tune with bitsandbytes' AdamW8bit ------------------------------------

def _adam8bit_state(shape) -> int:
    """bitsandbytes Optimizer2State.init_state: tensors under min_8bit_size (4096) keep two
    fp32 moments; larger ones two uint8 moments and two fp32 absmax vectors, one value per block
    of 256. (The two shared 256-entry quantisation maps are not per tensor: QMAPS.)"""
    numel = prod(shape)
    if numel < 4096:
        return 2 * ex.rounded(numel * ex.FP32)
    return 2 * ex.rounded(numel) + 2 * ex.rounded(-(-numel // 256) * ex.FP32)


QMAPS = 2 * ex.rounded(256 * ex.FP32)
"""bitsandbytes' two fp32 quantization maps (`qmap1` / `qmap2`), made on the host and moved to the
device once at the first step: optimizer state (capture/phases.py)."""


@needs("bitsandbytes")
def test_torchtune_style_full_finetune_bf16_adamw8bit_checkpointing():
    vocab, dim, hidden, kv = 2048, 256, 704, 2 * (256 // 8)
    shapes = [(vocab, dim)]
    for _ in range(2):
        shapes += [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (hidden, dim), (dim, hidden),
                   (hidden, dim), (dim,), (dim,)]
    shapes += [(dim,), (vocab, dim)]
    params = ex.device_bytes(shapes, ex.BF16)
    est = estimate_here("r3_torchtune_style_bnb_adamw8bit.py", "--enable-activation-checkpointing")
    assert_training(est, params=params, optimizer_state=QMAPS + sum(map(_adam8bit_state, shapes)))
    assert "accumulation window 2" in _notes(est)
    # the recipe's memory log read the fake device's allocator statistics
    assert "peak_memory_active 0.09 GiB" in est.stderr


# pytorch/examples distributed/tensor_parallelism -----------------------------------------------

def test_tensor_parallel_example_optimizer_built_before_parallelize_module(tmp_path):
    # ToyModel: in_proj Linear(10, 32), out_proj Linear(32, 5), moved to "cuda" whole; then
    # ColwiseParallel shards in_proj's rows and RowwiseParallel out_proj's columns over 2 ranks,
    # and out_proj's bias is replicated (the DTensor wraps the same storage)
    whole = ex.device_bytes(ex.linear(32, 10) + ex.linear(5, 32), ex.FP32)
    shards = ex.device_bytes([(16, 10), (16,), (5, 16)], ex.FP32)
    est = estimate("r3_tensor_parallel_example.py", cwd=tmp_path,
                   launcher=("torchrun", "--nproc_per_node", "2"))
    # the AdamW made before parallelize_module holds the whole, replaced parameters: they stay
    # alive, get no gradients, and the optimizer never makes state (as on GPUs)
    assert_training(est, params=whole + shards, optimizer_state=0,
                    grads=shards + ex.device_bytes([(5,)], ex.FP32))
    assert est.data["world_size"] == 2
    assert "Tensor Parallel iter 1 completed" in est.stderr
