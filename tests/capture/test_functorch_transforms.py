"""torch.func transforms over a module on the device (`vmap(grad(functional_call(model, ...)))`,
per-sample gradients): peakmem's module hooks see torch.func's wrapper tensors, which have no
storage of their own (capture.session.unwrap_functorch)."""

from __future__ import annotations

import pytest

from peakmem.estimate import estimate_command

SAMPLES, FEATURES = 64, 512
JOB = f"""\
import torch, torch.nn as nn
from torch.func import functional_call, grad, vmap
model = nn.Sequential(nn.Linear({FEATURES}, {FEATURES}), nn.ReLU(),
                      nn.Linear({FEATURES}, {FEATURES})).cuda()
params = {{name: p.detach() for name, p in model.named_parameters()}}

def loss(p, x):
    return functional_call(model, p, (x.unsqueeze(0),)).pow(2).mean()

# the module's first forward runs inside the transforms, its parameters swapped for wrappers
per_sample = vmap(grad(loss), in_dims=(None, 0))(params, torch.randn({SAMPLES}, {FEATURES},
                                                                       device="cuda"))
print(sum(g.numel() for g in per_sample.values()))
del per_sample
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(8, {FEATURES}, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    vmap(grad(loss), in_dims=(None, 0))(params, torch.randn({SAMPLES}, {FEATURES}, device="cuda"))
"""


@pytest.mark.parametrize("mode", ["fake", "eager"])
def test_per_sample_gradients(tmp_path, mode):
    script = tmp_path / "per_sample.py"
    script.write_text(JOB)
    result = estimate_command(["python", str(script)], gpu="a100-40gb", mode=mode,
                              isolate=False, steps="all")
    params = 2 * (FEATURES * FEATURES + FEATURES)
    assert result.peak_allocated_bytes >= SAMPLES * params * 4  # the per-sample gradients
    assert result.peak_allocated_bytes < 3 * SAMPLES * params * 4
