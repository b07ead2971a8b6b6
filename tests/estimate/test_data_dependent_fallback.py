"""Auto mode reruns in eager mode a fake capture that failed on a size the job checked after a
data-dependent op (estimate/api.py `eager_fallback_reason`): fake mode sizes `unique`, `nonzero`
and boolean masks as if every element were kept, which a validation check can reject
(torchmetrics: `len(torch.unique(target)) > num_classes` raises)."""

import pytest
import torch
from torch import nn

from peakmem.estimate import EstimateError, estimate


def train() -> None:
    model = nn.Linear(32, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x, target = torch.randn(64, 32).cuda(), torch.randint(0, 4, (64,)).cuda()
        if len(torch.unique(target)) > 4:
            raise RuntimeError("Detected more unique values in `target` than `num_classes`")
        loss = nn.functional.cross_entropy(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_fake_mode_alone_fails_on_the_checked_size():
    with pytest.raises(EstimateError, match="more unique values"):
        estimate(train, gpu="a100-40gb", mode="fake")


def test_auto_mode_reruns_it_in_eager_mode():
    result = estimate(train, gpu="a100-40gb", mode="auto")
    assert result.capture.mode == "eager"
    assert "data-dependent op(s) (aten::_unique2)" in result.capture.mode_reason
    assert result.steps == 2
    assert result.breakdown.by_category["parameter"] == 2 * 512  # weight (512 B) and bias blocks
