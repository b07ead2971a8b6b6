"""The DataLoader's default collate stacks large host batches lazily (capture.host_deferred):
the estimate (trace, peaks, utilization, notes) is the one the real stack gives, the batch's
values are stacked for real where the job reads them, and small batches stay real."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tests.capture.capture_helpers import estimate_with_deferral


class Images(Dataset):
    """Image `i` is filled with the value i (values the job can check)."""

    def __init__(self, n: int, side: int) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, self.side, self.side), float(index)), index % 10


def train(side: int = 512, batch: int = 8, read_on_host: bool = False) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Images(4 * batch, side), batch_size=batch, pin_memory=True)
    for step, (x, y) in enumerate(loader):
        if read_on_host:  # the values a real stack gives
            first = step * batch
            assert x.mean().item() == pytest.approx(first + (batch - 1) / 2)
            assert float(x[1, 0, 0, 0]) == first + 1
        x, y = x.cuda(non_blocking=True), y.cuda()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def _run(monkeypatch, lazy: bool, **job) -> tuple[dict, int]:
    data, deferred, trace = estimate_with_deferral(monkeypatch, "_collate_stack", lazy, train, **job)
    assert len(trace) > 0
    return data, deferred


@pytest.mark.parametrize("read_on_host", [False, True], ids=["straight-to-device", "read-on-host"])
def test_a_lazily_stacked_batch_gives_the_real_stacks_estimate(monkeypatch, read_on_host):
    lazy, deferred = _run(monkeypatch, True, read_on_host=read_on_host)
    real, none = _run(monkeypatch, False, read_on_host=read_on_host)
    assert deferred == 4 and none == 0  # the 4 image batches (labels are small)
    assert json.dumps(lazy, sort_keys=True, default=str) == json.dumps(
        real, sort_keys=True, default=str)


def test_small_batches_stay_real(monkeypatch):
    _lazy, deferred = _run(monkeypatch, True, side=64)
    assert deferred == 0
