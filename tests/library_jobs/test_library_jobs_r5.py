"""Round 5: helper libraries around the training loop (torchmetrics, timm's training pieces,
einops, HF datasets from local files, tiktoken token streams, omegaconf configs, tqdm), each in a
tiny script written the way the public pattern it cites writes it, run unmodified through the
real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r5_*.py). Parameter
and optimizer bytes are worked out by hand (expected.py), not read from peakmem."""

from __future__ import annotations

import numpy as np
import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import MiB, assert_training, fused_steps, needs


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# torchmetrics README + tqdm + samplers + CUDA events ---------------------------------------------

@needs("torchmetrics", "tqdm", "torchvision")
def test_torchmetrics_collection_tqdm_weighted_sampler_cuda_events():
    shapes = ex.linear(64, 32) + ex.linear(4, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    # in a child: the job's validation line goes through logging.basicConfig's root handler
    est = estimate("r5_torchmetrics_tqdm.py", "--epochs", "2")
    assert_training(est, params=params, optimizer_state=2 * params)
    # validation after each epoch (metrics computed and reset), traced as evaluation
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    # random_split 128 / 32, batches of 16 drawn by the WeightedRandomSampler
    assert "DataLoader epoch of 8 batches" in _notes(est)
    assert "val {'acc':" in est.stderr and "max memory allocated:" in est.stderr
    # the metrics' bincount (minlength = num_classes) ran on fake tensors
    assert est.data["mode"] == "fake", est.data["mode_reason"]


# timm train.py's pieces ----------------------------------------------------------------------------

def _images(folder, count: int):
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


@needs("timm", "torchvision", "PIL")
@pytest.mark.parametrize("opt, states, ema_flags", [("lamb", 2, ()), ("lookahead_adamw", 3, ()),
                                                    ("adamp", 2, ("--model-ema-force-cpu",))])
def test_timm_optimizer_factory_scheduler_mixup_ema_native_scaler(tmp_path, opt, states,
                                                                  ema_flags):
    shapes, buffer_shapes = ex.resnet18_shapes(classes=10)
    model = ex.device_bytes(shapes, ex.FP32)
    # 20 batches of 2 in one epoch: the capture stops after a few steps; Lookahead (k = 6)
    # holds a slow copy of the weights from its 6th step on, and the estimate must too
    est = estimate_here("r5_timm_pieces.py", "--data-dir", str(_images(tmp_path / "img", 40)),
                        "--opt", opt, "-b", "2", "--epochs", "1", *ema_flags)
    assert_training(est, params=model, optimizer_state=(states * model,
                                                       states * model + fused_steps(shapes)),
                    extra_upper=256 * MiB)
    assert est.breakdown["buffer"] == ex.device_bytes(buffer_shapes, ex.FP32)
    assert "DataLoader epoch of 20 batches" in _notes(est)
    # ModelEmaV3 deep-copies the model on the device; --model-ema-force-cpu moves the copy to
    # the host, where it takes no device memory by the time training starts (on the device,
    # its weights are labelled `ema` once it is seen kept in sync with the model)
    ema_on_device = est.breakdown.get("ema", 0) >= model
    assert ema_on_device == (not ema_flags), est.breakdown


# HF datasets from local files + tiktoken (run_clm_no_trainer's group_texts, nanoGPT prepare.py) --

TEXT_LINES = [f"line {i}: the quick brown fox jumps over the lazy dog number {i * 7}"
              for i in range(60)]


def _corpus(tmp_path, fmt: str):
    import csv
    import json

    if fmt == "text":
        path = tmp_path / "corpus.txt"
        path.write_text("\n".join(TEXT_LINES))
    elif fmt == "csv":
        path = tmp_path / "corpus.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([line, i % 2] for i, line in enumerate(TEXT_LINES))
    else:
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({"text": line}) + "\n" for line in TEXT_LINES))
    return path


@needs("datasets", "tiktoken")
@pytest.mark.parametrize("fmt, device_format, num_proc",
                         [("text", False, 1), ("csv", True, 1), ("json", False, 2)])
