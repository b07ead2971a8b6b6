"""Round 5: helper libraries around the training loop (torchmetrics, timm's training pieces,
einops, HF datasets from local files, tiktoken token streams, omegaconf configs, tqdm), each in a
tiny script written the way the public pattern it cites writes it, run unmodified through the
real CLI (`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r5_*.py). Parameter
and optimizer bytes are worked out by hand (expected.py), not read from peakmem."""

from __future__ import annotations

import numpy as np
import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import MiB, assert_training, fused_steps, needs


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# torchmetrics README + tqdm + samplers + CUDA events ---------------------------------------------

@needs("torchmetrics", "tqdm", "torchvision")
def test_torchmetrics_collection_tqdm_weighted_sampler_cuda_events():
    shapes = ex.linear(64, 32) + ex.linear(4, 64)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r5_torchmetrics_tqdm.py", "--epochs", "2")
    assert_training(est, params=params, optimizer_state=2 * params)
    # validation after each epoch (metrics computed and reset), traced as evaluation
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    # random_split 128 / 32, batches of 16 drawn by the WeightedRandomSampler
    assert "DataLoader epoch of 8 batches" in _notes(est)
    assert "val {'acc':" in est.stderr and "max memory allocated:" in est.stderr


# timm train.py's pieces ----------------------------------------------------------------------------

def _images(folder, count: int):
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


@needs("timm", "torchvision", "PIL")
@pytest.mark.parametrize("opt, states", [("lamb", 2), ("lookahead_adamw", 3)])
def test_timm_optimizer_factory_scheduler_mixup_ema_native_scaler(tmp_path, opt, states):
    shapes, buffer_shapes = ex.resnet18_shapes(classes=10)
    model = ex.device_bytes(shapes, ex.FP32)
    # 20 batches of 2 in one epoch: the capture stops after a few steps; Lookahead (k = 6)
    # holds a slow copy of the weights from its 6th step on, and the estimate must too
    est = estimate("r5_timm_pieces.py", "--data-dir", str(_images(tmp_path / "img", 40)),
                   "--opt", opt, "-b", "2", "--epochs", "1")
    assert_training(est, params=model, optimizer_state=(states * model,
                                                       states * model + fused_steps(shapes)),
                    extra_upper=256 * MiB)
    assert est.breakdown["buffer"] == ex.device_bytes(buffer_shapes, ex.FP32)
    assert "DataLoader epoch of 20 batches" in _notes(est)
