"""Auto mode reruns in eager mode a fake capture that failed on a size the job checked after a
data-dependent op (estimate/api.py `eager_fallback_reason`): fake mode sizes `unique`, `nonzero`
and boolean masks as if every element were kept, which a validation check can reject
(torchmetrics: `len(torch.unique(target)) > num_classes` raises)."""

import pytest
import torch
from torch import nn

from peakmem.estimate import EstimateError, estimate


def train(target_from_host: bool = False) -> None:
    """Random targets made on the device: values fake mode does not have, so `unique` keeps
    its upper bound (every element). Made on the host and moved (`target_from_host`), they keep
    their values (capture/known_values.py) and `unique` has the GPU's size."""
    model = nn.Linear(32, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(64, 32).cuda()
        target = (torch.randint(0, 4, (64,)).cuda() if target_from_host
                  else torch.randint(0, 4, (64,), device="cuda"))
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


def test_a_target_moved_from_the_host_keeps_its_values_and_fake_mode_runs():
    result = estimate(train, True, gpu="a100-40gb", mode="auto")
    assert result.capture.mode == "fake"
    assert result.steps == 2
