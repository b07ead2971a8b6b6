"""Ray Train's TorchTrainer runs its training function in the job's process during a capture
(capture/ray_train.py)."""

import importlib.util

import pytest
import torch
from torch import nn

from peakmem.estimate import estimate

if importlib.util.find_spec("ray") is None:  # ray.train.torch is imported by the test only:
    pytest.skip("ray is not installed", allow_module_level=True)  # not at collection (~6 s)


def fit_on_ray(seen: dict, workers: int) -> None:
    import ray.train
    import ray.train.torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_func():
        model = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 4)))
        seen["ddp"] = isinstance(model, nn.parallel.DistributedDataParallel)
        seen["world"] = ray.train.get_context().get_world_size()
        optimizer = torch.optim.Adam(model.parameters())
        device = ray.train.torch.get_device()
        seen["device"] = str(device)
        for _ in range(3):
            loss = model(torch.randn(16, 32, device=device)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ray.train.report({"loss": float(loss)})

    TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=workers, use_gpu=True)).fit()


@pytest.mark.parametrize("workers", [1, 2])
def test_torch_trainer_with_gpu_workers_trains_in_the_jobs_process(workers):
    pytest.importorskip("ray.train.torch")
    seen: dict = {}
    result = estimate(fit_on_ray, seen, workers, gpu="a100-40gb", torch_version="2.4.1",
                      mode="fake", timeout=120)
    assert seen["device"] == "cuda:0"  # prepare_model / get_device as on a GPU worker
    assert result.steps == 3
    weights = sum(max(512, -(-n * 4 // 512) * 512) for n in (32 * 64, 64, 64 * 4, 4))
    assert result.breakdown.by_category["parameter"] == weights
    assert result.breakdown.by_category["optimizer_state"] == 2 * weights
    note = next(n for n in result.notes if n.startswith("Ray Train:"))
    assert f"instead of on {workers} Ray worker(s) with a GPU each" in note
    # more workers: rank 0 of them, in a (fake) process group, the model wrapped in DDP
    assert seen["world"] == workers and seen["ddp"] == (workers > 1)
    assert (f"rank 0 of {workers}" in note) == (workers > 1)
