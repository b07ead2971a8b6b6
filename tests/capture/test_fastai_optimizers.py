"""fastai's own optimizers (not torch.optim): their per-parameter state is optimizer state
(capture/fastai_optimizers.py).

Each estimate runs in a child Python: importing fastai patches torch for the whole process
(fastai.torch_core replaces `Tensor.as_subclass`), which must not leak into the other tests of
a pytest worker."""

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastai") is None,
                                reason="not installed: fastai")

JOB = """
import json, sys
import torch
from torch import nn
from fastai.optimizer import SGD, Adam, ranger
from peakmem.estimate import estimate

def train(opt_func):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
    opt = opt_func(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(16, 32, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

results = {}
opt_funcs = {"adam": Adam, "sgd_momentum": lambda params, lr: SGD(params, lr, mom=0.9),
             "ranger_k2": lambda params, lr: ranger(params, lr, k=2)}
for name, opt_func in opt_funcs.items():
    result = estimate(train, opt_func, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    results[name] = {"steps": result.steps, "by_category": result.breakdown.by_category}
print(json.dumps(results))
"""


def rounded(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def test_fastai_optimizer_state_is_optimizer_state():
    done = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    weights = sum(rounded(n * 4) for n in (32 * 64, 64, 64 * 4, 4))
    # Adam: grad_avg and sqr_avg per parameter; SGD with momentum: grad_avg
    for optimizer, moments in (("adam", 2), ("sgd_momentum", 1)):
        result = results[optimizer]
        assert result["steps"] >= 3
        assert result["by_category"]["parameter"] == weights
        # `other` before (made by fastai's stepper callbacks, outside torch.optim)
        assert result["by_category"].get("optimizer_state", 0) == moments * weights, optimizer


def test_fastai_lookahead_slow_weights_are_optimizer_state():
    """`ranger` is `Lookahead(RAdam(...))`: Lookahead keeps a copy of every parameter (its
    `slow_weights`, cloned at its first step, outside `state`) and every k-th step moves them
    toward the weights and copies them back. They were `other` until that sync, then `ema`
    (capture/weight_copies.py took the sync for an averaged model's); they are the optimizer's
    state, as timm's Lookahead's `lookahead_slow_buff` is."""
    done = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])["ranger_k2"]
    weights = sum(rounded(n * 4) for n in (32 * 64, 64, 64 * 4, 4))
    assert result["steps"] >= 3
    assert result["by_category"]["parameter"] == weights
    # RAdam's grad_avg and sqr_avg, and the slow weights
    assert result["by_category"].get("optimizer_state", 0) == 3 * weights
    assert "ema" not in result["by_category"]
    assert result["by_category"]["other"] == 16 * 32 * 4  # the batch, made on the device
