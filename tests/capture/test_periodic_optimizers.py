"""Optimizers whose state appears every k-th step (capture/periodic_optimizers.py): timm's
Lookahead makes its slow weights at step k, which a capture that stops a loop early never reaches."""

import importlib.util

import pytest
import torch
from torch import nn

from peakmem.capture.library_patches import library_patches
from peakmem.estimate import estimate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")


def _lookahead(params, k):
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()  # timm imports torchvision (no C ops on a CPU-only torch)
    from timm.optim.lookahead import Lookahead

    return Lookahead(torch.optim.AdamW(params, lr=1e-3), k=k)


def train(k: int, steps: int) -> None:
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)).cuda()
    optimizer = _lookahead(model.parameters(), k)
    for _ in range(steps):
        loss = model(torch.randn(16, 256).cuda()).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_lookahead_slow_weights_are_made_at_the_first_step_and_leave_the_weights():
    model = nn.Linear(4, 3)
    with library_patches():
        optimizer = _lookahead(model.parameters(), k=6)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        after_step = model.weight.detach().clone()
        state = optimizer._base_optimizer.state
        assert all("lookahead_slow_buff" in state[p] for p in model.parameters())
        assert torch.equal(state[model.weight]["lookahead_slow_buff"], after_step)
        assert torch.equal(model.weight.detach(), after_step)
    optimizer = _lookahead(nn.Linear(4, 3).parameters(), k=6)  # the patch is undone
    params = optimizer.param_groups[0]["params"]
    sum(p.sum() for p in params).backward()
    optimizer.step()
    assert not any("lookahead_slow_buff" in optimizer._base_optimizer.state[p] for p in params)


def test_a_short_capture_holds_the_slow_weights_step_k_makes():
    # k = 6 with 2 steps: the real run holds the slow weights from step 6 on; k = 1 makes them
    # at the first step, as the capture now does for any k
    late = estimate(train, 6, 2, gpu="a100-40gb", mode="fake", steps="all")
    first = estimate(train, 1, 2, gpu="a100-40gb", mode="fake", steps="all")
    params = late.breakdown.by_category["parameter"]
    assert late.peak_allocated_bytes == first.peak_allocated_bytes
    assert late.peak_allocated_bytes >= 4 * params  # params, grads, two moments, slow weights
