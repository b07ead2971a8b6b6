"""A Dataset's random host samples (`torch.randn(C, H, W)` in `__getitem__`) are drawn lazily
(capture.host_deferred): the estimate (trace, peaks, utilization, notes) is the one real draws
give, whether the batch goes straight to the device or the job reads it on the host."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from peakmem.capture import host_deferred
from tests.capture.capture_helpers import estimate_with_deferral


class RandomImages(Dataset):
    """GPUMemNet's CNN launcher's dataset: `randn(C, S, S)` per sample, a random label."""

    def __init__(self, n: int, side: int, normalize: bool = False) -> None:
        self.n, self.side, self.normalize = n, side, normalize

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.randn(3, self.side, self.side)
        if self.normalize:  # a host op on the sample: drawn for real from here on
            image = (image - 0.5) / 2
        return image, int(torch.randint(0, 10, ()))


def train(side: int = 40, read_on_host: bool = False, normalize: bool = False) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(RandomImages(30, side, normalize), batch_size=8, shuffle=True,
                        pin_memory=True)
    for x, y in loader:
        assert x.shape == (len(y), 3, side, side) and x.dtype == torch.float32
        if read_on_host:
            assert torch.isfinite(x).all().item() and x.std().item() > 0.1
        x, y = x.cuda(non_blocking=True), y.cuda()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _run(monkeypatch, lazy: bool, **job) -> tuple[dict, int]:
    data, drawn, trace = estimate_with_deferral(monkeypatch, "_sample_draw", lazy, train, **job)
    data["utilization_record"] = trace.meta.get("utilization")
    assert len(trace) > 0 and data["utilization_record"]["host_random_bytes"] > 0
    return data, drawn


@pytest.mark.parametrize(
    "job", [{}, {"read_on_host": True}, {"normalize": True}],
    ids=["straight-to-device", "batch-read-on-host", "sample-normalized-on-host"],
)
def test_lazily_drawn_samples_give_the_real_draws_estimate(monkeypatch, job):
    lazy, drawn = _run(monkeypatch, True, **job)
    real, none = _run(monkeypatch, False, **job)
    assert drawn == 30 and none == 0  # every sample of the epoch (its 4 batches)
    assert json.dumps(lazy, sort_keys=True, default=str) == json.dumps(
        real, sort_keys=True, default=str)


def test_small_samples_and_draws_outside_a_fetch_stay_real(monkeypatch):
    _lazy, drawn = _run(monkeypatch, True, side=16)  # 768 elements per sample
    assert drawn == 0
    assert not host_deferred._in_dataset_fetch()  # a draw in the training loop: real


def test_draw_sizes():
    assert host_deferred._draw_size((3, 4), {}) == (3, 4)
    assert host_deferred._draw_size(((3, 4),), {}) == (3, 4)
    assert host_deferred._draw_size((torch.Size([2, 5]),), {}) == (2, 5)
    assert host_deferred._draw_size((), {"size": [7]}) == (7,)
    assert host_deferred._draw_size((3,), {"size": [7]}) is None
    assert host_deferred._draw_size((3, 2.0), {}) is None