def test_hf_datasets_local_files_tiktoken_blocks(tmp_path, fmt, device_format, num_proc):
    vocab = 257  # byte-level tiktoken Encoding: 256 ranks + <|endoftext|>
    shapes = [(vocab, 64), *ex.linear(128, 64), *ex.linear(vocab, 128)]
    params = ex.device_bytes(shapes, ex.FP32)
    # num_proc 2 forks datasets' map workers: in a child; one process: in this process
    run = estimate if num_proc > 1 else estimate_here
    est = run("r5_hf_datasets_tiktoken.py", "--format", fmt,
              "--data-file", str(_corpus(tmp_path, fmt)),
              "--num-proc", str(num_proc), *(["--device-format"] if device_format else []),
              cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params)
    # 60 lines of bytes + EOT each, grouped into blocks of 33 tokens; batches of 4
    tokens = sum(len(line.encode()) + 1 for line in TEXT_LINES)
    assert f"{tokens // 33} blocks of 33 tokens" in est.stderr
    assert f"DataLoader epoch of {tokens // 33 // 4} batches" in _notes(est)
    assert est.data["steps"] == 4


# einops ViT (lucidrains vit-pytorch) + an omegaconf YAML merged with a CLI dotlist -------------

def _einops_vit_shapes(image_size, patch_size, num_classes, dim, depth, heads, dim_head, mlp_dim):
    patch_dim = 3 * patch_size ** 2
    shapes = [(patch_dim,), (patch_dim,), *ex.linear(dim, patch_dim)]
    shapes += [(1, 1, dim), (1, (image_size // patch_size) ** 2 + 1, dim)]
    for _ in range(depth):
        shapes += [(dim,), (dim,), *ex.linear(3 * heads * dim_head, dim, bias=False),
                   *ex.linear(dim, heads * dim_head)]
        shapes += [(dim,), (dim,), *ex.linear(mlp_dim, dim), *ex.linear(dim, mlp_dim)]
    return shapes + ex.linear(num_classes, dim)


@needs("einops", "omegaconf")
def test_einops_vit_omegaconf_yaml_with_cli_dotlist():
    # r5_einops_vit.yaml's model, depth 3 from the command line
    shapes = _einops_vit_shapes(32, 8, 10, 64, 3, 4, 16, 128)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r5_einops_vit.py", "train.steps=2", "model.depth=3")
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["steps"] == 2
    assert "depth: 3" in est.stderr


@needs("torchmetrics", "tqdm", "torchvision")
def test_torchmetrics_sync_on_compute_under_torchrun_ddp(tmp_path):
    shapes = ex.linear(64, 32) + ex.linear(4, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r5_torchmetrics_tqdm.py", "--epochs", "2", cwd=tmp_path,
                   launcher=("torchrun", "--nproc_per_node", "2"))
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["world_size"] == 2 and est.data["launcher"] == "torchrun"
    # the metrics' all_gather on compute() went through the fake process group
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "val {'acc':" in est.stderr
    # torchmetrics' gather_all_tensors slices the gathered states by sizes that live on the
    # device (`slice(dim_size)` of a device tensor, read on the host: capture/slice_bounds.py)
    assert est.data["mode"] == "fake", est.data["mode_reason"]


@needs("timm", "torchvision", "PIL")
def test_timm_create_dataset_create_loader_prefetcher_random_erasing(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(3):
        (tmp_path / "train" / f"c{c}").mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "train" / f"c{c}" / f"{i}.png")
    shapes, buffer_shapes = ex.resnet18_shapes(classes=3)
    model = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r5_timm_loader.py", "--data-dir", str(tmp_path), "-j", "2", cwd=tmp_path)
    assert_training(est, params=model, optimizer_state=2 * model, extra_upper=256 * MiB)
    assert est.breakdown["buffer"] == ex.device_bytes(buffer_shapes, ex.FP32)
    # 24 images in batches of 2 through timm's PrefetchLoader (its side stream, device
    # normalisation and RandomErasing)
    assert "DataLoader epoch of 12 batches" in _notes(est)
    assert est.data["steps"] == 4 and "epoch 0: 4 batches" in est.stderr  # 3, then the last
    assert est.data["mode"] == "fake", est.data["mode_reason"]
