"""fastai's own optimizers (not torch.optim): their per-parameter state is optimizer state
(capture/fastai_optimizers.py)."""

import pytest
import torch
from torch import nn

pytest.importorskip("fastai.optimizer")

from fastai.optimizer import SGD, Adam  # noqa: E402

from peakmem.estimate import estimate  # noqa: E402


def rounded(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def train(opt_func) -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
    opt = opt_func(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(16, 32, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(("opt_func", "moments"), [
    (Adam, 2),  # grad_avg and sqr_avg per parameter
    (lambda params, lr: SGD(params, lr, mom=0.9), 1),  # grad_avg
])
def test_fastai_optimizer_state_is_optimizer_state(opt_func, moments):
    weights = sum(rounded(n * 4) for n in (32 * 64, 64, 64 * 4, 4))
    result = estimate(train, opt_func, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert result.steps >= 3
    by_category = result.breakdown.by_category
    assert by_category["parameter"] == weights
    # they were `other` before (made by fastai's stepper callbacks, outside torch.optim)
    assert by_category.get("optimizer_state", 0) == moments * weights
