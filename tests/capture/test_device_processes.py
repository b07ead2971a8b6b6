"""multiprocessing.Process workers given the job's device tensors (capture.device_processes):
the first runs in the capture's process, so its training is in the estimate (mnist_hogwild)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peakmem.capture.device_processes import holds_device_tensor
from peakmem.estimate import estimate_command

HOGWILD = """\
import torch
import torch.multiprocessing as mp

def train(rank, model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
        opt.step()

def helper(queue):
    queue.put("host work done")

if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    model = torch.nn.Linear(1024, 1024).cuda()
    model.share_memory()
    workers = [mp.Process(target=train, args=(rank, model, 2)) for rank in range(NUM)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
        assert p.exitcode == 0 and not p.is_alive()
    queue = mp.Queue()
    host = mp.Process(target=helper, args=(queue,))
    host.start()
    print(queue.get(timeout=60))
    host.join()
    assert host.exitcode == 0
"""


def test_holds_device_tensor_looks_into_modules_optimizers_and_containers():
    cpu = torch.nn.Linear(2, 2)
    assert not holds_device_tensor(((0, cpu, [torch.ones(1)]), {"lr": 0.1}))
    meta = torch.empty(2, device="meta")  # neither host nor CUDA
    assert not holds_device_tensor({"x": meta})


@pytest.mark.parametrize("workers", [1, 3])
def test_hogwild_workers_train_in_the_estimate(tmp_path: Path, monkeypatch, workers):
    (tmp_path / "hogwild.py").write_text(HOGWILD.replace("NUM", str(workers)))
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "hogwild.py"], gpu="a100-40gb", mode="fake",
                              timeout=120)
    weight = 1024 * 1024 * 4
    assert result.estimate_kind == "training"
    # the worker's SGD steps: parameters, gradients and momentum buffers all on the device
    assert result.breakdown.by_category["parameter"] >= weight
    assert result.breakdown.by_category["optimizer_state"] >= weight
    assert result.peak_allocated_bytes >= 3 * weight
    notes = [n for n in result.notes if n.startswith("multiprocessing.Process worker(s)")]
    assert len(notes) == 1, result.notes
    assert ("more were not run" in notes[0]) == (workers > 1)
    if workers == 3:
        assert "2 more were not run" in notes[0]
